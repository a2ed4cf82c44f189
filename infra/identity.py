"""Workload Identity for the pods that touch Cloud Storage: one Google service account per component,
no key, and roles on the user's bucket only.

A Kubernetes service account (KSA) annotated ``iam.gke.io/gcp-service-account: <GSA email>`` acts as
that Google service account (GSA) once the GSA grants ``roles/iam.workloadIdentityUser`` to the member
``serviceAccount:<project>.svc.id.goog[<namespace>/<ksa>]`` (cloud.google.com/kubernetes-engine/docs/
how-to/workload-identity). The GKE metadata server then hands the pod short-lived tokens for the GSA;
Autopilot always runs it, and the Standard cluster of ``infra.cluster`` sets ``workloadIdentityConfig``
and ``GKE_METADATA`` on its node pools. No key is created, and no node-wide scope is widened.

Roles are granted on the bucket (``storage.BucketIAMMember``), never on the project:
- the loader reads the dataset: ``roles/storage.objectViewer`` on the ``datasetUri`` bucket, limited by an IAM
  condition to the objects under its prefix and to listing under it (``GcsUri.readable``) when ``datasetUri``
  names one; a ``datasetUri`` that is a whole bucket (``gs://<bucket>``) reads that bucket, as declared;
- the workers write results: ``roles/storage.objectUser`` on the ``outputUri`` bucket with an IAM
  condition ``resource.name.startsWith("projects/_/buckets/<b>/objects/<prefix>/")``, so they can create
  and overwrite objects under the prefix and nothing else (listing is checked against the bucket's own
  name, which the condition does not match, so it is not granted either). ``outputUri`` must name a prefix
  (``infra.config`` refuses ``gs://<bucket>`` alone): write access to a whole bucket is never granted.

IAM Conditions on a bucket need uniform bucket-level access on it (cloud.google.com/storage/docs/access-control/
iam#conditions: "you must enable uniform bucket-level access on the bucket"); ``uniform_access_checked`` reads
each such bucket at preview (``gcp.storage.get_bucket``: the provider's ``uniform_bucket_level_access``) and fails
with one line naming the bucket and the setting.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_gcp as gcp
import pulumi_kubernetes as k8s

from infra import contract
from infra.config import GcsUri, Site
from infra.kube import InCluster

WORKLOAD_IDENTITY_USER = "roles/iam.workloadIdentityUser"
READ_OBJECTS = "roles/storage.objectViewer"
# objectUser, not objectCreator: a run exported again (after new days) overwrites its files, and
# overwriting an object needs storage.objects.delete, which objectCreator lacks.
WRITE_OBJECTS = "roles/storage.objectUser"


@dataclass(frozen=True)
class BucketGrant:
    """``role`` on ``location``'s bucket; ``prefix_only``: limited by an IAM condition to its prefix."""

    role: str
    location: GcsUri
    prefix_only: bool

    def condition(self) -> gcp.storage.BucketIAMMemberConditionArgs | None:
        if not self.prefix_only:
            return None
        if self.role == READ_OBJECTS:  # the loader lists the dataset's files too
            what, expression = "dataset", self.location.readable()
        else:
            what, expression = "results", f'resource.name.startsWith("{self.location.objects}")'
        return gcp.storage.BucketIAMMemberConditionArgs(
            title=f"only {self.location.uri}/"[:100],
            description=f"Objects under this prefix only (spot-trainer {what})",
            expression=expression,
        )


class BucketAccessError(RuntimeError):
    """A bucket a conditional grant goes on cannot take IAM Conditions; the message says which and how to fix it."""


def uniform_access_problem(bucket: str, uniform: bool | None, key: str) -> str:
    """One line when ``bucket`` (of config ``key``) has uniform bucket-level access off ('' when on)."""
    if uniform:
        return ""
    return (f"bucket gs://{bucket} (config {key}) has uniform bucket-level access off; the stack's prefix-limited "
            "grant on it is an IAM Condition, which needs it on: `gcloud storage buckets update "
            f"gs://{bucket} --uniform-bucket-level-access`")


def uniform_access_checked(
    grant: BucketGrant, key: str, provider: pulumi.ProviderResource | None, gate: pulumi.Input[str] | None = None
) -> pulumi.Output[str]:
    """``grant``'s bucket name, once its uniform bucket-level access is read and on (at preview as at `up`: the
    bucket is the user's, it exists before the stack). Without ``prefix_only`` there is no condition to check.
    ``gate``: an output the read waits for (the provider's services)."""
    bucket = grant.location.bucket
    if not grant.prefix_only:
        return pulumi.Output.from_input(bucket)

    def read(_: Any) -> str:
        found = gcp.storage.get_bucket(name=bucket, opts=pulumi.InvokeOptions(provider=provider))
        problem = uniform_access_problem(bucket, found.uniform_bucket_level_access, key)
        if problem:
            raise BucketAccessError(problem)
        return bucket

    return pulumi.Output.all(gate).apply(read)


