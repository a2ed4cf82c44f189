"""The program under mocks, per stack file and per mode: issue 3 acceptance on the registered resources."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import pytest

from infra import contract, render, share_prep
from infra.image import docker_hub_path
from infra.render import Registered, Rendered
from policy.rules import LABELLED, UNLABELLED  # one list of which GCP types take labels
from tests.infra.pod_security import pod_security_violations

STACKS = render.stack_names()
Render = Callable[..., Rendered]

JOB = "kubernetes:batch/v1:Job"
CLUSTER = "gcp:container/cluster:Cluster"
NODE_POOL = "gcp:container/nodePool:NodePool"
FILESTORE = "gcp:filestore/instance:Instance"
COMPUTE_CLASS = "kubernetes:cloud.google.com/v1:ComputeClass"
ACCOUNT = "gcp:serviceaccount/account:Account"
IAM_MEMBER = "gcp:projects/iAMMember:IAMMember"
NETWORK = "gcp:compute/network:Network"
SUBNETWORK = "gcp:compute/subnetwork:Subnetwork"
CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"
DIGEST_REF = re.compile(r"^[a-z0-9.-]+-docker\.pkg\.dev/[^@\s]+@sha256:[0-9a-f]{64}$")


def pod_spec(job: Registered) -> dict[str, Any]:
    return job.inputs["spec"]["template"]["spec"]


def container(job: Registered) -> dict[str, Any]:
    (only,) = pod_spec(job)["containers"]
    return only


def workload_jobs(r: Rendered) -> list[Registered]:
    """Loader and training: the Jobs in the workloads' namespace (the share preparation is elsewhere)."""
    return [j for j in r.of_type(JOB) if j.inputs["metadata"]["namespace"] == r.config.namespace]


def test_every_stack_file_is_found() -> None:
    assert {"dev", "prod"} <= set(STACKS)


@pytest.mark.parametrize("stack", STACKS)
def test_stack_constructs_with_its_own_config(stack: str, rendered: Render) -> None:
    r = rendered(stack)
    assert r.config.stack == stack and r.config.labels.env == stack
    out = r.outputs
    assert out["clusterName"] == r.one(CLUSTER).outputs["name"]
    assert out["filestoreIp"] == render.FILESTORE_IP
    assert out["filestoreShare"] == r.config.filestore.share
    assert DIGEST_REF.match(out["imageRef"]) and out["imageRef"].endswith(render.IMAGE_DIGEST)
    assert out["redisService"] == f"redis.{r.config.namespace}.svc.cluster.local:6379"
    assert {out["loaderJob"], out["trainingJob"]} == {j.inputs["metadata"]["name"] for j in workload_jobs(r)}
    assert "gke-gcloud-auth-plugin" in out["kubeconfig"] and render.CLUSTER_ENDPOINT in out["kubeconfig"]
    assert {"logs", "status", "report", "queueStatus"} <= set(out["commands"])
    assert out["trainingJob"] in out["commands"]["status"]
    # Every output, as `pulumi stack output` shows it (without a bucket or a schedule: no scoring, no identities).
    n, loader, training = "-n spot-trainer", "spot-trainer-loader", "spot-trainer-worker"
    urn = f"urn:pulumi:{stack}::spot-trainer::spot-trainer:k8s"
    rerun_loader, rerun_training = f"'{urn}:LoaderJob$kubernetes:batch/v1:Job::loader'", (
        f"'{urn}:TrainingJob$kubernetes:batch/v1:Job::training'")
    commands = dict(out["commands"])
    one_off = {verb: commands.pop(verb) for verb in ("queueStatus", "report")}
    assert {k: v for k, v in out.items() if k not in ("kubeconfig", "commands")} == {
        "clusterName": "cluster",
        "filestoreIp": render.FILESTORE_IP,
        "filestoreShare": "share",
        "imageRef": out["imageRef"],
        "redisService": "redis.spot-trainer.svc.cluster.local:6379",
        "loaderJob": loader,
        "trainingJob": training,
        "scoringJob": "",
        "scheduledLoader": "",
        "gpuQuota": "PREEMPTIBLE-NVIDIA-L4-GPUS-per-project-region=16, "  # the fallback needs the standard quota too
        + ("NVIDIA-L4-GPUS-per-project-region=16, " if r.config.gpu.on_demand_fallback else "")
        + "GPUS-ALL-REGIONS-per-project=16",
        "datasetUri": "",
        "outputUri": "",
        "serviceAccounts": {},
    }
    assert commands == {
        "credentials": f"gcloud container clusters get-credentials cluster --region us-central1 --project "
        f"{render.FAKE_PROJECT_ID}",
        "status": f"kubectl {n} get job {loader} {training} -o wide",
        "pods": f"kubectl {n} get pods -l app.kubernetes.io/name=spot-trainer -o wide",
        "logs": f"kubectl {n} logs -f -l app.kubernetes.io/component=worker --prefix --max-log-requests=50",
        "wait": f"kubectl {n} wait --for=condition=complete job/{training} --timeout=24h",
        "rerunLoader": f"pulumi up --replace {rerun_loader}",
        "rerunTraining": f"pulumi up --replace {rerun_training}",
        "reload": f"pulumi up --replace {rerun_loader} --replace {rerun_training}",
        "export": {},
    }
    assert r.one(JOB, "loader").urn in rerun_loader and r.one(JOB, "training").urn in rerun_training
    # The training Job waits for the GPU quota check (checkGpuQuota, on by default) through its mark.
    assert r.one(JOB, "training").inputs["metadata"]["annotations"][contract.GPU_QUOTA_ANNOTATION] == "enough"
    # The one-off pods: the queue's status, and the reports on the share.
    run = {"queueStatus": (["status"], None), "report": ([], ["sh", "-c", "cat /mnt/share/output/*/report.txt"])}
    for verb, (args, command) in run.items():
        prefix = f"kubectl {n} run {args[0] if args else verb} --rm -i --restart=Never --image={out['imageRef']} "
        assert one_off[verb].startswith(prefix + "--overrides='") and one_off[verb].endswith("'")
        (pod,) = json.loads(one_off[verb][len(prefix + "--overrides='") : -1])["spec"]["containers"]
        assert (pod["name"], pod["args"], pod.get("command")) == (args[0] if args else verb, args, command)


