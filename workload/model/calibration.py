"""Scores that are probabilities: Platt scaling fitted on the newest labelled days old enough to use.

Class weighting (fraud weighs up to 25x in the loss) makes the network's raw scores rank well but
overstate fraud roughly 25-fold; a fraud team sets alert rules from these numbers. The fix is two
numbers per model, ``p = sigmoid(scale * logit + shift)``, fitted by logistic regression on the
raw logits of labelled days. Monotone, so every ranking figure (AP, ROC AUC, CP@100) is unchanged.

Which days: the newest ``CALIBRATION_DAYS`` training days the run has applied whose labels are at
least the label delay old when the first test day starts (to the second, as the features read
labels). A test day is never used, nor a label younger than the delay: the calibration is fitted on
what a bank would know on the day it scores. With no such day, the model stays uncalibrated (scale
1, shift 0), and the report says so.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from workload.data import dataset as ds
from workload.data import features
from workload.data.dayfile import TESTING
from workload.model import metrics

CALIBRATION_DAYS = 7
IDENTITY = {"scale": 1.0, "shift": 0.0}


def _newton(design: np.ndarray, y: np.ndarray, start: np.ndarray, ridge: float,
            offset: np.ndarray | float = 0.0) -> np.ndarray:
    """Logistic regression of `y` on `design` (plus a fixed `offset`) from `start`, shrunk towards
    `start` by a tiny ridge (keeps a separable day finite).

    Newton's method with step halving: a full step is taken whenever it lowers the penalised log-loss
    (near the optimum it always does, and the iteration converges quadratically), else it is halved
    until it does. Full steps alone can overshoot on wide logits and cycle or diverge: a week of
    logits spread over tens of units fitted a scale in the millions."""
    coef = start.copy()
    weight = ridge * len(y)
    penalty = weight * np.eye(len(coef))

    def loss(c: np.ndarray) -> float:  # log(1 + e^eta) - y * eta, summed, without overflow
        eta = design @ c + offset
        return float(np.sum(np.logaddexp(0.0, eta) - y * eta) + weight / 2 * np.sum((c - start) ** 2))

    current = loss(coef)
    for _ in range(100):
        p = 1 / (1 + np.exp(-np.clip(design @ coef + offset, -35, 35)))
        gradient = design.T @ (p - y) + penalty @ (coef - start)
        hessian = (design * (p * (1 - p))[:, None]).T @ design + penalty
        step = np.linalg.solve(hessian, gradient)
        # Halve until the loss does not rise (rounding allowed for at the optimum); 60 halvings reach 1e-18.
        for halvings in range(61):
            tried = loss(coef - step)
            if tried <= current + 1e-12 * abs(current) or halvings == 60:
                break
            step = step / 2
        coef -= step
        current = tried
        if np.abs(step).max() < 1e-10:
            break
    return coef


def fit_platt(logits: np.ndarray, labels: np.ndarray, ridge: float = 1e-6) -> tuple[float, float]:
    """(scale, shift) minimising the log-loss of sigmoid(scale * logit + shift), by Newton's method in
    float64 (deterministic, a few steps). A scale that comes out <= 0 (a model that does not rank yet,
    like a first day's) would reverse or flatten the ranking: then only the shift is fitted."""
    z = np.asarray(logits, dtype=np.float64).ravel()
    y = (np.asarray(labels, dtype=np.float64).ravel() > 0.5).astype(np.float64)
    if len(y) == 0 or y.sum() == 0 or y.sum() == len(y):
        return IDENTITY["scale"], IDENTITY["shift"]
    scale, shift = _newton(np.c_[z, np.ones_like(z)], y, np.array([1.0, 0.0]), ridge)
    if scale > 0:
        return float(scale), float(shift)
    (shift,) = _newton(np.ones((len(y), 1)), y, np.array([0.0]), ridge, offset=z)
    return 1.0, float(shift)


def eligible_days(data: ds.Dataset, applied: list[str]) -> list[str]:
    """The newest `CALIBRATION_DAYS` of `applied` whose last transaction is at least the label delay
    before the first test transaction (all of them when the dataset has no test day), oldest first.
    The cutoff alone keeps every test day out: a test day ends after the first test transaction."""
    tests = [pd.Timestamp(f["first"]) for f in data.files if f["role"] == TESTING]
    cutoff = min(tests) - pd.Timedelta(seconds=features.LABEL_DELAY_SECONDS) if tests else None
    entries = [data.known_entry(rel) for rel in dict.fromkeys(applied)]
    usable = [e for e in entries if cutoff is None or data.last_time(e["path"]) <= cutoff]
    usable.sort(key=lambda e: (e["first"], e["path"]))
    return [e["path"] for e in usable[-CALIBRATION_DAYS:]]


def refit(trainer: Any, data: ds.Dataset, shard: str) -> list[str]:
    """Fit `trainer`'s calibration on the eligible days among those it applied and `shard` (just
    trained); returns the days used ([] leaves it uncalibrated)."""
    days = eligible_days(data, [*trainer.applied, shard])
    if not days:
        trainer.set_calibration(*IDENTITY.values())
        return []
    examples = data.examples(days)
    trainer.set_calibration(*fit_platt(trainer.logits(examples.x), examples.y))
    return days


def assess(trainer: Any, test: ds.Examples, scores: np.ndarray, days: list[str],
           raw: np.ndarray | None = None) -> dict[str, Any]:
    """The history entry's calibration and alert figures on the test days (plain numbers and lists:
    checkpoint- and JSON-friendly): the days and the two numbers fitted, Brier score, expected
    calibration error and reliability table before (`_raw`) and after calibration, and the alert
    thresholds of the calibrated `scores`. `raw`: the uncalibrated scores, when the caller has them
    (scored here otherwise: a second pass over the test days)."""
    raw = trainer.score(test.x, calibrated=False) if raw is None else raw
    return {
        "calibration_days": list(days),
        "calibration_scale": float(trainer.calibration["scale"]),
        "calibration_shift": float(trainer.calibration["shift"]),
        "brier_raw": metrics.brier(raw, test.y), "brier": metrics.brier(scores, test.y),
        "ece_raw": metrics.expected_calibration_error(raw, test.y),
        "ece": metrics.expected_calibration_error(scores, test.y),
        "reliability_raw": metrics.reliability(raw, test.y), "reliability": metrics.reliability(scores, test.y),
        "alerts": metrics.alert_thresholds(scores, test.y, test.day, test.card),
    }
