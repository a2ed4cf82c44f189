"""The report: rendered from checkpoint history; pictures throttled, never stale at a run's end."""

from __future__ import annotations

import os
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from workload.model import metrics, plots, report


def view(state: dict[str, Any]) -> SimpleNamespace:
    """A checkpoint's story as `report.write` reads it from a `LineageState`."""
    return SimpleNamespace(run=state["run"], hparams=state["hparams"], history=state["history"],
                           reapplied=state.get("reapplied", []))


def test_pictures_are_stale_when_missing_or_older_than_the_interval(tmp_path: Path) -> None:
    assert report.plots_stale(tmp_path, 30)
    picture = tmp_path / "metrics.png"
    picture.write_bytes(b"png")
    assert not report.plots_stale(tmp_path, 30)
    old = time.time() - 31
    os.utime(picture, (old, old))
    assert report.plots_stale(tmp_path, 30)



def test_pictures_are_due_at_once_with_a_zero_interval_and_not_while_a_peers_clock_is_ahead(tmp_path: Path) -> None:
    picture = tmp_path / "metrics.png"
    picture.write_bytes(b"png")
    now = time.time()
    os.utime(picture, (now, now))
    assert report.plots_stale(tmp_path, 0)
    ahead = now + 120  # drawn by a worker whose clock runs two minutes ahead
    os.utime(picture, (ahead, ahead))
    assert not report.plots_stale(tmp_path, 30)

def test_report_keeps_the_tutorial_shape_and_says_how_it_compares_to_the_base_rate(tmp_path: Path) -> None:
    entry = {"shard": "training/2018-04-01.parquet", "time": "t", "checkpoint": "ckpt-00000001-t1.pt",
             "train_accuracy": 0.99, "accuracy": 0.97, "average_precision": 0.6, "base_rate": 0.03,
             "roc_auc": 0.9, "precision_top100": 0.8, "recall_at_1pct_fpr": 0.5}
    state = {"run": "main", "hparams": {"lr": 0.1}, "history": [entry]}
    path = report.write(tmp_path, view(state), None, draw=False)
    text = path.read_text()
    for line in ("time: t", "training dataset: training/2018-04-01.parquet",
                 f"model checkpoint: {tmp_path / 'checkpoints' / 'ckpt-00000001-t1.pt'}",
                 "accuracy on training data: 0.9900", "accuracy on testing data: 0.9700",
                 "average precision (AUPRC) on testing data: 0.6000 (base rate 0.0300: 20.0x better than guessing)"):
        assert line in text
    assert "predicting 'legitimate' for every transaction scores 0.9700" in text
    assert report.latest_metrics(tmp_path) == entry
    assert not (tmp_path / "metrics.png").exists()


def test_the_report_says_worse_than_guessing_and_shows_the_fields_figures(tmp_path: Path) -> None:
    entry = {"shard": "training/2018-04-01.parquet", "time": "t", "checkpoint": "c.pt", "train_accuracy": 0.9,
             "accuracy": 0.9, "average_precision": 0.027, "base_rate": 0.03, "roc_auc": 0.45,
             "card_precision_top100": 0.12, "precision_top100": 0.1, "recall_at_1pct_fpr": 0.0}
    text = report.render("main", {}, [entry], tmp_path)
    assert "(base rate 0.0300: worse than guessing (0.9x the base rate))" in text
    assert "better than guessing" not in text
    assert "card precision of the top 100 cards per test day (CP@100): 0.1200" in text
    line = report.figures_line(entry)
    assert "average precision 0.027" in line and "ROC AUC 0.450" in line and "card precision@100 0.120" in line
    no_fraud = {**entry, "average_precision": float("nan"), "base_rate": 0.0}
    assert "no fraud on the test days: undefined" in report.render("main", {}, [no_fraud], tmp_path)


# A run of two days, as a checkpoint's history holds it: the first from before calibration and the
# field's figures existed (no base rate, AP, CP@100 or Brier score), the newest with all of them.
OLDER = {"shard": "training/2018-04-01.parquet", "time": "2024-05-01 08:00:00 UTC",
         "checkpoint": "ckpt-00000001-t1.pt", "train_accuracy": 1, "accuracy": 0.6, "roc_auc": 0.7,
         "precision_top100": 0.1, "recall_at_1pct_fpr": 0.2}
