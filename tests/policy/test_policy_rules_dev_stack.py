"""Each rule over dev's own resources (tests/policy/dev_stack.py, checked against the render), then over
the same resources changed the way a careless edit would change them: the verdict and the message."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from infra import contract
from policy import rules
from policy.rules import Resource, StackFacts
from tests.policy import dev_stack

JOB = "kubernetes:batch/v1:Job"
DEPLOYMENT = "kubernetes:apps/v1:Deployment"
DEV = StackFacts(stack="dev", labels={"env": "dev", "app": contract.APP, "team": "ml-platform"})


def pod(props: dict[str, Any]) -> dict[str, Any]:
    return props["spec"]["template"]["spec"]


def first(props: dict[str, Any]) -> dict[str, Any]:
    return pod(props)["containers"][0]


def test_dev_passes_every_rule() -> None:
    resources = dev_stack.stack()
    # The rules awaiting the infra branch (rules.AWAITING_INFRA) read settings this model of today's dev stack
    # does not have yet; tests/policy/test_policy_rules.py and test_policy_stacks.py see each of them fail.
    for rule in (r for r in rules.RULES if r.name not in rules.AWAITING_INFRA):
        if rule.check_stack:
            assert rule.check_stack(resources, DEV) == [], rule.name
        else:
            assert rule.check_resource
            extra = {"protect": True} if rule.reads_protect else {}  # the BASIC share is protected by Pulumi
            for r in resources:
                assert rule.check_resource(r.type, r.props, DEV, **extra) == [], (rule.name, r.type, r.name)


# --- the share-preparation Job: the one root container, with CHOWN alone ---------------------------------

PREP = "Job 'spot-trainer-share-prep': container 'share-prep'"
ROOT = [
    f"{PREP} does not set runAsNonRoot: true (pod or container securityContext)",
    f"{PREP} runs as uid 0 (root)",
]


def share_prep() -> dict[str, Any]:
    return dev_stack.props(JOB, "share-prep")


def capabilities(props: dict[str, Any]) -> dict[str, Any]:
    return first(props)["securityContext"]["capabilities"]


def test_the_share_preparation_runs_as_root_with_chown_alone() -> None:
    assert rules.containers_run_as_non_root(JOB, share_prep(), DEV) == []


def _relabelled(props: dict[str, Any]) -> None:
    props["spec"]["template"]["metadata"]["labels"] = contract.labels(contract.LOADER)


@pytest.mark.parametrize(
    "edit",
    [
        _relabelled,  # its pod spec copied into another component: the exemption is the share-prep's only
        lambda p: capabilities(p).update(add=["CHOWN", "DAC_OVERRIDE"]),  # one more capability
        lambda p: capabilities(p).update(add=["SYS_ADMIN"]),
        lambda p: capabilities(p).update(drop=["NET_RAW"]),  # keeps the runtime's default set
        lambda p: capabilities(p).pop("drop"),
        lambda p: first(p)["securityContext"].pop("capabilities"),
    ],
    ids=["other-component", "chown-and-more", "other-capability", "drops-not-all", "drops-nothing",
         "no-capabilities"],
)  # fmt: skip
def test_root_beyond_the_share_preparation_exemption_is_a_violation(edit: Any) -> None:
    props = share_prep()
    edit(props)
    assert rules.containers_run_as_non_root(JOB, props, DEV) == ROOT


def test_the_exemption_never_covers_privilege() -> None:
    props = share_prep()
    first(props)["securityContext"].update(privileged=True, allowPrivilegeEscalation=True)
    assert rules.containers_run_as_non_root(JOB, props, DEV) == [
        f"{PREP} is privileged",
        f"{PREP} does not set allowPrivilegeEscalation: false",
    ]


def test_a_sidecar_beside_the_share_preparation_gets_no_exemption() -> None:
    props = share_prep()
    sidecar = {**first(props), "name": "debug", "securityContext": {"allowPrivilegeEscalation": False}}
    pod(props)["containers"].append(sidecar)
    assert rules.containers_run_as_non_root(JOB, props, DEV) == [
        "Job 'spot-trainer-share-prep': container 'debug' does not set runAsNonRoot: true (pod or container "
        "securityContext)",
        "Job 'spot-trainer-share-prep': container 'debug' runs as uid 0 (root)",
    ]


# --- training on spot: the GPU pods of any component, and the worker's with or without a GPU -----------


def training() -> dict[str, Any]:
    return dev_stack.props(JOB, "training")


def with_training(props: dict[str, Any], *others: Resource) -> list[Resource]:
    return dev_stack.stack(dev_stack.resource(JOB, "training", props), *others)


TRAINING_URN = dev_stack.resource(JOB, "training").urn
OFF_SPOT = (
    'training pods must select spot capacity: nodeSelector cloud.google.com/gke-spot: "true", or '
    "cloud.google.com/compute-class with a class that lists spot first"
)
ZONE_ONLY = {"topology.kubernetes.io/zone": "us-central1-a"}


@pytest.mark.parametrize("kind", ["limits", "requests"])
def test_a_gpu_pod_of_another_component_must_run_on_spot_too(kind: str) -> None:
    """An evaluation Job copied from the training one, its compute class dropped, a GPU in ``kind`` only."""
    props = training()
    props["metadata"]["name"] = "spot-trainer-eval"
    props["spec"]["template"]["metadata"]["labels"] = contract.labels("evaluator")
    pod(props)["nodeSelector"] = dict(ZONE_ONLY)
    other = "requests" if kind == "limits" else "limits"
    del first(props)["resources"][other]["nvidia.com/gpu"]
    assert rules.training_on_spot(with_training(props), DEV) == [(TRAINING_URN, f"Job 'spot-trainer-eval': {OFF_SPOT}")]
    first(props)["resources"][kind].pop("nvidia.com/gpu")  # a CPU-only pod of another component: anywhere
    assert rules.training_on_spot(with_training(props), DEV) == []


def test_a_worker_without_a_gpu_still_trains_on_spot_only() -> None:
    props = training()
    first(props)["resources"] = {"requests": {"cpu": "4", "memory": "16Gi"}, "limits": {"memory": "16Gi"}}
    pod(props)["nodeSelector"] = dict(ZONE_ONLY)
    assert rules.training_on_spot(with_training(props), DEV) == [
        (TRAINING_URN, f"Job 'spot-trainer-worker': {OFF_SPOT}")
    ]


def compute_class(spec: dict[str, Any]) -> Resource:
    props = dev_stack.props(rules.COMPUTE_CLASS, "gpu")
    props["spec"].update(spec)
    return dev_stack.resource(rules.COMPUTE_CLASS, "gpu", props)


L4 = {"type": "nvidia-l4", "driverVersion": "latest", "count": 1.0}
WORKER = "Job 'spot-trainer-worker'"
NOT_FIRST = "compute class 'spot-trainer-gpu' does not list spot first"


@pytest.mark.parametrize(
    ("selector", "spec", "message"),
    [
        (ZONE_ONLY, {}, OFF_SPOT),
        ({**ZONE_ONLY, "cloud.google.com/gke-spot": "false"}, {}, OFF_SPOT),
        ({**ZONE_ONLY, "cloud.google.com/compute-class": "spot-trainer-gpu-v2"}, {},
         "selects compute class 'spot-trainer-gpu-v2', which the stack does not declare"),
        (None, {"priorities": [{"gpu": L4}, {"spot": True, "gpu": L4}]}, NOT_FIRST),
        (None, {"priorities": [{"spot": False, "gpu": L4}]}, NOT_FIRST),
        (None, {"priorities": []}, NOT_FIRST),
        (None, {"priorities": [{"spot": True, "gpu": L4}, {"gpu": L4}]},
         "compute class 'spot-trainer-gpu' falls back to on-demand, but the stack does not enable onDemandFallback"),
        (None, {"whenUnsatisfiable": "ScaleUpAnyway"},
         "compute class 'spot-trainer-gpu' must set whenUnsatisfiable: DoNotScaleUp, or GKE scales up on-demand "
         "nodes when spot is out"),
    ],
    ids=["no-class", "spot-false", "undeclared-class", "on-demand-first", "spot-false-first", "no-priorities",
         "on-demand-second", "scale-up-anyway"],
)  # fmt: skip
def test_training_off_spot_is_a_violation(selector: dict[str, str] | None, spec: dict[str, Any], message: str) -> None:
    props = training()
    if selector is not None:
        pod(props)["nodeSelector"] = selector
    assert rules.training_on_spot(with_training(props, compute_class(spec)), DEV) == [
        (TRAINING_URN, f"{WORKER}: {message}")
    ]


def test_a_stack_that_enables_on_demand_fallback_may_scale_up_on_demand() -> None:
    fallback = StackFacts(stack="dev", on_demand_fallback=True)
    on_demand_second = compute_class(
        {"priorities": [{"spot": True, "gpu": L4}, {"gpu": L4}], "whenUnsatisfiable": "ScaleUpAnyway"}
    )
    assert rules.training_on_spot(with_training(training(), on_demand_second), fallback) == []
    on_demand_first = compute_class({"priorities": [{"gpu": L4}, {"spot": True, "gpu": L4}]})
    assert rules.training_on_spot(with_training(training(), on_demand_first), fallback) == [
        (TRAINING_URN, f"{WORKER}: compute class 'spot-trainer-gpu' does not list spot first")
    ]


def test_every_gpu_pod_is_judged_whatever_comes_before_it() -> None:
    """GPU Jobs on spot by label, off spot, on an undeclared class, then the training Job on a class that
    does not list spot first: each is looked at and each violation reported, in the stack's order."""

    def gpu_job(name: str, selector: dict[str, str]) -> Resource:
        props = training()
        props["metadata"]["name"] = name
        pod(props)["nodeSelector"] = {**ZONE_ONLY, **selector}
        return dev_stack.resource(JOB, name, props)

    jobs = [
        gpu_job("on-spot", {"cloud.google.com/gke-spot": "true"}),
        gpu_job("off-spot", {}),
        gpu_job("old-class", {"cloud.google.com/compute-class": "gpu-old"}),
    ]
    on_demand_first = compute_class({"priorities": [{"gpu": L4}, {"spot": True, "gpu": L4}]})
    assert rules.training_on_spot([*jobs, *dev_stack.stack(on_demand_first)], DEV) == [
        (jobs[1].urn, f"Job 'off-spot': {OFF_SPOT}"),
        (jobs[2].urn, "Job 'old-class': selects compute class 'gpu-old', which the stack does not declare"),
        (TRAINING_URN, f"{WORKER}: {NOT_FIRST}"),
    ]


