"""`make diff`: a config change previewed under mocks, with the replacements that destroy data named loudly.

The replace-on-change facts are infra/replacements.py's (each path with the file and line of the provider's
source that makes it so); these tests pin what `make diff` prints for the changes issue 36 names (zone,
region, subnetCidr shrink and expand, filestoreTier, clusterMode, outputUri, the failure policy, a
namespace), plus a deleted stateful resource and the exit status a script can stop on.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Callable

import pytest

from infra import diff, render, replacements
from infra.diff import REFUSED
from infra.render import Rendered

Render = Callable[..., Rendered]
FILESTORE = replacements.FILESTORE


def _by_name(changes: list[diff.Change]) -> dict[tuple[str, str], diff.Change]:
    return {(c.type, c.name): c for c in changes}


@pytest.mark.parametrize("stack", render.stack_names())
def test_a_new_zone_is_reported_as_a_replacement_of_the_share(stack: str, rendered: Render) -> None:
    before = rendered(stack)
    zone = before.config.region + "-b"
    changes = _by_name(diff.compare(before, rendered(stack, zone=zone)))
    share = changes[(FILESTORE, "share")]
    assert share.action == "replace" and "location" in share.why
    assert "checkpoints" in share.loses
    # The PV names the instance's IP, a new one after the replacement.
    assert changes[("kubernetes:core/v1:PersistentVolume", "share")].action == "replace"
    assert changes[(FILESTORE, "share")] == diff.compare(before, rendered(stack, zone=zone))[0]  # loudest first
    lines = diff.report(list(changes.values()))
    assert lines[0].startswith("!! DATA LOSS: replace  gcp:filestore/instance:Instance share")
    assert "1 stateful resource(s) destroyed" in lines[-1]


def test_growing_the_share_updates_in_place_and_loses_nothing(rendered: Render) -> None:
    before = rendered("dev")
    changes = diff.compare(before, rendered("dev", filestoreCapacityGb=before.config.filestore.capacity_gb + 1024))
    assert {c.action for c in changes} == {"update"}
    assert _by_name(changes)[(FILESTORE, "share")].why == "fileShares.capacityGb"
    assert not any(c.loses for c in changes)


def test_a_new_output_bucket_replaces_the_grant_and_loses_no_data(rendered: Render) -> None:
    """A grant's replacement moves access (the provider creates the new grant, then deletes the old one): it is
    no DATA LOSS, and `make diff` exits 0 on it."""
    before = rendered("dev", outputUri="gs://acme-results/runs/v1")
    changes = diff.compare(before, rendered("dev", outputUri="gs://acme-archive/runs/v1"))
    (grant,) = [c for c in changes if c.type == replacements.BUCKET_GRANT]
    assert grant.action == "replace" and "bucket" in grant.why and not grant.loses
    assert not any(c.loses or c.fails for c in changes)
    assert not [line for line in diff.report(changes) if "DATA LOSS" in line]


def test_make_diff_exits_1_on_data_loss_and_0_otherwise(capsys: pytest.CaptureFixture[str]) -> None:
    assert diff.main(["dev", "filestoreShare=data"]) == 1
    out = capsys.readouterr().out
    assert "!! DATA LOSS: replace  gcp:filestore/instance:Instance share  (fileShares.name)" in out
    assert diff.main(["dev", "workerMemory=32Gi"]) == 0
    out = capsys.readouterr().out
    assert "DATA LOSS" not in out and "replace  kubernetes:batch/v1:Job training  (spec.template)" in out
    assert diff.main(["dev", "zone=europe-west4-a"]) == 2  # a bad value: the config's own one-line error


def test_every_fact_names_the_file_and_line_of_the_providers_source() -> None:
    for fact in replacements.FACTS:
        assert fact.paths
        for path, source in fact.sources.items():
            assert re.fullmatch(r"(google|provider)/[\w/]+\.go:\d+", source), (fact.type, path, source)
    for paths in replacements.API_IMMUTABLE.values():
        assert all("validation.go" in source for source in paths.values())
    assert replacements.stateful(FILESTORE) and replacements.stateful(replacements.CLUSTER)
    assert "metadata.name" in replacements.replace_paths("kubernetes:core/v1:Namespace")


def test_only_kubernetes_objects_are_replaced_by_a_new_name_and_nothing_stateless_is_lost() -> None:
    """The facts as `make diff` reads them: a Google resource's own ForceNew inputs, a Kubernetes object's plus
    its name and namespace; what a replacement destroys is a sentence for a stateful resource and '' otherwise."""
    assert replacements.replace_paths(replacements.BUCKET_GRANT) == ("bucket", "role", "member", "condition")
    assert replacements.replace_paths("kubernetes:core/v1:ConfigMap") == (
        "binaryData", "data", "metadata.name", "metadata.namespace")
    assert replacements.stateful("kubernetes:core/v1:ConfigMap") == ""
    assert replacements.stateful(replacements.BUCKET_GRANT) == ""  # a grant moves access; it holds no data


def _actions(changes: list[diff.Change]) -> dict[tuple[str, str], str]:
    return {(c.type, c.name): c.action for c in changes}


def test_a_new_region_replaces_what_lives_in_a_region(rendered: Render) -> None:
    """Subnet, router and NAT (region ForceNew), the registries (the image's and the Docker Hub proxy: location
    ForceNew), the cluster and the share (location) are replaced; the network is global and stays."""
    changes = diff.compare(rendered("dev"), rendered("dev", region="europe-west4", zone="europe-west4-a"))
    actions = _actions(changes)
    for type_, why in ((replacements.SUBNETWORK, "region"), (replacements.ROUTER, "region"),
                       (replacements.ROUTER_NAT, "region"), (replacements.REPOSITORY, "location"),
                       (replacements.CLUSTER, "location"), (FILESTORE, "location")):  # fmt: skip
        found = [c for c in changes if c.type == type_]
        assert len(found) == (2 if type_ == replacements.REPOSITORY else 1), found
        for change in found:
            assert change.action == "replace" and change.why == why, change
    assert (replacements.NETWORK, "network") not in actions
    assert {c.type for c in changes if c.loses} == {replacements.CLUSTER, FILESTORE}


@pytest.mark.parametrize(
    "old, new, replaced",
    [
        ("10.10.0.0/20", "10.10.0.0/16", False),  # expansion: the provider's update method widens it
        ("10.10.0.0/20", "10.10.0.0/20", False),
        ("10.10.0.0/20", "10.10.0.0/21", True),  # shrink
        ("10.10.0.0/20", "10.11.0.0/20", True),  # same size elsewhere: not an expansion
        ("10.10.0.0/20", "10.11.0.0/16", True),  # larger but not containing the old range
    ],
)
def test_a_subnet_range_is_replaced_unless_it_expands(old: str, new: str, replaced: bool) -> None:
    assert replacements.is_shrinkage_ip_cidr(old, new) is replaced


def test_a_subnet_range_elsewhere_replaces_the_subnet_and_so_the_cluster(rendered: Render) -> None:
    changes = diff.compare(rendered("dev"), rendered("dev", subnetCidr="10.11.0.0/20"))
    actions = _actions(changes)
    assert actions[(replacements.SUBNETWORK, "network")] == "replace"
    cluster = _by_name(changes)[(replacements.CLUSTER, "cluster")]
    assert cluster.action == "replace" and cluster.why.startswith("subnetwork takes outputs") and cluster.loses


def test_a_wider_subnet_range_is_an_update(rendered: Render) -> None:
    changes = diff.compare(rendered("dev"), rendered("dev", subnetCidr="10.10.0.0/16"))
    assert [(c.action, c.type, c.why) for c in changes] == [("update", replacements.SUBNETWORK, "ipCidrRange")]


def test_a_new_share_tier_replaces_the_share_and_says_what_stops_it(rendered: Render) -> None:
    """BASIC -> ZONAL: the tier is ForceNew. Today only BASIC shares carry Pulumi's protect, so the new ZONAL
    one lifts it in the same update and the engine lets the replacement through: the BASIC share (which has
    no provider deletion protection) WILL BE DELETED. With protect on every tier (the infra branch), the
    engine refuses it; both outcomes are pinned here."""
    before = rendered("dev")
    after = rendered("dev", filestoreTier="ZONAL")
    changes = diff.compare(before, after)
    share = _by_name(changes)[(FILESTORE, "share")]
    assert share.action == "replace" and share.why == "tier" and "checkpoints" in share.loses
    (line,) = [line for line in diff.report(changes) if "DATA LOSS" in line]
    if after.one(FILESTORE).protect:
        assert share.protect and REFUSED in line
    else:
        assert "protect is lifted in this same update" in line and "WILL BE DELETED" in line


def test_a_new_cluster_mode_replaces_the_cluster_and_everything_in_it(rendered: Render) -> None:
    """The cluster's new endpoint is unknown at preview, so the Kubernetes provider replaces itself (its
    DiffConfig on an unknown kubeconfig) and the engine replaces every object it manages."""
    before = rendered("dev")
    changes = diff.compare(before, rendered("dev", clusterMode="standard"))
    by_name = _by_name(changes)
    cluster = by_name[(replacements.CLUSTER, "cluster")]
    assert cluster.action == "replace" and "enableAutopilot" in cluster.why and cluster.loses
    provider = by_name[("pulumi:providers:kubernetes", "cluster")]
    assert (provider.action, provider.why) == ("replace", "kubeconfig takes outputs of the replaced cluster")
    kept = {(r.type, r.name) for r in before.kubernetes()} - {(c.type, c.name) for c in changes if c.action != "update"}
    assert not kept  # replaced or deleted, every one
    assert by_name[("kubernetes:core/v1:Secret", "redis")].why == "its provider 'cluster' is replaced"
    (line,) = [line for line in diff.report(changes) if "GKE cluster" in line]
    assert (REFUSED if cluster.protect else "deletion protection stops `pulumi up` half-way") in line


def test_a_new_namespace_replaces_every_namespaced_object_and_destroys_no_data(rendered: Render) -> None:
    before = rendered("dev")
    changes = diff.compare(before, rendered("dev", namespace="other"))
    namespaced = {(r.type, r.name) for r in before.kubernetes() if "namespace" in r.inputs.get("metadata", {})}
    assert namespaced and namespaced <= {(c.type, c.name) for c in changes if c.action == "replace"}
    assert all("metadata.namespace" in c.why for c in changes if (c.type, c.name) in namespaced)
    assert not any(c.loses for c in changes)


def _job_changed(before: Render, change: Callable[[dict], None], replace_on: list[str] | None = None) -> list:
    old = before("dev")
    new = copy.deepcopy(old)
    job = new.one(replacements.JOB, "training")
    change(job.inputs)
    if replace_on is not None:
        job.replace_on_changes = replace_on
    return diff.compare(old, new)


def _no_retry_on_preemption(inputs: dict) -> None:
    inputs["spec"]["podFailurePolicy"]["rules"] = inputs["spec"]["podFailurePolicy"]["rules"][1:]


def test_the_stacks_jobs_are_replaced_when_their_failure_policy_changes(rendered: Render) -> None:
    """The program names spec.podFailurePolicy in the Jobs' replaceOnChanges (infra/jobs.py), so `make diff`
    shows the replacement the engine will make, never a PATCH the API server refuses."""
    (job,) = _job_changed(rendered, _no_retry_on_preemption)
    assert (job.action, job.why, job.fails) == ("replace", "spec.podFailurePolicy (replaceOnChanges)", "")


def test_a_new_failure_policy_is_an_update_the_api_server_refuses(rendered: Render) -> None:
    """spec.podFailurePolicy is immutable in the Kubernetes API (ValidateJobSpecUpdate) and not among the
    provider's replace-on-change paths: without replaceOnChanges the provider PATCHes it and `pulumi up` fails."""
    (job,) = _job_changed(rendered, _no_retry_on_preemption, replace_on=[])
    assert (job.action, job.why, job.fails) == ("update", "spec.podFailurePolicy.rules", "spec.podFailurePolicy")
    lines = diff.report([job])
    assert lines[0].startswith("!! WILL FAIL: update   kubernetes:batch/v1:Job training") and "immutable" in lines[0]
    assert lines[-1] == "1 update; 1 update(s) the API server refuses"