RELIABILITY_RAW = [{"low": 0.0, "high": 0.01, "n": 1234.0, "frauds": 5.0, "predicted": 0.004321, "observed": 0.0052},
                   {"low": 0.5, "high": 1.0, "n": 20.0, "frauds": 15.0, "predicted": 0.8123, "observed": 0.75}]
RELIABILITY = [{"low": 0.05, "high": 0.1, "n": 99.0, "frauds": 7.0, "predicted": 0.0712, "observed": 0.0707}]
ALERTS = {"top100_cards": {"threshold": 0.1234567, "precision": 0.4567, "recall": 0.25, "alerts_per_day": 98.76},
          "fpr_1pct": {"threshold": 0.0456789, "precision": 0.3333, "recall": 0.6, "false_positive_rate": 0.01}}
NEWEST = {"shard": "training/2018-04-02.parquet", "time": "2024-05-01 10:00:00 UTC",
          "checkpoint": "ckpt-00000002-t1.pt", "train_accuracy": 0.98766, "accuracy": 0.97,
          "average_precision": 0.45, "base_rate": 0.03, "roc_auc": 0.91234, "card_precision_top100": 0.25,
          "precision_top100": 0.3, "recall_at_1pct_fpr": 0.4, "brier_raw": 0.05, "brier": 0.02, "ece_raw": 0.1,
          "ece": 0.01, "calibration_days": ["2018-03-01", "2018-03-02", "2018-03-03"],
          "reliability_raw": RELIABILITY_RAW, "reliability": RELIABILITY, "alerts": ALERTS}
REWIND = {"day": "2018-04-01", "reapplied": ["2018-04-02", "2018-04-03"], "from": "ckpt-00000000-t1.pt",
          "why": "2018-04-01 arrived after 2018-04-03 was applied (a backfill or a requeued day)",
          "time": "2024-05-01 09:00:00 UTC"}
NEWEST_MODEL_SECTION = [
    "Newest model: are its scores probabilities? (test days; reliability per bin of predicted probability; "
    "a calibrated model's predicted and observed rates agree)",
    "  before calibration (the network's own sigmoid):",
    "              bin      rows  frauds predicted  observed",
    "     0.000-0.010       1234       5    0.0043    0.0052",
    "     0.500-1.000         20      15    0.8123    0.7500",
    "  after calibration (what score and export give):",
    "              bin      rows  frauds predicted  observed",
    "     0.050-0.100         99       7    0.0712    0.0707",
    "",
    "Alert thresholds of the newest model (alert when score >= threshold; figures on the test days):",
    "  top 100 cards a day: threshold 0.123457 (98.8 cards/day): precision 0.457, recall 0.250 of fraud cards",
    "  1% false-positive rate: threshold 0.045679: precision 0.333, recall 0.600 of fraud transactions",
]


def _expected_report(run_dir: Path) -> str:
    ckpts = run_dir / "checkpoints"
    return "\n".join([
        "Training report: run 'main'",
        'hyperparameters: {"hidden": [128, 64], "lr": 0.002}',
        "shards applied: 2",
        "",
        "Newest model, on the test days (after training/2018-04-02.parquet):",
        "  average precision (AUPRC) 0.4500: 15.0x better than guessing (base rate 0.0300)",
        "  card precision of the top 100 cards per test day (CP@100) 0.2500",
        "  Brier score 0.0200, expected calibration error 0.0100 (calibrated; 0.0500 and 0.1000 before)",
        "  alert thresholds with their precision and recall: at the end of this report",
        "",
        "re-applied at 2024-05-01 09:00:00 UTC: 2018-04-02, 2018-04-03, because 2018-04-01 arrived after "
        "2018-04-03 was applied (a backfill or a requeued day); the run went back to ckpt-00000000-t1.pt and "
        "applied 2018-04-01 and every later day in date order",
        "",
        "time: 2024-05-01 08:00:00 UTC",
        "training dataset: training/2018-04-01.parquet",
        f"model checkpoint: {ckpts / 'ckpt-00000001-t1.pt'} (pruned: only the newest checkpoints are kept)",
        "average precision (AUPRC) on testing data: n/a (base rate n/a: no fraud on the test days: undefined)",
        "card precision of the top 100 cards per test day (CP@100): n/a",
        "ROC AUC on testing data: 0.7000",
        "precision of the top 100 transactions per test day: 0.1000",
        "recall at 1% false-positive rate: 0.2000",
        "accuracy on training data: 1",
        "accuracy on testing data: 0.6000",
        "",
        "time: 2024-05-01 10:00:00 UTC",
        "training dataset: training/2018-04-02.parquet",
        f"model checkpoint: {ckpts / 'ckpt-00000002-t1.pt'}",
        "average precision (AUPRC) on testing data: 0.4500 (base rate 0.0300: 15.0x better than guessing)",
        "card precision of the top 100 cards per test day (CP@100): 0.2500",
        "calibration: fitted on 3 day(s) 2018-03-01..2018-03-03; Brier score 0.0500 -> 0.0200, "
        "expected calibration error 0.1000 -> 0.0100",
        "ROC AUC on testing data: 0.9123",
        "precision of the top 100 transactions per test day: 0.3000",
        "recall at 1% false-positive rate: 0.4000",
        "accuracy on training data: 0.9877",
        "accuracy on testing data: 0.9700",
        "",
        "Accuracy alone says little here: predicting 'legitimate' for every transaction scores 0.9700 on the "
        "test days. Average precision of a random guess is the base rate (0.0300); this model reaches 0.4500.",
        "",
        *NEWEST_MODEL_SECTION,
    ]) + "\n"


