"""The Jobs built through infra.program's own wiring (``program.workloads``): their failure rules played through
the Job controller, their pods admitted by the namespace's Pod Security level and by the Redis NetworkPolicy,
what they mount and carry, the one-off pods, every object strictly valid."""

from __future__ import annotations

import copy
import json
import shlex
from typing import Any

import kubernetes_validate
import pytest

from infra import config, contract, jobs, program, render
from infra.gke import ZONE_LABEL
from tests.infra.components import (
    DATA,
    IMAGE,
    JOB,
    KUBERNETES_VERSION,
    READING,
    _strictly_valid,
    admitted_by_redis,
    container,
    env,
    pod,
    workloads,
)
from tests.infra.job_controller import FailedPod, JobController
from tests.infra.pod_security import pod_security_violations
from workload.core import errors

# --- the Jobs ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["loader", "training"])
def test_the_failure_policy_means_what_the_design_says(name: str) -> None:
    b = workloads()
    job = b.one(JOB, name)
    spec, worker = job.inputs["spec"], container(job)["name"]
    limit = 0 if name == "loader" else b.cfg.jobs.backoff_limit
    assert spec["backoffLimit"] == limit
    ctl = JobController(spec)
    for code in errors.RETRYABLE_EXIT_CODES:  # a new pod does better: free
        assert ctl.pod_failed(FailedPod({worker: code})) is None
    assert ctl.pod_failed(FailedPod({worker: 1}, ("DisruptionTarget",))) is None  # preempted: free
    assert ctl.pod_failed(FailedPod({"sidecar": errors.EXIT_INFRA, worker: 0})) is None or limit == 0
    assert ctl.counted == (1 if limit == 0 else 1) and ctl.ignored == len(errors.RETRYABLE_EXIT_CODES) + 1
    fresh = JobController(spec)
    reasons = [fresh.pod_failed(FailedPod({worker: errors.EXIT_BAD_CONFIG})) for _ in range(limit + 1)]
    assert reasons == [None] * limit + ["BackoffLimitExceeded"]
    assert reasons[-1] in jobs.AWAIT_FAILURE_REASONS
    counted = JobController(spec)
    assert [counted.pod_failed(FailedPod({worker: 1})) for _ in range(limit + 1)][-1] == "BackoffLimitExceeded"
    rules = spec["podFailurePolicy"]["rules"]
    # FailJob's reason is not awaited: only exits no new pod can fix use it, exit 3 (the infrastructure
    # down for the pod's whole retry budget) and, on GPU pods, exit 6 (a driver CUDA cannot use).
    fail_job = [r["onExitCodes"]["values"] for r in rules if r["action"] == "FailJob"]
    assert fail_job == [[errors.EXIT_INFRA]] + ([[errors.EXIT_GPU_UNUSABLE]] if name == "training" else [])
    assert {r["action"] for r in rules} <= {"Ignore", "Count", "FailJob"}
    # Every exit-code rule reads the worker's container only: another container of the pod (a sidecar) exiting 3
    # or 6 says nothing about the worker's infrastructure budget or its GPU.
    assert [r["onExitCodes"]["containerName"] for r in rules if "onExitCodes" in r] == [worker] * (len(rules) - 1)
    for code in (errors.EXIT_INFRA, errors.EXIT_GPU_UNUSABLE):
        assert JobController(spec).pod_failed(FailedPod({"sidecar": code, worker: 0})) != "PodFailurePolicy"


def _at(inputs: dict[str, Any], path: str) -> Any:
    for key in path.split("."):
        inputs = inputs[key]
    return inputs


def test_a_change_to_a_jobs_failure_policy_replaces_the_job_instead_of_patching_it() -> None:
    """podFailurePolicy is immutable in the API (ValidateJobSpecUpdate) and not replace-on-change in the provider:
    every Job Pulumi manages names it in replaceOnChanges, and deletes the old Job first (its name is fixed)."""
    b = workloads(**DATA)
    managed = b.of_type(JOB)
    assert {j.name for j in managed} == {"share-prep", "loader", "training", "scoring"}
    for job in managed:
        assert jobs.REPLACE_ON_CHANGES == ["spec.podFailurePolicy"] == job.replace_on_changes, job.name
        assert _at(job.inputs, job.replace_on_changes[0])["rules"], f"{job.name}: the path names its rules"
        assert job.delete_before_replace, job.name


