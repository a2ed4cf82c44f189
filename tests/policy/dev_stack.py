"""The dev stack's workloads and network resources as the pack sees them after ``make render STACK=dev``.

Copied from the render (stack rules' view: outputs, secrets unwrapped, ``id`` added) and trimmed to the
keys the rules read or a careless edit would touch; ``test_policy_stacks.py`` checks that every key and
value here is still what the stack renders, so a rule test built on these shapes judges the stack's real
resources without paying for a render in each mutant's test run. Each function returns a fresh copy to
change.
"""

from __future__ import annotations

import copy
from typing import Any

from policy.rules import Resource

NAMESPACE = "spot-trainer"
PREP_NAMESPACE = "spot-trainer-share-prep"
IMAGE = "us-central1-docker.pkg.dev/spot-trainer-test/spot-trainer-dev/trainer@sha256:" + "ab" * 32
# Redis through the stack's own Docker Hub proxy (an Artifact Registry remote repository), still by digest.
REDIS_IMAGE = ("us-central1-docker.pkg.dev/spot-trainer-test/spot-trainer-dev-hub/library/redis:7.4-alpine"
               "@sha256:858f009f9709ce576febc734aa78b8f6d624b82571f9ddb6bda4377c833b3499")
COMPUTE_CLASS_NAME = "spot-trainer-gpu"
# The mocks' stand-in for the RandomPassword: no real secret.
MOCK_PASSWORD = "p" * 32


def _labels(component: str) -> dict[str, str]:
    return {"app.kubernetes.io/component": component, "app.kubernetes.io/name": "spot-trainer"}


def _password_env(name: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"secretKeyRef": {"key": "password", "name": "redis-auth"}}}


_WORKLOAD_CONTEXT = {
    "runAsNonRoot": True,
    "seccompProfile": {"type": "RuntimeDefault"},
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
}

_SHARE_PREP: dict[str, Any] = {
    "metadata": {"name": "spot-trainer-share-prep", "namespace": PREP_NAMESPACE, "labels": _labels("share-prep")},
    "kind": "Job",
    "spec": {
        "template": {
            "metadata": {"labels": _labels("share-prep")},
            "spec": {
                "containers": [
                    {
                        "volumeMounts": [{"mountPath": "/share", "name": "share"}],
                        "securityContext": {
                            "privileged": False,
                            "allowPrivilegeEscalation": False,
                            "capabilities": {"drop": ["ALL"], "add": ["CHOWN"]},
                        },
                        "image": IMAGE,
                        "command": [
                            "sh",
                            "-c",
                            'set -eu; cd "$SHARE"; chown "$OWNER" .; chmod 0755 .; '
                            'echo "share root is now $(stat -c %u:%g .) mode $(stat -c %a .)"',
                        ],
                        "env": [{"value": "/share", "name": "SHARE"}, {"value": "10001:10001", "name": "OWNER"}],
                        "name": "share-prep",
                    }
                ],
                "securityContext": {
                    "runAsGroup": 0.0,
                    "seccompProfile": {"type": "RuntimeDefault"},
                    "runAsUser": 0.0,
                    "runAsNonRoot": False,
                },
                "volumes": [{"persistentVolumeClaim": {"claimName": "share"}, "name": "share"}],
                "restartPolicy": "Never",
            },
        },
    },
    "apiVersion": "batch/v1",
    "id": "share-prep-id",
}

_REDIS: dict[str, Any] = {
    "metadata": {"name": "redis", "namespace": NAMESPACE, "labels": _labels("redis")},
    "kind": "Deployment",
    "spec": {
        "template": {
            "metadata": {"labels": _labels("redis")},
            "spec": {
                "containers": [
                    {
                        "volumeMounts": [
                            {"mountPath": "/data", "name": "data"},
                            {"readOnly": True, "mountPath": "/etc/redis-auth", "name": "auth"},
                        ],
                        "securityContext": _WORKLOAD_CONTEXT,
                        "image": REDIS_IMAGE,
                        "env": [_password_env("REDISCLI_AUTH")],
                        "args": [
                            "/etc/redis-auth/auth.conf",
                            "--appendonly",
                            "yes",
                            "--appendfsync",
                            "always",
                            "--dir",
                            "/data",
                            "--port",
                            "6379",
                        ],  # fmt: skip
                        "name": "redis",
                    }
                ],
                "securityContext": {
                    "runAsGroup": 1000.0,
                    "seccompProfile": {"type": "RuntimeDefault"},
                    "runAsUser": 999.0,
                    "fsGroup": 1000.0,
                    "runAsNonRoot": True,
                },
                "volumes": [
                    {"persistentVolumeClaim": {"claimName": "redis-data"}, "name": "data"},
                    {
                        "secret": {
                            "defaultMode": 288.0,
                            "secretName": "redis-auth",
                            "items": [{"key": "auth.conf", "path": "auth.conf"}],
                        },
                        "name": "auth",
                    },
                ],
            },
        },
    },
    "apiVersion": "apps/v1",
    "id": "redis-id",
}

