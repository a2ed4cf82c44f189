"""What the launcher may create: this stack's scheduled training and scoring Jobs, and nothing else.

RBAC cannot say it: ``create`` is authorized before the object's name is known, so ``resourceNames`` does not
limit it (kubernetes.io "Using RBAC Authorization": resourceNames and create), and a right to create Jobs is a
right to run any image as any service account of the namespace. A ValidatingAdmissionPolicy closes that: for
requests by the launcher's service account only (``matchConditions`` on ``request.userInfo.username``), a Job
is admitted only with one of the two fixed names, every container and init container running the stack's image
by digest, the service account its name calls for (the workers' for both; the namespace's ``default`` for
training when the stack has no output bucket, as the stack's own training Job), and the body its name calls for:
each container's name, command, args, environment and mounts, the pod's volumes and GPU count, equal to what
infra/schedule.py renders for that name. So a stolen launcher token can neither post the scoring body under the
training name (or the reverse) nor run the image with other arguments, variables or volumes.

What is compared is written as one line per entry (``pinned``), not as whole objects: the API server defaults a
Job before validating admission policies (kubernetes.io "Validating Admission Policy": validation runs after
mutation and defaulting), so a container gains ``imagePullPolicy``, ``terminationMessagePath`` and the like and a
``fieldRef`` gains ``apiVersion: v1`` (kubernetes pkg/apis/core/v1/defaults.go, SetDefaults_ObjectFieldSelector):
equality of whole containers would refuse the launcher's own bodies. CPU and memory are not compared: the API
server stores quantities in canonical form ("0.5" as "500m") and workerCpu is the user's text. The expressions are
standard CEL (has, map, ternaries, string concatenation, list equality) and are evaluated offline with cel-python
(tests/infra/test_admission_cel.py); the API server's cost budget for them was not measured (no live cluster).

Evidence: admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy and ValidatingAdmissionPolicyBinding are GA
and on by default since Kubernetes 1.30 (kubernetes.io "Validating Admission Policy": "v1.30 [stable]"; fields
matchConstraints, matchConditions, variables, validations, failurePolicy; binding validationActions and
matchResources.namespaceSelector). pulumi-kubernetes 4.34.2 (the installed SDK) has both types
(pulumi_kubernetes/admissionregistration/v1/ValidatingAdmissionPolicy.py, ...Binding.py). GKE runs the upstream
API server, so a GKE 1.30+ control plane admits them; no GKE page saying so was found with the search tool, and
nothing here was run on a live cluster. GKE_VAP says what the search found about Autopilot. Both objects are
cluster-scoped, so their names carry the namespace.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from infra import contract
from infra.gke import GPU_RESOURCE
from infra.kube import InCluster

POD = "object.spec.template.spec"


# Whether GKE Autopilot admits ValidatingAdmissionPolicy objects: the search tool found no GKE page that says so
# either way (queries "GKE Autopilot ValidatingAdmissionPolicy", "cloud.google.com kubernetes-engine
# ValidatingAdmissionPolicy CEL policy" over docs and pages, 2026-11-28: only kubernetes.io, KEDA and Gatekeeper
# pages). GKE's Autopilot page on privileged workloads (docs.cloud.google.com/kubernetes-engine/docs/concepts/
# about-autopilot-privileged-workloads) lists what Autopilot itself refuses and does not name these objects.
GKE_VAP = "not found in GKE's docs: unverified on Autopilot"


@dataclass(frozen=True)
class AdmissionArgs:
    """``launcher``: the launcher's Kubernetes service account; ``jobs``: Job name -> the Job manifest the launcher
    may post under it (infra/schedule.py, Outputs inside); ``image``: the stack's image by digest."""

    launcher: str
    jobs: dict[str, Any]
    image: pulumi.Input[str]


def username(namespace: str, account: str) -> str:
    """The API server's user name of a service account (kubernetes.io "Service accounts": the
    ``system:serviceaccount:<namespace>:<name>`` form)."""
    return f"system:serviceaccount:{namespace}:{account}"


def _cel(value: Any) -> str:
    """A CEL literal: strings and lists of strings are written as JSON writes them, which CEL reads alike."""
    return json.dumps(value)


def account_of(job: dict[str, Any]) -> str:
    """The service account a Job's pods run as (the namespace's ``default`` when the body names none)."""
    return job["spec"]["template"]["spec"].get("serviceAccountName", "default")


