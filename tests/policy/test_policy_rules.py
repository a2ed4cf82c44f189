"""Each rule on a passing and a violating resource, with the message checked (no engine, no mocks)."""

from __future__ import annotations

import base64
import copy
from typing import Any

import pytest

from infra import contract, gke
from policy import rules
from policy.rules import Resource, StackFacts

JOB = "kubernetes:batch/v1:Job"
DEPLOYMENT = "kubernetes:apps/v1:Deployment"
POD = "kubernetes:core/v1:Pod"
DIGEST = "sha256:" + "0f" * 32
DEV = StackFacts(stack="dev", labels={"env": "dev", "app": contract.APP, "team": "ml-platform"})


def job(**pod: Any) -> dict[str, Any]:
    """A training Job as the program declares it, with ``pod`` merged into its pod spec."""
    spec: dict[str, Any] = {
        "securityContext": {"runAsNonRoot": True, "runAsUser": 10001.0},
        "nodeSelector": {gke.SPOT_LABEL: "true", gke.ACCELERATOR_LABEL: "nvidia-l4"},
        "containers": [
            {
                "name": "worker",
                "image": f"europe-docker.pkg.dev/p/r/trainer@{DIGEST}",
                "securityContext": {"allowPrivilegeEscalation": False},
                "resources": {"limits": {gke.GPU_RESOURCE: "1"}},
            }
        ],
    }
    spec.update(pod)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train", "namespace": "ns"},
        "spec": {"template": {"metadata": {"labels": contract.labels(contract.WORKER)}, "spec": spec}},
    }


def container(props: dict[str, Any]) -> dict[str, Any]:
    return props["spec"]["template"]["spec"]["containers"][0]


# --- images ------------------------------------------------------------------------------------------


def test_image_by_digest_passes() -> None:
    assert rules.image_pinned_by_digest(JOB, job(), DEV) == []
    tagged_and_pinned = job()
    container(tagged_and_pinned)["image"] = f"redis:7.4-alpine@{DIGEST}"
    assert rules.image_pinned_by_digest(JOB, tagged_and_pinned, DEV) == []


@pytest.mark.parametrize("image", ["trainer:latest", "trainer:v1", "trainer", "eu.gcr.io/p/trainer:1.0"])
def test_image_without_digest_is_a_violation(image: str) -> None:
    props = job()
    container(props)["image"] = image
    assert rules.image_pinned_by_digest(JOB, props, DEV) == [
        f"Job 'train': container 'worker' image {image!r} is not pinned by digest; use name@sha256:<digest>"
    ]


def test_latest_next_to_a_digest_is_a_violation() -> None:
    props = job()
    container(props)["image"] = f"trainer:latest@{DIGEST}"
    assert rules.image_pinned_by_digest(JOB, props, DEV) == [
        f"Job 'train': container 'worker' image 'trainer:latest@{DIGEST}' names the tag 'latest'; drop the tag, "
        "the digest is what runs"
    ]


def test_init_containers_and_bare_pods_are_checked_too() -> None:
    pod = {"metadata": {"name": "p"}, "spec": {"initContainers": [{"name": "init", "image": "busybox"}]}}
    (message,) = rules.image_pinned_by_digest(POD, pod, DEV)
    assert message.startswith("Pod 'p': container 'init' image 'busybox' is not pinned")
    assert rules.image_pinned_by_digest("gcp:container/cluster:Cluster", {"image": "x"}, DEV) == []


# --- non-root ----------------------------------------------------------------------------------------


def test_non_root_container_passes() -> None:
    assert rules.containers_run_as_non_root(JOB, job(), DEV) == []


def test_container_context_overrides_the_pod_context() -> None:
    props = job(securityContext={})
    container(props)["securityContext"].update(runAsNonRoot=True, runAsUser=999.0)
    assert rules.containers_run_as_non_root(JOB, props, DEV) == []
    container(props)["securityContext"]["runAsUser"] = 0.0
    assert rules.containers_run_as_non_root(JOB, props, DEV) == ["Job 'train': container 'worker' runs as uid 0 (root)"]


@pytest.mark.parametrize(
    ("pod_context", "container_context", "expected"),
    [
        ({"runAsUser": 10001.0}, {"allowPrivilegeEscalation": False},
         "does not set runAsNonRoot: true (pod or container securityContext)"),
        ({"runAsNonRoot": True}, {"allowPrivilegeEscalation": False}, "sets no runAsUser; give it a non-zero uid"),
        ({"runAsNonRoot": True, "runAsUser": 1.0}, {"allowPrivilegeEscalation": False, "privileged": True},
         "is privileged"),
        ({"runAsNonRoot": True, "runAsUser": 1.0}, {}, "does not set allowPrivilegeEscalation: false"),
    ],
)  # fmt: skip
def test_root_or_privileged_containers_are_violations(
    pod_context: dict[str, Any], container_context: dict[str, Any], expected: str
) -> None:
    props = job(securityContext=pod_context)
    container(props)["securityContext"] = container_context
    assert rules.containers_run_as_non_root(JOB, props, DEV) == [f"Job 'train': container 'worker' {expected}"]


# --- end-of-life GPUs --------------------------------------------------------------------------------


def test_current_gpus_pass() -> None:
    pool = {"nodeConfig": {"guestAccelerators": [{"type": "nvidia-l4", "count": 1.0}]}}
    assert rules.no_end_of_life_gpu(rules.NODE_POOL, pool, DEV) == []
    assert rules.no_end_of_life_gpu(JOB, job(), DEV) == []


