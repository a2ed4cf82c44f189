"""Metrics agree with hand-computed values, known identities, and survive degenerate days."""

from __future__ import annotations

import math

import numpy as np
import pytest

from workload.model import metrics

KEYS = {
    "average_precision",
    "roc_auc",
    "precision_top100",
    "card_precision_top100",
    "recall_at_1pct_fpr",
    "accuracy",
    "base_rate",
    "n",
    "n_fraud",
}


def test_hand_computed_small_example() -> None:
    scores = np.array([0.9, 0.8, 0.7, 0.6])
    labels = np.array([1, 0, 1, 0])
    result = metrics.evaluate(scores, labels, np.zeros(4))
    assert set(result) == KEYS
    assert all(type(v) is float for v in result.values())
    # Recall steps 0.5 at precision 1, then 0.5 at precision 2/3.
    assert result["average_precision"] == pytest.approx(0.5 * 1 + 0.5 * 2 / 3)
    # Pairs (fraud, legit) ordered right: (0.9,0.8), (0.9,0.6), (0.7,0.6); wrong: (0.7,0.8).
    assert result["roc_auc"] == pytest.approx(3 / 4)
    assert result["precision_top100"] == pytest.approx(0.5)  # fewer than 100 rows: all of them
    assert math.isnan(result["card_precision_top100"])  # no cards given
    assert result["accuracy"] == pytest.approx(0.5)  # >= 0.5 flagged: all four
    assert result["base_rate"] == 0.5 and result["n"] == 4.0 and result["n_fraud"] == 2.0


def test_ties_are_handled_like_scikit_learn() -> None:
    scores = np.array([0.5, 0.5, 0.2])
    labels = np.array([1, 0, 1])
    # One threshold for the tie: (P=1/2, R=1/2), then (P=2/3, R=1).
    assert metrics.average_precision(scores, labels) == pytest.approx(0.5 * 0.5 + 0.5 * 2 / 3)
    # Fraud at 0.5 vs legit at 0.5 counts one half; fraud at 0.2 vs legit at 0.5 counts 0.
    assert metrics.roc_auc(scores, labels) == pytest.approx(0.25)
    assert metrics.roc_auc(np.ones(6), np.array([1, 0, 1, 0, 0, 0])) == pytest.approx(0.5)
    assert metrics.average_precision(np.ones(4), np.array([1, 0, 0, 0])) == pytest.approx(0.25)


def test_scikit_learn_documented_examples() -> None:
    # Examples from scikit-learn's docstrings of average_precision_score and roc_auc_score.
    y = np.array([0, 0, 1, 1])
    s = np.array([0.1, 0.4, 0.35, 0.8])
    assert metrics.average_precision(s, y) == pytest.approx(0.8333333333)
    assert metrics.roc_auc(s, y) == pytest.approx(0.75)
    precision, recall = metrics.pr_curve(s, y)
    np.testing.assert_allclose(precision, [1, 1, 0.5, 2 / 3, 0.5])
    np.testing.assert_allclose(recall, [0, 0.5, 0.5, 1, 1])