def _state(**extra: Any) -> dict[str, Any]:
    return {"run": "main", "hparams": {"lr": 0.002, "hidden": [128, 64]}, "history": [OLDER, NEWEST],
            "reapplied": [REWIND], **extra}


def test_the_report_is_exact_line_for_line(tmp_path: Path) -> None:
    path = report.write(tmp_path, view(_state()), None, draw=False, kept={"ckpt-00000002-t1.pt"})
    assert path == tmp_path / "report.txt"
    assert path.read_text() == _expected_report(tmp_path)


def test_checkpoints_are_called_pruned_only_when_kept_is_given_and_lacks_them(tmp_path: Path) -> None:
    def checkpoint_lines(kept: set[str] | None) -> list[str]:
        text = report.render("main", {}, [OLDER, NEWEST], tmp_path, kept)
        return [line for line in text.splitlines() if line.startswith("model checkpoint:")]

    ckpts = tmp_path / "checkpoints"
    both = [f"model checkpoint: {ckpts / 'ckpt-00000001-t1.pt'}", f"model checkpoint: {ckpts / 'ckpt-00000002-t1.pt'}"]
    assert checkpoint_lines(None) == both  # not said: nobody listed the folder
    assert checkpoint_lines({"ckpt-00000001-t1.pt", "ckpt-00000002-t1.pt"}) == both
    assert checkpoint_lines(set()) == [f"{line} (pruned: only the newest checkpoints are kept)" for line in both]


def test_a_report_without_days_is_its_header_only(tmp_path: Path) -> None:
    for reapplied in (None, []):
        assert report.render("fresh", {}, [], tmp_path, reapplied=reapplied) == (
            "Training report: run 'fresh'\nhyperparameters: {}\nshards applied: 0\n\n")


def test_the_newest_model_section_appears_only_when_the_newest_day_has_reliability(tmp_path: Path) -> None:
    plain = {key: value for key, value in NEWEST.items() if key not in ("reliability", "reliability_raw", "alerts")}
    text = report.render("main", {}, [OLDER, plain], tmp_path)
    assert text.endswith("this model reaches 0.4500.\n")
    assert "Newest model: are its scores" not in text and "alert thresholds" not in text
    assert report.newest_model_section(NEWEST) == NEWEST_MODEL_SECTION


def test_the_report_leads_with_the_figures_that_mean_something_at_the_fraud_rate(tmp_path: Path) -> None:
    """Before any day's block and before any accuracy: the newest model's AP against the base rate, CP@100 and
    calibration (today's main opened every block with "accuracy on training data 0.99")."""
    lines = report.render("main", {}, [OLDER, NEWEST], tmp_path).splitlines()
    first_accuracy = next(i for i, line in enumerate(lines) if "accuracy" in line.lower())
    lead = [i for i, line in enumerate(lines) if line.startswith("  average precision (AUPRC) 0.4500: 15.0x better")]
    assert lead and lead[0] < first_accuracy and lines[lead[0] - 1].startswith("Newest model, on the test days")
    for block in "\n".join(lines).split("\ntime: ")[1:]:
        names = [line.split(":")[0] for line in block.split("\n\n")[0].splitlines()[3:]]
        assert names[0].startswith("average precision") and names[1].startswith("card precision"), names
        assert names[-2:] == ["accuracy on training data", "accuracy on testing data"], names


