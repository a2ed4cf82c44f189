"""What the workloads share, handed to each of their components as one bundle.

``Platform`` is where Kubernetes objects go (``infra.kube.InCluster``: the cluster's provider and the stack's
namespace) and what every Job's pod is wired to: the image, the Google identities, the share and the queue.
Built once by ``infra.program.platform`` (the tests build it through the same function), read by
``infra.jobs``, ``infra.schedule`` and ``infra.share_prep``.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s

from infra.filestore import FilestoreShare
from infra.identity import WorkloadIdentity
from infra.kube import InCluster
from infra.redis import RedisQueue


@dataclass(frozen=True)
class Identities:
    """The Workload Identities of the pods that call Cloud Storage (``None``: the stack does not read or write
    a bucket, and those pods run as the namespace's default account, which has no Google role)."""

    loader: WorkloadIdentity | None
    worker: WorkloadIdentity | None


@dataclass(frozen=True)
class Platform:
    """The shared pieces every workload component is wired to."""

    kube: InCluster
    image: pulumi.Input[str]  # the training image by digest
    identities: Identities
    share: FilestoreShare
    queue: RedisQueue

    @property
    def provider(self) -> k8s.Provider:
        return self.kube.provider

    @property
    def namespace(self) -> pulumi.Input[str]:
        return self.kube.namespace