def test_identities_on_random_data() -> None:
    rng = np.random.default_rng(0)
    labels = (rng.random(20000) < 0.05).astype(int)
    scores = rng.random(20000) + labels * rng.random(20000) * 0.5
    auc = metrics.roc_auc(scores, labels)
    assert metrics.roc_auc(-scores, labels) == pytest.approx(1 - auc)
    # Ranking metrics only see the order: a monotone transform changes nothing.
    assert metrics.average_precision(np.exp(3 * scores), labels) == pytest.approx(
        metrics.average_precision(scores, labels)
    )
    assert metrics.average_precision(labels + 0.0, labels) == pytest.approx(1.0)
    assert metrics.roc_auc(labels + 0.0, labels) == pytest.approx(1.0)
    # Uninformative scores: AP near the base rate, AUC near one half.
    noise = rng.random(20000)
    assert metrics.average_precision(noise, labels) == pytest.approx(labels.mean(), abs=0.01)
    assert metrics.roc_auc(noise, labels) == pytest.approx(0.5, abs=0.03)
    # AUC equals the pairwise definition.
    pos, neg = scores[labels == 1][:300], scores[labels == 0][:300]
    pairwise = ((pos[:, None] > neg[None, :]) + 0.5 * (pos[:, None] == neg[None, :])).mean()
    sub = np.r_[pos, neg]
    assert metrics.roc_auc(sub, np.r_[np.ones(300), np.zeros(300)]) == pytest.approx(pairwise)
    # AP equals the mean precision at each fraud's rank when there are no ties.
    order = np.argsort(-scores)
    hits = labels[order]
    ranks = np.nonzero(hits)[0] + 1
    precision_at_each_fraud = np.cumsum(hits)[ranks - 1] / ranks
    assert metrics.average_precision(scores, labels) == pytest.approx(precision_at_each_fraud.mean())


def test_recall_at_one_percent_fpr() -> None:
    negatives = np.arange(200) / 200  # 0 .. 0.995
    scores = np.r_[0.999, 0.9975, 0.5, negatives]
    labels = np.r_[1, 1, 1, np.zeros(200)]
    # 1% of 200 legit = 2 false positives allowed: threshold 0.99 flags the two top frauds.
    assert metrics.recall_at_fpr(scores, labels) == pytest.approx(2 / 3)
    assert metrics.evaluate(scores, labels, np.zeros(203))["recall_at_1pct_fpr"] == pytest.approx(2 / 3)
    # A fraud scored below every legit transaction is never found within 1% FPR.
    assert metrics.recall_at_fpr(np.r_[-1.0, negatives], np.r_[1, np.zeros(200)]) == 0.0


def test_precision_top100_is_a_mean_over_days() -> None:
    # Day 0: 150 rows, the 100 best hold 30 frauds (and 20 more frauds rank below them).
    day0_scores = np.linspace(1, 0, 150)
    day0_labels = np.zeros(150)
    day0_labels[:30] = 1
    day0_labels[100:120] = 1
    # Day 1: 10 rows (fewer than 100: all count), 5 frauds.
    day1_scores = np.linspace(1, 0, 10)
    day1_labels = np.r_[np.ones(5), np.zeros(5)]
    scores = np.r_[day0_scores, day1_scores]
    labels = np.r_[day0_labels, day1_labels]
    days = np.r_[np.zeros(150), np.ones(10)]
    assert metrics.precision_top_k(scores, labels, days) == pytest.approx((0.3 + 0.5) / 2)
    shuffle = np.random.default_rng(0).permutation(160)
    assert metrics.evaluate(scores[shuffle], labels[shuffle], days[shuffle])["precision_top100"] == (
        pytest.approx(0.4)
    )


def test_degenerate_cases_give_nan_not_exceptions() -> None:
    no_fraud = metrics.evaluate(np.array([0.1, 0.7]), np.array([0, 0]), np.array([0, 0]))
    assert math.isnan(no_fraud["average_precision"]) and math.isnan(no_fraud["roc_auc"])
    assert math.isnan(no_fraud["recall_at_1pct_fpr"])
    assert no_fraud["precision_top100"] == 0.0 and no_fraud["base_rate"] == 0.0
    assert no_fraud["accuracy"] == 0.5

    all_fraud = metrics.evaluate(np.array([0.1, 0.7]), np.array([1, 1]), np.array([0, 1]))
    assert all_fraud["average_precision"] == 1.0
    assert math.isnan(all_fraud["roc_auc"]) and math.isnan(all_fraud["recall_at_1pct_fpr"])
    assert all_fraud["precision_top100"] == 1.0 and all_fraud["base_rate"] == 1.0

    empty = metrics.evaluate(np.array([]), np.array([]), np.array([]))
    assert empty["n"] == 0.0 and empty["n_fraud"] == 0.0
    assert all(math.isnan(empty[k]) for k in KEYS - {"n", "n_fraud"})
    assert all(type(v) is float for v in empty.values())

    precision, recall = metrics.pr_curve(np.array([0.3]), np.array([0]))
    assert precision.size == 0 and recall.size == 0
    with pytest.raises(ValueError, match="scores has 2 values, labels has 1"):
        metrics.evaluate(np.array([0.1, 0.2]), np.array([1]), np.array([0, 0]))


