"""The Redis NetworkPolicy rule judges the app label of the pods it admits, not only their component.

``worker`` and ``loader`` are common component names: a policy admitting any pod labelled
``app.kubernetes.io/component=worker`` opens Redis to every other app's workers in the namespace.
Each case differs from an admitted one by the app label alone, so a rule that ignores it passes them.
"""

from __future__ import annotations

from typing import Any

import pytest

from infra import contract
from policy import rules
from policy.rules import Resource, StackFacts

DEV = StackFacts(stack="dev", labels={"env": "dev", "app": contract.APP, "team": "ml-platform"})
OTHER_APP = "billing"
CLIENTS = sorted(rules.REDIS_CLIENTS)


def redis_deployment() -> Resource:
    props = {
        "metadata": {"name": "redis", "namespace": "ns"},
        "spec": {
            "template": {
                "metadata": {"labels": contract.labels(contract.REDIS)},
                "spec": {"containers": [{"name": "redis", "image": "redis:7.4@sha256:" + "0f" * 32}]},
            }
        },
    }
    return Resource("kubernetes:apps/v1:Deployment", "redis", "urn:pulumi:dev::p::Deployment::redis", props)


def policy_admitting(selector: dict[str, Any]) -> Resource:
    props = {
        "metadata": {"name": "redis-clients", "namespace": "ns"},
        "spec": {
            "podSelector": {"matchLabels": contract.labels(contract.REDIS)},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"podSelector": selector}], "ports": [{"port": float(contract.REDIS_PORT)}]}],
        },
    }
    return Resource(rules.NETWORK_POLICY, "redis-clients", "urn:pulumi:dev::p::NetworkPolicy::redis-clients", props)


def component_in(values: list[str]) -> dict[str, Any]:
    return {"key": contract.COMPONENT_LABEL, "operator": "In", "values": values}


ADMITTED = {
    "labels": {"matchLabels": contract.labels(contract.WORKER)},
    "expressions": {
        "matchLabels": {contract.NAME_LABEL: contract.APP},
        "matchExpressions": [component_in(CLIENTS)],
    },
    "name-in-app-only": {
        "matchExpressions": [
            {"key": contract.NAME_LABEL, "operator": "In", "values": [contract.APP]},
            component_in(CLIENTS),
        ]
    },
}

REFUSED = {
    "no-app-label": {"matchLabels": {contract.COMPONENT_LABEL: contract.WORKER}},
    "another-app": {"matchLabels": {contract.NAME_LABEL: OTHER_APP, contract.COMPONENT_LABEL: contract.WORKER}},
    "no-app-label-expressions": {"matchExpressions": [component_in(CLIENTS)]},
    "app-or-another": {
        "matchExpressions": [
            {"key": contract.NAME_LABEL, "operator": "In", "values": [contract.APP, OTHER_APP]},
            component_in(CLIENTS),
        ]
    },
    "app-label-exists-only": {
        "matchExpressions": [{"key": contract.NAME_LABEL, "operator": "Exists"}, component_in(CLIENTS)]
    },
}


@pytest.mark.parametrize("selector", ADMITTED.values(), ids=ADMITTED.keys())
def test_this_apps_loader_and_worker_pods_are_admitted(selector: dict[str, Any]) -> None:
    assert rules.redis_network_policy([redis_deployment(), policy_admitting(selector)], DEV) == []


@pytest.mark.parametrize("selector", REFUSED.values(), ids=REFUSED.keys())
def test_pods_of_any_other_app_are_refused(selector: dict[str, Any]) -> None:
    policy = policy_admitting(selector)
    problems = rules.redis_network_policy([redis_deployment(), policy], DEV)
    assert [urn for urn, _ in problems] == [policy.urn]
    ((_, message),) = problems
    assert message.startswith("NetworkPolicy 'redis-clients' ingress rule 0 admits ")
    assert f"only {contract.NAME_LABEL}={contract.APP} pods" in message


def component_not_in(values: list[str]) -> dict[str, Any]:
    return {"key": contract.COMPONENT_LABEL, "operator": "NotIn", "values": values}


