"""The two pictures of a run: metrics after each applied shard, and the latest precision-recall curve.

They answer "does the model find fraud, and is it getting better as days are applied?" at a glance,
with the base rate drawn in: a model at the base rate has learnt nothing. Written atomically, as
they are refreshed while other processes (``status``, a browser) may be reading them. Drawn with
the Agg canvas and no pyplot: no display needed, no global figure registry to leak or close.
"""

from __future__ import annotations

import io
import textwrap
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from workload.share.fsutil import atomic_write_bytes
from workload.share.paths import METRICS_PNG, PR_CURVE_PNG

CURVES = (
    ("average_precision", "average precision (AUPRC)"),
    ("roc_auc", "ROC AUC"),
    ("card_precision_top100", "card precision@100 / day"),
    ("recall_at_1pct_fpr", "recall at 1% FPR"),
)


# zlib level 1, not PIL's 6: the two pictures encode in ~36 ms instead of ~81 ms (a tenth of their drawing, on a
# worker's critical path after a run's last day), for files ~5 % larger (~115 kB the pair).
PNG_OPTIONS = {"compress_level": 1}


def _save_atomically(figure: Figure, path: Path) -> Path:
    buf = io.BytesIO()
    FigureCanvasAgg(figure).print_png(buf, pil_kwargs=PNG_OPTIONS)
    atomic_write_bytes(path, buf.getvalue(), durable=False)  # drawn again from the checkpoint if lost
    return path


def day_label(item: dict) -> str:
    """The days a shard held (from its rows' timestamps), else its file name."""
    first, last = item.get("first_day"), item.get("last_day")
    if first:
        return first if not last or last == first else f"{first}..{last}"
    return str(item.get("shard", "?"))


TITLE_WIDTH = 120  # characters of the 8 pt subtitle per line: a 9-inch figure holds about 135


def _title(run: str, hparams: dict | None) -> str:
    """The run and its hyperparameters, wrapped to lines the figure holds (a full set ran off both edges)."""
    if not hparams:
        return f"run {run!r}"
    shown = ", ".join(f"{k}={v}" for k, v in sorted(hparams.items()))
    return textwrap.fill(f"run {run!r}: {shown}", TITLE_WIDTH, break_on_hyphens=False, break_long_words=False)


def _metrics_figure(history: list[dict], run: str, hparams: dict | None) -> Figure:
    figure = Figure(figsize=(9, 5.5), dpi=110, layout="constrained")
    axes = figure.add_subplot()
    x = np.arange(len(history))
    for key, label in CURVES:
        values = [float(item.get(key, np.nan)) for item in history]
        axes.plot(x, values, marker="o", markersize=3, label=label)
    base = [float(item.get("base_rate", np.nan)) for item in history]
    axes.plot(x, base, linestyle="--", color="grey", label="base rate (fraud share): a random guess's AP")
    labels = [day_label(item) for item in history]
    step = max(1, len(labels) // 12)  # keep the labels readable on long runs
    axes.set_xticks(x[::step], labels[::step], rotation=45, ha="right", fontsize=8)
    axes.set_xlabel("model after training on day")
    axes.set_ylabel("on the held-out test days")
    axes.set_ylim(0, 1.02)
    axes.grid(alpha=0.3)
    figure.suptitle("Fraud detection on the test days after each training day", fontsize=11)
    axes.set_title(_title(run, hparams), fontsize=8)
    if not history:
        axes.text(0.5, 0.5, "no training day applied yet", ha="center", va="center", transform=axes.transAxes)
    elif all(float(item.get("n_fraud", 1)) == 0 for item in history):
        axes.text(0.5, 0.5, "the test days hold no fraud: nothing to find, every figure is undefined",
                  ha="center", va="center", transform=axes.transAxes)
    # Below the plot, not on it (a legend inside hid the curves near 1 and the base rate near 0), and outside the
    # axes' box with its tick labels and label: the layout makes room for it (anchored under the axes, it
    # covered the x label when the day labels were long).
    figure.legend(*axes.get_legend_handles_labels(), loc="outside lower center", ncol=3, fontsize=8, frameon=False)
    return figure


def _pr_figure(pr: tuple[np.ndarray, np.ndarray] | None, history: list[dict], run: str) -> Figure:
    figure = Figure(figsize=(6, 6), dpi=110, layout="constrained")
    axes = figure.add_subplot()
    last = history[-1] if history else {}
    base_rate = float(last.get("base_rate", np.nan))
    if pr is not None and len(pr[0]):
        precision, recall = pr
        ap = float(last.get("average_precision", np.nan))
        axes.step(recall, precision, where="post",
                  label=f"model after {day_label(last)}: average precision {ap:.3f}")
    elif history and float(last.get("n_fraud", 1)) == 0:
        axes.text(0.5, 0.5, "the test days hold no fraud:\nno precision-recall curve to draw", ha="center",
                  va="center")
    else:
        axes.text(0.5, 0.5, "no model yet", ha="center", va="center")
    if np.isfinite(base_rate) and base_rate > 0:
        axes.axhline(base_rate, linestyle="--", color="grey", label=f"random guess (base rate {base_rate:.2%})")
    axes.set_xlim(0, 1)
    axes.set_ylim(0, 1.02)
    axes.set_xlabel("recall (share of fraud found)")
    axes.set_ylabel("precision (share of flagged that is fraud)")
    figure.suptitle("Precision-recall on the test days", fontsize=11)
    axes.set_title(f"run {run!r}", fontsize=8)
    axes.grid(alpha=0.3)
    if axes.get_legend_handles_labels()[0]:
        figure.legend(*axes.get_legend_handles_labels(), loc="outside lower center", fontsize=8, frameon=False)
    return figure


def write_plots(run_dir: Path, history: list[dict], pr: tuple[np.ndarray, np.ndarray] | None,
                run: str = "", hparams: dict | None = None) -> list[Path]:
    """Write ``metrics.png`` and ``pr_curve.png`` into ``run_dir``; return their paths."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    run = run or run_dir.name
    return [
        _save_atomically(_metrics_figure(history, run, hparams), run_dir / METRICS_PNG),
        _save_atomically(_pr_figure(pr, history, run), run_dir / PR_CURVE_PNG),
    ]
