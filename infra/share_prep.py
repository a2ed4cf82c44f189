"""Hands the Filestore share's root to the workloads' uid before the loader writes to it.

A new Filestore share is owned by root with mode 755, so only root on a client can write (Filestore
access-control docs), and ``fsGroup`` does nothing for NFS volumes (Kubernetes: NFS volumes do not
support ownership management). The loader and the workers run as uid 10001 in a namespace that
enforces the ``restricted`` Pod Security Standard, which forbids root. So a one-shot Job runs as root
in a namespace of its own, enforcing ``baseline`` (which allows uid 0 and the CHOWN capability, and
nothing else that ``restricted`` forbids here), and does ``chown 10001:10001`` on the share root: not
recursive (it takes a second on any share), idempotent, and a no-op on a share already handed over.
The workloads' namespace stays ``restricted``. docs/cloud.md says why this and not the alternatives.

The namespace denies all pod traffic, both ways, with no allowance on top: the step needs no network. The kubelet
mounts the NFS share from the node, outside the pod's network, and NetworkPolicy governs pod traffic only
(kubernetes.io "Network Policies"); the pod resolves no name, fetches no token (none is mounted) and calls no API.
"""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from infra import contract
from infra.jobs import REPLACE_ON_CHANGES
from infra.platform import Platform

# Pod Security level of the preparation namespace: the least that admits a root container.
PREP_POD_SECURITY = "baseline"
# The only capability the step needs (root owns the share root, so chmod needs nothing more).
PREP_CAPABILITIES = ["CHOWN"]
MOUNT = "/share"
# Runs in the training image (already pulled by the loader next): sh and coreutils, nothing fetched.
SCRIPT = (
    'set -eu; cd "$SHARE"; '
    'chown "$OWNER" .; chmod 0755 .; '
    'echo "share root is now $(stat -c %u:%g .) mode $(stat -c %a .)"'
)


def prep_namespace(namespace: str) -> str:
    """``<namespace>-share-prep``, cut to a DNS label's 63 characters."""
    return f"{namespace[:52].rstrip('-')}-share-prep"


def _pod_spec(image: pulumi.Input[str]) -> dict[str, Any]:
    """Root with CHOWN alone, the share mounted at MOUNT, SCRIPT run once."""
    uid = contract.WORKLOAD_UID
    return {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "securityContext": {
            "runAsUser": 0,
            "runAsGroup": 0,
            "runAsNonRoot": False,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [
            {
                "name": contract.SHARE_PREP,
                "image": image,
                "command": ["sh", "-c", SCRIPT],
                "env": [
                    {"name": "SHARE", "value": MOUNT},
                    {"name": "OWNER", "value": f"{uid}:{uid}"},
                ],
                "resources": {
                    "requests": {"cpu": "250m", "memory": "256Mi"},
                    "limits": {"memory": "256Mi"},
                },
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "privileged": False,
                    "capabilities": {"drop": ["ALL"], "add": PREP_CAPABILITIES},
                },
                "terminationMessagePolicy": "FallbackToLogsOnError",
                "volumeMounts": [{"name": "share", "mountPath": MOUNT}],
            }
        ],
        "volumes": [{"name": "share", "persistentVolumeClaim": {"claimName": "share"}}],
    }


class SharePreparation(pulumi.ComponentResource):
    """``job`` completes once uid 10001 owns the share root; the loader ``depends_on`` it."""

    job: k8s.batch.v1.Job
    namespace: k8s.core.v1.Namespace

    def __init__(self, name: str, platform: Platform, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("spot-trainer:storage:SharePreparation", name, None, opts)
        provider = platform.provider
        k8s_opts = pulumi.ResourceOptions(parent=self, provider=provider)
        labels = contract.labels(contract.SHARE_PREP)
        self.namespace = k8s.core.v1.Namespace(
            name,
            metadata={
                "name": prep_namespace(platform.kube.namespace_name),
                "labels": {
                    contract.NAME_LABEL: contract.APP,
                    "pod-security.kubernetes.io/enforce": PREP_POD_SECURITY,
                },
            },
            opts=k8s_opts,
        )
        ns = self.namespace.metadata.name
        # As infra/network_policy.py's default deny: every pod, both types, no rule.
        deny = k8s.networking.v1.NetworkPolicy(
            f"{name}-default-deny",
            metadata={"name": "default-deny", "namespace": ns, "labels": {contract.NAME_LABEL: contract.APP}},
            spec={"podSelector": {}, "policyTypes": ["Ingress", "Egress"]},
            opts=k8s_opts,
        )
        # A PV binds one claim: this namespace gets its own pair on the same share, same mount options.
        _, claim = platform.share.bind(f"{name}-share", ns, "share", "share-prep")
        self.job = k8s.batch.v1.Job(
            name,
            metadata={"name": f"{contract.APP}-{contract.SHARE_PREP}", "namespace": ns, "labels": labels},
            spec={
                "backoffLimit": 3,
                "podFailurePolicy": {
                    "rules": [
                        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
                    ]
                },
                "template": {"metadata": {"labels": labels}, "spec": _pod_spec(platform.image)},
            },
            opts=pulumi.ResourceOptions(
                parent=self,
                provider=provider,
                # Fixed name: a new image digest deletes the old Job before the new one runs again.
                delete_before_replace=True,
                # Its podFailurePolicy is immutable as every Job's (infra.jobs REPLACE_ON_CHANGES).
                replace_on_changes=REPLACE_ON_CHANGES,
                depends_on=[claim, deny],
                # A new node and the training image pull come first: minutes, not seconds.
                custom_timeouts=pulumi.CustomTimeouts(create="15m", update="15m"),
            ),
        )
        self.register_outputs({"namespace": ns})
