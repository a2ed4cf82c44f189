"""Continuous training (issue 22, Build 5; issue 36): with `schedule`, a CronJob runs the loader's command, which
records what it added, and a launcher of its own starts the training Job that Pulumi rendered, only for work to
train (tests/workload/test_launch.py).

Checked for what they mean: the CronJobs and the Job bodies the launcher may post are strictly valid against
Kubernetes 1.33, pass the policy pack, and are played through the Job controller's rules as the stack's
Jobs are; the right to post is `create` on `jobs` in the namespace (and `get` on the stack's training Job), for
the launcher's account only, which no Google identity, share or bucket comes with.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import kubernetes_validate
import pytest

from infra import config, contract, jobs, render, schedule
from infra.render import Registered, Rendered
from policy import offline
from tests.infra.job_controller import FailedPod, JobController
from tests.infra.pod_security import pod_security_violations
from workload.core import errors

Render = Callable[..., Rendered]
DOCS = Path(__file__).parents[2] / "docs" / "cloud.md"
CRON = "kubernetes:batch/v1:CronJob"
JOB = "kubernetes:batch/v1:Job"
DAILY = {"datasetUri": "gs://acme-fraud/exports/v1", "schedule": "0 3 * * *"}


def _posted(r: Rendered) -> dict:
    """The training Job the launcher posts, as the mounted file holds it."""
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
    assert container["args"] == [*loader_pod["containers"][0]["args"], contract.REQUEST_LAUNCH]
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


def test_only_the_launchers_account_may_create_jobs_and_only_with_a_schedule(rendered: Render) -> None:
    r = rendered("dev", **DAILY)
    (role,) = r.of_type("kubernetes:rbac.authorization.k8s.io/v1:Role")
    training = r.one(JOB, "training").inputs["metadata"]["name"]
    assert role.inputs["rules"] == [
        {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create"]},
        {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get"], "resourceNames": [training]},
    ]
    (binding,) = r.of_type("kubernetes:rbac.authorization.k8s.io/v1:RoleBinding")
    assert binding.inputs["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                         "name": role.inputs["metadata"]["name"]}
    assert binding.inputs["subjects"] == [{"kind": "ServiceAccount", "name": LAUNCHER, "namespace": r.config.namespace}]
    # The launcher's account is a plain Kubernetes one: no Google service account behind it.
    account = r.one("kubernetes:core/v1:ServiceAccount", "schedule-launcher")
    assert account.inputs["metadata"] == {"name": LAUNCHER, "namespace": r.config.namespace,
                                          "labels": contract.labels(contract.LAUNCHER)}
    assert LAUNCHER not in json.dumps([g.inputs for g in r.resources if g.type.startswith("gcp:")])
    for manifest in (role, binding, account):
        kubernetes_validate.validate(render.to_manifest(manifest), "1.33", strict=True)
    unscheduled = rendered("dev", datasetUri=DAILY["datasetUri"])
    assert not unscheduled.of_type(CRON)
    assert not unscheduled.of_type("kubernetes:rbac.authorization.k8s.io/v1:Role")
    assert not unscheduled.of_type(POLICY)
    assert unscheduled.outputs["scheduledLoader"] == ""


@pytest.mark.parametrize("stack", render.stack_names())
def test_scheduled_jobs_fail_and_retry_as_the_stacks_jobs_do(stack: str, rendered: Render) -> None:
    r = rendered(stack, **DAILY)
    load = JobController(r.one(CRON, "schedule").inputs["spec"]["jobTemplate"]["spec"])
    assert load.pod_failed(FailedPod({contract.LOADER: 1}, ("DisruptionTarget",))) is None  # preempted
    assert load.pod_failed(FailedPod({contract.LOADER: errors.EXIT_TERMINATED})) is None
    # Redis or the share failed for the whole budget: an infrastructure fault fails the load.
    assert load.pod_failed(FailedPod({contract.LOADER: errors.EXIT_INFRA})) == "PodFailurePolicy"
    launcher = JobController(r.one(CRON, "schedule-launcher").inputs["spec"]["jobTemplate"]["spec"])
    assert launcher.pod_failed(FailedPod({contract.LAUNCHER: 1}, ("DisruptionTarget",))) is None
    # The API server or Redis out of reach for the budget, or the queue not drained in time: the next schedule.
    assert launcher.pod_failed(FailedPod({contract.LAUNCHER: errors.EXIT_INFRA})) == "PodFailurePolicy"
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
    cron, scoring, training = r.one(CRON, "schedule-launcher"), r.one(JOB, "scoring"), r.one(JOB, "training")
    (container,) = cron.inputs["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    assert container["args"][:5] == ["launch", "--job", contract.LAUNCH_FILE,
                                     "--scoring", contract.SCORING_LAUNCH_FILE]  # fmt: skip
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
    for cron in ("schedule", "schedule-launcher"):
        (container,) = r.one(CRON, cron).inputs["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
        assert "--scoring" not in container["args"]
    (policy,) = r.of_type(POLICY)  # and the launcher may not post one
    assert schedule.SCHEDULED_SCORING_JOB not in json.dumps(policy.inputs)


COMPONENT = "spot-trainer:k8s:ScheduledLoad"
POLICY = "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicy"
LAUNCHER = f"{contract.APP}-{contract.LAUNCHER}"
ROLE = "kubernetes:rbac.authorization.k8s.io/v1:Role"
BINDING = "kubernetes:rbac.authorization.k8s.io/v1:RoleBinding"
LAUNCH_CM = f"{contract.APP}-launch"
SCHEDULED_LOADER = f"{contract.APP}-{contract.LOADER}-scheduled"


def _children(r: Rendered) -> dict[str, Registered]:
    cm = r.one("kubernetes:core/v1:ConfigMap", "schedule-job")
    return {"configmap": cm, "role": r.one(ROLE), "binding": r.one(BINDING), "cron": r.one(CRON, "schedule"),
            "account": r.one("kubernetes:core/v1:ServiceAccount", "schedule-launcher"),
            "launcher": r.one(CRON, "schedule-launcher")}


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
        ("spot-trainer:k8s:GpuCapacity", "gpu"), ("spot-trainer:k8s:LaunchAdmission", "schedule-admission"),
        ("spot-trainer:k8s:LoaderJob", "loader"),
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
    # The binding names the role: it waits for it, and the launcher waits for the right to post and its limits.
    kids = _children(r)
    assert kids["role"].urn in kids["binding"].dependencies
    admission = r.one("kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicyBinding")
    assert {kids["binding"].urn, kids["configmap"].urn, admission.urn} <= set(kids["launcher"].dependencies)
    assert admission.parent == r.one("spot-trainer:k8s:LaunchAdmission").urn
    assert r.one("spot-trainer:k8s:LaunchAdmission").parent == component.urn


def test_the_schedules_objects_carry_their_names_and_labels(rendered: Render) -> None:
    """Names the loader's code and kubectl look for, and the labels the NetworkPolicy and `kubectl -l`
    select on: the schedule's objects and pods are the loader's, the Jobs it posts the worker's and scorer's."""
    r = rendered("dev", **SCORED)
    kids = _children(r)
    loader, launcher = contract.labels(contract.LOADER), contract.labels(contract.LAUNCHER)
    expected = {"configmap": (LAUNCH_CM, launcher), "role": (LAUNCHER, launcher), "binding": (LAUNCHER, launcher),
                "cron": (SCHEDULED_LOADER, loader), "launcher": (f"{LAUNCHER}-scheduled", launcher)}
    for key, (name, labels) in expected.items():
        assert kids[key].inputs["metadata"] == {"name": name, "namespace": r.config.namespace, "labels": labels}
    for key, labels in (("cron", loader), ("launcher", launcher)):
        cron_spec = kids[key].inputs["spec"]
        assert cron_spec["jobTemplate"]["metadata"] == {"labels": labels}
        assert cron_spec["jobTemplate"]["spec"]["template"]["metadata"]["labels"] == labels
    assert _posted(r)["metadata"] == {"name": schedule.SCHEDULED_JOB, "labels": contract.labels(contract.WORKER)}
    assert _posted_scoring(r)["metadata"] == {"name": schedule.SCHEDULED_SCORING_JOB,
                                              "labels": contract.labels(contract.SCORER)}


def test_the_cron_jobs_run_in_utc_and_keep_three_of_each_finished_run(rendered: Render) -> None:
    for cron in ("schedule", "schedule-launcher"):
        spec = rendered("dev", **DAILY).one(CRON, cron).inputs["spec"]
        assert (spec["timeZone"], spec["successfulJobsHistoryLimit"], spec["failedJobsHistoryLimit"]) == (
            "Etc/UTC", 3, 3)


@pytest.mark.parametrize("overrides", [DAILY, SCORED], ids=["trains", "scores"])
def test_the_scheduled_load_is_the_loaders_pod_that_only_records_its_request(overrides: dict, rendered: Render) -> None:
    """The same pod as the stack's loader (its runs file, its seed-inputs annotation, its account), plus
    --request-launch: no Job body mounted, no right to post (its account is bound to no Role)."""
    r = rendered("dev", **overrides)
    loader = r.one(JOB, "loader").inputs["spec"]["template"]
    template = r.one(CRON, "schedule").inputs["spec"]["jobTemplate"]["spec"]["template"]
    assert template["metadata"] == loader["metadata"]
    pod, loader_pod = template["spec"], loader["spec"]
    (container,), (loader_container,) = pod["containers"], loader_pod["containers"]
    assert container == {**loader_container, "args": [*loader_container["args"], contract.REQUEST_LAUNCH]}
    assert pod == {**loader_pod, "containers": [container]}
    subjects = [s["name"] for b in r.of_type(BINDING) for s in b.inputs["subjects"]]
    assert pod["serviceAccountName"] not in subjects


@pytest.mark.parametrize("overrides", [DAILY, SCORED], ids=["trains", "scores"])
def test_the_launcher_is_a_small_pod_of_its_own_without_share_bucket_or_google_identity(
    overrides: dict, rendered: Render
) -> None:
    """Its own account (whose token it posts with), the Job bodies mounted read-only, Redis's address and password;
    no share, no Google identity, 0.1 CPU while it waits; a deadline that covers the load's wait and the drain's."""
    r = rendered("dev", **overrides)
    cron = r.one(CRON, "schedule-launcher")
    spec = cron.inputs["spec"]
    assert (spec["schedule"], spec["concurrencyPolicy"]) == (DAILY["schedule"], "Forbid")
    job = spec["jobTemplate"]["spec"]
    pod = job["template"]["spec"]
    (container,) = pod["containers"]
    assert (pod["serviceAccountName"], pod["automountServiceAccountToken"]) == (LAUNCHER, True)
    assert pod["volumes"] == [{"name": schedule.LAUNCH_VOLUME, "configMap": {"name": LAUNCH_CM}}]
    assert container["volumeMounts"] == [{"name": schedule.LAUNCH_VOLUME, "mountPath": contract.LAUNCH_DIR,
                                          "readOnly": True}]  # fmt: skip
    assert container["resources"] == schedule.LAUNCHER_RESOURCES
    # What docs/cloud.md tells a reviewer the launcher's wait holds, and what the scoring pod's would.
    cloud = " ".join(DOCS.read_text().split())
    assert schedule.LAUNCHER_RESOURCES["requests"] == {"cpu": "100m", "memory": "256Mi"}
    assert "a pod of its own (0.1 CPU, 256 MiB)" in cloud and "the launcher's 0.1 CPU" in cloud
    if "outputUri" in overrides:
        scorers = _posted_scoring(r)["spec"]["template"]["spec"]["containers"]
        assert {json.dumps(c["resources"]["requests"]) for c in scorers} == {'{"cpu": "2", "memory": "4Gi"}'}
        assert "2 CPU and 4 GiB per scored run" in cloud
    assert {e["name"] for e in container["env"]} == {contract.ENV_REDIS_URL, contract.ENV_REDIS_PASSWORD,
                                                     contract.ENV_REDIS_RETRY}  # fmt: skip
    assert container["image"] == r.one(JOB, "loader").inputs["spec"]["template"]["spec"]["containers"][0]["image"]
    training, cfg = r.one(JOB, "training").inputs, r.config.jobs
    load_wait = cfg.loader_timeout_minutes * 60
    assert container["args"][-6:] == ["--stack-job", training["metadata"]["name"], "--load-wait", str(load_wait),
                                      "--drain-timeout", str(cfg.active_deadline_seconds)]  # fmt: skip
    assert job["activeDeadlineSeconds"] > load_wait + cfg.active_deadline_seconds
    kubernetes_validate.validate(render.to_manifest(cron), "1.33", strict=True)
    immutable = r.one("kubernetes:core/v1:ConfigMap", "schedule-job")
    assert immutable.inputs["immutable"] is True and immutable.delete_before_replace


def test_the_admission_policy_and_its_binding_are_the_launch_admissions_own_on_the_stacks_cluster(
        rendered: Render) -> None:
    """Both objects are children of LaunchAdmission, go to the stack's cluster provider, carry the launcher's
    labels and the policy's one name; the binding is created after the policy it names."""
    r = rendered("dev", **DAILY)
    component = r.one("spot-trainer:k8s:LaunchAdmission")
    cluster_provider = r.one(JOB, "loader").provider
    policy = r.one("kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicy")
    binding = r.one("kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicyBinding")
    name = f"{contract.APP}-{r.config.namespace}-{contract.LAUNCHER}"
    for child in (policy, binding):
        assert (child.parent, child.provider) == (component.urn, cluster_provider), child.urn
        assert child.inputs["metadata"] == {"name": name, "labels": contract.labels(contract.LAUNCHER)}, child.urn
    assert binding.inputs["spec"]["policyName"] == name and policy.urn in binding.dependencies