def test_a_failure_policy_named_in_replace_on_changes_replaces_the_job(rendered: Render) -> None:
    (job,) = _job_changed(rendered, _no_retry_on_preemption, replace_on=["spec.podFailurePolicy"])
    assert (job.action, job.why, job.fails) == ("replace", "spec.podFailurePolicy (replaceOnChanges)", "")
    (job,) = _job_changed(rendered, lambda i: i["spec"].update(backoffLimit=99), replace_on=["spec.podFailurePolicy"])
    assert (job.action, job.fails) == ("update", "")  # backoffLimit is mutable, and not named


def test_a_deleted_stateful_resource_is_data_loss_too(rendered: Render) -> None:
    before = rendered("dev")
    after = dataclasses.replace(before, resources=[r for r in before.resources if r.type != FILESTORE])
    changes = diff.compare(before, after)
    share = _by_name(changes)[(FILESTORE, "share")]
    assert share.action == "delete" and "checkpoints" in share.loses and share.protect
    lines = diff.report(changes)
    assert lines[0].startswith("!! DATA LOSS: delete   gcp:filestore/instance:Instance share")
    assert REFUSED in lines[0] and lines[-1] == "1 delete; 1 stateful resource(s) destroyed"
    bare = dataclasses.replace(before, resources=[
        dataclasses.replace(r, protect=False) if r.type == FILESTORE else r for r in before.resources])
    (share,) = diff.compare(bare, after)
    assert "nothing stops it: the data WILL BE DELETED" in diff.report([share])[0]


