"""The in-cluster Redis job queue: password in a Secret, AOF on a volume, reachable by loader/workers only."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s
import pulumi_random as random

from infra import contract
from infra.kube import InCluster

NAME = "redis"
AUTH_CONF_KEY = "auth.conf"  # Secret key holding `requirepass ...`, mounted as a Redis config file
AUTH_CONF_DIR = "/etc/redis-auth"
DATA_DIR = "/data"
# The official image's `redis` user (alpine variant: uid 999, gid 1000).
REDIS_UID, REDIS_GID = 999, 1000


@dataclass(frozen=True)
class RedisArgs:
    """The queue's slice of the stack: the Redis image, by digest (through the stack's Docker Hub proxy)."""

    image: pulumi.Input[str]


def _container(image: pulumi.Input[str], password_env: dict[str, Any]) -> dict[str, Any]:
    """The Redis container: the password from a config file (the Secret), never argv; AOF fsynced always."""
    return {
        "name": NAME,
        "image": image,
        # The password comes from a config file (the Secret), never argv.
        "args": [
            f"{AUTH_CONF_DIR}/{AUTH_CONF_KEY}",
            "--appendonly",
            "yes",
            # Every queue write reaches disk before it is acknowledged:
            # the queue writes a few times a second, and a lost write
            # could hand out a fencing token twice.
            "--appendfsync",
            "always",
            "--dir",
            DATA_DIR,
            "--port",
            str(contract.REDIS_PORT),
        ],
        "ports": [{"name": "redis", "containerPort": contract.REDIS_PORT}],
        # redis-cli reads REDISCLI_AUTH, so the probe has no password on argv.
        "env": [{"name": "REDISCLI_AUTH", **password_env}],
        "readinessProbe": {
            "exec": {"command": ["sh", "-c", "redis-cli ping | grep -q PONG"]},
            "initialDelaySeconds": 2,
            "periodSeconds": 5,
        },
        "livenessProbe": {
            "tcpSocket": {"port": contract.REDIS_PORT},
            "initialDelaySeconds": 10,
            "periodSeconds": 10,
        },
        "resources": {
            "requests": {"cpu": "250m", "memory": "512Mi"},
            "limits": {"memory": "1Gi"},
        },
        "securityContext": contract.restricted_security_context(),
        "volumeMounts": [
            {"name": "data", "mountPath": DATA_DIR},
            {"name": "auth", "mountPath": AUTH_CONF_DIR, "readOnly": True},
        ],
    }


def _pod_spec(container: dict[str, Any], claim: pulumi.Input[str], secret: pulumi.Input[str]) -> dict[str, Any]:
    """Redis's pod: non-root as the image's redis user, its data claim and the password file mounted."""
    return {
        "automountServiceAccountToken": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": REDIS_UID,
            "runAsGroup": REDIS_GID,
            "fsGroup": REDIS_GID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": [
            {"name": "data", "persistentVolumeClaim": {"claimName": claim}},
            {
                "name": "auth",
                "secret": {
                    "secretName": secret,
                    "items": [{"key": AUTH_CONF_KEY, "path": AUTH_CONF_KEY}],
                    "defaultMode": 0o440,
                },
            },
        ],
    }


def _clients_policy_spec(labels: dict[str, str]) -> dict[str, Any]:
    """Ingress to the Redis port from the loader's and the workers' pods (contract.REDIS_CLIENTS) only."""
    return {
        "podSelector": {"matchLabels": labels},
        "policyTypes": ["Ingress"],
        "ingress": [
            {
                "from": [
                    {
                        "podSelector": {
                            "matchLabels": {contract.NAME_LABEL: contract.APP},
                            "matchExpressions": [
                                {
                                    "key": contract.COMPONENT_LABEL,
                                    "operator": "In",
                                    "values": list(contract.REDIS_CLIENTS),
                                }
                            ],
                        }
                    }
                ],
                "ports": [{"protocol": "TCP", "port": contract.REDIS_PORT}],
            }
        ],
    }


class RedisQueue(pulumi.ComponentResource):
    """``url`` (no password in it) and ``secret_name``/``password_key`` for the password."""

    url: str
    service_name: str
    secret_name: str
    password_key: str

    def __init__(
        self, name: str, args: RedisArgs, kube: InCluster, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("spot-trainer:k8s:RedisQueue", name, None, opts)
        k8s_opts = pulumi.ResourceOptions(parent=self, provider=kube.provider)
        namespace, labels = kube.namespace, contract.labels(contract.REDIS)
        self.service_name = NAME
        self.secret_name = f"{NAME}-auth"
        self.password_key = contract.REDIS_PASSWORD_KEY
        self.url = f"redis://{NAME}.{kube.namespace_name}.svc.cluster.local:{contract.REDIS_PORT}/0"
        self.secret = self._secret(name, namespace, labels, k8s_opts)
        data = k8s.core.v1.PersistentVolumeClaim(
            f"{name}-data",
            metadata={
                "name": f"{NAME}-data",
                "namespace": namespace,
                "labels": labels,
                # GKE's default class binds on first consumer: awaiting "Bound" here would wait for the
                # Deployment that is created after this claim, forever.
                "annotations": {"pulumi.com/skipAwait": "true"},
            },
            spec={"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "10Gi"}}},
            opts=k8s_opts,
        )
        password_env = {"valueFrom": {"secretKeyRef": {"name": self.secret_name, "key": self.password_key}}}
        self.deployment = k8s.apps.v1.Deployment(
            name,
            metadata={"name": NAME, "namespace": namespace, "labels": labels},
            spec={
                "replicas": 1,
                # One writer on a ReadWriteOnce volume: stop the old pod before starting the new one.
                "strategy": {"type": "Recreate"},
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": _pod_spec(
                        _container(args.image, password_env), data.metadata.name, self.secret.metadata.name
                    ),
                },
            },
            opts=k8s_opts,
        )
        self.service = k8s.core.v1.Service(
            name,
            metadata={"name": NAME, "namespace": namespace, "labels": labels},
            spec={
                "type": "ClusterIP",
                "selector": labels,
                "ports": [{"name": "redis", "port": contract.REDIS_PORT, "targetPort": "redis"}],
            },
            opts=k8s_opts,
        )
        self.network_policy = k8s.networking.v1.NetworkPolicy(
            name,
            metadata={"name": f"{NAME}-clients", "namespace": namespace, "labels": labels},
            spec=_clients_policy_spec(labels),
            opts=k8s_opts,
        )
        self.register_outputs({"service": self.service_name, "url": self.url})

    def _secret(
        self, name: str, namespace: pulumi.Input[str], labels: dict[str, str], k8s_opts: pulumi.ResourceOptions
    ) -> k8s.core.v1.Secret:
        """A random password (no special characters: it goes into a Redis config line unquoted), as the
        password itself and as the ``requirepass`` line Redis reads."""
        password = random.RandomPassword(
            name, length=32, special=False, opts=pulumi.ResourceOptions(parent=self)
        )
        return k8s.core.v1.Secret(
            name,
            metadata={"name": self.secret_name, "namespace": namespace, "labels": labels},
            type="Opaque",
            string_data=pulumi.Output.secret(
                password.result.apply(
                    lambda pw: {self.password_key: pw, AUTH_CONF_KEY: f"requirepass {pw}\n"}
                )
            ),
            opts=k8s_opts,
        )
