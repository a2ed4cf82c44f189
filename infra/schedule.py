"""Continuous training (``schedule``): a CronJob re-runs the loader, and a launcher starts training only for new work.

Why the Jobs are posted by a pod of ours, and not a CronJob of GPU pods: a pod's resources, ``nvidia.com/gpu``
included, are reserved for the pod's whole life, init containers too (Kubernetes "Init Containers": the effective
request is the larger of the init and app requests), so a GPU pod that first asked "is anything new?" would hold,
and on spot pay for, a GPU while it asked, every time. A suspended Job resumed by a sidecar, or an external
autoscaler (KEDA's ScaledJob), would still need either an API call from our code or a new controller.

Why two pods: the loader parses the bank's files with the bucket's read role and the share mounted; an account
that may create Jobs can start any image as any service account of its namespace, mounting any Secret. So the
scheduled loader (CPU, the loader Job's pod plus ``--request-launch``) only records in Redis what it added
(WorkQueue.request_launch), and its account is bound to no Role. The launcher is a pod of its own (CPU, 0.1 CPU):
its own Kubernetes service account, no Google identity, no share, no bucket; it reads the request and posts the
Jobs (workload/runtime/launch.py).

Why a second CronJob on the same schedule, and not a Job started after the loader: something must create that
Job, and the loader may not; a CronJob is the only thing the cluster itself starts on time. The launcher waits for
the load's request (up to the loader's deadline), so the two need no clock between them; a load whose launcher
failed leaves its request in Redis for the next launcher (requests are summed, taken away only once acted on).

What it posts is what Pulumi rendered here, from the same code as the stack's Jobs (``jobs.training_spec``,
``jobs.scoring_spec``), mounted from a ConfigMap, so its Role needs ``create`` on ``jobs`` and ``get`` on the
stack's own training Job alone (one training Job at a time: while that one may run, no second is posted). An
admission policy (infra/admission.py) admits only those two Jobs from it: fixed names, the stack's image by
digest, the workers' service account. The scoring Job is posted once the queue is drained, so its scorers'
requests are not held while training runs: the wait is the launcher's small pod.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from infra import contract
from infra.admission import AdmissionArgs, LaunchAdmission
from infra.gpu import GpuCapacity
from infra.jobs import (
    JobArgs,
    LoaderJob,
    failure_policy,
    loader_spec,
    loader_template,
    scoring_spec,
    training_spec,
)
from infra.platform import Platform

LAUNCH_VOLUME = "launch"
# The Job the schedule starts. A fixed name: while one exists (training, or finished and not yet removed),
# the API server answers 409 and the launcher starts no second one (its pods would drain the same queue). The
# stack's own training Job (Pulumi's, another name) the launcher reads with `get` (workload/runtime/launch.py).
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
# The launcher's pod: it reads Redis and waits; what it holds while it waits for a drained queue (docs/cloud.md).
LAUNCHER_RESOURCES = {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "256Mi"}}
# Past its two waits (the load, the drained queue), the launcher's Job is given this long to post.
LAUNCH_SLACK_S = 600


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
    posts lands on, the stack's loader (its runs file, its seed inputs; the first load is Pulumi's) and the name
    of the stack's own training Job (no second training Job while it runs)."""

    work: JobArgs
    capacity: GpuCapacity
    loader: LoaderJob
    stack_job: str


def _cron_spec(work: JobArgs, job_spec: dict[str, Any], component: str) -> dict[str, Any]:
    """A CronJob spec on the stack's schedule: the loader's and the launcher's."""
    # batch/v1 CronJobSpec as the provider declares it (pulumi_kubernetes/batch/v1/_inputs.py CronJobSpecArgs:
    # schedule, job_template, concurrency_policy, starting_deadline_seconds, time_zone, *_jobs_history_limit). The
    # provider has no await logic for CronJobs (provider/pkg/await/awaiters.go lists batch/v1 Job, not CronJob):
    # `pulumi up` creates it and goes on. GKE runs CronJobs as upstream Kubernetes does, Autopilot included (GKE
    # docs "CronJobs", GA since 1.21).
    return {
        "schedule": work.jobs.schedule,
        # Explicit: the controller's own zone otherwise (kubernetes.io "CronJob": time zones, GA 1.27).
        "timeZone": "Etc/UTC",
        # A run still going when the next is due is left alone: two seeders (or launchers) would only race.
        "concurrencyPolicy": "Forbid",
        "startingDeadlineSeconds": STARTING_DEADLINE_S,
        "successfulJobsHistoryLimit": 3,
        "failedJobsHistoryLimit": 3,
        "jobTemplate": {"metadata": {"labels": contract.labels(component)}, "spec": job_spec},
    }