def cluster_common(r: Rendered) -> dict[str, Any]:
    """The cluster inputs both modes share: the stack's VPC and its secondary ranges, private nodes with a public
    control plane, Workload Identity, the release channel, deletion protection and the cost labels."""
    return {
        "project": render.FAKE_PROJECT_ID,
        "location": "us-central1",
        "network": r.one(NETWORK).id,
        "subnetwork": r.one(SUBNETWORK).id,
        "ipAllocationPolicy": {"clusterSecondaryRangeName": "pods", "servicesSecondaryRangeName": "services"},
        "releaseChannel": {"channel": "REGULAR"},
        # Private nodes; the control plane stays reachable so `pulumi up` and kubectl work from a laptop.
        "privateClusterConfig": {"enablePrivateNodes": True, "enablePrivateEndpoint": False},
        "workloadIdentityConfig": {"workloadPool": f"{render.FAKE_PROJECT_ID}.svc.id.goog"},
        "deletionProtection": True,  # every stack (allowDataLoss lifts it)
        "resourceLabels": {"env": r.config.stack, "app": "spot-trainer", "team": "ml-platform"},
    }


def check_cluster_component(r: Rendered) -> Registered:
    """What both modes share around the cluster: its node account (GKE's least-privilege node role, bound before
    the cluster exists), the VPC wiring, every piece a child of the Cluster component, and the Kubernetes provider
    built from the cluster's endpoint and CA. Returns the cluster."""
    component = r.one("spot-trainer:gcp:Cluster", "cluster")
    cluster = r.one(CLUSTER, "cluster")
    account = r.one(ACCOUNT, "cluster-nodes")
    (role,) = r.of_type(IAM_MEMBER)
    assert role.name == "cluster-nodes-container.defaultNodeServiceAccount"
    assert role.inputs == {
        "project": render.FAKE_PROJECT_ID,
        "role": "roles/container.defaultNodeServiceAccount",
        "member": account.outputs["member"],
    }
    assert role.urn in cluster.dependencies  # nodes never start without their role
    assert cluster.property_dependencies["network"] == [r.one(NETWORK).urn]
    assert cluster.property_dependencies["subnetwork"] == [r.one(SUBNETWORK).urn]
    provider = r.one("pulumi:providers:kubernetes", "cluster")
    for child in (account, role, cluster, provider, *r.of_type(NODE_POOL)):
        assert child.parent == component.urn, child.urn
    assert provider.property_dependencies["kubeconfig"] == [cluster.urn]
    assert json.loads(provider.inputs["kubeconfig"]) == {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "gke-cluster",
                "cluster": {
                    "server": f"https://{render.CLUSTER_ENDPOINT}",
                    "certificate-authority-data": render.CLUSTER_CA,
                },
            }
        ],
        "contexts": [{"name": "gke-cluster", "context": {"cluster": "gke-cluster", "user": "gke-cluster"}}],
        "current-context": "gke-cluster",
        # The deployer's gcloud credentials, through GKE's plugin: no long-lived key in the kubeconfig.
        "users": [
            {
                "name": "gke-cluster",
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
    }
    assert r.outputs["kubeconfig"] == provider.inputs["kubeconfig"]
    return cluster


@pytest.mark.parametrize("stack", STACKS)
def test_autopilot_cluster_by_default(stack: str, rendered: Render) -> None:
    r = rendered(stack)
    cluster = check_cluster_component(r)
    account = r.one(ACCOUNT, "cluster-nodes")
    assert account.inputs == {
        "project": render.FAKE_PROJECT_ID,
        "accountId": f"spot-trainer-{stack}-nodes",
        "displayName": f"GKE nodes of spot-trainer ({stack})",
    }
    # binaryAuthorization, authorizedNetworks and a key of the stack's own: on in prod's stack file
    # (test_infra_hardening.py reads every control-plane setting).
    settings = r.config.cluster
    enforced = {"binaryAuthorization": {"evaluationMode": "PROJECT_SINGLETON_POLICY_ENFORCE"}} if (
        settings.binary_authorization) else {}  # fmt: skip
    if settings.authorized_networks:
        enforced["masterAuthorizedNetworksConfig"] = {
            "cidrBlocks": [{"cidrBlock": c, "displayName": c} for c in settings.authorized_networks]}
    if settings.secrets_kms_key:
        key = r.one("gcp:kms/cryptoKey:CryptoKey", "cluster-secrets")
        enforced["databaseEncryption"] = {"state": "ENCRYPTED", "keyName": key.id}
    assert cluster.inputs == cluster_common(r) | enforced | {
        "enableAutopilot": True,
        # Nodes Autopilot creates run as the stack's node account, not the Compute Engine default one.
        "clusterAutoscaling": {
            "autoProvisioningDefaults": {"serviceAccount": account.outputs["email"], "oauthScopes": [CLOUD_PLATFORM]}
        },
    }
    assert not r.of_type(NODE_POOL)
    assert r.one("pulumi:providers:kubernetes").dependencies == [cluster.urn]


def test_a_cluster_on_an_existing_vpc_names_it_in_the_stacks_project_and_region(rendered: Render) -> None:
    """A shared VPC is not created but addressed: the cluster names it under the stack's own project and region."""
    r = rendered("dev", network="shared-vpc", subnetwork="shared-sub")
    assert not r.of_type(NETWORK) and not r.of_type(SUBNETWORK)
    cluster = r.one(CLUSTER)
    assert (cluster.inputs["network"], cluster.inputs["subnetwork"]) == (
        f"projects/{render.FAKE_PROJECT_ID}/global/networks/shared-vpc",
        f"projects/{render.FAKE_PROJECT_ID}/regions/us-central1/subnetworks/shared-sub",
    )


def test_standard_cluster_has_a_spot_gpu_pool_that_training_pods_tolerate(rendered: Render) -> None:
    # A stack name whose slug does not fit the node account's id: cut to 24 characters, and the cut's
    # trailing '-' dropped (GCP's 6-30 characters, lowercase, digits and inner hyphens).
    r = rendered(
        "us-central-1-canary", clusterMode="standard", gpuCapacity="nodeSelector", gpuType="nvidia-tesla-t4",
        gpuCount=2, gpuMaxNodes=5, parallelism=2,
    )  # fmt: skip
    assert r.warnings == [
        "parallelism 2 > 1 run(s): 1 training pod(s) will wait on spot GPUs as hot standbys (a run trains on one "
        "worker at a time). Add runs (a sweep) or lower parallelism if that is not what you want to pay for."
    ]
    registered = check_cluster_component(r)
    account = r.one(ACCOUNT, "cluster-nodes")
    assert account.inputs == {
        "project": render.FAKE_PROJECT_ID,
        "accountId": "spot-trainer-us-central-nodes",
        "displayName": "GKE nodes of spot-trainer (us-central-1-canary)",
    }
    email = account.outputs["email"]
    # The default pool exists for a moment before it is removed: it too runs as the node account.
    assert registered.inputs == cluster_common(r) | {
        "removeDefaultNodePool": True,
        "initialNodeCount": 1,
        "nodeConfig": {"serviceAccount": email, "oauthScopes": [CLOUD_PLATFORM]},
        "datapathProvider": "ADVANCED_DATAPATH",  # enforces the Redis NetworkPolicy
    }

    # Both pools: zonal in the share's zone, autoscaled, repaired and upgraded by GKE, their nodes running as the
    # node account with the GKE metadata server (Workload Identity) and the cost labels.
    labels = {"env": "us-central-1-canary", "app": "spot-trainer", "team": "ml-platform"}
    node = {
        "serviceAccount": email,
        "oauthScopes": [CLOUD_PLATFORM],
        "workloadMetadataConfig": {"mode": "GKE_METADATA"},
        "resourceLabels": labels,
    }
    pool = {
        "project": render.FAKE_PROJECT_ID,
        "cluster": registered.id,
        "location": "us-central1",
        "nodeLocations": ["us-central1-a"],
        "management": {"autoRepair": True, "autoUpgrade": True},
    }
    system, gpu = r.one(NODE_POOL, "cluster-system"), r.one(NODE_POOL, "cluster-gpu-spot")
    # Redis and the loader: on-demand, never below one node, untainted.
    assert system.inputs == pool | {
        "initialNodeCount": 1,
        "autoscaling": {"minNodeCount": 1, "maxNodeCount": 3},
        "nodeConfig": node | {"machineType": "e2-standard-4"},
    }
    # Training: spot GPUs from zero to gpuMaxNodes, tainted so only the training pods land there.
    assert gpu.inputs == pool | {
        "initialNodeCount": 0,
        "autoscaling": {"minNodeCount": 0, "maxNodeCount": 5},
        "nodeConfig": node | {
            "machineType": "n1-standard-16",
            "spot": True,
            "guestAccelerators": [
                {"type": "nvidia-tesla-t4", "count": 2, "gpuDriverInstallationConfig": {"gpuDriverVersion": "LATEST"}}
            ],
            "taints": [{"key": "cloud.google.com/gke-spot", "value": "true", "effect": "NO_SCHEDULE"}],
        },
    }
    for each in (system, gpu):
        assert each.property_dependencies["cluster"] == [registered.urn]
    # Nothing Kubernetes goes to the cluster before it has nodes to run on.
    provider = r.one("pulumi:providers:kubernetes")
    assert set(provider.dependencies) == {registered.urn, system.urn, gpu.urn}

    # The training pods tolerate the GPU pool's taint.
    (taint,) = gpu.inputs["nodeConfig"]["taints"]
    effect = {
        "NO_SCHEDULE": "NoSchedule",
        "NO_EXECUTE": "NoExecute",
        "PREFER_NO_SCHEDULE": "PreferNoSchedule",
    }
    tolerated = pod_spec(r.one(JOB, "training"))["tolerations"]
    assert {
        "key": taint["key"],
        "operator": "Equal",
        "value": taint["value"],
        "effect": effect[taint["effect"]],
    } in (tolerated)


def test_training_pods_select_spot_gpus_through_the_compute_class(rendered: Render) -> None:
    r = rendered("dev")
    compute_class = r.one(COMPUTE_CLASS).inputs
    priorities = compute_class["spec"]["priorities"]
    assert priorities == [{"gpu": {"type": "nvidia-l4", "count": 1, "driverVersion": "latest"}, "spot": True}]
    assert compute_class["spec"]["whenUnsatisfiable"] == "DoNotScaleUp"
    training = r.one(JOB, "training")
    selector = pod_spec(training)["nodeSelector"]
    assert selector == {
        "cloud.google.com/compute-class": compute_class["metadata"]["name"],
        "topology.kubernetes.io/zone": r.config.zone,  # BASIC_HDD share: pinned to its zone
    }
    assert container(training)["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert r.one(COMPUTE_CLASS).urn in training.dependencies


def test_on_demand_fallback_comes_after_spot(rendered: Render) -> None:
    r = rendered("prod")
    assert r.config.gpu.on_demand_fallback
    priorities = r.one(COMPUTE_CLASS).inputs["spec"]["priorities"]
    assert [p["spot"] for p in priorities] == [True, False]
    # Four pods for one run: `pulumi up` says what the three idle ones may cost.
    assert r.warnings == [
        "parallelism 4 > 1 run(s): 3 training pod(s) will wait on spot GPUs, or on-demand ones while spot is out "
        "(onDemandFallback) as hot standbys (a run trains on one worker at a time). Add runs (a sweep) or lower "
        "parallelism if that is not what you want to pay for."
    ]
    assert "cloud.google.com/gke-spot" not in pod_spec(r.one(JOB, "training"))["nodeSelector"]


def test_node_selector_mode_requests_spot_and_the_accelerator(rendered: Render) -> None:
    r = rendered("dev", gpuCapacity="nodeSelector", gpuType="nvidia-h100-80gb", gpuCount=8, pinToShareZone=False)
    assert not r.of_type(COMPUTE_CLASS)
    spec = pod_spec(r.one(JOB, "training"))
    assert spec["nodeSelector"] == {
        "cloud.google.com/gke-spot": "true",
        "cloud.google.com/gke-accelerator": "nvidia-h100-80gb",
        # Autopilot installs the driver the pod asks for; the CUDA build of torch needs a recent one.
        "cloud.google.com/gke-gpu-driver-version": "latest",
    }
    assert container(r.one(JOB, "training"))["resources"]["limits"]["nvidia.com/gpu"] == "8"


@pytest.mark.parametrize("stack", STACKS)
def test_pv_points_at_the_filestore_ip_output_and_the_claim_binds_to_it(stack: str, rendered: Render) -> None:
    r = rendered(stack)
    instance = r.one(FILESTORE)
    pv = r.one("kubernetes:core/v1:PersistentVolume", "share")
    share = r.config.filestore.share
    assert pv.inputs["spec"]["nfs"] == {"server": render.FILESTORE_IP, "path": f"/{share}"}
    assert instance.urn in pv.dependencies  # the IP flows from the instance's output, not a literal
    assert pv.inputs["spec"]["accessModes"] == ["ReadWriteMany"]
    assert {k: v for k, v in instance.inputs["fileShares"].items() if k != "nfsExportOptions"} == {
        "name": share, "capacityGb": r.config.filestore.capacity_gb}  # the export options: test_infra_hardening.py
    assert instance.inputs["tier"] == r.config.filestore.tier

    pvc = r.one("kubernetes:core/v1:PersistentVolumeClaim", "share").inputs
    assert pvc["spec"]["volumeName"] == pv.inputs["metadata"]["name"]
    assert pvc["spec"]["storageClassName"] == "" and pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    for job in workload_jobs(r):
        volumes = {v["name"]: v for v in pod_spec(job)["volumes"]}
        (mount,) = [m for m in container(job)["volumeMounts"] if m["mountPath"] == contract.SHARE_DIR]
        assert volumes[mount["name"]]["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]


@pytest.mark.parametrize(
    "overrides", [{}, {"network": "shared", "subnetwork": "shared-us"}], ids=["created-vpc", "existing-vpc"]
)
def test_filestore_and_cluster_share_a_network(overrides: dict[str, str], rendered: Render) -> None:
    r = rendered("dev", **overrides)
    cluster = r.one(CLUSTER).inputs
    (fs_network,) = r.one(FILESTORE).inputs["networks"]
    assert fs_network["connectMode"] == "DIRECT_PEERING"
    if overrides:
        assert not r.of_type("gcp:compute/network:Network")
        assert cluster["network"].endswith(f"/networks/{overrides['network']}")
        assert fs_network["network"] == overrides["network"]
    else:
        vpc = r.one("gcp:compute/network:Network")
        assert cluster["network"] == vpc.id
        assert fs_network["network"] == vpc.outputs["name"]
        subnet = r.one("gcp:compute/subnetwork:Subnetwork")
        assert cluster["subnetwork"] == subnet.id
        ranges = {x["rangeName"] for x in subnet.inputs["secondaryIpRanges"]}
        policy = cluster["ipAllocationPolicy"]
        assert {policy["clusterSecondaryRangeName"], policy["servicesSecondaryRangeName"]} == ranges
        assert r.of_type("gcp:compute/routerNat:RouterNat")  # private nodes need egress


def test_public_nodes_need_no_nat(rendered: Render) -> None:
    r = rendered("dev", privateNodes=False)
    assert not r.of_type("gcp:compute/routerNat:RouterNat")


@pytest.mark.parametrize("stack", STACKS)
def test_redis_requires_the_password_from_the_secret(stack: str, rendered: Render) -> None:
    r = rendered(stack)
    secret = r.one("kubernetes:core/v1:Secret").inputs
    password = secret["stringData"][contract.REDIS_PASSWORD_KEY]
    assert len(password) >= 32
    deployment = r.one("kubernetes:apps/v1:Deployment").inputs
    assert password not in repr(deployment)  # never on a command line or in the spec
    pod = deployment["spec"]["template"]["spec"]
    (redis,) = pod["containers"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    auth_mount = next(m for m in redis["volumeMounts"] if volumes[m["name"]].get("secret"))
    auth = volumes[auth_mount["name"]]["secret"]
    assert auth["secretName"] == secret["metadata"]["name"]
    (item,) = auth["items"]
    # redis-server's first argument is that config file, which holds `requirepass <password>`.
    assert redis["args"][0] == f"{auth_mount['mountPath']}/{item['path']}"
    assert secret["stringData"][item["key"]] == f"requirepass {password}\n"
    assert redis["args"][redis["args"].index("--appendonly") + 1] == "yes"
    data_mount = next(m for m in redis["volumeMounts"] if volumes[m["name"]].get("persistentVolumeClaim"))
    assert redis["args"][redis["args"].index("--dir") + 1] == data_mount["mountPath"]
    assert "@sha256:" in redis["image"]
    assert redis["readinessProbe"] and redis["resources"]["requests"]
    service = r.one("kubernetes:core/v1:Service").inputs["spec"]
    assert service["type"] == "ClusterIP" and service["ports"][0]["port"] == contract.REDIS_PORT
    # Loader and workers get the same password from the same Secret, and no password in the URL.
    for job in workload_jobs(r):
        env = {e["name"]: e for e in container(job)["env"]}
        ref = env[contract.ENV_REDIS_PASSWORD]["valueFrom"]["secretKeyRef"]
        assert ref == {"name": secret["metadata"]["name"], "key": contract.REDIS_PASSWORD_KEY}
        assert env[contract.ENV_REDIS_URL]["value"] == f"redis://{r.outputs['redisService']}/0"


def _admits(policy: dict[str, Any], labels: dict[str, str]) -> bool:
    for rule in policy["spec"]["ingress"]:
        for peer in rule["from"]:
            selector = peer["podSelector"]
            if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
                continue
            if all(labels.get(e["key"]) in e["values"] for e in selector.get("matchExpressions", [])):
                return True
    return False


@pytest.mark.parametrize("stack", STACKS)
def test_network_policy_admits_only_loader_and_worker_pods_on_6379(stack: str, rendered: Render) -> None:
    r = rendered(stack)
    policy = r.one("kubernetes:networking.k8s.io/v1:NetworkPolicy", "redis").inputs
    redis_pod = r.one("kubernetes:apps/v1:Deployment").inputs["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"] == {"matchLabels": redis_pod}
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert [rule["ports"] for rule in policy["spec"]["ingress"]] == [[{"protocol": "TCP", "port": 6379}]]
    for job in workload_jobs(r):
        assert _admits(policy, job.inputs["spec"]["template"]["metadata"]["labels"])
    # The share preparation, where the stack declares it (not with root squash: prod).
    for prep in r.of_type(JOB):
        if prep.name == "share-prep":
            assert not _admits(policy, prep.inputs["spec"]["template"]["metadata"]["labels"])
    assert not _admits(policy, redis_pod)
    assert not _admits(policy, {contract.NAME_LABEL: contract.APP, contract.COMPONENT_LABEL: "debug"})
    assert not _admits(policy, {contract.NAME_LABEL: "other-app", contract.COMPONENT_LABEL: contract.WORKER})


@pytest.mark.parametrize("stack", STACKS)
def test_both_jobs_run_the_pushed_image_by_digest(stack: str, rendered: Render) -> None:
    r = rendered(stack)
    image = r.one("docker-build:index:Image")
    assert image.inputs["push"] is True and image.inputs["platforms"] == ["linux/amd64"]
    assert image.inputs["context"]["location"].endswith("workload")
    assert image.inputs["dockerfile"]["location"].endswith("workload/Dockerfile")
    (registry,) = image.inputs["registries"]
    assert registry["password"] == render.ACCESS_TOKEN and registry["username"] == "oauth2accesstoken"
    # Previews do not build the CUDA image; builds reuse layers from a registry cache beside the image.
    assert image.inputs["buildOnPreview"] is False
    repository = image.inputs["tags"][0].rsplit(":", 1)[0]
    assert image.inputs["cacheFrom"] == [{"registry": {"ref": f"{repository}:buildcache"}}]
    (cache_to,) = image.inputs["cacheTo"]  # the SDK fills the other fields with their defaults
    assert cache_to["registry"] | {"ref": f"{repository}:buildcache", "mode": "max", "imageManifest": True,
                                   "ociMediaTypes": True} == cache_to["registry"]  # fmt: skip
    for job in r.of_type(JOB):
        assert container(job)["image"] == r.outputs["imageRef"]
        assert image.urn in job.dependencies
    # One Docker repository per stack, which the nodes' own account may read, and nothing more.
    component = r.one("spot-trainer:build:TrainingImage", "image")
    repo = r.one("gcp:artifactregistry/repository:Repository", "image")
    assert repo.inputs == {
        "project": render.FAKE_PROJECT_ID,
        "location": "us-central1",
        "repositoryId": f"spot-trainer-{stack}",
        "format": "DOCKER",
        "description": "Training images of spot-trainer",
        "labels": {"env": stack, "app": "spot-trainer", "team": "ml-platform"},
    }
    grant = r.one("gcp:artifactregistry/repositoryIamMember:RepositoryIamMember", "image-node-reader")
    assert grant.inputs == {
        "project": render.FAKE_PROJECT_ID,
        "location": "us-central1",
        "repository": f"spot-trainer-{stack}",
        "role": "roles/artifactregistry.reader",
        "member": r.one(ACCOUNT, "cluster-nodes").outputs["member"],
    }
    assert grant.property_dependencies["repository"] == [repo.urn]
    url = f"us-central1-docker.pkg.dev/{render.FAKE_PROJECT_ID}/spot-trainer-{stack}/trainer"
    assert image.inputs["tags"] == [f"{url}:{stack}"]
    assert registry["address"] == "us-central1-docker.pkg.dev"
    assert repo.urn in image.dependencies  # pushed only once the repository exists
    for child in (repo, grant, image):
        assert child.parent == component.urn, child.urn
    # The reference names the pushed digest, and whatever runs it waits for the nodes' read access.
    assert r.outputs["imageRef"] == f"{url}@{render.IMAGE_DIGEST}"
    for job in r.of_type(JOB):
        assert grant.urn in job.dependencies


@pytest.mark.parametrize("stack", STACKS)
def test_redis_comes_through_the_stacks_own_docker_hub_proxy_still_by_digest(stack: str, rendered: Render) -> None:
    """Issue 36: Redis from the stack's own registry. An Artifact Registry remote repository of Docker Hub
    (mode REMOTE_REPOSITORY, publicRepository DOCKER_HUB), which the nodes may read; the Redis pods name the
    image through it with redisImage's digest, and wait for the read grant."""
    r = rendered(stack)
    hub = r.one("gcp:artifactregistry/repository:Repository", "image-docker-hub")
    assert hub.inputs["mode"] == "REMOTE_REPOSITORY" and hub.inputs["format"] == "DOCKER"
    assert hub.inputs["remoteRepositoryConfig"]["dockerRepository"] == {"publicRepository": "DOCKER_HUB"}
    assert hub.inputs["repositoryId"] == f"spot-trainer-{stack}-hub"
    grant = r.one("gcp:artifactregistry/repositoryIamMember:RepositoryIamMember", "image-docker-hub-node-reader")
    assert grant.inputs["member"] == r.one(ACCOUNT, "cluster-nodes").outputs["member"]
    assert grant.inputs["role"] == "roles/artifactregistry.reader"
    assert grant.property_dependencies["repository"] == [hub.urn]
    (redis,) = r.of_type("kubernetes:apps/v1:Deployment")
    name, digest = r.config.redis_image.split("@")
    assert redis.inputs["spec"]["template"]["spec"]["containers"][0]["image"] == (
        f"us-central1-docker.pkg.dev/{render.FAKE_PROJECT_ID}/spot-trainer-{stack}-hub/library/{name}@{digest}")
    assert grant.urn in redis.dependencies


@pytest.mark.parametrize("stack", STACKS)
def test_training_job_is_a_preemption_tolerant_work_queue(stack: str, rendered: Render) -> None:
    r = rendered(stack)
    jobs = r.config.jobs
    spec = r.one(JOB, "training").inputs["spec"]
    assert spec["parallelism"] == jobs.parallelism
    assert "completions" not in spec and "ttlSecondsAfterFinished" not in spec
    assert spec["backoffLimit"] == jobs.backoff_limit
    assert spec["activeDeadlineSeconds"] == jobs.active_deadline_seconds
    # First match wins: a preempted pod is ignored whatever its exit code; exit 2 (bad config) counts
    # (tests/infra/test_infra_jobs.py plays the rules through the Job controller's semantics).
    assert spec["podFailurePolicy"]["rules"] == [
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
        {
            "action": "Ignore",
            "onExitCodes": {"containerName": contract.WORKER, "operator": "In", "values": [5, 143]},
        },
        {
            "action": "Count",
            "onExitCodes": {"containerName": contract.WORKER, "operator": "In", "values": [2]},
        },
        # Redis or the share down for the pod's whole retry budget (infraRetryBudgetMinutes): fail.
        {
            "action": "FailJob",
            "onExitCodes": {"containerName": contract.WORKER, "operator": "In", "values": [3]},
        },
        # A GPU that CUDA cannot use fails the Job at once (workload/runtime/gpu.py).
        {
            "action": "FailJob",
            "onExitCodes": {"containerName": contract.WORKER, "operator": "In", "values": [6]},
        },
    ]
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    assert pod["terminationGracePeriodSeconds"] <= 15
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    c = container(r.one(JOB, "training"))
    assert c["args"] == ["worker"]
    assert c["resources"]["requests"]["cpu"] == jobs.worker_cpu
    assert c["resources"]["requests"]["memory"] == jobs.worker_memory


@pytest.mark.parametrize("stack", STACKS)
def test_workload_namespace_enforces_the_restricted_pod_security_standard(
    stack: str, rendered: Render
) -> None:
    r = rendered(stack)
    namespace = r.one("kubernetes:core/v1:Namespace", "namespace").inputs["metadata"]
    assert namespace["name"] == r.config.namespace
    assert namespace["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    namespaced = [
        m for m in r.manifests() if m["kind"] not in ("Namespace", "PersistentVolume", "ComputeClass")
    ]
    prep = share_prep.prep_namespace(r.config.namespace)
    # The preparation's namespace, unless root squash leaves the share root to no one (prod: docs/cloud.md).
    prepared = not r.config.filestore.root_squash
    assert {m["metadata"]["namespace"] for m in namespaced} == {r.config.namespace, *([prep] if prepared else [])}
    # Only the share preparation (its Job and claim, and the namespace's default deny) lives in the other namespace.
    assert {(m["kind"], m["metadata"]["name"]) for m in namespaced if m["metadata"]["namespace"] == prep} == ({
        ("Job", "spot-trainer-share-prep"), ("PersistentVolumeClaim", "share"), ("NetworkPolicy", "default-deny"),
    } if prepared else set())  # fmt: skip
    for m in namespaced:
        if m["metadata"]["namespace"] == r.config.namespace and m["kind"] in ("Job", "Deployment"):
            assert pod_security_violations(m["spec"]["template"]["spec"], "restricted") == [], m["metadata"]


@pytest.mark.parametrize("stack", STACKS)
def test_pods_follow_the_worker_image_contract(stack: str, rendered: Render) -> None:
    r = rendered(stack)
    jobs = r.config.jobs
    for job in workload_jobs(r):
        component = job.inputs["metadata"]["labels"][contract.COMPONENT_LABEL]
        assert job.inputs["spec"]["template"]["metadata"]["labels"] == contract.labels(component)
        pod = pod_spec(job)
        assert pod["securityContext"] == {
            "runAsNonRoot": True,
            "runAsUser": 10001,
            "runAsGroup": 10001,
            "fsGroup": 10001,
            "seccompProfile": {"type": "RuntimeDefault"},
        }
        c = container(job)
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
        assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        env = {e["name"]: e for e in c["env"]}
        assert env["SHARE_DIR"]["value"] == "/mnt/share"
        assert env["WORKER_ID"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
        assert env["LEASE_TTL_SECONDS"]["value"] == str(jobs.lease_ttl_seconds)
        assert env["CHECKPOINT_INTERVAL_SECONDS"]["value"] == str(jobs.checkpoint_interval_seconds)
        assert env["MAX_ATTEMPTS"]["value"] == str(jobs.max_attempts)
    loader = container(r.one(JOB, "loader"))
    assert loader["args"] == [
        "seed", "--runs-file", contract.RUNS_FILE, "--dataset", "fraud", "--preset", jobs.dataset_preset,
    ]  # fmt: skip


@pytest.mark.parametrize("stack", STACKS)
def test_training_job_starts_after_the_loader_job(stack: str, rendered: Render) -> None:
    r = rendered(stack)
    loader, training = r.one(JOB, "loader"), r.one(JOB, "training")
    assert loader.urn in training.dependencies
    redis = r.one("kubernetes:apps/v1:Deployment")
    assert redis.urn in loader.dependencies
    # The loader is always awaited: workers that start on an unseeded queue would see it drained.
    assert loader.custom_timeouts["create"] == f"{r.config.jobs.loader_timeout_minutes}m"
    assert "annotations" not in loader.inputs["metadata"]
    assert loader.delete_before_replace and training.delete_before_replace


@pytest.mark.parametrize("mode", ["wait", "skip"])
def test_job_await_mode_is_chosen_by_config(mode: str, rendered: Render) -> None:
    r = rendered("dev", jobAwait=mode, jobTimeoutMinutes=45)
    training = r.one(JOB, "training")
    annotations = training.inputs["metadata"].get("annotations", {})
    if mode == "wait":
        assert training.custom_timeouts == {"create": "45m", "update": "45m"}
        assert "pulumi.com/skipAwait" not in annotations
    else:
        # (besides the GPU quota check's mark, tests/infra/test_infra_quota.py)
        assert {k: v for k, v in annotations.items() if k != contract.GPU_QUOTA_ANNOTATION} == {
            "pulumi.com/skipAwait": "true"
        }
        assert training.custom_timeouts == {}


@pytest.mark.parametrize("mode", ["autopilot", "standard"])
@pytest.mark.parametrize("stack", STACKS)
def test_every_labellable_gcp_resource_carries_the_cost_labels(
    stack: str, mode: str, rendered: Render
) -> None:
    overrides = {"clusterMode": mode, "gpuCapacity": "nodeSelector", "onDemandFallback": False}
    r = rendered(stack, **(overrides if mode == "standard" else {}))
    expected = {"env": stack, "app": "spot-trainer", "team": r.config.labels.team}
    for res in r.resources:
        if not res.type.startswith("gcp:"):
            continue
        assert res.type in LABELLED or res.type in UNLABELLED, f"decide whether {res.type} takes labels"
        if res.type in LABELLED:
            labels = res.inputs
            for key in LABELLED[res.type]:
                labels = labels[key]
            assert labels == expected, res.urn


@pytest.mark.parametrize("stack", STACKS)
def test_gcp_resources_wait_for_the_project_apis(stack: str, rendered: Render) -> None:
    r = rendered(stack)
    services = r.of_type("gcp:projects/service:Service")
    # Without a bucket (datasetUri, outputUri) no Cloud Storage nor IAM Credentials (test_infra_data.py).
    apis = ("container", "file", "artifactregistry", "compute", "iam", "cloudresourcemanager", "cloudquotas") + (
        ("binaryauthorization", "containeranalysis") if r.config.cluster.binary_authorization else ()) + (
        ("cloudkms",) if "stack" in (r.config.cluster.secrets_kms_key, r.config.filestore.kms_key)
        or r.config.cluster.binary_authorization else ()) + (
        ("accesscontextmanager",) if r.config.perimeter.on else ())  # fmt: skip
    # disableOnDestroy: the provider's default (true) would turn an API off for the whole project on destroy.
    assert {s.name: s.inputs for s in services} == {
        api: {"project": render.FAKE_PROJECT_ID, "service": f"{api}.googleapis.com", "disableOnDestroy": False}
        for api in apis
    }
    component = r.one("spot-trainer:gcp:ProjectServices", "services")
    assert {s.parent for s in services} == {component.urn}
    provider = r.one("pulumi:providers:gcp", "gcp")
    assert set(provider.dependencies) == {s.urn for s in services}
    assert provider.inputs == {"project": render.FAKE_PROJECT_ID, "region": "us-central1"}
    provider_ref = f"{provider.urn}::{provider.id}"
    for res in r.resources:
        if res.type.startswith("gcp:") and res not in services:
            assert res.provider == provider_ref, res.urn
    # Provider functions too (the deployer's token; the GPU quota through its own provider, which bills the
    # stack's project and waits for the same APIs, infra/quota.py): no default provider is ever created.
    billed = r.one("pulumi:providers:gcp", "gpu-quota")
    assert {s.urn for s in services} <= set(billed.dependencies)
    assert {c.token: c.provider for c in r.calls} == {
        "gcp:organizations/getClientConfig:getClientConfig": provider_ref,
        "gcp:cloudquota/getSQuotaInfo:getSQuotaInfo": f"{billed.urn}::{billed.id}",
        # secretsKmsKey "stack": the project number names GKE's service agent (infra/cluster.py).
        **({"gcp:organizations/getProject:getProject": provider_ref} if (
            r.config.cluster.secrets_kms_key == "stack") else {}),  # fmt: skip
        # binaryAuthorization: the attestation key's public key, and who runs `up` (infra/binauthz.py).
        **({"gcp:kms/getKMSCryptoKeyVersion:getKMSCryptoKeyVersion": provider_ref,
            "gcp:organizations/getClientOpenIdUserInfo:getClientOpenIdUserInfo": provider_ref} if (
            r.config.cluster.binary_authorization) else {}),  # fmt: skip
    }


@pytest.mark.parametrize("stack", STACKS)
def test_kubernetes_objects_use_the_cluster_provider(stack: str, rendered: Render) -> None:
    r = rendered(stack)
    provider = r.one("pulumi:providers:kubernetes")
    assert r.one(CLUSTER).urn in provider.dependencies  # kubeconfig comes from the cluster's outputs
    for res in r.kubernetes():
        assert res.provider == f"{provider.urn}::{provider.id}", res.urn


@pytest.mark.parametrize("stack", STACKS)
def test_components_own_their_children(stack: str, rendered: Render) -> None:
    r = rendered(stack)
    components = {res.urn for res in r.resources if res.type.startswith("spot-trainer:")}
    # By type and name: the names are in every child's URN (a renamed component is replaced with its children).
    assert sorted((res.type, res.name) for res in r.resources if res.urn in components) == sorted([
        ("spot-trainer:build:TrainingImage", "image"), ("spot-trainer:gcp:Cluster", "cluster"),
        ("spot-trainer:gcp:Network", "network"), ("spot-trainer:gcp:ProjectServices", "services"),
        ("spot-trainer:k8s:GpuCapacity", "gpu"), ("spot-trainer:k8s:LoaderJob", "loader"),
        ("spot-trainer:k8s:NamespacePolicies", "network-policy"),
        ("spot-trainer:k8s:RedisQueue", "redis"), ("spot-trainer:k8s:TrainingJob", "training"),
        ("spot-trainer:storage:FilestoreShare", "share"),
        *([("spot-trainer:storage:SharePreparation", "share-prep")] if not r.config.filestore.root_squash else []),
        *((("spot-trainer:gcp:BinaryAuthorization", "binauthz"),) if r.config.cluster.binary_authorization else ()),
        *([("spot-trainer:gcp:ServicePerimeter", "perimeter")] if r.config.perimeter.on else []),
    ], key=str)  # fmt: skip
    loose = {
        res.type
        for res in r.resources
        if not res.type.startswith("spot-trainer:") and res.parent not in components
    }
    # Only the composition's own glue sits at the top: the gcp provider and the namespace.
    assert loose == {"pulumi:providers:gcp", "kubernetes:core/v1:Namespace"}


def test_stacks_can_share_a_project(rendered: Render) -> None:
    """Explicitly named GCP resources carry the stack, so dev and prod can live in one project."""

    def names(r: Rendered) -> set[str]:
        return {
            *(repo.inputs["repositoryId"] for repo in r.of_type("gcp:artifactregistry/repository:Repository")),
            r.one("gcp:serviceaccount/account:Account").inputs["accountId"],
        }

    assert not names(rendered("dev")) & names(rendered("prod"))


@pytest.mark.parametrize("stack", STACKS)
def test_the_share_is_created_after_the_subnet(stack: str, rendered: Render) -> None:
    """The instance names only the VPC; without an explicit dependency it was created beside the subnet."""
    r = rendered(stack)
    subnet = r.one("gcp:compute/subnetwork:Subnetwork")
    assert subnet.urn in r.one(FILESTORE).dependencies
    existing = rendered(stack, network="shared-vpc", subnetwork="shared-subnet", filestoreClientRanges=["10.8.0.0/20"])
    assert not existing.of_type("gcp:compute/subnetwork:Subnetwork") and existing.one(FILESTORE)


OUTPUT_URI = "gs://acme-results/spot-trainer/main"


@pytest.mark.parametrize("stack", STACKS)
def test_an_output_bucket_adds_the_scoring_job_and_the_workers_identity_in_the_stacks_namespace(
    stack: str, rendered: Render
) -> None:
    """With outputUri (the way test_infra_scoring.py renders it): the workers' Kubernetes service account and the
    scoring Job are created in the stack's namespace (after the Namespace itself, whose name they take) through
    the cluster's provider, and the outputs name the Job and the bucket's URI."""
    r = rendered(stack, outputUri=OUTPUT_URI)
    namespace = r.one("kubernetes:core/v1:Namespace", "namespace")
    provider = r.one("pulumi:providers:kubernetes")
    provider_ref = f"{provider.urn}::{provider.id}"
    identity = r.one("spot-trainer:iam:WorkloadIdentity", "worker-identity")
    granted = [res for res in r.kubernetes() if res.parent == identity.urn]
    assert [(res.type, res.name) for res in granted] == [("kubernetes:core/v1:ServiceAccount", "worker-identity")]
    scoring = r.one(JOB, "scoring")
    for res in (*granted, scoring):
        assert res.inputs["metadata"]["namespace"] == r.config.namespace, res.urn
        assert namespace.urn in res.dependencies, res.urn
        assert res.provider == provider_ref, res.urn
    assert r.outputs["scoringJob"] == scoring.inputs["metadata"]["name"] == "spot-trainer-scorer"
    assert r.outputs["outputUri"] == OUTPUT_URI


def test_no_quota_lookup_and_not_checked_with_check_gpu_quota_off(rendered: Render) -> None:
    """checkGpuQuota=false: the Cloud Quotas API is never asked, and the output says so in these words."""
    r = rendered("dev", checkGpuQuota=False)
    assert [c.token for c in r.calls] == ["gcp:organizations/getClientConfig:getClientConfig"]
    assert r.outputs["gpuQuota"] == "not checked"


def test_the_quota_check_reads_the_limits_of_the_stacks_region(monkeypatch: pytest.MonkeyPatch) -> None:
    """The spot quota is per region: the check reads the stack's region's row (8 here), no other region's."""
    spot = "PREEMPTIBLE-NVIDIA-L4-GPUS-per-project-region"
    monkeypatch.setattr(render, "GPU_QUOTAS", {spot: {"europe-west4": 32, "us-central1": 8}})
    r = render.render("dev")  # not the cached fixture: the quotas differ from every other test's
    assert r.config.region == "us-central1"
    assert r.outputs["gpuQuota"] == f"{spot}=8, GPUS-ALL-REGIONS-per-project=16"


@pytest.mark.parametrize("stack", STACKS)
def test_the_quota_lookup_waits_for_the_project_apis(stack: str, rendered: Render) -> None:
    """The lookup reads the Cloud Quotas API only once the APIs are enabled (depends_on): the mock engine keeps
    no dependencies of a provider function call, but its result carries them into the training Job's metadata
    (the quota check's mark), so they show there, every API's, besides the other metadata's own."""
    r = rendered(stack)
    training = r.one(JOB, "training")
    assert {s.urn for s in r.of_type("gcp:projects/service:Service")} <= set(training.property_dependencies["metadata"])
    unchecked = rendered(stack, checkGpuQuota=False).one(JOB, "training")
    assert not any(":projects/service:Service::" in urn for urn in unchecked.property_dependencies.get("metadata", []))


@pytest.mark.parametrize(
    ("image", "path"),
    [
        ("redis:7.4-alpine@sha256:" + "a" * 64, "library/redis:7.4-alpine@sha256:" + "a" * 64),
        ("docker.io/redis@sha256:" + "a" * 64, "library/redis@sha256:" + "a" * 64),
        ("docker.io/bitnami/redis@sha256:" + "a" * 64, "bitnami/redis@sha256:" + "a" * 64),
        ("bitnami/redis@sha256:" + "a" * 64, "bitnami/redis@sha256:" + "a" * 64),
        ("gcr.io/acme/redis@sha256:" + "a" * 64, None),  # another registry: used as given
        ("localhost:5000/redis@sha256:" + "a" * 64, None),
    ],
)
def test_a_docker_hub_image_is_found_by_its_path_in_the_proxy(image: str, path: str | None) -> None:
    assert docker_hub_path(image) == path
