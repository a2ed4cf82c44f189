"""Recall at 1% FPR exactly at its boundary: the 2nd false positive of 200 legit is allowed, the 3rd is not.

The other metric tests reach their answer with 0 false positives above the found frauds, so a `<`
where `<=` belongs (or a looser bound) would pass them; here every step of the ranking matters.
"""

from __future__ import annotations

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
