"""The two pictures of a run: metrics after each applied shard, and the latest precision-recall curve.

They answer "does the model find fraud, and is it getting better as days are applied?" at a glance,
with the base rate drawn in: a model at the base rate has learnt nothing. Written atomically, as
they are refreshed while other processes (``status``, a browser) may be reading them. Drawn with
the Agg canvas and no pyplot: no display needed, no global figure registry to leak or close.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from workload.fsutil import atomic_write_bytes
from workload.paths import METRICS_PNG, PR_CURVE_PNG

CURVES = (
    ("average_precision", "average precision (AUPRC)"),
    ("roc_auc", "ROC AUC"),
    ("precision_top100", "precision of top 100 / day"),
    ("recall_at_1pct_fpr", "recall at 1% FPR"),
)


def _save_atomically(figure: Figure, path: Path) -> Path:
    buf = io.BytesIO()
    FigureCanvasAgg(figure).print_png(buf)
    atomic_write_bytes(path, buf.getvalue())
    return path


def _metrics_figure(history: list[dict]) -> Figure:
    figure = Figure(figsize=(8, 4.5), dpi=110, layout="constrained")
    axes = figure.add_subplot()
    x = np.arange(len(history))
    for key, label in CURVES:
        values = [float(item.get(key, np.nan)) for item in history]
        axes.plot(x, values, marker="o", markersize=3, label=label)
    base = [float(item.get("base_rate", np.nan)) for item in history]
    axes.plot(x, base, linestyle="--", color="grey", label="base rate (fraud share)")
    shards = [str(item.get("shard", i)) for i, item in enumerate(history)]
    step = max(1, len(shards) // 12)  # keep the labels readable on long runs
    axes.set_xticks(x[::step], shards[::step], rotation=45, ha="right", fontsize=8)
    axes.set_xlabel("training shard applied (day)")
    axes.set_ylabel("on the held-out test days")
    axes.set_ylim(0, 1.02)
    axes.grid(alpha=0.3)
    axes.legend(loc="lower right", fontsize=8)
    axes.set_title("Fraud detection on the test days after each shard")
    if not history:
        axes.text(0.5, 0.5, "no shard applied yet", ha="center", va="center", transform=axes.transAxes)
    return figure


def _pr_figure(pr: tuple[np.ndarray, np.ndarray] | None, base_rate: float) -> Figure:
    figure = Figure(figsize=(5.5, 5), dpi=110, layout="constrained")
    axes = figure.add_subplot()
    if pr is not None and len(pr[0]):
        precision, recall = pr
        axes.step(recall, precision, where="post", label="latest model")
    else:
        axes.text(0.5, 0.5, "no curve yet (no model, or no fraud)", ha="center", va="center")
    if np.isfinite(base_rate):
        axes.axhline(base_rate, linestyle="--", color="grey", label=f"base rate {base_rate:.2%}")
    axes.set_xlim(0, 1)
    axes.set_ylim(0, 1.02)
    axes.set_xlabel("recall (share of fraud found)")
    axes.set_ylabel("precision (share of flagged that is fraud)")
    axes.set_title("Precision-recall on the test days")
    axes.grid(alpha=0.3)
    if axes.get_legend_handles_labels()[0]:
        axes.legend(loc="upper right", fontsize=8)
    return figure


def write_plots(
    run_dir: Path, history: list[dict], pr: tuple[np.ndarray, np.ndarray] | None
) -> list[Path]:
    """Write ``metrics.png`` and ``pr_curve.png`` into ``run_dir``; return their paths."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    base_rate = float(history[-1].get("base_rate", np.nan)) if history else float("nan")
    return [
        _save_atomically(_metrics_figure(history), run_dir / METRICS_PNG),
        _save_atomically(_pr_figure(pr, base_rate), run_dir / PR_CURVE_PNG),
    ]