# --- Redis's password: from the stack's Secret, as a config file or through an environment variable -----

REDIS_URN = dev_stack.resource(DEPLOYMENT, "redis").urn
NO_PASSWORD = (
    "Deployment 'redis': Redis container 'redis' does not require a password from a Secret of the stack (a "
    "`requirepass` config file mounted from the Secret, or --requirepass $(VAR) with VAR from a secretKeyRef)"
)
CONF = "/etc/redis-auth/auth.conf"
OPTIONS = ["--appendonly", "yes", "--appendfsync", "always", "--dir", "/data", "--port", "6379"]


def redis() -> dict[str, Any]:
    return dev_stack.props(DEPLOYMENT, "redis")


def auth_volume(props: dict[str, Any]) -> dict[str, Any]:
    (volume,) = [v for v in pod(props)["volumes"] if v["name"] == "auth"]
    return volume["secret"]


def by_env(props: dict[str, Any], *before: str) -> dict[str, Any]:
    """The password on the command line from REDISCLI_AUTH (a secretKeyRef in dev), after ``before``."""
    first(props)["args"] = [*before, "--requirepass", "$(REDISCLI_AUTH)"]
    return props


def secret(props: dict[str, Any]) -> Resource:
    return dev_stack.resource(rules.SECRET, "redis", props)


