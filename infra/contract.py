"""The contract between this program and the worker image (``workload/``): one place for each fact.

Pod labels, the share mount path, environment variable names, the non-root uid and the CLI verbs are
what the worker and its NetworkPolicy rely on; change them here and only here.
"""

from __future__ import annotations

from typing import Any

APP = "spot-trainer"
NAME_LABEL = "app.kubernetes.io/name"
COMPONENT_LABEL = "app.kubernetes.io/component"
LOADER, WORKER, REDIS = "loader", "worker", "redis"
# The scoring Job's pods (CPU): score the scoring/ days with a run's newest model.
SCORER = "scorer"
# With `schedule`: the pod that posts the training and scoring Jobs (infra/schedule.py). Not the loader: it parses
# no bank file and holds no bucket or share; it reads the loader's launch request from Redis.
LAUNCHER = "launcher"
# The pods the Redis NetworkPolicy admits (and the policy pack allows): the scorer's init container waits
# on the queue (infra/jobs.py scoring_spec); the launcher reads the loads' requests and waits for a drained queue.
REDIS_CLIENTS = (LOADER, WORKER, SCORER, LAUNCHER)
# The root step that hands the share to WORKLOAD_UID (infra/share_prep.py): the only root container.
SHARE_PREP = "share-prep"

# Mount path of the Filestore PVC inside loader and worker pods.
SHARE_DIR = "/mnt/share"

# Environment variable names the worker reads.
ENV_SHARE_DIR = "SHARE_DIR"
ENV_REDIS_URL = "REDIS_URL"
ENV_REDIS_PASSWORD = "REDIS_PASSWORD"
ENV_WORKER_ID = "WORKER_ID"
ENV_LEASE_TTL = "LEASE_TTL_SECONDS"
ENV_CHECKPOINT_INTERVAL = "CHECKPOINT_INTERVAL_SECONDS"
ENV_MAX_ATTEMPTS = "MAX_ATTEMPTS"
# `seed --runs-file` (JSON {run: {hyperparameters}}) and `seed --datasets` (a folder or gs://bucket/prefix).
ENV_RUNS_FILE = "RUNS_FILE"
ENV_DATASETS_SRC = "DATASETS_SRC"
# How `seed` reads the user's files: the column mapping itself (JSON) and a declared date format.
ENV_DATASET_COLUMNS = "DATASET_COLUMNS"
ENV_DATASET_DATETIME_FORMAT = "DATASET_DATETIME_FORMAT"
# Where the worker exports each finished run (gs://bucket/prefix); unset: results stay on the share.
ENV_OUTPUT_URI = "OUTPUT_URI"

# The stack's `runs`, mounted into the loader pod from a ConfigMap (key RUNS_KEY) at RUNS_DIR.
RUNS_DIR = "/etc/spot-trainer"
RUNS_KEY = "runs.json"
RUNS_FILE = f"{RUNS_DIR}/{RUNS_KEY}"
# With `schedule`: the training Job the launcher may create (`launch --job`), mounted from a ConfigMap (key
# LAUNCH_KEY) at LAUNCH_DIR (infra/schedule.py).
LAUNCH_DIR = "/etc/spot-trainer-launch"
LAUNCH_KEY = "job.json"
LAUNCH_FILE = f"{LAUNCH_DIR}/{LAUNCH_KEY}"
SCORING_LAUNCH_KEY = "scoring.json"  # the scoring Job's body, beside it in the same ConfigMap
SCORING_LAUNCH_FILE = f"{LAUNCH_DIR}/{SCORING_LAUNCH_KEY}"

# Pod-template annotation of both Jobs: a hash of what the loader seeds (runs, data source) and the image.
# A change to any of them changes both pod templates, and Kubernetes Job templates are immutable, so the
# Kubernetes provider replaces both Jobs and the next `pulumi up` trains what is new.
SEED_INPUTS_ANNOTATION = f"{APP}/seed-inputs"
# The training Job's metadata (not its pods'): the GPU quota limits `pulumi up` read before creating it.
GPU_QUOTA_ANNOTATION = f"{APP}/gpu-quota"
# Workload Identity: the Kubernetes service account names the Google service account it acts as.
GCP_SERVICE_ACCOUNT_ANNOTATION = "iam.gke.io/gcp-service-account"

# The image runs as this uid/gid (see workload/Dockerfile).
WORKLOAD_UID = 10001

