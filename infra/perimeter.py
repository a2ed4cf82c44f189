"""VPC Service Controls (``vpcServiceControls``): a service perimeter around the stack's project.

IAM asks "may this identity call this API?"; a perimeter asks "may this call reach the project's data from where it
comes from?". With it, a stolen key of the workers' account cannot copy the card data from the bucket or the share's
backups from outside the project, and the pods cannot write it to a bucket of another project (Google's "Dry run
mode for service perimeters" and "Supported products" pages, cloud.google.com/vpc-service-controls/docs).

Who makes what. A perimeter lives in an access policy of the organisation. The organisation's admin makes a policy
*scoped* to this project and grants the deploy identity ``roles/accesscontextmanager.policyEditor`` on that policy
alone (cloud.google.com/access-context-manager/docs/scoped-policies: "delegated administrators can modify or read
that specific policy and not the organization's Access Context Manager policy"; vpc-service-controls/docs/
access-control: permissions only at the organisation or on a policy, "Access Context Manager permissions granted on
folders or projects have no effect on scoped policies"). The stack then declares the perimeter itself, so what it
restricts and who may come in are reviewed and tested with the code (docs/ci.md says why not the other way round).

Arguments (pulumi_gcp 10.2.0, the installed SDK: accesscontextmanager/service_perimeter.py ServicePerimeterArgs:
parent "accessPolicies/{policy_id}", title "unique within the Policy", name "accessPolicies/{policy_id}/
servicePerimeters/{short_name}", short name "must begin with a letter and only include alphanumeric and '_'",
perimeter_type, status, spec, use_explicit_dry_run_spec "must be set to True if any of the fields in the spec are
set"; _inputs.py ServicePerimeterStatusArgs/SpecArgs: resources "projects/{project_number}", restricted_services,
ingress_policies; IngressFrom identities and identity_type, sources access_level ("*": any source); IngressTo
resources ("*": every resource in the perimeter) and operations service_name with method_selectors method "*").
Nothing here was run against a live organisation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_gcp as gcp

from infra import contract
from infra.config import PerimeterConfig, Site

# What the perimeter restricts: every Google API the stack's data and image go through. Each is listed on Google's
# "Supported products and limitations" page (cloud.google.com/vpc-service-controls/docs/supported-products; the
# authority is `gcloud access-context-manager supported-services list`); Artifact Registry's own page asks for
# Binary Authorization, Artifact Analysis (containeranalysis) and GKE in the same perimeter as the registry
# (cloud.google.com/artifact-registry/docs/securing-with-vpc-sc).
RESTRICTED_SERVICES = (
    "storage.googleapis.com",  # datasetUri, outputUri: the card data and the scores
    "file.googleapis.com",  # the Filestore share's API (backups, snapshots)
    "artifactregistry.googleapis.com",  # the training image, the Docker Hub proxy
    "containeranalysis.googleapis.com",  # the image's scans and attestations
    "container.googleapis.com",  # the GKE API (not the Kubernetes API: kubectl is not a Google API)
    "cloudkms.googleapis.com",  # the Secrets key (secretsKmsKey: stack)
    "binaryauthorization.googleapis.com",
)
# The Artifact Registry remote repository (the Docker Hub proxy, infra/image.py) fetches from outside any perimeter:
# a project in a perimeter denies that unless its VPC-SC config for the region is ALLOW (pulumi_gcp
# artifactregistry/vpcsc_config.py VpcscConfigArgs: location, vpcsc_policy "Possible values are: DENY, ALLOW";
# Artifact Registry's "Create remote repositories": "If Artifact Registry is in a VPC Service Controls service
# perimeter, enable the Access Context Manager API"). The provider cannot delete it (terraform-provider-google-beta
# google-beta/services/artifactregistry/resource_artifact_registry_vpcsc_config.go, Delete: "cannot be deleted from
# Google Cloud", only forgotten): turning the perimeter off leaves ALLOW, which only lets remote repositories fetch.
# Its location and project are ForceNew there (lines 134, 153 at 02b32db096a8); make diff's facts do not list it.
REMOTE_REPOSITORIES_POLICY = "ALLOW"


@dataclass(frozen=True)
class PerimeterArgs:
    site: Site
    config: PerimeterConfig


def short_name(site: Site) -> str:
    """The perimeter's short name: a letter first, then letters, digits and '_' only."""
    return f"{contract.APP}_{site.slug}".replace("-", "_")


def perimeter_config(project_number: str, config: PerimeterConfig) -> dict[str, Any]:
    """The perimeter's configuration (``status`` when enforced, ``spec`` in dry run): the project inside, the
    restricted services, and one ingress rule for the named identities from anywhere to any method of them."""
    ingress = [{
        "ingressFrom": {"identities": list(config.ingress_identities), "sources": [{"accessLevel": "*"}]},
        "ingressTo": {"resources": ["*"], "operations": [
            {"serviceName": service, "methodSelectors": [{"method": "*"}]} for service in RESTRICTED_SERVICES]},
    }] if config.ingress_identities else []  # fmt: skip
    return {
        "resources": [f"projects/{project_number}"],
        "restrictedServices": list(RESTRICTED_SERVICES),
        "ingressPolicies": ingress,
    }


class ServicePerimeter(pulumi.ComponentResource):
    """The perimeter (dry run or enforced) in the configured access policy, and the registry's VPC-SC config that
    keeps the Docker Hub proxy working inside it."""

    def __init__(self, name: str, args: PerimeterArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("spot-trainer:gcp:ServicePerimeter", name, None, opts)
        site, config = args.site, args.config
        child = pulumi.ResourceOptions(parent=self)
        number = gcp.organizations.get_project_output(project_id=site.project_id, opts=pulumi.InvokeOutputOptions(
            parent=self)).number  # fmt: skip
        body = number.apply(lambda n: perimeter_config(n, config))
        self.perimeter = gcp.accesscontextmanager.ServicePerimeter(
            name,
            parent=config.access_policy,
            name=f"{config.access_policy}/servicePerimeters/{short_name(site)}",
            title=f"{contract.APP} {site.stack} {site.project_id}",
            perimeter_type="PERIMETER_TYPE_REGULAR",
            # Dry run: the configuration goes to ``spec`` and nothing is enforced (``status`` left empty).
            use_explicit_dry_run_spec=config.dry_run,
            spec=body if config.dry_run else None,
            status=None if config.dry_run else body,
            opts=child,
        )
        self.registry = gcp.artifactregistry.VpcscConfig(
            f"{name}-registry",
            location=site.region,
            vpcsc_policy=REMOTE_REPOSITORIES_POLICY,
            opts=child,
        )
        self.register_outputs({"perimeter": self.perimeter.name})
