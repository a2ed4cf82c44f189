"""Continuous training (``schedule``): a CronJob re-runs the loader, which starts training only for new work.

Why the loader creates the training Job itself, and not a CronJob of GPU pods: a pod's resources,
``nvidia.com/gpu`` included, are reserved for the pod's whole life, init containers too (Kubernetes
"Init Containers": the effective request is the larger of the init and app requests), so a GPU pod that
first asked "is anything new?" would hold, and on spot pay for, a GPU while it asked, every time. A
suspended Job resumed by a sidecar, or an external autoscaler (KEDA's ScaledJob), would still need either
an API call from our code or a new controller in the cluster. So the scheduled loader (CPU) seeds as the
loader Job does and then, only when items were enqueued or are still pending (workload/runtime/launch.py),
POSTs the training Job that Pulumi rendered here from the same code as the stack's training Job
(``jobs.training_spec``). It reads that body from a mounted ConfigMap, so its Role needs no ``get``: only
``create`` on ``jobs`` in the stack's namespace, bound to the loader's service account.

With ``outputUri`` too, the same ConfigMap holds the scoring Job's body (``jobs.scoring_spec``, the stack's
scoring Job's), which the loader posts when the load published new ``scoring/`` days or started training.
Its pod's init container waits on CPU until the queue is drained, so it scores with the newest models.
"""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from infra import contract
from infra.filestore import FilestoreShare
from infra.gpu import GpuCapacity
from infra.identity import WorkloadIdentity
from infra.jobs import JobArgs, LoaderJob, loader_spec, loader_template, scoring_spec, training_spec
from infra.redis import RedisQueue

LAUNCH_VOLUME = "launch"
# The Job the schedule starts. A fixed name: while one exists (training, or finished and not yet removed),
# the API server answers 409 and the launcher starts no second one (its pods would drain the same queue).
SCHEDULED_JOB = f"{contract.APP}-{contract.WORKER}-scheduled"
# Removes a finished scheduled Job, so the next schedule can start a new one (kubernetes.io "Automatic
# Cleanup for Finished Jobs"; GA since 1.23). Safe here: Pulumi does not manage this Job, so nothing
# recreates it. Its pods' logs go with it after this long.
SCHEDULED_JOB_TTL_S = 3600
# The scoring Job the schedule starts: fixed name and the same TTL, for the same reasons.
SCHEDULED_SCORING_JOB = f"{contract.APP}-{contract.SCORER}-scheduled"
# A run missed by more than this (controller down, the previous run still active under Forbid) is skipped
# and counted as missed, not started late; the next schedule catches up, since seeding is incremental.
STARTING_DEADLINE_S = 3600


def scheduled_training_job(
    args: JobArgs,
    image: pulumi.Input[str],
    redis: RedisQueue,
    share: FilestoreShare,
    capacity: GpuCapacity,
    identity: WorkloadIdentity | None,
    seed_inputs: pulumi.Input[str],
) -> dict[str, Any]:
    """The Job manifest the launcher posts: the stack's training Job's spec, its own name, and a TTL.
    No namespace: it is created in the launcher's own."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": SCHEDULED_JOB, "labels": contract.labels(contract.WORKER)},
        "spec": {
            **training_spec(args, image, redis, share, capacity, identity, seed_inputs),
            "ttlSecondsAfterFinished": SCHEDULED_JOB_TTL_S,
        },
    }


def scheduled_scoring_job(
    args: JobArgs,
    image: pulumi.Input[str],
    redis: RedisQueue,
    share: FilestoreShare,
    identity: WorkloadIdentity,
    seed_inputs: pulumi.Input[str],
) -> dict[str, Any]:
    """The scoring Job manifest the launcher posts: the stack's scoring Job's spec, its own name, a TTL."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": SCHEDULED_SCORING_JOB, "labels": contract.labels(contract.SCORER)},
        "spec": {
            **scoring_spec(args, image, redis, share, identity, seed_inputs),
            "ttlSecondsAfterFinished": SCHEDULED_JOB_TTL_S,
        },
    }


