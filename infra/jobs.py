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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from infra import contract
from infra.config import DataConfig, JobConfig
from infra.gke import GPU_RESOURCE, ZONE_LABEL
from infra.gpu import GpuCapacity
from infra.platform import Platform
from infra.redis import RedisQueue
from workload.core import errors, preemption  # stdlib only: the exit codes' and the grace period's one definition

SKIP_AWAIT = "pulumi.com/skipAwait"
# The spot notice (workload/core/preemption.py, where the worker's stop budgets derive from it too); the
# worker releases its lease and exits inside it.
TERMINATION_GRACE_SECONDS = preemption.GRACE_PERIOD_S
SHARE_VOLUME = "share"
RUNS_VOLUME = "runs"

# The Job failure reasons pulumi-kubernetes' Job await stops on at once (provider/pkg/await/checker/job/
# check.go, collectJobConditionErrors, unchanged since 2021): any other Failed reason, such as
# "PodFailurePolicy" from a FailJob rule, is waited out until the await times out (30 or 120 minutes).
AWAIT_FAILURE_REASONS = ("BackoffLimitExceeded", "DeadlineExceeded")

# A Job's podFailurePolicy is immutable (kubernetes pkg/apis/batch/validation/validation.go,
# ValidateJobSpecUpdate: ValidateImmutableField(spec.PodFailurePolicy, ...)), but pulumi-kubernetes' diff does
# not list it among a Job's replace-on-change fields (provider/pkg/provider/diff.go: .spec.template and others),
# so a change to the rules alone would PATCH the Job and fail "field is immutable". The Jobs Pulumi manages
# name the path in replaceOnChanges (pulumi.com/docs "Resource option: replaceOnChanges", path syntax
# "spec.input"): the engine replaces them instead, old one first (fixed names, delete_before_replace).
REPLACE_ON_CHANGES = ["spec.podFailurePolicy"]

# Preemption or eviction: not the code's fault, retry without consuming backoffLimit.
IGNORE_DISRUPTIONS = {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}


@dataclass(frozen=True)
class JobArgs:
    """The Jobs' slice of the stack: their namespace, settings, data locations, GPUs per pod, and the
    share's zone when pods are pinned to it (``None``: anywhere in the region)."""

    namespace: str
    jobs: JobConfig
    data: DataConfig
    gpu_count: int
    share_zone: str | None


def failure_policy(container: str | None, gpu: bool = False, budget: bool = True) -> dict[str, Any]:
    """podFailurePolicy of the loader and training Jobs (first matching rule wins):

    - a preempted or evicted pod (DisruptionTarget) is retried and never counted;
    - a worker that exits with one of ``errors.RETRYABLE_EXIT_CODES`` (143: SIGTERM without the
      condition; 5: the stall watchdog gave a stuck read up) is retried and not counted: a new pod does
      better;
    - ``budget``: exit 3 means an infrastructure fault (Redis, the share) persisted for the pod's whole
      retry budget (``infraRetryBudgetMinutes``, handed to the worker as its Redis retry and give-up
      times), so the Job fails (FailJob) with the worker's reason in the pod's last log lines, instead of
      re-creating GPU pods for a day. Without a budget in the pod (the scoring Job), 3 is retried;
    - ``errors.EXIT_BAD_CONFIG`` is counted, as is every other failure (dead letters included). Not
      FailJob: the Job would end with reason PodFailurePolicy, which the provider's await does not
      recognise, and `pulumi up` would wait out its whole timeout. Counted against ``backoffLimit`` it
      ends in BackoffLimitExceeded, which the await reports at once with the pods' termination messages
      (the worker's one-line error). The loader has ``backoffLimit: 0``, so a bad config fails `pulumi up`
      on the loader's first pod, before any GPU pod exists.

    ``container``: the container whose exit codes the rules read; None for a pod of several containers
    that all exit by the same codes (the scoring Job's, one per run).
    """
    which = {"containerName": container} if container else {}
    retried = [*([] if budget else [errors.EXIT_INFRA]), *errors.RETRYABLE_EXIT_CODES]
    return {
        "rules": [
            IGNORE_DISRUPTIONS,
            {"action": "Ignore", "onExitCodes": {**which, "operator": "In", "values": sorted(retried)}},
            {
                "action": "Count",
                "onExitCodes": {**which, "operator": "In", "values": [errors.EXIT_BAD_CONFIG]},
            },
            *([{"action": "FailJob", "onExitCodes": {**which, "operator": "In", "values": [errors.EXIT_INFRA]}}]
              if budget else []),
            *([_fail_on_unusable_gpu(container)] if gpu else []),
        ]
    }


