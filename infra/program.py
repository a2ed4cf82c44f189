"""Composition of the stack: config in, components wired together, outputs out.

``__main__.py`` calls ``build`` under the Pulumi engine; ``infra.render`` calls it under mocks. This is
the one place that cuts the validated ``StackConfig`` into the typed slices the components take (the
``*_args`` functions below; the component tests build them the same way).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_gcp as gcp
import pulumi_kubernetes as k8s

from infra import contract
from infra.binauthz import BinaryAuthorization, BinauthzArgs
from infra.cluster import Cluster, ClusterArgs
from infra.config import STACK_KEY, StackConfig
from infra.filestore import FilestoreArgs, FilestoreShare
from infra.gpu import GpuArgs, GpuCapacity
from infra.identity import (
    READ_OBJECTS,
    WRITE_OBJECTS,
    BucketGrant,
    IdentityArgs,
    WorkloadIdentity,
    uniform_access_checked,
)
from infra.image import ImageArgs, TrainingImage
from infra.jobs import JobArgs, LoaderJob, ScoringArgs, ScoringJob, TrainingArgs, TrainingJob, one_off_pod
from infra.kube import InCluster
from infra.network import Network, NetworkArgs
from infra.network_policy import NamespacePolicies, PolicyArgs
from infra.perimeter import PerimeterArgs, ServicePerimeter
from infra.platform import Identities, Platform
from infra.quota import check as check_gpu_quota
from infra.redis import RedisArgs, RedisQueue
from infra.schedule import ScheduleArgs, ScheduledLoad
from infra.services import ProjectServices, apis
from infra.share_prep import SharePreparation


def network_args(cfg: StackConfig) -> NetworkArgs:
    return NetworkArgs(cfg.project_id, cfg.region, cfg.network, private_nodes=cfg.cluster.private_nodes)


def cluster_args(cfg: StackConfig) -> ClusterArgs:
    return ClusterArgs(cfg.site, cfg.cluster, cfg.network, cfg.gpu)


def filestore_args(cfg: StackConfig) -> FilestoreArgs:
    # The share is protected whenever the cluster is: one setting (deletionProtection) for both.
    return FilestoreArgs(cfg.site, cfg.filestore, protected=cfg.cluster.deletion_protection)


def job_args(cfg: StackConfig) -> JobArgs:
    zone = cfg.zone if cfg.filestore.pin_to_zone else None
    gpus = 0 if cfg.gpu.on_cpu else cfg.gpu.count  # trainOn=cpu: training pods ask for no GPU
    return JobArgs(cfg.namespace, cfg.jobs, cfg.data, gpu_count=gpus, share_zone=zone)


def workload_namespace(cfg: StackConfig, provider: k8s.Provider) -> InCluster:
    """The stack's namespace, where every workload object goes."""
    namespace = k8s.core.v1.Namespace(
        "namespace",
        metadata={
            "name": cfg.namespace,
            # Every pod here is non-root with a RuntimeDefault seccomp profile: enforce it.
            "labels": {contract.NAME_LABEL: contract.APP, "pod-security.kubernetes.io/enforce": "restricted"},
        },
        opts=pulumi.ResourceOptions(provider=provider),
    )
    return InCluster(provider, namespace.metadata.name, cfg.namespace)


def _identity(
    cfg: StackConfig, kube: InCluster, workload_pool: pulumi.Input[str], grant: BucketGrant, on_gcp: Any
) -> WorkloadIdentity:
    component, key = (contract.LOADER, "datasetUri") if grant.role == READ_OBJECTS else (contract.WORKER, "outputUri")
    # The grant's bucket is read first: a conditional grant on a bucket without uniform bucket-level access
    # fails the preview with one line, not the `up` halfway.
    provider = (on_gcp.providers or {}).get("gcp") if isinstance(on_gcp.providers, dict) else None
    bucket = uniform_access_checked(grant, key, provider, provider.urn if provider else None)
    args = IdentityArgs(cfg.site, workload_pool, component, (grant,), checked_buckets=(bucket,))
    return WorkloadIdentity(f"{component}-identity", args, kube, opts=on_gcp)