_RUNTIME_ENV = [
    {"value": "/mnt/share", "name": "SHARE_DIR"},
    {"value": "redis://redis.spot-trainer.svc.cluster.local:6379/0", "name": "REDIS_URL"},
    _password_env("REDIS_PASSWORD"),
    {"valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}, "name": "WORKER_ID"},
    {"value": "30", "name": "LEASE_TTL_SECONDS"},
    {"value": "10", "name": "CHECKPOINT_INTERVAL_SECONDS"},
    {"value": "5", "name": "MAX_ATTEMPTS"},
    {"value": "1800", "name": "REDIS_RETRY_SECONDS"},
    {"value": "1800", "name": "INFRA_GIVE_UP_SECONDS"},
]


def _runtime_job(component: str, name: str, pod: dict[str, Any], container: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": _labels(component)},
        "kind": "Job",
        "spec": {
            "template": {
                "metadata": {"labels": _labels(component)},
                "spec": {
                    **pod,
                    "securityContext": {
                        "runAsGroup": 10001.0,
                        "seccompProfile": {"type": "RuntimeDefault"},
                        "runAsUser": 10001.0,
                        "fsGroup": 10001.0,
                        "runAsNonRoot": True,
                    },
                    "containers": [
                        {
                            "securityContext": _WORKLOAD_CONTEXT,
                            "image": IMAGE,
                            "env": _RUNTIME_ENV,
                            "name": component,
                            **container,
                        }
                    ],
                    "restartPolicy": "Never",
                },
            },
        },
        "apiVersion": "batch/v1",
        "id": f"{'training' if component == 'worker' else component}-id",
    }


_LOADER = _runtime_job(
    "loader",
    "spot-trainer-loader",
    {"nodeSelector": {"topology.kubernetes.io/zone": "us-central1-a"}},
    {
        "resources": {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "2Gi"}},
        "args": ["seed", "--runs-file", "/etc/spot-trainer/runs.json", "--dataset", "fraud", "--preset", "cluster"],
    },
)

_TRAINING = _runtime_job(
    "worker",
    "spot-trainer-worker",
    {
        "nodeSelector": {
            "topology.kubernetes.io/zone": "us-central1-a",
            "cloud.google.com/compute-class": COMPUTE_CLASS_NAME,
        },
        "tolerations": [
            {"value": "true", "key": "cloud.google.com/gke-spot", "operator": "Equal", "effect": "NoSchedule"},
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        ],
    },
    {
        "resources": {
            "requests": {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "1"},
            "limits": {"memory": "16Gi", "nvidia.com/gpu": "1"},
        },
        "args": ["worker"],
        "env": [*_RUNTIME_ENV, {"value": "1", "name": "EXPECTED_GPUS"}],
    },
)

_SECRET: dict[str, Any] = {
    "type": "Opaque",
    "stringData": {"auth.conf": f"requirepass {MOCK_PASSWORD}\n", "password": MOCK_PASSWORD},
    "metadata": {"name": "redis-auth", "namespace": NAMESPACE, "labels": _labels("redis")},
    "kind": "Secret",
    "apiVersion": "v1",
    "id": "redis-id",
}

_COMPUTE_CLASS: dict[str, Any] = {
    "metadata": {"name": COMPUTE_CLASS_NAME, "labels": {"app.kubernetes.io/name": "spot-trainer"}},
    "kind": "ComputeClass",
    "spec": {
        "nodePoolAutoCreation": {"enabled": True},
        "whenUnsatisfiable": "DoNotScaleUp",
        "priorities": [{"spot": True, "gpu": {"type": "nvidia-l4", "driverVersion": "latest", "count": 1.0}}],
    },
    "apiVersion": "cloud.google.com/v1",
    "id": "gpu-id",
}

