"""Batch scoring in the cloud (issue 22, Build 6): with outputUri, a CPU Job after training scores the
dataset's scoring/ days with each run's newest model and writes the scores under <outputUri>/<run>/scores/.

The Job is checked for what it means: the `score` command's contract (issues 20 and 22) in its args, its
place after the training Job, its identity, strict validity against Kubernetes 1.33, the policy pack, and
its failure rules played through the Job controller.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import kubernetes_validate
import pytest

from infra import config, contract, jobs, render
from infra.render import Rendered
from policy import offline
from tests.infra.job_controller import FailedPod, JobController
from workload.core import errors

Render = Callable[..., Rendered]
JOB = "kubernetes:batch/v1:Job"
POLICY = "kubernetes:networking.k8s.io/v1:NetworkPolicy"
OUTPUT = {"outputUri": "gs://acme-results/spot-trainer/main"}
SWEEP = {"main": {}, "wide": {"hidden": [128, 64]}}


@pytest.mark.parametrize("stack", render.stack_names())
def test_scoring_follows_training_with_each_runs_newest_model(stack: str, rendered: Render) -> None:
    r = rendered(stack, runs=SWEEP, **OUTPUT)
    scoring, training = r.one(JOB, "scoring"), r.one(JOB, "training")
    assert training.urn in scoring.dependencies
    pod = scoring.inputs["spec"]["template"]["spec"]
    assert [c["args"] for c in pod["containers"]] == [
        ["score", "--model", f"/mnt/share/output/{run}", "--datasets", "/mnt/share/datasets/fraud",
         "--days", "scoring", "--out", f"gs://acme-results/spot-trainer/main/{run}/scores/"]
        for run in ("main", "wide")
    ]  # fmt: skip
    assert pod["serviceAccountName"] == f"{contract.APP}-{contract.WORKER}"  # may write under outputUri only
    assert not any("nvidia.com/gpu" in str(c["resources"]) for c in pod["containers"])  # CPU
    assert "cloud.google.com/gke-spot" not in str(pod.get("nodeSelector"))
    kubernetes_validate.validate(render.to_manifest(scoring), "1.33", strict=True)
    assert offline.mandatory(offline.check_rendered(r)) == []
    assert r.outputs["scoringJob"] == "spot-trainer-scorer"


def test_no_output_bucket_no_scoring_and_score_run_picks_one(rendered: Render) -> None:
    assert not [j for j in rendered("dev").of_type(JOB) if j.name == "scoring"]
    one = rendered("dev", runs=SWEEP, scoreRun="wide", **OUTPUT).one(JOB, "scoring")
    (container,) = one.inputs["spec"]["template"]["spec"]["containers"]
    assert container["args"][2] == "/mnt/share/output/wide"
    with pytest.raises(config.ConfigError) as err:
        config.load(render.stack_config("dev", {"runs": SWEEP, "scoreRun": "narrow", **OUTPUT}), stack="dev")
    assert str(err.value) == (
        "config spot-trainer:scoreRun='narrow' is not allowed: empty (every run) or one of the runs: main, wide"
    )


@pytest.mark.parametrize("stack", render.stack_names())
def test_bad_input_fails_scoring_at_once_and_infra_faults_retry(stack: str, rendered: Render) -> None:
    """The `score` contract: exit 2 is the user's file (a new pod cannot help), 3 the bucket or share."""
    spec = rendered(stack, runs=SWEEP, **OUTPUT).one(JOB, "scoring").inputs["spec"]
    job = JobController(spec)
    # The scorer has no retry budget of its own: a bucket that does not answer is retried (to its deadline).
    assert job.pod_failed(FailedPod({"scorer-1": errors.EXIT_INFRA, "scorer-0": 0})) is None
    assert job.pod_failed(FailedPod({"scorer-0": 1}, ("DisruptionTarget",))) is None
    assert job.pod_failed(FailedPod({"scorer-0": 0, "scorer-1": errors.EXIT_BAD_CONFIG})) == "BackoffLimitExceeded"
    # Nothing ends it with FailJob, whose reason (PodFailurePolicy) the provider's await waits out: not even a rule
    # on exit 3 behind the Ignore rule that catches it first.
    assert [r for r in spec["podFailurePolicy"]["rules"] if r["action"] == "FailJob"] == []


