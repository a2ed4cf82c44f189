"""The pack over every rendered stack, over mutated stacks, through pulumi-policy's own wrappers, and
what ``make render`` writes (manifests valid for Kubernetes 1.33, no secret values)."""

from __future__ import annotations

import copy
import dataclasses
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kubernetes_validate
import pulumi
import pytest
import yaml
from pulumi_policy import (
    EnforcementLevel,
    PolicyCustomTimeouts,
    PolicyResource,
    PolicyResourceOptions,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)
from pulumi_policy.proxy import UNKNOWN_STRING_VALUE, UnknownValueError, unknown_checking_proxy

from infra import render
from infra.config import DATA_LOSS_KEY, PROJECT
from infra.render import Registered, Rendered
from policy import offline, pack, rules
from tests.infra.test_infra_manifests import KUBERNETES_VERSION, _is_custom
from tests.policy import dev_stack

STACKS = render.stack_names()
_CACHE: dict[str, Rendered] = {}


@pytest.fixture
def rendered() -> Callable[[str], Rendered]:
    def get(stack: str) -> Rendered:
        if stack not in _CACHE:
            _CACHE[stack] = render.render(stack)
        return _CACHE[stack]

    return get


def mutated(r: Rendered, type_: str, name: str, change: Callable[[dict[str, Any]], None]) -> list[Registered]:
    """The stack's resources with one resource's inputs and outputs changed alike (deep copies)."""
    out = []
    for res in r.resources:
        if res.type == type_ and res.name == name:
            res = copy.deepcopy(res)
            change(res.inputs)
            change(res.outputs)
        out.append(res)
    return out


def pod_spec(props: dict[str, Any]) -> dict[str, Any]:
    return props["spec"]["template"]["spec"]


def settled(violations: list[offline.Violation]) -> list[offline.Violation]:
    """Violations of the rules that do not await the infra branch's settings (rules.AWAITING_INFRA)."""
    return [v for v in violations if v.policy not in rules.AWAITING_INFRA]


@pytest.mark.parametrize("stack", STACKS)
def test_every_stack_passes_the_pack(stack: str, rendered: Callable[[str], Rendered]) -> None:
    """Advisory ones too, with the stack files as they are. The rules awaiting the infra branch's settings are
    advisory until the lead empties rules.AWAITING_INFRA at merge; from then on this test holds them too."""
    violations = offline.check_rendered(rendered(stack))
    assert offline.mandatory(violations) == []
    assert settled(violations) == []
    assert {v.level for v in violations if v.policy in rules.AWAITING_INFRA} <= {rules.ADVISORY}


def test_a_stack_that_trains_on_cpu_passes_the_pack() -> None:
    """trainOn=cpu (issue 33): Spot Pods without a GPU still train on spot capacity, as the pack requires."""
    violations = offline.check_rendered(render.render("dev", {"trainOn": "cpu"}))
    assert offline.mandatory(violations) == [] and settled(violations) == []


def _env_names(value: Any) -> set[str]:
    """Every container env variable named anywhere in ``value``, JSON Job bodies in ConfigMaps included."""
    if isinstance(value, str) and value.startswith("{"):
        try:
            value = json.loads(value)
        except ValueError:
            return set()
    if isinstance(value, dict):
        own = {e.get("name") for e in value.get("env") or [] if isinstance(e, dict)} if "image" in value else set()
        return own.union(*(_env_names(v) for v in value.values()))
    if isinstance(value, list):
        return set().union(*(_env_names(v) for v in value))
    return set()


@pytest.mark.parametrize("stack", STACKS)
def test_no_container_replaces_the_images_driver_path(stack: str, rendered: Callable[[str], Rendered]) -> None:
    """A container's env replaces the image's variable of that name: a Job setting LD_LIBRARY_PATH or PATH
    would drop /usr/local/nvidia/lib64 (workload/Dockerfile, tests/policy/test_image_environment.py)."""
    manifests = rendered(stack).manifests()
    named = _env_names(manifests)
    assert "REDIS_HOST" in named or len(named) > 3  # the walk sees the containers' env at all
    assert not named & {"LD_LIBRARY_PATH", "PATH"}
    planted = copy.deepcopy(manifests) + [{"data": {"job.json": json.dumps(
        {"spec": {"containers": [{"image": "x", "env": [{"name": "LD_LIBRARY_PATH", "value": "/opt"}]}]}})}}]
    assert "LD_LIBRARY_PATH" in _env_names(planted)


