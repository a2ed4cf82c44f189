"""The namespace's NetworkPolicies: deny every pod's traffic by default, then allow what each pod needs.

- every pod: DNS (port 53, UDP and TCP, to wherever the cluster's resolver is: kube-dns pods, NodeLocal
  DNSCache's link-local address or Cloud DNS for GKE's metadata address);
- the queue's clients (loader, workers, scorer): Redis's port on Redis's pods (Redis's own ingress policy,
  infra/redis.py, admits them on its side);
- the pods with a Google identity (the loader with datasetUri, workers and scorer with outputUri): the GKE
  metadata server, which hands them their Workload Identity tokens, and HTTPS to Google APIs
  (``apiEgressCidr``; by default any address outside the private ranges, as storage.googleapis.com resolves to
  Google's public ranges unless the VPC maps it to the restricted VIP, 199.36.153.4/30);
- the launcher (with ``schedule``): HTTPS to the cluster's control plane, to post the Jobs it may create.

The share needs no rule: the kubelet mounts an NFS volume from the node, outside the pod's network, and
NetworkPolicy governs pod traffic only (kubernetes.io "Network Policies": what is and is not covered).
Redis needs no egress. Enforced by Dataplane V2 (Autopilot always; Standard sets ADVANCED_DATAPATH).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from infra import contract
from infra.kube import InCluster

# The private ranges no Google API address is in: left out of the default HTTPS rule, so a pod that may call
# Google cannot reach the VPC's other hosts (or the nodes) on 443 through it.
PRIVATE_RANGES = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16")
EVERYWHERE = "0.0.0.0/0"
# Where pods fetch Workload Identity tokens: GKE's docs ("Workload Identity Federation for GKE", restrictions
# with network policies) ask for 169.254.169.254/32 on port 80 with Dataplane V2, and 169.254.169.252/32 on
# port 988 (the gke-metadata-server), where an iptables dataplane has already DNATed the request by the time
# policy is evaluated. Public GKE egress policies allow the same pair (found with the search tool: "GKE
# metadata 169.254.169.254/32:80, Workload Identity metadata 169.254.169.252/32:987,988").
METADATA_SERVER = (("169.254.169.254/32", 80), ("169.254.169.252/32", 988))
HTTPS = 443
DNS = 53


@dataclass(frozen=True)
class PolicyArgs:
    """``api_clients``: the components with a Google identity; ``api_cidr``: where their HTTPS may go;
    ``launcher``: the component that posts Jobs (``None`` without ``schedule``), to ``control_plane`` (an IP)."""

    api_clients: tuple[str, ...]
    api_cidr: str
    launcher: str | None
    control_plane: pulumi.Input[str]


def _pods(*components: str) -> dict[str, Any]:
    """A selector for this app's pods of ``components``."""
    return {
        "matchLabels": {contract.NAME_LABEL: contract.APP},
        "matchExpressions": [{"key": contract.COMPONENT_LABEL, "operator": "In", "values": list(components)}],
    }


def _tcp(port: int) -> dict[str, Any]:
    return {"protocol": "TCP", "port": port}


def api_block(cidr: str) -> dict[str, Any]:
    """The HTTPS destination of Google API calls: ``cidr`` (the private ranges left out of 0.0.0.0/0)."""
    return {"cidr": cidr, "except": list(PRIVATE_RANGES)} if cidr == EVERYWHERE else {"cidr": cidr}


def egress_rules(args: PolicyArgs) -> dict[str, tuple[dict[str, Any], list[dict[str, Any]]]]:
    """Policy name -> (the pods it selects, their egress rules)."""
    rules: dict[str, tuple[dict[str, Any], list[dict[str, Any]]]] = {
        "dns": ({}, [{"ports": [{"protocol": "UDP", "port": DNS}, _tcp(DNS)]}]),
        "redis-clients": (_pods(*contract.REDIS_CLIENTS), [
            {"to": [{"podSelector": {"matchLabels": contract.labels(contract.REDIS)}}],
             "ports": [_tcp(contract.REDIS_PORT)]},
        ]),
    }  # fmt: skip
    if args.api_clients:
        rules["google-apis"] = (_pods(*args.api_clients), [
            *({"to": [{"ipBlock": {"cidr": cidr}}], "ports": [_tcp(port)]} for cidr, port in METADATA_SERVER),
            {"to": [{"ipBlock": api_block(args.api_cidr)}], "ports": [_tcp(HTTPS)]},
        ])  # fmt: skip
    if args.launcher:
        to = pulumi.Output.from_input(args.control_plane).apply(lambda ip: [{"ipBlock": {"cidr": f"{ip}/32"}}])
        rules["launcher"] = (_pods(args.launcher), [{"to": to, "ports": [_tcp(HTTPS)]}])
    return rules


class NamespacePolicies(pulumi.ComponentResource):
    """Default deny for every pod of the namespace, and one egress allowance per need."""

    def __init__(
        self, name: str, args: PolicyArgs, kube: InCluster, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("spot-trainer:k8s:NamespacePolicies", name, None, opts)
        k8s_opts = pulumi.ResourceOptions(parent=self, provider=kube.provider)
        meta = {"namespace": kube.namespace, "labels": {contract.NAME_LABEL: contract.APP}}
        deny = k8s.networking.v1.NetworkPolicy(
            f"{name}-default-deny",
            metadata={"name": "default-deny", **meta},
            # An empty selector picks every pod; both types and no rule: nothing in, nothing out.
            spec={"podSelector": {}, "policyTypes": ["Ingress", "Egress"]},
            opts=k8s_opts,
        )
        self.policies = [deny] + [
            k8s.networking.v1.NetworkPolicy(
                f"{name}-{policy}",
                metadata={"name": f"allow-{policy}", **meta},
                spec={"podSelector": selector, "policyTypes": ["Egress"], "egress": egress},
                opts=k8s_opts,
            )
            for policy, (selector, egress) in egress_rules(args).items()
        ]
        self.register_outputs({})