_NETWORK_POLICY: dict[str, Any] = {
    "metadata": {"name": "redis-clients", "namespace": NAMESPACE, "labels": _labels("redis")},
    "kind": "NetworkPolicy",
    "spec": {
        "policyTypes": ["Ingress"],
        "ingress": [
            {
                "ports": [{"protocol": "TCP", "port": 6379.0}],
                "from": [
                    {
                        "podSelector": {
                            "matchLabels": {"app.kubernetes.io/name": "spot-trainer"},
                            "matchExpressions": [
                                {"key": "app.kubernetes.io/component", "operator": "In",
                                 "values": ["loader", "worker", "scorer", "launcher"]}
                            ],
                        }
                    }
                ],
            }
        ],
        "podSelector": {"matchLabels": _labels("redis")},
    },
    "apiVersion": "networking.k8s.io/v1",
    "id": "redis-id",
}



def _default_deny(namespace: str, name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": "default-deny", "namespace": namespace,
                     "labels": {"app.kubernetes.io/name": "spot-trainer"}},
        "kind": "NetworkPolicy",
        "spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]},
        "apiVersion": "networking.k8s.io/v1",
        "id": f"{name}-id",
    }


_NETWORK: dict[str, Any] = {"name": "network", "id": "network-id", "project": "spot-trainer-test"}
_LABELS = {"app": "spot-trainer", "env": "dev", "team": "ml-platform"}
_CLUSTER: dict[str, Any] = {
    "enableAutopilot": True,
    "releaseChannel": {"channel": "REGULAR"},
    "privateClusterConfig": {"enablePrivateNodes": True, "enablePrivateEndpoint": False},
    "resourceLabels": _LABELS,
    "subnetwork": "network-id",
    "workloadIdentityConfig": {"workloadPool": "spot-trainer-test.svc.id.goog"},
    "network": "network-id",
    "deletionProtection": True,
    "id": "cluster-id",
}
_FILESTORE: dict[str, Any] = {
    "tier": "BASIC_HDD",
    "networks": [{"connectMode": "DIRECT_PEERING", "network": "network", "modes": ["MODE_IPV4"]}],
    "labels": _LABELS,
    "id": "share-id",
}

_POLICY = "kubernetes:networking.k8s.io/v1:NetworkPolicy"
# (type, resource name) -> props, in the order the stack registers them.
SHAPES: dict[tuple[str, str], dict[str, Any]] = {
    ("gcp:compute/network:Network", "network"): _NETWORK,
    ("gcp:filestore/instance:Instance", "share"): _FILESTORE,
    ("gcp:container/cluster:Cluster", "cluster"): _CLUSTER,
    ("kubernetes:cloud.google.com/v1:ComputeClass", "gpu"): _COMPUTE_CLASS,
    ("kubernetes:core/v1:Secret", "redis"): _SECRET,
    ("kubernetes:networking.k8s.io/v1:NetworkPolicy", "redis"): _NETWORK_POLICY,
    (_POLICY, "network-policy-default-deny"): _default_deny(NAMESPACE, "network-policy-default-deny"),
    (_POLICY, "share-prep-default-deny"): _default_deny(PREP_NAMESPACE, "share-prep-default-deny"),
    ("kubernetes:apps/v1:Deployment", "redis"): _REDIS,
    ("kubernetes:batch/v1:Job", "share-prep"): _SHARE_PREP,
    ("kubernetes:batch/v1:Job", "loader"): _LOADER,
    ("kubernetes:batch/v1:Job", "training"): _TRAINING,
}


def props(type_: str, name: str) -> dict[str, Any]:
    """A fresh copy of one resource's properties, to change."""
    return copy.deepcopy(SHAPES[(type_, name)])


def resource(type_: str, name: str, changed: dict[str, Any] | None = None) -> Resource:
    """The resource as a stack rule sees it, with ``changed`` as its properties if given."""
    return Resource(type_, name, f"urn:pulumi:dev::spot-trainer::{type_}::{name}", changed or props(type_, name))


def stack(*changed: Resource) -> list[Resource]:
    """Every resource above in the stack's order, each of ``changed`` in place of its namesake."""
    by_key = {(r.type, r.name): r for r in changed}
    return [by_key.get(key) or resource(*key) for key in SHAPES]