# The worker's exit codes are defined once, in workload/core/errors.py (stdlib only); infra/jobs.py
# reads them from there.
# How long a pod rides out Redis or the share failing (infraRetryBudgetMinutes) before it exits
# errors.EXIT_INFRA, which fails the Jobs (infra/jobs.py failure_policy).
ENV_REDIS_RETRY = "REDIS_RETRY_SECONDS"
ENV_INFRA_GIVE_UP = "INFRA_GIVE_UP_SECONDS"
# The training pods' GPU count, which the worker compares with what CUDA sees (workload/runtime/gpu.py;
# the downward API cannot expose an nvidia.com/gpu limit).
ENV_EXPECTED_GPUS = "EXPECTED_GPUS"
# The worker's torch CPU threads (workload/cli.py `work --threads`): 1 on CPU training pods (trainOn=cpu).
ENV_TORCH_THREADS = "TORCH_THREADS"

# Dataset presets the image's simulator knows (workload/data/simulator.py PRESETS; tests/test_contract.py
# checks they agree), so a wrong `datasetPreset` fails at preview, not in the loader pod.
DATASET_PRESETS = ("small", "cluster")

REDIS_PORT = 6379
REDIS_PASSWORD_KEY = "password"  # key of the password in the Redis Secret

# Build context and Dockerfile of the training image, relative to the repository root.
IMAGE_CONTEXT = "workload"
IMAGE_DOCKERFILE = "workload/Dockerfile"


def labels(component: str) -> dict[str, str]:
    """Pod/object labels of one component; the NetworkPolicy selects on exactly these."""
    return {NAME_LABEL: APP, COMPONENT_LABEL: component}


def loader_args(dataset: str, preset: str, dataset_uri: str | None) -> list[str]:
    """``python -m workload seed ...``: idempotent, so a re-run of the loader Job is harmless. Runs come
    from RUNS_FILE; dataset ``dataset`` from ``dataset_uri`` (synced to the share) or the simulator's
    ``preset``."""
    source = ["--datasets", dataset_uri] if dataset_uri else ["--preset", preset]
    return ["seed", "--runs-file", RUNS_FILE, "--dataset", dataset, *source]


def export_args(run: str, to: str) -> list[str]:
    """``python -m workload export``: a run's report, metrics, plots and model to ``to``/<run>/."""
    return ["export", "--run", run, "--to", to]


def score_args(run: str, dataset: str, output_uri: str) -> list[str]:
    """``python -m workload score`` (the contract of issues 20 and 22): the run's newest promoted checkpoint
    on the share scores the dataset's ``scoring/`` days, one Parquet per day under
    ``<output_uri>/<run>/scores/``."""
    return [
        "score", "--model", f"{SHARE_DIR}/output/{run}", "--datasets", f"{SHARE_DIR}/datasets/{dataset}",
        "--days", "scoring", "--out", f"{output_uri}/{run}/scores/",
    ]


# The scoring pod's init container: it waits for training to drain the queue (workload/runtime/launch.py).
WAIT_DRAINED = "wait-drained"


# The scheduled loader records what it added for the launcher (`seed --request-launch`).
REQUEST_LAUNCH = "--request-launch"


def launch_args(stack_job: str, load_wait_s: int, drain_s: int, scoring: bool) -> list[str]:
    """``python -m workload launch``: the launcher's pod. ``stack_job``: the stack's own training Job, while which
    runs no second one is posted; ``load_wait_s``: how long it waits for the load's request; ``drain_s``: how long
    for a drained queue before the scoring Job (``scoring``: the stack scores)."""
    scoring_args = ["--scoring", SCORING_LAUNCH_FILE] if scoring else []
    return ["launch", "--job", LAUNCH_FILE, *scoring_args, "--stack-job", stack_job, "--load-wait", str(load_wait_s),
            "--drain-timeout", str(drain_s)]


def wait_drained_args(timeout_s: int) -> list[str]:
    """``python -m workload wait-drained``: exit 0 once nothing is pending or leased and the share holds every day
    of its plan, 3 after ``timeout_s``."""
    return [WAIT_DRAINED, "--timeout", str(timeout_s)]


WORKER_ARGS = ["worker"]
# Queue and run summary (pending, leased, done, dead-lettered, latest metrics).
STATUS_ARGS = ["status"]
# Where the worker writes each run's report, relative to SHARE_DIR.
REPORT_GLOB = "output/*/report.txt"


def restricted_security_context() -> dict[str, Any]:
    """Container securityContext meeting the 'restricted' Pod Security Standard."""
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
