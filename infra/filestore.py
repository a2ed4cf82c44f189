"""Filestore on the cluster's VPC, and a statically bound PV/PVC for its share (ReadWriteMany)."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp
import pulumi_kubernetes as k8s

from infra import contract
from infra.config import FilestoreConfig, Site
from infra.kube import InCluster
from infra.network import Network


@dataclass(frozen=True)
class FilestoreArgs:
    """The share's slice of the stack: where it goes, its tier, size and name, and whether it is protected."""

    site: Site
    filestore: FilestoreConfig
    protected: bool


def _export_options(fs: FilestoreConfig) -> list[gcp.filestore.InstanceFileSharesNfsExportOptionArgs] | None:
    """filestoreRootSquash: only the nodes' ranges may mount, read-write, with root squashed to the anonymous user
    (pulumi_gcp 10.2 filestore InstanceFileSharesNfsExportOptionArgs: ip_ranges, access_mode READ_WRITE,
    squash_mode ROOT_SQUASH; anon_uid/anon_gid left at Filestore's 65534). None: Filestore's default export
    (every client of the VPC, root not squashed)."""
    if not fs.root_squash:
        return None
    return [
        gcp.filestore.InstanceFileSharesNfsExportOptionArgs(
            ip_ranges=list(fs.client_ranges), access_mode="READ_WRITE", squash_mode="ROOT_SQUASH"
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
            # kms_key_name; config.py allows it on the CMEK-capable tiers only).
            kms_key_name=fs.kms_key or None,
            labels=site.labels.as_dict(),
            # After the subnet: the instance names only the VPC, and creating it beside the subnet raced the
            # peering Filestore sets up on a network that was still being built.
            opts=pulumi.ResourceOptions(parent=self, protect=protected, depends_on=network.ready),
        )
        self.ip = self.instance.networks.apply(lambda nets: nets[0].ip_addresses[0])
        self.share = fs.share
        self.path = f"/{fs.share}"
        self.claim_name = "share"
        self._site, self._provider = site, kube.provider
        self.capacity_gb, self.claim_gb = fs.capacity_gb, fs.claim_gb
        self.volume, self.claim = self.bind(name, kube.namespace, self.claim_name, "share")
        self.register_outputs({"ip": self.ip, "share": self.share, "claim": self.claim_name})

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
