"""Which input changes make a provider replace a resource (delete, then create) instead of updating it,
and which updates the Kubernetes API refuses.

The one list ``make diff`` reads. Every path names the line of the provider's source that makes it so,
at the commit named in ``SOURCES``, so it can be checked again when a provider is upgraded:

- pulumi-gcp is bridged from terraform-provider-google: a field marked ``ForceNew`` there (or forced by a
  ``customdiff.ForceNewIfChange``) is a replacement in Pulumi too.
- pulumi-kubernetes lists its replace-on-change fields per kind in provider/pkg/provider/diff.go
  (``forceNew``), plus ``.metadata.name`` and ``.metadata.namespace`` for every kind.
- A Kubernetes field that the API server keeps immutable but pulumi-kubernetes does not replace on is
  PATCHed, and the update fails ("field is immutable"): ``API_IMMUTABLE``, from kubernetes' validation.

Paths are input property names as the engine sees them (camelCase), joined with dots; a list counts as
one value. ``stateful`` says what a replacement or a deletion destroys, for the resources whose loss
loses data, so the preview can say it loudly.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

FILESTORE = "gcp:filestore/instance:Instance"
CLUSTER = "gcp:container/cluster:Cluster"
NODE_POOL = "gcp:container/nodePool:NodePool"
NETWORK = "gcp:compute/network:Network"
SUBNETWORK = "gcp:compute/subnetwork:Subnetwork"
ROUTER = "gcp:compute/router:Router"
ROUTER_NAT = "gcp:compute/routerNat:RouterNat"
REPOSITORY = "gcp:artifactregistry/repository:Repository"
REPOSITORY_GRANT = "gcp:artifactregistry/repositoryIamMember:RepositoryIamMember"
SERVICE_ACCOUNT = "gcp:serviceaccount/account:Account"
PROJECT_SERVICE = "gcp:projects/service:Service"
BUCKET_GRANT = "gcp:storage/bucketIAMMember:BucketIAMMember"
ACCOUNT_GRANT = "gcp:serviceaccount/iAMMember:IAMMember"
PROJECT_GRANT = "gcp:projects/iAMMember:IAMMember"
PERIMETER = "gcp:accesscontextmanager/servicePerimeter:ServicePerimeter"
KEY_RING = "gcp:kms/keyRing:KeyRing"
CRYPTO_KEY = "gcp:kms/cryptoKey:CryptoKey"
CRYPTO_KEY_GRANT = "gcp:kms/cryptoKeyIAMMember:CryptoKeyIAMMember"
JOB = "kubernetes:batch/v1:Job"
CLAIM = "kubernetes:core/v1:PersistentVolumeClaim"

# The provider sources the line numbers below were read at.
TPG = "hashicorp/terraform-provider-google@e03b7622a26c"
K8S_PROVIDER = "pulumi/pulumi-kubernetes@94977969d641"
KUBERNETES = "kubernetes/kubernetes@3989b1858620"
# The service perimeter's lines were read at another commit of the same provider (the one the search tool holds).
TPG_PERIMETER = "hashicorp/terraform-provider-google@0937ec5ba25b"
SOURCES = (TPG, K8S_PROVIDER, KUBERNETES, TPG_PERIMETER)

_SUBNET = "google/services/compute/resource_compute_subnetwork.go"
_CLUSTER = "google/services/container/resource_container_cluster.go"
_POOL = "google/services/container/resource_container_node_pool.go"
_NODE_CONFIG = "google/services/container/node_config.go"
_FILESTORE = "google/services/filestore/resource_filestore_instance.go"
_ROUTER = "google/services/compute/resource_compute_router.go"
_NAT = "google/services/compute/resource_compute_router_nat.go"
_NETWORK = "google/services/compute/resource_compute_network.go"
_REPO = "google/services/artifactregistry/resource_artifact_registry_repository.go"
_IAM = "google/tpgiamresource/resource_iam_member.go"
_KEY_RING = "google/services/kms/resource_kms_key_ring.go"
_CRYPTO_KEY = "google/services/kms/resource_kms_crypto_key.go"
_DIFF_GO = "provider/pkg/provider/diff.go"
_JOB_VALIDATION = "pkg/apis/batch/validation/validation.go ValidateJobSpecUpdate"


def _at(source: str, **lines: int) -> dict[str, str]:
    """Python-safe path names (``fileShares__name``) -> ``source:line``."""
    return {path.replace("__", "."): f"{source}:{line}" for path, line in lines.items()}


def is_shrinkage_ip_cidr(old: Any, new: Any) -> bool:
    """terraform-provider-google's IsShrinkageIpCidr (resource_compute_subnetwork.go:63): a new range that
    does not contain the old one's first and last address replaces the subnet; an expansion is an update."""
    try:
        before, after = ipaddress.ip_network(str(old)), ipaddress.ip_network(str(new))
    except ValueError:
        return False  # the provider's own validation refuses it first
    return not (before[0] in after and before[-1] in after)


