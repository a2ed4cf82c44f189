"""Where a component's Kubernetes objects go: one small type that the platform's pieces (the share, the queue, the
identities) and the bundle of them (``infra.platform``) both take, so neither imports the other's module."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s


@dataclass(frozen=True)
class InCluster:
    """Where a component's Kubernetes objects go: ``namespace`` is the Namespace's own output (objects wait for
    it), ``namespace_name`` the same name as a plain string (in-cluster addresses, IAM members)."""

    provider: k8s.Provider
    namespace: pulumi.Input[str]
    namespace_name: str
