"""Composition of the stack: config in, components wired together, outputs out.

``__main__.py`` calls ``build`` under the Pulumi engine; ``infra.render`` calls it under mocks. This is
the one place that cuts the validated ``StackConfig`` into the typed slices the components take (the
``*_args`` functions below; the component tests build them the same way).
"""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi_gcp as gcp
import pulumi_kubernetes as k8s

from infra import contract
from infra.cluster import Cluster, ClusterArgs
from infra.config import StackConfig
from infra.filestore import FilestoreArgs, FilestoreShare
from infra.gpu import GpuCapacity
from infra.identity import READ_OBJECTS, WRITE_OBJECTS, BucketGrant, WorkloadIdentity
from infra.image import TrainingImage
from infra.jobs import JobArgs, LoaderJob, ScoringJob, TrainingJob, one_off_pod
from infra.network import Network, NetworkArgs
from infra.quota import check as check_gpu_quota
from infra.redis import RedisQueue
from infra.schedule import ScheduledLoad
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
    return JobArgs(cfg.namespace, cfg.jobs, cfg.data, gpu_count=cfg.gpu.count, share_zone=zone)


def build(cfg: StackConfig) -> dict[str, Any]:
    """Declare every resource of the stack; returns the stack outputs (name -> value or Output)."""
    if cfg.jobs.standby_workers:
        where = "on spot GPUs, or on-demand ones while spot is out (onDemandFallback)" if (
            cfg.gpu.on_demand_fallback) else "on spot GPUs"
        pulumi.log.warn(
            f"parallelism {cfg.jobs.parallelism} > {len(cfg.jobs.runs)} run(s): {cfg.jobs.standby_workers} "
            f"training pod(s) will wait {where} as hot standbys (a run trains on one worker at a time). "
            "Add runs (a sweep) or lower parallelism if that is not what you want to pay for.")
    services = ProjectServices("services", cfg.project_id, apis(cfg.data))
    # Every other GCP resource goes through this provider, and the provider waits for the APIs.
    gcp_provider = gcp.Provider(
        "gcp",
        project=cfg.project_id,
        region=cfg.region,
        opts=pulumi.ResourceOptions(depends_on=services.services),
    )
    on_gcp = pulumi.ResourceOptions(providers={"gcp": gcp_provider})

    network = Network("network", network_args(cfg), opts=on_gcp)
    cluster = Cluster("cluster", cluster_args(cfg), network, opts=on_gcp)
    image = TrainingImage("image", cfg.site, reader_member=cluster.node_service_account.member, opts=on_gcp)

    namespace = k8s.core.v1.Namespace(
        "namespace",
        metadata={
            "name": cfg.namespace,
            # Every pod here is non-root with a RuntimeDefault seccomp profile: enforce it.
            "labels": {contract.NAME_LABEL: contract.APP, "pod-security.kubernetes.io/enforce": "restricted"},
        },
        opts=pulumi.ResourceOptions(provider=cluster.provider),
    )
    ns = namespace.metadata.name
    capacity = GpuCapacity("gpu", cfg.gpu, cfg.cluster.autopilot, cluster.provider)
    share = FilestoreShare("share", filestore_args(cfg), network, cluster.provider, ns, opts=on_gcp)
    redis = RedisQueue("redis", cfg.redis_image, cluster.provider, ns, cfg.namespace)
    site, work = cfg.site, job_args(cfg)
    # Only pods that need the bucket get a Google identity, and only with datasetUri / outputUri set.
    data = cfg.data
    loader_identity = (
        WorkloadIdentity(
            "loader-identity", site, cfg.namespace, cluster.workload_pool, contract.LOADER,
            [BucketGrant(READ_OBJECTS, data.dataset, prefix_only=False)], cluster.provider, ns, opts=on_gcp,
        )
        if data.dataset else None
    )  # fmt: skip
    worker_identity = (
        WorkloadIdentity(
            "worker-identity", site, cfg.namespace, cluster.workload_pool, contract.WORKER,
            [BucketGrant(WRITE_OBJECTS, data.output, prefix_only=True)], cluster.provider, ns, opts=on_gcp,
        )
        if data.output else None
    )  # fmt: skip
    # The share starts root-owned: hand it to the workloads' uid before the loader writes to it.
    prepared = SharePreparation("share-prep", cfg.namespace, image.ref, share, cluster.provider)
    loader = LoaderJob(
        "loader", work, image.ref, redis, share, loader_identity, cluster.provider, ns, after=[prepared.job]
    )
    # Read before any GPU pod exists: the training Job waits on it, and a shortfall fails `pulumi up` here.
    quota = check_gpu_quota(
        cfg.project_id, cfg.gpu, cfg.region, cfg.jobs.parallelism,
        pulumi.InvokeOutputOptions(provider=gcp_provider, depends_on=services.services),
    ) if cfg.gpu.check_quota else None  # fmt: skip
    training = TrainingJob(
        "training", work, image.ref, redis, share, capacity, loader, worker_identity, cluster.provider, ns,
        quota=quota,
    )

    # With outputUri: the scoring/ days are scored by the newest models after training.
    scoring = (
        ScoringJob(
            "scoring", work, image.ref, redis, share, training, loader, worker_identity, cluster.provider, ns
        )
        if worker_identity else None
    )  # fmt: skip

    # With `schedule` (datasetUri required, infra.config): reloads and, for new work, trains on its own.
    scheduled = ScheduledLoad(
        "schedule", work, image.ref, redis, share, capacity, loader, loader_identity, worker_identity,
        cluster.provider, ns,
    ) if cfg.jobs.schedule and loader_identity else None  # fmt: skip

    n = f"-n {cfg.namespace}"
    workers = f"{contract.COMPONENT_LABEL}={contract.WORKER}"
    return {
        "clusterName": cluster.name,
        "kubeconfig": cluster.kubeconfig,
        "filestoreIp": share.ip,
        "filestoreShare": share.share,
        "imageRef": image.ref,
        "redisService": f"{redis.service_name}.{cfg.namespace}.svc.cluster.local:{contract.REDIS_PORT}",
        "loaderJob": loader.name,
        "trainingJob": training.name,
        "scoringJob": scoring.name if scoring else "",
        "scheduledLoader": scheduled.name if scheduled else "",
        # The GPU quota limits read at this `pulumi up` (checkGpuQuota).
        "gpuQuota": quota if quota is not None else "not checked",
        "datasetUri": data.dataset.uri if data.dataset else "",
        "outputUri": data.output.uri if data.output else "",
        "serviceAccounts": {
            component: identity.account.email
            for component, identity in ((contract.LOADER, loader_identity), (contract.WORKER, worker_identity))
            if identity
        },
        "commands": {
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
            "queueStatus": one_off_pod(work, image.ref, redis, share, "status", contract.STATUS_ARGS),
            # With outputUri: export a run by hand, as the workers' account (the only one that may write).
            "export": {
                run: one_off_pod(
                    work, image.ref, redis, share, "export", contract.export_args(run, data.output.uri),
                    service_account=worker_identity.ksa_name,
                )
                for run in cfg.jobs.runs
            } if data.output and worker_identity else {},  # fmt: skip
            "report": one_off_pod(
                work,
                image.ref,
                redis,
                share,
                "report",
                [],
                command=["sh", "-c", f"cat {contract.SHARE_DIR}/{contract.REPORT_GLOB}"],
            ),
        },
    }