class ScheduledLoad(pulumi.ComponentResource):
    """With ``schedule``: the CronJob, the training Job's body it may post, and the one right it needs."""

    cron_job: k8s.batch.v1.CronJob
    name: str

    def __init__(
        self,
        name: str,
        args: JobArgs,
        image: pulumi.Input[str],
        redis: RedisQueue,
        share: FilestoreShare,
        capacity: GpuCapacity,
        loader: LoaderJob,
        loader_identity: WorkloadIdentity,
        worker_identity: WorkloadIdentity | None,
        provider: k8s.Provider,
        namespace: pulumi.Input[str],
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("spot-trainer:k8s:ScheduledLoad", name, None, opts)
        jobs = args.jobs
        self.name = f"{contract.APP}-{contract.LOADER}-scheduled"
        child = pulumi.ResourceOptions(parent=self, provider=provider)
        meta = {"namespace": namespace, "labels": contract.labels(contract.LOADER)}
        body = scheduled_training_job(args, image, redis, share, capacity, worker_identity, loader.seed_inputs)
        bodies = {contract.LAUNCH_KEY: pulumi.Output.json_dumps(body)}
        launch_args = ["--launch-job", contract.LAUNCH_FILE]
        if args.data.output and worker_identity:  # the stack scores: so does each scheduled load
            scoring = scheduled_scoring_job(args, image, redis, share, worker_identity, loader.seed_inputs)
            bodies[contract.SCORING_LAUNCH_KEY] = pulumi.Output.json_dumps(scoring)
            launch_args += ["--launch-scoring", contract.SCORING_LAUNCH_FILE]
        launch = k8s.core.v1.ConfigMap(
            f"{name}-job",
            metadata={"name": f"{contract.APP}-launch", **meta},
            # Mutable: a new image or new runs update the body in place, and the mounted file follows.
            data=bodies,
            opts=child,
        )
        # rbac.authorization.k8s.io/v1 Role and RoleBinding (pulumi_kubernetes.rbac.v1 Role(rules=...),
        # RoleBinding(role_ref=..., subjects=...); the roleRef cannot change, so the provider replaces it).
        role = k8s.rbac.v1.Role(
            f"{name}-role",
            metadata={"name": self.name, **meta},
            rules=[{"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create"]}],
            opts=child,
        )
        binding = k8s.rbac.v1.RoleBinding(
            f"{name}-binding",
            metadata={"name": self.name, **meta},
            role_ref={"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": self.name},
            subjects=[{"kind": "ServiceAccount", "name": loader_identity.ksa_name, "namespace": namespace}],
            opts=pulumi.ResourceOptions(parent=self, provider=provider, depends_on=[role]),
        )
        mount = (
            {"name": LAUNCH_VOLUME, "configMap": {"name": launch.metadata.name}},
            {"name": LAUNCH_VOLUME, "mountPath": contract.LAUNCH_DIR, "readOnly": True},
        )
        template = loader_template(
            args, image, redis, share, loader_identity, loader.runs.metadata.name, loader.seed_inputs,
            extra_args=launch_args, volumes=[mount],
        )  # fmt: skip
        # batch/v1 CronJobSpec as the provider declares it (pulumi_kubernetes/batch/v1/_inputs.py
        # CronJobSpecArgs: schedule, job_template, concurrency_policy, starting_deadline_seconds, time_zone,
        # *_jobs_history_limit). The provider has no await logic for CronJobs (provider/pkg/await/
        # awaiters.go lists batch/v1 Job, not CronJob): `pulumi up` creates it and goes on. GKE runs
        # CronJobs as upstream Kubernetes does, Autopilot included (GKE docs "CronJobs", GA since 1.21).
        self.cron_job = k8s.batch.v1.CronJob(
            name,
            metadata={"name": self.name, **meta},
            spec={
                "schedule": jobs.schedule,
                # Explicit: the controller's own zone otherwise (kubernetes.io "CronJob": time zones, GA 1.27).
                "timeZone": "Etc/UTC",
                # A load still running when the next is due is left alone: two seeders would only race.
                "concurrencyPolicy": "Forbid",
                "startingDeadlineSeconds": STARTING_DEADLINE_S,
                "successfulJobsHistoryLimit": 3,
                "failedJobsHistoryLimit": 3,
                "jobTemplate": {
                    "metadata": {"labels": contract.labels(contract.LOADER)},
                    "spec": loader_spec(jobs, template),
                },
            },
            opts=pulumi.ResourceOptions(
                parent=self,
                provider=provider,
                # After the first load (pulumi up's own), with the right to launch already granted.
                depends_on=[loader.job, launch, binding, *capacity.resources, *loader_identity.resources],
            ),
        )
        self.register_outputs({"name": self.name})