def redis_verdict(props: dict[str, Any], *others: Resource) -> list[tuple[str, str]]:
    resources = dev_stack.stack(dev_stack.resource(DEPLOYMENT, "redis", props), *others)
    return rules.redis_requires_password(resources, DEV)


def _config_in_command(p: dict[str, Any]) -> None:
    first(p).update(command=["redis-server", CONF], args=OPTIONS)


def _mounted_with_a_slash(p: dict[str, Any]) -> None:
    """A mount path written with a trailing slash (its last letters are no slash to strip)."""
    first(p)["volumeMounts"][1]["mountPath"] = "/run/secrets/REDIS_AUTH_BOX/"
    first(p)["args"] = ["/run/secrets/REDIS_AUTH_BOX/auth.conf", *OPTIONS]


def _projected_elsewhere(p: dict[str, Any]) -> None:
    auth_volume(p)["items"] = [{"key": "auth.conf", "path": "redis/auth.conf"}]
    first(p)["args"] = ["/etc/redis-auth/redis/auth.conf", *OPTIONS]


def _cluster_kept_secret() -> Resource:
    props = dev_stack.props(rules.SECRET, "redis")
    data = props.pop("stringData")
    props["data"] = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
    return secret(props)


@pytest.mark.parametrize(
    ("edit", "others"),
    [
        (_config_in_command, ()),
        (_mounted_with_a_slash, ()),
        (lambda p: auth_volume(p).pop("items"), ()),  # the whole Secret projected: auth.conf is there
        (_projected_elsewhere, ()),
        (lambda p: None, (_cluster_kept_secret(),)),
        (lambda p: by_env(p, *OPTIONS), ()),
        (lambda p: by_env(p), ()),
    ],
    ids=["config-in-command", "mount-path-with-slash", "whole-secret", "projected-under-a-folder", "secret-data",
         "env-after-options", "env-only"],
)  # fmt: skip
def test_redis_with_its_password_from_the_secret_passes(edit: Any, others: tuple[Resource, ...]) -> None:
    props = redis()
    edit(props)
    assert redis_verdict(props, *others) == []