def _differences(part: Any, whole: Any, where: str = "") -> list[str]:
    """Where ``part`` is not ``whole`` with keys left out (lists: same length, item by item)."""
    if isinstance(part, dict):
        if not isinstance(whole, dict):
            return [f"{where}: {whole!r} is no mapping"]
        return [
            d
            for k, v in part.items()
            for d in (_differences(v, whole[k], f"{where}.{k}") if k in whole else [f"{where}.{k}: not rendered"])
        ]
    if isinstance(part, list):
        if not isinstance(whole, list) or len(part) != len(whole):
            return [f"{where}: {whole!r} rendered"]
        return [
            d for i, (p, w) in enumerate(zip(part, whole, strict=True)) for d in _differences(p, w, f"{where}[{i}]")
        ]
    return [] if part == whole else [f"{where}: {whole!r} rendered, {part!r} in tests/policy/dev_stack.py"]


def test_the_rule_tests_shapes_are_what_dev_renders(rendered: Callable[[str], Rendered]) -> None:
    """The rule tests build on tests/policy/dev_stack.py: every key and value kept there is dev's own."""
    r = rendered("dev")
    for (type_, name), props in dev_stack.SHAPES.items():
        view = offline.stack_view(r.one(type_, name)).props
        assert _differences(props, view, f"{type_} {name}") == []
    # Only which resources, not their order: the engine registers resources as their inputs resolve, and
    # under load the Redis Deployment and the share-prep Job come in either order.
    registered = {(x.type, x.name) for x in r.resources}
    assert set(dev_stack.SHAPES) <= registered


def test_the_offline_runner_feeds_engine_shaped_properties(rendered: Callable[[str], Rendered]) -> None:
    """Schema (camelCase) names, numbers as floats, secrets unwrapped: what an analyzer receives."""
    r = rendered("prod")
    cluster = r.one(rules.CLUSTER).inputs
    assert {"releaseChannel", "deletionProtection", "privateClusterConfig", "resourceLabels"} <= set(cluster)
    assert not [k for k in cluster if "_" in k]
    assert isinstance(r.one("kubernetes:batch/v1:Job", "training").inputs["spec"]["parallelism"], float)
    secret = offline.stack_view(r.one(rules.SECRET)).props
    assert isinstance(secret["stringData"]["password"], str)
    assert offline.stack_view(r.one(rules.NETWORK)).props["id"] == r.one(rules.NETWORK).id


def test_a_mutated_stack_reports_each_break_as_mandatory(rendered: Callable[[str], Rendered]) -> None:
    r = rendered("dev")
    job, redis = "kubernetes:batch/v1:Job", "kubernetes:apps/v1:Deployment"

    def latest(props: dict[str, Any]) -> None:
        pod_spec(props)["containers"][0]["image"] = "us-docker.pkg.dev/p/r/trainer:latest"

    def off_spot(props: dict[str, Any]) -> None:
        pod_spec(props).pop("nodeSelector")

    def open_redis(props: dict[str, Any]) -> None:
        pod_spec(props)["containers"][0]["args"] = ["--appendonly", "yes"]

    resources = mutated(r, job, "loader", latest)
    resources = mutated(Rendered(r.stack, r.config, resources), job, "training", off_spot)
    resources = mutated(Rendered(r.stack, r.config, resources), redis, "redis", open_redis)
    found = settled(offline.check(resources, offline.facts_of(r)))
    assert {(v.policy, v.level, v.resource) for v in found} == {
        ("image-pinned-by-digest", rules.MANDATORY, f"{job} loader"),
        ("training-on-spot", rules.MANDATORY, f"{job} training"),
        ("redis-requires-password", rules.MANDATORY, f"{redis} redis"),
    }
    messages = {v.policy: v.message for v in found}
    assert "image 'us-docker.pkg.dev/p/r/trainer:latest' is not pinned by digest" in messages["image-pinned-by-digest"]
    assert "training pods must select spot capacity" in messages["training-on-spot"]
    assert "does not require a password from a Secret" in messages["redis-requires-password"]


