"""The namespace's NetworkPolicies, built through infra.program's wiring and evaluated as Kubernetes does: a pod
selected by any Egress policy may send only what one of those policies' rules allows (the union), so the
default-deny policy leaves each pod exactly its allowances (kubernetes.io "Network Policies")."""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest

from infra import contract, network_policy, render, share_prep
from tests.infra.components import DATA, _selects, _strictly_valid, workloads

POLICY = "kubernetes:networking.k8s.io/v1:NetworkPolicy"
GOOGLE_API = "142.250.1.207"  # an address storage.googleapis.com resolves to
IN_VPC = "10.10.0.5"
SCHEDULED = {**DATA, "schedule": "0 3 * * *"}


def egress_allowed(policies: list[dict[str, Any]], labels: dict[str, str], to: dict[str, Any]) -> bool:
    """``to``: {"ip": ..., "labels": ... (a pod of the namespace), "port": n, "protocol": "TCP"}."""
    selecting = [p["spec"] for p in policies if "Egress" in p["spec"]["policyTypes"]
                 and _selects(p["spec"]["podSelector"], labels)]  # fmt: skip
    if not selecting:
        return True  # no policy selects it: unrestricted (which the default-deny policy rules out)
    return any(_rule_allows(rule, to) for spec in selecting for rule in spec.get("egress", []))


def _rule_allows(rule: dict[str, Any], to: dict[str, Any]) -> bool:
    ports = rule.get("ports")
    if ports and not any(p["port"] == to["port"] and p.get("protocol", "TCP") == to["protocol"] for p in ports):
        return False
    peers = rule.get("to")
    return not peers or any(_peer_allows(peer, to) for peer in peers)


def _peer_allows(peer: dict[str, Any], to: dict[str, Any]) -> bool:
    if "ipBlock" in peer:
        if "ip" not in to:
            return False
        ip = ipaddress.ip_address(to["ip"])
        block = peer["ipBlock"]
        inside = ip in ipaddress.ip_network(block["cidr"])
        return inside and not any(ip in ipaddress.ip_network(e) for e in block.get("except", []))
    if "podSelector" in peer and "namespaceSelector" not in peer:
        return "labels" in to and _selects(peer["podSelector"], to["labels"])
    return False


def _policies(b: Any) -> list[dict[str, Any]]:
    return [r.inputs for r in b.of_type(POLICY)]


def tcp(port: int, **where: Any) -> dict[str, Any]:
    return {"port": port, "protocol": "TCP", **where}


REDIS = {"labels": contract.labels(contract.REDIS)}


