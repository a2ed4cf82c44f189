"""What the infra component tests share: each component built on its own under the mock engine, through the
same functions as infra/program.py (``program.platform``, ``program.workloads``), and the checks its rendered
objects must pass (strictly valid, startable, schedulable, admitted by the Redis NetworkPolicy).

A component build registers tens of resources instead of the whole stack's, so these tests are what
`make mutation` runs for the infra components (a mutant is tested in well under a second); the whole
stack's wiring is test_infra_stack.py's and test_infra_jobs.py's.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import kubernetes_validate
import pulumi
import pulumi_gcp as gcp
import pulumi_kubernetes as k8s

from infra import config, program, render
from infra.kube import InCluster
from infra.network import Network
from infra.platform import Platform
from infra.render import Registered

KUBERNETES_VERSION = "1.33"
IMAGE = "us-central1-docker.pkg.dev/p/spot-trainer/trainer@" + render.IMAGE_DIGEST
JOB = "kubernetes:batch/v1:Job"
DATA = {"datasetUri": "gs://acme-fraud/exports", "outputUri": "gs://acme-results/runs/v1"}
READING = {"datasetColumns": {"ts": "TX_DATETIME", "card_id": "CUSTOMER_ID"}, "datasetDatetimeFormat": "%d/%m/%Y %H:%M"}

@dataclass
class Built:
    """What one component build registered, and the component objects (for their plain attributes)."""

    cfg: config.StackConfig
    resources: list[Registered]
    made: dict[str, Any] = field(default_factory=dict)
    resolved: dict[str, Any] = field(default_factory=dict)

    def of_type(self, type_: str) -> list[Registered]:
        return [r for r in self.resources if r.type == type_]

    def one(self, type_: str, name: str | None = None) -> Registered:
        found = [r for r in self.of_type(type_) if name is None or r.name == name]
        assert len(found) == 1, f"expected one {type_} named {name!r}, found {[r.name for r in found]}"
        return found[0]

    def by_urn(self, urn: str) -> Registered:
        (found,) = [r for r in self.resources if r.urn == urn]
        return found

    def manifests(self) -> list[dict[str, Any]]:
        return [
            render.to_manifest(r)
            for r in self.resources
            if r.type.startswith("kubernetes:") and r.type != "pulumi:providers:kubernetes"
        ]


_GCP: list[pulumi.ResourceOptions] = []


def on_gcp() -> pulumi.ResourceOptions:
    """The options infra.program gives the components that declare GCP resources (set by ``build``)."""
    return _GCP[0]


def build(
    make: Callable[[config.StackConfig, k8s.Provider], dict[str, Any]], stack: str = "dev", **overrides: Any
) -> Built:
    """Run ``make`` (which declares components and returns them by name) under the mock engine with the
    stack's config; outputs among the returned values are resolved into ``resolved``."""
    values = render.stack_config(stack, overrides)
    cfg = config.load(values, stack=stack)
    built = Built(cfg, [])

    def program() -> None:
        # As infra.program does: GCP resources through a provider of their own (passed down by opts).
        _GCP[:] = [pulumi.ResourceOptions(providers={"gcp": gcp.Provider("gcp", project=cfg.project_id)})]
        built.made.update(make(cfg, k8s.Provider("k8s")))
        plain = {k: v for k, v in built.made.items() if isinstance(v, pulumi.Output | str)}
        built.resolved.update(render._sync_await(pulumi.Output.from_input(plain).future()) or {})

    built.resources = render.run_mocked(stack, values, program)
    return built


def in_cluster(cfg: config.StackConfig, provider: k8s.Provider) -> InCluster:
    """The stack's namespace by its name (the program passes the Namespace's output; no Namespace here)."""
    return InCluster(provider, cfg.namespace, cfg.namespace)


def platform(cfg: config.StackConfig, provider: k8s.Provider) -> Platform:
    """The share, the queue and the identities, as infra.program wires them (the image by a fixed digest, the
    workload pool by its name: no cluster here)."""
    network = Network("network", program.network_args(cfg), opts=on_gcp())
    pool = f"{cfg.project_id}.svc.id.goog"
    return program.platform(cfg, in_cluster(cfg, provider), IMAGE, network, pool, on_gcp())


