"""The share is handed to the workloads' uid before the loader runs (issue 11, point 1).

A new Filestore share is root-owned, mode 755, and fsGroup does nothing for NFS: the loader's first
mkdir would fail with EACCES. The program runs a root step in a namespace of its own; the workloads'
namespace stays ``restricted``. The last test runs that step's own command on a real root-owned folder.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from infra import contract, render, share_prep
from infra.render import Registered, Rendered
from tests.infra.pod_security import pod_security_violations

STACKS = render.stack_names()
# Where the step is declared: a share without root squash. Prod squashes root, so its step runs only in the `up`
# that creates its share, with filestoreRootSquash false (docs/cloud.md, "A new prod share").
PREPARED = {"prod": {"filestoreRootSquash": False}}
JOB = "kubernetes:batch/v1:Job"
PV = "kubernetes:core/v1:PersistentVolume"
PVC = "kubernetes:core/v1:PersistentVolumeClaim"
NAMESPACE = "kubernetes:core/v1:Namespace"
Render = Callable[..., Rendered]


def _prep(r: Rendered) -> Registered:
    return r.one(JOB, "share-prep")


@pytest.mark.parametrize("stack", STACKS)
def test_the_share_is_prepared_before_the_loader(stack: str, rendered: Render) -> None:
    r = rendered(stack, **PREPARED.get(stack, {}))
    prep, loader = _prep(r), r.one(JOB, "loader")
    assert prep.urn in loader.dependencies  # the loader starts only after the step completed
    assert "annotations" not in prep.inputs["metadata"]  # awaited: completion is what the loader waits for
    assert prep.custom_timeouts["create"] and prep.delete_before_replace
    (c,) = prep.inputs["spec"]["template"]["spec"]["containers"]
    assert c["image"] == r.outputs["imageRef"]  # by digest, pulled with the nodes' registry grant
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["OWNER"] == f"{contract.WORKLOAD_UID}:{contract.WORKLOAD_UID}"
    (mount,) = c["volumeMounts"]
    assert env["SHARE"] == mount["mountPath"]


@pytest.mark.parametrize("stack", STACKS)
def test_the_step_can_write_a_root_owned_share_and_only_it_may(stack: str, rendered: Render) -> None:
    r = rendered(stack, **PREPARED.get(stack, {}))
    pod = _prep(r).inputs["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert pod["securityContext"]["runAsUser"] == 0  # only root may chown a root-owned folder
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    # Kubernetes' own admission: restricted refuses this pod, baseline admits it.
    assert "container 'share-prep' runs as uid 0" in pod_security_violations(pod, "restricted")
    assert pod_security_violations(pod, "baseline") == []

    namespaces = {n.inputs["metadata"]["name"]: n.inputs["metadata"]["labels"] for n in r.of_type(NAMESPACE)}
    prep_ns = _prep(r).inputs["metadata"]["namespace"]
    assert prep_ns == share_prep.prep_namespace(r.config.namespace) != r.config.namespace
    assert namespaces[prep_ns]["pod-security.kubernetes.io/enforce"] == "baseline"
    # The workloads' namespace still enforces restricted, and every pod in it passes restricted.
    assert namespaces[r.config.namespace]["pod-security.kubernetes.io/enforce"] == "restricted"
    for job in r.of_type(JOB) + r.of_type("kubernetes:apps/v1:Deployment"):
        if job.inputs["metadata"]["namespace"] == r.config.namespace:
            assert pod_security_violations(job.inputs["spec"]["template"]["spec"], "restricted") == []


@pytest.mark.parametrize("stack", STACKS)
def test_the_step_mounts_the_same_share_as_the_workloads(stack: str, rendered: Render) -> None:
    r = rendered(stack, **PREPARED.get(stack, {}))
    claims = {(c.inputs["metadata"]["namespace"], c.inputs["metadata"]["name"]): c.inputs for c in r.of_type(PVC)}
    volumes = {v.inputs["metadata"]["name"]: v.inputs for v in r.of_type(PV)}

    def nfs_of(job: Registered) -> dict[str, str]:
        pod = job.inputs["spec"]["template"]["spec"]
        (volume,) = [v for v in pod["volumes"] if "persistentVolumeClaim" in v]  # the loader also has its runs
        claim = claims[(job.inputs["metadata"]["namespace"], volume["persistentVolumeClaim"]["claimName"])]
        pv = volumes[claim["spec"]["volumeName"]]
        assert claim["spec"]["storageClassName"] == "" and pv["spec"]["mountOptions"] == ["hard", "nfsvers=3"]
        return pv["spec"]["nfs"]

    assert nfs_of(_prep(r)) == nfs_of(r.one(JOB, "loader")) == nfs_of(r.one(JOB, "training"))
    assert nfs_of(_prep(r)) == {"server": render.FILESTORE_IP, "path": f"/{r.config.filestore.share}"}


def test_the_root_exemption_in_the_policy_is_this_step_only(rendered: Render) -> None:
    """The pack admits root for the share-prep component with CHOWN alone, and for nothing else."""
    from policy import rules

    prep = _prep(rendered("dev"))
    assert rules.containers_run_as_non_root(JOB, prep.inputs, rules.StackFacts("dev")) == []
    worker = {**prep.inputs, "spec": {**prep.inputs["spec"], "template": {
        **prep.inputs["spec"]["template"], "metadata": {"labels": contract.labels(contract.WORKER)}}}}  # fmt: skip
    assert any("uid 0" in m for m in rules.containers_run_as_non_root(JOB, worker, rules.StackFacts("dev")))
    more = _with_capabilities(prep.inputs, ["CHOWN", "SYS_ADMIN"])
    assert any("uid 0" in m for m in rules.containers_run_as_non_root(JOB, more, rules.StackFacts("dev")))


def _with_capabilities(job: dict, add: list[str]) -> dict:
    import copy

    job = copy.deepcopy(job)
    job["spec"]["template"]["spec"]["containers"][0]["securityContext"]["capabilities"]["add"] = add
    return job


# --- the step's own command on a real root-owned folder ----------------------------------------------


@pytest.fixture
def root_owned_share() -> Iterator[Path]:
    """A folder like a new Filestore share: root:root, mode 755, in a parent uid 10001 can traverse."""
    if os.geteuid() != 0:
        pytest.skip("needs root to create a root-owned folder and to chown it, as on a new share")
    parent = Path(tempfile.mkdtemp(prefix="share-prep-"))
    try:
        parent.chmod(0o755)
        share = parent / "share"
        share.mkdir(mode=0o755)
        os.chown(share, 0, 0)
        yield share
    finally:
        shutil.rmtree(parent)


def _as_workload_uid(*argv: str) -> subprocess.CompletedProcess[str]:
    uid = str(contract.WORKLOAD_UID)
    return subprocess.run(
        ["setpriv", "--reuid", uid, "--regid", uid, "--clear-groups", *argv], capture_output=True, text=True
    )


def test_the_steps_command_lets_the_workloads_write_a_root_owned_share(
    root_owned_share: Path, rendered: Render
) -> None:
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is needed to act as uid 10001")
    (c,) = _prep(rendered("dev")).inputs["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in c["env"]}
    before = _as_workload_uid("mkdir", str(root_owned_share / "datasets"))
    assert before.returncode != 0 and "Permission denied" in before.stderr  # what the loader hit

    for _ in range(2):  # idempotent: a re-run (new image digest) changes nothing
        done = subprocess.run(
            c["command"], env={**os.environ, **env, "SHARE": str(root_owned_share)}, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        assert f"share root is now {contract.WORKLOAD_UID}:{contract.WORKLOAD_UID} mode 755" in done.stdout
    after = _as_workload_uid("mkdir", "-p", str(root_owned_share / "datasets" / "fraud"))
    assert after.returncode == 0, after.stderr
    assert (root_owned_share / "datasets" / "fraud").stat().st_uid == contract.WORKLOAD_UID


@pytest.mark.parametrize("stack", STACKS)
def test_growing_the_share_leaves_both_claims_as_they_are(stack: str, rendered: Render) -> None:
    """A claim bound to a static PV cannot be resized (the API server refuses: "only dynamically
    provisioned pvc can be resized"), and pulumi-kubernetes replaces a claim whose request changes: a
    bigger ``filestoreCapacityGb`` must reach the instance and the PVs, never the claims (both of them)."""
    before = rendered(stack, **PREPARED.get(stack, {}))
    size = before.config.filestore.capacity_gb
    after = rendered(stack, **PREPARED.get(stack, {}), filestoreCapacityGb=size + 1024)
    claims = {c.urn: c.inputs["spec"] for c in before.of_type(PVC) if "volumeName" in c.inputs["spec"]}
    assert len(claims) == 2  # the workloads' claim and the share preparation's (Redis has its own disk)
    assert {c.urn: c.inputs["spec"] for c in after.of_type(PVC) if c.urn in claims} == claims
    grown = {v.inputs["spec"]["capacity"]["storage"] for v in after.of_type(PV)}
    assert grown == {f"{size + 1024}Gi"}  # the PVs say the new size (changed in place)
    instance = after.one("gcp:filestore/instance:Instance")
    assert instance.inputs["fileShares"]["capacityGb"] == size + 1024
