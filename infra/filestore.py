"""Filestore on the cluster's VPC, and a statically bound PV/PVC for its share (ReadWriteMany)."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp
import pulumi_kubernetes as k8s

from infra import contract
from infra.config import STACK_KEY, FilestoreConfig, Site
from infra.kube import InCluster
from infra.network import Network

# filestoreKmsKey "stack": Filestore's service agent encrypts and decrypts the share's data keys with the stack's key.
SHARE_KEY_ROLE = "roles/cloudkms.cryptoKeyEncrypterDecrypter"
SHARE_KEY_ROTATION = "7776000s"  # 90 days, as the Secrets key (Cloud KMS rotates; old versions still decrypt)


def filestore_service_agent(project_number: str) -> str:
    """Filestore's service agent, the identity that calls Cloud KMS for a CMEK instance (Filestore "Encrypt data with
    customer-managed encryption keys", cloud.google.com/filestore/docs/cmek, and IAM's service-agent list: Cloud
    Filestore Service Agent, ``roles/file.serviceAgent``). It is Google's account: the stack grants it, never creates
    it. IAM's service-agent page says Google creates an agent "at some point after you activate and use the API"
    (the stack enables file.googleapis.com first); that it exists before a project's first instance was not checked
    here: if the grant fails with "does not exist", create the agent once (``gcloud beta services identity create
    --service=file.googleapis.com``) and rerun (docs/cloud.md, "A new prod share")."""
    return f"serviceAccount:service-{project_number}@cloud-filestore.iam.gserviceaccount.com"


@dataclass(frozen=True)
class FilestoreArgs:
    """The share's slice of the stack: where it goes, its tier, size and name, and whether it is protected."""

    site: Site
    filestore: FilestoreConfig
    protected: bool


def _export_options(fs: FilestoreConfig) -> list[gcp.filestore.InstanceFileSharesNfsExportOptionArgs] | None:
    """Who may mount the share, and as whom root comes. pulumi_gcp 10.2 filestore InstanceFileSharesNfsExportOptionArgs
    (ip_ranges, access_mode, squash_mode, anon_uid, anon_gid; Filestore API NfsExportOptions: squash_mode defaults to
    NO_ROOT_SQUASH, anon_uid/anon_gid to 65534 and only with ROOT_SQUASH; an update in place, infra/replacements.py).

    - filestoreRootSquash: only the clients' ranges (the nodes: the kubelet mounts the share from the node's address),
      read-write, root squashed to 65534. Left at 65534 on purpose: "nobody" may read what the modes let others read
      but write nothing of uid 10001's, where an anon_uid of 10001 would give root on a node the workloads' rights.
    - a customer-managed key without root squash (the one `up` that creates a prod share, below): the same ranges with
      root not squashed, so that the share preparation can hand the new share's root to uid 10001.
    - neither (dev): None, Filestore's default export (every client of the VPC, root not squashed), as before.

    Why squash cannot be on when a share is created: Filestore makes a new share's root root:root with mode 755
    ("only root users on connected clients have read/write access", cloud.google.com/filestore/docs/access-control),
    and only its owner or an unsquashed root may chown or chmod it; a squashed root is 65534 (or anon_uid), neither.
    No export option changes who owns the root, and two entries cannot give one client root for one step: the
    ranges may not be identical, and the narrower range wins (same page; BASIC tiers take no overlap at all)."""
    if not fs.root_squash and not fs.kms_key:
        return None
    return [
        gcp.filestore.InstanceFileSharesNfsExportOptionArgs(
            ip_ranges=list(fs.client_ranges), access_mode="READ_WRITE",
            squash_mode="ROOT_SQUASH" if fs.root_squash else "NO_ROOT_SQUASH",
        )
    ]


