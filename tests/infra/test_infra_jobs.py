"""The Jobs against the real behaviour of their controller and of Pulumi's await (issue 11, points 4-8).

A bad configuration must fail `pulumi up` within minutes, in a way pulumi-kubernetes' Job await stops on
(``jobs.AWAIT_FAILURE_REASONS``, read from provider/pkg/await/checker/job/check.go); a preemption must
never fail a Job. ``JobController`` plays the rendered podFailurePolicy through the Job controller's rules.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from infra import contract, jobs, render
from infra.render import Registered, Rendered
from tests.infra.job_controller import FailedPod, JobController
from workload.core import errors

STACKS = render.stack_names()
JOB = "kubernetes:batch/v1:Job"
Render = Callable[..., Rendered]
GRANT = "gcp:artifactregistry/repositoryIamMember:RepositoryIamMember"


def _controller(r: Rendered, name: str) -> tuple[JobController, str]:
    job = r.one(JOB, name).inputs
    (container,) = job["spec"]["template"]["spec"]["containers"]
    return JobController(job["spec"]), container["name"]


def test_the_await_reasons_are_the_providers() -> None:
    """pulumi-kubernetes collectJobConditionErrors: `case "BackoffLimitExceeded", "DeadlineExceeded":`."""
    assert jobs.AWAIT_FAILURE_REASONS == ("BackoffLimitExceeded", "DeadlineExceeded")
    assert "PodFailurePolicy" not in jobs.AWAIT_FAILURE_REASONS  # what a FailJob rule ends with


@pytest.mark.parametrize("stack", STACKS)
def test_bad_config_fails_the_loader_on_its_first_pod_as_the_await_expects(stack: str, rendered: Render) -> None:
    job, name = _controller(rendered(stack), "loader")
    reason = job.pod_failed(FailedPod({name: errors.EXIT_BAD_CONFIG}))
    assert reason in jobs.AWAIT_FAILURE_REASONS  # `pulumi up` stops here, before any GPU pod exists
    assert job.counted == 1


@pytest.mark.parametrize("stack", STACKS)
def test_bad_config_fails_training_within_its_backoff_limit_as_the_await_expects(
    stack: str, rendered: Render
) -> None:
    r = rendered(stack)
    job, name = _controller(r, "training")
    bad = FailedPod({name: errors.EXIT_BAD_CONFIG})
    reasons = [job.pod_failed(bad) for _ in range(r.config.jobs.backoff_limit + 1)]
    assert reasons[:-1] == [None] * r.config.jobs.backoff_limit
    assert reasons[-1] in jobs.AWAIT_FAILURE_REASONS


@pytest.mark.parametrize("stack", STACKS)
def test_dead_letters_fail_training_within_its_backoff_limit(stack: str, rendered: Render) -> None:
    """Drained with dead letters is not success: every pod exits 4 at once, and the Job ends Failed in a way
    the await stops on, with the dead items in the pods' last log lines."""
    r = rendered(stack)
    job, name = _controller(r, "training")
    dead = FailedPod({name: errors.EXIT_DEAD_LETTERS})
    reasons = [job.pod_failed(dead) for _ in range(r.config.jobs.backoff_limit + 1)]
    assert reasons[-1] in jobs.AWAIT_FAILURE_REASONS and job.counted == r.config.jobs.backoff_limit + 1


@pytest.mark.parametrize("stack", STACKS)
@pytest.mark.parametrize("name", ["loader", "training"])
@pytest.mark.parametrize("exit_code", [143, 137, 2, 1, 3, 4, 5])
def test_preemptions_never_fail_a_job(stack: str, name: str, exit_code: int, rendered: Render) -> None:
    """Whatever a preempted pod exits with, DisruptionTarget makes it free: 100 preemptions in a row."""
    job, container = _controller(rendered(stack), name)
    for _ in range(100):
        assert job.pod_failed(FailedPod({container: exit_code}, ("DisruptionTarget",))) is None
    assert job.counted == 0 and job.ignored == 100


@pytest.mark.parametrize("name", ["loader", "training"])
@pytest.mark.parametrize("exit_code", errors.RETRYABLE_EXIT_CODES)
def test_transient_exits_are_retried_without_counting(name: str, exit_code: int, rendered: Render) -> None:
    job, container = _controller(rendered("dev"), name)
    for _ in range(20):
        assert job.pod_failed(FailedPod({container: exit_code})) is None
    assert job.counted == 0
    # ...until the deadline, which the await also recognises.
    assert job.deadline_passed() in jobs.AWAIT_FAILURE_REASONS


