"""docs/architecture.md's folder map names exactly the package folders on disk, so it cannot go stale:
a folder added without a line in the map, or a line left for a folder that moved, fails here."""

from __future__ import annotations

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAPPED = ("workload", "infra", "policy", "bench", "tests")
SKIP_DIRS = {"venv", "__pycache__"}  # policy/venv is the policy pack's own virtualenv


def package_folders(root: Path = ROOT) -> set[str]:
    """Every folder under the mapped roots that holds Python code, as `name/` relative to the root."""
    found = set()
    for top in MAPPED:
        for dirpath, dirnames, filenames in os.walk(root / top):
            dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS and not d.startswith(".")]
            if any(f.endswith(".py") for f in filenames):
                found.add(Path(dirpath).relative_to(root).as_posix() + "/")
    return found


def mapped_folders(text: str) -> list[str]:
    """The folders the map's code block names: the first word of each of its lines."""
    section = re.search(r"^## Folder map\n(.*?)(?=^## )", text, re.S | re.M)
    assert section, "docs/architecture.md has a '## Folder map' section"
    block = re.search(r"^```\n(.*?)^```", section[1], re.S | re.M)
    assert block, "the folder map is a code block"
    return [line.split()[0] for line in block[1].splitlines() if line.strip()]


def test_the_folder_map_names_every_package_folder_and_no_other() -> None:
    named = mapped_folders((ROOT / "docs" / "architecture.md").read_text())
    assert len(named) == len(set(named)), "a folder is named twice"
    on_disk = package_folders()
    assert {"workload/core/", "tests/workload/", "infra/"} <= on_disk  # the walk found the tree
    assert sorted(on_disk - set(named)) == [], "folders missing from the map"
    assert sorted(set(named) - on_disk) == [], "the map names folders that are not there"


def test_the_readme_and_the_cloud_docs_link_the_architecture_page() -> None:
    readme = (ROOT / "README.md").read_text()
    what_this_is = re.search(r"^## What this is\n(.*?)(?=^## )", readme, re.S | re.M)
    assert what_this_is and "(docs/architecture.md)" in what_this_is[1]
    assert "(architecture.md)" in (ROOT / "docs" / "cloud.md").read_text()