@dataclass(frozen=True)
class ReplaceOnChange:
    """A change to any of ``sources``' paths in a ``type`` resource replaces it; each path names the file and
    line of the provider's source that says so. ``only_if``: paths replaced only when ``only_if[path](old,
    new)`` holds (a ``customdiff.ForceNewIfChange``)."""

    type: str
    sources: Mapping[str, str]
    stateful: str = ""  # what a replacement or deletion destroys ('' when nothing is lost)
    only_if: Mapping[str, Callable[[Any, Any], bool]] = field(default_factory=dict)

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(self.sources)

    @property
    def evidence(self) -> str:
        return "; ".join(f"{p}: {s}" for p, s in self.sources.items())


FACTS: tuple[ReplaceOnChange, ...] = (
    ReplaceOnChange(
        FILESTORE,
        _at(_FILESTORE, project=660, location=487, zone=573, tier=362, protocol=545, fileShares__name=199,
            networks=285, kmsKeyName=470, tags=556),
        stateful="the Filestore share: datasets, features, checkpoints and reports",
    ),  # fileShares.capacityGb and fileShares.nfsExportOptions carry no ForceNew: updated in place
    ReplaceOnChange(
        CLUSTER,
        _at(_CLUSTER, name=296, location=330, clusterIpv4Cidr=1027, description=1036, enableKubernetesAlpha=1070,
            enableAutopilot=1117, initialNodeCount=1159, network=1682, nodePools=1718, project=1872,
            subnetwork=1880, ipAllocationPolicy__clusterIpv4CidrBlock=1924,
            ipAllocationPolicy__servicesIpv4CidrBlock=1934, ipAllocationPolicy__clusterSecondaryRangeName=1945,
            ipAllocationPolicy__servicesSecondaryRangeName=1954, networkingMode=2066,
            privateClusterConfig__masterIpv4CidrBlock=2176, privateClusterConfig__privateEndpointSubnetwork=2194,
            defaultMaxPodsPerNode=2257, datapathProvider=2441),
        stateful="the GKE cluster: the Redis queue's disk and every running pod",
    ),  # releaseChannel, enablePrivateNodes, masterAuthorizedNetworksConfig, binaryAuthorization,
    #     databaseEncryption and workloadIdentityConfig carry no ForceNew: updated in place
    ReplaceOnChange(
        NODE_POOL,
        {**_at(_POOL, project=243, cluster=249, location=256, maxPodsPerNode=413, initialNodeCount=466, name=514,
               namePrefix=522, placementPolicy=369),
         **_at(_NODE_CONFIG, nodeConfig__guestAccelerators=320, nodeConfig__oauthScopes=564, nodeConfig__spot=619,
               nodeConfig__serviceAccount=628)},
    ),  # machineType, nodeLocations and autoscaling update in place
    ReplaceOnChange(NETWORK, _at(_NETWORK, name=143, autoCreateSubnetworks=156, description=168, project=305)),
    ReplaceOnChange(
        SUBNETWORK,
        _at(_SUBNET, ipCidrRange=385, name=420, network=433, description=450, region=621, project=760),
        only_if={"ipCidrRange": is_shrinkage_ip_cidr},  # customdiff.ForceNewIfChange("ip_cidr_range", ...)
    ),
    ReplaceOnChange(ROUTER, _at(_ROUTER, name=166, network=295, region=323, project=336)),
    ReplaceOnChange(ROUTER_NAT, _at(_NAT, name=307, router=315, region=475, type=528, project=546)),
    ReplaceOnChange(
        # remoteRepositoryConfig: the Docker Hub proxy's upstream (infra/image.py), ForceNew as a whole.
        REPOSITORY, _at(_REPO, format=305, repositoryId=315, kmsKeyName=448, location=472, mode=511,
                        remoteRepositoryConfig=519, project=930),
    ),
    ReplaceOnChange(
        REPOSITORY_GRANT,
        {**_at("google/services/artifactregistry/iam_artifact_registry_repository.go", project=76, location=82,
               repository=87),
         **_at(_IAM, role=67, member=72, condition=80)},
    ),
    ReplaceOnChange(
        SERVICE_ACCOUNT, _at("google/services/resourcemanager/resource_google_service_account.go", accountId=93,
                             project=118)
    ),
    ReplaceOnChange(
        PROJECT_SERVICE, _at("google/services/resourcemanager/resource_google_project_service.go", service=135,
                             project=142)
    ),
    # vpcServiceControls (infra/perimeter.py), at TPG_PERIMETER: a new vpcAccessPolicy moves the perimeter to
    # another policy (a new one is made, the old one deleted); nothing is stored in it. Its spec and status update.
    ReplaceOnChange(
        PERIMETER, _at("google/services/accesscontextmanager/resource_access_context_manager_service_perimeter.go",
                       name=55, parent=63, perimeterType=81)
    ),
    # A grant's replacement moves access; it destroys no data (Pulumi creates the new grant before it
    # deletes the old one), so it is not stateful.
    ReplaceOnChange(
        BUCKET_GRANT,
        {**_at("google/services/storage/iam_storage_bucket.go", bucket=36), **_at(_IAM, role=67, member=72,
                                                                                   condition=80)},
    ),
    ReplaceOnChange(
        ACCOUNT_GRANT,
        {**_at("google/services/resourcemanager/iam_service_account.go", serviceAccountId=40),
         **_at(_IAM, role=67, member=72, condition=80)},
    ),
    # secretsKmsKey and filestoreKmsKey "stack" (infra/cluster.py, infra/filestore.py). A new key is a new key:
    # data written under the old one is unreadable once its versions are destroyed, so each carries Pulumi's protect.
    ReplaceOnChange(KEY_RING, _at(_KEY_RING, location=144, name=151, project=158)),
    ReplaceOnChange(CRYPTO_KEY, _at(_CRYPTO_KEY, keyRing=152, name=160, purpose=199),
                    stateful="a Cloud KMS key of the stack's (the cluster's Secrets, or the share's card data)"),
    ReplaceOnChange(
        CRYPTO_KEY_GRANT,
        {**_at("google/services/kms/iam_kms_crypto_key.go", cryptoKeyId=36), **_at(_IAM, role=67, member=72,
                                                                                    condition=80)},
    ),
    ReplaceOnChange(
        PROJECT_GRANT,
        {**_at("google/services/resourcemanager/iam_project.go", project=38), **_at(_IAM, role=67, member=72,
                                                                                     condition=80)},
    ),
    ReplaceOnChange(JOB, _at(_DIFF_GO, spec__completions=180, spec__parallelism=181, spec__selector=182,
                             spec__template=183)),
    # Only these four: a larger spec.resources.requests is an in-place expansion.
    ReplaceOnChange(CLAIM, _at(_DIFF_GO, spec__accessModes=113, spec__selector=114, spec__storageClassName=115,
                               spec__volumeName=116)),
    ReplaceOnChange("kubernetes:core/v1:PersistentVolume", _at(_DIFF_GO, spec__csi=93, spec__nfs=102)),
    # Replaced on data (not updated) unless the provider's enableConfigMapMutable is set, which this program
    # does not set: the launcher's ConfigMap of Job bodies is replaced, not patched, on a new body.
    ReplaceOnChange("kubernetes:core/v1:ConfigMap", _at(_DIFF_GO, binaryData=33, data=33)),
    ReplaceOnChange("kubernetes:core/v1:Secret", _at(_DIFF_GO, type=29, stringData=29, data=29)),
    ReplaceOnChange("kubernetes:core/v1:Service", _at(_DIFF_GO, spec__clusterIP=159)),
    ReplaceOnChange("kubernetes:apps/v1:Deployment", _at(_DIFF_GO, spec__selector=173)),
    ReplaceOnChange("kubernetes:rbac.authorization.k8s.io/v1:RoleBinding", _at(_DIFF_GO, roleRef=193)),
)
# Every Kubernetes object is replaced when its name or namespace changes (diff.go:207-211,
# metadataForceNewProperties, applied to every kind at diff.go:25).
KUBERNETES_IDENTITY = ("metadata.name", "metadata.namespace")
KUBERNETES_IDENTITY_SOURCE = f"{_DIFF_GO}:209-210"

