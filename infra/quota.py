"""GPU quota up front: `pulumi up` fails in its first minute, naming the quota and how to raise it, instead
of a training Job that waits for GPUs a project may never get (a new project has GPUS_ALL_REGIONS = 0).

The limits come from the Cloud Quotas API (``gcp.cloudquota.get_s_quota_info``: a quota info's
``dimensionsInfos[].details.value``, per region or for every applicable location). Compute Engine's quota
ids: ``PREEMPTIBLE-NVIDIA-<TYPE>-GPUS-per-project-region`` (spot), ``NVIDIA-<TYPE>-GPUS-per-project-region``
(on-demand) and ``GPUS-ALL-REGIONS-per-project`` (every GPU of the project, any region).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_gcp as gcp

from infra.config import GpuConfig

SERVICE = "compute.googleapis.com"
ALL_REGIONS = "GPUS-ALL-REGIONS-per-project"
# gpuType -> the name Compute Engine's quota ids use for it.
QUOTA_NAMES = {
    "nvidia-l4": "NVIDIA-L4",
    "nvidia-tesla-t4": "NVIDIA-T4",
    "nvidia-tesla-a100": "NVIDIA-A100",
    "nvidia-a100-80gb": "NVIDIA-A100-80GB",
    "nvidia-h100-80gb": "NVIDIA-H100",
}
HOW_TO_ASK = (
    "request it on the console's IAM & Admin > Quotas page (service compute.googleapis.com) or with "
    "`gcloud beta quotas preferences create --service=compute.googleapis.com --quota-id={quota}{where} "
    "--preferred-value={needed}`; free-trial accounts cannot get GPU quota (docs/cloud.md#prerequisites)"
)


@dataclass(frozen=True)
class Need:
    """A quota the stack needs: ``needed`` GPUs of ``quota_id`` (in ``region``, or project-wide)."""

    quota_id: str
    needed: int
    region: str = ""


def needs(gpu: GpuConfig, region: str, pods: int) -> list[Need]:
    """The quotas ``pods`` training pods of ``gpu`` in ``region`` need: spot quota for the type, and the
    project-wide GPU count (what new projects lack). With the on-demand fallback, on-demand quota is a
    fallback, not a need: spot quota alone decides."""
    name = QUOTA_NAMES[gpu.type]
    total = pods * gpu.count
    return [Need(f"PREEMPTIBLE-{name}-GPUS-per-project-region", total, region), Need(ALL_REGIONS, total)]


def limit(infos: Sequence[Mapping[str, Any]], region: str) -> float | None:
    """The limit in effect for ``region`` ('' = project-wide) among a quota info's dimension infos: the
    row for that region, else the row without a region dimension whose locations include it. The SDK's result
    types are dicts (keyed by the Python names), under the mock engine as under a real one."""
    rows = [dict(i) for i in infos or []]
    for row in rows:
        if (row.get("dimensions") or {}).get("region") == region and region:
            return _value(row)
    for row in rows:
        locations = row.get("applicable_locations") or []
        applies = not region or region in locations or "global" in locations
        if "region" not in (row.get("dimensions") or {}) and applies:
            return _value(row)
    return None


def _value(row: Mapping[str, Any]) -> float | None:
    details = row.get("details") or {}
    if isinstance(details, list | tuple):  # the SDK's shape: a list of one detail (not empty: `or {}` above)
        details = details[0]
    value = details.get("value")
    return float(value) if value not in (None, "") else None


def shortfall(need: Need, have: float | None) -> str:
    """One line when the limit does not cover the need ('' when it does, or is unknown: not our call)."""
    if have is None or have >= need.needed:
        return ""
    where = f" in {need.region}" if need.region else " (all regions together)"
    dims = f" --dimensions=region={need.region}" if need.region else ""
    ask = HOW_TO_ASK.format(quota=need.quota_id, where=dims, needed=need.needed)
    return (f"GPU quota {need.quota_id}{where} is {have:g}, the training pods need {need.needed} "
            f"(parallelism x gpuCount); {ask}")


def check(
    project_id: str, gpu: GpuConfig, region: str, pods: int, opts: pulumi.InvokeOutputOptions
) -> pulumi.Output[str]:
    """The quotas read at `pulumi up` (and preview); raises with ``shortfall``'s line when one falls short,
    which fails the update before any GPU pod is created (the training Job waits on this output)."""
    found = [
        gcp.cloudquota.get_s_quota_info_output(
            parent=f"projects/{project_id}", service=SERVICE, quota_id=need.quota_id, opts=opts
        ).dimensions_infos.apply(lambda infos, need=need: (need, limit(infos, need.region)))
        for need in needs(gpu, region, pods)
    ]

    def judge(results: list[tuple[Need, float | None]]) -> str:
        problems = [line for need, have in results if (line := shortfall(need, have))]
        if problems:
            raise QuotaError(problems[0])
        return ", ".join(f"{need.quota_id}={'?' if have is None else f'{have:g}'}" for need, have in results)

    return pulumi.Output.all(*found).apply(judge)


class QuotaError(RuntimeError):
    """The project's GPU quota cannot run the training pods; the message says which and how to ask."""

