"""The GitHub workflows: the stack matrix comes from stacks/, every stack is previewed with the policy
pack, updates go through per-stack environments, and GCP is reached by identity federation only."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra import render

ROOT = render.REPO_ROOT
WORKFLOWS = ROOT / ".github" / "workflows"
MATRIX = "${{ fromJSON(needs.stacks.outputs.stacks) }}"


def workflow(name: str) -> dict[str, Any]:
    data = yaml.safe_load((WORKFLOWS / name).read_text())
    data["on"] = data.pop(True, data.get("on"))  # YAML 1.1 reads the key `on` as a boolean
    return data


def step(job: dict[str, Any], uses: str) -> dict[str, Any]:
    (found,) = [s for s in job["steps"] if s.get("uses", "").split("@")[0] == uses]
    return found


def index(job: dict[str, Any], predicate: Any) -> int:
    return next(i for i, s in enumerate(job["steps"]) if predicate(s))


def run_listing_step(wf: dict[str, Any], cwd: Path) -> list[str]:
    """Run the `stacks` job's listing step the way the runner would (bash, $GITHUB_OUTPUT)."""
    (listing,) = [s for s in wf["jobs"]["stacks"]["steps"] if s.get("id") == "list"]
    with tempfile.TemporaryDirectory() as out_dir:
        return _run_listing_step(wf, listing, cwd, Path(out_dir) / "github_output")


def _run_listing_step(wf: dict[str, Any], listing: dict[str, Any], cwd: Path, output: Path) -> list[str]:
    output.write_text("")
    env = {**os.environ, "GITHUB_OUTPUT": str(output)}
    subprocess.run(["bash", "-e", "-c", listing["run"]], cwd=cwd, env=env, check=True, timeout=30)
    key, _, value = output.read_text().strip().partition("=")
    assert key == "stacks" == wf["jobs"]["stacks"]["outputs"]["stacks"].split(".")[-1].rstrip(" }")
    return json.loads(value)


@pytest.mark.parametrize("name", ["preview.yml", "up.yml"])
def test_the_matrix_is_exactly_the_stack_files(name: str, tmp_path: Path) -> None:
    wf = workflow(name)
    assert run_listing_step(wf, ROOT) == render.stack_names()
    main_job = wf["jobs"]["preview" if name == "preview.yml" else "up"]
    assert main_job["needs"] == "stacks"
    assert main_job["strategy"]["matrix"] == {"stack": MATRIX}
    assert main_job["strategy"]["fail-fast"] is False
    # A new stack file joins the matrix with no workflow edit; a removed one leaves it.
    shutil.copytree(ROOT / ".github", tmp_path / ".github")
    (tmp_path / "stacks").mkdir()
    for stack in ("dev", "qa-eu"):
        (tmp_path / "stacks" / f"Pulumi.{stack}.yaml").write_text("config: {}\n")
    (tmp_path / "stacks" / "README.md").write_text("not a stack\n")
    assert run_listing_step(wf, tmp_path) == ["dev", "qa-eu"]


def test_a_stack_name_unfit_for_commands_stops_the_listing(tmp_path: Path) -> None:
    shutil.copytree(ROOT / ".github", tmp_path / ".github")
    (tmp_path / "stacks").mkdir()
    (tmp_path / "stacks" / "Pulumi.$(id).yaml").write_text("config: {}\n")
    with pytest.raises(subprocess.CalledProcessError):
        run_listing_step(workflow("preview.yml"), tmp_path)


def _common_checks(job: dict[str, Any], command: str) -> dict[str, Any]:
    assert job["permissions"]["id-token"] == "write"
    auth = step(job, "google-github-actions/auth")["with"]
    assert set(auth) == {"workload_identity_provider", "service_account"}  # no key file, no credentials_json
    gcloud = step(job, "google-github-actions/setup-gcloud")["with"]
    assert "gke-gcloud-auth-plugin" in gcloud["install_components"]
    step(job, "docker/setup-buildx-action")
    pulumi = step(job, "pulumi/actions")
    assert pulumi["with"]["command"] == command
    assert pulumi["with"]["stack-name"] == "${{ matrix.stack }}"
    assert pulumi["with"]["cloud-url"] == "${{ vars.PULUMI_BACKEND_URL }}"
    # The pack folder the action gets is the one holding PulumiPolicy.yaml.
    assert (ROOT / pulumi["with"]["policyPacks"] / "PulumiPolicy.yaml").is_file()
    # Dependencies are in .venv (Pulumi.yaml's virtualenv) before Pulumi, auth and tools too.
    install = index(job, lambda s: "pip install -r requirements.txt" in s.get("run", ""))
    assert ".venv/bin/pip" in job["steps"][install]["run"]
    pulumi_at = index(job, lambda s: s.get("uses", "").startswith("pulumi/actions"))
    for earlier in ("google-github-actions/auth", "google-github-actions/setup-gcloud", "docker/setup-buildx-action"):
        assert index(job, lambda s, u=earlier: s.get("uses", "").startswith(u)) < pulumi_at
    assert install < pulumi_at
    offline = index(job, lambda s: "policy.offline" in s.get("run", ""))
    assert offline < index(job, lambda s: s.get("uses", "").startswith("google-github-actions/auth"))
    return pulumi["with"]


def test_pull_requests_preview_every_stack_with_the_policy_pack() -> None:
    wf = workflow("preview.yml")
    assert "pull_request" in wf["on"]
    job = wf["jobs"]["preview"]
    pulumi = _common_checks(job, "preview")
    assert pulumi["policyPacks"] == "policy"
    assert pulumi["comment-on-pr"] is True and pulumi["comment-on-summary"] is True
    assert job["permissions"]["pull-requests"] == "write"
    assert (
        step(job, "google-github-actions/auth")["with"]["service_account"] == "${{ vars.GCP_PREVIEW_SERVICE_ACCOUNT }}"
    )


def test_main_updates_every_stack_behind_its_environment() -> None:
    wf = workflow("up.yml")
    assert wf["on"] == {"push": {"branches": ["main"]}}
    job = wf["jobs"]["up"]
    pulumi = _common_checks(job, "up")
    assert pulumi["policyPacks"] == "policy"
    assert job["environment"] == "${{ matrix.stack }}"  # prod's required reviewers gate its update
    assert job["concurrency"] == {"group": "pulumi-up-${{ matrix.stack }}", "cancel-in-progress": False}
    assert (
        step(job, "google-github-actions/auth")["with"]["service_account"] == "${{ vars.GCP_DEPLOY_SERVICE_ACCOUNT }}"
    )


@pytest.mark.parametrize("name", ["preview.yml", "up.yml"])
def test_workflows_default_to_read_only_and_pin_actions(name: str) -> None:
    wf = workflow(name)
    assert wf["permissions"] == {"contents": "read"}
    for job in wf["jobs"].values():
        for s in job["steps"]:
            if "uses" in s:
                assert "@" in s["uses"], s["uses"]  # a version, never a moving default branch
            # Expressions are passed through env, never pasted into a shell script.
            assert "${{" not in s.get("run", ""), s["run"]