def test_the_jobs_run_for_as_long_as_the_config_says() -> None:
    b = workloads(jobAwait="wait")
    loader, training = b.one(JOB, "loader"), b.one(JOB, "training")
    minutes = b.cfg.jobs.loader_timeout_minutes
    assert loader.inputs["spec"]["activeDeadlineSeconds"] == minutes * 60
    assert loader.custom_timeouts == {"create": f"{minutes}m", "update": f"{minutes}m"}
    assert training.inputs["spec"]["activeDeadlineSeconds"] == b.cfg.jobs.active_deadline_seconds
    assert training.inputs["spec"]["parallelism"] == b.cfg.jobs.parallelism
    assert "completions" not in training.inputs["spec"]  # work-queue Job
    wait = f"{b.cfg.jobs.timeout_minutes}m"
    assert training.custom_timeouts == {"create": wait, "update": wait}
    for job in (loader, training):
        assert "ttlSecondsAfterFinished" not in job.inputs["spec"]
        assert job.delete_before_replace
        assert jobs.SKIP_AWAIT not in job.inputs["metadata"].get("annotations", {})
    skipped = workloads(jobAwait="skip")
    training = skipped.one(JOB, "training")
    assert training.inputs["metadata"]["annotations"] == {jobs.SKIP_AWAIT: "true"}
    assert not training.custom_timeouts
    assert jobs.SKIP_AWAIT not in skipped.one(JOB, "loader").inputs["metadata"].get("annotations", {})


def test_the_jobs_pods_reach_redis_and_the_share() -> None:
    b = workloads()
    r, share = b.made["redis"], b.made["share"]
    secret = b.one("kubernetes:core/v1:Secret").inputs
    # The workloads run as the owner the share preparation hands the share root to.
    owner = env(container(b.one(JOB, "share-prep")))["OWNER"]
    for name, component in (("loader", contract.LOADER), ("training", contract.WORKER)):
        job = b.one(JOB, name)
        meta = job.inputs["metadata"]
        assert meta["name"] == f"{b.cfg.labels.app}-{component}" and meta["namespace"] == b.cfg.namespace
        assert meta["labels"] == contract.labels(component)
        assert job.inputs["spec"]["template"]["metadata"]["labels"] == contract.labels(component)
        assert admitted_by_redis(b, job.inputs["spec"]["template"]["metadata"]["labels"])
        c = container(job)
        assert c["name"] == component and c["image"] == IMAGE
        ids = pod(job)["securityContext"]
        assert f"{ids['runAsUser']:.0f}:{ids['runAsGroup']:.0f}" == owner and ids["fsGroup"] == ids["runAsGroup"]
        assert c["terminationMessagePolicy"] == "FallbackToLogsOnError"
        assert pod(job)["terminationGracePeriodSeconds"] == jobs.TERMINATION_GRACE_SECONDS <= 15
        values = env(c)
        ref = values[contract.ENV_REDIS_PASSWORD]["secretKeyRef"]
        assert ref["name"] == secret["metadata"]["name"] and ref["key"] in secret["stringData"]
        assert secret["stringData"][ref["key"]] == "p" * 32  # the password itself, not the config line
        assert values[contract.ENV_REDIS_URL] == b.resolved["redis_url"] == r.url
        assert values[contract.ENV_WORKER_ID] == {"fieldRef": {"fieldPath": "metadata.name"}}
        assert values[contract.ENV_LEASE_TTL] == str(b.cfg.jobs.lease_ttl_seconds)
        assert values[contract.ENV_CHECKPOINT_INTERVAL] == str(b.cfg.jobs.checkpoint_interval_seconds)
        assert values[contract.ENV_MAX_ATTEMPTS] == str(b.cfg.jobs.max_attempts)
        # infraRetryBudgetMinutes, in the seconds the worker reads (its Redis retry and give-up times)
        budget = str(b.cfg.jobs.infra_retry_budget_minutes * 60)
        assert values[contract.ENV_REDIS_RETRY] == values[contract.ENV_INFRA_GIVE_UP] == budget
        # the stack sets no column mapping or date format: `seed` reads our names and ISO 8601
        assert contract.ENV_DATASET_COLUMNS not in values and contract.ENV_DATASET_DATETIME_FORMAT not in values
        mounts = {m["name"]: m for m in c["volumeMounts"]}
        volumes = {v["name"]: v for v in pod(job)["volumes"]}
        assert set(mounts) == set(volumes)
        (at_share,) = [n for n, m in mounts.items() if m["mountPath"] == values[contract.ENV_SHARE_DIR]]
        assert values[contract.ENV_SHARE_DIR] == contract.SHARE_DIR
        assert volumes[at_share]["persistentVolumeClaim"]["claimName"] == share.claim_name
        assert not mounts[at_share].get("readOnly")