# Card Precision@2 by hand. Day 0: card 1 scores max(0.9, 0.2) = 0.9 and had fraud (its 0.2 row);
# card 2: 0.8, legit; card 3: 0.7, fraud; card 4: 0.1, fraud. Top 2 = cards 1, 2: one fraud, 1/2.
# Day 1: card 1 0.95 fraud, card 5 0.6 fraud, card 3 0.3 legit. Top 2 = cards 1, 5: 2/2.
CP_SCORES = np.array([0.9, 0.2, 0.8, 0.7, 0.1, 0.95, 0.3, 0.6])
CP_LABELS = np.array([0, 1, 0, 1, 1, 1, 0, 1])
CP_DAYS = np.array([0, 0, 0, 0, 0, 1, 1, 1])
CP_CARDS = np.array([1, 1, 2, 3, 4, 1, 3, 5])


def test_card_precision_at_k_by_hand() -> None:
    assert metrics.card_precision_top_k(CP_SCORES, CP_LABELS, CP_DAYS, CP_CARDS, k=2) == pytest.approx((0.5 + 1) / 2)
    # Card 1 was found on day 0: blocked, it leaves day 1, where card 5 and card 3 are the top 2: 1/2.
    assert metrics.card_precision_top_k(CP_SCORES, CP_LABELS, CP_DAYS, CP_CARDS, k=2,
                                        drop_detected=True) == pytest.approx((0.5 + 0.5) / 2)
    # An investigator checks k cards a day: with fewer active cards the precision is still over k.
    assert metrics.card_precision_top_k(CP_SCORES, CP_LABELS, CP_DAYS, CP_CARDS, k=5) == pytest.approx(
        (3 / 5 + 2 / 5) / 2)
    # Row order does not matter; a transaction-level figure would differ (day 0's top 2 rows: 0/2).
    shuffle = np.random.default_rng(0).permutation(8)
    assert metrics.card_precision_top_k(CP_SCORES[shuffle], CP_LABELS[shuffle], CP_DAYS[shuffle],
                                        CP_CARDS[shuffle], k=2) == pytest.approx(0.75)
    assert metrics.precision_top_k(CP_SCORES, CP_LABELS, CP_DAYS, k=2) == pytest.approx((0 + 1) / 2)


def test_card_precision_ties_go_to_the_lower_card_id() -> None:
    scores, days = np.array([0.5, 0.5]), np.array([0, 0])
    assert metrics.card_precision_top_k(scores, np.array([0, 1]), days, np.array([7, 3]), k=1) == 1.0
    assert metrics.card_precision_top_k(scores, np.array([1, 0]), days, np.array([7, 3]), k=1) == 0.0


def test_the_handbook_evaluation_removes_known_compromised_cards() -> None:
    known = np.array([0, 0, 0, 0, 1, 0, 1, 0], dtype=bool)  # card 4 on day 0, card 3 on day 1
    keep = ~known
    handbook = metrics.evaluate(CP_SCORES, CP_LABELS, CP_DAYS, CP_CARDS, known)
    assert handbook["n"] == 6.0 and handbook["n_fraud"] == 4.0
    assert handbook["average_precision"] == metrics.average_precision(CP_SCORES[keep], CP_LABELS[keep])
    assert handbook["card_precision_top100"] == metrics.card_precision_top_k(
        CP_SCORES[keep], CP_LABELS[keep], CP_DAYS[keep], CP_CARDS[keep], drop_detected=True)
    plain = metrics.evaluate(CP_SCORES, CP_LABELS, CP_DAYS, CP_CARDS)
    assert plain["n"] == 8.0
    assert plain["card_precision_top100"] == pytest.approx((3 / 100 + 2 / 100) / 2)


