"""The control plane's and the share's security settings as the stack renders them: each argument present
only when its setting is on, named as pulumi_gcp 10.2 (terraform-provider-google) declares it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from infra.render import Rendered

Render = Callable[..., Rendered]
CLUSTER = "gcp:container/cluster:Cluster"
FILESTORE = "gcp:filestore/instance:Instance"
KEY = "projects/acme-sec/locations/us-central1/keyRings/ring/cryptoKeys/{}"
ON: dict[str, Any] = {
    "authorizedNetworks": ["203.0.113.0/24"], "privateEndpoint": True, "binaryAuthorization": True,
    "secretsKmsKey": KEY.format("etcd"), "filestoreTier": "ZONAL", "filestoreCapacityGb": 1024,
    "filestoreKmsKey": KEY.format("share"), "filestoreRootSquash": True,
}  # fmt: skip


def test_the_control_plane_settings_reach_the_cluster(rendered: Render) -> None:
    off = rendered("dev").one(CLUSTER).inputs
    for absent in ("masterAuthorizedNetworksConfig", "binaryAuthorization", "databaseEncryption"):
        assert absent not in off, absent
    assert off["privateClusterConfig"]["enablePrivateEndpoint"] is False
    r = rendered("dev", **ON)
    on = r.one(CLUSTER).inputs
    assert on["masterAuthorizedNetworksConfig"] == {
        "cidrBlocks": [{"cidrBlock": "203.0.113.0/24", "displayName": "203.0.113.0/24"}]}
    assert on["privateClusterConfig"] == {"enablePrivateNodes": True, "enablePrivateEndpoint": True}
    assert on["binaryAuthorization"] == {"evaluationMode": "PROJECT_SINGLETON_POLICY_ENFORCE"}
    assert on["databaseEncryption"] == {"state": "ENCRYPTED", "keyName": KEY.format("etcd")}
    assert "binaryauthorization.googleapis.com" in {s.inputs["service"] for s in r.of_type(
        "gcp:projects/service:Service")}  # fmt: skip


def test_the_share_settings_reach_the_filestore_instance(rendered: Render) -> None:
    off = rendered("dev").one(FILESTORE).inputs
    assert "kmsKeyName" not in off and "nfsExportOptions" not in off["fileShares"]
    r = rendered("dev", **ON)
    on = r.one(FILESTORE).inputs
    assert on["kmsKeyName"] == KEY.format("share")
    assert on["fileShares"]["nfsExportOptions"] == [
        {"ipRanges": [r.config.network.subnet_cidr], "accessMode": "READ_WRITE", "squashMode": "ROOT_SQUASH"}]
    # Root on a client may no longer chown the share root: the preparation (root) is not declared, and the
    # loader waits on nothing it would have done.
    assert not r.of_type("spot-trainer:storage:SharePreparation")
    assert rendered("dev").one("spot-trainer:storage:SharePreparation")
