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
    assert sorted(c.args["quotaId"] for c in calls) == [quota.ALL_REGIONS, spot]
    assert {(c.args["parent"], c.args["service"]) for c in calls} == {
        (f"projects/{render.FAKE_PROJECT_ID}", "compute.googleapis.com")}
    assert all(c.provider.startswith("urn:pulumi:dev::") and "pulumi:providers:gcp::" in c.provider for c in calls)


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