def test_workers_request_the_gpus_and_land_on_the_spot_capacity() -> None:
    b = workloads(gpuCount=2)
    training, loader = b.one(JOB, "training"), b.one(JOB, "loader")
    res = container(training)["resources"]
    assert res["requests"]["nvidia.com/gpu"] == res["limits"]["nvidia.com/gpu"] == "2"
    assert res["requests"]["memory"] == res["limits"]["memory"] == b.cfg.jobs.worker_memory
    assert res["requests"]["cpu"] == b.cfg.jobs.worker_cpu
    capacity = b.made["capacity"]
    selector = dict(capacity.node_selector)
    if b.cfg.filestore.pin_to_zone:
        selector[ZONE_LABEL] = b.cfg.zone
    assert pod(training)["nodeSelector"] == selector
    assert pod(training)["tolerations"] == capacity.tolerations
    assert "tolerations" not in pod(loader)  # the loader needs no GPU node
    loader_res = container(loader)["resources"]
    assert loader_res["requests"]["memory"] == loader_res["limits"]["memory"]
    assert "nvidia.com/gpu" not in loader_res["requests"]
    unpinned = workloads(filestoreTier="REGIONAL")
    assert "nodeSelector" not in pod(unpinned.one(JOB, "loader"))


def test_on_cpu_workers_ask_for_no_gpu_and_land_on_spot_pods() -> None:
    """trainOn=cpu (issue 33): Autopilot Spot Pods with one torch thread; no GPU request, compute class, GPU exit
    rule or quota check."""
    b = workloads(trainOn="cpu", filestoreTier="REGIONAL")
    training = b.one(JOB, "training")
    res = container(training)["resources"]
    assert "nvidia.com/gpu" not in res["requests"] and "nvidia.com/gpu" not in res["limits"]
    assert res["requests"]["cpu"] == b.cfg.jobs.worker_cpu
    assert pod(training)["nodeSelector"] == {"cloud.google.com/gke-spot": "true"}
    assert not b.made["capacity"].resources  # no compute class
    variables = env(container(training))
    assert variables[contract.ENV_EXPECTED_GPUS] == "0" and variables[contract.ENV_TORCH_THREADS] == "1"
    rules = training.inputs["spec"]["podFailurePolicy"]["rules"]
    assert not [r for r in rules if errors.EXIT_GPU_UNUSABLE in r.get("onExitCodes", {}).get("values", [])]
    assert b.cfg.gpu.check_quota is False
    on_gpu = workloads()
    assert contract.ENV_TORCH_THREADS not in env(container(on_gpu.one(JOB, "training")))
    assert on_gpu.cfg.gpu.check_quota


def test_the_loader_reads_the_runs_from_an_immutable_config_map() -> None:
    b = workloads(runs={"main": {}, "wide": {"hidden": [128, 64]}}, **READING)
    cm = b.one("kubernetes:core/v1:ConfigMap")
    assert cm.inputs["immutable"] is True and cm.delete_before_replace
    # Labelled as its Job is: `kubectl -l app.kubernetes.io/component=loader` (docs/cloud.md) finds it too.
    assert cm.inputs["metadata"]["labels"] == contract.labels(contract.LOADER)
    assert json.loads(cm.inputs["data"][contract.RUNS_KEY]) == json.loads(b.cfg.jobs.runs_json)
    loader = b.one(JOB, "loader")
    c = container(loader)
    (runs_mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == contract.RUNS_DIR]
    assert runs_mount["readOnly"] is True
    (runs_volume,) = [v for v in pod(loader)["volumes"] if v["name"] == runs_mount["name"]]
    assert runs_volume["configMap"]["name"] == cm.inputs["metadata"]["name"]
    assert c["args"] == contract.loader_args(b.cfg.data.dataset_name, b.cfg.jobs.dataset_preset, None)
    assert container(b.one(JOB, "training"))["args"] == contract.WORKER_ARGS
    # ...and the stack's data through its column mapping and date format (`seed` reads them from its env)
    reading = {contract.ENV_DATASET_COLUMNS: '{"card_id": "CUSTOMER_ID", "ts": "TX_DATETIME"}',
               contract.ENV_DATASET_DATETIME_FORMAT: "%d/%m/%Y %H:%M"}
    assert {k: v for k, v in env(c).items() if k in reading} == reading
    assert not set(reading) & set(env(container(b.one(JOB, "training"))))  # the loader's alone
    for dep in (
        "kubernetes:apps/v1:Deployment",
        "kubernetes:networking.k8s.io/v1:NetworkPolicy",
        "kubernetes:core/v1:ConfigMap",
    ):
        assert b.one(dep, "redis" if "NetworkPolicy" in dep else None).urn in loader.dependencies, dep
    claim = next(r for r in b.of_type("kubernetes:core/v1:PersistentVolumeClaim") if r.name == "share")
    assert claim.urn in loader.dependencies
    assert b.one(JOB, "share-prep").urn in loader.dependencies
    assert loader.urn in b.one(JOB, "training").dependencies