def _env_literal(p: dict[str, Any]) -> None:
    by_env(p, *OPTIONS)
    first(p)["env"] = [{"name": "REDISCLI_AUTH", "value": "hunter2"}]


def _env_from_another_secret(p: dict[str, Any]) -> None:
    by_env(p, *OPTIONS)
    first(p)["env"][0]["valueFrom"]["secretKeyRef"]["name"] = "redis-auth-old"


def _flag_without_value(p: dict[str, Any]) -> None:
    first(p)["args"] = [*OPTIONS, "--requirepass"]


def _config_on_the_data_volume(p: dict[str, Any]) -> None:
    first(p)["args"] = ["/data/auth.conf", *OPTIONS]


def _secret_without_requirepass(text: str) -> Resource:
    props = dev_stack.props(rules.SECRET, "redis")
    props["stringData"]["auth.conf"] = text
    return secret(props)


def _secret_with_data(value: str) -> Resource:
    props = dev_stack.props(rules.SECRET, "redis")
    del props["stringData"]
    props["data"] = {"auth.conf": value}
    return secret(props)


def _secret_elsewhere() -> Resource:
    props = dev_stack.props(rules.SECRET, "redis")
    props["metadata"]["namespace"] = "default"
    return secret(props)


def test_every_redis_is_judged_whatever_comes_before_it() -> None:
    props = redis()
    first(props)["args"] = OPTIONS  # the config file dropped
    resources = [*dev_stack.stack(), dev_stack.resource(DEPLOYMENT, "redis-2", props)]
    assert rules.redis_requires_password(resources, DEV) == [
        (resources[-1].urn, NO_PASSWORD),
    ]


@pytest.mark.parametrize(
    ("edit", "others"),
    [
        (_env_literal, ()),
        (_env_from_another_secret, ()),
        (_flag_without_value, ()),
        (_config_on_the_data_volume, ()),
        (lambda p: auth_volume(p).update(items=[{"key": "password", "path": "password"}]), ()),
        (lambda p: None, (_secret_without_requirepass(f"# requirepass {dev_stack.MOCK_PASSWORD}\n"),)),
        (lambda p: None, (_secret_with_data("not base64!"),)),
        (lambda p: None, (_secret_with_data(base64.b64encode(b"requirepass \xff\xfe\n").decode()),)),
        (lambda p: None, (_secret_elsewhere(),)),
    ],
    ids=["env-literal", "env-from-another-secret", "flag-without-value", "config-on-the-data-volume",
         "config-not-projected", "requirepass-commented-out", "data-not-base64", "data-not-text",
         "secret-in-another-namespace"],
)  # fmt: skip
def test_redis_without_its_password_from_the_secret_is_a_violation(edit: Any, others: tuple[Resource, ...]) -> None:
    props = redis()
    edit(props)
    assert redis_verdict(props, *others) == [(REDIS_URN, NO_PASSWORD)]


# --- the Filestore share on the cluster's network, however each names it --------------------------------

FILESTORE_URN = dev_stack.resource(rules.FILESTORE, "share").urn
SELF_LINK = "https://www.googleapis.com/compute/v1/projects/spot-trainer-test/global/networks/network"


def network_verdict(filestore_network: str | None, cluster_network: str | None = None) -> list[tuple[str, str]]:
    share = dev_stack.props(rules.FILESTORE, "share")
    if filestore_network is None:
        share["networks"] = []
    else:
        share["networks"][0]["network"] = filestore_network
    cluster = dev_stack.props(rules.CLUSTER, "cluster")
    if cluster_network is not None:
        cluster["network"] = cluster_network
    changed = [
        dev_stack.resource(rules.FILESTORE, "share", share),
        dev_stack.resource(rules.CLUSTER, "cluster", cluster),
    ]
    return rules.filestore_on_cluster_network(dev_stack.stack(*changed), DEV)