def _workloads(cfg: config.StackConfig, provider: k8s.Provider) -> dict[str, Any]:
    """The Jobs and everything they are wired to (no cluster, image or project services), as infra.program
    declares them."""
    shared = platform(cfg, provider)
    made = program.workloads(cfg, shared, render.CLUSTER_ENDPOINT)
    ids = shared.identities
    lines = program.one_off_commands(cfg, shared)
    return {
        "share": shared.share,
        "redis": shared.queue,
        "capacity": made.capacity,
        "loader": made.loader,
        "training": made.training,
        "loader_id": ids.loader,
        "worker_id": ids.worker,
        "status": lines["queueStatus"],
        "report": lines["report"],
        **{f"export-{run}": line for run, line in lines["export"].items()},
        "seed": made.loader.seed_inputs,
        "redis_url": shared.queue.url,
        "loader_id_urns": _urns(ids.loader.resources if ids.loader else []),
        "worker_id_urns": _urns(ids.worker.resources if ids.worker else []),
    }


def _urns(resources: list[pulumi.Resource]) -> pulumi.Output[list[str]]:
    return pulumi.Output.all(*[r.urn for r in resources])


def workloads(stack: str = "dev", **overrides: Any) -> Built:
    return build(_workloads, stack, **overrides)


def _strictly_valid(built: Built) -> None:
    """Every object valid for the API server (schema, names) and every pod startable and schedulable."""
    for manifest in built.manifests():
        if not manifest["apiVersion"].startswith("cloud.google.com/"):  # ComputeClass: no schema offline
            kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True)
        if manifest["kind"] in ("Job", "Deployment"):
            spec = manifest["spec"]["template"]["spec"]
            startable(spec)
            for c in spec["containers"]:
                schedulable(c["resources"])
    names_are_dns_labels(built)


def pod(job: Registered) -> dict[str, Any]:
    return job.inputs["spec"]["template"]["spec"]


def container(job: Registered) -> dict[str, Any]:
    (only,) = pod(job)["containers"]
    return only


def env(c: dict[str, Any]) -> dict[str, Any]:
    names = [e["name"] for e in c["env"]]
    assert len(names) == len(set(names)), names
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}


DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
# Kubernetes resource quantities (apimachinery resource.Quantity): decimal and binary SI suffixes.
QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(m|k|M|G|T|Ki|Mi|Gi|Ti)?$")
SCALE = {None: 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30,
         "Ti": 2**40}  # fmt: skip


def quantity(text: str) -> float:
    """A quantity as the API server reads it (a bad suffix is refused at admission)."""
    match = QUANTITY.match(str(text))
    assert match, f"{text!r} is not a Kubernetes quantity"
    return float(match[1]) * SCALE[match[2]]


def schedulable(resources: dict[str, Any]) -> None:
    """Requests a node can hold (up to 16 CPUs and 64 GiB), and limits no lower than the requests."""
    requests, limits = resources.get("requests", {}), resources.get("limits", {})
    assert 0 < quantity(requests["cpu"]) <= 16 and 0 < quantity(requests["memory"]) <= 64 * 2**30
    for key, value in limits.items():
        assert quantity(value) >= quantity(requests[key]), key


def startable(spec: dict[str, Any]) -> None:
    """What the kubelet refuses at container start: runAsNonRoot with uid 0; an unknown seccomp type."""
    pod_ctx = spec.get("securityContext", {})
    for c in spec["containers"]:
        ctx = {**pod_ctx, **c.get("securityContext", {})}
        assert not (ctx.get("runAsNonRoot") and ctx.get("runAsUser") == 0), c["name"]
        assert ctx.get("seccompProfile", {}).get("type") == "RuntimeDefault", c["name"]


def names_are_dns_labels(built: Built) -> None:
    for manifest in built.manifests():
        meta = manifest["metadata"]
        for name in (meta["name"], meta.get("namespace", "default")):
            assert DNS_LABEL.match(name), f"{manifest['kind']} {name!r} is not a DNS label"



def admitted_by_redis(b: Built, labels: dict[str, str]) -> bool:
    """Would the Redis NetworkPolicy admit a pod with ``labels`` (in its namespace) to the Redis port?"""
    policy = b.one("kubernetes:networking.k8s.io/v1:NetworkPolicy", "redis").inputs["spec"]
    return any(_selects(peer["podSelector"], labels) for rule in policy["ingress"] for peer in rule["from"])


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Kubernetes label selector semantics: every matchLabels pair and every expression must hold."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for e in selector.get("matchExpressions", []):
        value, op = labels.get(e["key"]), e["operator"]
        ok = {
            "In": value in e.get("values", []),
            "NotIn": value not in e.get("values", []),
            "Exists": e["key"] in labels,
            "DoesNotExist": e["key"] not in labels,
        }[op]
        if not ok:
            return False
    return True

