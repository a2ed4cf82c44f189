"""Recall at 1% FPR exactly at its boundary: the 2nd false positive of 200 legit is allowed, the 3rd is not.

The other metric tests reach their answer with 0 false positives above the found frauds, so a `<`
where `<=` belongs (or a looser bound) would pass them; here every step of the ranking matters.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from workload.model import metrics

N_LEGIT = 200  # 1% of 200 legit transactions: exactly 2 false positives are allowed


def ranked(pattern: str) -> tuple[np.ndarray, np.ndarray]:
    """Scores falling with the position in ``pattern`` (F fraud, L legit), then the remaining legit
    transactions below them all; labels as floats, the way they come out of a parquet column."""
    legit_left = N_LEGIT - pattern.count("L")
    labels = np.array([1.0 if c == "F" else 0.0 for c in pattern] + [0.0] * legit_left)
    scores = np.linspace(0.99, 0.01, len(labels))
    order = np.random.default_rng(7).permutation(len(labels))  # rows arrive in no particular order
    return scores[order], labels[order]


@pytest.mark.parametrize(
    ("pattern", "recall"),
    [
        ("FLFLFLF", 3 / 4),  # the 3rd fraud sits just below the 2nd false positive: found; the 4th is not
        ("LLFFF", 1.0),  # both false positives above every fraud: all frauds within 1% FPR
        ("LLLFFF", 0.0),  # 3 legit above every fraud: 1.5% FPR before the first fraud
        ("FLLLF", 1 / 2),  # after the 3rd false positive nothing more counts
    ],
)
def test_two_false_positives_are_allowed_and_a_third_is_not(pattern: str, recall: float) -> None:
    scores, labels = ranked(pattern)
    assert (labels == 0).sum() == N_LEGIT
    assert metrics.recall_at_fpr(scores, labels) == pytest.approx(recall)
    days = np.full(len(labels), np.datetime64("2018-04-07"))
    assert metrics.evaluate(scores, labels, days)["recall_at_1pct_fpr"] == pytest.approx(recall)


def test_a_tie_that_crosses_the_boundary_counts_whole() -> None:
    """A fraud tied with the 3rd false positive cannot be flagged without flagging that legit row too."""
    top = np.array([0.99, 0.98, 0.97, 0.96, 0.96])  # fraud, legit, legit, then a fraud and a legit tied
    labels = np.r_[1.0, 0.0, 0.0, 1.0, 0.0, np.zeros(N_LEGIT - 3)]
    scores = np.r_[top, np.linspace(0.5, 0.01, N_LEGIT - 3)]
    order = np.random.default_rng(3).permutation(len(labels))
    # Counting the tied fraud before its legit twin would give 2 frauds at 2 false positives: recall 1.
    assert metrics.recall_at_fpr(scores[order], labels[order]) == pytest.approx(1 / 2)


def test_no_threshold_within_the_rate_finds_nothing() -> None:
    """With 50 legit rows, a single false positive is already 2%: the top-scored legit row blocks all."""
    labels = np.r_[0.0, 1.0, 1.0, np.zeros(49)]
    scores = np.linspace(0.9, 0.1, len(labels))
    assert metrics.recall_at_fpr(scores, labels) == 0.0
    assert metrics.recall_at_fpr(scores, labels, max_fpr=0.02) == 1.0  # the same ranking at 2%: both found


def test_alert_thresholds_at_their_edges() -> None:
    """No transactions: every figure unknown. One fraud alone: it is the alert, and without a legitimate transaction
    there is no false-positive rate. Timestamps of one day are one card-day, ranked from the best score down; the
    false-positive limit is inclusive; a limit nothing meets alerts nothing."""
    none = metrics.alert_thresholds(np.array([]), np.array([]), np.array([], dtype="datetime64[D]"), np.array([]))
    assert {rule: sorted(figures) for rule, figures in none.items()} == {
        "top100_cards": ["alerts_per_day", "precision", "recall", "threshold"],
        "fpr_1pct": ["false_positive_rate", "precision", "recall", "threshold"]}
    assert all(math.isnan(x) for figures in none.values() for x in figures.values())

    one = metrics.alert_thresholds(np.array([0.3]), np.array([1]), np.array(["2018-08-08"], dtype="datetime64[D]"),
                                   np.array([7]))
    assert one["top100_cards"] == {"threshold": 0.3, "precision": 1.0, "recall": 1.0, "alerts_per_day": 1.0}
    assert all(math.isnan(x) for x in one["fpr_1pct"].values())

    days = np.array(["2018-08-08T01:00", "2018-08-08T23:00", "2018-08-08T12:00", "2018-08-08T05:00"],
                    dtype="datetime64[ns]")
    scores, labels, cards = np.array([0.2, 0.9, 0.5, 0.1]), np.array([0, 1, 0, 0]), np.array([1, 1, 2, 3])
    alerts = metrics.alert_thresholds(scores, labels, days, cards, k=1, max_fpr=1 / 3)
    assert alerts["top100_cards"] == {"threshold": 0.9, "precision": 1.0, "recall": 1.0, "alerts_per_day": 1.0}
    assert alerts["fpr_1pct"] == {"threshold": 0.5, "precision": 0.5, "recall": 1.0, "false_positive_rate": 1 / 3}
    strict = metrics.alert_thresholds(np.array([0.9, 0.5]), np.array([0, 1]), days[:2], cards[1:3], max_fpr=0.0)
    assert strict["fpr_1pct"]["threshold"] == float("inf") and math.isnan(strict["fpr_1pct"]["precision"])
    assert {k: v for k, v in strict["fpr_1pct"].items() if k not in ("threshold", "precision")} == {
        "recall": 0.0, "false_positive_rate": 0.0}
    assert metrics.alert_columns([], scores) == {}  # a model without a history has no thresholds


def test_a_probability_on_a_bin_edge_belongs_to_the_bin_it_opens() -> None:
    rows = metrics.reliability(np.array([0.001, 0.0009]), np.array([1, 0]))
    assert [(r["low"], r["high"], r["n"]) for r in rows] == [(0.0, 0.001, 1.0), (0.001, 0.003, 1.0)]


def test_a_float32_score_alerts_by_its_exact_value() -> None:
    """The network scores in float32: a score is compared with the threshold at the value it holds, not at
    the threshold rounded to float32. 0.7 in float32 is 0.69999998..., below a threshold of 0.7; 0.6 in
    float32 is 0.60000002..., above a threshold of 0.6; a threshold a float32 score set is met by that score."""
    scores = np.array([0.7, 0.6, 0.5], dtype=np.float32)
    history = [{"alerts": {"top100_cards": {"threshold": 0.7}, "fpr_1pct": {"threshold": 0.6}}},
               {"alerts": {"top100_cards": {"threshold": float(scores[0])}, "fpr_1pct": {"threshold": float("inf")}}}]
    older = metrics.alert_columns(history[:1], scores)
    assert older["alert_top100_cards"].tolist() == [False, False, False]
    assert older["alert_1pct_fpr"].tolist() == [True, True, False]
    newest = metrics.alert_columns(history, scores)  # the last entry's thresholds
    assert newest["alert_top100_cards"].tolist() == [True, False, False]
    assert newest["alert_1pct_fpr"].tolist() == [False, False, False]
