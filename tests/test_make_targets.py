"""The Makefile's targets as a user meets them, dry-run (`make -n`: nothing installed, nothing run)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no make on PATH")


def dry_run(*argv: str, path: str | None = None) -> subprocess.CompletedProcess[str]:
    # Under `make test` this runs inside make: its MAKEFLAGS/MAKELEVEL would make the inner make print
    # "Entering directory" lines; a user's shell has neither.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    env |= {"PATH": path} if path is not None else {}
    return subprocess.run([shutil.which("make") or "make", "-n", *argv], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)


def test_render_diff_and_preview_use_the_programs_own_virtualenv_never_dot_venv() -> None:
    """`make render` installed pulumi-policy into .venv, whose protobuf it downgraded (pip printed an ERROR)."""
    venv = yaml.safe_load((ROOT / "Pulumi.yaml").read_text())["runtime"]["options"]["virtualenv"]
    assert venv == "build/infra-venv"
    for target in ("render", "diff"):
        out = dry_run(target, "STACK=dev")
        assert out.returncode == 0, out.stderr
        assert f"{venv}/bin/python -m pip install" in out.stdout and f"{venv}/bin/python -m " in out.stdout
        assert ".venv/" not in out.stdout.replace(f"{venv}/", ""), out.stdout


def test_preview_without_the_pulumi_cli_says_what_to_install_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "sh").symlink_to(shutil.which("sh"))  # a PATH with a shell and no pulumi
    out = dry_run("preview", "STACK=dev", path=str(tmp_path))
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and "needs the Pulumi CLI" in out.stderr, out.stderr
    assert "https://get.pulumi.com" in out.stderr and "Error 127" not in out.stderr


def test_make_test_installs_chromium_under_ci_only() -> None:
    assert "apt-get install" in dry_run("test", "CI=true").stdout
    assert "apt-get install" not in dry_run("test", "CI=false").stdout
