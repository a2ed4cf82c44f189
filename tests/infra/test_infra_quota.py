"""GPU quota up front (issue 22, Build 4): a project whose quota cannot run the training pods fails
`pulumi up` in its first minute, with one line naming the quota and how to request it, before any GPU pod
exists. The Cloud Quotas API is the mock engine's here (infra.render.GPU_QUOTAS)."""

from __future__ import annotations

import pytest

from infra import config, contract, quota, render

JOB = "kubernetes:batch/v1:Job"


@pytest.fixture
def quotas(monkeypatch: pytest.MonkeyPatch) -> dict[str, float | dict[str, float] | None]:
    limits: dict[str, float | dict[str, float] | None] = {}
    monkeypatch.setattr(render, "GPU_QUOTAS", limits)
    return limits


@pytest.mark.parametrize("stack", render.stack_names())
def test_a_new_project_without_gpu_quota_fails_before_any_gpu_pod(stack: str, quotas: dict[str, float]) -> None:
    quotas[quota.ALL_REGIONS] = 0
    with pytest.raises(Exception, match="GPU quota") as err:
        render.render(stack)
    line = str(err.value)
    assert f"GPU quota {quota.ALL_REGIONS} (all regions together) is 0, the training pods need" in line
    assert "--quota-id=GPUS-ALL-REGIONS-per-project --preferred-value=" in line and "IAM & Admin > Quotas" in line


def test_spot_quota_below_parallelism_names_the_region_and_the_count(quotas: dict[str, float]) -> None:
    quotas["PREEMPTIBLE-NVIDIA-L4-GPUS-per-project-region"] = 1
    with pytest.raises(Exception, match="GPU quota") as err:
        render.render("dev", {"parallelism": 3, "runs": {"a": {}, "b": {}, "c": {}}})
    assert ("GPU quota PREEMPTIBLE-NVIDIA-L4-GPUS-per-project-region in us-central1 is 1, the training pods "
            "need 3 (parallelism x gpuCount)") in str(err.value)
    assert "--dimensions=region=us-central1 --preferred-value=3" in str(err.value)


def test_enough_quota_lets_the_training_job_wait_on_the_check(quotas: dict[str, float]) -> None:
    quotas.update({quota.ALL_REGIONS: 4, "PREEMPTIBLE-NVIDIA-L4-GPUS-per-project-region": 4})
    r = render.render("dev")
    training = r.one(JOB, "training")
    assert training.inputs["metadata"]["annotations"][contract.GPU_QUOTA_ANNOTATION] == "enough"
    assert r.outputs["gpuQuota"] == "PREEMPTIBLE-NVIDIA-L4-GPUS-per-project-region=4, GPUS-ALL-REGIONS-per-project=4"
    # The reads are billed to the stack's own project (laptop credentials have no quota project of their own).
    billed = r.one("pulumi:providers:gcp", "gpu-quota").inputs
    assert (billed["billingProject"], billed["project"]) == (render.FAKE_PROJECT_ID, render.FAKE_PROJECT_ID)
    assert billed["userProjectOverride"] in (True, "true")
    quotas[quota.ALL_REGIONS] = 0
    unchecked = render.render("dev", {"checkGpuQuota": False})
    assert contract.GPU_QUOTA_ANNOTATION not in unchecked.one(JOB, "training").inputs["metadata"].get("annotations", {})


def test_a_limit_per_region_wins_over_the_default_row() -> None:
    infos = [
        {"dimensions": {"region": "us-central1"}, "details": {"value": "8"}},
        {"dimensions": {}, "applicable_locations": ["us-central1", "europe-west4"], "details": [{"value": "1"}]},
    ]
    assert quota.limit(infos, "us-central1") == 8 and quota.limit(infos, "europe-west4") == 1
    assert quota.limit(infos, "asia-east1") is None  # unknown: not ours to refuse
    gpu = config.load(render.stack_config("dev", {}), stack="dev").gpu
    assert [n.quota_id for n in quota.needs(gpu, "us-central1", 2)] == [
        "PREEMPTIBLE-NVIDIA-L4-GPUS-per-project-region", quota.ALL_REGIONS]
    prod = config.load(render.stack_config("prod", {}), stack="prod").gpu
    assert prod.on_demand_fallback and [n.quota_id for n in quota.needs(prod, "us-central1", 2)] == [
        "PREEMPTIBLE-NVIDIA-L4-GPUS-per-project-region", "NVIDIA-L4-GPUS-per-project-region", quota.ALL_REGIONS]
    assert set(quota.QUOTA_NAMES) == set(config.GPU_MACHINE_TYPES)  # every allowed GPU has its quota name


