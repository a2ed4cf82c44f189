"""The Google APIs the stack needs, enabled before anything that calls them."""

from __future__ import annotations

import pulumi
import pulumi_gcp as gcp

from infra.config import DataConfig

APIS = (
    "compute.googleapis.com",
    "container.googleapis.com",
    "file.googleapis.com",
    "artifactregistry.googleapis.com",
    # Service accounts (nodes, workloads) and their IAM bindings: a new project may not have it on.
    "iam.googleapis.com",
    # Project-level IAM members (the nodes' role) are read and written through Resource Manager.
    "cloudresourcemanager.googleapis.com",
    # GPU quota read before any GPU pod is created (infra/quota.py).
    "cloudquotas.googleapis.com",
)
# With datasetUri or outputUri: pods call Cloud Storage as their own service account (calls are accounted
# to that account's project), and the GKE metadata server mints its tokens through IAM Credentials.
DATA_APIS = ("storage.googleapis.com", "iamcredentials.googleapis.com")


# With binaryAuthorization: GKE asks the Binary Authorization API to evaluate the project's policy; the stack's
# attestations are Container Analysis occurrences signed by a Cloud KMS key (infra/binauthz.py).
BINARY_AUTHORIZATION_API = "binaryauthorization.googleapis.com"
CONTAINER_ANALYSIS_API = "containeranalysis.googleapis.com"


# With secretsKmsKey or filestoreKmsKey "stack": the stack creates its key rings and keys (infra/cluster.py,
# infra/filestore.py).
KMS_API = "cloudkms.googleapis.com"


# With vpcServiceControls: the perimeter is written through Access Context Manager, and Artifact Registry asks for
# it on a project whose registry is in a perimeter ("Create remote repositories", Before you begin).
PERIMETER_API = "accesscontextmanager.googleapis.com"


def apis(data: DataConfig, binary_authorization: bool = False, stack_key: bool = False,
         perimeter: bool = False) -> tuple[str, ...]:
    """The APIs a stack with this data configuration (and control-plane settings) calls."""
    return (APIS + (DATA_APIS if data.dataset or data.output else ())
            + ((BINARY_AUTHORIZATION_API, CONTAINER_ANALYSIS_API) if binary_authorization else ())
            + ((KMS_API,) if stack_key or binary_authorization else ())
            + ((PERIMETER_API,) if perimeter else ()))


class ProjectServices(pulumi.ComponentResource):
    """Enables the APIs; other components ``depends_on`` it (``self.services``)."""

    def __init__(
        self, name: str, project_id: str, services: tuple[str, ...], opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("spot-trainer:gcp:ProjectServices", name, None, opts)
        self.services = [
            gcp.projects.Service(
                api.split(".")[0],
                project=project_id,
                service=api,
                # Disabling an API on destroy can break other workloads in a shared project.
                disable_on_destroy=False,
                opts=pulumi.ResourceOptions(parent=self),
            )
            for api in services
        ]
        self.register_outputs({"services": [s.service for s in self.services]})
