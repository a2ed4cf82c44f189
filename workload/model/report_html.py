"""A run's report as one page a fraud team opens: ``report.html``, self-contained (no server, no network,
no script): its tables are HTML and its pictures are inline ``data:`` URIs.

It says what report.txt says, in the order that matters at a fraud rate of a few per thousand: the newest
model's figures first (average precision against the base rate, card precision of the top 100 cards a day,
Brier score and calibration error), its alert thresholds with the precision and recall they held on the
test days, the pictures (metrics per day, precision-recall, reliability), the figures after every training
day, the reliability tables, and the run's settings. Every value shown comes from the checkpoint's history,
as report.txt's; the PNGs are the ones on the share beside it (drawn by the workers, at most
``PLOT_INTERVAL_SECONDS`` old and redrawn after a run's last day). The reliability picture is drawn here,
as SVG, from the history (no matplotlib: it costs nothing per day).
"""

from __future__ import annotations

import base64
import html
import json
import math
from pathlib import Path
from typing import Any

from workload.share.paths import METRICS_PNG, PR_CURVE_PNG

PICTURES = ((METRICS_PNG, "Fraud detection on the test days after each training day"),
            (PR_CURVE_PNG, "Precision-recall of the newest model on the test days"))

STYLE = """
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1d2430;background:#f6f7f9;margin:0}
main{max-width:1100px;margin:0 auto;padding:24px 20px 48px}
h1{font-size:24px;margin:0 0 4px}h2{font-size:18px;margin:32px 0 8px;border-bottom:1px solid #d8dce3}
.meta{color:#5a6473;margin:0 0 16px}
.cards{display:grid;grid-template-columns:repeat(auto-fit,minmax(180px,1fr));gap:12px}
.card{background:#fff;border:1px solid #d8dce3;border-radius:8px;padding:12px 14px}
.card .v{font-size:26px;font-weight:600}.card .k{font-size:13px;color:#5a6473}
.card .n{font-size:13px;color:#1d2430;overflow-wrap:anywhere}
.wide{overflow-x:auto;background:#fff;border:1px solid #d8dce3;border-radius:8px}
table{border-collapse:collapse;width:100%;font-size:13px;font-variant-numeric:tabular-nums}
th,td{padding:5px 8px;text-align:right;border-bottom:1px solid #eceef2;white-space:nowrap}
th:first-child,td:first-child{text-align:left}th{background:#eef0f4}
td.text{text-align:left;white-space:normal;overflow-wrap:anywhere}
figure{margin:12px 0;background:#fff;border:1px solid #d8dce3;border-radius:8px;padding:8px}
figure img{display:block;max-width:100%;height:auto;margin:0 auto}
figcaption{font-size:13px;color:#5a6473;text-align:center}
.note{color:#5a6473;font-size:13px}
"""


def _num(value: Any, digits: int = 4) -> str:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return "n/a" if math.isnan(value) else f"{value:.{digits}f}"
    return "n/a" if value is None else html.escape(str(value))


def _lift(ap: float, base: float) -> str:
    if math.isnan(ap) or math.isnan(base) or base <= 0:
        return "no fraud on the test days"
    return f"{ap / base:.1f}x the base rate {base:.4f} (a random guess)"


def _day(item: dict[str, Any]) -> str:
    first, last = item.get("first_day"), item.get("last_day")
    if first:
        return first if not last or last == first else f"{first}..{last}"
    return str(item.get("shard", "?"))