@pytest.mark.parametrize("stack", STACKS)
def test_the_loaders_retries_are_bounded_by_its_await_timeout(stack: str, rendered: Render) -> None:
    r = rendered(stack)
    spec = r.one(JOB, "loader").inputs["spec"]
    assert spec["backoffLimit"] == 0
    assert spec["activeDeadlineSeconds"] == r.config.jobs.loader_timeout_minutes * 60


def test_a_failjob_rule_would_not_stop_the_await() -> None:
    """The design this replaces: FailJob ends the Job with a reason the await waits out."""
    fail_job = {"action": "FailJob", "onExitCodes": {"containerName": "worker", "operator": "In", "values": [2]}}
    spec = {"backoffLimit": 4, "podFailurePolicy": {"rules": [fail_job]}}
    reason = JobController(spec).pod_failed(FailedPod({"worker": 2}))
    assert reason == "PodFailurePolicy" and reason not in jobs.AWAIT_FAILURE_REASONS


@pytest.mark.parametrize("name", ["loader", "training"])
def test_the_workers_error_is_in_what_pulumi_prints(name: str, rendered: Render) -> None:
    """The provider prints a failed container's termination message; FallbackToLogsOnError fills it with
    the last log lines, i.e. the worker's one-line error (provider/pkg/await/checker/pod/check.go)."""
    (container,) = rendered("dev").one(JOB, name).inputs["spec"]["template"]["spec"]["containers"]
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"


# --- parallelism: replace on change, by decision -------------------------------------------------------


