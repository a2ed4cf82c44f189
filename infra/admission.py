"""What the launcher may create: this stack's scheduled training and scoring Jobs, and nothing else.

RBAC cannot say it: ``create`` is authorized before the object's name is known, so ``resourceNames`` does not
limit it (kubernetes.io "Using RBAC Authorization": resourceNames and create), and a right to create Jobs is a
right to run any image as any service account of the namespace. A ValidatingAdmissionPolicy closes that: for
requests by the launcher's service account only (``matchConditions`` on ``request.userInfo.username``), a Job
is admitted only with one of the two fixed names, every container and init container running the stack's image
by digest, and the service account its name calls for (the workers' for both; the namespace's ``default`` for
training when the stack has no output bucket, as the stack's own training Job).

Evidence: admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy and ValidatingAdmissionPolicyBinding are GA
and on by default since Kubernetes 1.30 (kubernetes.io "Validating Admission Policy": "v1.30 [stable]"; fields
matchConstraints, matchConditions, variables, validations, failurePolicy; binding validationActions and
matchResources.namespaceSelector). pulumi-kubernetes 4.34.2 (the installed SDK) has both types
(pulumi_kubernetes/admissionregistration/v1/ValidatingAdmissionPolicy.py, ...Binding.py). GKE runs the upstream
API server, so a GKE 1.30+ control plane admits them; no GKE page saying so was found with the search tool, and
nothing here was run on a live cluster. Both objects are cluster-scoped, so their names carry the namespace.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from infra import contract
from infra.kube import InCluster

POD = "object.spec.template.spec"


@dataclass(frozen=True)
class AdmissionArgs:
    """``launcher``: the launcher's Kubernetes service account; ``jobs``: Job name -> the service account its
    pods must run as; ``image``: the stack's image by digest."""

    launcher: str
    jobs: dict[str, str]
    image: pulumi.Input[str]


def username(namespace: str, account: str) -> str:
    """The API server's user name of a service account (kubernetes.io "Service accounts": the
    ``system:serviceaccount:<namespace>:<name>`` form)."""
    return f"system:serviceaccount:{namespace}:{account}"


def _cel(value: Any) -> str:
    """A CEL literal: strings and lists of strings are written as JSON writes them, which CEL reads alike."""
    return json.dumps(value)


def validations(jobs: dict[str, str], image: str) -> list[dict[str, str]]:
    """The CEL checks every Job the launcher creates must pass (the request is denied with the message)."""
    names = sorted(jobs)
    by_name = " : ".join(f"object.metadata.name == {_cel(n)} ? {_cel(jobs[n])}" for n in names) + " : ''"
    images = f"{POD}.containers.all(c, c.image == {_cel(image)}) && (!has({POD}.initContainers) || " \
             f"{POD}.initContainers.all(c, c.image == {_cel(image)}))"
    return [
        {"expression": f"object.metadata.name in {_cel(names)}",
         "message": f"the launcher may create only the Jobs {', '.join(names)}"},
        {"expression": images, "message": f"every container of a launched Job runs the stack's image {image}"},
        {"expression": f"variables.account == ({by_name}) && (!has({POD}.serviceAccount) || "
                       f"{POD}.serviceAccount == variables.account)",
         "message": "a launched Job runs as the service account the stack gives it: "
                    + ", ".join(f"{n} as {jobs[n]}" for n in names)},
    ]  # fmt: skip


def policy_spec(namespace: str, args: AdmissionArgs, image: str) -> dict[str, Any]:
    """The ValidatingAdmissionPolicy's spec: Job creations in ``namespace`` by the launcher, checked."""
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
        "validations": validations(args.jobs, image),
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
            spec=pulumi.Output.from_input(args.image).apply(lambda ref: policy_spec(namespace, args, ref)),
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
