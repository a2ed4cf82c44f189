"""The launcher's admission policy evaluated as CEL (infra/admission.py), on the Job bodies the launcher posts and on
bodies changed the way a stolen launcher token would change them.

Needs cel-python (`celpy`, PyPI "cel-python"), which the project's requirements do not carry yet: skipped without
it. It evaluates standard CEL, as the API server's cel-go does for these expressions (they use no Kubernetes
extension library); the API server itself is not run.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from infra import contract, render, schedule

celpy = pytest.importorskip("celpy")

POLICY = "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicy"
SCORED = {"schedule": "0 3 * * *", "datasetUri": "gs://acme-fraud/exports", "outputUri": "gs://acme-results/out"}


def _run(expression: str, activation: dict[str, Any]) -> Any:
    env = celpy.Environment()
    return env.program(env.compile(expression)).evaluate(activation)


def verdict(policy: dict[str, Any], job: dict[str, Any], user: str) -> str | list[str]:
    """"not matched", "admitted", or the messages of the failed validations."""
    activation = {"object": celpy.json_to_cel(job), "request": celpy.json_to_cel({"userInfo": {"username": user}})}
    if not all(_run(c["expression"], activation) for c in policy["matchConditions"]):
        return "not matched"
    (account,) = policy["variables"]
    activation["variables"] = celpy.json_to_cel({"account": str(_run(account["expression"], activation))})
    failed = [v["message"] for v in policy["validations"] if not _run(v["expression"], activation)]
    return failed or "admitted"


def test_the_policy_admits_the_launchers_two_jobs_and_nothing_else_from_it() -> None:
    r = render.render("dev", SCORED)
    policy = r.one(POLICY).inputs["spec"]
    data = r.one("kubernetes:core/v1:ConfigMap", "schedule-job").inputs["data"]
    training, scoring = json.loads(data[contract.LAUNCH_KEY]), json.loads(data[contract.SCORING_LAUNCH_KEY])
    launcher = f"system:serviceaccount:{r.config.namespace}:{contract.APP}-{contract.LAUNCHER}"
    assert verdict(policy, training, launcher) == verdict(policy, scoring, launcher) == "admitted"
    loader = f"system:serviceaccount:{r.config.namespace}:{contract.APP}-{contract.LOADER}"
    assert verdict(policy, {**training, "metadata": {"name": "x"}}, loader) == "not matched"

    def changed(job: dict[str, Any], edit: Any) -> dict[str, Any]:
        job = copy.deepcopy(job)
        edit(job, job["spec"]["template"]["spec"])
        return job

    name, image, account = (v["message"] for v in policy["validations"])
    cases = [
        (changed(training, lambda j, p: j["metadata"].update(name="miner")), [name, account]),
        (changed(training, lambda j, p: p["containers"][0].update(image="busybox")), [image]),
        (changed(scoring, lambda j, p: p["initContainers"][0].update(image="busybox")), [image]),
        (changed(training, lambda j, p: p.update(serviceAccountName=f"{contract.APP}-{contract.LOADER}")), [account]),
        (changed(training, lambda j, p: p.pop("serviceAccountName")), [account]),
        (changed(training, lambda j, p: p.update(serviceAccount=f"{contract.APP}-{contract.LOADER}")), [account]),
    ]
    for job, messages in cases:
        assert verdict(policy, job, launcher) == messages
    assert schedule.SCHEDULED_JOB in name and schedule.SCHEDULED_SCORING_JOB in name
