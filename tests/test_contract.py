"""The Pulumi program and the worker image agree: env names, CLI verbs, presets, uid, mount path."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from infra import contract
from workload import cli
from workload.data import simulator

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(("name", "verb", "value", "attr", "expected"), [
    (contract.ENV_SHARE_DIR, "worker", "/x/share", "share", Path("/x/share")),
    (contract.ENV_REDIS_URL, "worker", "redis://r:6379/0", "redis_url", "redis://r:6379/0"),
    (contract.ENV_WORKER_ID, "worker", "pod-7", "worker_id", "pod-7"),
    (contract.ENV_LEASE_TTL, "worker", "45", "lease_ttl", 45.0),
    (contract.ENV_CHECKPOINT_INTERVAL, "worker", "12", "checkpoint_interval", 12.0),
    (contract.ENV_MAX_ATTEMPTS, "worker", "9", "max_attempts", 9),
    (contract.ENV_RUNS_FILE, "seed", "/etc/x/runs.json", "runs_file", "/etc/x/runs.json"),
    (contract.ENV_DATASETS_SRC, "seed", "gs://acme/fraud", "datasets", "gs://acme/fraud"),
])
def test_every_env_var_the_jobs_set_is_read_by_the_cli(monkeypatch, name, verb, value, attr, expected) -> None:
    monkeypatch.setenv(name, value)
    assert getattr(cli.parser().parse_args([verb]), attr) == expected


def test_the_gpu_count_the_training_job_sets_is_what_the_worker_checks() -> None:
    from workload.runtime import gpu

    assert contract.ENV_EXPECTED_GPUS == gpu.ENV_EXPECTED_GPUS


def test_the_password_variable_is_the_one_the_queue_client_reads() -> None:
    assert f'env("{contract.ENV_REDIS_PASSWORD}")' in (ROOT / "workload" / "cli.py").read_text()


def test_job_arguments_parse_and_name_a_real_preset() -> None:
    for preset in simulator.PRESETS:
        args = cli.parser().parse_args(contract.loader_args("fraud", preset, None))
        assert args.command == "seed" and args.preset == preset and args.runs_file == contract.RUNS_FILE
        assert args.dataset == "fraud" and not args.datasets and not args.run
    args = cli.parser().parse_args(contract.loader_args("exports", "cluster", "gs://acme-fraud/exports"))
    assert args.datasets == "gs://acme-fraud/exports" and args.runs_file == contract.RUNS_FILE
    assert args.dataset == "exports"
    assert cli.parser().parse_args(contract.WORKER_ARGS).command == "worker"
    assert cli.parser().parse_args(contract.STATUS_ARGS).command == "status"


def test_simulated_data_keeps_the_dataset_name_seed_uses_by_default() -> None:
    """A stack deployed before datasetName existed must find its dataset where seed put it."""
    from infra import config

    assert config.SIMULATED_DATASET == cli.DEFAULT_DATASET


def test_the_runs_file_the_stack_mounts_is_what_seed_reads(tmp_path: Path) -> None:
    """The ConfigMap holds the stack's `runs` as infra.config wrote it; seed's loader parses it strictly."""
    from infra import config, render

    cfg = config.load(render.stack_config("dev", {"runs": {"main": {}, "wide": {"hidden": [128, 64]}}}), "dev")
    runs_file = tmp_path / contract.RUNS_KEY
    runs_file.write_text(cfg.jobs.runs_json)
    args = cli.parser().parse_args(["seed", "--runs-file", str(runs_file)])
    runs = cli.load_runs(args)
    assert set(runs) == {"main", "wide"} and runs["wide"].hidden == (128, 64)


def test_the_output_uri_the_training_pods_get_is_where_the_worker_exports(monkeypatch) -> None:
    """The training Job sets OUTPUT_URI; the worker's hook and `export --to` read that same variable."""
    from workload.model import export

    assert export.OUTPUT_URI_ENV == contract.ENV_OUTPUT_URI
    monkeypatch.setenv(contract.ENV_OUTPUT_URI, "gs://acme-results/spot")
    assert cli.parser().parse_args(["export", "--run", "main"]).to == "gs://acme-results/spot"
    args = cli.parser().parse_args(contract.export_args("wide", "gs://acme-results/other"))
    assert (args.command, args.run, args.to) == ("export", "wide", "gs://acme-results/other")