def platform(
    cfg: StackConfig,
    kube: InCluster,
    image: pulumi.Input[str],
    network: Network,
    workload_pool: pulumi.Input[str],
    on_gcp: pulumi.ResourceOptions,
    redis_image: pulumi.Input[str] | None = None,
) -> Platform:
    """The share, the queue and the Google identities: what every workload is wired to. ``redis_image``: the
    Redis image as nodes pull it (through the stack's Docker Hub proxy); ``redisImage`` as given when not."""
    share = FilestoreShare("share", filestore_args(cfg), network, kube, opts=on_gcp)
    queue = RedisQueue("redis", RedisArgs(redis_image or cfg.redis_image), kube)
    # Only pods that need the bucket get a Google identity, and only with datasetUri / outputUri set.
    data = cfg.data
    # The loader reads under datasetUri's prefix only (a whole bucket when it names none).
    loader = _identity(cfg, kube, workload_pool, BucketGrant(READ_OBJECTS, data.dataset,
                       prefix_only=bool(data.dataset.prefix)), on_gcp) if data.dataset else None  # fmt: skip
    worker = _identity(cfg, kube, workload_pool, BucketGrant(WRITE_OBJECTS, data.output, prefix_only=True),
                       on_gcp) if data.output else None  # fmt: skip
    return Platform(kube, image, Identities(loader=loader, worker=worker), share, queue)


@dataclass(frozen=True)
class Workloads:
    """The stack's Jobs and what they run on (``None``: not declared by this stack's config)."""

    capacity: GpuCapacity
    loader: LoaderJob
    training: TrainingJob
    scoring: ScoringJob | None
    scheduled: ScheduledLoad | None


def policy_args(cfg: StackConfig, platform: Platform, control_plane: pulumi.Input[str]) -> PolicyArgs:
    """Which pods call Google APIs (those with an identity; one-off export pods are labelled loader), and
    which one posts Jobs to the control plane (the launcher, with ``schedule``)."""
    ids = platform.identities
    clients = ((contract.LOADER,) if ids.loader or ids.worker else ()) + (
        (contract.WORKER, contract.SCORER) if ids.worker else ())  # fmt: skip
    launcher = contract.LAUNCHER if cfg.jobs.schedule and ids.loader else None
    return PolicyArgs(clients, cfg.network.api_egress_cidr, launcher, control_plane)


def workloads(
    cfg: StackConfig, platform: Platform, control_plane: pulumi.Input[str], quota: pulumi.Input[str] | None = None
) -> Workloads:
    """The Jobs, in the order they run: share preparation, loader, training, scoring; and the schedule; the
    namespace's network policies. ``control_plane``: the cluster endpoint's address; ``quota``: the GPU quota
    check's result, which the training Job waits for."""
    NamespacePolicies("network-policy", policy_args(cfg, platform, control_plane), platform.kube)
    capacity = GpuCapacity("gpu", GpuArgs(cfg.gpu, cfg.cluster.autopilot), platform.provider)
    work = job_args(cfg)
    # The share starts root-owned: hand it to the workloads' uid before the loader writes to it. Not with
    # filestoreRootSquash (root on a client is squashed and could not), which is turned on once that is done: the
    # `up` that creates a share runs without it (infra/filestore.py _export_options, docs/cloud.md).
    prepared = None if cfg.filestore.root_squash else SharePreparation("share-prep", platform)
    loader = LoaderJob("loader", work, platform, after=[prepared.job] if prepared else [])
    training = TrainingJob("training", TrainingArgs(work, capacity, loader, quota), platform)
    # With outputUri: the scoring/ days are scored by the newest models after training.
    scoring = ScoringJob("scoring", ScoringArgs(work, training, loader), platform) if (
        platform.identities.worker) else None  # fmt: skip
    # With `schedule` (datasetUri required, infra.config): reloads and, for new work, trains on its own.
    scheduled = ScheduledLoad("schedule", ScheduleArgs(work, capacity, loader, training.name), platform) if (
        cfg.jobs.schedule and platform.identities.loader) else None  # fmt: skip
    return Workloads(capacity, loader, training, scoring, scheduled)


