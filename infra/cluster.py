"""The GKE cluster (Autopilot by default, Standard by config) and a Kubernetes provider for it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_gcp as gcp
import pulumi_kubernetes as k8s

from infra.config import STACK_KEY, ClusterConfig, GpuConfig, NetworkConfig, Site
from infra.gke import SPOT_LABEL
from infra.network import Network

CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
# Logging, monitoring and metadata for nodes, nothing else (GKE's least-privilege node role).
NODE_ROLES = ("roles/container.defaultNodeServiceAccount",)
# secretsKmsKey "stack": GKE's service agent encrypts and decrypts the Secrets' data keys with the stack's key.
SECRETS_KEY_ROLE = "roles/cloudkms.cryptoKeyEncrypterDecrypter"
SECRETS_KEY_ROTATION = "7776000s"  # 90 days (Cloud KMS rotates; old versions still decrypt)

_DriverArgs = gcp.container.NodePoolNodeConfigGuestAcceleratorGpuDriverInstallationConfigArgs
_AutoProvisioningArgs = gcp.container.ClusterClusterAutoscalingAutoProvisioningDefaultsArgs


@dataclass(frozen=True)
class ClusterArgs:
    """The cluster's slice of the stack: where it goes, its mode, the VPC's secondary ranges it uses, and
    (Standard mode) the GPU pool's shape."""

    site: Site
    cluster: ClusterConfig
    network: NetworkConfig
    gpu: GpuConfig


def gke_service_agent(project_number: str) -> str:
    """GKE's service agent, the identity that calls Cloud KMS for application-layer secrets encryption
    (cloud.google.com/kubernetes-engine/docs/how-to/encrypting-secrets: grant it Cloud KMS CryptoKey
    Encrypter/Decrypter on the key before the cluster is created or updated)."""
    return f"serviceAccount:service-{project_number}@container-engine-robot.iam.gserviceaccount.com"


def _hardening(cluster: ClusterConfig, secrets_key: pulumi.Input[str] | None = None) -> dict[str, Any]:
    """The control plane's optional controls, each only when its setting is on (arguments as pulumi_gcp 10.2's
    container.Cluster declares them, generated from terraform-provider-google's google_container_cluster:
    master_authorized_networks_config.cidr_blocks[].cidr_block, binary_authorization.evaluation_mode
    (DISABLED or PROJECT_SINGLETON_POLICY_ENFORCE), database_encryption.state (ENCRYPTED) and key_name)."""
    extra: dict[str, Any] = {}
    if cluster.authorized_networks:
        extra["master_authorized_networks_config"] = gcp.container.ClusterMasterAuthorizedNetworksConfigArgs(
            cidr_blocks=[
                gcp.container.ClusterMasterAuthorizedNetworksConfigCidrBlockArgs(cidr_block=c, display_name=c)
                for c in cluster.authorized_networks
            ]
        )
    if cluster.binary_authorization:
        extra["binary_authorization"] = gcp.container.ClusterBinaryAuthorizationArgs(
            evaluation_mode="PROJECT_SINGLETON_POLICY_ENFORCE"
        )
    if cluster.secrets_kms_key:
        extra["database_encryption"] = gcp.container.ClusterDatabaseEncryptionArgs(
            state="ENCRYPTED", key_name=secrets_key or cluster.secrets_kms_key
        )
    return extra


def _common(args: ClusterArgs, network: Network, secrets_key: pulumi.Input[str] | None = None) -> dict[str, Any]:
    """The cluster's arguments in either mode: place, network ranges, channel, privacy, identity, protection."""
    site = args.site
    return dict(**_hardening(args.cluster, secrets_key),
        project=site.project_id,
        location=site.region,
        network=network.network_id,
        subnetwork=network.subnetwork_id,
        ip_allocation_policy=gcp.container.ClusterIpAllocationPolicyArgs(
            cluster_secondary_range_name=args.network.pods_range_name,
            services_secondary_range_name=args.network.services_range_name,
        ),
        release_channel=gcp.container.ClusterReleaseChannelArgs(channel=args.cluster.release_channel),
        private_cluster_config=gcp.container.ClusterPrivateClusterConfigArgs(
            enable_private_nodes=args.cluster.private_nodes,
            # privateEndpoint: no public endpoint at all. Off by default, so `pulumi up` and kubectl work from a
            # laptop; authorizedNetworks narrows who reaches the public one.
            enable_private_endpoint=args.cluster.private_endpoint,
        ),
        workload_identity_config=gcp.container.ClusterWorkloadIdentityConfigArgs(
            workload_pool=f"{site.project_id}.svc.id.goog"
        ),
        deletion_protection=args.cluster.deletion_protection,
        resource_labels=site.labels.as_dict(),
    )