def test_prod_mutations_hit_the_prod_only_and_network_rules(rendered: Callable[[str], Rendered]) -> None:
    r = rendered("prod")
    fs = "gcp:filestore/instance:Instance"
    resources = mutated(r, fs, "share", lambda p: p.update(deletionProtectionEnabled=False, labels={}))
    resources = mutated(
        Rendered(r.stack, r.config, resources), fs, "share", lambda p: p.update(networks=[{"network": "other"}])
    )
    found = {(v.policy, v.level) for v in settled(offline.check(resources, offline.facts_of(r)))}
    assert found == {
        ("stateful-protection", rules.MANDATORY),
        ("cost-labels", rules.MANDATORY),
        ("filestore-on-cluster-network", rules.MANDATORY),
    }


def test_the_pack_wraps_every_rule_at_its_level() -> None:
    policies = pack.policies()
    assert [p.name for p in policies] == [r.name for r in rules.RULES]
    levels = {p.name: p.enforcement_level for p in policies}
    assert {n for n, level in levels.items() if level == EnforcementLevel.ADVISORY} == {
        "private-nodes", "workload-identity", "release-channel", *rules.AWAITING_INFRA,
    }  # fmt: skip
    assert set(levels.values()) == {EnforcementLevel.ADVISORY, EnforcementLevel.MANDATORY}


def _run_resource_policy(name: str, type_: str, props: dict[str, Any], stack: str = "dev") -> list[str]:
    """Run one wrapped policy the way the analyzer does: props behind the SDK's unknown-checking proxy."""
    (policy,) = [p for p in pack.policies() if p.name == name]
    assert isinstance(policy, ResourceValidationPolicy)
    reported: list[str] = []
    urn = f"urn:pulumi:{stack}::spot-trainer::{type_}::x"
    args = ResourceValidationArgs(type_, unknown_checking_proxy(props), urn, "x", None, None)  # type: ignore[arg-type]
    policy.validate(args, lambda message, urn=None: reported.append(message))
    return reported


def test_wrapped_policies_report_through_the_sdk(
    rendered: Callable[[str], Rendered], monkeypatch: pytest.MonkeyPatch
) -> None:
    r = rendered("dev")
    monkeypatch.setattr(pack, "stack_facts", lambda stack: offline.facts_of(r))
    loader = copy.deepcopy(r.one("kubernetes:batch/v1:Job", "loader").inputs)
    assert _run_resource_policy("image-pinned-by-digest", "kubernetes:batch/v1:Job", loader) == []
    pod_spec(loader)["containers"][0]["image"] = "trainer:latest"
    (message,) = _run_resource_policy("image-pinned-by-digest", "kubernetes:batch/v1:Job", loader)
    assert "'trainer:latest' is not pinned by digest" in message


def test_a_wrapped_policy_protects_every_stack() -> None:
    cluster = {"deletionProtection": False}
    for stack in ("dev", "prod"):
        assert _run_resource_policy("stateful-protection", rules.CLUSTER, cluster, stack=stack) == [
            f"Cluster: deletionProtection is False in stack {stack!r}; it must be true (unless allowDataLoss is set)"
        ]


def test_a_wrapped_policy_reads_the_protect_option_from_the_engine() -> None:
    """prod's BASIC_SSD share is guarded by `protect`, which the analyzer passes in ``args.opts``."""
    (policy,) = [p for p in pack.policies() if p.name == "stateful-protection"]
    share = {"tier": "BASIC_SSD", "labels": {}}

    def run(protect: bool) -> list[str]:
        reported: list[str] = []
        opts = PolicyResourceOptions(protect, [], False, [], PolicyCustomTimeouts(0, 0, 0), [])
        urn = f"urn:pulumi:prod::spot-trainer::{rules.FILESTORE}::share"
        args = ResourceValidationArgs(rules.FILESTORE, unknown_checking_proxy(share), urn, "share", opts, None)  # type: ignore[arg-type]
        policy.validate(args, lambda message, urn=None: reported.append(message))
        return reported

    assert run(protect=True) == []
    assert run(protect=False) == [
        "Filestore instance: tier 'BASIC_SSD' in stack 'prod' must have Pulumi's `protect` option (unless "
        "allowDataLoss is set)"
    ]