@pytest.mark.parametrize(
    "selector",
    [
        {"matchLabels": {contract.NAME_LABEL: contract.APP}, "matchExpressions": [component_not_in(CLIENTS)]},
        {
            "matchExpressions": [
                {"key": contract.NAME_LABEL, "operator": "NotIn", "values": [OTHER_APP]},
                component_in(CLIENTS),
            ]
        },
        {
            "matchExpressions": [
                {"key": contract.NAME_LABEL, "operator": "NotIn", "values": [contract.APP]},
                component_in(CLIENTS),
            ]
        },
    ],
    ids=["every-component-but-the-clients", "every-app-but-another", "every-app-but-this-one"],
)
def test_not_in_is_no_allowlist(selector: dict[str, Any]) -> None:
    """NotIn admits everything it does not name: Redis itself, a debug pod, any other app."""
    policy = policy_admitting(selector)
    assert [urn for urn, _ in rules.redis_network_policy([redis_deployment(), policy], DEV)] == [policy.urn]


# --- which policies guard Redis: Kubernetes label-selector semantics on the policy's podSelector ---------


def guard(pod_selector: dict[str, Any], *peers: dict[str, Any]) -> Resource:
    """A NetworkPolicy with ``pod_selector``, admitting ``peers`` (this app's loader and workers if none)."""
    props = {
        "metadata": {"name": "guard", "namespace": "ns"},
        "spec": {
            "podSelector": pod_selector,
            "policyTypes": ["Ingress"],
            "ingress": [{"from": list(peers or [{"podSelector": ADMITTED["labels"]}])}],
        },
    }
    return Resource(rules.NETWORK_POLICY, "guard", "urn:pulumi:dev::p::NetworkPolicy::guard", props)


def expression(key: str, operator: str, *values: str) -> dict[str, Any]:
    return {"matchExpressions": [{"key": key, "operator": operator, "values": list(values)}]}


SELECTS_REDIS = {
    "in": expression(contract.COMPONENT_LABEL, "In", contract.REDIS, "cache"),
    "not-in": expression(contract.COMPONENT_LABEL, "NotIn", contract.LOADER, contract.WORKER),
    "not-in-absent-key": expression("tier", "NotIn", "frontend"),
    "exists": expression(contract.NAME_LABEL, "Exists"),
    "does-not-exist": expression("tier", "DoesNotExist"),
    "labels-and-expressions": {
        "matchLabels": {contract.NAME_LABEL: contract.APP},
        **expression(contract.COMPONENT_LABEL, "In", contract.REDIS),
    },
}
MISSES_REDIS = {
    "in-other-values": expression(contract.COMPONENT_LABEL, "In", contract.WORKER),
    "in-absent-key": expression("tier", "In", "db"),
    "not-in": expression(contract.COMPONENT_LABEL, "NotIn", contract.REDIS),
    "exists-absent-key": expression("tier", "Exists"),
    "does-not-exist": expression(contract.COMPONENT_LABEL, "DoesNotExist"),
    "unknown-operator": expression(contract.COMPONENT_LABEL, "Gt", "1"),
    "labels-match-expressions-do-not": {
        "matchLabels": {contract.NAME_LABEL: contract.APP},
        **expression(contract.COMPONENT_LABEL, "In", contract.WORKER),
    },
}
NO_GUARD = (
    "urn:pulumi:dev::p::Deployment::redis",
    "Deployment 'redis': no NetworkPolicy with policyType Ingress selects the Redis pods",
)


@pytest.mark.parametrize("selector", SELECTS_REDIS.values(), ids=SELECTS_REDIS.keys())
def test_a_policy_selecting_redis_by_expressions_guards_it(selector: dict[str, Any]) -> None:
    assert rules.redis_network_policy([redis_deployment(), guard(selector)], DEV) == []


