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
from matplotlib import rcParams
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.legend import Legend
from matplotlib.text import Text
from matplotlib.transforms import Bbox

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


PAD_PT = 4.0  # around the picture's edge and between its blocks (constrained layout's pads were 3 pt)


def _shown(labels: list[Text], limits: tuple[float, float], along: int) -> list[Text]:
    """The tick labels drawn: those of ticks inside the axes' limits (the locator also places one beyond them)."""
    lo, hi = sorted(limits)
    return [t for t in labels if t.get_text() and lo <= t.get_position()[along] <= hi]


def _fit(figure: Figure, axes: Axes, title: Text, legend: Legend | None) -> None:
    """Place `axes` so that its tick labels, axis labels and subtitle, the figure's `title` above and its `legend`
    below (if any) lie inside the picture and clear of each other, from those texts' own sizes: what constrained
    layout did for these two designs, but measuring each text once where it measured every text of the axes twice,
    round after round. A pair draws and encodes in ~0.20-0.24 s instead of ~0.27-0.32 s (matplotlib 3.10.9, medians
    of interleaved draws on the 2-core CI machine), on a worker's critical path after a run's last day (issue 33).
    The texts are measured with the canvas the picture is saved with, which keeps their sizes for the drawing. Texts
    too large for the picture (day labels of very long file names) never shrink the axes below `MIN_AXES` of it:
    they are cut at its edge, and the report is written all the same."""
    renderer = FigureCanvasAgg(figure).get_renderer()
    width, height, pt = figure.bbox.width, figure.bbox.height, figure.dpi / 72
    pad = PAD_PT * pt

    def size(text: Text | Legend) -> Bbox:
        return text.get_window_extent(renderer)

    xticks = _shown(axes.get_xticklabels(), axes.get_xlim(), 0)
    yticks = _shown(axes.get_yticklabels(), axes.get_ylim(), 1)
    tick_x = (rcParams["xtick.major.size"] + rcParams["xtick.major.pad"] + rcParams["axes.labelpad"]) * pt
    tick_y = (rcParams["ytick.major.size"] + rcParams["ytick.major.pad"] + rcParams["axes.labelpad"]) * pt
    bottom = pad + max((size(t).height for t in xticks), default=0.0) + tick_x + size(axes.xaxis.label).height
    if legend is not None:
        legend.set_bbox_to_anchor((0.5, pad / height), transform=figure.transFigure)
        bottom += size(legend).height + pad
    left = pad + size(axes.yaxis.label).width + max((size(t).width for t in yticks), default=0.0) + tick_y
    top = pad + size(title).height + pad + size(axes.title).height + rcParams["axes.titlepad"] * pt
    right = pad
    title.set_y(1 - pad / height)
    _place(figure, left / width, right / width, bottom / height, top / height)
    # What reaches past the axes' sides: the first days' labels rotated leftwards, the last tick label's half, a wide
    # subtitle centred over the axes. A margin grown by the shortfall moves such a text by all of it but its share of
    # the axes' width (its place along them: ~0.05 for the first day's label), so a few rounds close it.
    for _ in range(8):
        boxes = [size(t) for t in (*xticks, axes.title) if t.get_text()]
        short_left = pad - min((b.x0 for b in boxes), default=pad)
        short_right = max((b.x1 for b in boxes), default=0.0) - (width - pad)
        if short_left <= 0.5 and short_right <= 0.5:  # half a pixel
            break
        left, right = left + max(0.0, short_left), right + max(0.0, short_right)
        if not _place(figure, left / width, right / width, bottom / height, top / height):
            break  # the axes are as small as they may be


MIN_AXES = 0.25  # of the picture's width and of its height: the least the axes keep, whatever their texts need


def _place(figure: Figure, left: float, right: float, bottom: float, top: float) -> bool:
    """The axes inside these margins (fractions of the picture), or as near as `MIN_AXES` allows (the margins cut
    in proportion); False when it had to cut them."""
    fits = True
    for near, far in ((0, 1), (2, 3)):
        margins = [left, right, bottom, top]
        room = 1 - MIN_AXES
        if margins[near] + margins[far] > room:
            scale = room / (margins[near] + margins[far])
            margins[near], margins[far] = margins[near] * scale, margins[far] * scale
            fits = False
        left, right, bottom, top = margins
    figure.subplots_adjust(left=left, right=1 - right, bottom=bottom, top=1 - top)
    return fits


def _save_atomically(figure: Figure, path: Path) -> Path:
    buf = io.BytesIO()
    canvas = figure.canvas if isinstance(figure.canvas, FigureCanvasAgg) else FigureCanvasAgg(figure)
    canvas.print_png(buf, pil_kwargs=PNG_OPTIONS)  # `_fit`'s canvas: its renderer has the texts' sizes cached
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
    figure = Figure(figsize=(9, 5.5), dpi=110)
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
    title = figure.suptitle("Fraud detection on the test days after each training day", fontsize=11)
    axes.set_title(_title(run, hparams), fontsize=8)
    if not history:
        axes.text(0.5, 0.5, "no training day applied yet", ha="center", va="center", transform=axes.transAxes)
    elif all(float(item.get("n_fraud", 1)) == 0 for item in history):
        axes.text(0.5, 0.5, "the test days hold no fraud: nothing to find, every figure is undefined",
                  ha="center", va="center", transform=axes.transAxes)
    # Below the plot, not on it (a legend inside hid the curves near 1 and the base rate near 0), and outside the
    # axes' box with its tick labels and label: `_fit` makes room for it (anchored under the axes, it
    # covered the x label when the day labels were long).
    legend = figure.legend(*axes.get_legend_handles_labels(), loc="lower center", ncol=3, fontsize=8,
                           frameon=False, borderaxespad=0)
    _fit(figure, axes, title, legend)
    return figure


def _pr_figure(pr: tuple[np.ndarray, np.ndarray] | None, history: list[dict], run: str) -> Figure:
    figure = Figure(figsize=(6, 6), dpi=110)
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
    title = figure.suptitle("Precision-recall on the test days", fontsize=11)
    axes.set_title(f"run {run!r}", fontsize=8)
    axes.grid(alpha=0.3)
    legend = (figure.legend(*axes.get_legend_handles_labels(), loc="lower center", fontsize=8, frameon=False,
                            borderaxespad=0) if axes.get_legend_handles_labels()[0] else None)
    _fit(figure, axes, title, legend)
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
