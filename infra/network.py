"""The VPC the cluster and Filestore share: created with secondary ranges and NAT, or an existing one."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp

from infra.config import NetworkConfig


@dataclass(frozen=True)
class NetworkArgs:
    """What the network needs to know: the project and region, the VPC settings, and whether nodes are
    private (then a created VPC gets Cloud NAT for their egress)."""

    project_id: str
    region: str
    network: NetworkConfig
    private_nodes: bool


class Network(pulumi.ComponentResource):
    """``network_id`` / ``subnetwork_id`` for the cluster; ``network_name`` for Filestore's peering."""

    network_id: pulumi.Output[str]
    network_name: pulumi.Output[str]
    subnetwork_id: pulumi.Output[str]
    # What must exist before anything is placed on the VPC (the created subnet); empty for an existing VPC.
    ready: list[pulumi.Resource]

    def __init__(self, name: str, args: NetworkArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("spot-trainer:gcp:Network", name, None, opts)
        net = args.network
        child = pulumi.ResourceOptions(parent=self)
        self.ready = []
        if not net.create:
            project, region = args.project_id, args.region
            self.network_name = pulumi.Output.from_input(net.existing_network)
            self.network_id = pulumi.Output.from_input(
                f"projects/{project}/global/networks/{net.existing_network}"
            )
            self.subnetwork_id = pulumi.Output.from_input(
                f"projects/{project}/regions/{region}/subnetworks/{net.existing_subnetwork}"
            )
        else:
            vpc = gcp.compute.Network(
                name,
                project=args.project_id,
                auto_create_subnetworks=False,
                routing_mode="REGIONAL",
                opts=child,
            )
            subnet = gcp.compute.Subnetwork(
                name,
                project=args.project_id,
                region=args.region,
                network=vpc.id,
                ip_cidr_range=net.subnet_cidr,
                # Private nodes pull from Artifact Registry through Private Google Access.
                private_ip_google_access=True,
                secondary_ip_ranges=[
                    gcp.compute.SubnetworkSecondaryIpRangeArgs(
                        range_name=net.pods_range_name, ip_cidr_range=net.pods_cidr
                    ),
                    gcp.compute.SubnetworkSecondaryIpRangeArgs(
                        range_name=net.services_range_name, ip_cidr_range=net.services_cidr
                    ),
                ],
                opts=child,
            )
            if args.private_nodes:
                # Private nodes have no public IP: NAT gives them egress (Docker Hub for Redis, PyPI...).
                router = gcp.compute.Router(
                    name, project=args.project_id, region=args.region, network=vpc.id, opts=child
                )
                gcp.compute.RouterNat(
                    name,
                    project=args.project_id,
                    region=args.region,
                    router=router.name,
                    nat_ip_allocate_option="AUTO_ONLY",
                    source_subnetwork_ip_ranges_to_nat="ALL_SUBNETWORKS_ALL_IP_RANGES",
                    log_config=gcp.compute.RouterNatLogConfigArgs(enable=True, filter="ERRORS_ONLY"),
                    opts=child,
                )
            self.network_name = vpc.name
            self.network_id = vpc.id
            self.subnetwork_id = subnet.id
            self.ready = [subnet]
        self.register_outputs({"network_id": self.network_id, "subnetwork_id": self.subnetwork_id})
