"""Which input changes make a provider replace a resource (delete, then create) instead of updating it.

The one list ``make diff`` reads. Each entry names where the fact comes from, in the provider's own
source, so it can be checked again when a provider is upgraded:

- pulumi-gcp is bridged from terraform-provider-google: a field marked ``ForceNew`` there (or
  ``immutable`` in magic-modules' product YAML, from which that provider is generated) is a
  replacement in Pulumi too.
- pulumi-kubernetes lists its replace-on-change fields per kind in provider/pkg/provider/diff.go
  (``forceNew``), plus ``.metadata.name`` and ``.metadata.namespace`` for every kind.

Paths are input property names as the engine sees them (camelCase), joined with dots; a list counts as
one value. ``stateful`` says what a replacement destroys, for the resources whose replacement loses
data or access, so the preview can say it loudly.
"""

from __future__ import annotations

from dataclasses import dataclass

FILESTORE = "gcp:filestore/instance:Instance"
CLUSTER = "gcp:container/cluster:Cluster"
NODE_POOL = "gcp:container/nodePool:NodePool"
BUCKET_GRANT = "gcp:storage/bucketIAMMember:BucketIAMMember"
ACCOUNT_GRANT = "gcp:serviceaccount/iAMMember:IAMMember"
PROJECT_GRANT = "gcp:projects/iAMMember:IAMMember"

_TPG = "terraform-provider-google (generated from GoogleCloudPlatform/magic-modules"
_K8S_DIFF = "pulumi-kubernetes provider/pkg/provider/diff.go, forceNew"


@dataclass(frozen=True)
class ReplaceOnChange:
    """A change to any of ``paths`` in a ``type`` resource replaces it."""

    type: str
    paths: tuple[str, ...]
    evidence: str
    stateful: str = ""  # what a replacement destroys ('' when nothing is lost)


FACTS: tuple[ReplaceOnChange, ...] = (
    ReplaceOnChange(
        FILESTORE,
        ("project", "location", "tier", "protocol", "fileShares.name", "networks", "kmsKeyName"),
        f"{_TPG} mmv1/products/filestore/Instance.yaml: location (url parameter), tier, protocol, "
        "fileShares.name, networks and each of its fields, kmsKeyName are immutable; capacityGb is not)",
        stateful="the Filestore share: datasets, features, checkpoints and reports",
    ),
    ReplaceOnChange(
        CLUSTER,
        (
            "project", "location", "network", "subnetwork", "enableAutopilot", "datapathProvider",
            "initialNodeCount", "ipAllocationPolicy.clusterSecondaryRangeName",
            "ipAllocationPolicy.servicesSecondaryRangeName",
        ),
        f"{_TPG} mmv1/third_party/terraform/services/container/resource_container_cluster.go.tmpl: ForceNew "
        "on these; releaseChannel, privateClusterConfig.enablePrivateNodes and workloadIdentityConfig update)",
        stateful="the GKE cluster: the Redis queue's disk and every running pod",
    ),
    ReplaceOnChange(
        NODE_POOL,
        ("project", "location", "cluster", "nodeConfig.guestAccelerators", "nodeConfig.spot",
         "nodeConfig.serviceAccount", "nodeConfig.oauthScopes"),
        f"{_TPG} mmv1/third_party/terraform/services/container/resource_container_node_pool.go.tmpl and "
        "node_config.go.tmpl: ForceNew; machineType, nodeLocations and autoscaling update in place)",
    ),
    ReplaceOnChange(
        BUCKET_GRANT,
        ("bucket", "role", "member", "condition"),
        f"{_TPG} tpgiamresource/resource_iam_member.go: role, member, condition ForceNew; "
        "services/storage/iam_storage_bucket.go: bucket ForceNew)",
        stateful="a bucket grant: the pods lose access to the bucket between the delete and the create",
    ),
    ReplaceOnChange(
        ACCOUNT_GRANT,
        ("serviceAccountId", "role", "member", "condition"),
        f"{_TPG} tpgiamresource/resource_iam_member.go and services/resourcemanager/iam_service_account.go.tmpl)",
    ),
    ReplaceOnChange(
        PROJECT_GRANT,
        ("project", "role", "member", "condition"),
        f"{_TPG} tpgiamresource/resource_iam_member.go and services/resourcemanager/iam_project.go.tmpl)",
    ),
    ReplaceOnChange("kubernetes:batch/v1:Job",
                    ("spec.completions", "spec.parallelism", "spec.selector", "spec.template"), _K8S_DIFF),
    ReplaceOnChange("kubernetes:core/v1:PersistentVolumeClaim", ("spec",), _K8S_DIFF),
    ReplaceOnChange("kubernetes:core/v1:PersistentVolume", ("spec.nfs", "spec.csi"), _K8S_DIFF),
    ReplaceOnChange("kubernetes:core/v1:ConfigMap", ("data", "binaryData"), _K8S_DIFF),
    ReplaceOnChange("kubernetes:core/v1:Secret", ("type", "stringData", "data"), _K8S_DIFF),
    ReplaceOnChange("kubernetes:core/v1:Service", ("spec.clusterIP",), _K8S_DIFF),
    ReplaceOnChange("kubernetes:apps/v1:Deployment", ("spec.selector",), _K8S_DIFF),
)
# Every Kubernetes object is replaced when its name or namespace changes (diff.go, metadataForceNewProperties).
KUBERNETES_IDENTITY = ("metadata.name", "metadata.namespace")


def replace_paths(type_: str) -> tuple[str, ...]:
    """The input paths whose change replaces a ``type_`` resource."""
    paths = tuple(p for fact in FACTS if fact.type == type_ for p in fact.paths)
    return paths + KUBERNETES_IDENTITY if type_.startswith("kubernetes:") else paths


def stateful(type_: str) -> str:
    """What a replacement of a ``type_`` resource destroys ('' when nothing)."""
    return next((fact.stateful for fact in FACTS if fact.type == type_ and fact.stateful), "")