def test_identities_are_worn_only_by_their_own_pods() -> None:
    b = workloads(**DATA)
    loader, training = b.one(JOB, "loader"), b.one(JOB, "training")
    assert pod(loader)["serviceAccountName"] == b.made["loader_id"].ksa_name
    assert pod(training)["serviceAccountName"] == b.made["worker_id"].ksa_name
    assert env(container(training))[contract.ENV_OUTPUT_URI] == DATA["outputUri"]
    assert contract.ENV_OUTPUT_URI not in env(container(loader))
    assert container(loader)["args"] == contract.loader_args(
        b.cfg.data.dataset_name, b.cfg.jobs.dataset_preset, DATA["datasetUri"]
    )
    for urns, job in ((b.resolved["loader_id_urns"], loader), (b.resolved["worker_id_urns"], training)):
        assert len(urns) == 3 and set(urns) <= set(job.dependencies)  # KSA, its binding, the bucket grant
    plain = workloads()
    assert "serviceAccountName" not in pod(plain.one(JOB, "training"))


def _job_args(values: dict[str, str], stack: str) -> jobs.JobArgs:
    return program.job_args(config.load(values, stack=stack))


def test_what_the_loader_seeds_from_decides_both_jobs_annotation() -> None:
    cfg = config.load(render.stack_config("dev", {}), stack="dev")
    base = jobs.seed_inputs(program.job_args(cfg), IMAGE)
    (other_preset,) = set(contract.DATASET_PRESETS) - {cfg.jobs.dataset_preset}
    assert len(base) == 16 and int(base, 16) >= 0 and base == jobs.seed_inputs(program.job_args(cfg), IMAGE)
    changed = [
        jobs.seed_inputs(program.job_args(cfg), IMAGE.replace("ab", "cd")),
        jobs.seed_inputs(_job_args(render.stack_config("dev", {"runs": {"other": {}}}), stack="dev"), IMAGE),
        jobs.seed_inputs(_job_args(render.stack_config("dev", {"datasetPreset": other_preset}), stack="dev"), IMAGE),
        jobs.seed_inputs(_job_args(render.stack_config("dev", {"datasetName": "other"}), stack="dev"), IMAGE),
        jobs.seed_inputs(_job_args(render.stack_config("dev", DATA), stack="dev"), IMAGE),
        # the same dataset name (the last folder) at a new location: new data to load
        jobs.seed_inputs(_job_args(render.stack_config("dev", {**DATA, "datasetUri": "gs://acme-fraud-2/exports"}),
                                     stack="dev"), IMAGE),
        # a column mapping or a date format alone, or both: the same files read another way
        *(jobs.seed_inputs(_job_args(render.stack_config("dev", reading), stack="dev"), IMAGE)
          for reading in ({"datasetColumns": READING["datasetColumns"]},
                          {"datasetDatetimeFormat": READING["datasetDatetimeFormat"]}, READING)),
    ]
    assert base not in changed and len(set(changed)) == len(changed)
    # Deployed stacks carry this value: an encoding that changed (keys, order, length) would replace both
    # Jobs of every stack at its next `pulumi up` with nothing new to seed, rerunning the loader and
    # restarting the workers. The same inputs keep the value their stacks were deployed with.
    pinned = {"runs": {"main": {}, "wide": {"hidden": [128, 64]}}, "datasetPreset": "small", "datasetName": "fraud"}
    deployed = config.load(render.stack_config("dev", pinned), stack="dev")
    assert jobs.seed_inputs(program.job_args(deployed), "reg/img@sha256:" + "0" * 64) == "60cc4f7ce852a905"
    read = config.load(render.stack_config("dev", {**pinned, **READING}), stack="dev")
    assert jobs.seed_inputs(program.job_args(read), "reg/img@sha256:" + "0" * 64) == "d2b2c9fe15d83664"
    b = workloads()
    for name in ("loader", "training"):
        notes = b.one(JOB, name).inputs["spec"]["template"]["metadata"]["annotations"]
        assert notes == {contract.SEED_INPUTS_ANNOTATION: base}


