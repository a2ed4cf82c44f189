"""Static checks run by `make test`: ruff on all Python, yamllint on all YAML, hadolint on the Dockerfile.

(Manifests against Kubernetes 1.33 are tests/infra/test_infra_manifests.py and, for what `make render`
writes, tests/policy/test_policy_stacks.py.)
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from infra import render

ROOT = render.REPO_ROOT
BIN = Path(sys.executable).parent


def run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), cwd=cwd, capture_output=True, text=True, timeout=120)


def test_ruff_on_all_python() -> None:
    result = run(str(BIN / "ruff"), "check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_yamllint_on_all_yaml() -> None:
    result = run(str(BIN / "yamllint"), "--strict", ".")
    assert result.returncode == 0, result.stdout + result.stderr
    listed = run(str(BIN / "yamllint"), "--list-files", ".").stdout.split()
    linted = {str(Path(p)) for p in listed}
    expected = {
        "Pulumi.yaml", "policy/PulumiPolicy.yaml", ".github/workflows/preview.yml", ".github/workflows/up.yml",
        *(f"stacks/Pulumi.{s}.yaml" for s in render.stack_names()),
    }  # fmt: skip
    assert expected <= linted


def test_yamllint_is_not_vacuous(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("a: 1\na: 2\nb:   [x,y]\n")
    result = run(str(BIN / "yamllint"), "-c", str(ROOT / ".yamllint"), "--strict", "bad.yaml", cwd=tmp_path)
    assert result.returncode != 0 and "key-duplicates" in result.stdout


def test_hadolint_on_the_dockerfile() -> None:
    result = run(str(BIN / "hadolint"), "workload/Dockerfile")
    assert result.returncode == 0, result.stdout + result.stderr
    probe = subprocess.run(
        [str(BIN / "hadolint"), "-"], input="FROM python:latest\nRUN cd /tmp\n", capture_output=True, text=True
    )
    assert probe.returncode != 0 and "DL3007" in probe.stdout  # `latest` base images are caught


def test_the_venv_has_no_broken_requirements() -> None:
    """`make test`'s venv holds the worker, the Pulumi SDKs and the policy pack together; a pin that one
    of them cannot live with (google-api-core's protobuf against pulumi-policy's) is a broken install."""
    result = run(sys.executable, "-m", "pip", "check")
    assert result.returncode == 0 and "No broken requirements found" in result.stdout, result.stdout
