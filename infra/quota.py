"""GPU quota up front: `pulumi up` fails in its first minute, naming the quota and how to raise it, instead
of a training Job that waits for GPUs a project may never get (a new project has GPUS_ALL_REGIONS = 0).

The limits come from the Cloud Quotas API (``gcp.cloudquota.get_s_quota_info``: a quota info's
``dimensionsInfos[].details.value``, per region or for every applicable location). Compute Engine's quota
ids: ``PREEMPTIBLE-NVIDIA-<TYPE>-GPUS-per-project-region`` (spot), ``NVIDIA-<TYPE>-GPUS-per-project-region``
(on-demand) and ``GPUS-ALL-REGIONS-per-project`` (every GPU of the project, any region).

What spot really uses: Compute Engine counts Spot (and preemptible) VMs against the preemptible quota where
the project has one in the region, and against the standard quota where it has none (Compute Engine docs,
"Resource quotas", preemptible quotas). A project with standard L4 quota and no preemptible row can run
spot L4 pods, so that is no shortfall. The on-demand fallback (``onDemandFallback``) may run every pod
on-demand while spot is out, so it needs the standard quota as well.

The call is billed to the stack's project (a provider with ``user_project_override`` and
``billing_project``: laptop credentials have no quota project of their own, and the Cloud Quotas API refuses
a call without one) and retried a bounded number of times on errors that pass (the API enabled moments ago
in the same `pulumi up`, rate limits, 5xx).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

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


# Bounded retries of one quota read: attempts, and the first wait (doubled each time, at most MAX_WAIT_S).
ATTEMPTS = 6
FIRST_WAIT_S = 5.0
MAX_WAIT_S = 60.0
# Errors that pass: the service enabled in this same update (SERVICE_DISABLED, "has not been used in
# project ... or it is disabled"), rate limits and server errors.
TRANSIENT = ("SERVICE_DISABLED", "has not been used in project", "it is disabled", "RESOURCE_EXHAUSTED",
             "rateLimitExceeded", "429", "500", "502", "503", "504", "UNAVAILABLE", "DEADLINE_EXCEEDED")


@dataclass(frozen=True)
class Need:
    """A quota the stack needs: ``needed`` GPUs of ``quota_id`` (in ``region``, or project-wide).
    ``or_else``: the quota that serves the need where ``quota_id`` has no limit in the region (spot VMs use the
    standard quota where the project has no preemptible one)."""

    quota_id: str
    needed: int
    region: str = ""
    or_else: str = ""


def needs(gpu: GpuConfig, region: str, pods: int) -> list[Need]:
    """The quotas ``pods`` training pods of ``gpu`` (``gpu.count`` GPUs each) in ``region`` need: spot quota for
    the type (or the standard one where there is no preemptible quota), the standard quota too with the
    on-demand fallback, and the project-wide GPU count (what new projects lack)."""
    name = QUOTA_NAMES[gpu.type]
    total = pods * gpu.count
    standard = f"{name}-GPUS-per-project-region"
    spot = Need(f"PREEMPTIBLE-{name}-GPUS-per-project-region", total, region, or_else=standard)
    on_demand = [Need(standard, total, region)] if gpu.on_demand_fallback else []
    return [spot, *on_demand, Need(ALL_REGIONS, total)]


def quota_ids(wanted: Sequence[Need]) -> list[str]:
    """Every quota id to read for ``wanted``, once each, in order."""
    return list(dict.fromkeys(q for n in wanted for q in (n.quota_id, n.or_else) if q))


def judge(
    wanted: Sequence[Need], limits: Mapping[tuple[str, str], float | None]
) -> list[tuple[Need, str, float | None]]:
    """Each need with the quota that serves it and that quota's limit (``limits``: (quota id, region) ->
    limit). A need with ``or_else`` is served by it where its own quota has no limit or a limit of 0."""
    judged = []
    for need in wanted:
        have = limits.get((need.quota_id, need.region))
        if need.or_else and not have:
            judged.append((need, need.or_else, limits.get((need.or_else, need.region))))
        else:
            judged.append((need, need.quota_id, have))
    return judged


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


def shortfall(need: Need, have: float | None, quota_id: str = "") -> str:
    """One line when the limit of ``quota_id`` (default: the need's own) does not cover the need ('' when it
    does, or is unknown: not our call)."""
    quota_id = quota_id or need.quota_id
    if have is None or have >= need.needed:
        return ""
    where = f" in {need.region}" if need.region else " (all regions together)"
    dims = f" --dimensions=region={need.region}" if need.region else ""
    ask = HOW_TO_ASK.format(quota=quota_id, where=dims, needed=need.needed)
    served = f" (no {need.quota_id} here: spot VMs use {quota_id})" if quota_id != need.quota_id else ""
    return (f"GPU quota {quota_id}{where} is {have:g}{served}, the training pods need {need.needed} "
            f"(parallelism x gpuCount); {ask}")


T = TypeVar("T")


def with_retries(call: Callable[[], T], what: str, sleep: Callable[[float], None] = time.sleep) -> T:
    """``call()``, again after FIRST_WAIT_S, 2x, 4x ... (at most MAX_WAIT_S) while it fails with a TRANSIENT
    error, ATTEMPTS times in all; the last error, or any other, is raised as it is."""
    wait = FIRST_WAIT_S
    for attempt in range(1, ATTEMPTS + 1):
        try:
            return call()
        except Exception as err:  # noqa: BLE001 - the provider's invoke errors carry the API's status as text
            if attempt == ATTEMPTS or not any(mark in str(err) for mark in TRANSIENT):
                raise
            pulumi.log.warn(f"{what}: {str(err).splitlines()[0][:200]}; retrying in {wait:g}s "
                            f"(attempt {attempt} of {ATTEMPTS})")
            sleep(wait)
            wait = min(wait * 2, MAX_WAIT_S)
    raise AssertionError("unreachable")


def check(
    project_id: str, gpu: GpuConfig, region: str, pods: int, opts: pulumi.InvokeOutputOptions
) -> pulumi.Output[str]:
    """The quotas read at `pulumi up` (and preview); raises with ``shortfall``'s line when one falls short,
    which fails the update before any GPU pod is created (the training Job waits on this output).

    ``opts``: its ``depends_on`` (the enabled services) gate the reads; the reads go through a provider of
    their own that bills the stack's project, retried by ``with_retries``."""
    wanted = needs(gpu, region, pods)
    billed = gcp.Provider(
        "gpu-quota", project=project_id, billing_project=project_id, user_project_override=True,
        opts=pulumi.ResourceOptions(parent=opts.parent, depends_on=opts.depends_on),
    )
    invoke = pulumi.InvokeOptions(provider=billed, parent=opts.parent)

    def read(quota_id: str) -> Any:
        return with_retries(lambda: gcp.cloudquota.get_s_quota_info(
            parent=f"projects/{project_id}", service=SERVICE, quota_id=quota_id, opts=invoke).dimensions_infos,
            f"reading GPU quota {quota_id}")

    def run(_: Any) -> str:
        infos = {q: read(q) for q in quota_ids(wanted)}
        limits = {(q, n.region): limit(infos[q], n.region) for n in wanted for q in (n.quota_id, n.or_else) if q}
        judged = judge(wanted, limits)
        problems = [line for need, quota_id, have in judged if (line := shortfall(need, have, quota_id))]
        if problems:
            raise QuotaError(problems[0])
        return ", ".join(f"{q}={'?' if have is None else f'{have:g}'}" for _, q, have in judged)

    gate = [d.urn for d in _resources(opts.depends_on)] + [billed.urn]
    return pulumi.Output.all(*gate).apply(run)


def _resources(depends_on: Any) -> list[pulumi.Resource]:
    if depends_on is None:
        return []
    return [d for d in (depends_on if isinstance(depends_on, Sequence) else [depends_on])
            if isinstance(d, pulumi.Resource)]


class QuotaError(RuntimeError):
    """The project's GPU quota cannot run the training pods; the message says which and how to ask."""