def _kubectl_run(line: str) -> tuple[list[str], dict[str, Any]]:
    words = shlex.split(line)
    (overrides,) = [w.partition("=")[2] for w in words if w.startswith("--overrides=")]
    return words, json.loads(overrides)


def test_one_off_pods_run_like_the_loader_and_pass_the_namespaces_checks() -> None:
    b = workloads(**DATA)
    words, spec = _kubectl_run(b.resolved["status"])
    assert words[:6] == ["kubectl", "-n", b.cfg.namespace, "run", "status", "--rm"]
    assert {"-i", "--restart=Never", f"--image={IMAGE}"} <= set(words)
    kubernetes_validate.validate(
        {**spec, "kind": "Pod", "metadata": {"name": "status", **spec["metadata"]}}, KUBERNETES_VERSION, strict=True
    )
    assert spec["apiVersion"] == "v1" and spec["metadata"]["labels"] == contract.labels(contract.LOADER)
    assert not pod_security_violations(spec["spec"], "restricted")
    (c,) = spec["spec"]["containers"]
    assert c["name"] == "status" and c["args"] == contract.STATUS_ARGS and "resources" not in c
    # kubectl applies --overrides as a JSON merge patch over the pod it generates: a null image would
    # delete the image --image set, and the API server refuses a container without one.
    assert c["image"] == IMAGE
    assert "command" not in c and "serviceAccountName" not in spec["spec"]
    assert env(c)[contract.ENV_REDIS_URL] == b.resolved["redis_url"]
    _, report = _kubectl_run(b.resolved["report"])
    (c,) = report["spec"]["containers"]
    assert c["command"][:2] == ["sh", "-c"] and c["name"] == "report" and "serviceAccountName" not in report["spec"]
    (run,) = b.cfg.jobs.runs
    _, export = _kubectl_run(b.resolved[f"export-{run}"])
    (c,) = export["spec"]["containers"]
    assert c["args"] == contract.export_args(run, DATA["outputUri"]) and c["name"] == "export"
    assert export["spec"]["serviceAccountName"] == b.made["worker_id"].ksa_name


@pytest.mark.parametrize(
    ("stack", "overrides"),
    [
        ("dev", {}),
        ("prod", {}),
        ("dev", {"clusterMode": "standard", "gpuCapacity": "nodeSelector", **DATA}),
        ("dev", {"trainOn": "cpu"}),
    ],
    ids=["dev", "prod", "standard-with-data", "cpu"],
)
def test_every_workload_object_is_valid_and_admitted(stack: str, overrides: dict[str, Any]) -> None:
    b = workloads(stack, **overrides)
    _strictly_valid(b)
    for job in b.of_type(JOB):
        level = "baseline" if job.inputs["metadata"]["name"].endswith(contract.SHARE_PREP) else "restricted"
        assert not pod_security_violations(pod(job), level), job.name
        assert pod(job)["restartPolicy"] == "Never"  # a Job's podFailurePolicy requires it
        assert pod(job)["automountServiceAccountToken"] is bool(pod(job).get("serviceAccountName"))


@pytest.mark.parametrize(("setting", "violation"), [
    ({"runAsNonRoot": False}, "pod sets runAsNonRoot false"),
    ({"seccompProfile": {"type": "runtimedefault"}}, "pod seccomp profile is 'runtimedefault'"),
])
def test_a_pod_level_setting_the_containers_override_still_keeps_the_pod_out(setting: dict[str, Any],
                                                                             violation: str) -> None:
    """The restricted level judges the pod's own securityContext too, not only what each container ends up
    with: a workload pod with one pod-level field changed is refused, though its container sets both."""
    jobs = workloads("dev").of_type(JOB)
    job = next(j for j in jobs if not j.inputs["metadata"]["name"].endswith(contract.SHARE_PREP))
    spec = copy.deepcopy(pod(job))
    assert not pod_security_violations(spec, "restricted")
    spec["securityContext"].update(setting)
    assert violation in pod_security_violations(spec, "restricted")
