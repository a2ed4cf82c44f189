"""Every Kubernetes object the program declares passes ``kubernetes-validate --strict`` for 1.33.

Custom resources (the GKE ComputeClass) have no schema in the validator and are the only exception.
"""

from __future__ import annotations

import copy
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from infra import render
from infra.render import Rendered

KUBERNETES_VERSION = "1.33"
CUSTOM_RESOURCE_GROUPS = {"cloud.google.com"}
VARIANTS = [(stack, {}) for stack in render.stack_names()] + [
    ("dev", {"clusterMode": "standard", "gpuCapacity": "nodeSelector"}),
    ("dev", {"gpuCapacity": "nodeSelector", "jobAwait": "skip"}),
    # Bring-your-data: Workload Identity service accounts, the runs ConfigMap, OUTPUT_URI.
    ("dev", {"datasetUri": "gs://acme-fraud/exports", "outputUri": "gs://acme-results/runs",
             "runs": {"main": {}, "wide": {"hidden": [128, 64]}}}),
]


def _is_custom(manifest: dict[str, Any]) -> bool:
    return manifest["apiVersion"].split("/")[0] in CUSTOM_RESOURCE_GROUPS


@pytest.mark.parametrize(("stack", "overrides"), VARIANTS, ids=lambda v: str(v) if v else "stack-file")
def test_every_manifest_validates_strictly(
    stack: str, overrides: dict[str, Any], rendered: Callable[..., Rendered]
) -> None:
    manifests = rendered(stack, **overrides).manifests()
    kinds = {m["kind"] for m in manifests}
    assert {"Job", "Deployment", "Service", "NetworkPolicy", "Secret", "PersistentVolume"} <= kinds
    for manifest in manifests:
        if _is_custom(manifest):
            continue
        # Raises ValidationError (or SchemaNotFoundError for an unknown kind) with the offending path.
        kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True)


def test_only_the_compute_class_is_exempt(rendered: Callable[..., Rendered]) -> None:
    custom = [m["kind"] for m in rendered("dev").manifests() if _is_custom(m)]
    assert custom == ["ComputeClass"]


def test_the_validator_is_strict_and_offline(rendered: Callable[..., Rendered]) -> None:
    """A validator that accepts anything checks nothing: an unknown field and a wrong type must fail."""
    job = next(m for m in rendered("dev").manifests() if m["kind"] == "Job")
    kubernetes_validate.validate(job, KUBERNETES_VERSION, strict=True)
    typo = copy.deepcopy(job)
    typo["spec"]["template"]["spec"]["restartPolicyy"] = "Never"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(typo, KUBERNETES_VERSION, strict=True)
    wrong_type = copy.deepcopy(job)
    wrong_type["spec"]["parallelism"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(wrong_type, KUBERNETES_VERSION, strict=True)


def test_the_cli_agrees(tmp_path: Path, rendered: Callable[..., Rendered]) -> None:
    """The same manifests through the ``kubernetes-validate`` command a reader would run by hand."""
    manifests = [m for m in rendered("dev").manifests() if not _is_custom(m)]
    path = tmp_path / "dev.yaml"
    path.write_text(yaml.safe_dump_all(manifests))
    cli = Path(sys.executable).parent / "kubernetes-validate"
    result = subprocess.run(
        [str(cli), "--strict", "-k", KUBERNETES_VERSION, "--quiet", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