# One line per entry of what a body pins, the same in CEL (on the defaulted object) and in Python (on the rendered
# body): equal lines, equal entries. A value the API server omits when empty (EnvVar.value, VolumeMount.readOnly are
# omitempty) reads as absent in both.
ENV_LINE = ("e.name + (has(e.value) ? '=' + e.value : has(e.valueFrom) && has(e.valueFrom.secretKeyRef) ? "
            "' secret ' + e.valueFrom.secretKeyRef.name + '/' + e.valueFrom.secretKeyRef.key : has(e.valueFrom) && "
            "has(e.valueFrom.fieldRef) ? ' field ' + e.valueFrom.fieldRef.fieldPath : ' other')")
MOUNT_LINE = ("m.name + ' at ' + m.mountPath + (has(m.subPath) ? ' sub ' + m.subPath : '') + "
              "(has(m.readOnly) && m.readOnly ? ' ro' : '')")
VOLUME_LINE = ("v.name + (has(v.persistentVolumeClaim) ? ' claim ' + v.persistentVolumeClaim.claimName : "
               "has(v.configMap) ? ' configMap ' + v.configMap.name : ' other')")


def env_line(e: dict[str, Any]) -> str:
    source = e.get("valueFrom") or {}
    if e.get("value"):
        return f"{e['name']}={e['value']}"
    if "secretKeyRef" in source:
        return f"{e['name']} secret {source['secretKeyRef']['name']}/{source['secretKeyRef']['key']}"
    return f"{e['name']} field {source['fieldRef']['fieldPath']}" if "fieldRef" in source else f"{e['name']} other"


def mount_line(m: dict[str, Any]) -> str:
    return (f"{m['name']} at {m['mountPath']}" + (f" sub {m['subPath']}" if m.get("subPath") else "")
            + (" ro" if m.get("readOnly") else ""))


def volume_line(v: dict[str, Any]) -> str:
    if "persistentVolumeClaim" in v:
        return f"{v['name']} claim {v['persistentVolumeClaim']['claimName']}"
    return f"{v['name']} configMap {v['configMap']['name']}" if "configMap" in v else f"{v['name']} other"


def _lines(path: str, line: str, var: str) -> str:
    """A CEL list of ``line`` over the list at ``path`` (empty when the field is absent)."""
    return f"(has({path}) ? {path}.map({var}, {line}) : [])"


def _container_pin(path: str, c: dict[str, Any]) -> str:
    """The CEL check that the container at ``path`` is ``c``: name, no command, args, env, mounts, GPUs."""
    gpus = c.get("resources", {}).get("limits", {}).get(GPU_RESOURCE)
    gpu_check = (f"has({path}.resources.limits) && {_cel(GPU_RESOURCE)} in {path}.resources.limits && "
                 f"{path}.resources.limits[{_cel(GPU_RESOURCE)}] == {_cel(gpus)}" if gpus else
                 f"!(has({path}.resources.limits) && {_cel(GPU_RESOURCE)} in {path}.resources.limits) && "
                 f"!(has({path}.resources.requests) && {_cel(GPU_RESOURCE)} in {path}.resources.requests)")
    return " && ".join([
        f"{path}.name == {_cel(c['name'])}",
        f"!has({path}.command)", f"!has({path}.envFrom)",
        f"(has({path}.args) ? {path}.args : []) == {_cel(c.get('args', []))}",
        f"{_lines(f'{path}.env', ENV_LINE, 'e')} == {_cel([env_line(e) for e in c.get('env', [])])}",
        f"{_lines(f'{path}.volumeMounts', MOUNT_LINE, 'm')} == "
        f"{_cel([mount_line(m) for m in c.get('volumeMounts', [])])}",
        f"({gpu_check})",
    ])  # fmt: skip


def body_pin(job: dict[str, Any]) -> str:
    """The CEL check that the posted Job's pod is ``job``'s: each container and init container by position, the
    pod's volumes, no ephemeral containers."""
    pod = job["spec"]["template"]["spec"]
    volumes = [volume_line(v) for v in pod.get("volumes", [])]
    checks = [f"!has({POD}.ephemeralContainers)", f"{_lines(f'{POD}.volumes', VOLUME_LINE, 'v')} == {_cel(volumes)}"]
    for field in ("containers", "initContainers"):
        listed = pod.get(field, [])
        path = f"{POD}.{field}"
        checks.append(f"size(has({path}) ? {path} : []) == {len(listed)}")
        checks += [f"({_container_pin(f'{path}[{i}]', c)})" for i, c in enumerate(listed)]
    return " && ".join(checks)  # fmt: skip


