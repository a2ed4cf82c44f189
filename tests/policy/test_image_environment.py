"""The training image's environment, read from its definition (workload/Dockerfile): CUDA in a GPU pod on GKE
finds the driver only where GKE's device plugin mounts it, /usr/local/nvidia (see the Dockerfile's comment
for the evidence), and only through the loader path, since the plugin injects no environment variable.

No Docker daemon runs on the development machines, so the image is not built here: the ENV instructions are
parsed as Docker applies them (later ones override, ``${VAR}`` expands from what is set before), over the
base image's PATH.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from infra import render

DOCKERFILE = render.REPO_ROOT / "workload" / "Dockerfile"
# What GKE mounts (container-engine-accelerators: NVIDIA_INSTALL_DIR_CONTAINER) and GKE's GPU docs name.
DRIVER_LIBS = "/usr/local/nvidia/lib64"
DRIVER_TOOLS = "/usr/local/nvidia/bin"
# python:3.11-slim-bookworm's own PATH (`docker buildx imagetools inspect --format '{{json .Image}}'`).
BASE_ENV = {"PATH": "/usr/local/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}


def _instructions(text: str) -> list[str]:
    """Instructions with their continuation lines joined and comments dropped."""
    lines, current = [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        current += line[:-1] + " " if line.endswith("\\") else line
        if not line.endswith("\\"):
            lines.append(current)
            current = ""
    return lines


def _expand(value: str, env: dict[str, str]) -> str:
    for name, have in env.items():
        value = value.replace("${" + name + "}", have).replace("$" + name, have)
    return value


def image_env(text: str, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of the image a Dockerfile builds (ENV key=value forms, as this one writes them).
    Within one ENV instruction every ``$VAR`` expands from the environment before it, as Docker does."""
    env = dict(BASE_ENV if base is None else base)
    for line in _instructions(text):
        keyword, _, rest = line.partition(" ")
        if keyword.upper() != "ENV":
            continue
        before = dict(env)
        for pair in shlex.split(rest):
            name, sep, value = pair.partition("=")
            assert sep, f"ENV {pair!r}: write ENV key=value"
            env[name] = _expand(value, before)
    return env


def test_cuda_finds_the_driver_gke_mounts_and_the_tools_are_on_the_path() -> None:
    env = image_env(DOCKERFILE.read_text())
    assert DRIVER_LIBS in env["LD_LIBRARY_PATH"].split(":")
    path = env["PATH"].split(":")
    assert DRIVER_TOOLS in path and "/usr/local/bin" in path  # python itself stays found
    # No variable that steers an NVIDIA container runtime: GKE does not use one, and where one ran,
    # NVIDIA_VISIBLE_DEVICES=all would give the pod every GPU of the node.
    assert not [k for k in env if k.startswith("NVIDIA_")]


@pytest.mark.parametrize(
    "text, problem",
    [
        ("FROM x\nENV PYTHONUNBUFFERED=1\n", "no LD_LIBRARY_PATH at all (the image before issue 36)"),
        ("FROM x\nENV LD_LIBRARY_PATH=/usr/local/nvidia/lib \\\n    PATH=/usr/local/nvidia/bin:${PATH}\n",
         "lib, not lib64"),
        ("FROM x\nENV LD_LIBRARY_PATH=/usr/local/nvidia/lib64\nENV LD_LIBRARY_PATH=/opt\n", "overridden later"),
        ("FROM x\n# ENV LD_LIBRARY_PATH=/usr/local/nvidia/lib64\n", "only in a comment"),
    ],
)
def test_an_image_without_the_driver_path_is_caught(text: str, problem: str) -> None:
    assert DRIVER_LIBS not in image_env(text).get("LD_LIBRARY_PATH", "").split(":"), problem


def test_a_path_that_forgets_the_base_one_is_caught() -> None:
    env = image_env("FROM x\nENV PATH=/usr/local/nvidia/bin\n")
    assert "/usr/local/bin" not in env["PATH"].split(":")