def _fail_on_unusable_gpu(container: str) -> dict[str, Any]:
    """GPU pods only: a GPU that CUDA cannot use (exit 6) fails the Job at once, since every new pod gets
    the same driver. FailJob ends the Job with reason PodFailurePolicy, which the provider's await does not
    stop on (AWAIT_FAILURE_REASONS): with jobAwait=wait, `pulumi up` reports it at jobTimeoutMinutes, with
    the pod's one-line error as its termination message. Counting instead would re-create GPU pods
    backoffLimit more times, each failing the same way."""
    return {
        "action": "FailJob",
        "onExitCodes": {"containerName": container, "operator": "In", "values": [errors.EXIT_GPU_UNUSABLE]},
    }


def seed_inputs(args: JobArgs, image_ref: str) -> str:
    """A short hash of everything the loader seeds from (runs, data source) and the image that runs.

    Both Jobs carry it as a pod-template annotation. A Job's template is immutable, so the Kubernetes
    provider replaces a Job whose template changed (pulumi-kubernetes provider/pkg/provider/diff.go lists
    ``.spec.template`` among a Job's force-new fields): a new run, a new dataset location or a new image
    replaces the loader, which seeds what is new, and the training Job, which trains it. The fixed
    ``dependsOn`` alone never re-ran a completed training Job."""
    data = args.data.dataset.uri if args.data.dataset else f"preset:{args.jobs.dataset_preset}"
    runs = json.loads(args.jobs.runs_json)
    facts = {"runs": runs, "data": data, "dataset": args.data.dataset_name, "image": image_ref}
    if args.data.columns_json or args.data.datetime_format:  # absent otherwise: existing stacks keep their hash
        facts["reading"] = [args.data.columns_json, args.data.datetime_format]
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:16]


def loader_env(data: DataConfig) -> list[dict[str, Any]] | None:
    """How `seed` reads the stack's data: its column mapping and date format, when the stack sets them."""
    env = [{"name": contract.ENV_DATASET_COLUMNS, "value": data.columns_json},
           {"name": contract.ENV_DATASET_DATETIME_FORMAT, "value": data.datetime_format}]
    return [e for e in env if e["value"]] or None


def _env(jobs: JobConfig, redis: RedisQueue) -> list[dict[str, Any]]:
    budget = str(jobs.infra_retry_budget_minutes * 60)
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
        # How long a pod rides out Redis or the share failing before it exits 3, which fails the Job.
        {"name": contract.ENV_REDIS_RETRY, "value": budget},
        {"name": contract.ENV_INFRA_GIVE_UP, "value": budget},
    ]


@dataclass(frozen=True)
class PodArgs:
    """What one Job's pod adds to what every workload pod has (infra.jobs ``_pod_template``).

    ``volumes``: extra (volume, mount) pairs; ``service_account``: a Workload Identity KSA (else the
    namespace's default account, which has no Google roles)."""

    component: str
    argv: list[str]
    resources: dict[str, Any]
    node_selector: dict[str, str] | None = None
    tolerations: list[dict[str, Any]] | None = None
    service_account: str | None = None
    env: list[dict[str, Any]] | None = None
    volumes: list[tuple[dict[str, Any], dict[str, Any]]] | None = None
    annotations: dict[str, pulumi.Input[str]] | None = None


def _pod_security_context() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": contract.WORKLOAD_UID,
        "runAsGroup": contract.WORKLOAD_UID,
        "fsGroup": contract.WORKLOAD_UID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _container(pod: PodArgs, image: pulumi.Input[str], args: JobArgs, platform: Platform) -> dict[str, Any]:
    return {
        "name": pod.component,
        "image": image,
        "args": pod.argv,
        "env": _env(args.jobs, platform.queue) + (pod.env or []),
        "resources": pod.resources,
        "securityContext": contract.restricted_security_context(),
        # The last log lines become the pod's termination message on a failure: the provider's
        # await prints it, so `pulumi up` shows the worker's own error.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [
            {"name": SHARE_VOLUME, "mountPath": contract.SHARE_DIR},
            *(mount for _, mount in pod.volumes or []),
        ],
    }