@pytest.mark.parametrize("selector", SELECTS_REDIS.values(), ids=SELECTS_REDIS.keys())
def test_a_policy_selecting_redis_by_expressions_is_judged_on_what_it_admits(selector: dict[str, Any]) -> None:
    """Policies add up: one that selects Redis and admits every source opens it, whatever else guards it."""
    open_to_all = guard(selector, {"ipBlock": {"cidr": "0.0.0.0/0"}})
    proper = policy_admitting(ADMITTED["labels"])
    assert [urn for urn, _ in rules.redis_network_policy([redis_deployment(), proper, open_to_all], DEV)] == [
        open_to_all.urn
    ]


@pytest.mark.parametrize("selector", MISSES_REDIS.values(), ids=MISSES_REDIS.keys())
def test_a_policy_whose_expressions_miss_redis_guards_nothing(selector: dict[str, Any]) -> None:
    wide_open = guard(selector, {"ipBlock": {"cidr": "0.0.0.0/0"}})  # not about Redis: not judged here
    assert rules.redis_network_policy([redis_deployment(), guard(selector), wide_open], DEV) == [NO_GUARD]


def test_every_redis_is_checked_whatever_comes_before_it() -> None:
    worker = Resource(
        "kubernetes:apps/v1:Deployment",
        "trainer",
        "urn:pulumi:dev::p::Deployment::trainer",
        {
            "metadata": {"name": "trainer", "namespace": "ns"},
            "spec": {
                "template": {
                    "metadata": {"labels": contract.labels(contract.WORKER)},
                    "spec": {"containers": [{"name": "worker", "image": "trainer@sha256:" + "0f" * 32}]},
                }
            },
        },
    )
    assert rules.redis_network_policy([worker, redis_deployment()], DEV) == [NO_GUARD]


# --- which workloads the Redis rules judge: the component label, or a redis image anywhere in the pod -----


def workload(labels: dict[str, str], *images: str | None) -> Resource:
    containers = [{"name": f"c{i}", **({"image": image} if image else {})} for i, image in enumerate(images)]
    props = {
        "metadata": {"name": "w", "namespace": "ns"},
        "spec": {"template": {"metadata": {"labels": labels}, "spec": {"containers": containers}}},
    }
    return Resource("kubernetes:apps/v1:StatefulSet", "w", "urn:pulumi:dev::p::StatefulSet::w", props)


DIGEST = "@sha256:" + "0f" * 32
OTHER = {contract.NAME_LABEL: OTHER_APP}
REDIS_WORKLOADS = {
    "by-label": workload(contract.labels(contract.REDIS), "europe-docker.pkg.dev/p/mirror/cache" + DIGEST),
    "official-image": workload(OTHER, "redis:7.4" + DIGEST),
    "docker-hub-path": workload(OTHER, "docker.io/library/redis:7.4" + DIGEST),
    "registry-with-port": workload(OTHER, "registry.local:5000/team/redis:7.4"),
    "digest-only": workload(OTHER, "europe-docker.pkg.dev/p/mirror/redis" + DIGEST),
    "sidecar": workload(OTHER, "trainer" + DIGEST, "redis" + DIGEST),
}
OTHER_WORKLOADS = {
    "exporter": workload(OTHER, "oliver006/redis_exporter:v1.62.0"),
    "redis-in-the-path": workload(OTHER, "europe-docker.pkg.dev/p/redis/trainer:1"),
    "prefix": workload(OTHER, "myredis:7"),
    "no-image": workload(OTHER, None),
    "worker": workload(contract.labels(contract.WORKER), "trainer" + DIGEST),
}


@pytest.mark.parametrize("redis", REDIS_WORKLOADS.values(), ids=REDIS_WORKLOADS.keys())
def test_a_redis_found_by_label_or_image_must_be_guarded(redis: Resource) -> None:
    assert rules.redis_network_policy([redis], DEV) == [
        (redis.urn, "StatefulSet 'w': no NetworkPolicy with policyType Ingress selects the Redis pods")
    ]


@pytest.mark.parametrize("other", OTHER_WORKLOADS.values(), ids=OTHER_WORKLOADS.keys())
def test_other_workloads_are_not_taken_for_redis(other: Resource) -> None:
    assert rules.redis_network_policy([other], DEV) == []
