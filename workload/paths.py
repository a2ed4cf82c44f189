"""The layout of the shared volume, in one place."""

from __future__ import annotations

from pathlib import Path


def share_paths(share: Path) -> tuple[Path, Path]:
    """(datasets folder, output folder) on the share."""
    return Path(share) / "datasets", Path(share) / "output"


# Files in output/<run>/ besides checkpoints/.
REPORT_TXT = "report.txt"
METRICS_JSONL = "metrics.jsonl"
METRICS_PNG = "metrics.png"
PR_CURVE_PNG = "pr_curve.png"