# A provider replaces itself when these config inputs are unknown at preview, as they are when they take
# outputs of a replaced resource (a new cluster's endpoint and CA): "we can't tell for sure if a computed value
# has changed, so we make the conservative choice and force a replacement" (pulumi-kubernetes
# provider/pkg/provider/provider.go:504-515, DiffConfig). The engine then replaces every resource of that
# provider (pulumi pkg/resource/deploy/step_generator.go, providerChanged: ReplaceKeys ["provider"]).
PROVIDER_REPLACED_BY_UNKNOWN: Mapping[str, Mapping[str, str]] = {
    "pulumi:providers:kubernetes": {p: "provider/pkg/provider/provider.go:506" for p in ("kubeconfig", "context",
                                                                                       "cluster")},
}

# Fields the Kubernetes API server refuses to change on update that pulumi-kubernetes does not replace on:
# the provider PATCHes them and `pulumi up` fails "field is immutable", unless the resource's
# replaceOnChanges option names them (then the engine replaces it).
API_IMMUTABLE: Mapping[str, Mapping[str, str]] = {
    JOB: {p: _JOB_VALIDATION for p in (
        "spec.podFailurePolicy", "spec.completionMode", "spec.backoffLimitPerIndex", "spec.successPolicy",
        "spec.managedBy")},
}