def test_the_calibration_line_says_on_which_days_or_that_there_were_none() -> None:
    assert report.calibration_line(NEWEST) == (
        "calibration: fitted on 3 day(s) 2018-03-01..2018-03-03; Brier score 0.0500 -> 0.0200, "
        "expected calibration error 0.1000 -> 0.0100")
    none = "none (no training day's labels were the label delay old before the test days)"
    for days in ({"calibration_days": []}, {}):
        h = {**days, "brier_raw": 0.05, "brier": 0.05, "ece_raw": float("nan"), "ece": float("nan")}
        assert report.calibration_line(h) == (
            f"calibration: {none}; Brier score 0.0500 -> 0.0500, expected calibration error n/a -> n/a")


def test_alert_lines_give_each_rules_threshold_precision_and_recall() -> None:
    assert report.alert_lines(ALERTS) == NEWEST_MODEL_SECTION[-2:]


def test_metrics_jsonl_is_one_sorted_json_line_per_day() -> None:
    history = [{"b": 1, "a": 0.5}, {"z": [1, 2], "c": "x"}]
    assert report.metrics_jsonl(history) == '{"a": 0.5, "b": 1}\n{"c": "x", "z": [1, 2]}\n'
    assert report.metrics_jsonl([]) == ""


def test_lift_is_the_ratio_to_the_base_rate_and_undefined_without_fraud() -> None:
    nan = float("nan")
    assert report.lift_phrase(0.6, 0.03) == "20.0x better than guessing"
    assert report.lift_phrase(0.03, 0.03) == "1.0x better than guessing"  # as good as a guess is not worse
    assert report.lift_phrase(0.015, 0.03) == "worse than guessing (0.5x the base rate)"
    for ap, base in ((0.5, 0.0), (nan, 0.03), (0.5, nan), (nan, nan)):
        assert report.lift_phrase(ap, base) == "no fraud on the test days: undefined", (ap, base)


def test_the_figures_line_is_exact_and_says_nan_for_a_missing_card_precision() -> None:
    m = {"average_precision": 0.45678, "base_rate": 0.03456, "card_precision_top100": 0.25, "roc_auc": 0.91234,
         "recall_at_1pct_fpr": 0.4}
    assert report.figures_line(m) == ("average precision 0.457 vs base rate 0.0346; card precision@100 0.250; "
                                      "ROC AUC 0.912; recall@1%FPR 0.400")
    del m["card_precision_top100"]
    assert "; card precision@100 nan; " in report.figures_line(m)


def test_latest_metrics_is_the_last_line_or_none(tmp_path: Path) -> None:
    assert report.latest_metrics(tmp_path) is None  # no file yet
    (tmp_path / "metrics.jsonl").write_text("")
    assert report.latest_metrics(tmp_path) is None
    (tmp_path / "metrics.jsonl").write_text(report.metrics_jsonl([{"day": 1}, {"day": 2}, {"day": 3}]))
    assert report.latest_metrics(tmp_path) == {"day": 3}


def test_metrics_jsonl_is_appended_to_only_when_it_holds_exactly_the_days_before(tmp_path: Path) -> None:
    """A day's write appends one line (the file is not rewritten: cost flat in the days applied); anything else
    (a rewind to fewer days, a torn append, a write that left no stamp) rewrites it whole from the history."""
    days = [dict(NEWEST, checkpoint=f"ckpt-{i:08d}-t1.pt", shard=f"d{i}") for i in range(1, 5)]
    path = tmp_path / "metrics.jsonl"
    for n in range(1, 4):
        report.write(tmp_path, view(_state(history=days[:n], reapplied=[])), None, draw=False, stamp=(1, n))
    inode = path.stat().st_ino
    report.write(tmp_path, view(_state(history=days, reapplied=[])), None, draw=False, stamp=(1, 4))
    assert path.stat().st_ino == inode, "appended, not replaced"
    assert path.read_text() == report.metrics_jsonl(days)
    report.write(tmp_path, view(_state(history=days[:2], reapplied=[])), None, draw=False, stamp=(2, 5))
    assert path.read_text() == report.metrics_jsonl(days[:2])  # a rewind: whole again
    with path.open("a") as f:
        f.write('{"torn')
    report.write(tmp_path, view(_state(history=days[:3], reapplied=[])), None, draw=False, stamp=(2, 6))
    assert path.read_text() == report.metrics_jsonl(days[:3])


