"""report.html as a fraud team sees it: opened from the file in a real headless Chromium (no server, no
network), at a desktop and a phone width: its figures' text is there, nothing spills out of the page, every
picture loaded. Without Chromium the browser test skips outside CI and fails under CI=true."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from browser import Browser, needs_chromium

from workload.model import metrics, report, report_html

DAYS = 30


def _entry(i: int) -> dict[str, Any]:
    """Day i of a realistic run: figures that climb, and the newest model's calibration and alerts."""
    rng = np.random.default_rng(i)
    ap = 0.2 + 0.5 * (1 - math.exp(-i / 6)) + rng.uniform(-0.02, 0.02)
    bins = [(0.0, 0.001, 33280, 10, 0.0002, 0.0003), (0.001, 0.003, 163, 1, 0.0017, 0.0061),
            (0.003, 0.01, 70, 1, 0.0049, 0.0143), (0.1, 0.3, 80, 15, 0.19, 0.1875), (0.5, 1.0, 700, 650, 0.92, 0.9286)]
    reliability = [{"low": lo, "high": hi, "n": float(n), "frauds": float(f), "predicted": p, "observed": o}
                   for lo, hi, n, f, p, o in bins]
    return {"shard": f"training/2018-04-{i + 1:02d}.parquet", "first_day": f"2018-04-{i + 1:02d}",
            "last_day": f"2018-04-{i + 1:02d}", "time": f"2026-11-27 20:{i:02d}:00 UTC",
            "checkpoint": f"ckpt-{i + 1:08d}-t1.pt", "train_accuracy": 0.99, "accuracy": 0.9876,
            "average_precision": ap, "base_rate": 0.0295, "roc_auc": 0.85 + i / 1000, "card_precision_top100": ap + 0.1,
            "precision_top100": ap, "recall_at_1pct_fpr": ap - 0.05, "n": 33514.0, "n_fraud": 990.0,
            "train_rows": 4891 + i, "brier_raw": 0.0125, "brier": 0.0105, "ece_raw": 0.031, "ece": 0.0036,
            "calibration_days": ["2018-03-25", "2018-03-31"], "reliability_raw": reliability,
            "reliability": reliability,
            "alerts": {"top100_cards": {"threshold": 0.169060, "alerts_per_day": 100.0, "precision": 0.844,
                                        "recall": 0.700},
                       "fpr_1pct": {"threshold": 0.060617, "false_positive_rate": 0.0099, "precision": 0.680,
                                    "recall": 0.699}}}


STATE = {"run": "main", "history": [_entry(i) for i in range(DAYS)],
         "hparams": {"batch_size": 128, "epochs": 4, "hidden": [256, 256, 128], "lr": 0.002, "seed": 1,
                     "weight_decay": 0.0001, "label_delay_days": 7},
         "reapplied": [{"day": "2018-04-03", "reapplied": ["2018-04-04", "2018-04-05"], "from": "ckpt-00000002-t1.pt",
                        "why": "2018-04-03 arrived after 2018-04-05 was applied (a backfill or a requeued day)",
                        "time": "2026-11-27 20:10:00 UTC"}]}


@pytest.fixture(scope="module")
def page_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("run")
    scores = np.random.default_rng(0).random(400)
    labels = (scores + np.random.default_rng(1).normal(0, 0.3, 400) > 0.9).astype(int)
    report.write(run_dir, SimpleNamespace(**STATE), metrics.pr_curve(scores, labels))
    return run_dir / "report.html"


def test_the_page_holds_every_figure_and_needs_nothing_from_outside(page_file: Path) -> None:
    page = page_file.read_text()
    assert not re.search(r"(?:src|href)\s*=\s*['\"](?!data:)", page), "everything inline"
    assert "<script" not in page and "<link" not in page
    assert page.count("src='data:image/png;base64,") == 2 and page.count("src='data:image/svg+xml;base64,") == 1


# What a person must read on the page, as the newest day's figures are formatted there.
SEEN = ("Fraud model report: run main", "30 training day(s) applied, the newest 2018-04-30", "The newest model",
        "average precision (AUPRC)", "card precision@100 a day", "Brier score", "0.0105", "before calibration 0.0125",
        "calibration error (ECE)", "0.0036", "Alert thresholds", "top 100 cards a day", "0.169060", "0.844",
        "0.700 of fraud cards", "1% false-positive rate", "0.060617", "0.699 of fraud transactions",
        "After each training day", "2018-04-01", "2018-04-17", "Are the scores probabilities?", "Settings",
        "[256, 256, 128]", "label_delay_days", "re-applied at 2026-11-27 20:10:00 UTC",
        "Reliability of the newest model")