def launcher_template(work: JobArgs, platform: Platform, config_map: pulumi.Input[str], account: str,
                      scoring: bool, stack_job: str) -> dict[str, Any]:
    """The launcher's pod: Redis's address and password, the Job bodies mounted read-only, its own account's token
    (to post), no share, no Google identity."""
    queue = platform.queue
    load_wait_s = work.jobs.loader_timeout_minutes * 60
    container = {
        "name": contract.LAUNCHER,
        "image": platform.image,
        "args": contract.launch_args(stack_job, load_wait_s, work.jobs.active_deadline_seconds, scoring),
        "env": [
            {"name": contract.ENV_REDIS_URL, "value": queue.url},
            {"name": contract.ENV_REDIS_PASSWORD,
             "valueFrom": {"secretKeyRef": {"name": queue.secret_name, "key": queue.password_key}}},
            {"name": contract.ENV_REDIS_RETRY, "value": str(work.jobs.infra_retry_budget_minutes * 60)},
        ],
        "resources": LAUNCHER_RESOURCES,
        "securityContext": contract.restricted_security_context(),
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [{"name": LAUNCH_VOLUME, "mountPath": contract.LAUNCH_DIR, "readOnly": True}],
    }  # fmt: skip
    return {
        "metadata": {"labels": contract.labels(contract.LAUNCHER)},
        "spec": {
            "restartPolicy": "Never",
            "serviceAccountName": account,
            # Its token is what it posts with: its Role is create jobs, get the stack's training Job.
            "automountServiceAccountToken": True,
            "securityContext": {"runAsNonRoot": True, "runAsUser": contract.WORKLOAD_UID,
                                "runAsGroup": contract.WORKLOAD_UID, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [container],
            "volumes": [{"name": LAUNCH_VOLUME, "configMap": {"name": config_map}}],
        },
    }  # fmt: skip


def launcher_spec(work: JobArgs, template: dict[str, Any]) -> dict[str, Any]:
    """The launcher Job's spec: the loader's exit-code rules; its deadline covers both of its waits."""
    jobs = work.jobs
    return {
        "backoffLimit": 0,
        "activeDeadlineSeconds": jobs.loader_timeout_minutes * 60 + jobs.active_deadline_seconds + LAUNCH_SLACK_S,
        "podFailurePolicy": failure_policy(contract.LAUNCHER),
        "template": template,
    }


class ScheduledLoad(pulumi.ComponentResource):
    """With ``schedule``: the loader's CronJob, the launcher's CronJob with its account, Role and admission
    policy, and the Job bodies it may post."""

    cron_job: k8s.batch.v1.CronJob
    launcher_job: k8s.batch.v1.CronJob
    name: str

    def __init__(
        self, name: str, args: ScheduleArgs, platform: Platform, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("spot-trainer:k8s:ScheduledLoad", name, None, opts)
        work, loader, identity = args.work, args.loader, platform.identities.loader
        assert identity is not None, "a schedule needs datasetUri (infra.config), which gives the loader its identity"
        self.name = f"{contract.APP}-{contract.LOADER}-scheduled"
        self.launcher_name = f"{contract.APP}-{contract.LAUNCHER}"
        launch, posted = self._launch_bodies(name, args, platform)
        account, binding = self._launcher_identity(name, platform, args.stack_job)
        admission = LaunchAdmission(f"{name}-admission", AdmissionArgs(self.launcher_name, posted, platform.image),
                                    platform.kube, opts=pulumi.ResourceOptions(parent=self))  # fmt: skip
        template = loader_template(
            work, platform, loader.runs.metadata.name, loader.seed_inputs, extra_args=[contract.REQUEST_LAUNCH]
        )
        self.cron_job = k8s.batch.v1.CronJob(
            name,
            metadata={"name": self.name, **self._meta(platform, contract.LOADER)},
            spec=_cron_spec(work, loader_spec(work.jobs, template), contract.LOADER),
            opts=pulumi.ResourceOptions(
                parent=self,
                provider=platform.provider,
                # After the first load (pulumi up's own).
                depends_on=[loader.job, *identity.resources],
            ),
        )
        launcher = launcher_template(work, platform, launch.metadata.name, account.metadata.name,
                                     SCHEDULED_SCORING_JOB in posted, args.stack_job)  # fmt: skip
        self.launcher_job = k8s.batch.v1.CronJob(
            f"{name}-launcher",
            metadata={"name": f"{self.launcher_name}-scheduled", **self._meta(platform, contract.LAUNCHER)},
            spec=_cron_spec(work, launcher_spec(work, launcher), contract.LAUNCHER),
            opts=pulumi.ResourceOptions(
                parent=self,
                provider=platform.provider,
                # With the right to launch, and its limits, in place first.
                depends_on=[loader.job, launch, binding, admission.binding, *args.capacity.resources],
            ),
        )
        self.register_outputs({"name": self.name, "launcher": self.launcher_name})

    @staticmethod
    def _meta(platform: Platform, component: str) -> dict[str, Any]:
        return {"namespace": platform.namespace, "labels": contract.labels(component)}

    def _launch_bodies(
        self, name: str, args: ScheduleArgs, platform: Platform
    ) -> tuple[k8s.core.v1.ConfigMap, dict[str, dict[str, Any]]]:
        """The ConfigMap of the Jobs the launcher may post, and those Jobs by name (what admission pins)."""
        work, seed = args.work, args.loader.seed_inputs
        posted = {SCHEDULED_JOB: scheduled_training_job(work, platform, args.capacity, seed)}
        bodies = {contract.LAUNCH_KEY: pulumi.Output.json_dumps(posted[SCHEDULED_JOB])}
        if work.data.output and platform.identities.worker:  # the stack scores: so does the schedule
            posted[SCHEDULED_SCORING_JOB] = scheduled_scoring_job(work, platform, seed)
            bodies[contract.SCORING_LAUNCH_KEY] = pulumi.Output.json_dumps(posted[SCHEDULED_SCORING_JOB])
        launch = k8s.core.v1.ConfigMap(
            f"{name}-job",
            metadata={"name": f"{contract.APP}-launch", **self._meta(platform, contract.LAUNCHER)},
            data=bodies,
            # Immutable, and replaced on a new body: pulumi-kubernetes replaces a ConfigMap whose data changed
            # unless the provider sets enableConfigMapMutable, which this program does not (provider/pkg/provider/
            # diff.go:32-33, infra/replacements.py; tests/infra/test_infra_diff.py). Said here so that the file
            # never changes under a running launcher; the name is fixed, so the old one goes first.
            immutable=True,
            opts=pulumi.ResourceOptions(parent=self, provider=platform.provider, delete_before_replace=True),
        )
        return launch, posted

    def _launcher_identity(
        self, name: str, platform: Platform, stack_job: str
    ) -> tuple[k8s.core.v1.ServiceAccount, k8s.rbac.v1.RoleBinding]:
        """The launcher's Kubernetes service account (no Google identity: no annotation, no IAM binding) and its
        Role: ``create`` on ``jobs`` (which RBAC cannot limit by name: infra/admission.py does), ``get`` on the
        stack's own training Job by name."""
        meta = self._meta(platform, contract.LAUNCHER)
        k8s_opts = pulumi.ResourceOptions(parent=self, provider=platform.provider)
        account = k8s.core.v1.ServiceAccount(f"{name}-launcher", metadata={"name": self.launcher_name, **meta},
                                             opts=k8s_opts)  # fmt: skip
        # rbac.authorization.k8s.io/v1 Role and RoleBinding (pulumi_kubernetes.rbac.v1 Role(rules=...),
        # RoleBinding(role_ref=..., subjects=...); the roleRef cannot change, so the provider replaces it).
        role = k8s.rbac.v1.Role(
            f"{name}-role",
            metadata={"name": self.launcher_name, **meta},
            rules=[
                {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create"]},
                {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get"], "resourceNames": [stack_job]},
            ],
            opts=k8s_opts,
        )
        binding = k8s.rbac.v1.RoleBinding(
            f"{name}-binding",
            metadata={"name": self.launcher_name, **meta},
            role_ref={"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": self.launcher_name},
            subjects=[{"kind": "ServiceAccount", "name": self.launcher_name, "namespace": platform.namespace}],
            opts=pulumi.ResourceOptions(parent=self, provider=platform.provider, depends_on=[role, account]),
        )
        return account, binding
