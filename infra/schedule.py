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

from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from infra import contract
from infra.gpu import GpuCapacity
from infra.jobs import JobArgs, LoaderJob, loader_spec, loader_template, scoring_spec, training_spec
from infra.platform import Platform

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


def _scheduled(name: str, component: str, spec: dict[str, Any]) -> dict[str, Any]:
    """A Job manifest the launcher posts: a stack Job's spec, its own name, and a TTL. No namespace: it is
    created in the launcher's own."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": contract.labels(component)},
        "spec": {**spec, "ttlSecondsAfterFinished": SCHEDULED_JOB_TTL_S},
    }


def scheduled_training_job(
    args: JobArgs, platform: Platform, capacity: GpuCapacity, seed_inputs: pulumi.Input[str]
) -> dict[str, Any]:
    """The training Job the launcher posts: the stack's training Job's spec, its own name, a TTL."""
    return _scheduled(SCHEDULED_JOB, contract.WORKER, training_spec(args, platform, capacity, seed_inputs))


def scheduled_scoring_job(args: JobArgs, platform: Platform, seed_inputs: pulumi.Input[str]) -> dict[str, Any]:
    """The scoring Job the launcher posts: the stack's scoring Job's spec, its own name, a TTL."""
    return _scheduled(SCHEDULED_SCORING_JOB, contract.SCORER, scoring_spec(args, platform, seed_inputs))


@dataclass(frozen=True)
class ScheduleArgs:
    """The schedule's slice: the Jobs' settings (``schedule`` among them), the GPU capacity the training Job it
    posts lands on, and the stack's loader (its runs file, its seed inputs; the first load is Pulumi's)."""

    work: JobArgs
    capacity: GpuCapacity
    loader: LoaderJob


class ScheduledLoad(pulumi.ComponentResource):
    """With ``schedule``: the CronJob, the training Job's body it may post, and the one right it needs."""

    cron_job: k8s.batch.v1.CronJob
    name: str

    def __init__(
        self, name: str, args: ScheduleArgs, platform: Platform, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("spot-trainer:k8s:ScheduledLoad", name, None, opts)
        work, loader, launcher = args.work, args.loader, platform.identities.loader
        assert launcher is not None, "a schedule needs datasetUri (infra.config), which gives the loader its identity"
        self.name = f"{contract.APP}-{contract.LOADER}-scheduled"
        launch, launch_args = self._launch_bodies(name, args, platform)
        binding = self._launch_right(name, platform, launcher.ksa_name)
        mount = (
            {"name": LAUNCH_VOLUME, "configMap": {"name": launch.metadata.name}},
            {"name": LAUNCH_VOLUME, "mountPath": contract.LAUNCH_DIR, "readOnly": True},
        )
        template = loader_template(
            work, platform, loader.runs.metadata.name, loader.seed_inputs, extra_args=launch_args, volumes=[mount]
        )
        # batch/v1 CronJobSpec as the provider declares it (pulumi_kubernetes/batch/v1/_inputs.py
        # CronJobSpecArgs: schedule, job_template, concurrency_policy, starting_deadline_seconds, time_zone,
        # *_jobs_history_limit). The provider has no await logic for CronJobs (provider/pkg/await/
        # awaiters.go lists batch/v1 Job, not CronJob): `pulumi up` creates it and goes on. GKE runs
        # CronJobs as upstream Kubernetes does, Autopilot included (GKE docs "CronJobs", GA since 1.21).
        self.cron_job = k8s.batch.v1.CronJob(
            name,
            metadata={"name": self.name, **self._meta(platform)},
            spec={
                "schedule": work.jobs.schedule,
                # Explicit: the controller's own zone otherwise (kubernetes.io "CronJob": time zones, GA 1.27).
                "timeZone": "Etc/UTC",
                # A load still running when the next is due is left alone: two seeders would only race.
                "concurrencyPolicy": "Forbid",
                "startingDeadlineSeconds": STARTING_DEADLINE_S,
                "successfulJobsHistoryLimit": 3,
                "failedJobsHistoryLimit": 3,
                "jobTemplate": {
                    "metadata": {"labels": contract.labels(contract.LOADER)},
                    "spec": loader_spec(work.jobs, template),
                },
            },
            opts=pulumi.ResourceOptions(
                parent=self,
                provider=platform.provider,
                # After the first load (pulumi up's own), with the right to launch already granted.
                depends_on=[loader.job, launch, binding, *args.capacity.resources, *launcher.resources],
            ),
        )
        self.register_outputs({"name": self.name})

    @staticmethod
    def _meta(platform: Platform) -> dict[str, Any]:
        return {"namespace": platform.namespace, "labels": contract.labels(contract.LOADER)}

    def _launch_bodies(
        self, name: str, args: ScheduleArgs, platform: Platform
    ) -> tuple[k8s.core.v1.ConfigMap, list[str]]:
        """The ConfigMap of the Jobs the launcher may post, and the launcher's arguments that name them."""
        work, seed = args.work, args.loader.seed_inputs
        body = scheduled_training_job(work, platform, args.capacity, seed)
        bodies = {contract.LAUNCH_KEY: pulumi.Output.json_dumps(body)}
        launch_args = ["--launch-job", contract.LAUNCH_FILE]
        if work.data.output and platform.identities.worker:  # the stack scores: so does each scheduled load
            scoring = scheduled_scoring_job(work, platform, seed)
            bodies[contract.SCORING_LAUNCH_KEY] = pulumi.Output.json_dumps(scoring)
            launch_args += ["--launch-scoring", contract.SCORING_LAUNCH_FILE]
        launch = k8s.core.v1.ConfigMap(
            f"{name}-job",
            metadata={"name": f"{contract.APP}-launch", **self._meta(platform)},
            # Mutable: a new image or new runs update the body in place, and the mounted file follows.
            data=bodies,
            opts=pulumi.ResourceOptions(parent=self, provider=platform.provider),
        )
        return launch, launch_args

    def _launch_right(self, name: str, platform: Platform, launcher: str) -> k8s.rbac.v1.RoleBinding:
        """``create`` on ``jobs`` in the stack's namespace, for the launcher's service account alone."""
        meta = self._meta(platform)
        # rbac.authorization.k8s.io/v1 Role and RoleBinding (pulumi_kubernetes.rbac.v1 Role(rules=...),
        # RoleBinding(role_ref=..., subjects=...); the roleRef cannot change, so the provider replaces it).
        role = k8s.rbac.v1.Role(
            f"{name}-role",
            metadata={"name": self.name, **meta},
            rules=[{"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create"]}],
            opts=pulumi.ResourceOptions(parent=self, provider=platform.provider),
        )
        return k8s.rbac.v1.RoleBinding(
            f"{name}-binding",
            metadata={"name": self.name, **meta},
            role_ref={"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": self.name},
            subjects=[{"kind": "ServiceAccount", "name": launcher, "namespace": platform.namespace}],
            opts=pulumi.ResourceOptions(parent=self, provider=platform.provider, depends_on=[role]),
        )