def test_the_workers_report_shows_the_newest_days_and_the_exports_every_day(tmp_path: Path) -> None:
    """What a worker rewrites each day must not grow with the days applied: report.txt and report.html show the
    newest `REPORT_DAYS` (saying how many are left out and where they are); render without a limit (the
    export's) shows every day."""
    n = report.REPORT_DAYS + 5
    days = [dict(NEWEST, checkpoint=f"ckpt-{i:08d}-t1.pt", shard=f"d{i}") for i in range(1, n + 1)]
    report.write(tmp_path, view(_state(history=days, reapplied=[])), None, draw=False)
    text = (tmp_path / "report.txt").read_text()
    assert text.count("training dataset: ") == report.REPORT_DAYS and "training dataset: d6\n" in text
    assert f"shards applied: {n}\n" in text and "5 earlier day(s) are not shown here" in text
    assert "5 earlier day(s) are not shown here" in (tmp_path / "report.html").read_text()
    assert report.render("r", {}, days, tmp_path).count("training dataset: ") == n


def test_rendered_from_reads_the_stamp_and_is_zero_when_it_is_missing_or_unreadable(tmp_path: Path) -> None:
    source = tmp_path / ".report-source.json"
    assert report.rendered_from(tmp_path) == (0, 0)
    for text in ("{not json", '{"token": 3}', '{"seq": 7}', '{"token": null, "seq": 7}', '["token", "seq"]',
                 '{"token": "three", "seq": 7}'):
        source.write_text(text)
        assert report.rendered_from(tmp_path) == (0, 0), text
    source.write_text('{"token": 3, "seq": 7}\n')
    assert report.rendered_from(tmp_path) == (3, 7)


def test_a_stamped_write_records_its_source_and_an_older_one_writes_nothing(tmp_path: Path) -> None:
    assert report.write(tmp_path, view(_state()), None, draw=False, stamp=(2, 5)) == tmp_path / "report.txt"
    assert report.rendered_from(tmp_path) == (2, 5)
    files = {name: (tmp_path / name).read_text() for name in ("report.txt", "metrics.jsonl", ".report-source.json")}
    shorter = _state(history=[NEWEST], reapplied=[])
    for older in ((2, 4), (1, 9), (0, 0)):  # a worker that lost its lease, holding an older checkpoint
        assert report.write(tmp_path, view(shorter), None, draw=False, stamp=older) is None
        assert {name: (tmp_path / name).read_text() for name in files} == files, older
    same_source = report.write(tmp_path, view(shorter), None, draw=False, stamp=(2, 5))
    assert same_source == tmp_path / "report.txt"
    assert "shards applied: 1\n" in (tmp_path / "report.txt").read_text()
    assert (tmp_path / "metrics.jsonl").read_text() == report.metrics_jsonl([NEWEST])
    assert report.write(tmp_path, view(_state()), None, draw=False, stamp=(3, 0)) == tmp_path / "report.txt"
    assert report.rendered_from(tmp_path) == (3, 0)
    assert (tmp_path / "report.txt").read_text() == _expected_report(tmp_path).replace(" (pruned: only the newest "
                                                                                       "checkpoints are kept)", "")


def test_an_unstamped_write_always_writes_and_records_no_source(tmp_path: Path) -> None:
    (tmp_path / ".report-source.json").write_text('{"token": 9, "seq": 9}\n')
    assert report.write(tmp_path, view(_state()), None, draw=False) == tmp_path / "report.txt"
    assert (tmp_path / ".report-source.json").read_text() == '{"token": 9, "seq": 9}\n'
    assert report.write(tmp_path / "fresh", view({"run": "fresh", "hparams": {}, "history": []}), None,
                        draw=False)
    assert sorted(p.name for p in (tmp_path / "fresh").iterdir()) == ["metrics.jsonl", "report.html", "report.txt"]


