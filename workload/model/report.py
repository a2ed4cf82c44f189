"""A run's report, rendered whole from its checkpoint, so it is exact however often workers died.

``report.txt`` keeps the shape of the original tutorial's report (one block per applied shard:
time, training dataset, model checkpoint, accuracy on training and testing data) and adds the
figures that mean something for rare fraud. ``metrics.jsonl`` has one JSON line per shard. What a worker
rewrites after each day costs the same whatever the days before it: the reports show the newest
`REPORT_DAYS` days (the export's show every one), and metrics.jsonl is appended to.

Writes are fenced like checkpoints: ``.report-source.json`` records the (lease token, seq) of the
checkpoint the files were rendered from, and a writer whose source is older than that writes nothing
(a stale worker cannot roll the report back). Only checkpoints that still exist are named as such;
the others say they were pruned.

Every file here (and the pictures) is replaced atomically but not fsynced: it is rendered again from the
checkpoint, which is durable, by the next day's write or by `export`, and two fsyncs a file cost a small
day more than its render (issue 33: per-item overhead).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from workload.model import report_html
from workload.share.fsutil import atomic_write_text
from workload.share.paths import METRICS_JSONL, METRICS_PNG, REPORT_HTML, REPORT_TXT

if TYPE_CHECKING:
    from workload.model.lineage import LineageState  # torch: only the writers (workers) load it


def _fmt(value: Any, digits: int = 4) -> str:
    if isinstance(value, float):
        return "n/a" if math.isnan(value) else f"{value:.{digits}f}"
    return str(value)


SOURCE = ".report-source.json"  # {"token", "seq"} of the checkpoint the report was rendered from


def _checkpoint_line(run_dir: Path, name: str, kept: set[str] | None) -> str:
    path = run_dir / "checkpoints" / name
    if kept is None or name in kept:
        return f"model checkpoint: {path}"
    return f"model checkpoint: {path} (pruned: only the newest checkpoints are kept)"


def lift_phrase(ap: float, base: float) -> str:
    """How average precision compares with a random guess (whose AP is the base rate), in words."""
    if math.isnan(ap) or math.isnan(base) or base <= 0:
        return "no fraud on the test days: undefined"
    lift = ap / base
    if lift < 1:
        return f"worse than guessing ({lift:.1f}x the base rate)"
    return f"{lift:.1f}x better than guessing"


def render(run: str, hparams: dict[str, Any], history: list[dict[str, Any]], run_dir: Path,
           kept: set[str] | None = None, reapplied: list[dict[str, Any]] | None = None,
           newest_days: int | None = None) -> str:
    """The report text; `kept` names the checkpoint files that still exist (None: do not say);
    `reapplied` lists the lineage's rewinds (a day that arrived after later days were applied); `newest_days`:
    a block for only that many newest days (None: every day, as the export's report has)."""
    lines = [f"Training report: run {run!r}", f"hyperparameters: {json.dumps(hparams, sort_keys=True)}",
             f"shards applied: {len(history)}", "", *headline(history)]
    shown = history if newest_days is None else history[-newest_days:] if newest_days else []
    for r in reapplied or []:
        lines.append(f"re-applied at {r['time']}: {', '.join(r['reapplied'])}, because {r['why']}; the run went "
                     f"back to {r['from']} and applied {r['day']} and every later day in date order")
    if reapplied:
        lines.append("")
    if len(shown) < len(history):
        lines += [f"{len(history) - len(shown)} earlier day(s) are not shown here: every day is in {METRICS_JSONL} "
                  "and in the run's export (python -m workload export)", ""]
    for h in shown:
        base = h.get("base_rate", float("nan"))
        ap = h.get("average_precision", float("nan"))
        lines += [
            f"time: {h['time']}",
            f"training dataset: {h['shard']}",
            *([test_window_line(h["test_window"])] if h.get("test_window") else []),
            _checkpoint_line(run_dir, h["checkpoint"], kept),
            f"average precision (AUPRC) on testing data: {_fmt(ap)} (base rate {_fmt(base)}: "
            f"{lift_phrase(ap, base)})",
            f"card precision of the top 100 cards per test day (CP@100): "
            f"{_fmt(h.get('card_precision_top100', float('nan')))}",
            *([calibration_line(h)] if "brier" in h else []),
            f"ROC AUC on testing data: {_fmt(h['roc_auc'])}",
            f"precision of the top 100 transactions per test day: {_fmt(h['precision_top100'])}",
            f"recall at 1% false-positive rate: {_fmt(h['recall_at_1pct_fpr'])}",
            f"accuracy on training data: {_fmt(h['train_accuracy'])}",
            f"accuracy on testing data: {_fmt(h['accuracy'])}",
            "",
        ]
    if history:
        last = history[-1]
        lines.append(
            "Accuracy alone says little here: predicting 'legitimate' for every transaction scores "
            f"{_fmt(1 - last['base_rate'])} on the test days. Average precision of a random guess is the "
            f"base rate ({_fmt(last['base_rate'])}); this model reaches {_fmt(last['average_precision'])}.")
        if "reliability" in last:
            lines += ["", *newest_model_section(last)]
    return "\n".join(lines) + "\n"


def headline(history: list[dict[str, Any]]) -> list[str]:
    """What the newest model does at the fraud rate, before any day's block (accuracy says nothing there)."""
    if not history:
        return []
    h = history[-1]
    ap, base = h.get("average_precision", float("nan")), h.get("base_rate", float("nan"))
    lines = [f"Newest model, on the test days (after {h['shard']}):",
             f"  average precision (AUPRC) {_fmt(ap)}: {lift_phrase(ap, base)} (base rate {_fmt(base)})",
             f"  card precision of the top 100 cards per test day (CP@100) "
             f"{_fmt(h.get('card_precision_top100', float('nan')))}"]
    if "brier" in h:
        lines.append(f"  Brier score {_fmt(h['brier'])}, expected calibration error {_fmt(h['ece'])} (calibrated; "
                     f"{_fmt(h['brier_raw'])} and {_fmt(h['ece_raw'])} before)")
    if "alerts" in h:
        lines.append("  alert thresholds with their precision and recall: at the end of this report")
    return [*lines, ""]


def test_window_line(window: list[str]) -> str:
    """Which test days a day's figures are on (with the daily cycle the window moves every night)."""
    return f"tested on: {len(window)} day(s), {window[0]}" + (f" .. {window[-1]}" if len(window) > 1 else "")


def calibration_line(h: dict[str, Any]) -> str:
    """One day's calibration in one line: on which days, and what it did to Brier score and ECE."""
    days = h.get("calibration_days") or []
    fitted = (f"fitted on {len(days)} day(s) {days[0]}..{days[-1]}" if days else
              "none (no training day's labels were the label delay old before the test days)")
    return (f"calibration: {fitted}; Brier score {_fmt(h['brier_raw'])} -> {_fmt(h['brier'])}, "
            f"expected calibration error {_fmt(h['ece_raw'])} -> {_fmt(h['ece'])}")


def newest_model_section(h: dict[str, Any]) -> list[str]:
    """The newest model's reliability tables (before and after calibration) and alert thresholds."""
    lines = ["Newest model: are its scores probabilities? (test days; reliability per bin of predicted "
             "probability; a calibrated model's predicted and observed rates agree)"]
    for title, key in (("before calibration (the network's own sigmoid)", "reliability_raw"),
                       ("after calibration (what score and export give)", "reliability")):
        lines += [f"  {title}:", f"    {'bin':>13} {'rows':>9} {'frauds':>7} {'predicted':>9} {'observed':>9}"]
        lines += [f"    {r['low']:>6.3f}-{r['high']:<6.3f} {int(r['n']):>9} {int(r['frauds']):>7} "
                  f"{r['predicted']:>9.4f} {r['observed']:>9.4f}" for r in h[key]]
    lines += ["", "Alert thresholds of the newest model (alert when score >= threshold; figures on the test days):",
              *alert_lines(h["alerts"])]
    return lines


def alert_lines(alerts: dict[str, dict[str, float]]) -> list[str]:
    """The two alert rules, one line each (the report and the local summary print them)."""
    cards, fpr = alerts["top100_cards"], alerts["fpr_1pct"]
    return [f"  top 100 cards a day: threshold {_fmt(cards['threshold'], 6)} ({_fmt(cards['alerts_per_day'], 1)} "
            f"cards/day): precision {_fmt(cards['precision'], 3)}, recall {_fmt(cards['recall'], 3)} of fraud cards",
            f"  1% false-positive rate: threshold {_fmt(fpr['threshold'], 6)}: precision {_fmt(fpr['precision'], 3)}, "
            f"recall {_fmt(fpr['recall'], 3)} of fraud transactions"]


def metrics_jsonl(history: list[dict[str, Any]]) -> str:
    """metrics.jsonl: one JSON line per applied shard."""
    return "".join(json.dumps(h, sort_keys=True) + "\n" for h in history)


PICTURES_COST = ".pictures-cost.json"  # {"seconds"}: what drawing the pictures last took, in this run's folder
PICTURES_SHARE = 0.02  # of a run's wall time, at most, spent redrawing its pictures between its first and last day


def plots_stale(run_dir: Path, interval_s: float) -> bool:
    """Whether the pictures are missing, or older than `interval_s` and than 50 times what they last took to draw
    (any worker may have drawn them): on a slow or busy machine, where a small day trains in the time two
    pictures take, they are redrawn less often, so they never cost a run more than PICTURES_SHARE of its time.
    A run's last day redraws them whatever their age (the worker asks for them then)."""
    try:
        age = time.time() - (Path(run_dir) / METRICS_PNG).stat().st_mtime
    except FileNotFoundError:
        return True
    return age >= max(interval_s, pictures_cost(run_dir) / PICTURES_SHARE)


def pictures_cost(run_dir: Path) -> float:
    """Seconds the pictures last took to draw; 0 when unknown."""
    try:
        seconds = float(json.loads((Path(run_dir) / PICTURES_COST).read_text())["seconds"])
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return 0.0
    return seconds if math.isfinite(seconds) and seconds > 0 else 0.0


def rendered_from(run_dir: Path) -> tuple[int, int]:
    """(token, seq) of the checkpoint the current report was rendered from; (0, 0) if unknown."""
    try:
        data = json.loads((Path(run_dir) / SOURCE).read_text())
        return int(data["token"]), int(data["seq"])
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return 0, 0


REPORT_DAYS = 100  # day blocks in the report a worker rewrites after each day; the export's report has every day


def write(run_dir: Path, state: LineageState, pr: tuple[np.ndarray, np.ndarray] | None,
          draw: bool = True, kept: set[str] | None = None, stamp: tuple[int, int] | None = None) -> Path | None:
    """Rewrite report.txt and report.html (their newest `REPORT_DAYS` days) and metrics.jsonl (appended to when it
    holds exactly the days before, else rewritten) from a checkpoint state, and the pictures when `draw`; returns
    the report. So a day's report costs the same on day 2,000 as on day 100. With `stamp` (the source
    checkpoint's token and seq), nothing is written when the report already comes from a newer checkpoint
    (None is returned)."""
    run_dir = Path(run_dir)
    if stamp is not None and rendered_from(run_dir) > tuple(stamp):
        return None
    history = list(state.history)
    report = run_dir / REPORT_TXT
    atomic_write_text(report, render(state.run, state.hparams, history, run_dir, kept, list(state.reapplied),
                                     newest_days=REPORT_DAYS), durable=False)
    written = write_metrics(run_dir, history)
    if history and draw:
        from workload.model import plots  # matplotlib: only writers pay for it

        started = time.monotonic()
        plots.write_plots(run_dir, history, pr, run=state.run, hparams=state.hparams)
        cost = {"seconds": round(time.monotonic() - started, 3)}
        atomic_write_text(run_dir / PICTURES_COST, json.dumps(cost) + "\n", durable=False)
    write_html(run_dir, state)
    if stamp is not None:
        atomic_write_text(run_dir / SOURCE, json.dumps({"token": stamp[0], "seq": stamp[1], **written}) + "\n",
                          durable=False)
    return report


def _last(history: list[dict[str, Any]]) -> Any:
    return history[-1].get("checkpoint") if history else None


def write_metrics(run_dir: Path, history: list[dict[str, Any]]) -> dict[str, Any]:
    """metrics.jsonl for `history`: only the newest line appended when the file is, to the byte and the
    nanosecond, what the last stamped write left (`SOURCE`) for the days before it; else rewritten whole (a
    rewind, a first write, a torn append, anyone else's write). Returns what `SOURCE` records of it."""
    path = Path(run_dir) / METRICS_JSONL
    try:
        before = json.loads((Path(run_dir) / SOURCE).read_text())
        st = path.stat()
        same = (before["metrics"] == [len(history) - 1, st.st_size, st.st_mtime_ns]
                and before["last"] == _last(history[:-1]) and history)
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        same = False
    if same:
        with path.open("ab") as f:
            f.write(metrics_jsonl(history[-1:]).encode())
    else:
        atomic_write_text(path, metrics_jsonl(history), durable=False)
    st = path.stat()
    return {"metrics": [len(history), st.st_size, st.st_mtime_ns], "last": _last(history)}


def write_html(run_dir: Path, state: LineageState) -> Path:
    """report.html: the same history as one self-contained page, with the pictures on the share beside it."""
    page = report_html.render(state.run, state.hparams, list(state.history), report_html.read_pictures(run_dir),
                              list(state.reapplied), newest_days=REPORT_DAYS)
    path = Path(run_dir) / REPORT_HTML
    atomic_write_text(path, page, durable=False)
    return path


def latest_metrics(run_dir: Path) -> dict[str, Any] | None:
    """The last line of metrics.jsonl (what `status` and the local summary print)."""
    try:
        lines = (Path(run_dir) / METRICS_JSONL).read_text().splitlines()
    except FileNotFoundError:
        return None
    return json.loads(lines[-1]) if lines else None


def figures_line(m: dict[str, Any]) -> str:
    """The latest test-day figures in one line (`status` and the local summary print it)."""
    return (f"average precision {m['average_precision']:.3f} vs base rate {m['base_rate']:.4f}; "
            f"card precision@100 {m.get('card_precision_top100', float('nan')):.3f}; ROC AUC {m['roc_auc']:.3f}; "
            f"recall@1%FPR {m['recall_at_1pct_fpr']:.3f}")