def facts(type_: str) -> list[ReplaceOnChange]:
    return [fact for fact in FACTS if fact.type == type_]


def replace_paths(type_: str) -> tuple[str, ...]:
    """The input paths whose change can replace a ``type_`` resource."""
    paths = tuple(p for fact in facts(type_) for p in fact.paths)
    return paths + KUBERNETES_IDENTITY if type_.startswith("kubernetes:") else paths


def follow_paths(type_: str) -> tuple[str, ...]:
    """The inputs through which a replaced resource's new (unknown) outputs replace a ``type_`` resource."""
    return replace_paths(type_) + tuple(PROVIDER_REPLACED_BY_UNKNOWN.get(type_, {}))


def replaces(type_: str, path: str, old: Any, new: Any) -> bool:
    """Whether a change of ``path`` from ``old`` to ``new`` replaces a ``type_`` resource (the path is one
    of ``replace_paths``; a conditional one is asked its condition)."""
    for fact in facts(type_):
        if path in fact.only_if:
            return fact.only_if[path](old, new)
    return True


def immutable_paths(type_: str) -> tuple[str, ...]:
    """Paths the API server refuses to update and the provider does not replace on."""
    return tuple(API_IMMUTABLE.get(type_, {}))


# The provider's own deletion protection: input -> its default. The provider refuses to delete the resource
# while it is true (resource_container_cluster.go:342 "deletion_protection", Default true;
# resource_filestore_instance.go:366 "deletion_protection_enabled", off unless set, and accepted on ZONAL,
# REGIONAL and ENTERPRISE tiers only).
DELETION_PROTECTION: Mapping[str, tuple[str, bool]] = {
    CLUSTER: ("deletionProtection", True),
    FILESTORE: ("deletionProtectionEnabled", False),
}


def deletion_protected(type_: str, inputs: Mapping[str, Any]) -> bool:
    """Whether the provider refuses to delete a ``type_`` resource with these inputs."""
    key, default = DELETION_PROTECTION.get(type_, ("", False))
    return bool(key) and inputs.get(key, default) is True


def stateful(type_: str) -> str:
    """What a replacement or deletion of a ``type_`` resource destroys ('' when nothing)."""
    return next((fact.stateful for fact in facts(type_) if fact.stateful), "")