@pytest.mark.parametrize(
    ("filestore_network", "cluster_network"),
    [
        ("network", None),
        ("projects/spot-trainer-test/global/networks/network", None),
        (SELF_LINK, None),
        ("network", SELF_LINK),
        ("network", "projects/spot-trainer-test/global/networks/network/"),
        ("network", "network"),
    ],
    ids=["names", "id-path", "self-link", "cluster-self-link", "cluster-trailing-slash", "cluster-by-name"],
)
def test_filestore_on_the_cluster_network_passes_however_it_is_named(
    filestore_network: str, cluster_network: str | None
) -> None:
    assert network_verdict(filestore_network, cluster_network) == []


def test_a_cluster_that_names_no_network_is_on_the_default_one() -> None:
    cluster = dev_stack.props(rules.CLUSTER, "cluster")
    del cluster["network"], cluster["subnetwork"]
    share = dev_stack.props(rules.FILESTORE, "share")
    share["networks"][0]["network"] = "default"
    changed = [
        dev_stack.resource(rules.CLUSTER, "cluster", cluster),
        dev_stack.resource(rules.FILESTORE, "share", share),
    ]
    assert rules.filestore_on_cluster_network(dev_stack.stack(*changed), DEV) == []
    assert rules.filestore_on_cluster_network(dev_stack.stack(changed[0]), DEV) == [
        (FILESTORE_URN, "Filestore instance 'share' is on network 'network', the cluster on ['default']; pods could "
         "not mount it")
    ]  # fmt: skip


def test_filestore_on_another_network_or_none_is_a_violation() -> None:
    assert network_verdict("default") == [
        (FILESTORE_URN, "Filestore instance 'share' is on network 'default', the cluster on ['network']; pods could "
         "not mount it")
    ]  # fmt: skip
    assert network_verdict(f"{SELF_LINK}-old") == [
        (FILESTORE_URN, "Filestore instance 'share' is on network 'network-old', the cluster on ['network']; pods "
         "could not mount it")
    ]  # fmt: skip
    assert network_verdict(None) == [(FILESTORE_URN, "Filestore instance 'share' names no network")]


# --- images by digest, in every kind of container ---------------------------------------------------------

DIGEST = "@sha256:" + "ab" * 32


def test_every_container_of_the_pod_is_judged_after_an_unpinned_one() -> None:
    """An unpinned init container before a main container that names 'latest' beside its digest."""
    props = dev_stack.props(JOB, "loader")
    pod(props)["initContainers"] = [{"name": "wait-for-redis", "image": "busybox:1.36"}]
    first(props)["image"] = latest = (
        f"us-central1-docker.pkg.dev/spot-trainer-test/spot-trainer-dev/trainer:latest{DIGEST}"
    )
    assert rules.image_pinned_by_digest(JOB, props, DEV) == [
        "Job 'spot-trainer-loader': container 'wait-for-redis' image 'busybox:1.36' is not pinned by digest; use "
        "name@sha256:<digest>",
        f"Job 'spot-trainer-loader': container 'loader' image {latest!r} names the tag 'latest'; drop the tag, the "
        "digest is what runs",
    ]


@pytest.mark.parametrize(
    "image", ["registry.local:5000/trainer:latest", "registry.local:5000/team/trainer:latest", "trainer:latest"]
)
def test_latest_is_found_behind_a_registry_port(image: str) -> None:
    props = dev_stack.props(JOB, "loader")
    first(props)["image"] = image + DIGEST
    (message,) = rules.image_pinned_by_digest(JOB, props, DEV)
    assert message.endswith("names the tag 'latest'; drop the tag, the digest is what runs")
    first(props)["image"] = image.replace(":latest", ":1.4") + DIGEST  # a port is no tag
    assert rules.image_pinned_by_digest(JOB, props, DEV) == []


def test_a_debug_container_declared_in_a_pod_is_judged_too() -> None:
    """``kubectl debug`` adds ephemeral containers through the API; one declared in the program is judged."""
    props = {
        "metadata": {"name": "redis-debug", "namespace": dev_stack.NAMESPACE},
        "spec": {
            **pod(dev_stack.props(DEPLOYMENT, "redis")),
            "ephemeralContainers": [{"name": "debug", "image": "busybox", "targetContainerName": "redis"}],
        },
    }
    assert rules.image_pinned_by_digest("kubernetes:core/v1:Pod", props, DEV) == [
        "Pod 'redis-debug': container 'debug' image 'busybox' is not pinned by digest; use name@sha256:<digest>"
    ]
    assert rules.containers_run_as_non_root("kubernetes:core/v1:Pod", props, DEV) == [
        "Pod 'redis-debug': container 'debug' does not set allowPrivilegeEscalation: false"
    ]
