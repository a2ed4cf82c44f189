"""The training image: an Artifact Registry repository; ``workload/`` built and pushed on ``pulumi up``. And the
stack's own Docker Hub proxy: an Artifact Registry remote repository that the Redis image is pulled through.

Remote repository (cloud.google.com/artifact-registry/docs/repositories, "Remote repository": a read-only proxy of
an upstream such as Docker Hub that caches the first pull of each version): pulumi_gcp 10.2
``artifactregistry.Repository`` with ``mode="REMOTE_REPOSITORY"`` and ``remote_repository_config.docker_repository
.public_repository="DOCKER_HUB"`` (the SDK's only allowed value; ``mode`` is ForceNew, infra/replacements.py).
The image keeps its digest: a registry serves a manifest by its digest whichever host it is asked through, so the
pin (``redisImage``'s ``@sha256:``) holds and a changed upstream tag changes nothing. Nodes pull with the
repository's reader grant (no Docker Hub rate limit per node IP, no pull through NAT from the internet), and
Artifact Analysis can scan the cached copy.
"""

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
DOCKER_HUB = "docker.io"
# Docker Hub's own image names: a name with no registry host is Docker Hub's, and one with no namespace is an
# official image under "library/" (distribution/reference's normalisation: "redis" is docker.io/library/redis).
OFFICIAL_NAMESPACE = "library"


def docker_hub_path(image: str) -> str | None:
    """``redis:7.4@sha256:..`` -> ``library/redis:7.4@sha256:..``: the path of a Docker Hub image inside a remote
    repository of Docker Hub; ``None`` for an image of another registry (a first part with '.' or ':', or
    ``localhost``), which is used as given."""
    first, sep, rest = image.partition("/")
    if sep and first == DOCKER_HUB:
        first, sep, rest = rest.partition("/")
        if not sep:
            return f"{OFFICIAL_NAMESPACE}/{first}"
    elif sep and ("." in first or ":" in first or first == "localhost"):
        return None
    return f"{first}/{rest}" if sep else f"{OFFICIAL_NAMESPACE}/{first}"


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
        self._docker_hub(name, site, f"{repo_id}-hub", args.reader_member)
        self.repository_url = f"{registry}/{site.project_id}/{repo_id}/{IMAGE_NAME}"
        self.docker_hub_url = f"{registry}/{site.project_id}/{repo_id}-hub"
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

    def from_docker_hub(self, image: str) -> pulumi.Output[str]:
        """``image`` (by digest) pulled through the stack's Docker Hub proxy, once nodes may read it; an image of
        another registry as given."""
        path = docker_hub_path(image)
        if path is None:
            return pulumi.Output.from_input(image)
        return self.hub_reader_grant.id.apply(lambda _: f"{self.docker_hub_url}/{path}")

    def _docker_hub(self, name: str, site: Site, repo_id: str, reader_member: pulumi.Input[str]) -> None:
        child = pulumi.ResourceOptions(parent=self)
        self.hub = gcp.artifactregistry.Repository(
            f"{name}-docker-hub",
            project=site.project_id,
            location=site.region,
            repository_id=repo_id,
            format="DOCKER",
            mode="REMOTE_REPOSITORY",
            remote_repository_config=gcp.artifactregistry.RepositoryRemoteRepositoryConfigArgs(
                description="Docker Hub",
                docker_repository=gcp.artifactregistry.RepositoryRemoteRepositoryConfigDockerRepositoryArgs(
                    public_repository="DOCKER_HUB"),
            ),
            description="Docker Hub images of spot-trainer (Redis), cached in the stack's project",
            labels=site.labels.as_dict(),
            opts=child,
        )
        self.hub_reader_grant = gcp.artifactregistry.RepositoryIamMember(
            f"{name}-docker-hub-node-reader",
            project=site.project_id,
            location=site.region,
            repository=self.hub.repository_id,
            role="roles/artifactregistry.reader",
            member=reader_member,
            opts=child,
        )

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