def test_wrapped_stack_policies_report_against_the_offending_urn(rendered: Callable[[str], Rendered]) -> None:
    r = rendered("dev")
    (policy,) = [p for p in pack.policies() if p.name == "redis-requires-password"]
    assert isinstance(policy, StackValidationPolicy)

    def run(resources: list[Registered]) -> list[tuple[str, str | None]]:
        views = [offline.stack_view(res) for res in resources]
        args = StackValidationArgs(
            [PolicyResource(v.type, unknown_checking_proxy(dict(v.props)), v.urn, v.name, None, None, None, [], {})  # type: ignore[arg-type]
             for v in views]
        )  # fmt: skip
        reported: list[tuple[str, str | None]] = []
        policy.validate(args, lambda message, urn=None: reported.append((message, urn)))
        return reported

    assert run(r.resources) == []

    def open_redis(props: dict[str, Any]) -> None:
        pod_spec(props)["containers"][0]["args"] = []

    ((message, urn),) = run(mutated(r, "kubernetes:apps/v1:Deployment", "redis", open_redis))
    assert urn == r.one("kubernetes:apps/v1:Deployment").urn and "does not require a password" in message


def test_an_unknown_value_in_preview_is_not_a_silent_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK turns UnknownValueError into "can't run policy during preview"; a rule must not hide it."""
    monkeypatch.setattr(pack, "stack_facts", lambda stack: rules.StackFacts(stack=stack))
    job = {"metadata": {"name": "j"}, "spec": {"template": {"spec": {"containers": [
        {"name": "worker", "image": UNKNOWN_STRING_VALUE}]}}}}  # fmt: skip
    with pytest.raises(UnknownValueError):
        _run_resource_policy("image-pinned-by-digest", "kubernetes:batch/v1:Job", job)


def test_the_stack_name_comes_from_the_urn(rendered: Callable[[str], Rendered]) -> None:
    for stack in STACKS:
        assert {pack.stack_of(res.urn) for res in rendered(stack).resources} == {stack}


def test_stack_facts_follow_the_config_the_engine_passes() -> None:
    facts = pack.stack_facts({"onDemandFallback": "true", "team": "data"}, stack="prod")
    assert facts == rules.StackFacts("prod", True, {"env": "prod", "app": "spot-trainer", "team": "data"})
    assert pack.stack_facts({}, stack="dev").labels["team"] is None


def test_the_rules_import_without_provider_sdks() -> None:
    """The pack's own virtualenv has pulumi and pulumi-policy only (policy/requirements.txt)."""
    code = (
        "import sys; sys.modules['pulumi_gcp'] = sys.modules['pulumi_kubernetes'] = None; "
        "from policy import pack; print(len(pack.policies()))"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=render.REPO_ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(len(rules.RULES))


def test_the_pack_pins_what_the_project_pins() -> None:
    from tests.policy.test_policy_workflows import requirement_lines

    pack_pins = requirement_lines(render.REPO_ROOT / "policy" / "requirements.txt")
    assert set(pack_pins) == {"pulumi", "pulumi-policy", "pyyaml"}  # no provider SDK: they are hundreds of MB
    assert pack_pins.items() <= requirement_lines(render.REPO_ROOT / "requirements.txt").items()


@pytest.mark.parametrize("stack", STACKS)
def test_make_render_writes_valid_manifests_and_a_masked_inventory(stack: str, tmp_path: Path) -> None:
    """``make render STACK=<stack>`` calls ``offline.main``, which calls ``render_and_check``."""
    assert offline.main([stack, "--out", str(tmp_path)]) == 0
    manifests = sorted((tmp_path / "manifests").glob("*.yaml"))
    assert {m["kind"] for m in map(lambda p: yaml.safe_load(p.read_text()), manifests)} >= {"Job", "Secret"}
    for path in manifests:
        manifest = yaml.safe_load(path.read_text())
        if not _is_custom(manifest):
            kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True)
    inventory = json.loads((tmp_path / "inventory.json").read_text())
    rendered = render.render(stack)
    assert len(inventory["resources"]) == len(rendered.resources)
    assert {"type", "name", "inputs"} <= set(inventory["resources"][0])
    written = "".join(p.read_text() for p in tmp_path.rglob("*") if p.is_file())
    password = rendered.one("random:index/randomPassword:RandomPassword").outputs["result"]
    for secret_value in (password, render.ACCESS_TOKEN, render.CLUSTER_CA):
        assert secret_value not in written
    assert render.MASK in written