def _pod_template(pod: PodArgs, image: pulumi.Input[str], args: JobArgs, platform: Platform) -> dict[str, Any]:
    """Every workload pod: uid 10001, the share mounted, the queue's address and password in its environment."""
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": TERMINATION_GRACE_SECONDS,
        "automountServiceAccountToken": False,
        "securityContext": _pod_security_context(),
        "containers": [_container(pod, image, args, platform)],
        "volumes": [
            {"name": SHARE_VOLUME, "persistentVolumeClaim": {"claimName": platform.share.claim_name}},
            *(volume for volume, _ in pod.volumes or []),
        ],
    }
    if pod.service_account:
        spec["serviceAccountName"] = pod.service_account
        # Workload Identity needs the pod's service account token: Google's own GKE workloads turn it
        # back on for this (GoogleCloudPlatform/prometheus-engine#180: with automount off, pods could
        # not reach Google APIs through Workload Identity). None of these accounts has a Kubernetes
        # role: only the launcher's does, which has no Google identity (infra/schedule.py).
        spec["automountServiceAccountToken"] = True
    node_selector = pod.node_selector
    if args.share_zone:
        # The share lives in one zone: reading it from another costs inter-zone traffic on every read.
        node_selector = {**(node_selector or {}), ZONE_LABEL: args.share_zone}
    if node_selector:
        spec["nodeSelector"] = node_selector
    if pod.tolerations:
        spec["tolerations"] = pod.tolerations
    metadata: dict[str, Any] = {"labels": contract.labels(pod.component)}
    if pod.annotations:
        metadata["annotations"] = pod.annotations
    return {"metadata": metadata, "spec": spec}


def _job_metadata(
    name: str, component: str, namespace: pulumi.Input[str], skip_await: bool
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "labels": contract.labels(component)}
    if skip_await:
        metadata["annotations"] = {SKIP_AWAIT: "true"}
    return metadata


def _with_quota(metadata: dict[str, Any], quota: pulumi.Input[str] | None) -> dict[str, Any]:
    """A mark on the Job's own metadata that depends on the quota check, so the Job waits for it. A constant
    once the check passed: a raised limit must not touch the Job."""
    if quota is not None:
        passed = pulumi.Output.from_input(quota).apply(lambda _: "enough")
        metadata["annotations"] = {**metadata.get("annotations", {}), contract.GPU_QUOTA_ANNOTATION: passed}
    return metadata


def _timeouts(minutes: int | None) -> pulumi.CustomTimeouts | None:
    """How long `pulumi up` waits for a Job to complete (None: the provider's default, or no wait at all)."""
    return None if minutes is None else pulumi.CustomTimeouts(create=f"{minutes}m", update=f"{minutes}m")


def one_off_pod(
    args: JobArgs,
    platform: Platform,
    name: str,
    argv: list[str],
    command: list[str] | None = None,
    service_account: str | None = None,
) -> pulumi.Output[str]:
    """A ``kubectl run`` line for a throw-away pod with the loader's environment and share (for
    ``status`` and reading reports after the workers are gone); labelled loader so Redis admits it.
    ``service_account``: run as that Workload Identity account (an export to the output bucket)."""

    def render(ref: str) -> str:
        pod = PodArgs(contract.LOADER, argv, {}, service_account=service_account)
        template = _pod_template(pod, ref, args, platform)
        container = template["spec"]["containers"][0]
        container.pop("resources")
        container["name"] = name  # kubectl attaches to the container named like the pod
        if command:
            container["command"] = command
        overrides = {"apiVersion": "v1", "metadata": template["metadata"], "spec": template["spec"]}
        return (
            f"kubectl -n {args.namespace} run {name} --rm -i --restart=Never --image={ref} "
            f"--overrides='{json.dumps(overrides, separators=(',', ':'))}'"
        )

    return pulumi.Output.from_input(platform.image).apply(render)


