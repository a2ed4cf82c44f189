"""The loader Job (seeds the share and the queue) and the training Job (workers on spot GPUs).

Both run the image by digest, as uid 10001, with the share at ``contract.SHARE_DIR`` and the queue's
address and password in the environment. The training Job is a work-queue Job: ``completions``
unset, pods exit 0 only when the queue is drained, and preemptions (``DisruptionTarget``) do not count
against ``backoffLimit``. No ``ttlSecondsAfterFinished``: Kubernetes would delete the Job and the next
``pulumi up`` would recreate it and train again.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from infra import contract
from infra.config import StackConfig
from infra.filestore import FilestoreShare
from infra.gke import GPU_RESOURCE, ZONE_LABEL
from infra.gpu import GpuCapacity
from infra.identity import WorkloadIdentity
from infra.redis import RedisQueue
from workload.core import errors  # stdlib only: the exit codes' one definition

SKIP_AWAIT = "pulumi.com/skipAwait"
# Spot nodes get ~15 s of notice; the worker releases its lease and exits well inside that.
TERMINATION_GRACE_SECONDS = 15
SHARE_VOLUME = "share"
RUNS_VOLUME = "runs"

# The Job failure reasons pulumi-kubernetes' Job await stops on at once (provider/pkg/await/checker/job/
# check.go, collectJobConditionErrors, unchanged since 2021): any other Failed reason, such as
# "PodFailurePolicy" from a FailJob rule, is waited out until the await times out (30 or 120 minutes).
AWAIT_FAILURE_REASONS = ("BackoffLimitExceeded", "DeadlineExceeded")

# Preemption or eviction: not the code's fault, retry without consuming backoffLimit.
IGNORE_DISRUPTIONS = {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}


def failure_policy(container: str) -> dict[str, Any]:
    """podFailurePolicy of the loader and training Jobs (first matching rule wins):

    - a preempted or evicted pod (DisruptionTarget) is retried and never counted;
    - a worker that exits with one of ``errors.RETRYABLE_EXIT_CODES`` (SIGTERM without the condition, a
      persistent infrastructure fault, the stall watchdog) is retried and not counted: a new pod does better;
    - ``errors.EXIT_BAD_CONFIG`` is counted, as is every other failure (dead letters included: the Job
      ends Failed with the dead items in the pods' last log lines, not reporting work that did not
      happen). Not FailJob: the Job would end with reason PodFailurePolicy, which the provider's await does
      not recognise, and `pulumi up` would wait out its whole timeout. Counted against ``backoffLimit`` it
      ends in BackoffLimitExceeded, which the await reports at once with the pods' termination messages (the
      worker's one-line error). The loader has ``backoffLimit: 0``, so a bad config fails `pulumi up` on the
      loader's first pod, before any GPU pod exists.
    """
    return {
        "rules": [
            IGNORE_DISRUPTIONS,
            {
                "action": "Ignore",
                "onExitCodes": {
                    "containerName": container,
                    "operator": "In",
                    "values": list(errors.RETRYABLE_EXIT_CODES),
                },
            },
            {
                "action": "Count",
                "onExitCodes": {"containerName": container, "operator": "In", "values": [errors.EXIT_BAD_CONFIG]},
            },
        ]
    }


def seed_inputs(cfg: StackConfig, image_ref: str) -> str:
    """A short hash of everything the loader seeds from (runs, data source) and the image that runs.

    Both Jobs carry it as a pod-template annotation. A Job's template is immutable, so the Kubernetes
    provider replaces a Job whose template changed (pulumi-kubernetes provider/pkg/provider/diff.go lists
    ``.spec.template`` among a Job's force-new fields): a new run, a new dataset location or a new image
    replaces the loader, which seeds what is new, and the training Job, which trains it. The fixed
    ``dependsOn`` alone never re-ran a completed training Job."""
    data = cfg.data.dataset.uri if cfg.data.dataset else f"preset:{cfg.jobs.dataset_preset}"
    facts = {"runs": json.loads(cfg.jobs.runs_json), "data": data, "dataset": cfg.data.dataset_name, "image": image_ref}
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:16]


def _env(cfg: StackConfig, redis: RedisQueue) -> list[dict[str, Any]]:
    jobs = cfg.jobs
    return [
        {"name": contract.ENV_SHARE_DIR, "value": contract.SHARE_DIR},
        {"name": contract.ENV_REDIS_URL, "value": redis.url},
        {
            "name": contract.ENV_REDIS_PASSWORD,
            "valueFrom": {"secretKeyRef": {"name": redis.secret_name, "key": redis.password_key}},
        },
        {"name": contract.ENV_WORKER_ID, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": contract.ENV_LEASE_TTL, "value": str(jobs.lease_ttl_seconds)},
        {"name": contract.ENV_CHECKPOINT_INTERVAL, "value": str(jobs.checkpoint_interval_seconds)},
        {"name": contract.ENV_MAX_ATTEMPTS, "value": str(jobs.max_attempts)},
    ]


def _pod_template(
    component: str,
    image: pulumi.Input[str],
    args: list[str],
    resources: dict[str, Any],
    cfg: StackConfig,
    redis: RedisQueue,
    share: FilestoreShare,
    node_selector: dict[str, str] | None = None,
    tolerations: list[dict[str, Any]] | None = None,
    service_account: str | None = None,
    env: list[dict[str, Any]] | None = None,
    volumes: list[tuple[dict[str, Any], dict[str, Any]]] | None = None,
    annotations: dict[str, pulumi.Input[str]] | None = None,
) -> dict[str, Any]:
    """``volumes``: extra (volume, mount) pairs; ``service_account``: a Workload Identity KSA (else the
    namespace's default account, which has no Google roles)."""
    extra = volumes or []
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": TERMINATION_GRACE_SECONDS,
        "automountServiceAccountToken": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": contract.WORKLOAD_UID,
            "runAsGroup": contract.WORKLOAD_UID,
            "fsGroup": contract.WORKLOAD_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [
            {
                "name": component,
                "image": image,
                "args": args,
                "env": _env(cfg, redis) + (env or []),
                "resources": resources,
                "securityContext": contract.restricted_security_context(),
                # The last log lines become the pod's termination message on a failure: the provider's
                # await prints it, so `pulumi up` shows the worker's own error.
                "terminationMessagePolicy": "FallbackToLogsOnError",
                "volumeMounts": [
                    {"name": SHARE_VOLUME, "mountPath": contract.SHARE_DIR},
                    *(mount for _, mount in extra),
                ],
            }
        ],
        "volumes": [
            {"name": SHARE_VOLUME, "persistentVolumeClaim": {"claimName": share.claim_name}},
            *(volume for volume, _ in extra),
        ],
    }
    if service_account:
        spec["serviceAccountName"] = service_account
        # Workload Identity needs the pod's service account token: Google's own GKE workloads turn it
        # back on for this (GoogleCloudPlatform/prometheus-engine#180: with automount off, pods could
        # not reach Google APIs through Workload Identity). The account has no Kubernetes RBAC role.
        spec["automountServiceAccountToken"] = True
    if cfg.filestore.pin_to_zone:
        # The share lives in one zone: reading it from another costs inter-zone traffic on every read.
        node_selector = {**(node_selector or {}), ZONE_LABEL: cfg.zone}
    if node_selector:
        spec["nodeSelector"] = node_selector
    if tolerations:
        spec["tolerations"] = tolerations
    metadata: dict[str, Any] = {"labels": contract.labels(component)}
    if annotations:
        metadata["annotations"] = annotations
    return {"metadata": metadata, "spec": spec}


def _job_metadata(
    name: str, component: str, namespace: pulumi.Input[str], skip_await: bool
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "labels": contract.labels(component)}
    if skip_await:
        metadata["annotations"] = {SKIP_AWAIT: "true"}
    return metadata


def one_off_pod(
    cfg: StackConfig,
    image: pulumi.Input[str],
    redis: RedisQueue,
    share: FilestoreShare,
    name: str,
    args: list[str],
    command: list[str] | None = None,
    service_account: str | None = None,
) -> pulumi.Output[str]:
    """A ``kubectl run`` line for a throw-away pod with the loader's environment and share (for
    ``status`` and reading reports after the workers are gone); labelled loader so Redis admits it.
    ``service_account``: run as that Workload Identity account (an export to the output bucket)."""

    def render(ref: str) -> str:
        template = _pod_template(contract.LOADER, ref, args, {}, cfg, redis, share, service_account=service_account)
        container = template["spec"]["containers"][0]
        container.pop("resources")
        container["name"] = name  # kubectl attaches to the container named like the pod
        if command:
            container["command"] = command
        overrides = {"apiVersion": "v1", "metadata": template["metadata"], "spec": template["spec"]}
        return (
            f"kubectl -n {cfg.namespace} run {name} --rm -i --restart=Never --image={ref} "
            f"--overrides='{json.dumps(overrides, separators=(',', ':'))}'"
        )

    return pulumi.Output.from_input(image).apply(render)


class LoaderJob(pulumi.ComponentResource):
    """Puts the datasets on the share (synced from ``datasetUri``, or simulated) and enqueues (run, day)
    items for the stack's ``runs``; always awaited, because workers that start on an empty queue would
    see it drained and exit 0."""

    job: k8s.batch.v1.Job
    runs: k8s.core.v1.ConfigMap
    name: str
    seed_inputs: pulumi.Output[str]

    def __init__(
        self,
        name: str,
        cfg: StackConfig,
        image: pulumi.Input[str],
        redis: RedisQueue,
        share: FilestoreShare,
        identity: WorkloadIdentity | None,
        provider: k8s.Provider,
        namespace: pulumi.Input[str],
        opts: pulumi.ResourceOptions | None = None,
        after: list[pulumi.Resource] | None = None,
    ) -> None:
        super().__init__("spot-trainer:k8s:LoaderJob", name, None, opts)
        self.name = f"{cfg.labels.app}-{contract.LOADER}"
        # The runs file `seed --runs-file` reads: the stack's `runs`, already checked by infra.config.
        self.runs = k8s.core.v1.ConfigMap(
            f"{name}-runs",
            metadata={
                "name": f"{cfg.labels.app}-runs",
                "namespace": namespace,
                "labels": contract.labels(contract.LOADER),
            },
            data={contract.RUNS_KEY: cfg.jobs.runs_json},
            # Immutable: new runs mean a new ConfigMap (pulumi-kubernetes replaces an immutable ConfigMap
            # whatever its enableConfigMapMutable setting, provider/pkg/provider/diff.go), never a file
            # changing under a running loader. The name is fixed, so the old one goes first.
            immutable=True,
            opts=pulumi.ResourceOptions(parent=self, provider=provider, delete_before_replace=True),
        )
        self.seed_inputs = pulumi.Output.from_input(image).apply(lambda ref: seed_inputs(cfg, ref))
        runs_volume = (
            {"name": RUNS_VOLUME, "configMap": {"name": self.runs.metadata.name}},
            {"name": RUNS_VOLUME, "mountPath": contract.RUNS_DIR, "readOnly": True},
        )
        template = _pod_template(
            contract.LOADER,
            image,
            contract.loader_args(
                cfg.data.dataset_name, cfg.jobs.dataset_preset, cfg.data.dataset.uri if cfg.data.dataset else None
            ),
            {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "2Gi"}},
            cfg,
            redis,
            share,
            service_account=identity.ksa_name if identity else None,
            volumes=[runs_volume],
            annotations={contract.SEED_INPUTS_ANNOTATION: self.seed_inputs},
        )
        self.job = k8s.batch.v1.Job(
            name,
            metadata=_job_metadata(self.name, contract.LOADER, namespace, skip_await=False),
            spec={
                # The first counted failure (bad config, a crash) fails the Job and `pulumi up` at once;
                # preemptions and transient exits are retried (failure_policy) until the deadline.
                "backoffLimit": 0,
                "activeDeadlineSeconds": cfg.jobs.loader_timeout_minutes * 60,
                "podFailurePolicy": failure_policy(contract.LOADER),
                "template": template,
            },
            opts=pulumi.ResourceOptions(
                parent=self,
                provider=provider,
                # Fixed names: a new image digest must delete the old Job before creating the new one.
                delete_before_replace=True,
                depends_on=[
                    redis.deployment, redis.network_policy, share.claim, self.runs,
                    *(identity.resources if identity else []), *(after or []),
                ],  # fmt: skip
                custom_timeouts=pulumi.CustomTimeouts(
                    create=f"{cfg.jobs.loader_timeout_minutes}m", update=f"{cfg.jobs.loader_timeout_minutes}m"
                ),
            ),
        )
        self.register_outputs({"name": self.name})