def test_make_render_fails_on_a_mandatory_violation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(rules, "RULES", (rules.Rule("always", "d", rules.MANDATORY, lambda t, p, f: ["no"]),))
    assert offline.main(["dev", "--out", str(tmp_path)]) == 1
    assert "[mandatory] always:" in capsys.readouterr().out


DATA = {"datasetUri": "gs://acme-fraud/exports", "outputUri": "gs://acme-results/out"}


def test_a_stack_with_its_own_data_passes_and_a_wider_grant_does_not() -> None:
    r = render.render("dev", DATA)
    assert settled(offline.check_rendered(r)) == []
    grant = "gcp:storage/bucketIAMMember:BucketIAMMember"

    def elsewhere(props: dict[str, Any]) -> None:
        props["bucket"] = "someone-elses-bucket"

    def whole_bucket(props: dict[str, Any]) -> None:
        props.pop("condition")

    resources = mutated(r, grant, "loader-identity-objectviewer", elsewhere)
    resources = mutated(Rendered(r.stack, r.config, resources), grant, "worker-identity-objectuser", whole_bucket)
    found = settled(offline.check(resources, offline.facts_of(r)))
    assert {(v.policy, v.level, v.resource) for v in found} == {
        ("workload-storage-scope", rules.MANDATORY, f"{grant} loader-identity-objectviewer"),
        ("workload-storage-scope", rules.MANDATORY, f"{grant} worker-identity-objectuser"),
    }


def test_the_pack_sees_the_data_settings_the_engine_passes() -> None:
    facts = pack.stack_facts({"datasetUri": "gs://acme-fraud/exports/", "outputUri": "gs://acme-results/out"}, "dev")
    assert (facts.dataset_uri, facts.output_uri) == ("gs://acme-fraud/exports", "gs://acme-results/out")
    offline_facts = offline.facts_of(render.render("dev", DATA))
    assert (offline_facts.dataset_uri, offline_facts.output_uri) == (facts.dataset_uri, facts.output_uri)