def test_the_parser_reads_this_dockerfile_as_docker_would(tmp_path: Path) -> None:
    """Continuations, several pairs in one ENV, and ${VAR} from an earlier instruction."""
    text = "FROM x\nENV A=1 \\\n    B=two\nENV C=${A}:$B\n"
    assert image_env(text, base={}) == {"A": "1", "B": "two", "C": "1:two"}


LOCK = render.REPO_ROOT / "workload" / "requirements.lock"


def _pins(text: str) -> dict[str, tuple[str, list[str]]]:
    """name (normalised) -> (version, sha256 hashes) of a requirements file, continuation lines joined."""
    joined = text.replace("\\\n", " ")
    pins = {}
    for line in joined.splitlines():
        line = line.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        spec, *options = line.split()
        name, _, version = spec.partition("==")
        hashes = [o.removeprefix("--hash=sha256:") for o in options if o.startswith("--hash=sha256:")]
        pins[name.lower().replace("_", "-")] = (version, hashes)
    return pins


def test_the_images_pypi_packages_are_hash_locked_and_agree_with_requirements_txt() -> None:
    wanted = _pins((render.REPO_ROOT / "workload" / "requirements.txt").read_text())
    locked = _pins(LOCK.read_text())
    assert all(len(h) == 1 and len(h[0]) == 64 for _, h in locked.values())  # every entry, one sha256
    for name, (version, _) in wanted.items():
        if name != "torch":  # from the PyTorch index, in its own step
            assert locked[name][0] == version, name
    assert "torch" not in locked
    dockerfile = " ".join(_instructions(DOCKERFILE.read_text()))
    assert "pip install --no-cache-dir --require-hashes --no-deps -r /app/requirements.lock" in dockerfile
    assert "-r /app/requirements.txt" not in dockerfile  # no unhashed install of the rest


def test_a_lock_entry_without_a_hash_is_caught() -> None:
    (version, hashes), = _pins("redis==8.1.0\n").values()
    assert version == "8.1.0" and hashes == []


TORCH_INDEX = "https://download.pytorch.org/whl/"


def unhashed_installs(text: str) -> list[str]:
    """Each ``pip install`` of the Dockerfile's RUN instructions that is not hash-checked (``--require-hashes``),
    except the one the lock cannot cover yet: torch alone, by version, from the PyTorch index
    (download.pytorch.org was not reachable where the lock was written; docs/security.md, supply chain)."""
    found = []
    for line in _instructions(text):
        keyword, _, rest = line.partition(" ")
        if keyword.upper() != "RUN":
            continue
        for command in rest.replace(";", "&&").split("&&"):
            words = shlex.split(command)
            if words[:2] != ["pip", "install"] or "--require-hashes" in words:
                continue
            packages = [w for i, w in enumerate(words[2:], 2) if not w.startswith("-")
                        and not words[i - 1].startswith("--index-url")]  # fmt: skip
            torch_only = len(packages) == 1 and packages[0].startswith("torch==")
            from_index = any(w.startswith(TORCH_INDEX) or w.startswith(f'"{TORCH_INDEX}') for w in words)
            if not (torch_only and from_index):
                found.append(" ".join(words))
    return found


def test_every_pip_install_of_the_image_checks_hashes_but_torchs() -> None:
    assert unhashed_installs(DOCKERFILE.read_text()) == []
    torch = 'RUN pip install --index-url "https://download.pytorch.org/whl/${TORCH_CUDA}" "torch==2.13.0"\n'
    assert unhashed_installs(torch) == []
    assert unhashed_installs("RUN pip install --no-cache-dir -r /app/requirements.txt\n") != []
    assert unhashed_installs(torch.replace('"torch==2.13.0"', '"torch==2.13.0" numpy')) != []  # rides along
    assert unhashed_installs('RUN pip install "torch==2.13.0"\n') != []  # torch from PyPI, by version only
    assert unhashed_installs("RUN true && pip install requests\n") == ["pip install requests"]