def _same_figures(a: dict[str, float], b: dict[str, float]) -> bool:
    return a.keys() == b.keys() and all(a[k] == b[k] or (math.isnan(a[k]) and math.isnan(b[k])) for k in a)


def test_integer_and_boolean_scores_rank_like_their_float_values() -> None:
    """A rule's score counting red flags, kept as a small unsigned integer, or a yes/no rule as a boolean, is
    ranked by its value (an unsigned -x wraps around; a boolean -x is refused)."""
    labels = np.array([1, 0, 1, 0, 0, 1, 0, 0, 1, 0])
    days = np.zeros(10)
    flags = np.array([3, 0, 2, 1, 0, 1, 0, 2, 3, 0], dtype=np.uint8)
    expected = metrics.evaluate(flags.astype(np.float64), labels, days)
    assert expected["average_precision"] < 1.0
    assert _same_figures(metrics.evaluate(flags, labels, days), expected)
    rule = flags >= 2
    assert _same_figures(metrics.evaluate(rule, labels, days), metrics.evaluate(rule.astype(np.float64), labels, days))


def test_recall_reaches_one_only_at_the_lowest_scored_fraud() -> None:
    precision, recall = metrics.pr_curve(np.array([0.9, 0.8, 0.1]), np.array([1, 0, 1]))
    np.testing.assert_allclose(recall, [0, 0.5, 0.5, 1])
    np.testing.assert_allclose(precision, [1, 1, 0.5, 2 / 3])


@pytest.mark.filterwarnings("error")  # nan by rule, not by a 0/0 that prints a RuntimeWarning in the worker's log
def test_degenerate_days_give_nan_quietly() -> None:
    for labels in (np.zeros(3), np.ones(3)):
        assert math.isnan(metrics.roc_auc(np.array([0.2, 0.5, 0.9]), labels))
        assert math.isnan(metrics.recall_at_fpr(np.array([0.2, 0.5, 0.9]), labels))
    empty = metrics.evaluate(np.array([]), np.array([]), np.array([]), np.array([]), np.array([], dtype=bool))
    assert empty["n"] == 0.0 and all(math.isnan(empty[k]) for k in KEYS - {"n", "n_fraud"})


def test_a_single_transaction_or_a_single_fraud_is_a_valid_test_set() -> None:
    one = metrics.evaluate(np.array([0.7]), np.array([1]), np.array([0]), np.array([5]))
    assert one["precision_top100"] == 1.0 and one["average_precision"] == 1.0 and one["accuracy"] == 1.0
    assert one["card_precision_top100"] == pytest.approx(1 / 100)
    # One fraud among three legit rows, ranked second: it beats two of three.
    assert metrics.roc_auc(np.array([0.9, 0.8, 0.3, 0.1]), np.array([0, 1, 0, 0])) == pytest.approx(2 / 3)


def test_accuracy_flags_scores_at_or_above_one_half() -> None:
    scores = np.array([0.5, 0.49, 0.9, 0.1, 0.5])
    labels = np.array([1, 0, 0, 0, 1])
    # Flagged: both 0.5 (frauds, right) and the 0.9 (legit, wrong); the 0.49 and 0.1 are rightly left: 4 of 5.
    assert metrics.evaluate(scores, labels, np.zeros(5))["accuracy"] == pytest.approx(4 / 5)