def test_make_render_shows_the_service_accounts_and_their_roles(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``make render STACK=dev ARGS='datasetUri=... outputUri=...'``: identities on screen and on disk."""
    args = ["dev", "--out", str(tmp_path), *(f"{k}={v}" for k, v in DATA.items())]
    assert offline.main(args) == 0
    out = capsys.readouterr().out
    loader = "spot-trainer-dev-loader@spot-trainer-test.iam.gserviceaccount.com"
    assert (f"serviceAccount:{loader}: roles/storage.objectViewer on bucket acme-fraud if "
            'resource.name.startsWith("projects/_/buckets/acme-fraud/objects/exports/") || api.getAttribute('
            '"storage.googleapis.com/objectListPrefix", "").startsWith("exports/")\n') in out
    assert (
        "roles/storage.objectUser on bucket acme-results if "
        'resource.name.startsWith("projects/_/buckets/acme-results/objects/out/")'
    ) in out
    assert "svc.id.goog[spot-trainer/spot-trainer-loader]: roles/iam.workloadIdentityUser on " in out
    ksa = yaml.safe_load((tmp_path / "manifests" / "serviceaccount-spot-trainer-spot-trainer-loader.yaml").read_text())
    assert ksa["metadata"]["annotations"] == {"iam.gke.io/gcp-service-account": loader}
    inventory = json.loads((tmp_path / "inventory.json").read_text())["resources"]
    types = {r["type"] for r in inventory}
    assert {"gcp:serviceaccount/iAMMember:IAMMember", "gcp:storage/bucketIAMMember:BucketIAMMember"} <= types


def test_make_render_reports_a_bad_override(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert offline.main(["dev", "--out", str(tmp_path), "runs=[main, v2]"]) == 2
    assert "the old list form is now a map: {main: {}, v2: {}}" in capsys.readouterr().err


@pytest.mark.parametrize("stack", render.stack_names())
def test_the_pack_refuses_an_unprotected_share_unless_data_loss_is_allowed(
    stack: str, rendered: Callable[..., Rendered]
) -> None:
    """Every stack's share and cluster outlive a mistaken destroy or a replacing change (a new zone); a
    stack that set allowDataLoss is the only one whose unprotected share passes. Unprotected: Pulumi's protect
    off on a BASIC share (dev), Filestore's own deletionProtectionEnabled off on a ZONAL one (prod)."""
    r = rendered(stack)
    assert [v for v in offline.check_rendered(r) if v.policy == "stateful-protection"] == []
    fs = "gcp:filestore/instance:Instance"
    api = r.config.filestore.api_deletion_protection
    stripped = [
        dataclasses.replace(res, protect=False) if res.type == fs else res
        for res in mutated(Rendered(r.stack, r.config, mutated(
            r, rules.CLUSTER, "cluster", lambda p: p.update(deletionProtection=False))), fs, "share",
            lambda p: p.update(deletionProtectionEnabled=False) if api else None)
    ]
    found = [v for v in offline.check(stripped, offline.facts_of(r)) if v.policy == "stateful-protection"]
    assert {v.resource.split()[0] for v in found} == {fs, rules.CLUSTER} and all(
        v.level == rules.MANDATORY for v in found
    )
    lossy = render.render(stack, {"allowDataLoss": True})
    assert not lossy.one(fs).protect and lossy.one(rules.CLUSTER).inputs["deletionProtection"] is False
    assert [v for v in offline.check_rendered(lossy) if v.policy == "stateful-protection"] == []


def _run_stack_policy(name: str, resources: list[Registered]) -> list[tuple[str, str | None]]:
    """Run one wrapped stack policy the way the analyzer does: every resource behind the unknown-checking proxy."""
    (policy,) = [p for p in pack.policies() if p.name == name]
    assert isinstance(policy, StackValidationPolicy)
    views = [offline.stack_view(res) for res in resources]
    args = StackValidationArgs(
        [PolicyResource(v.type, unknown_checking_proxy(dict(v.props)), v.urn, v.name, None, None, None, [], {})  # type: ignore[arg-type]
         for v in views]
    )  # fmt: skip
    reported: list[tuple[str, str | None]] = []
    policy.validate(args, lambda message, urn=None: reported.append((message, urn)))
    return reported


@pytest.mark.parametrize("stack", STACKS)
def test_every_wrapped_stack_policy_passes_the_rendered_stacks_and_names_what_it_refuses(
        stack: str, rendered: Callable[[str], Rendered], engine_config: Any) -> None:
    """Through the pack, with the facts it reads itself (the stack from the URNs, the stack's config as the engine
    passes it): every stack rule passes the stack as rendered, and a refusal names the resource."""
    r = rendered(stack)
    engine_config(None, render.stack_config(stack, {}))
    for policy in pack.policies():
        if isinstance(policy, StackValidationPolicy) and policy.name not in rules.AWAITING_INFRA:
            assert _run_stack_policy(policy.name, r.resources) == [], policy.name
    share = r.one(rules.FILESTORE)
    unmounted = mutated(r, rules.FILESTORE, share.name, lambda props: props.pop("networks"))
    assert _run_stack_policy("filestore-on-cluster-network", unmounted) == [
        (f"Filestore instance {share.name!r} names no network", share.urn)]
    # A resource rule's facts too: env defaults to the stack's name from the URN.
    labels = {"env": "x", "app": "spot-trainer", "team": "t"}
    assert f"{rules.FILESTORE}: label env='x' in labels, expected {stack!r}" in _run_resource_policy(
        "cost-labels", rules.FILESTORE, {"labels": labels}, stack=stack)


@pytest.fixture
def engine_config() -> Any:
    """Set the config the engine passes to the pack (PULUMI_CONFIG); the render's config is restored after."""
    from pulumi.runtime import config as runtime_config

    before = dict(runtime_config.CONFIG.get())

    def set_config(values: dict[str, Any] | None, full: dict[str, Any] | None = None) -> None:
        """The project's `values` (short keys), or a stack's `full` config (namespaced keys) as a render sets it."""
        pulumi.runtime.set_all_config(full if full is not None else {f"{PROJECT}:{k}": v for k, v in values.items()})

    yield set_config
    pulumi.runtime.set_all_config(before)


def test_the_pack_reads_its_facts_from_the_config_the_engine_passes(engine_config: Any) -> None:
    engine_config({"env": "staging", "team": "fraud", "onDemandFallback": "True", "datasetUri": " gs://b/inX/ ",
                   "outputUri": "gs://b/outX//", DATA_LOSS_KEY: "TRUE"})  # prefixes may end in capitals
    assert pack.stack_facts(stack="prod") == rules.StackFacts(
        "prod", True, {"env": "staging", "app": "spot-trainer", "team": "fraud"}, "gs://b/inX", "gs://b/outX", True)
    engine_config({"env": "", "team": "", "onDemandFallback": "", "datasetUri": "", "outputUri": "",
                   DATA_LOSS_KEY: ""})
    assert pack.stack_facts(stack="dev") == rules.StackFacts(
        "dev", False, {"env": "dev", "app": "spot-trainer", "team": None}, "", "", False)


def _hardening(resources: list[Registered], r: Rendered, policy: str) -> list[offline.Violation]:
    found = [v for v in offline.check(resources, offline.facts_of(r)) if v.policy == policy]
    assert all(v.level == rules.level(policy) for v in found)
    return found


def test_the_hardening_rules_refuse_what_rendered_stacks_do_without_the_infra_settings(
    rendered: Callable[[str], Rendered],
) -> None:
    """Each issue-36 rule seen failing on a rendered stack, with the setting taken away: the launcher's Role bound
    to the scheduled loader's account instead, protect, authorized networks, the default-deny policies."""
    scheduled = render.render("dev", {"schedule": "0 3 * * *", "datasetUri": "gs://acme-fraud/exports"})
    cron = scheduled.one("kubernetes:batch/v1:CronJob", "schedule")
    loader = cron.inputs["spec"]["jobTemplate"]["spec"]["template"]["spec"]["serviceAccountName"]
    (bound,) = scheduled.of_type(rules.ROLE_BINDINGS[0])
    to_loader = mutated(scheduled, bound.type, bound.name, lambda p: p.update(subjects=[
        {"kind": "ServiceAccount", "name": loader, "namespace": p["metadata"]["namespace"]}]))
    (found,) = _hardening(to_loader, scheduled, "loader-cannot-create-pods")
    assert found.resource == f"{bound.type} {bound.name}" and "batch/jobs" in found.message

    prod = rendered("prod")
    unprotected = [dataclasses.replace(x, protect=False) for x in prod.resources]
    assert {v.resource.split()[0] for v in _hardening(unprotected, prod, "stateful-pulumi-protect")} == {
        rules.CLUSTER, rules.FILESTORE}
    public = mutated(prod, rules.CLUSTER, "cluster", lambda p: (
        p.pop("masterAuthorizedNetworksConfig", None), p["privateClusterConfig"].update(enablePrivateEndpoint=False)))
    assert len(_hardening(public, prod, "prod-control-plane-not-public")) == 1
    without_policies = [x for x in prod.resources if x.type != rules.NETWORK_POLICY]
    namespaces = {x.inputs["metadata"]["name"] for x in prod.of_type(rules.NAMESPACE)}
    found = _hardening(without_policies, prod, "default-deny-network-policy")
    assert namespaces and {v.message.split("'")[1] for v in found} == namespaces
    stripped = mutated(prod, rules.CLUSTER, "cluster", lambda p: (
        p.pop("binaryAuthorization", None), p.pop("databaseEncryption", None)))
    stripped = mutated(Rendered(prod.stack, prod.config, stripped), rules.FILESTORE, "share", lambda p: (
        p.pop("kmsKeyName", None), p["fileShares"].pop("nfsExportOptions", None)))
    found = _hardening(stripped, prod, "prod-admission-and-encryption")
    assert {v.resource.split()[0] for v in found} == {rules.CLUSTER} and len(found) == 2
    found = _hardening(stripped, prod, "prod-card-data-at-rest")
    assert {v.resource.split()[0] for v in found} == {rules.FILESTORE} and len(found) == 2
    outside = mutated(prod, rules.PERIMETER, "perimeter", lambda p: p["spec"].update(
        restrictedServices=["container.googleapis.com"]))
    (found,) = _hardening(outside, prod, "prod-service-perimeter")
    assert "storage.googleapis.com, file.googleapis.com not restricted" in found.message
    assert len(_hardening([x for x in prod.resources if x.type != rules.PERIMETER], prod,
                          "prod-service-perimeter")) == 1


POLICY_CHANGES = [
    (lambda p: p["defaultAdmissionRule"].update(evaluationMode="ALWAYS_ALLOW"), "the default rule is ALWAYS_ALLOW"),
    (lambda p: p["clusterAdmissionRules"][0].update(requireAttestationsBies=["projects/x/attestors/anyone"]),
     "not REQUIRE_ATTESTATION by the stack's own attestor"),
    (lambda p: p["clusterAdmissionRules"][0].update(enforcementMode="DRYRUN_AUDIT_LOG_ONLY"), "only logs"),
    (lambda p: p.update(clusterAdmissionRules=[]), "no rule for cluster us-central1.cluster"),
    (lambda p: p.update(globalPolicyEvaluationMode="DISABLE"), "GKE's own system images"),
    (lambda p: p.update(admissionWhitelistPatterns=[{"namePattern": "docker.io/*"}]), "admit images by path"),
]


@pytest.mark.parametrize(("change", "says"), POLICY_CHANGES)
def test_a_binary_authorization_policy_that_admits_more_than_the_stacks_signed_images_is_refused(
    change: Any, says: str, rendered: Callable[[str], Rendered]
) -> None:
    """CIS GKE 5.10.5: prod enforces the project's policy, and that policy must be the stack's own: default deny,
    the cluster's rule requiring the stack's attestor, enforced, GKE's system images by global evaluation."""
    prod = rendered("prod")
    (found,) = _hardening(mutated(prod, rules.BINAUTHZ_POLICY, "binauthz-policy", change), prod,
                          "binary-authorization-attested")
    assert says in found.message and found.resource.startswith(rules.BINAUTHZ_POLICY)


def test_a_cluster_enforcing_binary_authorization_without_the_stacks_policy_is_refused(
    rendered: Callable[[str], Rendered],
) -> None:
    prod = rendered("prod")
    without = [x for x in prod.resources if x.type not in (rules.BINAUTHZ_POLICY, rules.BINAUTHZ_ATTESTOR)]
    (found,) = _hardening(without, prod, "binary-authorization-attested")
    assert found.resource == f"{rules.CLUSTER} cluster" and "declares no policy" in found.message
    dev = rendered("dev")  # dev enforces nothing: nothing to back
    assert _hardening([*dev.resources], dev, "binary-authorization-attested") == []


@pytest.mark.parametrize("rule", ["prod-control-plane-not-public", "prod-admission-and-encryption",
                                  "binary-authorization-attested", "prod-card-data-at-rest",
                                  "prod-service-perimeter"])
def test_prod_complies_with_its_mandatory_hardening_rules(rule: str, rendered: Callable[[str], Rendered]) -> None:
    """stacks/Pulumi.prod.yaml sets authorizedNetworks, binaryAuthorization, a key of the stack's own for the
    Secrets and one for the ZONAL share, exported to the nodes' range with root squashed: the rules are mandatory,
    prod passes them as rendered, and dev is not held to them."""
    assert rule not in rules.AWAITING_INFRA and rules.level(rule) == rules.MANDATORY
    assert _hardening([*rendered("prod").resources], rendered("prod"), rule) == []


def test_the_up_that_creates_a_prod_share_without_root_squash_is_refused_by_the_pack() -> None:
    """The bootstrap `up` of a new prod share (filestoreRootSquash false, docs/cloud.md "A new prod share") keeps the
    key and the nodes' range but not root squash: the mandatory rule names it, so it cannot pass CI's policy gate
    unnoticed; it is run once, by hand, as the docs say."""
    bootstrap = render.render("prod", {"filestoreRootSquash": False})
    share = bootstrap.one(rules.FILESTORE)
    assert share.inputs["fileShares"]["nfsExportOptions"] == [{
        "ipRanges": [bootstrap.config.network.subnet_cidr], "accessMode": "READ_WRITE", "squashMode": "NO_ROOT_SQUASH"}]
    (found,) = _hardening([*bootstrap.resources], bootstrap, "prod-card-data-at-rest")
    assert found.level == rules.MANDATORY and "ROOT_SQUASH" in found.message and "kmsKeyName" not in found.message
