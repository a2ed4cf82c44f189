"""VPC Service Controls (infra/perimeter.py): the setting refused with one line when it cannot work, and the
perimeter as pulumi_gcp 10.2 declares it (dry run in ``spec``, enforced in ``status``), off by default."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from infra import diff, perimeter, render, replacements
from infra.render import FAKE_PROJECT_NUMBER, Rendered
from tests.infra.test_infra_config_rules import refusal

Render = Callable[..., Rendered]
PERIMETER = "gcp:accesscontextmanager/servicePerimeter:ServicePerimeter"
VPCSC = "gcp:artifactregistry/vpcscConfig:VpcscConfig"
POLICY = "accessPolicies/123456789"
DEPLOY = "serviceAccount:deploy-prod@acme-sec.iam.gserviceaccount.com"


def _apis(r: Rendered) -> set[str]:
    return {s.inputs["service"] for s in r.of_type("gcp:projects/service:Service")}


@pytest.mark.parametrize(("overrides", "key", "allowed"), [
    ({"vpcServiceControls": "on"}, "vpcServiceControls", "one of off, dryRun, enforced"),
    ({"vpcServiceControls": "dryRun"}, "vpcAccessPolicy", "accessPolicies/<number> with vpcServiceControls=dryRun"),
    ({"vpcServiceControls": "dryRun", "vpcAccessPolicy": "123"}, "vpcAccessPolicy", "accessPolicies/<number>"),
    ({"vpcAccessPolicy": POLICY}, "vpcAccessPolicy", "empty while vpcServiceControls is off"),
    ({"vpcIngressIdentities": [DEPLOY]}, "vpcIngressIdentities", "empty while vpcServiceControls is off"),
    ({"vpcServiceControls": "enforced", "vpcAccessPolicy": POLICY}, "vpcIngressIdentities",
     "at least the deploy identity"),
    ({"vpcServiceControls": "dryRun", "vpcAccessPolicy": POLICY, "vpcIngressIdentities": ["deploy@acme.com"]},
     "vpcIngressIdentities", "serviceAccount:<email>"),
    ({"vpcServiceControls": "dryRun", "vpcAccessPolicy": POLICY, "vpcIngressIdentities": DEPLOY},
     "vpcIngressIdentities", "a list such as"),
])  # fmt: skip
def test_a_perimeter_that_cannot_work_is_one_line_naming_its_key(overrides: dict[str, Any], key: str,
                                                                  allowed: str) -> None:
    line = refusal(**overrides)
    assert line.startswith(f"config spot-trainer:{key}=") and allowed in line, line


def test_no_perimeter_unless_set(rendered: Render) -> None:
    r = rendered("dev")
    assert not r.of_type(PERIMETER) and not r.of_type(VPCSC) and "accesscontextmanager.googleapis.com" not in _apis(r)


def test_dry_run_puts_the_project_and_its_data_services_in_the_spec_only(rendered: Render) -> None:
    r = rendered("dev", vpcServiceControls="dryRun", vpcAccessPolicy=POLICY)
    p = r.one(PERIMETER).inputs
    assert (p["parent"], p["name"]) == (POLICY, f"{POLICY}/servicePerimeters/spot_trainer_dev")
    assert p["useExplicitDryRunSpec"] is True and "status" not in p and p["perimeterType"] == "PERIMETER_TYPE_REGULAR"
    assert p["spec"] == {"resources": [f"projects/{FAKE_PROJECT_NUMBER}"], "ingressPolicies": [],
                         "restrictedServices": list(perimeter.RESTRICTED_SERVICES)}
    assert {"storage.googleapis.com", "file.googleapis.com", "artifactregistry.googleapis.com",
            "container.googleapis.com", "containeranalysis.googleapis.com", "cloudkms.googleapis.com"} <= set(
        p["spec"]["restrictedServices"])  # fmt: skip
    # The Docker Hub proxy keeps fetching from inside the perimeter; the perimeter is written through ACM.
    assert r.one(VPCSC).inputs == {"location": r.config.region, "vpcscPolicy": "ALLOW"}
    assert "accesscontextmanager.googleapis.com" in _apis(r)


def test_enforced_puts_it_in_the_status_with_ingress_for_the_named_identities(rendered: Render) -> None:
    r = rendered("dev", vpcServiceControls="enforced", vpcAccessPolicy=POLICY, vpcIngressIdentities=[DEPLOY])
    p = r.one(PERIMETER).inputs
    assert p["useExplicitDryRunSpec"] is False and "spec" not in p
    (rule,) = p["status"]["ingressPolicies"]
    assert rule["ingressFrom"] == {"identities": [DEPLOY], "sources": [{"accessLevel": "*"}]}
    assert rule["ingressTo"]["resources"] == ["*"]
    assert [o["serviceName"] for o in rule["ingressTo"]["operations"]] == list(perimeter.RESTRICTED_SERVICES)
    assert all(o["methodSelectors"] == [{"method": "*"}] for o in rule["ingressTo"]["operations"])


def test_prod_is_in_a_dry_run_perimeter_of_a_policy_the_operator_replaces() -> None:
    r = render.render("prod")
    p = r.one(PERIMETER).inputs
    assert r.config.perimeter.mode == "dryRun" and p["parent"] == "accessPolicies/000000000000"
    assert p["spec"]["resources"] == [f"projects/{FAKE_PROJECT_NUMBER}"]


def test_make_diff_says_a_new_access_policy_replaces_the_perimeter_and_a_new_mode_updates_it(
        rendered: Render) -> None:
    """infra/replacements.py: name and parent are ForceNew in the provider; spec, status and the dry-run flag are
    not. Nothing is stored in a perimeter, so neither is data loss."""
    before = rendered("prod")
    moved = {(c.type, c.name): c for c in diff.compare(before, rendered("prod", vpcAccessPolicy=POLICY))}
    change = moved[(replacements.PERIMETER, "perimeter")]
    assert change.action == "replace" and "parent" in change.why and "name" in change.why and not change.loses
    enforced = diff.compare(before, rendered("prod", vpcServiceControls="enforced", vpcIngressIdentities=[DEPLOY]))
    assert {(c.type, c.action) for c in enforced} == {(replacements.PERIMETER, "update")}