def loader_template(
    args: JobArgs,
    platform: Platform,
    runs_config_map: pulumi.Input[str],
    seed_inputs: pulumi.Input[str],
    extra_args: list[str] | None = None,
    volumes: list[tuple[dict[str, Any], dict[str, Any]]] | None = None,
) -> dict[str, Any]:
    """The loader's pod (`seed` on CPU, the runs file mounted): the loader Job's and the schedule's."""
    runs_volume = (
        {"name": RUNS_VOLUME, "configMap": {"name": runs_config_map}},
        {"name": RUNS_VOLUME, "mountPath": contract.RUNS_DIR, "readOnly": True},
    )
    data, identity = args.data, platform.identities.loader
    pod = PodArgs(
        contract.LOADER,
        contract.loader_args(data.dataset_name, args.jobs.dataset_preset, data.dataset.uri if data.dataset else None)
        + (extra_args or []),
        {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "2Gi"}},
        service_account=identity.ksa_name if identity else None,
        volumes=[runs_volume, *(volumes or [])],
        annotations={contract.SEED_INPUTS_ANNOTATION: seed_inputs},
        env=loader_env(data),
    )
    return _pod_template(pod, platform.image, args, platform)


def loader_spec(jobs: JobConfig, template: dict[str, Any]) -> dict[str, Any]:
    """The loader Job's spec, and the scheduled loader's: the same exit codes, the same rules."""
    return {
        # The first counted failure (bad config, a crash) fails the Job (and `pulumi up`) at once;
        # preemptions and transient exits are retried (failure_policy) until the deadline.
        "backoffLimit": 0,
        "activeDeadlineSeconds": jobs.loader_timeout_minutes * 60,
        "podFailurePolicy": failure_policy(contract.LOADER),
        "template": template,
    }


def training_spec(
    args: JobArgs, platform: Platform, capacity: GpuCapacity, seed_inputs: pulumi.Input[str]
) -> dict[str, Any]:
    """The training Job's spec: the stack's training Job and the one the schedule starts share it."""
    jobs, identity = args.jobs, platform.identities.worker
    gpus = str(args.gpu_count)
    on_gpu = {GPU_RESOURCE: gpus} if args.gpu_count else {}  # trainOn=cpu: no GPU asked for
    pod = PodArgs(
        contract.WORKER,
        contract.WORKER_ARGS,
        {
            "requests": {"cpu": jobs.worker_cpu, "memory": jobs.worker_memory, **on_gpu},
            "limits": {"memory": jobs.worker_memory, **on_gpu},
        },
        node_selector=capacity.node_selector,
        tolerations=capacity.tolerations,
        service_account=identity.ksa_name if identity else None,
        env=[
            {"name": contract.ENV_EXPECTED_GPUS, "value": gpus},
            # On CPU, one torch thread: this model's matrices are too small for more (docs/benchmarks.md), and torch
            # would otherwise start one per core of the node, not of the pod's request.
            *([] if args.gpu_count else [{"name": contract.ENV_TORCH_THREADS, "value": "1"}]),
            *([{"name": contract.ENV_OUTPUT_URI, "value": args.data.output.uri}] if args.data.output else []),
        ],
        # Derived from what the loader seeds: a change there replaces this Job too (see seed_inputs).
        annotations={contract.SEED_INPUTS_ANNOTATION: seed_inputs},
    )
    return {
        # Work-queue Job: no completions; done when a pod exits 0 (queue drained) and none run.
        "parallelism": jobs.parallelism,
        "backoffLimit": jobs.backoff_limit,
        "activeDeadlineSeconds": jobs.active_deadline_seconds,
        "podFailurePolicy": failure_policy(contract.WORKER, gpu=bool(args.gpu_count)),
        "template": _pod_template(pod, platform.image, args, platform),
    }