def _table(head: list[str], rows: list[list[str]], caption: str = "") -> str:
    """A table in a scrolling box (a long one never widens the page); cells are already escaped."""
    cap = f"<caption class='note'>{caption}</caption>" if caption else ""
    header = "".join(f"<th>{h}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<div class='wide'><table>{cap}<thead><tr>{header}</tr></thead><tbody>{body}</tbody></table></div>"


def _card(key: str, value: str, note: str = "") -> str:
    return f"<div class='card'><div class='k'>{key}</div><div class='v'>{value}</div><div class='n'>{note}</div></div>"


def lead(h: dict[str, Any]) -> str:
    """The newest model's figures that mean something at the fraud rate."""
    nan = float("nan")
    ap, base = h.get("average_precision", nan), h.get("base_rate", nan)
    cards = [_card("average precision (AUPRC)", _num(ap, 3), _lift(ap, base)),
             _card("card precision@100 a day", _num(h.get("card_precision_top100", nan), 3),
                   "share of the 100 most suspicious cards a day that were fraud")]
    if "brier" in h:
        cards += [_card("Brier score", _num(h["brier"]), f"before calibration {_num(h['brier_raw'])}"),
                  _card("calibration error (ECE)", _num(h["ece"]), f"before calibration {_num(h['ece_raw'])}")]
    cards += [_card("ROC AUC", _num(h.get("roc_auc", nan), 3)),
              _card("recall at 1% false positives", _num(h.get("recall_at_1pct_fpr", nan), 3))]
    return f"<div class='cards'>{''.join(cards)}</div>"


def alerts_table(alerts: dict[str, dict[str, float]]) -> str:
    cards, fpr = alerts["top100_cards"], alerts["fpr_1pct"]
    rows = [["top 100 cards a day", _num(cards["threshold"], 6), f"{_num(cards['alerts_per_day'], 1)} cards/day",
             _num(cards["precision"], 3), f"{_num(cards['recall'], 3)} of fraud cards"],
            ["1% false-positive rate", _num(fpr["threshold"], 6), f"{_num(fpr.get('false_positive_rate'), 4)} FPR",
             _num(fpr["precision"], 3), f"{_num(fpr['recall'], 3)} of fraud transactions"]]
    return _table(["rule", "alert when score &ge;", "volume", "expected precision", "expected recall"], rows)


DAY_COLUMNS = (("average_precision", "AP", 3), ("base_rate", "base rate", 4), ("card_precision_top100", "CP@100", 3),
               ("brier", "Brier", 4), ("ece", "ECE", 4), ("roc_auc", "ROC AUC", 3),
               ("recall_at_1pct_fpr", "recall@1%FPR", 3))


def days_table(history: list[dict[str, Any]]) -> str:
    """The figures on the test days after each training day, newest first."""
    rows = [[html.escape(_day(h)), *(_num(h.get(key, float("nan")), d) for key, _, d in DAY_COLUMNS),
             _num(h.get("train_rows", float("nan")), 0), _num(h.get("accuracy", float("nan")), 4)]
            for h in reversed(history)]
    head = ["model after day", *(label for _, label, _ in DAY_COLUMNS), "training rows", "accuracy"]
    return _table(head, rows, "newest first; accuracy only for continuity with the tutorial: predicting "
                              "'legitimate' for every transaction scores 1 &minus; base rate")


def reliability_tables(h: dict[str, Any]) -> str:
    parts = []
    for title, key in (("before calibration (the network's own sigmoid)", "reliability_raw"),
                       ("after calibration (what score and export give)", "reliability")):
        rows = [[f"{r['low']:.3f}&ndash;{r['high']:.3f}", f"{int(r['n']):,}", f"{int(r['frauds']):,}",
                 _num(r["predicted"]), _num(r["observed"])] for r in h.get(key, [])]
        parts.append(f"<h3>{title}</h3>" + _table(["bin of predicted probability", "rows", "frauds", "predicted",
                                                    "observed"], rows))
    return "".join(parts)


def reliability_svg(h: dict[str, Any], width: int = 560, height: int = 420) -> str:
    """Predicted against observed fraud rate per bin, log-log, before and after calibration, with the
    diagonal a calibrated model lies on; a bin without fraud is drawn on the bottom edge."""
    floor = 1e-5
    pad_l, pad_b, pad_t, pad_r = 64, 52, 34, 16

    def pos(p: float, o: float) -> tuple[float, float]:
        lx = (math.log10(max(p, floor)) + 5) / 5
        ly = (math.log10(max(o, floor)) + 5) / 5
        return pad_l + lx * (width - pad_l - pad_r), height - pad_b - ly * (height - pad_b - pad_t)

    out = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' viewBox='0 0 {width} {height}' "
           "font-family='sans-serif' font-size='12'><rect width='100%' height='100%' fill='white'/>"]
    for k in range(6):
        x, y = pos(10.0 ** (k - 5), 10.0 ** (k - 5))
        tick = "1" if k == 5 else f"1e-{5 - k}"
        out.append(f"<line x1='{x:.1f}' y1='{pad_t}' x2='{x:.1f}' y2='{height - pad_b}' stroke='#e3e6eb'/>"
                   f"<line x1='{pad_l}' y1='{y:.1f}' x2='{width - pad_r}' y2='{y:.1f}' stroke='#e3e6eb'/>"
                   f"<text x='{x:.1f}' y='{height - pad_b + 16}' text-anchor='middle'>{tick}</text>"
                   f"<text x='{pad_l - 6}' y='{y + 4:.1f}' text-anchor='end'>{tick}</text>")
    (x0, y0), (x1, y1) = pos(floor, floor), pos(1, 1)
    out.append(f"<line x1='{x0}' y1='{y0}' x2='{x1}' y2='{y1}' stroke='grey' stroke-dasharray='5,4'/>")
    for key, colour in (("reliability_raw", "#d9822b"), ("reliability", "#1f6fb4")):
        points = [(*pos(r["predicted"], r["observed"]), max(3.0, min(12.0, math.log10(1 + r["n"]) * 2)))
                  for r in h.get(key, []) if r["n"] > 0]
        line = " ".join(f"{x:.1f},{y:.1f}" for x, y, _ in points)
        out.append(f"<polyline points='{line}' fill='none' stroke='{colour}'/>")
        out += [f"<circle cx='{x:.1f}' cy='{y:.1f}' r='{r:.1f}' fill='{colour}' fill-opacity='0.7'/>"
                for x, y, r in points]
    out.append(f"<text x='{width / 2}' y='18' text-anchor='middle' font-size='14'>Reliability on the test days</text>"
               f"<text x='{width / 2}' y='{height - 12}' text-anchor='middle'>predicted fraud probability (bin mean)"
               f"</text><text transform='translate(16,{height / 2}) rotate(-90)' text-anchor='middle'>observed fraud "
               f"rate</text><text x='{pad_l + 10}' y='{pad_t + 16}' fill='#d9822b'>&#9679; before calibration</text>"
               f"<text x='{pad_l + 10}' y='{pad_t + 32}' fill='#1f6fb4'>&#9679; after calibration</text>"
               f"<text x='{pad_l + 10}' y='{pad_t + 48}' fill='grey'>- - calibrated: observed = predicted</text></svg>")
    return "".join(out)


