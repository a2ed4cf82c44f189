"""The control plane's and the share's security settings as the stack renders them: each argument present
only when its setting is on, named as pulumi_gcp 10.2 (terraform-provider-google) declares it; and the stateful
resources' protection."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from infra import render
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


@pytest.mark.parametrize(
    ("stack", "overrides", "api", "protect"),
    [
        ("prod", {}, True, True),  # ZONAL: Filestore's own protection, and Pulumi's protect as on every tier
        ("dev", {"filestoreTier": "BASIC_SSD", "filestoreCapacityGb": 2560}, None, True),  # no API protection
        ("prod", {"filestoreTier": "ZONAL", "filestoreCapacityGb": 2048}, True, True),
        ("prod", {"filestoreTier": "REGIONAL", "filestoreCapacityGb": 1024}, True, True),
        ("dev", {}, None, True),
        ("dev", {"filestoreTier": "ENTERPRISE", "filestoreCapacityGb": 1024}, True, True),
        ("dev", {"allowDataLoss": True}, None, False),
        ("dev", {"allowDataLoss": True, "filestoreTier": "ZONAL", "filestoreCapacityGb": 1024}, False, False),
    ],
    ids=str,
)
def test_filestore_deletion_protection_only_where_the_tier_has_it(
    stack: str, overrides: dict[str, Any], api: bool | None, protect: bool, rendered: Render
) -> None:
    """deletion_protection_enabled on a BASIC tier fails the create (terraform-provider-google#20311); Pulumi's
    protect on every tier (the provider's check fires only at delete, after a replacement was created), and on
    the cluster, unless allowDataLoss."""
    r = rendered(stack, **overrides)
    share = r.one(FILESTORE)
    assert share.inputs.get("deletionProtectionEnabled") is api
    assert share.protect is protect
    assert r.one("gcp:container/cluster:Cluster").protect is protect


def test_prod_encrypts_its_secrets_with_a_key_of_its_own_that_gke_may_use(rendered: Render) -> None:
    """secretsKmsKey "stack" (prod's file): a key ring and key in the stack's region, protected like the cluster,
    GKE's service agent granted encrypter/decrypter on it, and the cluster created only after that grant
    (GKE's "Encrypt secrets at the application layer": the agent needs the role before the cluster uses the key)."""
    r = rendered("prod")
    ring = r.one("gcp:kms/keyRing:KeyRing", "cluster-secrets")
    assert ring.inputs == {"project": render.FAKE_PROJECT_ID, "location": "us-central1", "name": "spot-trainer-prod"}
    key = r.one("gcp:kms/cryptoKey:CryptoKey", "cluster-secrets")
    assert (key.inputs["keyRing"], key.inputs["purpose"], key.inputs["rotationPeriod"]) == (
        ring.id, "ENCRYPT_DECRYPT", "7776000s")
    assert key.protect  # a destroyed key leaves the Secrets unreadable
    grant = r.one("gcp:kms/cryptoKeyIAMMember:CryptoKeyIAMMember", "cluster-secrets-gke-agent")
    assert grant.inputs == {
        "cryptoKeyId": key.id, "role": "roles/cloudkms.cryptoKeyEncrypterDecrypter",
        "member": f"serviceAccount:service-{render.FAKE_PROJECT_NUMBER}@container-engine-robot.iam.gserviceaccount.com"}
    cluster = r.one(CLUSTER)
    assert cluster.inputs["databaseEncryption"] == {"state": "ENCRYPTED", "keyName": key.id}
    assert grant.urn in cluster.dependencies
    assert "cloudkms.googleapis.com" in {s.inputs["service"] for s in r.of_type("gcp:projects/service:Service")}
    # A key named in config is used as it is: no key ring of the stack's.
    own = rendered("prod", secretsKmsKey=KEY.format("etcd"))
    assert not [k for k in own.of_type("gcp:kms/keyRing:KeyRing") if k.name == "cluster-secrets"]
    assert not [g for g in own.of_type("gcp:kms/cryptoKeyIAMMember:CryptoKeyIAMMember") if "secrets" in g.name]
    assert "share-key" in [x.name for x in own.of_type("gcp:kms/keyRing:KeyRing")]  # the share's, below
    assert own.one(CLUSTER).inputs["databaseEncryption"]["keyName"] == KEY.format("etcd")


def test_prod_keeps_its_card_data_under_a_key_of_its_own_that_filestore_may_use(rendered: Render) -> None:
    """filestoreKmsKey "stack" (prod's file): a key ring and key of the share's own in the stack's region (a ZONAL
    instance takes only a key of its region), protected like the share, Filestore's service agent granted
    encrypter/decrypter on that key alone, and the instance created only after the grant; the share exported to
    the nodes' range with root squashed (Filestore API NfsExportOptions; anon ids left at 65534)."""
    r = rendered("prod")
    ring = r.one("gcp:kms/keyRing:KeyRing", "share-key")
    assert ring.inputs == {"project": render.FAKE_PROJECT_ID, "location": "us-central1",
                           "name": "spot-trainer-prod-share"}
    key = r.one("gcp:kms/cryptoKey:CryptoKey", "share-key")
    assert (key.inputs["keyRing"], key.inputs["purpose"], key.inputs["rotationPeriod"]) == (
        ring.id, "ENCRYPT_DECRYPT", "7776000s")
    assert key.protect  # a destroyed key leaves the card data unreadable
    grant = r.one("gcp:kms/cryptoKeyIAMMember:CryptoKeyIAMMember", "share-key-filestore-agent")
    assert grant.inputs == {
        "cryptoKeyId": key.id, "role": "roles/cloudkms.cryptoKeyEncrypterDecrypter",
        "member": f"serviceAccount:service-{render.FAKE_PROJECT_NUMBER}@cloud-filestore.iam.gserviceaccount.com"}
    share = r.one(FILESTORE)
    assert (share.inputs["tier"], share.inputs["kmsKeyName"]) == ("ZONAL", key.id)
    assert grant.urn in share.dependencies and share.protect
    assert share.inputs["fileShares"]["nfsExportOptions"] == [
        {"ipRanges": [r.config.network.subnet_cidr], "accessMode": "READ_WRITE", "squashMode": "ROOT_SQUASH"}]
    assert "cloudkms.googleapis.com" in {s.inputs["service"] for s in r.of_type("gcp:projects/service:Service")}
    # Only the share's key (the Secrets' named): the KMS API is still enabled for it.
    alone = rendered("dev", filestoreTier="ZONAL", filestoreCapacityGb=1024, filestoreKmsKey="stack")
    assert alone.one(FILESTORE).inputs["kmsKeyName"] == alone.one("gcp:kms/cryptoKey:CryptoKey").id
    assert "cloudkms.googleapis.com" in {s.inputs["service"] for s in alone.of_type("gcp:projects/service:Service")}


def test_a_new_share_under_a_key_is_handed_over_by_unsquashed_root_limited_to_the_nodes(rendered: Render) -> None:
    """The `up` that creates a prod share runs with filestoreRootSquash false: the share preparation (root, CHOWN)
    is declared, the export is still the nodes' range alone, root not squashed; with root squash the preparation is
    gone (a squashed root could not chown a root:root 755 share root)."""
    bootstrap = rendered("prod", filestoreRootSquash=False)
    assert bootstrap.one(FILESTORE).inputs["fileShares"]["nfsExportOptions"] == [{
        "ipRanges": [bootstrap.config.network.subnet_cidr], "accessMode": "READ_WRITE", "squashMode": "NO_ROOT_SQUASH"}]
    assert bootstrap.one("spot-trainer:storage:SharePreparation")
    assert not rendered("prod").of_type("spot-trainer:storage:SharePreparation")


def test_a_prod_share_without_a_customer_managed_key_is_refused_at_preview() -> None:
    with pytest.raises(Exception, match="filestoreKmsKey") as err:
        render.render("prod", {"filestoreKmsKey": "", "filestoreTier": "BASIC_SSD", "filestoreCapacityGb": 2560})
    assert "config spot-trainer:filestoreKmsKey='' is not allowed: in a prod stack, 'stack'" in str(err.value)
    with pytest.raises(Exception, match="a BASIC_SSD share takes no customer-managed key"):
        render.render("prod", {"filestoreTier": "BASIC_SSD", "filestoreCapacityGb": 2560})


def test_a_prod_control_plane_open_to_any_address_is_refused_at_preview() -> None:
    with pytest.raises(Exception, match="authorizedNetworks") as err:
        render.render("prod", {"authorizedNetworks": []})
    assert ("config spot-trainer:authorizedNetworks=[] is not allowed: in a prod stack, the IPv4 ranges that may "
            "reach the control plane") in str(err.value)
    render.render("prod", {"authorizedNetworks": [], "privateEndpoint": True})  # no public endpoint: allowed
    with pytest.raises(Exception, match="narrower than 0.0.0.0/0"):
        render.render("dev", {"authorizedNetworks": ["0.0.0.0/0"]})