def scoring_spec(args: JobArgs, platform: Platform, seed_inputs: pulumi.Input[str]) -> dict[str, Any]:
    """The scoring Job's spec: the stack's scoring Job and the one the schedule starts share it.

    An init container (``wait-drained``, CPU) first waits until the queue holds nothing pending or leased and
    the share's newest checkpoints hold every day of its plan, so every container scores with its run's newest
    model even when training still runs (a scheduled load, or jobAwait=skip). It waits at most the training
    Job's own deadline and exits 3 past it; the Job's deadline adds the scoring time (loaderTimeoutMinutes)
    to that wait."""
    jobs, output, identity = args.jobs, args.data.output, platform.identities.worker
    assert output is not None and identity is not None, "a scoring Job needs outputUri"
    resources = {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"memory": "4Gi"}}
    pod = PodArgs(contract.SCORER, [], resources, service_account=identity.ksa_name,
                  annotations={contract.SEED_INPUTS_ANNOTATION: seed_inputs})  # fmt: skip
    template = _pod_template(pod, platform.image, args, platform)
    (base,) = template["spec"]["containers"]
    dataset = args.data.dataset_name
    template["spec"]["containers"] = [  # container names are DNS labels; a run name need not be one
        {**base, "name": f"{contract.SCORER}-{i}", "args": contract.score_args(run, dataset, output.uri)}
        for i, run in enumerate(jobs.scored_runs)
    ]
    template["spec"]["initContainers"] = [{
        **base, "name": contract.WAIT_DRAINED, "args": contract.wait_drained_args(jobs.active_deadline_seconds),
        # 1Gi: wait-drained reads the share's plan and each run's newest checkpoint (torch, pandas: 310 MB
        # resident before the first checkpoint is read, measured with ru_maxrss), not Redis's counts alone.
        # 250m keeps CPU:memory within Autopilot's 1:1..1:6.5 for general-purpose Pods, which it would otherwise
        # raise itself (cloud.google.com/kubernetes-engine/docs/concepts/autopilot-resource-requests).
        "resources": {"requests": {"cpu": "250m", "memory": "1Gi"}, "limits": {"memory": "1Gi"}},
    }]  # fmt: skip
    return {
        # A bad input (exit 2) fails the Job on its first pod, as the loader's; infra exits retry.
        "backoffLimit": 0,
        "activeDeadlineSeconds": jobs.active_deadline_seconds + jobs.loader_timeout_minutes * 60,
        "podFailurePolicy": failure_policy(None, budget=False),
        "template": template,
    }


class _StackJob(pulumi.ComponentResource):
    """A component around one Job that Pulumi manages: the Job has a fixed name, so a replacement (a new
    image digest, new runs) must delete the old Job before creating the new one."""

    job: k8s.batch.v1.Job
    name: str

    def _declare(
        self,
        name: str,
        metadata: dict[str, Any],
        spec: dict[str, Any],
        provider: k8s.Provider,
        depends_on: list[pulumi.Resource],
        timeout_minutes: int | None,
    ) -> None:
        self.job = k8s.batch.v1.Job(
            name,
            metadata=metadata,
            spec=spec,
            opts=pulumi.ResourceOptions(
                parent=self,
                provider=provider,
                delete_before_replace=True,
                replace_on_changes=REPLACE_ON_CHANGES,
                depends_on=depends_on,
                custom_timeouts=_timeouts(timeout_minutes),
            ),
        )
        self.register_outputs({"name": self.name})


