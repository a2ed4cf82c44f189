"""The platform's components built on their own: the VPC, the Filestore share and its claim, the spot GPU
capacity, the Workload Identities, the share's preparation; and the URNs deployed stacks are keyed on."""

from __future__ import annotations

import gc
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pulumi_kubernetes as k8s
import pytest

from infra import config, contract, program, render, share_prep
from infra.filestore import FilestoreShare
from infra.gpu import GpuArgs, GpuCapacity
from infra.identity import READ_OBJECTS, WORKLOAD_IDENTITY_USER, WRITE_OBJECTS, BucketGrant
from infra.network import Network
from policy import rules
from tests.infra.components import (
    DATA,
    IMAGE,
    JOB,
    KUBERNETES_VERSION,
    _strictly_valid,
    _urns,
    build,
    container,
    env,
    in_cluster,
    names_are_dns_labels,
    on_gcp,
    platform,
    pod,
    workloads,
)
from tests.infra.job_controller import FailedPod, JobController
from tests.infra.pod_security import pod_security_violations

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
    share = FilestoreShare("share", program.filestore_args(cfg), network, in_cluster(cfg, provider), opts=on_gcp())
    return {"share": share, "ip": share.ip}


@pytest.mark.parametrize(("stack", "tier"), [("dev", "BASIC_HDD"), ("prod", "REGIONAL"), ("dev", "BASIC_SSD")])
def test_the_share_is_one_filestore_bound_to_exactly_one_claim(stack: str, tier: str) -> None:
    capacity = 2560 if tier == "BASIC_SSD" else 1024
    b = build(_share, stack, filestoreTier=tier, filestoreCapacityGb=capacity)
    _strictly_valid(b)
    fs = b.cfg.filestore
    instance = b.one("gcp:filestore/instance:Instance")
    assert instance.inputs["tier"] == tier and instance.inputs["project"] == b.cfg.project_id
    assert instance.inputs["location"] == (b.cfg.zone if fs.zonal else b.cfg.region)
    exports = instance.inputs["fileShares"].pop("nfsExportOptions", None)  # prod's: test_infra_hardening.py
    assert instance.inputs["fileShares"] == {"name": fs.share, "capacityGb": capacity}
    assert (exports is not None) is (stack == "prod")
    assert b.made["share"].share == fs.share, "the share's name, as the stack exports it (filestoreShare)"
    (net,) = instance.inputs["networks"]
    assert net == {"network": "network", "modes": ["MODE_IPV4"], "connectMode": "DIRECT_PEERING"}
    assert instance.inputs["labels"] == b.cfg.labels.as_dict()
    protected = b.cfg.cluster.deletion_protection
    if fs.api_deletion_protection:
        assert instance.inputs["deletionProtectionEnabled"] is protected
    else:
        assert "deletionProtectionEnabled" not in instance.inputs
    assert instance.protect is protected, "Pulumi's protect on every tier: it refuses a replacement up front"
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
    gpu = GpuCapacity("gpu", GpuArgs(cfg.gpu, cfg.cluster.autopilot), provider)
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
    """The identities as infra.program makes them (with datasetUri and outputUri set: both)."""
    ids = platform(cfg, provider).identities
    reader, writer = ids.loader, ids.worker
    assert reader is not None and writer is not None, "the tests set both buckets"
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
    assert read["bucket"] == "acme-fraud" and read["role"] == READ_OBJECTS
    # The loader reads and lists under datasetUri's prefix (gs://acme-fraud/exports) and nothing else there.
    assert read["condition"]["expression"] == (
        'resource.name.startsWith("projects/_/buckets/acme-fraud/objects/exports/") || '
        'api.getAttribute("storage.googleapis.com/objectListPrefix", "").startsWith("exports/")')
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


def test_a_dataset_uri_without_a_prefix_reads_the_whole_bucket_as_declared() -> None:
    b = build(_identities, "prod", datasetUri="gs://acme-fraud", outputUri=DATA["outputUri"])
    grants = {g.name: g.inputs for g in b.of_type("gcp:storage/bucketIAMMember:BucketIAMMember")}
    assert "condition" not in grants["loader-identity-objectviewer"]
    assert "condition" in grants["worker-identity-objectuser"]


@pytest.mark.parametrize(("bucket", "key"), [("acme-fraud", "datasetUri"), ("acme-results", "outputUri")])
def test_a_bucket_without_uniform_access_fails_the_preview_naming_it(
    bucket: str, key: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A prefix-limited grant is an IAM Condition, which a bucket takes only with uniform bucket-level access:
    the program reads each such bucket (gcp.storage.get_bucket, the mock engine's here) and fails at preview."""
    monkeypatch.setattr(render, "NON_UNIFORM_BUCKETS", {bucket})
    with pytest.raises(Exception, match="uniform bucket-level access off") as err:
        render.render("dev", DATA)
    # Raised once, and not repeated by asyncio for every Output that carried it when they are collected (that
    # log, from inside a later test's ast.parse, failed it with a SystemError: render._quiet_about_unretrieved).
    err.value.__traceback__ = None
    gc.collect()
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]
    assert (f"bucket gs://{bucket} (config {key}) has uniform bucket-level access off; the stack's prefix-limited "
            f"grant on it is an IAM Condition, which needs it on: `gcloud storage buckets update gs://{bucket} "
            "--uniform-bucket-level-access`") in str(err.value)
    # A whole-bucket dataset read carries no condition: nothing to check there.
    if key == "datasetUri":
        render.render("dev", {**DATA, "datasetUri": f"gs://{bucket}"})


# --- the share preparation ---------------------------------------------------------------------------------


def _prep(cfg: config.StackConfig, provider: k8s.Provider) -> dict[str, Any]:
    shared = platform(cfg, provider)
    return {"prep": share_prep.SharePreparation("share-prep", shared), "share": shared.share}


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
    "scoring": "spot-trainer:k8s:ScoringJob",
    "network-policy": "spot-trainer:k8s:NamespacePolicies",
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
