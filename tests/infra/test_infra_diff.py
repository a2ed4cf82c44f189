"""`make diff`: a config change previewed under mocks, with the replacements that destroy data named loudly.

The replace-on-change facts are infra/replacements.py's (each with its provider-source evidence); these
tests check that the preview applies them: the acceptance case (a new zone replaces dev's share), a size
change that updates in place, and the exit status a script can stop on.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from infra import diff, render, replacements
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
    lines = diff.report(list(changes.values()), protected=True)
    assert lines[0].startswith("!! DATA LOSS: replace  gcp:filestore/instance:Instance share")
    assert "1 stateful resource(s) destroyed" in lines[-1]


def test_growing_the_share_updates_in_place_and_loses_nothing(rendered: Render) -> None:
    before = rendered("dev")
    changes = diff.compare(before, rendered("dev", filestoreCapacityGb=before.config.filestore.capacity_gb + 1024))
    assert {c.action for c in changes} == {"update"}
    assert _by_name(changes)[(FILESTORE, "share")].why == "fileShares.capacityGb"
    assert not any(c.loses for c in changes)


def test_a_new_output_bucket_replaces_the_grant_and_says_so(rendered: Render) -> None:
    before = rendered("dev", outputUri="gs://acme-results/runs/v1")
    changes = _by_name(diff.compare(before, rendered("dev", outputUri="gs://acme-archive/runs/v1")))
    (grant,) = [c for (t, _), c in changes.items() if t == replacements.BUCKET_GRANT]
    assert grant.action == "replace" and "bucket" in grant.why and "access" in grant.loses


def test_make_diff_exits_1_on_data_loss_and_0_otherwise(capsys: pytest.CaptureFixture[str]) -> None:
    assert diff.main(["dev", "filestoreShare=data"]) == 1
    out = capsys.readouterr().out
    assert "!! DATA LOSS: replace  gcp:filestore/instance:Instance share  (fileShares.name)" in out
    assert diff.main(["dev", "workerMemory=32Gi"]) == 0
    out = capsys.readouterr().out
    assert "DATA LOSS" not in out and "replace  kubernetes:batch/v1:Job training  (spec.template)" in out
    assert diff.main(["dev", "zone=europe-west4-a"]) == 2  # a bad value: the config's own one-line error


def test_every_fact_names_its_evidence_in_the_providers_source() -> None:
    for fact in replacements.FACTS:
        assert fact.paths and ("terraform-provider-google" in fact.evidence or "diff.go" in fact.evidence)
    assert replacements.stateful(FILESTORE) and replacements.stateful(replacements.CLUSTER)
    assert "metadata.name" in replacements.replace_paths("kubernetes:core/v1:Namespace")


def test_only_kubernetes_objects_are_replaced_by_a_new_name_and_nothing_stateless_is_lost() -> None:
    """The facts as `make diff` reads them: a Google resource's own ForceNew inputs, a Kubernetes object's plus
    its name and namespace; what a replacement destroys is a sentence for a stateful resource and '' otherwise."""
    assert replacements.replace_paths(replacements.BUCKET_GRANT) == ("bucket", "role", "member", "condition")
    assert replacements.replace_paths("kubernetes:core/v1:ConfigMap") == (
        "data", "binaryData", "metadata.name", "metadata.namespace")
    assert replacements.stateful("kubernetes:core/v1:ConfigMap") == ""
    assert replacements.stateful(replacements.BUCKET_GRANT).startswith("a bucket grant: the pods lose access")