def test_every_pod_is_denied_by_default_and_resolves_names() -> None:
    b = workloads("dev", **SCHEDULED)
    _strictly_valid(b)
    denies = [p for p in _policies(b) if p["metadata"]["name"] == "default-deny"]
    assert [d["spec"] for d in denies] == [{"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}] * 2
    # One in the workloads' namespace, one in the share preparation's (infra/share_prep.py).
    prep = share_prep.prep_namespace(b.cfg.namespace)
    assert {d["metadata"]["namespace"] for d in denies} == {b.cfg.namespace, prep}
    assert {p["metadata"]["namespace"] for p in _policies(b) if p not in denies} == {b.cfg.namespace}
    policies = [p for p in _policies(b) if p["metadata"]["namespace"] == b.cfg.namespace]
    for component in (*contract.REDIS_CLIENTS, contract.REDIS, "anything"):
        labels = contract.labels(component)
        assert egress_allowed(policies, labels, {"ip": "10.0.0.10", "port": 53, "protocol": "UDP"}), component
        assert egress_allowed(policies, labels, tcp(53, ip="169.254.20.10")), component
        assert not egress_allowed(policies, labels, tcp(80, ip="93.184.216.34")), component
        assert not egress_allowed(policies, labels, tcp(22, ip=IN_VPC)), component


def test_only_the_queues_clients_reach_redis_and_only_on_its_port() -> None:
    policies = _policies(workloads("dev"))
    for component in contract.REDIS_CLIENTS:
        assert egress_allowed(policies, contract.labels(component), tcp(contract.REDIS_PORT, **REDIS)), component
        assert not egress_allowed(policies, contract.labels(component), tcp(22, **REDIS)), component
    for component in (contract.REDIS, contract.SHARE_PREP, "other"):
        assert not egress_allowed(policies, contract.labels(component), tcp(contract.REDIS_PORT, **REDIS))


@pytest.mark.parametrize(("overrides", "callers"), [
    ({}, ()),
    ({"datasetUri": DATA["datasetUri"]}, (contract.LOADER,)),
    ({"outputUri": DATA["outputUri"]}, (contract.LOADER, contract.WORKER, contract.SCORER)),
    (DATA, (contract.LOADER, contract.WORKER, contract.SCORER)),
])  # fmt: skip
def test_only_pods_with_a_google_identity_reach_google_apis_and_the_metadata_server(
    overrides: dict[str, str], callers: tuple[str, ...]
) -> None:
    """One-off export pods are labelled loader and run as the workers' account: with outputUri, loader-labelled
    pods may call Google too."""
    policies = _policies(workloads("dev", **overrides))
    for component in (*contract.REDIS_CLIENTS, contract.REDIS):
        labels, calls = contract.labels(component), component in callers
        assert egress_allowed(policies, labels, tcp(443, ip=GOOGLE_API)) is calls, component
        assert egress_allowed(policies, labels, tcp(80, ip="169.254.169.254")) is calls, component
        assert egress_allowed(policies, labels, tcp(988, ip="169.254.169.252")) is calls, component
        # never the VPC's own hosts through the API rule, nor other ports
        assert not egress_allowed(policies, labels, tcp(443, ip=IN_VPC)), component
        assert not egress_allowed(policies, labels, tcp(8080, ip=GOOGLE_API)), component


def test_a_narrower_api_range_is_the_only_https_destination() -> None:
    policies = _policies(workloads("dev", apiEgressCidr="199.36.153.4/30", **DATA))
    worker = contract.labels(contract.WORKER)
    assert egress_allowed(policies, worker, tcp(443, ip="199.36.153.5"))
    assert not egress_allowed(policies, worker, tcp(443, ip=GOOGLE_API))
    assert network_policy.api_block("199.36.153.4/30") == {"cidr": "199.36.153.4/30"}  # no except outside it


def test_the_share_preparation_may_send_nothing() -> None:
    """Its namespace has the default deny and no allowance: the kubelet mounts the share, the pod needs no
    network (no name to resolve, no token, no API)."""
    b = workloads("dev", **SCHEDULED)
    prep = share_prep.prep_namespace(b.cfg.namespace)
    policies = [p for p in _policies(b) if p["metadata"]["namespace"] == prep]
    assert [p["metadata"]["name"] for p in policies] == ["default-deny"]
    pod = contract.labels(contract.SHARE_PREP)
    for to in ({"ip": "10.0.0.10", "port": 53, "protocol": "UDP"}, tcp(443, ip=GOOGLE_API), tcp(2049, ip=IN_VPC),
               tcp(443, ip=render.CLUSTER_ENDPOINT)):
        assert not egress_allowed(policies, pod, to), to


def test_only_the_launcher_reaches_the_control_plane_and_only_with_a_schedule() -> None:
    endpoint = tcp(443, ip=render.CLUSTER_ENDPOINT)
    scheduled = _policies(workloads("dev", **SCHEDULED, apiEgressCidr="199.36.153.4/30"))
    assert egress_allowed(scheduled, contract.labels(contract.LAUNCHER), endpoint)
    redis = tcp(contract.REDIS_PORT, labels=REDIS["labels"])
    assert egress_allowed(scheduled, contract.labels(contract.LAUNCHER), redis)
    assert not egress_allowed(scheduled, contract.labels(contract.LOADER), endpoint)  # the loader posts nothing
    assert not egress_allowed(scheduled, contract.labels(contract.LAUNCHER), tcp(443, ip="199.36.153.5"))  # nor GCS
    assert not egress_allowed(scheduled, contract.labels(contract.WORKER), tcp(443, ip=IN_VPC))
    unscheduled = _policies(workloads("dev", **{**DATA, "apiEgressCidr": "199.36.153.4/30"}))
    assert not egress_allowed(unscheduled, contract.labels(contract.LOADER), endpoint)
