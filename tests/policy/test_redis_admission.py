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