def test_precision_top_k_ties_at_the_cut_go_to_the_earlier_row() -> None:
    """300 rows of one day in no particular order: 50 clear alerts (legit), then 250 tied at 0.5 for the
    remaining 50 places; the first 50 tied rows in row order are taken, and 20 of them are frauds."""
    rng = np.random.default_rng(5)
    scores = np.full(300, 0.5)
    scores[rng.choice(300, 50, replace=False)] = 0.9
    tied = np.flatnonzero(scores == 0.5)
    labels = np.zeros(300)
    labels[tied[:20]] = 1  # frauds among the earliest tied rows
    labels[tied[60:100]] = 1  # and among later tied rows, which do not make the cut
    assert metrics.precision_top_k(scores, labels, np.zeros(300)) == pytest.approx(20 / 100)


def test_card_precision_ties_among_many_cards_go_to_the_lower_card_ids() -> None:
    """300 cards, 50 with a clear alert (legit), 250 tied for the remaining 50 places: the 50 lowest tied ids
    are taken (rows in no particular order), and 20 of them had fraud."""
    rng = np.random.default_rng(6)
    cards = np.arange(1000, 1300)
    best = np.full(300, 0.5)
    best[rng.choice(300, 50, replace=False)] = 0.9
    tied = np.flatnonzero(best == 0.5)
    fraud = np.zeros(300)
    fraud[tied[:20]] = 1
    fraud[tied[60:100]] = 1
    rows = rng.permutation(300)
    assert metrics.card_precision_top_k(best[rows], fraud[rows], np.zeros(300), cards[rows]) == pytest.approx(0.2)


@pytest.mark.parametrize("ids", [np.array([0, 1]), np.array([2**60 + 1, 2**60 + 2])],
                         ids=["card 0", "64-bit tokens beyond float64's integers"])
def test_a_detected_card_blocks_only_itself(ids: np.ndarray) -> None:
    """Card ids are customer ids from 0 up, or 64-bit tokens: blocking card A (found on day 0) must not
    block card B, and card 0 is a card like any other."""
    a, b = ids
    scores = np.array([0.9, 0.1, 0.9, 0.8])
    labels = np.array([1, 0, 1, 1])
    days = np.array([0, 0, 1, 1])
    cards = np.array([a, b, a, b])
    # Day 0: A found (1/1 with k=1). Day 1: A blocked, B is the top card and had fraud: 1/1.
    assert metrics.card_precision_top_k(scores, labels, days, cards, k=1, drop_detected=True) == 1.0


def test_the_known_flag_may_come_as_zeros_and_ones() -> None:
    """A known flag read back from a file as 0.0/1.0 (an integer column typed as floats) removes the same rows."""
    known = np.array([0, 0, 0, 0, 1, 0, 1, 0], dtype=bool)
    as_bool = metrics.evaluate(CP_SCORES, CP_LABELS, CP_DAYS, CP_CARDS, known)
    assert _same_figures(metrics.evaluate(CP_SCORES, CP_LABELS, CP_DAYS, CP_CARDS, known.astype(np.float64)), as_bool)
    # Without cards, the handbook figures still come, card precision aside.
    no_cards = metrics.evaluate(CP_SCORES, CP_LABELS, CP_DAYS, None, known)
    assert math.isnan(no_cards["card_precision_top100"]) and no_cards["n"] == 6.0
    with pytest.raises(ValueError, match="^scores has 8 values, known has 7$"):
        metrics.evaluate(CP_SCORES, CP_LABELS, CP_DAYS, CP_CARDS, known[:7])
    with pytest.raises(ValueError, match="^scores has 8 values, days 8, cards 7$"):
        metrics.card_precision_top_k(CP_SCORES, CP_LABELS, CP_DAYS, CP_CARDS[:7])


