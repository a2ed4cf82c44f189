"""Each infra component built on its own under the mock engine, and its rendered spec checked for what it
means: the Jobs' failure rules played through the Job controller, the pods admitted by the namespace's
Pod Security level and by the Redis NetworkPolicy, Redis started from its own rendered arguments, the
share preparation's script run on a real folder, every Kubernetes object strictly valid.

A component build registers tens of resources instead of the whole stack's, so these tests are what
`make mutation` runs for the infra components (a mutant is tested in well under a second); the whole
stack's wiring is test_infra_stack.py's and test_infra_jobs.py's. The Jobs come last: their build has
every other component in it, so a mutant elsewhere meets its own component's cheaper tests first.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kubernetes_validate
import pulumi
import pulumi_gcp as gcp
import pulumi_kubernetes as k8s
import pytest
import redis as redis_py

from infra import config, contract, jobs, program, render, share_prep
from infra.filestore import FilestoreShare
from infra.gke import ZONE_LABEL
from infra.gpu import GpuCapacity
from infra.identity import READ_OBJECTS, WORKLOAD_IDENTITY_USER, WRITE_OBJECTS, BucketGrant, WorkloadIdentity
from infra.network import Network
from infra.redis import RedisQueue
from infra.render import Registered
from policy import rules
from tests.infra.job_controller import FailedPod, JobController
from tests.infra.pod_security import pod_security_violations
from workload.core import errors
from workload.runtime.redis_server import find_redis_server, free_port

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


def _workloads(cfg: config.StackConfig, provider: k8s.Provider) -> dict[str, Any]:
    """The Jobs and everything they are wired to (no cluster, image or project services)."""
    network = Network("network", program.network_args(cfg), opts=on_gcp())
    share = FilestoreShare("share", program.filestore_args(cfg), network, provider, cfg.namespace, opts=on_gcp())
    redis = RedisQueue("redis", cfg.redis_image, provider, cfg.namespace, cfg.namespace)
    capacity = GpuCapacity("gpu", cfg.gpu, cfg.cluster.autopilot, provider)
    data, work = cfg.data, program.job_args(cfg)
    loader_id = (
        WorkloadIdentity(
            "loader-identity",
            cfg.site,
            cfg.namespace,
            f"{cfg.project_id}.svc.id.goog",
            contract.LOADER,
            [BucketGrant(READ_OBJECTS, data.dataset, prefix_only=False)],
            provider,
            cfg.namespace,
            opts=on_gcp(),
        )
        if data.dataset
        else None
    )
    worker_id = (
        WorkloadIdentity(
            "worker-identity",
            cfg.site,
            cfg.namespace,
            f"{cfg.project_id}.svc.id.goog",
            contract.WORKER,
            [BucketGrant(WRITE_OBJECTS, data.output, prefix_only=True)],
            provider,
            cfg.namespace,
            opts=on_gcp(),
        )
        if data.output
        else None
    )
    prepared = share_prep.SharePreparation("share-prep", cfg.namespace, IMAGE, share, provider)
    loader = jobs.LoaderJob(
        "loader", work, IMAGE, redis, share, loader_id, provider, cfg.namespace, after=[prepared.job]
    )
    training = jobs.TrainingJob(
        "training", work, IMAGE, redis, share, capacity, loader, worker_id, provider, cfg.namespace
    )
    status = jobs.one_off_pod(work, IMAGE, redis, share, "status", contract.STATUS_ARGS)
    export = jobs.one_off_pod(
        work,
        IMAGE,
        redis,
        share,
        "export",
        ["export"],
        command=["python", "-m", "x"],
        service_account=worker_id.ksa_name if worker_id else None,
    )
    return {
        "share": share,
        "redis": redis,
        "capacity": capacity,
        "loader": loader,
        "training": training,
        "loader_id": loader_id,
        "worker_id": worker_id,
        "status": status,
        "export": export,
        "seed": loader.seed_inputs,
        "redis_url": redis.url,
        "loader_id_urns": _urns(loader_id.resources if loader_id else []),
        "worker_id_urns": _urns(worker_id.resources if worker_id else []),
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


# --- Redis ------------------------------------------------------------------------------------------------


def _redis(cfg: config.StackConfig, provider: k8s.Provider) -> dict[str, Any]:
    r = RedisQueue("redis", cfg.redis_image, provider, cfg.namespace, cfg.namespace)
    return {"redis": r, "url": r.url}


def admitted_by_redis(b: Built, labels: dict[str, str]) -> bool:
    """Would the Redis NetworkPolicy admit a pod with ``labels`` (in its namespace) to the Redis port?"""
    policy = b.one("kubernetes:networking.k8s.io/v1:NetworkPolicy").inputs["spec"]
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


def test_redis_admits_only_the_loader_and_the_workers() -> None:
    b = build(_redis)
    _strictly_valid(b)
    policy = b.one("kubernetes:networking.k8s.io/v1:NetworkPolicy").inputs
    assert policy["metadata"]["namespace"] == b.cfg.namespace
    spec = policy["spec"]
    deployment = b.one("kubernetes:apps/v1:Deployment").inputs
    assert _selects(spec["podSelector"], deployment["spec"]["template"]["metadata"]["labels"])
    assert spec["policyTypes"] == ["Ingress"]
    for component in (contract.LOADER, contract.WORKER):
        assert admitted_by_redis(b, contract.labels(component))
    for labels in (
        contract.labels(contract.SHARE_PREP),
        contract.labels(contract.REDIS),
        {},
        {**contract.labels(contract.WORKER), contract.NAME_LABEL: "other-app"},
        {contract.COMPONENT_LABEL: contract.WORKER},
    ):
        assert not admitted_by_redis(b, labels), labels
    for rule in spec["ingress"]:
        assert rule["ports"] == [{"protocol": "TCP", "port": contract.REDIS_PORT}]


def test_redis_is_reachable_through_its_service_at_its_url() -> None:
    b = build(_redis)
    _strictly_valid(b)
    r = b.made["redis"]
    service = b.one("kubernetes:core/v1:Service").inputs
    deployment = b.one("kubernetes:apps/v1:Deployment").inputs
    pod_spec = deployment["spec"]["template"]["spec"]
    (c,) = pod_spec["containers"]
    assert service["metadata"]["name"] == r.service_name and service["spec"]["type"] == "ClusterIP"
    assert _selects({"matchLabels": service["spec"]["selector"]}, deployment["spec"]["template"]["metadata"]["labels"])
    assert _selects(deployment["spec"]["selector"], deployment["spec"]["template"]["metadata"]["labels"])
    # The app's other pods share its name label: a selector matching them would make the loader and the
    # workers Redis endpoints (the Service) or Deployment replicas.
    for component in (contract.LOADER, contract.WORKER, contract.SHARE_PREP):
        assert not _selects({"matchLabels": service["spec"]["selector"]}, contract.labels(component)), component
        assert not _selects(deployment["spec"]["selector"], contract.labels(component)), component
    (port,) = service["spec"]["ports"]
    (container_port,) = c["ports"]
    assert port["port"] == container_port["containerPort"] == contract.REDIS_PORT
    assert port["targetPort"] == container_port["name"]
    # The API server refuses a Service port name that is not a DNS label (pkg/apis/core/validation,
    # validateServicePort: ValidateDNS1123Label); the schema leaves it a plain string.
    assert DNS_LABEL.match(port["name"]), port
    assert b.resolved["url"] == (
        f"redis://{r.service_name}.{b.cfg.namespace}.svc.cluster.local:{contract.REDIS_PORT}/0"
    )
    assert "p" * 32 not in b.resolved["url"]
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert deployment["metadata"]["namespace"] == service["metadata"]["namespace"] == b.cfg.namespace
    probe = c["readinessProbe"]
    assert probe["exec"]["command"][:2] == ["sh", "-c"] and "redis-cli ping" in probe["exec"]["command"][2]
    assert "PONG" in probe["exec"]["command"][2] and probe["periodSeconds"] > 0
    assert c["livenessProbe"]["tcpSocket"] == {"port": contract.REDIS_PORT}
    assert c["livenessProbe"]["initialDelaySeconds"] >= probe["initialDelaySeconds"]
    auth = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in c["env"]}
    assert auth == {"REDISCLI_AUTH": {"name": r.secret_name, "key": r.password_key}}
    assert _mebibytes(c["resources"]["requests"]["memory"]) <= _mebibytes(c["resources"]["limits"]["memory"])
    assert not pod_security_violations(pod_spec, "restricted") and pod_spec["automountServiceAccountToken"] is False


def _mebibytes(quantity: str) -> int:
    return int(quantity[:-2]) * {"Mi": 1, "Gi": 1024}[quantity[-2:]]


def test_redis_keeps_its_data_on_its_own_claim_and_its_password_secret() -> None:
    b = build(_redis)
    r = b.made["redis"]
    claim = b.one("kubernetes:core/v1:PersistentVolumeClaim").inputs
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert claim["metadata"]["annotations"] == {"pulumi.com/skipAwait": "true"}  # binds on first consumer
    assert claim["spec"]["resources"]["requests"]["storage"].endswith("Gi")
    secret = b.one("kubernetes:core/v1:Secret")
    assert secret.masked_inputs["stringData"] == {r.password_key: render.MASK, "auth.conf": render.MASK}
    assert secret.inputs["metadata"]["name"] == r.secret_name and secret.inputs["type"] == "Opaque"
    password = b.one("random:index/randomPassword:RandomPassword").inputs
    assert password["length"] >= 32 and password["special"] is False  # unquoted in a config line
    pod_spec = b.one("kubernetes:apps/v1:Deployment").inputs["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod_spec["volumes"]}
    (c,) = pod_spec["containers"]
    kinds = {next(k for k in v if k != "name"): v for v in volumes.values()}
    assert kinds["persistentVolumeClaim"]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    auth = kinds["secret"]["secret"]
    assert auth["secretName"] == r.secret_name
    mode = int(auth["defaultMode"])
    assert mode & 0o040 and not mode & 0o007  # readable through fsGroup, not by others
    assert pod_spec["securityContext"]["fsGroup"] == pod_spec["securityContext"]["runAsGroup"]
    (mount,) = [m for m in c["volumeMounts"] if volumes[m["name"]].get("secret")]
    assert mount["readOnly"] is True


def test_redis_started_from_its_rendered_arguments_requires_the_password_and_fsyncs(tmp_path: Path) -> None:
    """The Deployment's own args and the Secret's own auth.conf, with the mounts on real folders."""
    b = build(_redis)
    deployment = b.one("kubernetes:apps/v1:Deployment").inputs["spec"]["template"]["spec"]
    (c,) = deployment["containers"]
    secret = b.one("kubernetes:core/v1:Secret").inputs
    volumes = {v["name"]: v for v in deployment["volumes"]}
    folders: dict[str, Path] = {}
    for m in c["volumeMounts"]:
        folders[m["mountPath"]] = tmp_path / m["name"]
        folders[m["mountPath"]].mkdir()
        for item in volumes[m["name"]].get("secret", {}).get("items", []):
            (folders[m["mountPath"]] / item["path"]).write_text(secret["stringData"][item["key"]])
    port = free_port()
    args = []
    for arg in c["args"]:
        for at, folder in folders.items():
            arg = str(folder) + arg[len(at) :] if arg == at or arg.startswith(at + "/") else arg
        args.append(str(port) if arg == str(contract.REDIS_PORT) else arg)
    proc = subprocess.Popen([find_redis_server(), *args], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        password = secret["stringData"][b.made["redis"].password_key]
        client = redis_py.Redis(port=port, password=password, socket_timeout=5)
        for _ in range(200):
            try:
                client.ping()
                break
            except redis_py.ConnectionError:
                assert proc.poll() is None, f"redis-server exited {proc.returncode} with args {args}"
                os.sched_yield()
                subprocess.run(["sleep", "0.05"], check=True)
        assert client.config_get("append*") == {
            **client.config_get("append*"),
            "appendonly": "yes",
            "appendfsync": "always",
        }
        assert client.config_get("dir")["dir"] == str(folders["/data"].resolve())
        with pytest.raises(redis_py.AuthenticationError):
            redis_py.Redis(port=port, socket_timeout=5).ping()
        # The readiness probe, as the kubelet runs it in the container: its own command, with the container's
        # env (the password from the Secret it names). It passes on this Redis; without the password or with
        # Redis gone it fails (the pod leaves the Service's endpoints).
        probe = c["readinessProbe"]["exec"]["command"]
        container_env = {}
        for var in c["env"]:
            ref = var["valueFrom"]["secretKeyRef"]
            assert ref["name"] == b.made["redis"].secret_name
            container_env[var["name"]] = secret["stringData"][ref["key"]]
        assert probe_passes(probe, port, tmp_path, container_env)
        assert not probe_passes(probe, port, tmp_path, {})
    finally:
        proc.kill()
        proc.wait()
    assert not probe_passes(probe, port, tmp_path, container_env)


def probe_passes(command: list[str], port: int, tmp_path: Path, env: dict[str, str]) -> bool:
    """Run an exec probe's command as the kubelet would, in the Redis image's shell with redis-cli on PATH. The
    Redis under test listens on a free port rather than the pod's 6379: the `redis-cli` found first on PATH is
    the real one (the binary next to redis-server) told that port."""
    bin_dir = tmp_path / "probe-bin"
    bin_dir.mkdir(exist_ok=True)
    cli = Path(find_redis_server()).with_name("redis-cli")
    cli = cli if cli.is_file() else Path(shutil.which("redis-cli") or "redis-cli")
    (bin_dir / "redis-cli").write_text(f'#!/bin/sh\nexec {shlex.quote(str(cli))} -p {port} "$@"\n')
    (bin_dir / "redis-cli").chmod(0o755)
    path = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
    return subprocess.run(command, env={"PATH": path, **env}, timeout=30, capture_output=True).returncode == 0


# --- the network, the share, the GPUs, the identities ------------------------------------------------------


def _network(cfg: config.StackConfig, provider: k8s.Provider) -> dict[str, Any]:
    n = Network("network", program.network_args(cfg), opts=on_gcp())
    return {"id": n.network_id, "name": n.network_name, "subnet": n.subnetwork_id}


def test_a_created_network_has_the_ranges_the_cluster_names_and_nat_for_private_nodes() -> None:
    b = build(_network, privateNodes=True)
    net = b.cfg.network
    vpc = b.one("gcp:compute/network:Network").inputs
    assert vpc["autoCreateSubnetworks"] is False and vpc["routingMode"] == "REGIONAL"
    assert vpc["project"] == b.cfg.project_id
    subnet = b.one("gcp:compute/subnetwork:Subnetwork").inputs
    assert subnet["ipCidrRange"] == net.subnet_cidr and subnet["privateIpGoogleAccess"] is True
    assert subnet["region"] == b.cfg.region and subnet["network"] == b.resolved["id"]
    assert {r["rangeName"]: r["ipCidrRange"] for r in subnet["secondaryIpRanges"]} == {
        net.pods_range_name: net.pods_cidr,
        net.services_range_name: net.services_cidr,
    }
    router = b.one("gcp:compute/router:Router").inputs
    nat = b.one("gcp:compute/routerNat:RouterNat").inputs  # its router's name is an output the mocks lack
    assert router["network"] == b.resolved["id"]
    assert nat["region"] == router["region"] == b.cfg.region
    assert nat["project"] == router["project"] == subnet["project"] == b.cfg.project_id
    assert nat["natIpAllocateOption"] == "AUTO_ONLY"
    assert nat["sourceSubnetworkIpRangesToNat"] == "ALL_SUBNETWORKS_ALL_IP_RANGES"
    assert nat["logConfig"] == {"enable": True, "filter": "ERRORS_ONLY"}
    assert b.resolved["name"] == b.one("gcp:compute/network:Network").outputs["name"]
    assert b.resolved["subnet"] == b.one("gcp:compute/subnetwork:Subnetwork").id, "the cluster's subnet is this one"
    public = build(_network, privateNodes=False)
    assert not public.of_type("gcp:compute/router:Router") and not public.of_type("gcp:compute/routerNat:RouterNat")


def test_an_existing_network_is_used_by_name_and_nothing_is_created() -> None:
    b = build(_network, network="shared-vpc", subnetwork="shared-sub")
    assert not [r for r in b.resources if r.type.startswith("gcp:")]
    p, region = b.cfg.project_id, b.cfg.region
    assert b.resolved == {
        "id": f"projects/{p}/global/networks/shared-vpc",
        "name": "shared-vpc",
        "subnet": f"projects/{p}/regions/{region}/subnetworks/shared-sub",
    }


def _share(cfg: config.StackConfig, provider: k8s.Provider) -> dict[str, Any]:
    network = Network("network", program.network_args(cfg), opts=on_gcp())
    share = FilestoreShare("share", program.filestore_args(cfg), network, provider, cfg.namespace, opts=on_gcp())
    return {"share": share, "ip": share.ip}


@pytest.mark.parametrize(("stack", "tier"), [("dev", "BASIC_HDD"), ("prod", "REGIONAL"), ("prod", "BASIC_SSD")])
def test_the_share_is_one_filestore_bound_to_exactly_one_claim(stack: str, tier: str) -> None:
    capacity = 2560 if tier == "BASIC_SSD" else 1024
    b = build(_share, stack, filestoreTier=tier, filestoreCapacityGb=capacity)
    _strictly_valid(b)
    fs = b.cfg.filestore
    instance = b.one("gcp:filestore/instance:Instance")
    assert instance.inputs["tier"] == tier and instance.inputs["project"] == b.cfg.project_id
    assert instance.inputs["location"] == (b.cfg.zone if fs.zonal else b.cfg.region)
    assert instance.inputs["fileShares"] == {"name": fs.share, "capacityGb": capacity}
    assert b.made["share"].share == fs.share, "the share's name, as the stack exports it (filestoreShare)"
    (net,) = instance.inputs["networks"]
    assert net == {"network": "network", "modes": ["MODE_IPV4"], "connectMode": "DIRECT_PEERING"}
    assert instance.inputs["labels"] == b.cfg.labels.as_dict()
    protected = b.cfg.cluster.deletion_protection
    if fs.api_deletion_protection:
        assert instance.inputs["deletionProtectionEnabled"] is protected and not instance.protect
    else:
        assert "deletionProtectionEnabled" not in instance.inputs and instance.protect is protected
    assert b.resolved["ip"] == render.FILESTORE_IP
    volume = b.one("kubernetes:core/v1:PersistentVolume").inputs
    claim = b.one("kubernetes:core/v1:PersistentVolumeClaim").inputs
    assert volume["spec"]["nfs"] == {"server": render.FILESTORE_IP, "path": f"/{fs.share}"}
    assert volume["spec"]["persistentVolumeReclaimPolicy"] == "Retain"
    assert volume["spec"]["mountOptions"] == ["hard", "nfsvers=3"]
    assert claim["spec"]["volumeName"] == volume["metadata"]["name"]
    assert claim["spec"]["storageClassName"] == volume["spec"]["storageClassName"] == ""
    assert claim["spec"]["accessModes"] == volume["spec"]["accessModes"] == ["ReadWriteMany"]
    assert volume["spec"]["capacity"]["storage"] == f"{capacity}Gi"
    # The claim asks for the tier's floor, whatever the size (test_infra_share: growing the share).
    assert claim["spec"]["resources"]["requests"]["storage"] == f"{config.FILESTORE_TIERS[tier][0]}Gi"
    assert claim["metadata"] == {"name": b.made["share"].claim_name, "namespace": b.cfg.namespace}
    assert b.cfg.slug in volume["metadata"]["name"]  # PVs are cluster-wide: one per stack
    # Filestore peers with the VPC: the instance waits for the subnet a created network makes.
    assert b.one("gcp:compute/subnetwork:Subnetwork").urn in instance.dependencies


def _gpu(cfg: config.StackConfig, provider: k8s.Provider) -> dict[str, Any]:
    gpu = GpuCapacity("gpu", cfg.gpu, cfg.cluster.autopilot, provider)
    return {"gpu": gpu, "urns": _urns(gpu.resources)}


def test_compute_class_puts_workers_on_spot_gpus_and_on_demand_only_when_asked() -> None:
    for fallback in (False, True):
        b = build(_gpu, gpuCapacity="computeClass", onDemandFallback=fallback, gpuType="nvidia-l4", gpuCount=2)
        cc = b.one("kubernetes:cloud.google.com/v1:ComputeClass").inputs
        names_are_dns_labels(b)
        # No offline schema for the ComputeClass kind, but its metadata is an ObjectMeta like any object's:
        # checked strictly as one (an unknown key is refused by the API server's strict field validation).
        kubernetes_validate.validate(
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": cc["metadata"]}, KUBERNETES_VERSION, strict=True
        )
        assert cc["metadata"]["labels"] == {contract.NAME_LABEL: contract.APP}  # `kubectl get -l` finds the stack's
        gpu = {"type": "nvidia-l4", "count": 2, "driverVersion": "latest"}
        assert cc["spec"]["priorities"] == [{"gpu": gpu, "spot": True}] + (
            [{"gpu": gpu, "spot": False}] if fallback else []
        )
        assert cc["spec"]["whenUnsatisfiable"] == "DoNotScaleUp"
        assert cc["spec"]["activeMigration"] == {"optimizeRulePriority": fallback}
        assert cc["spec"]["nodePoolAutoCreation"] == {"enabled": True}
        capacity = b.made["gpu"]
        assert capacity.node_selector == {"cloud.google.com/compute-class": cc["metadata"]["name"]}
        assert b.resolved["urns"] == [b.one("kubernetes:cloud.google.com/v1:ComputeClass").urn]


@pytest.mark.parametrize(("mode", "driver"), [("autopilot", True), ("standard", False)])
def test_node_selector_capacity_asks_for_spot_and_the_accelerator(mode: str, driver: bool) -> None:
    b = build(_gpu, clusterMode=mode, gpuCapacity="nodeSelector", gpuType="nvidia-tesla-t4")
    capacity = b.made["gpu"]
    assert not b.of_type("kubernetes:cloud.google.com/v1:ComputeClass") and b.resolved["urns"] == []
    expected = {"cloud.google.com/gke-spot": "true", "cloud.google.com/gke-accelerator": "nvidia-tesla-t4"}
    if driver:
        expected["cloud.google.com/gke-gpu-driver-version"] = "latest"
    assert capacity.node_selector == expected
    assert {"key": "cloud.google.com/gke-spot", "operator": "Equal", "value": "true", "effect": "NoSchedule"} in (
        capacity.tolerations
    )
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in capacity.tolerations


def _identities(cfg: config.StackConfig, provider: k8s.Provider) -> dict[str, Any]:
    data = cfg.data
    reader = WorkloadIdentity(
        "loader-identity",
        cfg.site,
        cfg.namespace,
        f"{cfg.project_id}.svc.id.goog",
        contract.LOADER,
        [BucketGrant(READ_OBJECTS, data.dataset, prefix_only=False)],
        provider,
        cfg.namespace,
        opts=on_gcp(),
    )
    writer = WorkloadIdentity(
        "worker-identity",
        cfg.site,
        cfg.namespace,
        f"{cfg.project_id}.svc.id.goog",
        contract.WORKER,
        [BucketGrant(WRITE_OBJECTS, data.output, prefix_only=True)],
        provider,
        cfg.namespace,
        opts=on_gcp(),
    )
    return {
        "reader": reader,
        "writer": writer,
        "email": writer.account.email,
        "reader_urns": _urns(reader.resources),
        "writer_urns": _urns(writer.resources),
    }


def test_each_identity_acts_as_its_own_account_with_a_bucket_role_only() -> None:
    b = build(_identities, "prod", **DATA)
    _strictly_valid(b)
    accounts = {a.name: a for a in b.of_type("gcp:serviceaccount/account:Account")}
    ksas = {k.name: k.inputs for k in b.of_type("kubernetes:core/v1:ServiceAccount")}
    bindings = {m.name: m.inputs for m in b.of_type("gcp:serviceaccount/iAMMember:IAMMember")}
    grants = {g.name: g.inputs for g in b.of_type("gcp:storage/bucketIAMMember:BucketIAMMember")}
    assert len(accounts) == len(ksas) == len(bindings) == len(grants) == 2
    for name, component in (("loader-identity", contract.LOADER), ("worker-identity", contract.WORKER)):
        account = accounts[name]
        account_id = account.inputs["accountId"]
        assert 6 <= len(account_id) <= 30 and account_id[0].isalpha() and not account_id.endswith("-")
        assert account.inputs["project"] == b.cfg.project_id
        assert component in account_id and b.cfg.slug[:3] in account_id
        ksa = ksas[name]
        made = b.made["reader" if component == contract.LOADER else "writer"]
        assert ksa["metadata"]["name"] == made.ksa_name and ksa["metadata"]["namespace"] == b.cfg.namespace
        assert ksa["metadata"]["annotations"] == {contract.GCP_SERVICE_ACCOUNT_ANNOTATION: account.outputs["email"]}
        assert ksa["metadata"]["labels"] == contract.labels(component)
        binding = bindings[f"{name}-workload-identity"]
        assert binding["serviceAccountId"] == account.outputs["name"]
        assert binding["role"] == WORKLOAD_IDENTITY_USER
        assert binding["member"] == (
            f"serviceAccount:{b.cfg.project_id}.svc.id.goog[{b.cfg.namespace}/{made.ksa_name}]"
        )
        urns = b.resolved["reader_urns" if component == contract.LOADER else "writer_urns"]
        assert {
            b.one("kubernetes:core/v1:ServiceAccount", name).urn,  # pods wait for all of it
            b.one("gcp:serviceaccount/iAMMember:IAMMember", f"{name}-workload-identity").urn,
        } <= set(urns)
        assert len(urns) == 3
    read = grants["loader-identity-objectviewer"]
    assert read["bucket"] == "acme-fraud" and read["role"] == READ_OBJECTS and "condition" not in read
    assert read["member"] == accounts["loader-identity"].outputs["member"]
    write = grants["worker-identity-objectuser"]
    assert write["bucket"] == "acme-results" and write["role"] == WRITE_OBJECTS
    assert write["member"] == accounts["worker-identity"].outputs["member"]
    condition = write["condition"]
    assert condition["expression"] == 'resource.name.startsWith("projects/_/buckets/acme-results/objects/runs/v1/")'
    assert 0 < len(condition["title"]) <= 100 and DATA["outputUri"] in condition["title"]
    assert len(condition.get("description", "")) <= 256
    assert b.resolved["email"] == accounts["worker-identity"].outputs["email"]


def test_a_long_output_uri_keeps_the_condition_title_within_iams_limit() -> None:
    uri = "gs://acme-results/" + "deep/" * 30
    grant = BucketGrant(WRITE_OBJECTS, config.GcsUri.split(uri), prefix_only=True)
    condition = grant.condition()
    assert condition is not None and len(condition.title) == 100 and condition.title.startswith("only gs://acme")
    assert condition.expression == f'resource.name.startsWith("{grant.location.objects}")'
    assert BucketGrant(READ_OBJECTS, grant.location, prefix_only=False).condition() is None


# --- the share preparation ---------------------------------------------------------------------------------


def _prep(cfg: config.StackConfig, provider: k8s.Provider) -> dict[str, Any]:
    network = Network("network", program.network_args(cfg), opts=on_gcp())
    share = FilestoreShare("share", program.filestore_args(cfg), network, provider, cfg.namespace, opts=on_gcp())
    return {"prep": share_prep.SharePreparation("share-prep", cfg.namespace, IMAGE, share, provider), "share": share}


def test_the_share_preparation_runs_as_root_only_in_its_own_baseline_namespace() -> None:
    b = build(_prep)
    _strictly_valid(b)
    ns = b.one("kubernetes:core/v1:Namespace", "share-prep").inputs["metadata"]
    assert ns["name"] == share_prep.prep_namespace(b.cfg.namespace) != b.cfg.namespace
    assert ns["labels"]["pod-security.kubernetes.io/enforce"] == "baseline"
    job = b.one(JOB, "share-prep")
    assert job.inputs["metadata"]["namespace"] == ns["name"]
    spec = pod(job)
    assert not pod_security_violations(spec, "baseline")
    assert pod_security_violations(spec, "restricted")  # which is why it has a namespace of its own
    assert spec["securityContext"]["runAsUser"] == 0 and spec["automountServiceAccountToken"] is False
    # root:root: with every capability but CHOWN dropped, root is held to the file modes (no DAC override),
    # and a new share's root directory is root:root, so the group is part of what lets the script in.
    assert spec["securityContext"]["runAsGroup"] == 0
    # The policy pack admits this one root container by its share-prep component label (and CHOWN alone).
    assert job.inputs["spec"]["template"]["metadata"]["labels"] == contract.labels(contract.SHARE_PREP)
    assert rules.containers_run_as_non_root(JOB, job.inputs, rules.StackFacts(stack=b.cfg.stack)) == []
    c = container(job)
    assert c["image"] == IMAGE and c["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["terminationMessagePolicy"] == "FallbackToLogsOnError"
    (mount,) = c["volumeMounts"]
    assert env(c)["SHARE"] == mount["mountPath"]
    (volume,) = spec["volumes"]
    assert volume["name"] == mount["name"]
    claims = {r.inputs["metadata"]["namespace"]: r for r in b.of_type("kubernetes:core/v1:PersistentVolumeClaim")}
    claim = claims[ns["name"]]
    assert volume["persistentVolumeClaim"]["claimName"] == claim.inputs["metadata"]["name"]
    assert claim.urn in job.dependencies
    volumes = {r.inputs["metadata"]["name"]: r.inputs for r in b.of_type("kubernetes:core/v1:PersistentVolume")}
    assert volumes[claim.inputs["spec"]["volumeName"]]["spec"]["nfs"]["path"] == f"/{b.cfg.filestore.share}"
    assert len(volumes) == 2  # a PV binds one claim: one per namespace
    assert job.delete_before_replace and job.custom_timeouts == {"create": "15m", "update": "15m"}
    ctl = JobController(job.inputs["spec"])
    assert all(ctl.pod_failed(FailedPod({c["name"]: 1}, ("DisruptionTarget",))) is None for _ in range(10))
    assert [ctl.pod_failed(FailedPod({c["name"]: 1})) for _ in range(4)][-1] == "BackoffLimitExceeded"
    assert ctl.counted == 4


def test_the_share_preparations_script_hands_the_share_root_over(tmp_path: Path) -> None:
    """The rendered command and environment, run on a real folder (as ourselves: chown to our own ids)."""
    b = build(_prep)
    c = container(b.one(JOB, "share-prep"))
    variables = env(c)
    assert variables["OWNER"] == f"{contract.WORKLOAD_UID}:{contract.WORKLOAD_UID}"
    share = tmp_path / "share"
    share.mkdir(mode=0o700)
    mine = f"{os.getuid()}:{os.getgid()}"
    done = subprocess.run(
        c["command"],
        env={"PATH": os.environ["PATH"], "SHARE": str(share), "OWNER": mine},
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert done.stdout.strip() == f"share root is now {mine} mode 755"
    assert (share.stat().st_mode & 0o777) == 0o755
    broken = subprocess.run(
        c["command"],
        env={"PATH": os.environ["PATH"], "SHARE": str(tmp_path / "missing"), "OWNER": mine},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert broken.returncode != 0  # set -e: a missing share fails the pod, never reports success


def test_the_preparation_namespace_is_a_dns_label() -> None:
    long = config.load(render.stack_config("dev", {"namespace": "n" * 63}), stack="dev")
    name = share_prep.prep_namespace(long.namespace)
    assert len(name) <= 63 and name.endswith("-share-prep") and name.startswith("n" * 52)
    dashed = config.load(render.stack_config("dev", {"namespace": "a" * 51 + "-b"}), stack="dev")
    assert "--" not in share_prep.prep_namespace(dashed.namespace)


# --- what deployed stacks are keyed on -----------------------------------------------------------------------

# A resource's URN is its parents' type tokens and its own name: a component renamed, re-typed or no longer
# the parent of a resource gives that resource a new URN, and `pulumi up` replaces it: the Filestore share
# (checkpoints, datasets), the Redis volume (the queue), the service accounts are deleted and recreated.
# These are the component types of every stack already deployed.
COMPONENT_TYPES = {
    "network": "spot-trainer:gcp:Network",
    "share": "spot-trainer:storage:FilestoreShare",
    "redis": "spot-trainer:k8s:RedisQueue",
    "gpu": "spot-trainer:k8s:GpuCapacity",
    "loader-identity": "spot-trainer:iam:WorkloadIdentity",
    "worker-identity": "spot-trainer:iam:WorkloadIdentity",
    "share-prep": "spot-trainer:storage:SharePreparation",
    "loader": "spot-trainer:k8s:LoaderJob",
    "training": "spot-trainer:k8s:TrainingJob",
}


def test_every_resource_keeps_its_urn_and_goes_through_the_stacks_providers() -> None:
    b = workloads(gpuCapacity="computeClass", privateNodes=True, **DATA)
    components = {r.name: r for r in b.resources if r.type in set(COMPONENT_TYPES.values())}
    assert {name: r.type for name, r in components.items()} == COMPONENT_TYPES
    (k8s_provider,) = [r for r in b.resources if r.type == "pulumi:providers:kubernetes"]
    (gcp_provider,) = [r for r in b.resources if r.type == "pulumi:providers:gcp"]
    children = [r for r in b.resources if r.parent in {c.urn for c in components.values()}]
    for r in b.resources:
        if r.type.startswith("pulumi:providers:") or r in components.values():
            continue
        assert r in children, f"{r.type} {r.name} is not a component's child"
        parent = b.by_urn(r.parent)
        assert r.urn == f"urn:pulumi:{b.cfg.stack}::spot-trainer::{parent.type}${r.type}::{r.name}"
        if r.type.startswith("gcp:"):
            assert r.provider.startswith(gcp_provider.urn + "::"), f"{r.type} {r.name}: {r.provider}"
        elif r.type.startswith("kubernetes:"):
            assert r.provider.startswith(k8s_provider.urn + "::"), f"{r.type} {r.name}: {r.provider}"


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
        assert b.one(dep).urn in loader.dependencies, dep
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
    _, export = _kubectl_run(b.resolved["export"])
    (c,) = export["spec"]["containers"]
    assert c["command"] == ["python", "-m", "x"] and c["name"] == "export"
    assert export["spec"]["serviceAccountName"] == b.made["worker_id"].ksa_name


@pytest.mark.parametrize(
    ("stack", "overrides"),
    [
        ("dev", {}),
        ("prod", {}),
        ("dev", {"clusterMode": "standard", "gpuCapacity": "nodeSelector", **DATA}),
    ],
    ids=["dev", "prod", "standard-with-data"],
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


def test_service_account_ids_stay_valid_for_long_stack_names() -> None:
    """GCP account ids are 6-30 characters, ``[a-z][-a-z0-9]*[a-z0-9]``: a long stack name is cut, and the
    cut (here right after a '-') leaves no doubled dash before the component."""
    b = build(_identities, "team-ml-a-experiments", **DATA)
    ids = sorted(a.inputs["accountId"] for a in b.of_type("gcp:serviceaccount/account:Account"))
    assert ids == ["spot-trainer-team-ml-a-loader", "spot-trainer-team-ml-a-worker"]
    for account_id in ids:
        assert re.match(r"^[a-z][-a-z0-9]{4,28}[a-z0-9]$", account_id) and "--" not in account_id


# The modules that may see the whole stack config: where it is made, where it is cut into slices, and the
# offline renderer that reports it. Every component module takes only its slice (issue 19).
WHOLE_CONFIG_MODULES = {"config.py", "program.py", "render.py", "__main__.py"}


def test_components_receive_their_own_config_slice_not_the_stack_config() -> None:
    """A component that takes ``StackConfig`` (or reads ``pulumi.Config``) can silently start depending on
    any setting; each gets a typed slice from infra.program instead, as the pulumi examples' args do."""
    infra_dir = Path(config.__file__).parent
    components = sorted(p for p in infra_dir.glob("*.py") if p.name not in WHOLE_CONFIG_MODULES | {"__init__.py"})
    assert {"cluster.py", "filestore.py", "jobs.py", "network.py"} <= {p.name for p in components}
    for path in components:
        text = path.read_text()
        assert "StackConfig" not in text and "pulumi.Config(" not in text, f"{path.name} takes the whole config"