def _warn_about_standbys(cfg: StackConfig) -> None:
    if cfg.jobs.standby_workers:
        where = "on spot GPUs, or on-demand ones while spot is out (onDemandFallback)" if (
            cfg.gpu.on_demand_fallback) else "on spot GPUs"
        pulumi.log.warn(
            f"parallelism {cfg.jobs.parallelism} > {len(cfg.jobs.runs)} run(s): {cfg.jobs.standby_workers} "
            f"training pod(s) will wait {where} as hot standbys (a run trains on one worker at a time). "
            "Add runs (a sweep) or lower parallelism if that is not what you want to pay for.")


def image_refs(
    cfg: StackConfig, cluster: Cluster, image: TrainingImage, on_gcp: pulumi.ResourceOptions
) -> tuple[pulumi.Output[str], pulumi.Output[str]]:
    """The training and Redis images as pods name them; with binaryAuthorization, each handed on only once the
    stack's attestor has attested it and the project's policy requires that (infra/binauthz.py)."""
    trainer, redis = image.ref, image.from_docker_hub(cfg.redis_image)
    if not cfg.cluster.binary_authorization:
        return trainer, redis
    binauthz = BinaryAuthorization("binauthz", BinauthzArgs(
        cfg.site, cluster.name, protected=cfg.cluster.deletion_protection), opts=on_gcp)
    return binauthz.attested("trainer", trainer), binauthz.attested("redis", redis)


def build(cfg: StackConfig) -> dict[str, Any]:
    """Declare every resource of the stack; returns the stack outputs (name -> value or Output)."""
    _warn_about_standbys(cfg)
    services = ProjectServices("services", cfg.project_id, apis(
        cfg.data, cfg.cluster.binary_authorization,
        stack_key=STACK_KEY in (cfg.cluster.secrets_kms_key, cfg.filestore.kms_key),
        perimeter=cfg.perimeter.on))
    # Every other GCP resource goes through this provider, and the provider waits for the APIs.
    gcp_provider = gcp.Provider(
        "gcp",
        project=cfg.project_id,
        region=cfg.region,
        opts=pulumi.ResourceOptions(depends_on=services.services),
    )
    on_gcp = pulumi.ResourceOptions(providers={"gcp": gcp_provider})
    network = Network("network", network_args(cfg), opts=on_gcp)
    if cfg.perimeter.on:  # vpcServiceControls: the project inside a perimeter (infra/perimeter.py)
        ServicePerimeter("perimeter", PerimeterArgs(cfg.site, cfg.perimeter), opts=on_gcp)
    cluster = Cluster("cluster", cluster_args(cfg), network, opts=on_gcp)
    image = TrainingImage("image", ImageArgs(cfg.site, cluster.node_service_account.member), opts=on_gcp)
    kube = workload_namespace(cfg, cluster.provider)
    trainer, redis = image_refs(cfg, cluster, image, on_gcp)
    shared = platform(cfg, kube, trainer, network, cluster.workload_pool, on_gcp, redis_image=redis)
    # Read before any GPU pod exists: the training Job waits on it, and a shortfall fails `pulumi up` here.
    quota = check_gpu_quota(
        cfg.project_id, cfg.gpu, cfg.region, cfg.jobs.parallelism,
        pulumi.InvokeOutputOptions(provider=gcp_provider, depends_on=services.services),
    ) if cfg.gpu.check_quota else None  # fmt: skip
    return outputs(cfg, cluster, shared, workloads(cfg, shared, cluster.endpoint, quota), quota)


