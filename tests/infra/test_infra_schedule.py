"""Continuous training (issue 22, Build 5): with `schedule`, a CronJob runs the loader's command and the
loader starts the training Job that Pulumi rendered, only for work to train (tests/workload/test_launch.py).

Checked for what they mean: the CronJob and the Job body it may post are strictly valid against
Kubernetes 1.33, pass the policy pack, and are played through the Job controller's rules as the stack's
Jobs are; the right to post is `create` on `jobs` in the namespace, for the loader's account only.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace

import kubernetes_validate
import pytest

from infra import config, contract, render, schedule
from infra.render import Registered, Rendered
from policy import offline
from tests.infra.job_controller import FailedPod, JobController
from workload.core import errors

Render = Callable[..., Rendered]
CRON = "kubernetes:batch/v1:CronJob"
JOB = "kubernetes:batch/v1:Job"
DAILY = {"datasetUri": "gs://acme-fraud/exports/v1", "schedule": "0 3 * * *"}


def _posted(r: Rendered) -> dict:
    """The training Job the scheduled loader posts, as the mounted file holds it."""
    (cm,) = [c for c in r.of_type("kubernetes:core/v1:ConfigMap") if c.name == "schedule-job"]
    return json.loads(cm.inputs["data"][contract.LAUNCH_KEY])


@pytest.mark.parametrize("stack", render.stack_names())
def test_the_schedule_runs_the_loader_which_may_start_the_stacks_training_job(stack: str, rendered: Render) -> None:
    r = rendered(stack, **DAILY)
    cron, loader, training = r.one(CRON, "schedule"), r.one(JOB, "loader"), r.one(JOB, "training")
    spec = cron.inputs["spec"]
    assert (spec["schedule"], spec["concurrencyPolicy"], spec["startingDeadlineSeconds"]) == (
        "0 3 * * *", "Forbid", schedule.STARTING_DEADLINE_S)
    job = spec["jobTemplate"]["spec"]
    pod, loader_pod = job["template"]["spec"], loader.inputs["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["args"] == [*loader_pod["containers"][0]["args"], "--launch-job", contract.LAUNCH_FILE]
    assert pod["serviceAccountName"] == loader_pod["serviceAccountName"] == f"{contract.APP}-{contract.LOADER}"
    assert container["image"] == loader_pod["containers"][0]["image"]
    assert "@sha256:" in container["image"]
    # The loader's own rules: same exit codes, same failure policy, same limits.
    assert {k: v for k, v in job.items() if k != "template"} == {
        k: v for k, v in loader.inputs["spec"].items() if k != "template"}
    assert loader.urn in cron.dependencies

    posted = _posted(r)
    assert posted["spec"] == {**training.inputs["spec"], "ttlSecondsAfterFinished": schedule.SCHEDULED_JOB_TTL_S}
    assert posted["metadata"]["name"] == schedule.SCHEDULED_JOB != training.inputs["metadata"]["name"]

    kubernetes_validate.validate(render.to_manifest(cron), "1.33", strict=True)
    kubernetes_validate.validate(posted, "1.33", strict=True)
    as_resource = replace(training, name="scheduled-training", urn=training.urn + "-scheduled",
                          inputs={**posted, "metadata": {**posted["metadata"], "namespace": r.config.namespace}})
    assert offline.mandatory(offline.check([*r.resources, as_resource], offline.facts_of(r))) == []
    assert r.outputs["scheduledLoader"] == f"{contract.APP}-{contract.LOADER}-scheduled"


def test_only_the_loaders_account_may_create_jobs_and_only_with_a_schedule(rendered: Render) -> None:
    r = rendered("dev", **DAILY)
    (role,) = r.of_type("kubernetes:rbac.authorization.k8s.io/v1:Role")
    assert role.inputs["rules"] == [{"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create"]}]
    (binding,) = r.of_type("kubernetes:rbac.authorization.k8s.io/v1:RoleBinding")
    assert binding.inputs["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                         "name": role.inputs["metadata"]["name"]}
    assert binding.inputs["subjects"] == [
        {"kind": "ServiceAccount", "name": f"{contract.APP}-{contract.LOADER}", "namespace": r.config.namespace}]
    for manifest in (role, binding):
        kubernetes_validate.validate(render.to_manifest(manifest), "1.33", strict=True)
    unscheduled = rendered("dev", datasetUri=DAILY["datasetUri"])
    assert not unscheduled.of_type(CRON)
    assert not unscheduled.of_type("kubernetes:rbac.authorization.k8s.io/v1:Role")
    assert unscheduled.outputs["scheduledLoader"] == ""


@pytest.mark.parametrize("stack", render.stack_names())
def test_scheduled_jobs_fail_and_retry_as_the_stacks_jobs_do(stack: str, rendered: Render) -> None:
    r = rendered(stack, **DAILY)
    load = JobController(r.one(CRON, "schedule").inputs["spec"]["jobTemplate"]["spec"])
    assert load.pod_failed(FailedPod({contract.LOADER: 1}, ("DisruptionTarget",))) is None  # preempted
    assert load.pod_failed(FailedPod({contract.LOADER: errors.EXIT_TERMINATED})) is None
    # The launcher could not reach the API server for the budget: an infrastructure fault fails the load.
    assert load.pod_failed(FailedPod({contract.LOADER: errors.EXIT_INFRA})) == "PodFailurePolicy"
    bad = JobController(r.one(CRON, "schedule").inputs["spec"]["jobTemplate"]["spec"])
    assert bad.pod_failed(FailedPod({contract.LOADER: errors.EXIT_BAD_CONFIG})) == "BackoffLimitExceeded"

    train = JobController(_posted(r)["spec"])
    assert train.pod_failed(FailedPod({contract.WORKER: 1}, ("DisruptionTarget",))) is None
    assert train.ignored == 1 and train.counted == 0
    assert train.pod_failed(FailedPod({contract.WORKER: errors.EXIT_GPU_UNUSABLE})) == "PodFailurePolicy"


@pytest.mark.parametrize(("value", "allowed"), [
    ("0 3 * *", "empty (off) or a cron line of five fields such as '0 3 * * *', or one of @yearly, @annually, "
                "@monthly, @weekly, @daily, @midnight, @hourly"),
    ("TZ=UTC 0 3 * * *", None),
    ("@every 1h", None),
])  # fmt: skip
def test_a_bad_schedule_is_one_line_at_preview(value: str, allowed: str | None) -> None:
    with pytest.raises(config.ConfigError) as err:
        config.load(render.stack_config("dev", {**DAILY, "schedule": value}), stack="dev")
    assert str(err.value).startswith(f"config spot-trainer:schedule={value!r} is not allowed: empty (off) or a cron")
    if allowed:
        assert str(err.value).endswith(allowed)
    for good in ("0 3 * * *", "*/15 2-5 1,15 * MON-FRI", "@daily"):
        assert config.load(render.stack_config("dev", {**DAILY, "schedule": good}), stack="dev").jobs.schedule == good


def test_a_schedule_without_a_bucket_is_refused() -> None:
    with pytest.raises(config.ConfigError) as err:
        config.load(render.stack_config("dev", {"schedule": "0 3 * * *"}), stack="dev")
    assert str(err.value) == ("config spot-trainer:schedule='0 3 * * *' is not allowed: empty unless datasetUri is "
                              "set (new days come from there)")


SCORED = {**DAILY, "outputUri": "gs://acme-results/spot-trainer/main"}


def _posted_scoring(r: Rendered) -> dict:
    (cm,) = [c for c in r.of_type("kubernetes:core/v1:ConfigMap") if c.name == "schedule-job"]
    return json.loads(cm.inputs["data"][contract.SCORING_LAUNCH_KEY])


@pytest.mark.parametrize("stack", render.stack_names())
def test_with_an_output_bucket_each_load_may_start_the_stacks_scoring_job(stack: str, rendered: Render) -> None:
    """Build 6 on the schedule: the scoring Job's body is the stack's scoring Job's own spec, the loader
    is told where it is, and the scorer first waits (on CPU, bounded) for training to drain the queue."""
    r = rendered(stack, **SCORED)
    cron, scoring, training = r.one(CRON, "schedule"), r.one(JOB, "scoring"), r.one(JOB, "training")
    (container,) = cron.inputs["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    assert container["args"][-4:] == ["--launch-job", contract.LAUNCH_FILE,
                                      "--launch-scoring", contract.SCORING_LAUNCH_FILE]  # fmt: skip
    posted = _posted_scoring(r)
    assert posted["spec"] == {**scoring.inputs["spec"], "ttlSecondsAfterFinished": schedule.SCHEDULED_JOB_TTL_S}
    assert posted["metadata"]["name"] == schedule.SCHEDULED_SCORING_JOB != scoring.inputs["metadata"]["name"]
    pod = posted["spec"]["template"]["spec"]
    (wait,) = pod["initContainers"]
    deadline = int(training.inputs["spec"]["activeDeadlineSeconds"])
    assert wait["args"] == ["wait-drained", "--timeout", str(deadline)]
    assert posted["spec"]["activeDeadlineSeconds"] > deadline  # time to score after the longest wait
    assert "nvidia.com/gpu" not in json.dumps(pod)  # waiting and scoring on CPU
    assert {e["name"] for e in wait["env"]} >= {contract.ENV_REDIS_URL, contract.ENV_REDIS_PASSWORD}

    kubernetes_validate.validate(posted, "1.33", strict=True)
    as_resource = replace(scoring, name="scheduled-scoring", urn=scoring.urn + "-scheduled",
                          inputs={**posted, "metadata": {**posted["metadata"], "namespace": r.config.namespace}})
    assert offline.mandatory(offline.check([*r.resources, as_resource], offline.facts_of(r))) == []
    policy = r.one("kubernetes:networking.k8s.io/v1:NetworkPolicy", "redis")
    admitted = policy.inputs["spec"]["ingress"][0]["from"][0]["podSelector"]["matchExpressions"][0]["values"]
    assert pod["containers"][0]["env"] and contract.SCORER in admitted  # the waiting scorer may reach Redis

    job = JobController(posted["spec"])  # the scoring Job's own rules: a wait past its deadline is retried
    assert job.pod_failed(FailedPod({contract.WAIT_DRAINED: errors.EXIT_INFRA})) is None
    assert job.pod_failed(FailedPod({contract.WAIT_DRAINED: 1}, ("DisruptionTarget",))) is None
    assert job.pod_failed(FailedPod({"scorer-0": errors.EXIT_BAD_CONFIG})) == "BackoffLimitExceeded"


def test_without_an_output_bucket_the_schedule_scores_nothing(rendered: Render) -> None:
    r = rendered("dev", **DAILY)
    (cm,) = [c for c in r.of_type("kubernetes:core/v1:ConfigMap") if c.name == "schedule-job"]
    assert set(cm.inputs["data"]) == {contract.LAUNCH_KEY}
    (container,) = r.one(CRON, "schedule").inputs["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    assert "--launch-scoring" not in container["args"]


COMPONENT = "spot-trainer:k8s:ScheduledLoad"
ROLE = "kubernetes:rbac.authorization.k8s.io/v1:Role"
BINDING = "kubernetes:rbac.authorization.k8s.io/v1:RoleBinding"
LAUNCH_CM = f"{contract.APP}-launch"
SCHEDULED_LOADER = f"{contract.APP}-{contract.LOADER}-scheduled"


def _children(r: Rendered) -> dict[str, Registered]:
    cm = r.one("kubernetes:core/v1:ConfigMap", "schedule-job")
    return {"configmap": cm, "role": r.one(ROLE), "binding": r.one(BINDING), "cron": r.one(CRON, "schedule")}


def test_the_schedule_is_one_component_whose_objects_go_to_the_stacks_cluster(rendered: Render) -> None:
    """The engine's view: one ScheduledLoad (its URN's type token is what `pulumi state` and an import know
    it by), whose four objects are its children, created through the stack's cluster provider (not the
    default one, which would point at whatever kubeconfig the machine running `pulumi up` has)."""
    r = rendered("dev", **SCORED)
    # Every component of the stack (with a bucket, an output and a schedule, all of them) by its type and name:
    # the names are in every child's URN, so a renamed one would be replaced with everything under it.
    assert sorted((res.type, res.name) for res in r.resources if res.type.startswith("spot-trainer:")) == [
        ("spot-trainer:build:TrainingImage", "image"), ("spot-trainer:gcp:Cluster", "cluster"),
        ("spot-trainer:gcp:Network", "network"), ("spot-trainer:gcp:ProjectServices", "services"),
        ("spot-trainer:iam:WorkloadIdentity", "loader-identity"),
        ("spot-trainer:iam:WorkloadIdentity", "worker-identity"),
        ("spot-trainer:k8s:GpuCapacity", "gpu"), ("spot-trainer:k8s:LoaderJob", "loader"),
        ("spot-trainer:k8s:NamespacePolicies", "network-policy"),
        ("spot-trainer:k8s:RedisQueue", "redis"), ("spot-trainer:k8s:ScheduledLoad", "schedule"),
        ("spot-trainer:k8s:ScoringJob", "scoring"), ("spot-trainer:k8s:TrainingJob", "training"),
        ("spot-trainer:storage:FilestoreShare", "share"), ("spot-trainer:storage:SharePreparation", "share-prep"),
    ]  # fmt: skip
    component = r.one(COMPONENT, "schedule")
    project = f"urn:pulumi:dev::{contract.APP}::"
    assert component.urn == f"{project}pulumi:pulumi:Stack${COMPONENT}::schedule"
    cluster_provider = r.one(JOB, "loader").provider
    assert "pulumi:providers:kubernetes::cluster" in cluster_provider
    for child in _children(r).values():
        assert (child.parent, child.provider) == (component.urn, cluster_provider), child.urn
        assert child.urn == f"{project}{COMPONENT}${child.type}::{child.name}"  # the parent's type, then its own
    # The binding names the role: it waits for it, and the schedule waits for the right to post.
    kids = _children(r)
    assert kids["role"].urn in kids["binding"].dependencies
    assert {kids["binding"].urn, kids["configmap"].urn} <= set(kids["cron"].dependencies)


def test_the_schedules_objects_carry_their_names_and_labels(rendered: Render) -> None:
    """Names the loader's code and kubectl look for, and the labels the NetworkPolicy and `kubectl -l`
    select on: the schedule's objects and pods are the loader's, the Jobs it posts the worker's and scorer's."""
    r = rendered("dev", **SCORED)
    kids = _children(r)
    loader = contract.labels(contract.LOADER)
    expected = {"configmap": LAUNCH_CM, "role": SCHEDULED_LOADER, "binding": SCHEDULED_LOADER,
                "cron": SCHEDULED_LOADER}
    for key, name in expected.items():
        assert kids[key].inputs["metadata"] == {"name": name, "namespace": r.config.namespace, "labels": loader}
    cron_spec = kids["cron"].inputs["spec"]
    assert cron_spec["jobTemplate"]["metadata"] == {"labels": loader}
    assert cron_spec["jobTemplate"]["spec"]["template"]["metadata"]["labels"] == loader
    assert _posted(r)["metadata"] == {"name": schedule.SCHEDULED_JOB, "labels": contract.labels(contract.WORKER)}
    assert _posted_scoring(r)["metadata"] == {"name": schedule.SCHEDULED_SCORING_JOB,
                                              "labels": contract.labels(contract.SCORER)}


def test_the_cron_job_runs_in_utc_and_keeps_three_of_each_finished_load(rendered: Render) -> None:
    spec = rendered("dev", **DAILY).one(CRON, "schedule").inputs["spec"]
    assert (spec["timeZone"], spec["successfulJobsHistoryLimit"], spec["failedJobsHistoryLimit"]) == ("Etc/UTC", 3, 3)


@pytest.mark.parametrize("overrides", [DAILY, SCORED], ids=["trains", "scores"])
def test_the_scheduled_load_is_the_loaders_pod_with_the_launch_file_mounted_read_only(
    overrides: dict, rendered: Render
) -> None:
    """The same pod as the stack's loader (its runs file, its seed-inputs annotation, its account), plus the
    launch ConfigMap mounted read-only: the loader reads the Job bodies from there and must not change them."""
    r = rendered("dev", **overrides)
    loader = r.one(JOB, "loader").inputs["spec"]["template"]
    template = r.one(CRON, "schedule").inputs["spec"]["jobTemplate"]["spec"]["template"]
    assert template["metadata"] == loader["metadata"]
    pod, loader_pod = template["spec"], loader["spec"]
    (container,), (loader_container,) = pod["containers"], loader_pod["containers"]
    launch_args = ["--launch-job", contract.LAUNCH_FILE]
    if "outputUri" in overrides:
        launch_args += ["--launch-scoring", contract.SCORING_LAUNCH_FILE]
    assert container == {
        **loader_container,
        "args": [*loader_container["args"], *launch_args],
        "volumeMounts": [*loader_container["volumeMounts"],
                         {"name": schedule.LAUNCH_VOLUME, "mountPath": contract.LAUNCH_DIR, "readOnly": True}],
    }
    assert pod == {
        **loader_pod,
        "containers": [container],
        "volumes": [*loader_pod["volumes"], {"name": schedule.LAUNCH_VOLUME, "configMap": {"name": LAUNCH_CM}}],
    }


@pytest.mark.parametrize("stack", render.stack_names())
def test_the_posted_training_job_runs_as_the_workers_account(stack: str, rendered: Render) -> None:
    """With an output bucket the workers have their own Workload Identity (the right to write results):
    the Job the schedule posts runs under it, as the stack's training Job does."""
    r = rendered(stack, **SCORED)
    training = r.one(JOB, "training").inputs["spec"]["template"]["spec"]
    posted = _posted(r)["spec"]["template"]["spec"]
    assert posted["serviceAccountName"] == training["serviceAccountName"] == f"{contract.APP}-{contract.WORKER}"
    assert _posted(r)["spec"] == {**r.one(JOB, "training").inputs["spec"],
                                  "ttlSecondsAfterFinished": schedule.SCHEDULED_JOB_TTL_S}