@pytest.mark.parametrize(
    ("type_", "props", "where"),
    [
        (rules.NODE_POOL, {"nodeConfig": {"guestAccelerators": [{"type": "nvidia-tesla-k80"}]}},
         "NodePool guest accelerator"),
        (rules.COMPUTE_CLASS, {"metadata": {"name": "gpu"}, "spec": {"priorities": [
            {"spot": True, "gpu": {"type": "nvidia-tesla-k80", "count": 1.0}}]}},
         "ComputeClass 'gpu' priority 0"),
        (JOB, job(nodeSelector={gke.SPOT_LABEL: "true", gke.ACCELERATOR_LABEL: "nvidia-tesla-k80"}),
         "Job 'train' nodeSelector"),
        (rules.CLUSTER, {"clusterAutoscaling": {"resourceLimits": [{"resourceType": "nvidia-tesla-k80"}]}},
         "Cluster autoscaling limit"),
    ],
)  # fmt: skip
def test_end_of_life_gpu_is_a_violation(type_: str, props: dict[str, Any], where: str) -> None:
    assert rules.no_end_of_life_gpu(type_, props, DEV) == [
        f"{where} asks for GPU 'nvidia-tesla-k80': end-of-life on GKE since 2024-05-01"
    ]


# --- cost labels -------------------------------------------------------------------------------------

LABELS = {"env": "dev", "app": contract.APP, "team": "ml-platform"}


def test_labelled_resources_pass_and_unlabellable_ones_are_skipped() -> None:
    assert rules.cost_labels(rules.FILESTORE, {"labels": LABELS}, DEV) == []
    assert rules.cost_labels(rules.NODE_POOL, {"nodeConfig": {"resourceLabels": LABELS}}, DEV) == []
    assert rules.cost_labels("gcp:projects/service:Service", {}, DEV) == []
    assert rules.cost_labels(JOB, {}, DEV) == []  # Kubernetes objects are not billed resources


def test_missing_or_wrong_labels_are_violations() -> None:
    props = {"resourceLabels": {"env": "prod", "app": contract.APP}}
    assert rules.cost_labels(rules.CLUSTER, props, DEV) == [
        "gcp:container/cluster:Cluster: label env='prod' in resourceLabels, expected 'dev'",
        "gcp:container/cluster:Cluster: label 'team' missing from resourceLabels",
    ]


def test_a_node_pool_names_the_nested_path_of_its_labels() -> None:
    pool = {"nodeConfig": {"resourceLabels": {"env": "dev", "app": contract.APP}}}
    assert rules.cost_labels(rules.NODE_POOL, pool, DEV) == [
        "gcp:container/nodePool:NodePool: label 'team' missing from nodeConfig.resourceLabels"
    ]


def test_any_team_will_do_when_the_pack_cannot_see_the_config() -> None:
    facts = StackFacts(stack="dev", labels={"env": "dev", "app": contract.APP, "team": None})
    assert rules.cost_labels(rules.FILESTORE, {"labels": {**LABELS, "team": "data"}}, facts) == []


def test_a_gcp_type_nobody_classified_is_a_violation() -> None:
    assert rules.cost_labels("gcp:storage/bucket:Bucket", {"labels": LABELS}, DEV) == [
        "gcp:storage/bucket:Bucket: not known to take labels or not; add it to LABELLED or UNLABELLED in "
        "policy/rules.py"
    ]


# --- deletion protection -----------------------------------------------------------------------------

PROD = StackFacts(stack="prod")
LOSSY = StackFacts(stack="dev", allow_data_loss=True)
UNLESS = " (unless allowDataLoss is set)"


def test_protection_passes_and_only_an_explicit_allow_data_loss_lifts_it() -> None:
    for facts in (PROD, DEV):
        assert rules.stateful_protection(rules.CLUSTER, {"deletionProtection": True}, facts) == []
        assert rules.stateful_protection(rules.CLUSTER, {}, facts) == []  # the provider defaults to true
        zonal = {"tier": "ZONAL", "deletionProtectionEnabled": True}
        assert rules.stateful_protection(rules.FILESTORE, zonal, facts) == []
    assert rules.stateful_protection(rules.CLUSTER, {"deletionProtection": False}, LOSSY) == []
    assert rules.stateful_protection(rules.FILESTORE, {"tier": "BASIC_HDD"}, LOSSY) == []
    assert rules.stateful_protection(rules.FILESTORE, {"tier": "ZONAL"}, LOSSY) == []


@pytest.mark.parametrize("facts", [PROD, DEV], ids=["prod", "dev"])
def test_an_unprotected_stateful_resource_is_a_violation_in_any_stack(facts: StackFacts) -> None:
    s = facts.stack
    assert rules.stateful_protection(rules.CLUSTER, {"deletionProtection": False}, facts) == [
        f"Cluster: deletionProtection is False in stack {s!r}; it must be true" + UNLESS
    ]
    assert rules.stateful_protection(rules.FILESTORE, {"tier": "REGIONAL"}, facts) == [
        f"Filestore instance: deletionProtectionEnabled is None in stack {s!r}; it must be true" + UNLESS
    ]
    zonal_unprotected = {"tier": "ZONAL", "deletionProtectionEnabled": False}
    assert rules.stateful_protection(rules.FILESTORE, zonal_unprotected, facts) == [
        f"Filestore instance: deletionProtectionEnabled is False in stack {s!r}; it must be true" + UNLESS
    ]


@pytest.mark.parametrize("tier", ["BASIC_HDD", "BASIC_SSD"])
def test_a_basic_filestore_is_protected_by_pulumi_not_by_the_api(tier: str) -> None:
    """The API has no deletion protection on BASIC tiers: asking for it fails the create, in any stack."""
    assert rules.stateful_protection(rules.FILESTORE, {"tier": tier}, PROD, protect=True) == []
    assert rules.stateful_protection(rules.FILESTORE, {"tier": tier}, PROD) == [
        f"Filestore instance: tier {tier!r} in stack 'prod' must have Pulumi's `protect` option" + UNLESS
    ]
    for facts in (PROD, DEV, LOSSY):
        assert rules.stateful_protection(
            rules.FILESTORE, {"tier": tier, "deletionProtectionEnabled": True}, facts, protect=True
        ) == [
            f"Filestore instance: tier {tier!r} has no deletion protection, and deletionProtectionEnabled fails the "
            "create; leave it out and protect the resource with Pulumi's `protect` option"
        ]