class FilestoreShare(pulumi.ComponentResource):
    """``claim_name`` is what pods mount; ``ip`` is the instance's address (an output, never typed in)."""

    ip: pulumi.Output[str]
    claim_name: str

    def __init__(
        self,
        name: str,
        args: FilestoreArgs,
        network: Network,
        kube: InCluster,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        """``kube``: where the share's volume and its claim go (the claim in the stack's namespace)."""
        super().__init__("spot-trainer:storage:FilestoreShare", name, None, opts)
        site, fs, protected = args.site, args.filestore, args.protected
        kms_key, key_grants = self._share_key(name, args)
        self.instance = gcp.filestore.Instance(
            name,
            project=site.project_id,
            location=site.zone if fs.zonal else site.region,
            tier=fs.tier,
            file_shares=gcp.filestore.InstanceFileSharesArgs(
                name=fs.share, capacity_gb=fs.capacity_gb, nfs_export_options=_export_options(fs)
            ),
            networks=[
                gcp.filestore.InstanceNetworkArgs(
                    network=network.network_name, modes=["MODE_IPV4"], connect_mode="DIRECT_PEERING"
                )
            ],
            # Checkpoints and datasets live here: protected as the cluster is, unless allowDataLoss. Filestore's
            # own protection exists on ZONAL, REGIONAL and ENTERPRISE only; on a BASIC tier the argument fails the
            # create (terraform-provider-google issue 20311), so it is left out there. Pulumi's `protect` guards
            # every tier on top of it: the provider's check only fires at delete time, after a replacing change
            # (zone, tier, share name, network) has already created the empty replacement and re-pointed the
            # claims at it; `protect` makes the engine refuse the replacement before anything is created (issue 36).
            deletion_protection_enabled=protected if fs.api_deletion_protection else None,
            # filestoreKmsKey: the data encrypted with the bank's own key (pulumi_gcp 10.2 filestore.Instance
            # kms_key_name; config.py allows it on the CMEK-capable tiers only). A change replaces the share
            # (resource_filestore_instance.go: kms_key_name ForceNew; infra/replacements.py).
            kms_key_name=kms_key,
            labels=site.labels.as_dict(),
            # After the subnet: the instance names only the VPC, and creating it beside the subnet raced the
            # peering Filestore sets up on a network that was still being built. After the agent's grant on the
            # stack's key: Filestore checks it may use the key when it creates the instance.
            opts=pulumi.ResourceOptions(parent=self, protect=protected, depends_on=[*network.ready, *key_grants]),
        )
        self.ip = self.instance.networks.apply(lambda nets: nets[0].ip_addresses[0])
        self.share = fs.share
        self.path = f"/{fs.share}"
        self.claim_name = "share"
        self._site, self._provider = site, kube.provider
        self.capacity_gb, self.claim_gb = fs.capacity_gb, fs.claim_gb
        self.volume, self.claim = self.bind(name, kube.namespace, self.claim_name, "share")
        self.register_outputs({"ip": self.ip, "share": self.share, "claim": self.claim_name})

    def _share_key(self, name: str, args: FilestoreArgs) -> tuple[pulumi.Input[str] | None, list[pulumi.Resource]]:
        """filestoreKmsKey ``stack``: a key ring and key of the share's own (in the stack's region, where a ZONAL or
        REGIONAL instance is: Filestore takes only a key in its own region), and Filestore's service agent granted
        encrypter/decrypter on that key alone, which the instance waits for. The key carries Pulumi's ``protect``
        like the share: destroying it (Cloud KMS only schedules the versions' destruction; a key itself is never
        deleted, nor a key ring) leaves the card data unreadable. pulumi_gcp 10.2: kms.KeyRing(name, location),
        kms.CryptoKey(key_ring, name, purpose, rotation_period), kms.CryptoKeyIAMMember(crypto_key_id, role,
        member); the project number from organizations.get_project. A named key is used as it is."""
        fs = args.filestore
        if fs.kms_key != STACK_KEY:
            return fs.kms_key or None, []
        site, child = args.site, pulumi.ResourceOptions(parent=self)
        ring = gcp.kms.KeyRing(f"{name}-key", project=site.project_id, location=site.region,
                               name=f"{site.labels.app}-{site.slug}-share", opts=child)
        key = gcp.kms.CryptoKey(
            f"{name}-key", key_ring=ring.id, name="card-data", purpose="ENCRYPT_DECRYPT",
            rotation_period=SHARE_KEY_ROTATION, labels=site.labels.as_dict(),
            opts=pulumi.ResourceOptions(parent=self, protect=args.protected),
        )
        project = gcp.organizations.get_project_output(
            project_id=site.project_id, opts=pulumi.InvokeOutputOptions(parent=self))
        grant = gcp.kms.CryptoKeyIAMMember(
            f"{name}-key-filestore-agent", crypto_key_id=key.id, role=SHARE_KEY_ROLE,
            member=project.number.apply(filestore_service_agent), opts=child,
        )
        return key.id, [grant]

    def bind(
        self, name: str, namespace: pulumi.Input[str], claim_name: str, volume_suffix: str
    ) -> tuple[k8s.core.v1.PersistentVolume, k8s.core.v1.PersistentVolumeClaim]:
        """A PV for the share and a claim bound to it in ``namespace`` (a PV binds one claim, so each
        namespace that mounts the share gets its own pair, with the same NFS mount options)."""
        site = self._site
        k8s_opts = pulumi.ResourceOptions(parent=self, provider=self._provider)
        # The PV shows the share's real size (a PV's capacity may change in place: only its volume source
        # replaces it, diff.go); the claim's request stays fixed (FilestoreConfig.claim_gb).
        volume = k8s.core.v1.PersistentVolume(
            name,
            metadata={
                "name": f"{site.labels.app}-{site.slug}-{volume_suffix}",
                "labels": {contract.NAME_LABEL: contract.APP},
            },
            spec={
                "capacity": {"storage": f"{self.capacity_gb}Gi"},
                "accessModes": ["ReadWriteMany"],
                # The data outlives the claim: deleting the PVC must not try to delete Filestore.
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": "",
                "mountOptions": ["hard", "nfsvers=3"],
                "nfs": {"server": self.ip, "path": self.path},
            },
            opts=k8s_opts,
        )
        claim = k8s.core.v1.PersistentVolumeClaim(
            name,
            metadata={"name": claim_name, "namespace": namespace},
            spec={
                "accessModes": ["ReadWriteMany"],
                # "" disables dynamic provisioning; volumeName binds to exactly our PV.
                "storageClassName": "",
                "volumeName": volume.metadata.name,
                "resources": {"requests": {"storage": f"{self.claim_gb}Gi"}},
            },
            opts=k8s_opts,
        )
        return volume, claim