def test_the_image_runs_as_the_uid_the_pods_require() -> None:
    dockerfile = (ROOT / contract.IMAGE_DOCKERFILE).read_text()
    assert re.search(rf"^USER {contract.WORKLOAD_UID}:{contract.WORKLOAD_UID}$", dockerfile, re.M)
    assert f"SHARE_DIR={contract.SHARE_DIR}" in dockerfile
    assert (ROOT / contract.IMAGE_CONTEXT / "requirements.txt").is_file()
    assert 'ENTRYPOINT ["python", "-m", "workload"]' in dockerfile


def test_the_presets_the_config_allows_are_the_simulators() -> None:
    """``datasetPreset`` is validated at preview against contract.DATASET_PRESETS: it must be the image's list."""
    assert tuple(simulator.PRESETS) == contract.DATASET_PRESETS


def test_the_oddest_values_the_config_accepts_parse_in_the_image(monkeypatch, tmp_path: Path) -> None:
    """The smallest and oddest values preview lets through parse in the worker's own CLI (no exit 2)."""
    import json

    from infra import config, render
    from workload.share.paths import check_name

    runs = {"main": {}, "lr-small": {"lr": 1e-06, "epochs": 1, "hidden": []}, "r" * 63: {"seed": 0}}
    values = {"runs": json.dumps(runs), "leaseTtlSeconds": "5", "checkpointIntervalSeconds": "1",
              "maxAttempts": "1", "datasetPreset": "small", "datasetUri": "gs://a-b/x.y_z/Q1+2024"}  # fmt: skip
    cfg = config.load({**render.stack_config("dev"), **{f"spot-trainer:{k}": v for k, v in values.items()}}, "dev")
    monkeypatch.setenv(contract.ENV_LEASE_TTL, str(cfg.jobs.lease_ttl_seconds))
    monkeypatch.setenv(contract.ENV_CHECKPOINT_INTERVAL, str(cfg.jobs.checkpoint_interval_seconds))
    monkeypatch.setenv(contract.ENV_MAX_ATTEMPTS, str(cfg.jobs.max_attempts))
    worker = cli.parser().parse_args(contract.WORKER_ARGS)
    assert worker.lease_ttl == 5.0 and worker.checkpoint_interval == 1.0 and worker.max_attempts == 1
    args = contract.loader_args(cfg.data.dataset_name, cfg.jobs.dataset_preset, cfg.data.dataset.uri)
    runs_file = tmp_path / contract.RUNS_KEY
    runs_file.write_text(cfg.jobs.runs_json)
    args[args.index("--runs-file") + 1] = str(runs_file)
    seed = cli.parser().parse_args(args)
    assert seed.datasets == "gs://a-b/x.y_z/Q1+2024"
    assert check_name(seed.dataset, "dataset") == "Q1-2024"
    assert set(cli.load_runs(seed)) == set(runs)
    assert [check_name(run, "run name") for run in cfg.jobs.runs] == list(cfg.jobs.runs)


def test_the_jobs_failure_policy_reads_the_workers_exit_codes(monkeypatch) -> None:
    """The podFailurePolicy retries, counts or fails on the worker's exit codes as errors.py defines them:
    were they renumbered there, the rendered policy follows (a copy of the numbers in infra/ would not)."""
    from infra import jobs
    from workload.core import errors

    def codes(policy: dict) -> list[tuple[str, list[int]]]:
        return [(rule["action"], rule["onExitCodes"]["values"]) for rule in policy["rules"] if "onExitCodes" in rule]

    assert codes(jobs.failure_policy("worker")) == [
        ("Ignore", list(errors.RETRYABLE_EXIT_CODES)), ("Count", [errors.EXIT_BAD_CONFIG]),
        ("FailJob", [errors.EXIT_INFRA])]
    assert codes(jobs.failure_policy("worker", gpu=True))[-1] == ("FailJob", [errors.EXIT_GPU_UNUSABLE])
    monkeypatch.setattr(errors, "RETRYABLE_EXIT_CODES", (93, 94))
    monkeypatch.setattr(errors, "EXIT_BAD_CONFIG", 92)
    monkeypatch.setattr(errors, "EXIT_INFRA", 91)
    assert codes(jobs.failure_policy("worker")) == [("Ignore", [93, 94]), ("Count", [92]), ("FailJob", [91])]


