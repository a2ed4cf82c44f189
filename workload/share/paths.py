"""The layout of the shared volume, in one place, and the rule for names that become folders on it."""

from __future__ import annotations

import re
from pathlib import Path

# Run and dataset names become folder names on the share: no separators, no dot-dot, no leading dot.
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
NAME_RULE = "1-63 letters, digits, '_', '.', '-', starting with a letter or digit"


def share_paths(share: Path) -> tuple[Path, Path]:
    """(datasets folder, output folder) on the share."""
    return Path(share) / "datasets", Path(share) / "output"


def runs_dir(share: Path) -> Path:
    """Where `seed` records each run's spec (see workload.queue.plan)."""
    return Path(share) / "runs"


def check_name(name: object, what: str) -> str:
    """`name` if it may name a folder on the share; ValueError naming `what`, the value and the rule."""
    if not isinstance(name, str) or not NAME.match(name):
        raise ValueError(f"{what} {name!r} is not allowed: use {NAME_RULE} (it names a folder on the share)")
    return name


# Files in output/<run>/ besides checkpoints/.
REPORT_TXT = "report.txt"
METRICS_JSONL = "metrics.jsonl"
METRICS_PNG = "metrics.png"
PR_CURVE_PNG = "pr_curve.png"

REPORT_HTML = "report.html"  # the same report as one self-contained page (workload.model.report_html)