# --- advisory cluster rules --------------------------------------------------------------------------

GOOD_CLUSTER = {
    "privateClusterConfig": {"enablePrivateNodes": True},
    "workloadIdentityConfig": {"workloadPool": "p.svc.id.goog"},
    "releaseChannel": {"channel": "REGULAR"},
}


@pytest.mark.parametrize(
    ("rule", "broken", "message"),
    [
        (rules.private_nodes, {"privateClusterConfig": {"enablePrivateNodes": False}},
         "Cluster: privateClusterConfig.enablePrivateNodes is not true; nodes get public IPs"),
        (rules.workload_identity, {"workloadIdentityConfig": None},
         "Cluster: workloadIdentityConfig.workloadPool is not set; pods would use the node's account"),
        (rules.release_channel, {"releaseChannel": {"channel": "UNSPECIFIED"}},
         "Cluster: releaseChannel.channel is 'UNSPECIFIED'; use one of RAPID, REGULAR, STABLE, EXTENDED"),
    ],
)  # fmt: skip
def test_advisory_cluster_rules(rule: rules.ResourceCheck, broken: dict[str, Any], message: str) -> None:
    assert rule(rules.CLUSTER, GOOD_CLUSTER, DEV) == []
    assert rule(rules.CLUSTER, {**GOOD_CLUSTER, **broken}, DEV) == [message]


def test_autopilot_always_has_workload_identity() -> None:
    assert rules.workload_identity(rules.CLUSTER, {"enableAutopilot": True}, DEV) == []


def test_a_standard_cluster_with_an_empty_workload_pool_has_no_workload_identity() -> None:
    assert rules.workload_identity(
        rules.CLUSTER, {**GOOD_CLUSTER, "workloadIdentityConfig": {"workloadPool": ""}}, DEV
    ) == ["Cluster: workloadIdentityConfig.workloadPool is not set; pods would use the node's account"]


# --- stack rules: spot -------------------------------------------------------------------------------


def res(type_: str, props: dict[str, Any], name: str = "r") -> Resource:
    return Resource(type_, name, f"urn:{type_}::{name}", props)


def compute_class(*spots: bool, when: str = "DoNotScaleUp") -> Resource:
    priorities = [{"spot": s, "gpu": {"type": "nvidia-l4", "count": 1.0}} for s in spots]
    props = {"metadata": {"name": "gpu"}, "spec": {"priorities": priorities, "whenUnsatisfiable": when}}
    return res(rules.COMPUTE_CLASS, props, "gpu")


CLASS_SELECTOR = {"nodeSelector": {gke.COMPUTE_CLASS_LABEL: "gpu"}}


def test_training_on_spot_passes() -> None:
    assert rules.training_on_spot([res(JOB, job())], DEV) == []
    assert rules.training_on_spot([res(JOB, job(**CLASS_SELECTOR)), compute_class(True)], DEV) == []
    fallback = StackFacts(stack="prod", on_demand_fallback=True)
    assert rules.training_on_spot([res(JOB, job(**CLASS_SELECTOR)), compute_class(True, False)], fallback) == []


@pytest.mark.parametrize(
    ("resources", "message"),
    [
        ([res(JOB, job(nodeSelector={}))],
         "Job 'train': training pods must select spot capacity: nodeSelector cloud.google.com/gke-spot: \"true\", "
         "or cloud.google.com/compute-class with a class that lists spot first"),
        ([res(JOB, job(**CLASS_SELECTOR))],
         "Job 'train': selects compute class 'gpu', which the stack does not declare"),
        ([res(JOB, job(**CLASS_SELECTOR)), compute_class(False, True)],
         "Job 'train': compute class 'gpu' does not list spot first"),
        ([res(JOB, job(**CLASS_SELECTOR)), compute_class(True, False)],
         "Job 'train': compute class 'gpu' falls back to on-demand, but the stack does not enable onDemandFallback"),
        ([res(JOB, job(**CLASS_SELECTOR)), compute_class(True, when="ScaleUpAnyway")],
         "Job 'train': compute class 'gpu' must set whenUnsatisfiable: DoNotScaleUp, or GKE scales up on-demand "
         "nodes when spot is out"),
    ],
)  # fmt: skip
def test_training_off_spot_is_a_violation(resources: list[Resource], message: str) -> None:
    assert rules.training_on_spot(resources, DEV) == [(resources[0].urn, message)]


def test_pods_without_gpus_outside_the_worker_component_may_run_anywhere() -> None:
    loader = job(nodeSelector={})
    container(loader)["resources"] = {}
    loader["spec"]["template"]["metadata"]["labels"] = contract.labels(contract.LOADER)
    assert rules.training_on_spot([res(JOB, loader)], DEV) == []


# --- stack rules: Redis ------------------------------------------------------------------------------

REDIS_LABELS = contract.labels(contract.REDIS)


def redis(args: list[str], env: list[dict[str, Any]] | None = None) -> Resource:
    pod = {
        "containers": [
            {
                "name": "redis",
                "image": f"redis:7.4@{DIGEST}",
                "args": args,
                "env": env or [],
                "volumeMounts": [{"name": "auth", "mountPath": "/etc/redis-auth"}],
            }
        ],
        "volumes": [{"name": "auth", "secret": {"secretName": "auth", "items": [{"key": "c", "path": "a.conf"}]}}],
    }
    props = {
        "metadata": {"name": "redis", "namespace": "ns"},
        "spec": {"template": {"metadata": {"labels": REDIS_LABELS}, "spec": pod}},
    }
    return res(DEPLOYMENT, props, "redis")