def test_write_draws_the_runs_pictures_by_default_and_only_once_a_day_is_applied(tmp_path: Path) -> None:
    scores, labels = np.array([0.9, 0.8, 0.3, 0.1]), np.array([1, 0, 1, 0])
    pr = metrics.pr_curve(scores, labels)
    state = {"run": "main", "hparams": {"lr": 0.002}, "history": [OLDER, {**NEWEST, "n_fraud": 2}]}
    report.write(tmp_path / "drawn", view(state), pr)
    direct = plots.write_plots(tmp_path / "direct", state["history"], pr, run="main", hparams={"lr": 0.002})
    for path in direct:  # the same pictures, pixel for pixel, as drawing the run's own name and hyperparameters
        assert (tmp_path / "drawn" / path.name).read_bytes() == path.read_bytes(), path.name
    report.write(tmp_path / "undrawn", view(state), pr, draw=False)
    report.write(tmp_path / "empty", view({**state, "history": []}), pr)
    for folder in ("undrawn", "empty"):
        names = sorted(p.name for p in (tmp_path / folder).iterdir())
        assert names == ["metrics.jsonl", "report.html", "report.txt"], folder


def test_the_report_is_replaced_whole_without_paying_for_fsync(tmp_path: Path, monkeypatch) -> None:
    """Rendered again from the checkpoint whenever lost: atomic (a reader keeps the whole old file), never
    fsynced (four fsynced files and their folder cost ~100 ms a day on a loaded disk, as much as a small day's
    training)."""
    report.write(tmp_path, view(_state()), None, draw=False)
    synced: list[int] = []
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd))
    with (tmp_path / "report.txt").open() as reader:
        old = (tmp_path / "report.txt").read_text()
        report.write(tmp_path, view({**_state(), "history": [NEWEST]}), None, draw=False, stamp=(1, 1))
        assert reader.read() == old
    assert synced == []
    assert "shards applied: 1" in (tmp_path / "report.txt").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".report-source.json", "metrics.jsonl", "report.html",
                                                          "report.txt"]


def test_pictures_that_took_long_to_draw_are_redrawn_less_often(tmp_path: Path) -> None:
    """On a machine where a small day trains in the time the pictures take, redrawing them every 30 s doubled
    the day: they wait 50 times their own cost (2 % of the run's time), and the interval when that is longer."""
    picture = tmp_path / "metrics.png"
    picture.write_bytes(b"png")
    (tmp_path / ".pictures-cost.json").write_text('{"seconds": 1.2}\n')
    for age, stale in ((31, False), (59, False), (61, True)):
        then = time.time() - age
        os.utime(picture, (then, then))
        assert report.plots_stale(tmp_path, 30) is stale, age
        assert report.plots_stale(tmp_path, 90) is False, age  # the interval, when longer, still holds
    for text in ("{", '{"seconds": "soon"}', '{"seconds": -1}', '{"seconds": NaN}', "[]"):
        (tmp_path / ".pictures-cost.json").write_text(text)
        assert report.pictures_cost(tmp_path) == 0.0, text
        assert report.plots_stale(tmp_path, 30), text  # unknown cost: the interval alone (61 s > 30 s)


def test_drawing_records_what_the_pictures_cost(tmp_path: Path) -> None:
    state = {"run": "main", "hparams": {}, "history": [OLDER, {**NEWEST, "n_fraud": 2}]}
    report.write(tmp_path, view(state), metrics.pr_curve(np.array([0.9, 0.1]), np.array([1, 0])))
    assert 0 < report.pictures_cost(tmp_path) < 60
    report.write(tmp_path / "undrawn", view(state), None, draw=False)
    assert report.pictures_cost(tmp_path / "undrawn") == 0.0


def test_the_day_card_pairs_are_numpys_unique_rows_in_a_tenth_of_the_time() -> None:
    """alert_thresholds' grouping (every report's alert figures) as np.unique(axis=0) gave it, pair for pair."""
    rng = np.random.default_rng(3)
    for n, cards in ((1, 1), (500, 7), (20_000, 3000)):
        days = rng.integers(17600, 17607, n).astype(np.int64)
        card = rng.integers(-5, cards, n).astype(np.int64)  # negative ids too: no packing into one number
        pairs, inverse = np.unique(np.c_[days, card], axis=0, return_inverse=True)
        pair_days, got = metrics._day_card_pairs(days, card)
        np.testing.assert_array_equal(pair_days, pairs[:, 0])
        np.testing.assert_array_equal(got, inverse.ravel())
    empty_days, empty_inverse = metrics._day_card_pairs(np.zeros(0, np.int64), np.zeros(0, np.int64))
    assert len(empty_days) == len(empty_inverse) == 0
