"""The training image: an Artifact Registry repository; ``workload/`` built and pushed on ``pulumi up``."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pulumi
import pulumi_docker_build as docker_build
import pulumi_gcp as gcp

from infra import contract
from infra.config import Site

REPO_ROOT = Path(__file__).resolve().parent.parent
IMAGE_NAME = "trainer"
CACHE_TAG = "buildcache"  # the registry build cache, next to the image in the same repository


def _from_cwd(path: str) -> str:
    """Repository path relative to the working directory: the CLI may run us from root or ``infra/``,
    and an absolute path would make the Image differ between machines."""
    return os.path.relpath(REPO_ROOT / path)


@dataclass(frozen=True)
class ImageArgs:
    """Where the repository goes (``site``), and who pulls the image: the nodes' service account member."""

    site: Site
    reader_member: pulumi.Input[str]


def _cache(ref: str) -> tuple[list[docker_build.CacheFromArgs], list[docker_build.CacheToArgs]]:
    """Layers come from the registry when unchanged (torch alone is gigabytes): CI runners and laptops start
    with an empty local cache. `max` keeps every stage's layers; image-manifest OCI cache is the form Artifact
    Registry stores."""
    return (
        [docker_build.CacheFromArgs(registry=docker_build.CacheFromRegistryArgs(ref=ref))],
        [
            docker_build.CacheToArgs(
                registry=docker_build.CacheToRegistryArgs(
                    ref=ref,
                    mode=docker_build.CacheMode.MAX,
                    image_manifest=True,
                    oci_media_types=True,
                )
            )
        ],
    )


class TrainingImage(pulumi.ComponentResource):
    """``ref`` is ``<repository>@sha256:<digest>``: a code change replaces the Jobs, no change keeps them."""

    ref: pulumi.Output[str]
    repository_url: str

    def __init__(self, name: str, args: ImageArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("spot-trainer:build:TrainingImage", name, None, opts)
        site = args.site
        repo_id = f"{site.labels.app}-{site.slug}"  # stacks may share a project and region
        registry = f"{site.region}-docker.pkg.dev"
        self._repository(name, site, repo_id, args.reader_member)
        self.repository_url = f"{registry}/{site.project_id}/{repo_id}/{IMAGE_NAME}"
        self.cache_ref = f"{self.repository_url}:{CACHE_TAG}"
        # The deployer's short-lived OAuth token: no key file, no `gcloud auth configure-docker` needed.
        token = gcp.organizations.get_client_config_output(opts=pulumi.InvokeOutputOptions(parent=self))
        cache_from, cache_to = _cache(self.cache_ref)
        self.image = docker_build.Image(
            name,
            context=docker_build.BuildContextArgs(location=_from_cwd(contract.IMAGE_CONTEXT)),
            dockerfile=docker_build.DockerfileArgs(location=_from_cwd(contract.IMAGE_DOCKERFILE)),
            platforms=[docker_build.Platform.LINUX_AMD64],
            tags=[f"{self.repository_url}:{site.slug}"],
            push=True,
            # `pulumi preview` (every pull request) does not build the CUDA image; `pulumi up` does.
            build_on_preview=False,
            cache_from=cache_from,
            cache_to=cache_to,
            registries=[
                docker_build.RegistryArgs(
                    address=registry, username="oauth2accesstoken", password=token.access_token
                )
            ],
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.repository]),
        )
        # The reference carries the grant as a dependency: whatever runs the image (the Jobs) is created
        # only once nodes may pull it, instead of racing the IAM binding into ImagePullBackOff.
        self.ref = pulumi.Output.all(self.image.digest, self.reader_grant.id).apply(
            lambda parts: f"{self.repository_url}@{parts[0]}"
        )
        self.register_outputs({"ref": self.ref})

    def _repository(self, name: str, site: Site, repo_id: str, reader_member: pulumi.Input[str]) -> None:
        child = pulumi.ResourceOptions(parent=self)
        self.repository = gcp.artifactregistry.Repository(
            name,
            project=site.project_id,
            location=site.region,
            repository_id=repo_id,
            format="DOCKER",
            description="Training images of spot-trainer",
            labels=site.labels.as_dict(),
            opts=child,
        )
        # Nodes pull with their own least-privilege account: read access to this repository only.
        self.reader_grant = gcp.artifactregistry.RepositoryIamMember(
            f"{name}-node-reader",
            project=site.project_id,
            location=site.region,
            repository=self.repository.repository_id,
            role="roles/artifactregistry.reader",
            member=reader_member,
            opts=child,
        )
