"""The launcher's admission policy evaluated as CEL (infra/admission.py), on the Job bodies the launcher posts and on
bodies changed the way a stolen launcher token would change them.

Needs cel-python (`celpy`, PyPI "cel-python", in requirements-test.txt): skipped without it. It evaluates
standard CEL, as the API server's cel-go does for these expressions (they use no Kubernetes extension library); the
API server itself is not run.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest

from infra import admission, contract, schedule
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
    activation["variables"] = celpy.json_to_cel({account["name"]: str(_run(account["expression"], activation))})
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
        "a GPU for the scorer": changed(scoring, lambda j, p: p[first][0]["resources"].setdefault(
            "limits", {}).update({"nvidia.com/gpu": "1"})),
        "a GPU requested by the scorer": changed(scoring, lambda j, p: p[first][0]["resources"].setdefault(
            "requests", {}).update({"nvidia.com/gpu": "1"})),
        "a second container": worker(lambda j, p: p[first].append({**p[first][0], "name": "side"})),
        "a scorer dropped": changed(scoring, lambda j, p: p[first].pop()),
        "the scorer's init args": changed(scoring, lambda j, p: p["initContainers"][0].update(args=["sleep"])),
    }
    verdicts = {case: verdict(policy, job, launcher) for case, job in cases.items()}
    assert verdicts == dict.fromkeys(cases, [body])


# Entries of every kind each line tells apart, as the API server stores them (empty omitempty fields left out).
ENTRIES = {
    "env": ([{"name": "A", "value": "1"}, {"name": "B", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
             {"name": "C", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}},
             {"name": "D", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}],
            ["A=1", "B secret s/k", "C field metadata.name", "D other"]),
    "mount": ([{"name": "a", "mountPath": "/a"}, {"name": "b", "mountPath": "/b", "subPath": "x"},
               {"name": "c", "mountPath": "/c", "readOnly": True}, {"name": "d", "mountPath": "/d", "readOnly": False},
               {"name": "e", "mountPath": "/e", "subPath": "y", "readOnly": True}],
              ["a at /a", "b at /b sub x", "c at /c ro", "d at /d", "e at /e sub y ro"]),
    "volume": ([{"name": "v", "persistentVolumeClaim": {"claimName": "share"}},
                {"name": "w", "configMap": {"name": "m"}}, {"name": "x", "emptyDir": {}}],
               ["v claim share", "w configMap m", "x other"]),
}
LINES = {"env": (admission.ENV_LINE, admission.env_line, "e"),
         "mount": (admission.MOUNT_LINE, admission.mount_line, "m"),
         "volume": (admission.VOLUME_LINE, admission.volume_line, "v")}


@pytest.mark.parametrize("kind", list(ENTRIES))
def test_every_kind_of_entry_reads_the_same_in_cel_and_in_python(kind: str) -> None:
    """A body's entries are compared as lines, written by CEL on the object and by Python on the rendered body:
    for each kind of variable, mount and volume the two lines are the same, and different kinds differ."""
    entries, lines = ENTRIES[kind]
    cel, python, var = LINES[kind]
    in_cel = _run(f"object.items.map({var}, {cel})", {"object": celpy.json_to_cel({"items": entries})})
    assert [str(line) for line in in_cel] == [python(e) for e in entries] == lines


def test_a_container_without_resources_is_pinned_to_no_gpu() -> None:
    """A body whose container declares no resources at all (nor limits), and none of args, variables, mounts or
    volumes, admits itself, and not itself with a GPU."""
    bare = {"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "i"}]}}}}  # no args, env, mounts
    no_limits = changed(bare, lambda j, p: p["containers"][0].update(resources={"requests": {"cpu": "1"}},
                                                                     args=["x"]))
    for job in (bare, no_limits):
        pin = admission.body_pin(job)
        assert _run(pin, {"object": celpy.json_to_cel(job)})
        gpu = changed(job, lambda j, p: p["containers"][0].setdefault("resources", {}).setdefault(
            "limits", {}).update({"nvidia.com/gpu": "1"}))
        assert not _run(pin, {"object": celpy.json_to_cel(gpu)})


def test_a_refused_job_is_told_which_rule_it_broke_in_the_stacks_own_names(rendered: Callable[..., Rendered]) -> None:
    """The API server denies the launcher's request with the broken rule's message: each names what is allowed."""
    policy, training, scoring, _ = _rendered(rendered)
    trains, scores = schedule.SCHEDULED_JOB, schedule.SCHEDULED_SCORING_JOB
    (first, second) = sorted([trains, scores])
    image = training["spec"]["template"]["spec"]["containers"][0]["image"]
    account = {trains: admission.account_of(training), scores: admission.account_of(scoring)}
    assert [v["message"] for v in policy["validations"]] == [
        f"the launcher may create only the Jobs {first}, {second}",
        f"every container of a launched Job runs the stack's image {image}",
        "a launched Job runs as the service account the stack gives it: "
        f"{first} as {account[first]}, {second} as {account[second]}",
        "a launched Job's containers run what the stack renders for its name (args, environment, mounts, volumes, "
        f"GPUs): {first}, {second}",
    ]