class TrainingJob(pulumi.ComponentResource):
    """``parallelism`` workers on spot GPUs draining the queue; started after the loader finished."""

    job: k8s.batch.v1.Job
    name: str

    def __init__(
        self,
        name: str,
        cfg: StackConfig,
        image: pulumi.Input[str],
        redis: RedisQueue,
        share: FilestoreShare,
        capacity: GpuCapacity,
        loader: LoaderJob,
        identity: WorkloadIdentity | None,
        provider: k8s.Provider,
        namespace: pulumi.Input[str],
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("spot-trainer:k8s:TrainingJob", name, None, opts)
        jobs = cfg.jobs
        self.name = f"{cfg.labels.app}-{contract.WORKER}"
        gpus = str(cfg.gpu.count)
        template = _pod_template(
            contract.WORKER,
            image,
            contract.WORKER_ARGS,
            {
                "requests": {"cpu": jobs.worker_cpu, "memory": jobs.worker_memory, GPU_RESOURCE: gpus},
                "limits": {"memory": jobs.worker_memory, GPU_RESOURCE: gpus},
            },
            cfg,
            redis,
            share,
            node_selector=capacity.node_selector,
            tolerations=capacity.tolerations,
            service_account=identity.ksa_name if identity else None,
            env=[{"name": contract.ENV_OUTPUT_URI, "value": cfg.data.output.uri}] if cfg.data.output else None,
            # Derived from what the loader seeds: a change there replaces this Job too (see seed_inputs).
            annotations={contract.SEED_INPUTS_ANNOTATION: loader.seed_inputs},
        )
        timeouts = None
        if not jobs.skip_await:
            wait = f"{jobs.timeout_minutes}m"
            timeouts = pulumi.CustomTimeouts(create=wait, update=wait)
        self.job = k8s.batch.v1.Job(
            name,
            metadata=_job_metadata(self.name, contract.WORKER, namespace, skip_await=jobs.skip_await),
            spec={
                # Work-queue Job: no completions; done when a pod exits 0 (queue drained) and none run.
                "parallelism": jobs.parallelism,
                "backoffLimit": jobs.backoff_limit,
                "activeDeadlineSeconds": jobs.active_deadline_seconds,
                "podFailurePolicy": failure_policy(contract.WORKER),
                "template": template,
            },
            opts=pulumi.ResourceOptions(
                parent=self,
                provider=provider,
                # Fixed names: a new image digest must delete the old Job before creating the new one.
                # A `parallelism` change replaces the Job too (pulumi-kubernetes lists .spec.parallelism
                # among a Job's replace-on-change fields, provider/pkg/provider/diff.go). Accepted, not
                # ignored: workers checkpoint and release on SIGTERM and the new Job resumes from the
                # share, while ignore_changes would keep the first value forever (docs/cloud.md).
                delete_before_replace=True,
                depends_on=[loader.job, *capacity.resources, *(identity.resources if identity else [])],
                custom_timeouts=timeouts,
            ),
        )
        self.register_outputs({"name": self.name})