def secret(data: dict[str, str], encoded: bool = False) -> Resource:
    body = (
        {"data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}}
        if encoded
        else {"stringData": data}
    )
    return res(rules.SECRET, {"metadata": {"name": "auth", "namespace": "ns"}, **body}, "auth")


@pytest.mark.parametrize("encoded", [False, True], ids=["stringData", "data"])
def test_redis_with_requirepass_from_a_secret_file_passes(encoded: bool) -> None:
    resources = [redis(["/etc/redis-auth/a.conf", "--appendonly", "yes"]), secret({"c": "requirepass s3\n"}, encoded)]
    assert rules.redis_requires_password(resources, DEV) == []


def test_redis_with_requirepass_from_a_secret_env_passes() -> None:
    env = [{"name": "PW", "valueFrom": {"secretKeyRef": {"name": "auth", "key": "password"}}}]
    resources = [redis(["--requirepass", "$(PW)"], env), secret({"password": "x"})]
    assert rules.redis_requires_password(resources, DEV) == []


@pytest.mark.parametrize(
    ("resources"),
    [
        [redis(["--appendonly", "yes"]), secret({"c": "requirepass s3\n"})],  # no password at all
        [redis(["/etc/redis-auth/a.conf"]), secret({"c": "appendonly yes\n"})],  # the file has no requirepass
        [redis(["/etc/redis-auth/a.conf"])],  # the Secret is not in the stack
        [redis(["--requirepass", "hunter2"]), secret({"password": "x"})],  # a literal on the command line
        [redis(["/etc/redis-auth/c"]), secret({"c": "requirepass s3\n"})],  # key c is projected as a.conf only
    ],
    ids=["none", "file-without-requirepass", "no-secret", "literal", "file-not-projected"],
)
def test_redis_without_a_password_from_a_secret_is_a_violation(resources: list[Resource]) -> None:
    assert rules.redis_requires_password(resources, DEV) == [
        (
            resources[0].urn,
            "Deployment 'redis': Redis container 'redis' does not require a password from a Secret of the stack "
            "(a `requirepass` config file mounted from the Secret, or --requirepass $(VAR) with VAR from a "
            "secretKeyRef)",
        )
    ]


def network_policy(*peers: dict[str, Any], selector: dict[str, Any] | None = None) -> Resource:
    props = {
        "metadata": {"name": "redis-clients", "namespace": "ns"},
        "spec": {
            "podSelector": {"matchLabels": REDIS_LABELS} if selector is None else selector,
            "policyTypes": ["Ingress"],
            "ingress": [{"from": list(peers), "ports": [{"port": 6379.0}]}],
        },
    }
    return res(rules.NETWORK_POLICY, props, "redis-clients")


CLIENTS = {
    "podSelector": {
        "matchLabels": {contract.NAME_LABEL: contract.APP},
        "matchExpressions": [{"key": contract.COMPONENT_LABEL, "operator": "In", "values": ["loader", "worker"]}],
    }
}


def test_redis_behind_a_network_policy_for_loader_and_workers_passes() -> None:
    redis_pod = redis(["/etc/redis-auth/a.conf"])
    assert rules.redis_network_policy([redis_pod, network_policy(CLIENTS)], DEV) == []
    worker_only = {"podSelector": {"matchLabels": contract.labels(contract.WORKER)}}
    assert rules.redis_network_policy([redis_pod, network_policy(worker_only)], DEV) == []


def test_redis_without_a_network_policy_is_a_violation() -> None:
    redis_pod = redis(["/etc/redis-auth/a.conf"])
    other = network_policy(CLIENTS, selector={"matchLabels": {contract.COMPONENT_LABEL: "web"}})
    assert rules.redis_network_policy([redis_pod, other], DEV) == [
        (redis_pod.urn, "Deployment 'redis': no NetworkPolicy with policyType Ingress selects the Redis pods")
    ]


@pytest.mark.parametrize(
    "peer",
    [
        {"podSelector": {"matchLabels": {contract.NAME_LABEL: contract.APP}}},  # every component, Redis too
        {"podSelector": {"matchLabels": contract.labels("debug")}},
        {"ipBlock": {"cidr": "0.0.0.0/0"}},
        {**CLIENTS, "namespaceSelector": {}},  # loader-like pods of every namespace
    ],
    ids=["whole-app", "debug-pod", "ip-block", "any-namespace"],
)
def test_a_policy_admitting_other_pods_is_a_violation(peer: dict[str, Any]) -> None:
    policy = network_policy(peer)
    ((urn, message),) = rules.redis_network_policy([redis(["/etc/redis-auth/a.conf"]), policy], DEV)
    assert urn == policy.urn
    assert message.startswith("NetworkPolicy 'redis-clients' ingress rule 0 admits {")
    assert message.endswith("may reach Redis")


def test_an_ingress_rule_without_sources_admits_everyone() -> None:
    policy = network_policy()
    assert rules.redis_network_policy([redis(["/etc/redis-auth/a.conf"]), policy], DEV) == [
        (
            policy.urn,
            "NetworkPolicy 'redis-clients' ingress rule 0 admits every source; list the loader and worker pods",
        )
    ]


# --- stack rules: Filestore network ------------------------------------------------------------------


def test_filestore_on_the_cluster_network_passes() -> None:
    vpc = res(rules.NETWORK, {"name": "vpc", "id": "projects/p/global/networks/vpc"})
    cluster = res(rules.CLUSTER, {"network": "projects/p/global/networks/vpc"}, "cluster")
    filestore = res(rules.FILESTORE, {"networks": [{"network": "vpc", "connectMode": "DIRECT_PEERING"}]}, "share")
    assert rules.filestore_on_cluster_network([vpc, cluster, filestore], DEV) == []
    # The mocks give ids that are not paths: the Network resource maps them to its name.
    mock_vpc = res(rules.NETWORK, {"name": "vpc", "id": "network-id"})
    mock_cluster = res(rules.CLUSTER, {"network": "network-id"}, "cluster")
    assert rules.filestore_on_cluster_network([mock_vpc, mock_cluster, filestore], DEV) == []


def test_filestore_on_another_network_is_a_violation() -> None:
    cluster = res(rules.CLUSTER, {"network": "projects/p/global/networks/vpc"}, "cluster")
    filestore = res(rules.FILESTORE, {"networks": [{"network": "default"}]}, "share")
    assert rules.filestore_on_cluster_network([cluster, filestore], DEV) == [
        (filestore.urn, "Filestore instance 'share' is on network 'default', the cluster on ['vpc']; "
         "pods could not mount it")
    ]  # fmt: skip


def test_rules_do_not_mutate_what_they_read() -> None:
    props = job()
    before = copy.deepcopy(props)
    for rule in rules.RULES:
        if rule.check_resource:
            rule.check_resource(JOB, props, DEV, **({"protect": False} if rule.reads_protect else {}))
        else:
            assert rule.check_stack
            rule.check_stack([res(JOB, props)], DEV)
    assert props == before


# --- stack rules: workload storage scope -------------------------------------------------------------

LOADER_SA = "st-dev-loader@p.iam.gserviceaccount.com"
WORKER_SA = "st-dev-worker@p.iam.gserviceaccount.com"
NODES_SA = "st-dev-nodes@p.iam.gserviceaccount.com"
DATA_FACTS = StackFacts(stack="dev", dataset_uri="gs://acme-fraud/exports", output_uri="gs://acme-results/out")
OUT_PREFIX = 'resource.name.startsWith("projects/_/buckets/acme-results/objects/out/")'
EXPORTS_READ = ('resource.name.startsWith("projects/_/buckets/acme-fraud/objects/exports/") || '
                'api.getAttribute("storage.googleapis.com/objectListPrefix", "").startsWith("exports/")')


def ksa(email: str, name: str) -> Resource:
    props = {"metadata": {"name": name, "annotations": {contract.GCP_SERVICE_ACCOUNT_ANNOTATION: email}}}
    return res(rules.SERVICE_ACCOUNT, props, name)


def bucket_grant(email: str, bucket: str, role: str, expression: str | None = None, name: str = "g") -> Resource:
    props: dict[str, Any] = {"bucket": bucket, "role": role, "member": f"serviceAccount:{email}"}
    if expression:
        props["condition"] = {"title": "t", "expression": expression}
    return res(rules.BUCKET_IAM[0], props, name)


def project_grant(email: str, role: str) -> Resource:
    return res(rules.PROJECT_IAM[0], {"project": "p", "role": role, "member": f"serviceAccount:{email}"}, "pg")


IDENTITIES = [ksa(LOADER_SA, "spot-trainer-loader"), ksa(WORKER_SA, "spot-trainer-worker")]


def test_workload_roles_on_the_configured_buckets_pass() -> None:
    resources = [
        *IDENTITIES,
        bucket_grant(LOADER_SA, "acme-fraud", "roles/storage.objectViewer", EXPORTS_READ),
        # The provider reports a created grant's bucket as "b/<name>".
        bucket_grant(WORKER_SA, "b/acme-results", "roles/storage.objectUser", OUT_PREFIX),
        bucket_grant(WORKER_SA, "acme-results", "roles/storage.objectCreator", OUT_PREFIX, name="g2"),
        # The nodes are no workload: their project role is the node rule's business, not this one's.
        project_grant(NODES_SA, "roles/container.defaultNodeServiceAccount"),
    ]
    assert rules.workload_storage_scope(resources, DATA_FACTS) == []
    # A stack without workload identities has nothing to check.
    assert rules.workload_storage_scope([project_grant(NODES_SA, "roles/storage.admin")], DEV) == []


def test_an_identity_found_through_its_workload_identity_binding_counts_too() -> None:
    binding = res(rules.SA_IAM_MEMBER, {
        "serviceAccountId": f"projects/p/serviceAccounts/{LOADER_SA}", "role": "roles/iam.workloadIdentityUser",
        "member": "serviceAccount:p.svc.id.goog[ns/spot-trainer-loader]"}, "wi")  # fmt: skip
    grant = project_grant(LOADER_SA, "roles/storage.objectViewer")
    ((urn, message),) = rules.workload_storage_scope([binding, grant], DATA_FACTS)
    assert urn == grant.urn and "on the whole project" in message


@pytest.mark.parametrize(
    ("grant", "message"),
    [
        (project_grant(LOADER_SA, "roles/storage.objectViewer"),
         f"IAMMember 'pg': grants roles/storage.objectViewer on the whole project to workload service account "
         f"{LOADER_SA}; grant object roles on the datasetUri/outputUri bucket instead"),
        (project_grant(WORKER_SA, "roles/editor"),
         f"IAMMember 'pg': grants roles/editor on the whole project to workload service account {WORKER_SA}; "
         "grant object roles on the datasetUri/outputUri bucket instead"),
        (bucket_grant(LOADER_SA, "other-bucket", "roles/storage.objectViewer"),
         f"BucketIAMMember 'g': roles/storage.objectViewer on bucket 'other-bucket' for {LOADER_SA}: workloads may "
         "only hold objectViewer on gs://acme-fraud/exports or objectCreator/objectUser under gs://acme-results/out"),
        (bucket_grant(LOADER_SA, "acme-fraud", "roles/storage.admin"),
         f"BucketIAMMember 'g': roles/storage.admin on bucket 'acme-fraud' for {LOADER_SA}: workloads may only hold "
         "objectViewer on gs://acme-fraud/exports or objectCreator/objectUser under gs://acme-results/out"),
        (bucket_grant(WORKER_SA, "acme-results", "roles/storage.objectUser"),
         f"BucketIAMMember 'g': roles/storage.objectUser on bucket 'acme-results' for {WORKER_SA}: write access must "
         'be limited to resource.name.startsWith("projects/_/buckets/acme-results/objects/out/")'),
        (bucket_grant(WORKER_SA, "acme-results", "roles/storage.objectUser",
                      'resource.name.startsWith("projects/_/buckets/acme-results/objects/")'),
         f"BucketIAMMember 'g': roles/storage.objectUser on bucket 'acme-results' for {WORKER_SA}: write access must "
         'be limited to resource.name.startsWith("projects/_/buckets/acme-results/objects/out/")'),
        (bucket_grant(WORKER_SA, "acme-fraud", "roles/storage.objectUser", OUT_PREFIX),
         f"BucketIAMMember 'g': roles/storage.objectUser on bucket 'acme-fraud' for {WORKER_SA}: workloads may only "
         "hold objectViewer on gs://acme-fraud/exports or objectCreator/objectUser under gs://acme-results/out"),
    ],
    ids=["project-storage-role", "project-basic-role", "other-bucket", "admin-on-data-bucket",
         "write-without-condition", "write-on-whole-bucket", "write-on-data-bucket"],
)  # fmt: skip
def test_workload_roles_beyond_the_configured_buckets_are_violations(grant: Resource, message: str) -> None:
    assert rules.workload_storage_scope([*IDENTITIES, grant], DATA_FACTS) == [(grant.urn, message)]


def test_a_project_binding_that_lists_a_workload_among_its_members_is_a_violation() -> None:
    members = ["group:ml@acme.example", f"serviceAccount:{WORKER_SA}"]
    binding = res(rules.PROJECT_IAM[1], {"project": "p", "role": "roles/storage.objectAdmin", "members": members}, "pb")
    assert rules.workload_storage_scope([*IDENTITIES, binding], DATA_FACTS) == [
        (binding.urn, f"IAMBinding 'pb': grants roles/storage.objectAdmin on the whole project to workload service "
         f"account {WORKER_SA}; grant object roles on the datasetUri/outputUri bucket instead")
    ]  # fmt: skip


def test_only_a_kubernetes_service_account_member_makes_an_account_a_workloads() -> None:
    """workloadIdentityUser granted to another Google account lets no pod act as the nodes' account."""
    binding = res(rules.SA_IAM_MEMBER, {
        "serviceAccountId": f"projects/p/serviceAccounts/{NODES_SA}", "role": "roles/iam.workloadIdentityUser",
        "member": "serviceAccount:deployer@p.iam.gserviceaccount.com"}, "wi")  # fmt: skip
    nodes_read_images = project_grant(NODES_SA, "roles/storage.objectViewer")
    assert rules.workload_storage_scope([*IDENTITIES, binding, nodes_read_images], DATA_FACTS) == []


def test_every_grant_is_judged_after_an_allowed_one() -> None:
    """The dataset read first, then a write grant naming both workloads without the prefix limit: each
    workload's write access is reported."""
    read = bucket_grant(LOADER_SA, "acme-fraud", "roles/storage.objectViewer", EXPORTS_READ, name="read")
    members = [f"serviceAccount:{LOADER_SA}", f"serviceAccount:{WORKER_SA}"]
    write = res(rules.BUCKET_IAM[1], {"bucket": "acme-results", "role": "roles/storage.objectUser", "members": members})
    limit = 'resource.name.startsWith("projects/_/buckets/acme-results/objects/out/")'
    assert rules.workload_storage_scope([*IDENTITIES, read, write], DATA_FACTS) == [
        (write.urn, f"BucketIAMBinding 'r': roles/storage.objectUser on bucket 'acme-results' for {email}: write "
         f"access must be limited to {limit}")
        for email in (LOADER_SA, WORKER_SA)
    ]  # fmt: skip


def test_without_data_settings_a_workload_may_hold_no_bucket_role() -> None:
    grant = bucket_grant(LOADER_SA, "acme-fraud", "roles/storage.objectViewer")
    ((_, message),) = rules.workload_storage_scope([*IDENTITIES, grant], DEV)
    assert message.endswith("workloads hold no bucket roles unless datasetUri or outputUri is set")


def test_a_dataset_read_beyond_its_prefix_is_refused() -> None:
    """datasetUri gs://acme-fraud/exports: the loader reads and lists under exports/ only; a read of the whole
    bucket, or a condition that forgets the listing or another prefix, is refused. gs://acme-fraud alone: the
    whole bucket is what was declared."""
    for expression in (None, 'resource.name.startsWith("projects/_/buckets/acme-fraud/objects/exports/")',
                       EXPORTS_READ.replace("exports/", "")):  # fmt: skip
        grant = bucket_grant(LOADER_SA, "acme-fraud", "roles/storage.objectViewer", expression)
        ((urn, message),) = rules.workload_storage_scope([*IDENTITIES, grant], DATA_FACTS)
        assert urn == grant.urn and f"read access must be limited to {EXPORTS_READ}" in message
    whole = StackFacts(stack="dev", dataset_uri="gs://acme-fraud", output_uri="gs://acme-results/out")
    grant = bucket_grant(LOADER_SA, "acme-fraud", "roles/storage.objectViewer")
    assert rules.workload_storage_scope([*IDENTITIES, grant], whole) == []


def test_a_whole_bucket_write_grant_is_refused_when_the_output_uri_has_no_prefix() -> None:
    """Issue 36's blind spot: with outputUri gs://acme-results (no prefix) there is no prefix to limit writes to,
    so a write grant on that bucket, with or without a condition naming all its objects, is refused."""
    facts = StackFacts(stack="dev", dataset_uri="gs://acme-fraud/exports", output_uri="gs://acme-results")
    everything = 'resource.name.startsWith("projects/_/buckets/acme-results/objects/")'
    for grant in (bucket_grant(WORKER_SA, "acme-results", "roles/storage.objectUser"),
                  bucket_grant(WORKER_SA, "acme-results", "roles/storage.objectCreator", everything)):  # fmt: skip
        ((urn, message),) = rules.workload_storage_scope([*IDENTITIES, grant], facts)
        assert urn == grant.urn and "write access must be limited to" in message


# --- hardening rules (issue 36) -----------------------------------------------------------------------

PROD = StackFacts(stack="prod", labels={"env": "prod", "app": contract.APP, "team": "ml"})


@pytest.mark.parametrize("type_", [rules.CLUSTER, rules.FILESTORE])
def test_an_unprotected_cluster_or_share_of_any_tier_is_refused(type_: str) -> None:
    props = {"tier": "ZONAL", "deletionProtectionEnabled": True} if type_ == rules.FILESTORE else {}
    (message,) = rules.stateful_pulumi_protect(type_, props, DEV, protect=False)
    assert "has no Pulumi `protect` option" in message and "stack 'dev'" in message
    assert rules.stateful_pulumi_protect(type_, props, DEV, protect=True) == []
    lossy = StackFacts(stack="dev", allow_data_loss=True)
    assert rules.stateful_pulumi_protect(type_, props, lossy, protect=False) == []
    assert rules.stateful_pulumi_protect(rules.NETWORK, {}, DEV, protect=False) == []


def loader_job(account: str | None = "spot-trainer-loader", component: str = contract.LOADER) -> Resource:
    spec: dict[str, Any] = {"containers": [{"name": "seed", "image": "x"}]}
    if account:
        spec["serviceAccountName"] = account
    template = {"metadata": {"labels": contract.labels(component)}, "spec": spec}
    return res("kubernetes:batch/v1:CronJob", {"metadata": {"name": "load", "namespace": "ns"},
                                               "spec": {"jobTemplate": {"spec": {"template": template}}}}, "load")


def role(rules_: list[dict[str, Any]], kind: str = "Role", name: str = "launch") -> Resource:
    type_ = rules.ROLE if kind == "Role" else rules.CLUSTER_ROLE
    return res(type_, {"metadata": {"name": name, "namespace": "ns"}, "rules": rules_}, f"{kind}-{name}")


def binding(account: str, kind: str = "Role", name: str = "launch", namespace: str | None = None) -> Resource:
    subject = {"kind": "ServiceAccount", "name": account, **({"namespace": namespace} if namespace else {})}
    props = {"metadata": {"name": "b", "namespace": "ns"}, "subjects": [subject],
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": name}}
    return res(rules.ROLE_BINDINGS[0] if kind == "Role" else rules.ROLE_BINDINGS[1], props, "b")


CREATE_JOBS = {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create"]}


@pytest.mark.parametrize(
    ("resources", "creates"),
    [
        ([loader_job(), role([CREATE_JOBS]), binding("spot-trainer-loader")], "batch/jobs"),
        ([loader_job(), role([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}], "ClusterRole"),
          binding("spot-trainer-loader", "ClusterRole", namespace="ns")], "apps/daemonsets"),
        ([loader_job(None), role([{"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get"]}]),
          binding("default")], "core/pods"),  # no serviceAccountName: the namespace's default account
    ],
    ids=["role-creates-jobs", "cluster-admin-like", "default-account-creates-pods"],
)  # fmt: skip
def test_a_loader_that_may_create_pods_is_refused(resources: list[Resource], creates: str) -> None:
    ((urn, message),) = rules.loader_cannot_create_pods(resources, DEV)
    assert urn == resources[2].urn and creates in message and "give the launch to an identity of its own" in message


def test_a_launcher_of_its_own_may_create_jobs_and_the_loader_may_read() -> None:
    read = {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get", "list"]}
    resources = [loader_job(), loader_job("spot-trainer-launcher", component="launcher"),
                 role([CREATE_JOBS]), binding("spot-trainer-launcher"),
                 role([read], name="read"), binding("spot-trainer-loader", name="read")]  # fmt: skip
    assert rules.loader_cannot_create_pods(resources, DEV) == []
    # A binding in another namespace does not reach the loader of "ns".
    assert rules.loader_cannot_create_pods(
        [loader_job(), role([CREATE_JOBS]), binding("spot-trainer-loader", namespace="other")], DEV) == []


def netpol(namespace: str, spec: dict[str, Any], name: str = "deny") -> Resource:
    return res(rules.NETWORK_POLICY, {"metadata": {"name": name, "namespace": namespace}, "spec": spec}, name)


DENY_ALL = {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
NAMESPACES = [res(rules.NAMESPACE, {"metadata": {"name": "ns"}}, "ns"),
              res("kubernetes:core/v1:Service", {"metadata": {"name": "redis", "namespace": "ns"}}, "svc")]


def test_a_namespace_with_a_default_deny_policy_passes() -> None:
    allow_redis = {"podSelector": {"matchLabels": {"app": "redis"}}, "policyTypes": ["Ingress"],
                   "ingress": [{"from": [{"podSelector": {}}]}]}  # fmt: skip
    resources = [*NAMESPACES, netpol("ns", DENY_ALL), netpol("ns", allow_redis, "redis")]
    assert rules.default_deny_network_policy(resources, DEV) == []


@pytest.mark.parametrize(
    "policies",
    [
        [],  # only Redis's policy, as today
        [netpol("ns", {"podSelector": {}, "policyTypes": ["Ingress"]})],  # egress stays open
        [netpol("ns", {**DENY_ALL, "egress": [{}]})],  # an empty egress rule allows everything
        [netpol("ns", {**DENY_ALL, "podSelector": {"matchLabels": {"a": "b"}}})],  # some pods only
        [netpol("other", DENY_ALL)],  # another namespace's
    ],
    ids=["none", "ingress-only", "allow-all-egress", "some-pods", "other-namespace"],
)
def test_a_namespace_without_a_default_deny_policy_is_refused(policies: list[Resource]) -> None:
    found = rules.default_deny_network_policy([*NAMESPACES, *policies], DEV)
    assert (NAMESPACES[0].urn, "namespace 'ns' has no default-deny NetworkPolicy (podSelector {}, policyTypes "
            "Ingress and Egress, no rules); every pod may talk to anything") in found


@pytest.mark.parametrize(
    ("props", "refused"),
    [
        ({}, True),
        ({"privateClusterConfig": {"enablePrivateEndpoint": False}}, True),
        ({"masterAuthorizedNetworksConfig": {"cidrBlocks": [{"cidrBlock": "0.0.0.0/0"}]}}, True),
        ({"masterAuthorizedNetworksConfig": {"cidrBlocks": [{"cidrBlock": "203.0.113.0/24"}]}}, False),
        ({"privateClusterConfig": {"enablePrivateEndpoint": True}}, False),
    ],
)
def test_a_public_control_plane_without_authorized_networks_is_refused_in_prod(props: dict, refused: bool) -> None:
    found = rules.prod_control_plane_not_public(rules.CLUSTER, props, PROD)
    assert bool(found) is refused
    assert rules.prod_control_plane_not_public(rules.CLUSTER, props, DEV) == []  # dev may keep it open


def test_rules_awaiting_the_infra_branch_are_advisory_until_it_lands() -> None:
    awaiting = {r.name: r.level for r in rules.RULES if r.name in rules.AWAITING_INFRA}
    assert set(awaiting) == rules.AWAITING_INFRA and set(awaiting.values()) <= {rules.ADVISORY}
    assert rules.level("stateful-protection") == rules.MANDATORY


KEY = "projects/p/locations/l/keyRings/r/cryptoKeys/k"
HARDENED_CLUSTER = {"binaryAuthorization": {"evaluationMode": "PROJECT_SINGLETON_POLICY_ENFORCE"},
                    "databaseEncryption": {"state": "ENCRYPTED", "keyName": KEY}}
HARDENED_SHARE = {"tier": "ZONAL", "kmsKeyName": "projects/p/locations/l/keyRings/r/cryptoKeys/f",
                  "fileShares": {"name": "share", "nfsExportOptions": [
                      {"ipRanges": ["10.20.0.0/14"], "accessMode": "READ_WRITE", "squashMode": "ROOT_SQUASH"}]}}


@pytest.mark.parametrize(
    ("type_", "change", "says"),
    [
        (rules.CLUSTER, lambda p: p.pop("binaryAuthorization"), "binaryAuthorization"),
        (rules.CLUSTER, lambda p: p["databaseEncryption"].update(state="DECRYPTED"), "databaseEncryption"),
        (rules.CLUSTER, lambda p: p["databaseEncryption"].pop("keyName"), "databaseEncryption"),
        (rules.FILESTORE, lambda p: p.pop("kmsKeyName"), "kmsKeyName"),
        (rules.FILESTORE, lambda p: p["fileShares"]["nfsExportOptions"][0].update(squashMode="NO_ROOT_SQUASH"),
         "ROOT_SQUASH"),
        (rules.FILESTORE, lambda p: p["fileShares"]["nfsExportOptions"][0].pop("ipRanges"), "ipRanges"),
        (rules.FILESTORE, lambda p: p["fileShares"].pop("nfsExportOptions"), "ROOT_SQUASH"),
        (rules.FILESTORE, lambda p: p["fileShares"]["nfsExportOptions"][0].update(anonUid=0), "anonUid/anonGid 0"),
        (rules.FILESTORE, lambda p: p["fileShares"]["nfsExportOptions"][0].update(anonGid=0), "anonUid/anonGid 0"),
    ],
)  # fmt: skip
def test_prod_refuses_an_unattested_image_or_unencrypted_data(type_: str, change: Any, says: str) -> None:
    props = copy.deepcopy(HARDENED_CLUSTER if type_ == rules.CLUSTER else HARDENED_SHARE)
    check = rules.prod_admission_and_encryption if type_ == rules.CLUSTER else rules.prod_card_data_at_rest
    assert check(type_, props, PROD) == []
    change(props)
    (message,) = check(type_, props, PROD)
    assert says in message and "stack 'prod'" in message
    assert check(type_, props, DEV) == []  # a cost dev does not pay
    other = rules.prod_card_data_at_rest if type_ == rules.CLUSTER else rules.prod_admission_and_encryption
    assert other(type_, props, PROD) == []  # each rule judges its own resource


PERIMETER_SPEC = {"resources": ["projects/123456789012"],
                  "restrictedServices": ["storage.googleapis.com", "file.googleapis.com"]}


@pytest.mark.parametrize(("props", "says"), [
    ({"useExplicitDryRunSpec": True, "spec": PERIMETER_SPEC}, None),
    ({"useExplicitDryRunSpec": False, "status": PERIMETER_SPEC}, None),
    (None, "declares no VPC Service Controls perimeter"),
    ({"useExplicitDryRunSpec": False, "spec": PERIMETER_SPEC}, "no project inside"),  # spec unused unless dry run
    ({"useExplicitDryRunSpec": True, "status": PERIMETER_SPEC}, "no project inside"),
    ({"status": {**PERIMETER_SPEC, "resources": []}}, "no project inside"),
    ({"status": {**PERIMETER_SPEC, "restrictedServices": ["container.googleapis.com"]}},
     "storage.googleapis.com, file.googleapis.com not restricted"),
    ({"status": {**PERIMETER_SPEC, "restrictedServices": ["storage.googleapis.com"]}},
     "file.googleapis.com not restricted"),
])  # fmt: skip
def test_prod_outside_a_perimeter_restricting_its_data_services_is_refused(props: dict | None, says: str | None
                                                                          ) -> None:
    resources = [Resource(rules.PERIMETER, "perimeter", "urn:perimeter", props)] if props is not None else []
    found = [message for _, message in rules.prod_service_perimeter(resources, PROD)]
    assert (found == []) if says is None else (len(found) == 1 and says in found[0]), found
    assert rules.prod_service_perimeter(resources, DEV) == []  # dev: off by default (it needs an organisation)