@pytest.mark.parametrize("overrides", [DAILY, SCORED], ids=["trains", "scores"])
def test_the_launchers_pod_is_restricted_and_its_job_fails_as_the_loaders_does(overrides: dict,
                                                                                 rendered: Render) -> None:
    """The launcher's pod passes the restricted Pod Security level on its own securityContext too (non-root, the
    workloads' UID, RuntimeDefault seccomp), is never restarted in place, leaves its log's tail as its termination
    message, and reads Redis's retry budget in seconds; its Job is the loader's kind of Job (no retry, the loader's
    exit-code rules for its own container) with a deadline of exactly its two waits and the slack."""
    r = rendered("dev", **overrides)
    cfg = r.config.jobs
    job = r.one(CRON, "schedule-launcher").inputs["spec"]["jobTemplate"]["spec"]
    pod = job["template"]["spec"]
    (container,) = pod["containers"]
    assert not pod_security_violations(pod, "restricted")
    assert pod["securityContext"] == {"runAsNonRoot": True, "runAsUser": contract.WORKLOAD_UID,
                                      "runAsGroup": contract.WORKLOAD_UID, "seccompProfile": {"type": "RuntimeDefault"}}
    assert (pod["restartPolicy"], container["terminationMessagePolicy"]) == ("Never", "FallbackToLogsOnError")
    values = {e["name"]: e.get("value") for e in container["env"]}
    assert values[contract.ENV_REDIS_RETRY] == str(cfg.infra_retry_budget_minutes * 60)
    assert (job["backoffLimit"], job["podFailurePolicy"]) == (0, jobs.failure_policy(contract.LAUNCHER))
    assert job["activeDeadlineSeconds"] == (cfg.loader_timeout_minutes * 60 + cfg.active_deadline_seconds
                                            + schedule.LAUNCH_SLACK_S)


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