def test_a_parallelism_change_replaces_only_through_parallelism(rendered: Render) -> None:
    """pulumi-kubernetes replaces a Job whose .spec.parallelism changes (provider/pkg/provider/diff.go).
    Decision: accept it, not ignore_changes (which would keep the first value for every later Job).
    The replacement is safe: fixed name deleted first, workers release on SIGTERM, the share keeps the
    checkpoints; and nothing else in the Job changes with parallelism."""
    two, three = rendered("dev", parallelism=2), rendered("dev", parallelism=3)
    a, b = two.one(JOB, "training"), three.one(JOB, "training")
    assert "spec.parallelism" not in a.ignore_changes and not a.ignore_changes
    assert a.delete_before_replace
    assert a.inputs["spec"]["parallelism"] == 2 and b.inputs["spec"]["parallelism"] == 3
    assert {**a.inputs["spec"], "parallelism": 0} == {**b.inputs["spec"], "parallelism": 0}
    assert two.one(JOB, "loader").inputs == three.one(JOB, "loader").inputs  # the loader is not re-run
    assert a.inputs["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] <= 15


# --- the image reference waits for the registry grant ---------------------------------------------------


@pytest.mark.parametrize("stack", STACKS)
def test_the_image_reference_depends_on_the_registry_grant(stack: str, rendered: Render) -> None:
    r = rendered(stack)
    grant = r.one(GRANT, "image-node-reader")
    nodes = r.one("gcp:serviceaccount/account:Account", "cluster-nodes")
    assert grant.inputs["member"] == nodes.outputs["member"] and grant.inputs["role"] == "roles/artifactregistry.reader"
    for job in r.of_type(JOB):
        assert grant.urn in job.dependencies, job.name
        assert grant.urn in job.property_dependencies["spec"], job.name  # through the image reference


# --- zone pin --------------------------------------------------------------------------------------------


def _zone(job: Registered) -> Any:
    return job.inputs["spec"]["template"]["spec"].get("nodeSelector", {}).get("topology.kubernetes.io/zone")


@pytest.mark.parametrize(
    ("tier", "capacity"), [("BASIC_HDD", 1024), ("BASIC_SSD", 2560), ("ZONAL", 1024)]
)
def test_zonal_shares_pin_loader_and_training_to_their_zone_by_default(
    tier: str, capacity: int, rendered: Render
) -> None:
    r = rendered("dev", filestoreTier=tier, filestoreCapacityGb=capacity, zone="us-central1-c")
    assert r.one("gcp:filestore/instance:Instance").inputs["location"] == "us-central1-c"
    assert _zone(r.one(JOB, "loader")) == _zone(r.one(JOB, "training")) == "us-central1-c"
    off = rendered("dev", filestoreTier=tier, filestoreCapacityGb=capacity, pinToShareZone=False)
    assert _zone(off.one(JOB, "loader")) is None and _zone(off.one(JOB, "training")) is None


@pytest.mark.parametrize("tier", ["REGIONAL", "ENTERPRISE"])
def test_regional_shares_do_not_pin_by_default(tier: str, rendered: Render) -> None:
    r = rendered("dev", filestoreTier=tier)
    assert r.one("gcp:filestore/instance:Instance").inputs["location"] == r.config.region
    assert _zone(r.one(JOB, "loader")) is None and _zone(r.one(JOB, "training")) is None


@pytest.mark.parametrize("stack", STACKS)
def test_the_stack_files_pin_as_their_tier_says(stack: str, rendered: Render) -> None:
    r = rendered(stack)
    assert (_zone(r.one(JOB, "training")) == r.config.zone) is r.config.filestore.zonal


# --- smaller items ---------------------------------------------------------------------------------------


def test_standard_mode_default_pool_never_uses_the_compute_engine_default_account(rendered: Render) -> None:
    r = rendered("dev", clusterMode="standard", gpuCapacity="nodeSelector")
    cluster = r.one("gcp:container/cluster:Cluster").inputs
    nodes = r.one("gcp:serviceaccount/account:Account", "cluster-nodes").outputs["email"]
    assert cluster["nodeConfig"]["serviceAccount"] == nodes
    for pool in r.of_type("gcp:container/nodePool:NodePool"):
        assert pool.inputs["nodeConfig"]["serviceAccount"] == nodes


@pytest.mark.parametrize("stack", STACKS)
def test_the_outputs_say_how_to_rerun_a_job(stack: str, rendered: Render) -> None:
    r = rendered(stack)
    commands = r.outputs["commands"]
    assert commands["rerunLoader"] == f"pulumi up --replace '{r.one(JOB, 'loader').urn}'"
    assert commands["rerunTraining"] == f"pulumi up --replace '{r.one(JOB, 'training').urn}'"


@pytest.mark.parametrize("stack", STACKS)
def test_a_gpu_that_cuda_cannot_use_fails_training_on_its_first_pod(stack: str, rendered: Render) -> None:
    """Every new pod lands on the same driver: exit 6 ends the Job at once (FailJob), instead of
    re-creating GPU pods that would train on their CPUs or fail the same way backoffLimit times. A
    preempted pod that exits 6 is still a preemption."""
    r = rendered(stack)
    job, name = _controller(r, "training")
    assert job.pod_failed(FailedPod({name: errors.EXIT_GPU_UNUSABLE}, ("DisruptionTarget",))) is None
    assert job.pod_failed(FailedPod({name: errors.EXIT_GPU_UNUSABLE})) == "PodFailurePolicy"
    assert job.counted == 0
    (container,) = r.one(JOB, "training").inputs["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    limit = container["resources"]["limits"]["nvidia.com/gpu"]
    assert env[contract.ENV_EXPECTED_GPUS] == limit == str(r.config.gpu.count)  # what the worker checks


@pytest.mark.parametrize("stack", STACKS)
@pytest.mark.parametrize("name", ["loader", "training"])
def test_an_infrastructure_fault_that_outlasts_the_budget_fails_the_job(
    stack: str, name: str, rendered: Render
) -> None:
    """A pod exits 3 only after riding out Redis or the share failing for infraRetryBudgetMinutes (its
    Redis retry and give-up times): the Job fails on that pod, instead of new GPU pods for a day. A
    preemption in the meantime is still free."""
    r = rendered(stack, infraRetryBudgetMinutes=45)
    job, container = _controller(r, name)
    assert job.pod_failed(FailedPod({container: errors.EXIT_INFRA}, ("DisruptionTarget",))) is None
    assert job.pod_failed(FailedPod({container: errors.EXIT_INFRA})) == "PodFailurePolicy"
    (spec,) = r.one(JOB, name).inputs["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in spec["env"]}
    assert env[contract.ENV_REDIS_RETRY] == env[contract.ENV_INFRA_GIVE_UP] == str(45 * 60)