def test_the_exit_codes_are_defined_once() -> None:
    """No module but workload/core/errors.py names an exit code: one definition, nothing to drift."""
    import ast

    copies = []
    for path in sorted({*ROOT.glob("infra/**/*.py"), *ROOT.glob("policy/**/*.py"), *ROOT.glob("workload/**/*.py"),
                        *ROOT.glob("bench/**/*.py")}):
        if path == ROOT / "workload" / "core" / "errors.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            copies += [f"{path.relative_to(ROOT)}:{node.lineno} {t.id}" for t in targets
                       if isinstance(node, ast.Assign | ast.AnnAssign) and isinstance(t, ast.Name)
                       and re.fullmatch(r"(EXIT_\w+|\w*EXIT_CODES)", t.id)]
    assert copies == []


def test_the_codes_the_jobs_retry_are_those_a_new_pod_can_fix() -> None:
    """Retried free: preemption, a stuck mount. Never success, bad config or dead letters: retrying those
    would run forever or hide a failure; nor an infrastructure fault the pod already rode out for its whole
    retry budget, nor a GPU that CUDA cannot use (the Jobs fail on those)."""
    from workload.core import errors

    assert set(errors.RETRYABLE_EXIT_CODES) == {errors.EXIT_STALLED, errors.EXIT_TERMINATED}
    assert not {errors.EXIT_INFRA, errors.EXIT_GPU_UNUSABLE} & set(errors.RETRYABLE_EXIT_CODES)
    assert not {errors.EXIT_DONE, errors.EXIT_BAD_CONFIG, errors.EXIT_DEAD_LETTERS} & set(errors.RETRYABLE_EXIT_CODES)
    assert errors.EXIT_TERMINATED == 128 + 15  # what Kubernetes shows for a SIGTERM'd process


def test_the_image_takes_torch_for_the_nodes_driver_not_pypis_cuda_13_build() -> None:
    """PyPI's linux torch needs driver R580; GKE's LATEST COS driver has been R570 (workload/Dockerfile):
    the image installs the requirements' torch version from the PyTorch index of a CUDA 12 line, whose
    minimum driver the worker's GPU check names."""
    from workload.runtime import gpu

    dockerfile = (ROOT / "workload" / "Dockerfile").read_text()
    line = re.search(r"^ARG TORCH_CUDA=cu(\d+)$", dockerfile, re.MULTILINE)
    assert line and line[1].startswith("12"), "the image's torch must be a CUDA 12 build (driver R525+)"
    assert gpu.CUDA_MIN_DRIVER["12"] == "R525"
    assert '--index-url "https://download.pytorch.org/whl/${TORCH_CUDA}"' in dockerfile
    pinned = re.search(r"^torch==(\S+)$", (ROOT / "workload" / "requirements.txt").read_text(), re.MULTILINE)
    assert pinned and "sed -n 's/^torch==//p' /app/requirements.txt" in dockerfile
    assert dockerfile.index("TORCH_CUDA") < dockerfile.index("-r /app/requirements.lock")


def test_the_retry_budget_the_jobs_set_is_what_the_worker_rides_out(monkeypatch) -> None:
    """infraRetryBudgetMinutes reaches the worker as its Redis retry and infrastructure give-up times: a
    pod that exits 3 has seen the fault for the whole budget, and the Jobs fail on that exit."""
    monkeypatch.setenv(contract.ENV_REDIS_RETRY, "1800")
    monkeypatch.setenv(contract.ENV_INFRA_GIVE_UP, "1800")
    cfg = cli.worker_config(cli.parser().parse_args(["worker", "--share", "/tmp/x"]))
    assert cfg.redis_retry_s == cfg.infra_give_up_s == 1800.0


def test_the_pods_grace_period_and_the_workers_stop_budgets_are_one_constant(monkeypatch) -> None:
    """The kubelet's SIGKILL comes terminationGracePeriodSeconds after SIGTERM: the worker's hard exit and
    its final-checkpoint budget must fall inside it, by default and as the image's CLI sets them."""
    from infra import jobs
    from workload.core import preemption
    from workload.runtime.config import WorkerConfig

    assert jobs.TERMINATION_GRACE_SECONDS == preemption.GRACE_PERIOD_S
    defaults = WorkerConfig(share=Path("/s"), redis_url="redis://x")
    assert 0 < defaults.term_budget_s < defaults.term_grace_s < jobs.TERMINATION_GRACE_SECONDS
    monkeypatch.delenv("TERM_GRACE_SECONDS", raising=False)
    image = cli.worker_config(cli.parser().parse_args(contract.WORKER_ARGS))
    assert (image.term_grace_s, image.term_budget_s) == (defaults.term_grace_s, defaults.term_budget_s)