@pytest.mark.parametrize("stack", render.stack_names())
def test_the_scorer_waits_for_training_within_its_deadline_on_cpu_it_reserves(stack: str, rendered: Render) -> None:
    """The init container waits at most the training Job's deadline (through the worker's own wait-drained
    command), the Job's deadline adds the scoring time to it, and both containers reserve what they use."""
    from workload.cli import parser

    r = rendered(stack, runs=SWEEP, **OUTPUT)
    scoring, training, loader = r.one(JOB, "scoring"), r.one(JOB, "training"), r.one(JOB, "loader")
    spec, cfg = scoring.inputs["spec"], config.load(render.stack_config(stack, {"runs": SWEEP, **OUTPUT}),
                                                   stack=stack)
    pod = spec["template"]["spec"]
    (wait,) = pod["initContainers"]
    assert wait["name"] == contract.WAIT_DRAINED and wait["image"] == pod["containers"][0]["image"]
    assert wait["args"] == [contract.WAIT_DRAINED, "--timeout", str(cfg.jobs.active_deadline_seconds)]
    assert parser().parse_args(wait["args"]).timeout == cfg.jobs.active_deadline_seconds  # the CLI's own flag
    assert wait["resources"] == {"requests": {"cpu": "250m", "memory": "1Gi"}, "limits": {"memory": "1Gi"}}
    assert {c["name"]: c["resources"] for c in pod["containers"]} == {
        f"{contract.SCORER}-{i}": {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"memory": "4Gi"}}
        for i in range(len(SWEEP))}
    assert spec["activeDeadlineSeconds"] == (
        training.inputs["spec"]["activeDeadlineSeconds"] + cfg.jobs.loader_timeout_minutes * 60)
    annotations = spec["template"]["metadata"]["annotations"]
    assert annotations[contract.SEED_INPUTS_ANNOTATION] == (
        loader.inputs["spec"]["template"]["metadata"]["annotations"][contract.SEED_INPUTS_ANNOTATION])
    assert scoring.type == JOB and scoring.parent.endswith("spot-trainer:k8s:ScoringJob::scoring")


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A label selector's matchLabels and In expressions (all the Redis NetworkPolicy uses)."""
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items()) and all(
        e["operator"] == "In" and labels.get(e["key"]) in e["values"] for e in selector.get("matchExpressions", []))


@pytest.mark.parametrize("stack", render.stack_names())
def test_the_scoring_job_is_deployed_like_the_jobs_it_follows(stack: str, rendered: Render) -> None:
    """Its fixed name and namespace, through the cluster's provider, deleted before it is replaced; awaited for
    loaderTimeoutMinutes, or marked skipAwait with jobAwait=skip as the training Job is; and its pod labelled so
    the Redis NetworkPolicy admits it (the init container reads the queue)."""
    r = rendered(stack, runs=SWEEP, **OUTPUT)
    scoring, training, cfg = r.one(JOB, "scoring"), r.one(JOB, "training"), r.config
    skip = {"annotations": {jobs.SKIP_AWAIT: "true"}} if cfg.jobs.skip_await else {}
    assert scoring.inputs["metadata"] == {
        "name": f"{contract.APP}-{contract.SCORER}", "namespace": cfg.namespace,
        "labels": contract.labels(contract.SCORER), **skip}  # fmt: skip
    assert scoring.provider == training.provider and "pulumi:providers:kubernetes::cluster::" in scoring.provider
    assert scoring.delete_before_replace is True  # a fixed name: the old Job goes first
    minutes = f"{cfg.jobs.loader_timeout_minutes}m"
    assert scoring.custom_timeouts == ({} if cfg.jobs.skip_await else {"create": minutes, "update": minutes})
    labels = scoring.inputs["spec"]["template"]["metadata"]["labels"]
    assert labels == contract.labels(contract.SCORER)
    policy = r.one(POLICY, "redis")
    assert any(_selects(peer["podSelector"], labels) for rule in policy.inputs["spec"]["ingress"]
               for peer in rule["from"])  # fmt: skip


@pytest.mark.parametrize("stack", render.stack_names())
def test_training_waits_for_the_gpu_quota_check(stack: str, rendered: Render) -> None:
    """The training Job's own metadata carries the quota check's mark (a constant once it passed), beside its
    skipAwait mark with jobAwait=skip, and depends on what the check depends on: created only after it.
    (Here because the jobs mutation group's whole-stack renders are this file's, bench/mutation.py.)"""
    r = rendered(stack, runs=SWEEP, **OUTPUT)
    training = r.one(JOB, "training")
    skip = {jobs.SKIP_AWAIT: "true"} if r.config.jobs.skip_await else {}
    assert training.inputs["metadata"]["annotations"] == {**skip, contract.GPU_QUOTA_ANNOTATION: "enough"}
    quotas_api = r.one("gcp:projects/service:Service", "cloudquotas")  # the check reads it once it is enabled
    assert quotas_api.urn in training.property_dependencies["metadata"]