def outputs(
    cfg: StackConfig, cluster: Cluster, platform: Platform, jobs: Workloads, quota: pulumi.Input[str] | None
) -> dict[str, Any]:
    """The stack outputs: where things are, and the commands that reach them."""
    data, ids = cfg.data, platform.identities
    return {
        "clusterName": cluster.name,
        "kubeconfig": cluster.kubeconfig,
        "filestoreIp": platform.share.ip,
        "filestoreShare": platform.share.share,
        "imageRef": platform.image,
        "redisService": f"{platform.queue.service_name}.{cfg.namespace}.svc.cluster.local:{contract.REDIS_PORT}",
        "loaderJob": jobs.loader.name,
        "trainingJob": jobs.training.name,
        "scoringJob": jobs.scoring.name if jobs.scoring else "",
        "scheduledLoader": jobs.scheduled.name if jobs.scheduled else "",
        # The GPU quota limits read at this `pulumi up` (checkGpuQuota).
        "gpuQuota": quota if quota is not None else "not checked",
        "datasetUri": data.dataset.uri if data.dataset else "",
        "outputUri": data.output.uri if data.output else "",
        "serviceAccounts": {
            component: identity.account.email
            for component, identity in ((contract.LOADER, ids.loader), (contract.WORKER, ids.worker))
            if identity
        },
        "commands": commands(cfg, cluster, platform, jobs),
    }


def commands(cfg: StackConfig, cluster: Cluster, platform: Platform, jobs: Workloads) -> dict[str, Any]:
    """The kubectl and pulumi lines the stack outputs for day two (docs/cloud.md)."""
    n = f"-n {cfg.namespace}"
    workers = f"{contract.COMPONENT_LABEL}={contract.WORKER}"
    loader, training = jobs.loader, jobs.training
    return {
        "credentials": pulumi.Output.concat(
            "gcloud container clusters get-credentials ",
            cluster.name,
            f" --region {cfg.region} --project {cfg.project_id}",
        ),
        "status": f"kubectl {n} get job {loader.name} {training.name} -o wide",
        "pods": f"kubectl {n} get pods -l {contract.NAME_LABEL}={contract.APP} -o wide",
        "logs": f"kubectl {n} logs -f -l {workers} --prefix --max-log-requests=50",
        "wait": f"kubectl {n} wait --for=condition=complete job/{training.name} --timeout=24h",
        # `pulumi up` never re-runs a Job that exists, failed or not: replace it (docs/cloud.md).
        "rerunLoader": pulumi.Output.concat("pulumi up --replace '", loader.job.urn, "'"),
        "rerunTraining": pulumi.Output.concat("pulumi up --replace '", training.job.urn, "'"),
        # New days in the bucket change no config: replace both Jobs to load and train them.
        "reload": pulumi.Output.concat(
            "pulumi up --replace '", loader.job.urn, "' --replace '", training.job.urn, "'"
        ),
        **one_off_commands(cfg, platform),
    }


def one_off_commands(cfg: StackConfig, platform: Platform) -> dict[str, Any]:
    """``kubectl run`` lines for throw-away pods: the queue's status, an export per run, the reports."""
    work, data, worker = job_args(cfg), cfg.data, platform.identities.worker
    return {
        "queueStatus": one_off_pod(work, platform, "status", contract.STATUS_ARGS),
        # With outputUri: export a run by hand, as the workers' account (the only one that may write).
        "export": {
            run: one_off_pod(work, platform, "export", contract.export_args(run, data.output.uri),
                             service_account=worker.ksa_name)
            for run in cfg.jobs.runs
        } if data.output and worker else {},  # fmt: skip
        "report": one_off_pod(
            work, platform, "report", [], command=["sh", "-c", f"cat {contract.SHARE_DIR}/{contract.REPORT_GLOB}"]
        ),
    }