# Every element's box inside the viewport's width, except what scrolls inside a table's own box; every
# table fits its box; every picture decoded, drawn at a width a person can read, and inline.
LOOK = """(() => {
  const width = document.documentElement.clientWidth;
  const spill = [...document.querySelectorAll('body *')].filter(e => !e.closest('.wide'))
    .filter(e => e.getBoundingClientRect().right > width + 0.5 || e.getBoundingClientRect().left < -0.5)
    .map(e => e.tagName + '.' + e.className + ': ' + (e.innerText || '').slice(0, 40));
  const scrolled = [...document.querySelectorAll('.wide')].filter(e => e.scrollWidth > e.clientWidth + 1).length;
  const images = [...document.images].map(i => ({ok: i.complete && i.naturalWidth > 0, shown: i.clientWidth,
    inline: i.src.startsWith('data:')}));
  const fetched = performance.getEntriesByType('resource').map(r => r.name).filter(n => !n.startsWith('data:'));
  return {text: document.body.innerText, pageWidth: document.documentElement.scrollWidth, width, spill,
          scrolled, images, fetched, tables: document.querySelectorAll('table').length};
})()"""


@pytest.mark.timeout(180)
def test_a_person_sees_the_figures_the_pictures_and_nothing_spills_at_desktop_and_phone_widths(
        page_file: Path, tmp_path: Path) -> None:
    binary = needs_chromium()
    history = STATE["history"]
    with Browser(binary) as browser:
        for width, height in ((1280, 900), (390, 844)):
            page = browser.open(page_file.as_uri(), width, height)
            seen = page.evaluate(LOOK)
            shot = page.screenshot(Path(os.environ.get("REPORT_PAGE_SHOTS", tmp_path)) / f"report-{width}.png")
            where = f"at {width}px (screenshot {shot})"
            for text in (*SEEN, f"{history[-1]['average_precision']:.3f}",
                         f"{history[-1]['average_precision'] / 0.0295:.1f}x the base rate"):
                assert text in seen["text"], f"{where}: {text!r} is not on the page"
            assert seen["pageWidth"] <= seen["width"], f"{where}: the page is wider than the window"
            assert seen["spill"] == [], f"{where}: outside the window: {seen['spill'][:5]}"
            assert len(seen["images"]) == 3 and all(i["ok"] and i["inline"] for i in seen["images"]), where
            assert all(i["shown"] >= min(300, width - 80) for i in seen["images"]), f"{where}: {seen['images']}"
            assert seen["fetched"] == [], f"{where}: fetched {seen['fetched']}"
            assert seen["tables"] == 5
            if width >= 1280:
                assert seen["scrolled"] == 0, f"{where}: a table needs a scrollbar on a desktop"


def test_a_run_without_days_or_pictures_is_a_page_that_says_so() -> None:
    page = report_html.render("fresh", {}, [], {})
    assert "no training day applied yet" in page and "no picture yet" in page and "<img" not in page


def test_names_and_settings_are_escaped() -> None:
    page = report_html.render("main", {"note": "<b>&"}, [], {})
    assert "&lt;b&gt;&amp;" in page and "<b>&" not in page


def test_without_chromium_the_browser_test_skips_outside_ci_and_fails_under_ci(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no browser on it
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="no Chromium on PATH"):
        needs_chromium()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true and no Chromium on PATH"):
        needs_chromium()


def test_the_reliability_picture_is_well_formed_svg_with_a_point_per_bin_and_the_diagonal() -> None:
    import xml.etree.ElementTree as ET

    newest = STATE["history"][-1]
    svg = ET.fromstring(report_html.reliability_svg(newest))
    ns = "{http://www.w3.org/2000/svg}"
    assert len(svg.findall(f"{ns}circle")) == len(newest["reliability"]) + len(newest["reliability_raw"])
    assert [t.text for t in svg.findall(f"{ns}text")][:4] == ["1e-5", "1e-5", "1e-4", "1e-4"]
    assert "1" in [t.text for t in svg.findall(f"{ns}text")]
    assert any(line.get("stroke-dasharray") for line in svg.findall(f"{ns}line"))  # calibrated: observed = predicted