class Cluster(pulumi.ComponentResource):
    """A cluster whose pods reach the Filestore VPC, plus ``provider`` for every Kubernetes object."""

    name: pulumi.Output[str]
    kubeconfig: pulumi.Output[str]
    node_service_account: gcp.serviceaccount.Account
    provider: k8s.Provider

    def __init__(
        self, name: str, args: ClusterArgs, network: Network, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("spot-trainer:gcp:Cluster", name, None, opts)
        self._pools: list[gcp.container.NodePool] = []
        node_roles = self._node_account(name, args.site)
        cluster = self._cluster(name, args, network, node_roles)
        if not args.cluster.autopilot:
            self._standard_pools(name, args, cluster)
        self.name = cluster.name
        # The control plane's address (public, or private with privateEndpoint): the launcher's egress goes there.
        self.endpoint: pulumi.Output[str] = cluster.endpoint
        # The pool exists once the cluster does: Workload Identity bindings take it from here (identity.py).
        self.workload_pool: pulumi.Output[str] = cluster.workload_identity_config.apply(
            lambda wi: wi.workload_pool if wi else ""
        )
        self.kubeconfig = pulumi.Output.secret(
            pulumi.Output.all(
                cluster.name, cluster.endpoint, cluster.master_auth.cluster_ca_certificate
            ).apply(lambda args: kubeconfig(*args))
        )
        self.provider = k8s.Provider(
            name,
            kubeconfig=self.kubeconfig,
            opts=pulumi.ResourceOptions(parent=self, depends_on=self._pools),
        )
        self.register_outputs({"name": self.name, "kubeconfig": self.kubeconfig})

    def _node_account(self, name: str, site: Site) -> list[gcp.projects.IAMMember]:
        """Nodes run as this account, not the project's default compute account (Editor by default)."""
        child = pulumi.ResourceOptions(parent=self)
        self.node_service_account = gcp.serviceaccount.Account(
            f"{name}-nodes",
            project=site.project_id,
            account_id=f"{site.labels.app}-{site.slug}"[:24].rstrip("-") + "-nodes",  # 6-30 characters
            display_name=f"GKE nodes of {site.labels.app} ({site.stack})",
            opts=child,
        )
        return [
            gcp.projects.IAMMember(
                f"{name}-nodes-{role.split('/')[-1]}",
                project=site.project_id,
                role=role,
                member=self.node_service_account.member,
                opts=child,
            )
            for role in NODE_ROLES
        ]

    def _cluster(
        self, name: str, args: ClusterArgs, network: Network, node_roles: list[gcp.projects.IAMMember]
    ) -> gcp.container.Cluster:
        """The cluster itself: Autopilot, or Standard with its default pool removed (our pools replace it).

        Protected twice unless allowDataLoss: the provider's ``deletion_protection`` refuses a delete, but only
        when it comes, after a replacing change (region, mode, network, ranges) has created the second cluster
        and re-pointed every Kubernetes object at it; Pulumi's ``protect`` refuses the replacement up front."""
        secrets_key, key_grants = self._secrets_key(name, args)
        opts = pulumi.ResourceOptions(parent=self, depends_on=[*node_roles, *key_grants],
                                      protect=args.cluster.deletion_protection)
        common = _common(args, network, secrets_key)
        if args.cluster.autopilot:
            return gcp.container.Cluster(
                name,
                enable_autopilot=True,
                cluster_autoscaling=gcp.container.ClusterClusterAutoscalingArgs(
                    auto_provisioning_defaults=_AutoProvisioningArgs(
                        service_account=self.node_service_account.email,
                        oauth_scopes=[CLOUD_PLATFORM_SCOPE],
                    ),
                ),
                opts=opts,
                **common,
            )
        return gcp.container.Cluster(
            name,
            # Node pools are separate resources: the default pool is replaced by ours.
            remove_default_node_pool=True,
            initial_node_count=1,
            # The default pool exists for a moment before it is removed: without this it would run as
            # the Compute Engine default account, which org policies often disable or strip.
            node_config=gcp.container.ClusterNodeConfigArgs(
                service_account=self.node_service_account.email, oauth_scopes=[CLOUD_PLATFORM_SCOPE]
            ),
            # Dataplane V2 enforces NetworkPolicy (the Redis policy relies on it).
            datapath_provider="ADVANCED_DATAPATH",
            opts=opts,
            **common,
        )

    def _secrets_key(self, name: str, args: ClusterArgs) -> tuple[pulumi.Input[str] | None, list[pulumi.Resource]]:
        """secretsKmsKey ``stack``: a key ring and key of the stack's own (in its region, rotated every 90 days,
        protected like the cluster: a destroyed key makes the Secrets unreadable) and GKE's service agent's grant
        on it, which the cluster waits for. pulumi_gcp 10.2: kms.KeyRing(name, location), kms.CryptoKey(key_ring,
        name, purpose, rotation_period), kms.CryptoKeyIAMMember(crypto_key_id, role, member); the project number
        from organizations.get_project. Cloud KMS never deletes a key ring: after `pulumi destroy`, a new stack
        of the same name in the project must `pulumi import` it (docs/security.md)."""
        if args.cluster.secrets_kms_key != STACK_KEY:
            return None, []
        site, child = args.site, pulumi.ResourceOptions(parent=self)
        ring = gcp.kms.KeyRing(f"{name}-secrets", project=site.project_id, location=site.region,
                               name=f"{site.labels.app}-{site.slug}", opts=child)
        key = gcp.kms.CryptoKey(
            f"{name}-secrets", key_ring=ring.id, name="kubernetes-secrets", purpose="ENCRYPT_DECRYPT",
            rotation_period=SECRETS_KEY_ROTATION, labels=site.labels.as_dict(),
            opts=pulumi.ResourceOptions(parent=self, protect=args.cluster.deletion_protection),
        )
        project = gcp.organizations.get_project_output(
            project_id=site.project_id, opts=pulumi.InvokeOutputOptions(parent=self))
        grant = gcp.kms.CryptoKeyIAMMember(
            f"{name}-secrets-gke-agent", crypto_key_id=key.id, role=SECRETS_KEY_ROLE,
            member=project.number.apply(gke_service_agent), opts=child,
        )
        return key.id, [grant]

    def _standard_pools(self, name: str, args: ClusterArgs, cluster: gcp.container.Cluster) -> None:
        """A small on-demand pool for Redis and the loader, and the spot GPU pool for training."""
        site, gpu = args.site, args.gpu
        labels = site.labels.as_dict()
        node_config = dict(
            service_account=self.node_service_account.email,
            oauth_scopes=[CLOUD_PLATFORM_SCOPE],
            workload_metadata_config=gcp.container.NodePoolNodeConfigWorkloadMetadataConfigArgs(
                mode="GKE_METADATA"
            ),
            resource_labels=labels,
        )
        pool_opts = pulumi.ResourceOptions(parent=self)
        system = gcp.container.NodePool(
            f"{name}-system",
            project=site.project_id,
            cluster=cluster.id,
            location=site.region,
            node_locations=[site.zone],
            initial_node_count=1,
            autoscaling=gcp.container.NodePoolAutoscalingArgs(min_node_count=1, max_node_count=3),
            management=gcp.container.NodePoolManagementArgs(auto_repair=True, auto_upgrade=True),
            node_config=gcp.container.NodePoolNodeConfigArgs(machine_type="e2-standard-4", **node_config),
            opts=pool_opts,
        )
        gpu = gcp.container.NodePool(
            f"{name}-gpu-spot",
            project=site.project_id,
            cluster=cluster.id,
            location=site.region,
            # GPUs in the Filestore zone. Spot capacity varies by zone, but `zone` also places a zonal share:
            # changing it REPLACES the share and its data (`make diff`, docs/cloud.md#day-two).
            node_locations=[site.zone],
            initial_node_count=0,
            autoscaling=gcp.container.NodePoolAutoscalingArgs(
                min_node_count=0, max_node_count=gpu.max_nodes
            ),
            management=gcp.container.NodePoolManagementArgs(auto_repair=True, auto_upgrade=True),
            node_config=gcp.container.NodePoolNodeConfigArgs(
                machine_type=gpu.machine_type,
                # Spot VMs: no 24 h limit (unlike legacy preemptible), ~15 s termination notice.
                spot=True,
                guest_accelerators=[
                    gcp.container.NodePoolNodeConfigGuestAcceleratorArgs(
                        type=gpu.type,
                        count=gpu.count,
                        gpu_driver_installation_config=_DriverArgs(gpu_driver_version="LATEST"),
                    )
                ],
                # Only pods that tolerate spot preemption (the training Job) land here.
                taints=[
                    gcp.container.NodePoolNodeConfigTaintArgs(
                        key=SPOT_LABEL, value="true", effect="NO_SCHEDULE"
                    )
                ],
                **node_config,
            ),
            opts=pool_opts,
        )
        self._pools = [system, gpu]


def kubeconfig(cluster_name: str, endpoint: str, ca_certificate: str) -> str:
    """A kubeconfig that authenticates with the deployer's gcloud credentials (no long-lived keys)."""
    context = f"gke-{cluster_name}"
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": context,
                    "cluster": {
                        "server": f"https://{endpoint}",
                        "certificate-authority-data": ca_certificate,
                    },
                }
            ],
            "contexts": [{"name": context, "context": {"cluster": context, "user": context}}],
            "current-context": context,
            "users": [
                {
                    "name": context,
                    "user": {
                        "exec": {
                            "apiVersion": "client.authentication.k8s.io/v1beta1",
                            "command": "gke-gcloud-auth-plugin",
                            "installHint": "gcloud components install gke-gcloud-auth-plugin",
                            "provideClusterInfo": True,
                        }
                    },
                }
            ],
        },
        indent=2,
    )
