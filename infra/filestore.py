"""Filestore on the cluster's VPC, and a statically bound PV/PVC for its share (ReadWriteMany)."""

from __future__ import annotations

import pulumi
import pulumi_gcp as gcp
import pulumi_kubernetes as k8s

from infra import contract
from infra.config import StackConfig
from infra.network import Network


class FilestoreShare(pulumi.ComponentResource):
    """``claim_name`` is what pods mount; ``ip`` is the instance's address (an output, never typed in)."""

    ip: pulumi.Output[str]
    claim_name: str

    def __init__(
        self,
        name: str,
        cfg: StackConfig,
        network: Network,
        provider: k8s.Provider,
        namespace: pulumi.Input[str],
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("spot-trainer:storage:FilestoreShare", name, None, opts)
        fs = cfg.filestore
        self.instance = gcp.filestore.Instance(
            name,
            project=cfg.project_id,
            location=cfg.zone if fs.zonal else cfg.region,
            tier=fs.tier,
            file_shares=gcp.filestore.InstanceFileSharesArgs(name=fs.share, capacity_gb=fs.capacity_gb),
            networks=[
                gcp.filestore.InstanceNetworkArgs(
                    network=network.network_name, modes=["MODE_IPV4"], connect_mode="DIRECT_PEERING"
                )
            ],
            # Checkpoints and datasets live here: protect them as the cluster is (prod).
            deletion_protection_enabled=cfg.cluster.deletion_protection,
            labels=cfg.labels.as_dict(),
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.ip = self.instance.networks.apply(lambda nets: nets[0].ip_addresses[0])
        self.share = fs.share
        self.path = f"/{fs.share}"
        self.claim_name = "share"
        k8s_opts = pulumi.ResourceOptions(parent=self, provider=provider)
        size = f"{fs.capacity_gb}Gi"
        self.volume = k8s.core.v1.PersistentVolume(
            name,
            metadata={
                "name": f"{cfg.labels.app}-{cfg.slug}-share",
                "labels": {contract.NAME_LABEL: contract.APP},
            },
            spec={
                "capacity": {"storage": size},
                "accessModes": ["ReadWriteMany"],
                # The data outlives the claim: deleting the PVC must not try to delete Filestore.
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": "",
                "mountOptions": ["hard", "nfsvers=3"],
                "nfs": {"server": self.ip, "path": self.path},
            },
            opts=k8s_opts,
        )
        self.claim = k8s.core.v1.PersistentVolumeClaim(
            name,
            metadata={"name": self.claim_name, "namespace": namespace},
            spec={
                "accessModes": ["ReadWriteMany"],
                # "" disables dynamic provisioning; volumeName binds to exactly our PV.
                "storageClassName": "",
                "volumeName": self.volume.metadata.name,
                "resources": {"requests": {"storage": size}},
            },
            opts=k8s_opts,
        )
        self.register_outputs({"ip": self.ip, "share": self.share, "claim": self.claim_name})
