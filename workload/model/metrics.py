"""Evaluation for rare-event detection, in numpy only.

Fraud is a few percent of transactions or less, so accuracy mostly measures the base rate. The
figures that matter are ranking ones: average precision (area under the precision-recall curve, as
scikit-learn's ``average_precision_score`` computes it), ROC AUC, Card Precision@100 (the field's
figure: of the 100 cards an investigator checks each day, the share that had fraud), the precision
of the 100 top transactions a day, and recall at 1% false-positive rate. Undefined figures (no
fraud, or nothing but fraud) are ``nan``, never an exception: a test day can be like that.
"""

from __future__ import annotations

import numpy as np

TOP_K = 100
MAX_FPR = 0.01
THRESHOLD = 0.5


def _curve(scores: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Cumulative (true positives, false positives) at each distinct score, highest score first."""
    order = np.argsort(-scores, kind="mergesort")
    s, y = scores[order], labels[order]
    last_of_tie = np.r_[np.nonzero(np.diff(s))[0], len(s) - 1]
    tps = np.cumsum(y)[last_of_tie]
    fps = last_of_tie + 1 - tps
    return tps.astype(np.float64), fps.astype(np.float64)


def _as_arrays(scores: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    scores = np.asarray(scores, dtype=np.float64).ravel()
    labels = np.asarray(labels, dtype=np.float64).ravel()
    if scores.shape != labels.shape:
        raise ValueError(f"scores has {scores.size} values, labels has {labels.size}")
    return scores, (labels > 0.5).astype(np.float64)


def pr_curve(scores: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(precision, recall) at each distinct threshold, highest first, starting at (1, 0).

    Empty arrays when there is no fraud (recall undefined).
    """
    scores, labels = _as_arrays(scores, labels)
    if labels.sum() == 0:
        return np.zeros(0), np.zeros(0)
    tps, fps = _curve(scores, labels)
    return np.r_[1.0, tps / (tps + fps)], np.r_[0.0, tps / tps[-1]]


def average_precision(scores: np.ndarray, labels: np.ndarray) -> float:
    """Step-wise area under the precision-recall curve: sum over thresholds of dRecall * precision."""
    scores, labels = _as_arrays(scores, labels)
    if labels.sum() == 0:
        return float("nan")
    tps, fps = _curve(scores, labels)
    recall = tps / tps[-1]
    precision = tps / (tps + fps)
    return float(np.sum(np.diff(np.r_[0.0, recall]) * precision))


def _average_ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks with ties given their average rank (Mann-Whitney convention)."""
    order = np.argsort(values, kind="mergesort")
    sorted_values = values[order]
    boundaries = np.r_[0, np.nonzero(np.diff(sorted_values))[0] + 1, len(values)]
    tie_mean = (boundaries[:-1] + boundaries[1:] + 1) / 2.0  # mean of ranks start+1 .. end
    ranks = np.empty(len(values), dtype=np.float64)
    ranks[order] = np.repeat(tie_mean, np.diff(boundaries))
    return ranks


def roc_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Probability that a random fraud scores above a random legit one, ties counting one half."""
    scores, labels = _as_arrays(scores, labels)
    n_pos = labels.sum()
    n_neg = len(labels) - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    rank_sum = _average_ranks(scores)[labels == 1].sum()
    return float((rank_sum - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def recall_at_fpr(scores: np.ndarray, labels: np.ndarray, max_fpr: float = MAX_FPR) -> float:
    """Highest recall among thresholds whose false-positive rate stays within ``max_fpr``."""
    scores, labels = _as_arrays(scores, labels)
    n_pos = labels.sum()
    n_neg = len(labels) - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    tps, fps = _curve(scores, labels)
    allowed = fps / n_neg <= max_fpr
    return float(tps[allowed].max() / n_pos) if allowed.any() else 0.0


def precision_top_k(scores: np.ndarray, labels: np.ndarray, days: np.ndarray, k: int = TOP_K) -> float:
    """Mean over days of the fraud share among the day's ``k`` highest scores (all rows if fewer).

    Ties at the k-th place go to the earlier rows (rows come in time order), so the figure is reproducible.
    """
    scores, labels = _as_arrays(scores, labels)
    days = np.asarray(days).ravel()
    if len(scores) == 0:
        return float("nan")
    per_day = []
    for day in np.unique(days):
        rows = np.nonzero(days == day)[0]
        top = rows[np.argsort(-scores[rows], kind="mergesort")[:k]]
        per_day.append(labels[top].mean())
    return float(np.mean(per_day))


def card_precision_top_k(scores: np.ndarray, labels: np.ndarray, days: np.ndarray, cards: np.ndarray,
                         k: int = TOP_K, drop_detected: bool = False) -> float:
    """Card Precision@k (the handbook's CP@k): per day, a card scores its highest transaction score and
    is fraudulent if any of its transactions that day is; precision is the number of fraudulent
    cards among the ``k`` best-scored ones, over ``k`` (an investigator checks k cards a day, even
    when fewer were active); the mean over days. Ties go to the lower card id.

    ``drop_detected``: as the handbook computes it over a test period, a card found on one day (in
    the top k and fraudulent) is blocked, so its later transactions are left out of later days.
    """
    scores, labels = _as_arrays(scores, labels)
    days, cards = np.asarray(days).ravel(), np.asarray(cards).ravel()
    if not len(scores) == len(days) == len(cards):
        raise ValueError(f"scores has {len(scores)} values, days {len(days)}, cards {len(cards)}")
    if len(scores) == 0:
        return float("nan")
    detected = np.zeros(0, dtype=cards.dtype)
    per_day = []
    for day in np.unique(days):
        rows = np.nonzero((days == day) & ~np.isin(cards, detected))[0]
        card_ids, inverse = np.unique(cards[rows], return_inverse=True)
        best = np.full(len(card_ids), -np.inf)
        np.maximum.at(best, inverse, scores[rows])
        fraud = np.zeros(len(card_ids))
        np.maximum.at(fraud, inverse, labels[rows])
        top = np.argsort(-best, kind="mergesort")[:k]  # card ids ascend: ties keep the lower id first
        per_day.append(fraud[top].sum() / k)
        if drop_detected:
            detected = np.union1d(detected, card_ids[top][fraud[top] == 1])
    return float(np.mean(per_day))


def evaluate(scores: np.ndarray, labels: np.ndarray, days: np.ndarray, cards: np.ndarray | None = None,
             known: np.ndarray | None = None) -> dict[str, float]:
    """All report figures as plain floats (JSON- and ``torch.save(weights_only=True)``-friendly).

    With ``known`` (a row's card already had a fraud confirmed by its time minus the label delay),
    the figures are the handbook's: those rows leave the test set, as an investigator would not be
    shown a card that is already blocked, and card precision drops the cards it detects day by day.
    Without ``cards``, card precision is ``nan``.
    """
    scores, binary = _as_arrays(scores, labels)
    days = np.asarray(days).ravel()
    handbook = known is not None
    if handbook:
        keep = ~np.asarray(known, dtype=bool).ravel()
        if len(keep) != len(scores):
            raise ValueError(f"scores has {len(scores)} values, known has {len(keep)}")
        scores, binary, days = scores[keep], binary[keep], days[keep]
        cards = None if cards is None else np.asarray(cards).ravel()[keep]
    n = len(binary)
    n_fraud = float(binary.sum())
    return {
        "average_precision": average_precision(scores, binary),
        "roc_auc": roc_auc(scores, binary),
        "card_precision_top100": (float("nan") if cards is None else
                                  card_precision_top_k(scores, binary, days, cards, drop_detected=handbook)),
        "precision_top100": precision_top_k(scores, binary, days),
        "recall_at_1pct_fpr": recall_at_fpr(scores, binary),
        "accuracy": float(np.mean((scores >= THRESHOLD) == (binary == 1))) if n else float("nan"),
        "base_rate": n_fraud / n if n else float("nan"),
        "n": float(n),
        "n_fraud": n_fraud,
    }


# -- probabilities: are they right, and where would an analyst set the alert? -------------------------
# Predicted-probability bins of the reliability table (and of the expected calibration error): fine at
# the bottom, where almost every transaction lies, coarse at the top, where the alerts are.
RELIABILITY_BINS = (0.0, 0.001, 0.003, 0.01, 0.03, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0)


def reliability(probs: np.ndarray, labels: np.ndarray) -> list[dict[str, float]]:
    """Per bin of predicted probability [low, high) (the last one holds 1.0): rows, frauds, the mean
    prediction and the observed fraud rate. Empty bins are left out."""
    probs, labels = _as_arrays(probs, labels)
    edges = np.asarray(RELIABILITY_BINS)
    which = np.clip(np.searchsorted(edges, probs, side="right") - 1, 0, len(edges) - 2)
    rows = []
    for b in range(len(edges) - 1):
        inside = which == b
        n = int(inside.sum())
        if n:
            rows.append({"low": float(edges[b]), "high": float(edges[b + 1]), "n": float(n),
                         "frauds": float(labels[inside].sum()), "predicted": float(probs[inside].mean()),
                         "observed": float(labels[inside].mean())})
    return rows


def brier(probs: np.ndarray, labels: np.ndarray) -> float:
    """Mean squared error of the probabilities (nan without rows)."""
    probs, labels = _as_arrays(probs, labels)
    return float(np.mean((probs - labels) ** 2)) if len(probs) else float("nan")


def expected_calibration_error(probs: np.ndarray, labels: np.ndarray) -> float:
    """Row-weighted mean gap between predicted and observed fraud rate over the reliability bins."""
    rows = reliability(probs, labels)
    n = sum(r["n"] for r in rows)
    return float(sum(r["n"] * abs(r["predicted"] - r["observed"]) for r in rows) / n) if n else float("nan")


def _day_card_pairs(days: np.ndarray, cards: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct (day, card) pairs in (day, card) order, as their days, and each row's pair index: what
    ``np.unique(np.c_[days, cards], axis=0, return_inverse=True)`` gives, ten times faster (one lexsort instead
    of sorting rows as opaque records: seconds a day on a loaded machine, in every report)."""
    order = np.lexsort((cards, days))
    sorted_days, sorted_cards = days[order], cards[order]
    first = np.ones(len(days), dtype=bool)  # a pair starts where the day or the card changes
    first[1:] = (sorted_days[1:] != sorted_days[:-1]) | (sorted_cards[1:] != sorted_cards[:-1])
    inverse = np.empty(len(days), dtype=np.int64)
    inverse[order] = np.cumsum(first) - 1
    return sorted_days[first], inverse


def alert_thresholds(scores: np.ndarray, labels: np.ndarray, days: np.ndarray, cards: np.ndarray,
                     k: int = TOP_K, max_fpr: float = MAX_FPR) -> dict[str, dict[str, float]]:
    """Two alert rules an analyst can adopt, each a score threshold (alert when score >= threshold)
    with the precision and recall it had on these (test) days:

    - ``top100_cards``: the threshold that alerts ``k`` cards a day on average (a card alerts on a day
      when its best transaction does); precision and recall over (day, card) pairs;
    - ``fpr_1pct``: the lowest threshold whose false-positive rate over transactions stays within
      ``max_fpr`` (the highest recall it allows); precision and recall over transactions.
    A threshold of inf alerts nothing (no threshold qualifies)."""
    scores, labels = _as_arrays(scores, labels)
    days, cards = np.asarray(days).ravel(), np.asarray(cards).ravel()
    nan = float("nan")
    out = {"top100_cards": {"threshold": nan, "precision": nan, "recall": nan, "alerts_per_day": nan},
           "fpr_1pct": {"threshold": nan, "precision": nan, "recall": nan, "false_positive_rate": nan}}
    if len(scores) == 0:
        return out
    pair_days, inverse = _day_card_pairs(days.astype("datetime64[D]").astype(np.int64), cards.astype(np.int64))
    best = np.full(len(pair_days), -np.inf)
    np.maximum.at(best, inverse, scores)
    fraud = np.zeros(len(pair_days))
    np.maximum.at(fraud, inverse, labels)
    n_days = len(np.unique(pair_days))
    threshold = float(np.sort(best)[::-1][min(k * n_days, len(best)) - 1])
    alerted = best >= threshold
    out["top100_cards"] = {"threshold": threshold, "precision": float(fraud[alerted].mean()),
                           "recall": float(fraud[alerted].sum() / fraud.sum()) if fraud.sum() else nan,
                           "alerts_per_day": float(alerted.sum() / n_days)}
    n_pos, n_neg = labels.sum(), len(labels) - labels.sum()
    if n_pos and n_neg:
        tps, fps = _curve(scores, labels)
        allowed = np.nonzero(fps / n_neg <= max_fpr)[0]
        if len(allowed):
            i = allowed[-1]
            out["fpr_1pct"] = {"threshold": float(np.sort(scores)[::-1][int(tps[i] + fps[i]) - 1]),
                               "precision": float(tps[i] / (tps[i] + fps[i])), "recall": float(tps[i] / n_pos),
                               "false_positive_rate": float(fps[i] / n_neg)}
        else:
            out["fpr_1pct"] = {"threshold": float("inf"), "precision": nan, "recall": 0.0, "false_positive_rate": 0.0}
    return out


ALERT_COLUMNS = {"top100_cards": "alert_top100_cards", "fpr_1pct": "alert_1pct_fpr"}


def alert_columns(history: list[dict], scores: np.ndarray) -> dict[str, np.ndarray]:
    """For `score`: whether each score would alert under the newest model's thresholds (the last
    history entry's), one boolean column per rule; {} for a model that has none (an older format)."""
    alerts = history[-1].get("alerts") if history else None
    if not alerts:
        return {}
    scores = np.asarray(scores, dtype=np.float64)
    return {column: scores >= float(alerts[rule]["threshold"]) for rule, column in ALERT_COLUMNS.items()}