def _registered(type_: str, inputs: dict) -> render.Registered:
    return render.Registered(type_, "x", f"urn:pulumi:dev::p::{type_}::x", "id", inputs, {}, "", "", [], {}, False)


@pytest.mark.parametrize(
    "spec, action",
    [
        ({"resources": {"requests": {"storage": "2Gi"}}}, "update"),  # an expansion, in place
        ({"storageClassName": "premium-rwo"}, "replace"),
        ({"accessModes": ["ReadWriteMany"]}, "replace"),
        ({"volumeName": "other"}, "replace"),
    ],
)
def test_a_claim_is_replaced_only_on_the_four_fields_the_provider_names(spec: dict, action: str) -> None:
    base = {"metadata": {"name": "c", "namespace": "n"},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "standard-rwo", "volumeName": "v",
                     "resources": {"requests": {"storage": "1Gi"}}}}  # fmt: skip
    changed = copy.deepcopy(base)
    changed["spec"].update(spec)
    old, new = _registered(replacements.CLAIM, base), _registered(replacements.CLAIM, changed)
    before = render.Rendered("dev", None, [old])  # type: ignore[arg-type]
    (change,) = diff.compare(before, dataclasses.replace(before, resources=[new]))
    assert change.action == action


def test_the_launch_config_map_is_replaced_on_a_new_body() -> None:
    """pulumi-kubernetes replaces a ConfigMap on data unless enableConfigMapMutable is set (diff.go:32-33)."""
    old = _registered("kubernetes:core/v1:ConfigMap", {"metadata": {"name": "launch"}, "data": {"job.json": "{}"}})
    new = _registered("kubernetes:core/v1:ConfigMap", {"metadata": {"name": "launch"}, "data": {"job.json": "{1}"}})
    before = render.Rendered("dev", None, [old])  # type: ignore[arg-type]
    (change,) = diff.compare(before, dataclasses.replace(before, resources=[new]))
    assert (change.action, change.why) == ("replace", "data")