def test_alert_thresholds_count_cards_a_day_and_false_positives() -> None:
    days = np.array(["2018-08-08"] * 4 + ["2018-08-09"] * 4, dtype="datetime64[D]")
    cards = np.array([1, 1, 2, 3, 1, 2, 3, 4])
    scores = np.array([0.9, 0.1, 0.8, 0.2, 0.7, 0.6, 0.5, 0.4])
    labels = np.array([1, 0, 0, 0, 0, 1, 0, 0])
    alerts = metrics.alert_thresholds(scores, labels, days, cards, k=2, max_fpr=0.34)
    # Card-days by best score: 0.9 (1, fraud), 0.8, 0.7, 0.6 (2, fraud), 0.5, 0.4, 0.2: two a day -> 0.6.
    assert alerts["top100_cards"] == {"threshold": 0.6, "precision": 0.5, "recall": 1.0, "alerts_per_day": 2.0}
    # 6 legitimate transactions: at most 2 false positives (0.8, 0.7) -> threshold 0.6 catches both frauds.
    assert alerts["fpr_1pct"] == {"threshold": 0.6, "precision": 0.5, "recall": 1.0, "false_positive_rate": 2 / 6}
    columns = metrics.alert_columns([{"alerts": alerts}], scores)
    assert columns["alert_top100_cards"].tolist() == [True, False, True, False, True, True, False, False]
    assert metrics.alert_columns([{}], scores) == {}


def test_reliability_brier_and_calibration_error_by_hand() -> None:
    probs = np.array([0.0005, 0.0005, 0.002, 0.5, 0.7, 1.0])
    labels = np.array([0, 0, 1, 0, 1, 1])
    rows = metrics.reliability(probs, labels)
    # Bins [0, .001), [.001, .003), [.4, .6), [.6, .8), [.8, 1] (1.0 falls in the last one); empty bins left out.
    assert [(r["low"], r["high"], r["n"], r["frauds"]) for r in rows] == [
        (0.0, 0.001, 2, 0), (0.001, 0.003, 1, 1), (0.4, 0.6, 1, 0), (0.6, 0.8, 1, 1), (0.8, 1.0, 1, 1)]
    assert rows[0]["predicted"] == pytest.approx(0.0005) and rows[1]["observed"] == 1.0
    assert metrics.brier(probs, labels) == pytest.approx((2 * 0.0005**2 + 0.998**2 + 0.25 + 0.09) / 6)
    assert metrics.expected_calibration_error(probs, labels) == pytest.approx(
        (2 * 0.0005 + 0.998 + 0.5 + 0.3 + 0.0) / 6)
    assert math.isnan(metrics.brier(probs[:0], labels[:0]))
    assert math.isnan(metrics.expected_calibration_error(probs[:0], labels[:0]))


@pytest.mark.parametrize("ids", [np.array([0, 1]), np.array([2**60 + 1, 2**60 + 2])],
                         ids=["card 0", "64-bit tokens beyond float64's integers"])
def test_alert_thresholds_keep_each_card_day_apart(ids: np.ndarray) -> None:
    """The top-100-cards rule counts (day, card) pairs: two cards whose 64-bit tokens float64 cannot tell apart
    are still two card-days (a float cast would merge them, and their frauds with them)."""
    a, b = ids
    days = np.array(["2018-08-08"] * 3 + ["2018-08-09"] * 2, dtype="datetime64[D]")
    cards = np.array([a, b, b, a, b])
    scores = np.array([0.9, 0.8, 0.3, 0.7, 0.2])
    labels = np.array([0, 1, 0, 1, 0])
    # Card-days by best score: (8th, A) 0.9 legit, (8th, B) 0.8 fraud, (9th, A) 0.7 fraud, (9th, B) 0.2 legit.
    # One card a day over two days: the two best, 0.9 and 0.8, both on the 8th; one of the two frauds is found.
    alerts = metrics.alert_thresholds(scores, labels, days, cards, k=1)
    assert alerts["top100_cards"] == {"threshold": 0.8, "precision": 0.5, "recall": 0.5, "alerts_per_day": 1.0}