def data_uri(kind: str, data: bytes) -> str:
    return f"data:{kind};base64,{base64.b64encode(data).decode()}"


def figures(pictures: dict[str, bytes], newest: dict[str, Any] | None) -> str:
    parts = [f"<figure><img src='{data_uri('image/png', pictures[name])}' alt='{caption}'>"
             f"<figcaption>{caption}</figcaption></figure>" for name, caption in PICTURES if name in pictures]
    if newest and newest.get("reliability"):
        caption = "Reliability of the newest model: predicted and observed fraud rate per bin"
        parts.append(f"<figure><img src='{data_uri('image/svg+xml', reliability_svg(newest).encode())}' "
                     f"alt='{caption}'><figcaption>{caption}</figcaption></figure>")
    return "".join(parts) or "<p class='note'>no picture yet: the workers draw them after a run's days</p>"


def settings(run: str, hparams: dict[str, Any], newest: dict[str, Any] | None,
             reapplied: list[dict[str, Any]]) -> str:
    rows = [["run", html.escape(run)]]
    rows += [[html.escape(str(k)), html.escape(json.dumps(v))] for k, v in sorted(hparams.items())]
    if newest and "calibration_days" in newest:
        days = newest["calibration_days"]
        rows.append(["calibration fitted on", html.escape(f"{len(days)} day(s) {days[0]}..{days[-1]}")
                     if days else "none (no training day was the label delay old)"])
    rows += [[f"re-applied at {html.escape(str(r['time']))}",
              html.escape(f"{', '.join(r['reapplied'])}, because {r['why']}")] for r in reapplied]
    body = "".join(f"<tr><th>{k}</th><td class='text'>{v}</td></tr>" for k, v in rows)
    return f"<div class='wide'><table><tbody>{body}</tbody></table></div>"


def render(run: str, hparams: dict[str, Any], history: list[dict[str, Any]], pictures: dict[str, bytes],
           reapplied: list[dict[str, Any]] | None = None, newest_days: int | None = None) -> str:
    """The whole page; `pictures` maps METRICS_PNG / PR_CURVE_PNG to their bytes (those missing are left out);
    `newest_days`: the days table's rows for only that many newest days (None: every day)."""
    newest = history[-1] if history else None
    title = f"Fraud model report: run {html.escape(run)}"
    parts = [f"<!doctype html><html lang='en'><head><meta charset='utf-8'>"
             f"<meta name='viewport' content='width=device-width,initial-scale=1'><title>{title}</title>"
             f"<style>{STYLE}</style></head><body><main><h1>{title}</h1>"]
    if newest is None:
        parts.append("<p class='meta'>no training day applied yet</p>")
    else:
        parts += [f"<p class='meta'>{len(history)} training day(s) applied, the newest {html.escape(_day(newest))} "
                  f"(at {html.escape(str(newest.get('time', '?')))}); every figure is on the held-out test days</p>",
                  "<h2 id='newest'>The newest model</h2>", lead(newest)]
        if "alerts" in newest:
            parts += ["<h2 id='alerts'>Alert thresholds</h2>", alerts_table(newest["alerts"])]
    parts += ["<h2 id='pictures'>Pictures</h2>", figures(pictures, newest)]
    if history:
        shown = history if newest_days is None else history[-newest_days:]
        parts += ["<h2 id='days'>After each training day</h2>", days_table(shown)]
        if len(shown) < len(history):
            parts.append(f"<p class='meta'>{len(history) - len(shown)} earlier day(s) are not shown here: every "
                         "day is in metrics.jsonl and in the run's export</p>")
    if newest and newest.get("reliability"):
        parts += ["<h2 id='calibration'>Are the scores probabilities?</h2>", reliability_tables(newest)]
    parts += ["<h2 id='settings'>Settings</h2>", settings(run, hparams, newest, reapplied or []),
              "</main></body></html>"]
    return "".join(parts) + "\n"


def read_pictures(run_dir: Path) -> dict[str, bytes]:
    """The run's PNGs as they are on the share (those not drawn yet are missing)."""
    found = {}
    for name, _ in PICTURES:
        try:
            found[name] = (Path(run_dir) / name).read_bytes()
        except FileNotFoundError:
            pass
    return found