def validations(jobs: dict[str, Any], image: str) -> list[dict[str, str]]:
    """The CEL checks every Job the launcher creates must pass (the request is denied with the message)."""
    names = sorted(jobs)
    by_name = " : ".join(f"object.metadata.name == {_cel(n)} ? {_cel(account_of(jobs[n]))}" for n in names) + " : ''"
    images = f"{POD}.containers.all(c, c.image == {_cel(image)}) && (!has({POD}.initContainers) || " \
             f"{POD}.initContainers.all(c, c.image == {_cel(image)}))"
    bodies = " : ".join(f"object.metadata.name == {_cel(n)} ? ({body_pin(jobs[n])})" for n in names) + " : false"
    return [
        {"expression": f"object.metadata.name in {_cel(names)}",
         "message": f"the launcher may create only the Jobs {', '.join(names)}"},
        {"expression": images, "message": f"every container of a launched Job runs the stack's image {image}"},
        {"expression": f"variables.account == ({by_name}) && (!has({POD}.serviceAccount) || "
                       f"{POD}.serviceAccount == variables.account)",
         "message": "a launched Job runs as the service account the stack gives it: "
                    + ", ".join(f"{n} as {account_of(jobs[n])}" for n in names)},
        {"expression": bodies,
         "message": "a launched Job's containers run what the stack renders for its name (args, environment, "
                    "mounts, volumes, GPUs): " + ", ".join(names)},
    ]  # fmt: skip


def policy_spec(namespace: str, args: AdmissionArgs, image: str, jobs: dict[str, Any]) -> dict[str, Any]:
    """The ValidatingAdmissionPolicy's spec: Job creations in ``namespace`` by the launcher, checked against
    ``jobs`` (the bodies, resolved)."""
    return {
        # Fail closed: a policy that cannot be evaluated denies the launcher's request (the launcher retries next
        # schedule); no other user is matched, so nothing else depends on it.
        "failurePolicy": "Fail",
        "matchConstraints": {
            "resourceRules": [{"apiGroups": ["batch"], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
                               "resources": ["jobs"]}],
        },
        "matchConditions": [{
            "name": "by-the-launcher",
            "expression": f"request.userInfo.username == {_cel(username(namespace, args.launcher))}",
        }],
        "variables": [{
            "name": "account",
            "expression": f"has({POD}.serviceAccountName) ? {POD}.serviceAccountName : 'default'",
        }],
        "validations": validations(jobs, image),
    }  # fmt: skip


class LaunchAdmission(pulumi.ComponentResource):
    """The policy and its binding (to the stack's namespace, action Deny)."""

    def __init__(self, name: str, args: AdmissionArgs, kube: InCluster, opts: pulumi.ResourceOptions | None = None
                 ) -> None:
        super().__init__("spot-trainer:k8s:LaunchAdmission", name, None, opts)
        namespace = kube.namespace_name
        self.name = f"{contract.APP}-{namespace}-{contract.LAUNCHER}"
        labels = contract.labels(contract.LAUNCHER)
        k8s_opts = pulumi.ResourceOptions(parent=self, provider=kube.provider)
        self.policy = k8s.admissionregistration.v1.ValidatingAdmissionPolicy(
            name,
            metadata={"name": self.name, "labels": labels},
            spec=pulumi.Output.all(args.image, pulumi.Output.from_input(args.jobs)).apply(
                lambda resolved: policy_spec(namespace, args, *resolved)),
            opts=k8s_opts,
        )
        self.binding = k8s.admissionregistration.v1.ValidatingAdmissionPolicyBinding(
            f"{name}-binding",
            metadata={"name": self.name, "labels": labels},
            spec={
                "policyName": self.name,
                "validationActions": ["Deny"],
                # Namespaces carry this label from the API server (kubernetes.io "Well-Known Labels").
                "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}},
            },
            opts=pulumi.ResourceOptions(parent=self, provider=kube.provider, depends_on=[self.policy]),
        )
        self.register_outputs({"name": self.name})