def test_the_check_asks_the_projects_compute_quotas_through_the_stacks_provider(
        quotas: dict[str, float | dict[str, float] | None], monkeypatch: pytest.MonkeyPatch) -> None:
    """The quota read is the project's Compute Engine quota, through the stack's Google provider (its project and
    credentials), for each need; the spot quota of another region does not count."""
    calls: list[object] = []
    monkeypatch.setattr(render, "GPU_QUOTA_CALLS", calls)
    quotas["PREEMPTIBLE-NVIDIA-L4-GPUS-per-project-region"] = {"europe-west4": 8, "us-central1": 1}
    with pytest.raises(Exception, match="GPU quota PREEMPTIBLE-NVIDIA-L4-GPUS-per-project-region in us-central1 is 1"):
        render.render("dev", {"parallelism": 2, "runs": {"a": {}, "b": {}}})
    spot = "PREEMPTIBLE-NVIDIA-L4-GPUS-per-project-region"
    # The standard quota is read too: it serves spot VMs where there is no preemptible quota.
    assert sorted(c.args["quotaId"] for c in calls) == [quota.ALL_REGIONS, "NVIDIA-L4-GPUS-per-project-region", spot]
    assert {(c.args["parent"], c.args["service"]) for c in calls} == {
        (f"projects/{render.FAKE_PROJECT_ID}", "compute.googleapis.com")}
    assert all(c.provider.startswith("urn:pulumi:dev::") and "pulumi:providers:gcp::gpu-quota" in c.provider
               for c in calls)


def test_a_quota_the_api_does_not_know_is_not_ours_to_refuse(
        quotas: dict[str, float | dict[str, float] | None]) -> None:
    quotas.update({quota.ALL_REGIONS: None, "PREEMPTIBLE-NVIDIA-L4-GPUS-per-project-region": 2})
    assert render.render("dev", {"parallelism": 2, "runs": {"a": {}, "b": {}}}).outputs["gpuQuota"] == (
        "PREEMPTIBLE-NVIDIA-L4-GPUS-per-project-region=2, GPUS-ALL-REGIONS-per-project=?")  # exactly enough


def test_a_limit_reads_the_row_of_its_region_or_the_default_and_no_other_regions() -> None:
    other = {"dimensions": {"region": "europe-west4"}, "applicable_locations": ["us-central1"],
             "details": [{"value": "2"}]}
    default = {"dimensions": {}, "applicable_locations": ["us-central1"], "details": [{"value": "1"}]}
    assert quota.limit([other, default], "us-central1") == 1
    assert quota.limit([other, {**default, "dimensions": None}], "us-central1") == 1
    for details in ([], [{"value": ""}], [{}], None):  # a row without a value: unknown, not zero
        assert quota.limit([{**default, "details": details}], "us-central1") is None
    need = quota.Need("NVIDIA-L4-GPUS-per-project-region", 2, "us-central1")
    assert quota.shortfall(need, 2) == "" and quota.shortfall(need, None) == ""
    assert quota.shortfall(need, 1).startswith("GPU quota NVIDIA-L4-GPUS-per-project-region in us-central1 is 1,")


SPOT, STANDARD = "PREEMPTIBLE-NVIDIA-L4-GPUS-per-project-region", "NVIDIA-L4-GPUS-per-project-region"
R = "us-central1"