def workload_member(pool: str, namespace: str, ksa: str) -> str:
    """The IAM principal of a Kubernetes service account in the workload identity pool ``pool``
    (``<project>.svc.id.goog``)."""
    return f"serviceAccount:{pool}[{namespace}/{ksa}]"


@dataclass(frozen=True)
class IdentityArgs:
    """One component's identity: where its account goes (``site``), the cluster's workload identity pool,
    the component it is for, and its bucket grants.

    ``workload_pool``: the cluster's pool output, never the project's name typed in: the pool exists only once
    the cluster does, and IAM refuses a binding to a member of a pool that does not exist ("Identity Pool does
    not exist": terraform-google-modules/terraform-google-kubernetes-engine#916 fixed it the same way). The
    output carries the dependency on the cluster."""

    site: Site
    workload_pool: pulumi.Input[str]
    component: str
    grants: tuple[BucketGrant, ...]
    # Each grant's bucket name as the grant takes it: an output that fails when the bucket cannot take the
    # grant's condition (``uniform_access_checked``); the plain name when not given.
    checked_buckets: tuple[pulumi.Input[str], ...] = ()


class WorkloadIdentity(pulumi.ComponentResource):
    """A GSA, the KSA that acts as it, and the GSA's bucket roles. Pods opt in with
    ``serviceAccountName: <ksa_name>``."""

    ksa_name: str
    account: gcp.serviceaccount.Account
    service_account: k8s.core.v1.ServiceAccount

    def __init__(
        self, name: str, args: IdentityArgs, kube: InCluster, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("spot-trainer:iam:WorkloadIdentity", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        site, component = args.site, args.component
        self.ksa_name = f"{site.labels.app}-{component}"
        self.account = gcp.serviceaccount.Account(
            name,
            project=site.project_id,
            # 6-30 characters; the stack slug keeps dev and prod apart in one project.
            account_id=f"{site.labels.app}-{site.slug}"[:23].rstrip("-") + f"-{component}"[:7],
            display_name=f"{site.labels.app} {component} pods ({site.stack})",
            description=f"Workload Identity of the {component} pods; bucket roles only, no key",
            opts=child,
        )
        self.service_account = k8s.core.v1.ServiceAccount(
            name,
            metadata={
                "name": self.ksa_name,
                "namespace": kube.namespace,
                "labels": contract.labels(component),
                "annotations": {contract.GCP_SERVICE_ACCOUNT_ANNOTATION: self.account.email},
            },
            # The pods that use it mount its token (infra.jobs): Workload Identity exchanges it. The
            # account is bound to no Kubernetes role, so the token opens nothing in the cluster.
            opts=pulumi.ResourceOptions(parent=self, provider=kube.provider),
        )
        binding = gcp.serviceaccount.IAMMember(
            f"{name}-workload-identity",
            # The GSA's fully-qualified name (projects/<p>/serviceAccounts/<email>), as the SDK asks.
            service_account_id=self.account.name,
            role=WORKLOAD_IDENTITY_USER,
            member=pulumi.Output.from_input(args.workload_pool).apply(
                lambda pool: workload_member(pool, kube.namespace_name, self.ksa_name)
            ),
            opts=child,
        )
        buckets = args.checked_buckets or tuple(g.location.bucket for g in args.grants)
        self.grants = [self._grant(name, grant, bucket) for grant, bucket in zip(args.grants, buckets, strict=True)]
        # Pods that start before the binding exists get 403s from the metadata server: wait for all of it.
        self.resources: list[pulumi.Resource] = [self.service_account, binding, *self.grants]
        self.register_outputs({"email": self.account.email, "ksa": self.ksa_name})

    def _grant(self, name: str, grant: BucketGrant, bucket: pulumi.Input[str]) -> gcp.storage.BucketIAMMember:
        return gcp.storage.BucketIAMMember(
            f"{name}-{grant.role.rsplit('.', 1)[-1].lower()}",
            bucket=bucket,
            role=grant.role,
            member=self.account.member,
            condition=grant.condition(),
            opts=pulumi.ResourceOptions(parent=self),
        )