class LoaderJob(_StackJob):
    """Puts the datasets on the share (synced from ``datasetUri``, or simulated) and enqueues (run, day)
    items for the stack's ``runs``; always awaited, because workers that start on an empty queue would
    see it drained and exit 0."""

    runs: k8s.core.v1.ConfigMap
    seed_inputs: pulumi.Output[str]

    def __init__(
        self,
        name: str,
        args: JobArgs,
        platform: Platform,
        after: Sequence[pulumi.Resource] = (),
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        """``after``: what must be done before the load starts (the share handed to the workloads' uid)."""
        super().__init__("spot-trainer:k8s:LoaderJob", name, None, opts)
        jobs, namespace, identity, queue = args.jobs, platform.namespace, platform.identities.loader, platform.queue
        self.name = f"{contract.APP}-{contract.LOADER}"
        # The runs file `seed --runs-file` reads: the stack's `runs`, already checked by infra.config.
        self.runs = k8s.core.v1.ConfigMap(
            f"{name}-runs",
            metadata={
                "name": f"{contract.APP}-runs",
                "namespace": namespace,
                "labels": contract.labels(contract.LOADER),
            },
            data={contract.RUNS_KEY: jobs.runs_json},
            # Immutable: new runs mean a new ConfigMap (pulumi-kubernetes replaces an immutable ConfigMap
            # whatever its enableConfigMapMutable setting, provider/pkg/provider/diff.go), never a file
            # changing under a running loader. The name is fixed, so the old one goes first.
            immutable=True,
            opts=pulumi.ResourceOptions(parent=self, provider=platform.provider, delete_before_replace=True),
        )
        self.seed_inputs = pulumi.Output.from_input(platform.image).apply(lambda ref: seed_inputs(args, ref))
        template = loader_template(args, platform, self.runs.metadata.name, self.seed_inputs)
        self._declare(
            name,
            _job_metadata(self.name, contract.LOADER, namespace, skip_await=False),
            loader_spec(jobs, template),
            platform.provider,
            [
                queue.deployment, queue.network_policy, platform.share.claim, self.runs,
                *(identity.resources if identity else []), *after,
            ],  # fmt: skip
            jobs.loader_timeout_minutes,
        )


@dataclass(frozen=True)
class TrainingArgs:
    """The training Job's slice: the Jobs' settings, the GPU capacity its pods land on, the loader it follows
    (and whose seed inputs it carries), and the GPU quota check's result (infra/quota.py; ``None``: not
    checked): the Job is created only once it passed."""

    work: JobArgs
    capacity: GpuCapacity
    loader: LoaderJob
    quota: pulumi.Input[str] | None = None


class TrainingJob(_StackJob):
    """``parallelism`` workers on spot GPUs draining the queue; started after the loader finished."""

    def __init__(
        self, name: str, args: TrainingArgs, platform: Platform, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("spot-trainer:k8s:TrainingJob", name, None, opts)
        work, identity = args.work, platform.identities.worker
        jobs = work.jobs
        self.name = f"{contract.APP}-{contract.WORKER}"
        metadata = _job_metadata(self.name, contract.WORKER, platform.namespace, jobs.skip_await)
        # A `parallelism` change replaces the Job too (pulumi-kubernetes lists .spec.parallelism among a Job's
        # replace-on-change fields, provider/pkg/provider/diff.go). Accepted, not ignored: workers checkpoint
        # and release on SIGTERM and the new Job resumes from the share, while ignore_changes would keep the
        # first value forever (docs/cloud.md).
        self._declare(
            name,
            _with_quota(metadata, args.quota),
            training_spec(work, platform, args.capacity, args.loader.seed_inputs),
            platform.provider,
            [args.loader.job, *args.capacity.resources, *(identity.resources if identity else [])],
            None if jobs.skip_await else jobs.timeout_minutes,
        )


@dataclass(frozen=True)
class ScoringArgs:
    """The scoring Job's slice: the Jobs' settings, and the training Job and loader it follows."""

    work: JobArgs
    training: TrainingJob
    loader: LoaderJob


class ScoringJob(_StackJob):
    """With ``outputUri``: after training, each scored run's newest model (its newest promoted checkpoint
    on the share, read-only) scores the dataset's ``scoring/`` days, and the scores go to
    ``<outputUri>/<run>/scores/<day>.parquet``. On CPU (no GPU, no spot selector: a short Job that a
    preemption would only delay), as the workers' Google identity (the one that may write there). One
    container per run in one pod: the runs score side by side and the Job completes when all have."""

    def __init__(
        self, name: str, args: ScoringArgs, platform: Platform, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("spot-trainer:k8s:ScoringJob", name, None, opts)
        jobs, identity = args.work.jobs, platform.identities.worker
        assert args.work.data.output is not None and identity is not None, "a scoring Job needs outputUri"
        self.name = f"{contract.APP}-{contract.SCORER}"
        self._declare(
            name,
            _job_metadata(self.name, contract.SCORER, platform.namespace, skip_await=jobs.skip_await),
            # Replaced with the Jobs it follows: new data or a new image scores again (see seed_inputs).
            scoring_spec(args.work, platform, args.loader.seed_inputs),
            platform.provider,
            # After training (awaited with jobAwait=wait): the newest models are the trained ones.
            [args.training.job, *identity.resources],
            None if jobs.skip_await else jobs.loader_timeout_minutes,
        )