def _gpu(stack: str = "dev", **overrides: object) -> config.GpuConfig:
    return config.load(render.stack_config(stack, overrides), stack=stack).gpu


def _problems(gpu: config.GpuConfig, pods: int, limits: dict[str, float | None]) -> list[str]:
    wanted = quota.needs(gpu, R, pods)
    by_region = {(q, n.region): limits.get(q) for n in wanted for q in (n.quota_id, n.or_else) if q}
    return [line for need, q, have in quota.judge(wanted, by_region) if (line := quota.shortfall(need, have, q))]


@pytest.mark.parametrize("spot_limit", [None, 0.0])
def test_spot_uses_the_standard_quota_where_there_is_no_preemptible_one(spot_limit: float | None) -> None:
    gpu = _gpu()
    assert _problems(gpu, 4, {SPOT: spot_limit, STANDARD: 4, quota.ALL_REGIONS: 8}) == []
    (line,) = _problems(gpu, 4, {SPOT: spot_limit, STANDARD: 2, quota.ALL_REGIONS: 8})
    assert line.startswith(f"GPU quota {STANDARD} in {R} is 2 (no {SPOT} here: spot VMs use {STANDARD}), the "
                           "training pods need 4")
    # Where the project has preemptible quota, spot counts against it alone.
    (line,) = _problems(gpu, 4, {SPOT: 2, STANDARD: 100, quota.ALL_REGIONS: 8})
    assert line.startswith(f"GPU quota {SPOT} in {R} is 2,")


def test_the_on_demand_fallback_needs_the_standard_quota_too() -> None:
    prod = _gpu("prod")
    assert _problems(prod, 4, {SPOT: 4, STANDARD: 4, quota.ALL_REGIONS: 8}) == []
    (line,) = _problems(prod, 4, {SPOT: 4, STANDARD: 1, quota.ALL_REGIONS: 8})
    assert line.startswith(f"GPU quota {STANDARD} in {R} is 1, the training pods need 4")
    assert _problems(_gpu(), 4, {SPOT: 4, STANDARD: 1, quota.ALL_REGIONS: 8}) == []  # dev has no fallback


def test_two_gpus_a_pod_count_twice(quotas: dict[str, float | dict[str, float] | None]) -> None:
    """The need is pods x GPUs per pod, everywhere it is asked."""
    assert [n.needed for n in quota.needs(_gpu(gpuCount=2), R, 3)] == [6, 6]
    quotas.update({SPOT: 5, quota.ALL_REGIONS: 100})
    with pytest.raises(Exception, match="GPU quota") as err:
        render.render("dev", {"gpuCount": 2, "parallelism": 3, "runs": {"a": {}, "b": {}, "c": {}}})
    assert f"GPU quota {SPOT} in {R} is 5, the training pods need 6 (parallelism x gpuCount)" in str(err.value)


def test_a_quota_read_is_retried_a_bounded_number_of_times_on_errors_that_pass() -> None:
    waits: list[float] = []
    failures = iter(["SERVICE_DISABLED: Cloud Quotas API has not been used in project 1", "HTTP 503 UNAVAILABLE"])

    def flaky() -> str:
        message = next(failures, None)
        if message:
            raise RuntimeError(message)
        return "rows"

    assert quota.with_retries(flaky, "reading", sleep=waits.append) == "rows" and waits == [5.0, 10.0]
    waits.clear()

    def forever() -> str:
        raise RuntimeError("429 RESOURCE_EXHAUSTED")

    with pytest.raises(RuntimeError, match="429"):
        quota.with_retries(forever, "reading", sleep=waits.append)
    assert len(waits) == quota.ATTEMPTS - 1 and max(waits) <= quota.MAX_WAIT_S

    def refused() -> str:
        raise RuntimeError("403 PERMISSION_DENIED: caller lacks cloudquotas.quotas.get")

    with pytest.raises(RuntimeError, match="PERMISSION_DENIED"):
        quota.with_retries(refused, "reading", sleep=waits.append)
    assert len(waits) == quota.ATTEMPTS - 1  # not retried