@pytest.mark.parametrize("stack", render.stack_names())
def test_the_scheduled_jobs_have_names_of_their_own(stack: str, rendered: Render) -> None:
    """The launcher tells its two Jobs apart by name (409 "exists" on its own name; the admission policy's account
    per name): the scheduled scoring Job named like the scheduled training Job (or like any of the stack's Jobs)
    would be refused or taken for the other."""
    r = rendered(stack, **SCORED)
    posted = [_posted(r)["metadata"]["name"], _posted_scoring(r)["metadata"]["name"]]
    stack_jobs = {j.inputs["metadata"]["name"] for j in r.of_type(JOB)}
    assert len(set(posted)) == 2 and not set(posted) & stack_jobs, (posted, stack_jobs)
    assert posted == [schedule.SCHEDULED_JOB, schedule.SCHEDULED_SCORING_JOB]


@pytest.mark.parametrize(("overrides", "accounts"), [
    (DAILY, {schedule.SCHEDULED_JOB: "default"}),
    (SCORED, {schedule.SCHEDULED_JOB: f"{contract.APP}-{contract.WORKER}",
              schedule.SCHEDULED_SCORING_JOB: f"{contract.APP}-{contract.WORKER}"}),
], ids=["trains", "scores"])  # fmt: skip
def test_the_admission_policy_admits_from_the_launcher_only_the_stacks_scheduled_jobs(
    overrides: dict, accounts: dict, rendered: Render
) -> None:
    """Matched on the launcher's user alone, in the stack's namespace alone, denying: the names, the image by digest
    and the service account of each Job the launcher may post are the ones of the bodies it posts."""
    r = rendered("dev", **overrides)
    policy = r.one(POLICY).inputs
    binding = r.one(f"{POLICY}Binding").inputs
    ns = r.config.namespace
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    assert spec["matchConditions"] == [{"name": "by-the-launcher", "expression":
                                        f'request.userInfo.username == "system:serviceaccount:{ns}:{LAUNCHER}"'}]
    assert spec["matchConstraints"]["resourceRules"] == [{"apiGroups": ["batch"], "apiVersions": ["v1"],
                                                          "operations": ["CREATE", "UPDATE"], "resources": ["jobs"]}]
    bodies = [_posted(r)] + ([_posted_scoring(r)] if "outputUri" in overrides else [])
    names, image, account, _bodies = (v["expression"] for v in spec["validations"])
    assert names == f"object.metadata.name in {json.dumps(sorted(accounts))}"
    for body in bodies:
        pod = body["spec"]["template"]["spec"]
        name = body["metadata"]["name"]
        assert pod.get("serviceAccountName", "default") == accounts[name]
        assert f'object.metadata.name == "{name}" ? "{accounts[name]}"' in account
        for container in pod["containers"] + pod.get("initContainers", []):
            assert image.count(f'c.image == "{container["image"]}"') == 2 and "@sha256:" in container["image"]
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"],
                               "matchResources": {"namespaceSelector": {"matchLabels": {
                                   "kubernetes.io/metadata.name": ns}}}}  # fmt: skip
    assert ns in policy["metadata"]["name"]  # cluster-scoped: one per stack's namespace
    for manifest in (r.one(POLICY), r.one(f"{POLICY}Binding")):
        kubernetes_validate.validate(render.to_manifest(manifest), "1.33", strict=True)
