"""The logistic-regression yardstick is the fit its docstring describes, checked from outside.

Its scores on the training rows are checked against the optimality conditions of the documented objective
(class-weighted log-loss + 1e-3 x rows x squared coefficients, intercept free, on standardised inputs), and
against the properties that follow: balanced classes, invariance to a column's unit and origin, float32
features fitted in double precision, and scores strictly inside (0, 1) for any test row.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from bench import baselines
from workload.model import metrics


def _problem(n: int, n_fraud: int, separation: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Features shaped like ours: an amount (log-normal), a count typed as float, a 0/1 flag; frauds shifted."""
    rng = np.random.default_rng(seed)
    y = np.zeros(n)
    y[rng.choice(n, n_fraud, replace=False)] = 1
    x = np.c_[rng.lognormal(3.0, 1.0, n) * (1 + separation * y),
              rng.poisson(4, n).astype(np.float64) + separation * 3 * y,
              (rng.random(n) < 0.3 + 0.4 * y).astype(np.float64)]
    return x, y


PROBLEMS = {
    "overlapping classes": _problem(60, 9, 0.7, 1),
    "a single fraud": _problem(40, 1, 1.0, 2),
    "a single legit row": (lambda xy: (xy[0], 1 - xy[1]))(_problem(30, 1, 1.0, 3)),
    "separable (only the ridge keeps it finite)": _problem(40, 6, 6.0, 4),
}


def _standardised(x: np.ndarray) -> np.ndarray:
    return np.c_[(x - x.mean(axis=0)) / x.std(axis=0), np.ones(len(x))]


@pytest.mark.parametrize("name", PROBLEMS)
def test_scores_minimise_the_documented_objective(name: str) -> None:
    x, y = PROBLEMS[name]
    p = baselines.logistic_regression_baseline(x, y, x)
    design = _standardised(x)
    # The scores are a logistic function of the standardised features: recover its coefficients.
    coef, *_ = np.linalg.lstsq(design, np.log(p / (1 - p)), rcond=None)
    np.testing.assert_allclose(design @ coef, np.log(p / (1 - p)), atol=1e-6)
    n, n_fraud = len(y), y.sum()
    weight = np.where(y == 1, n / (2 * n_fraud), n / (2 * (n - n_fraud)))  # each class weighs n/2 in all
    penalty = 1e-3 * n * np.r_[coef[:-1], 0.0]  # gradient of 1e-3 * n / 2 * |coef|^2, the intercept not shrunk
    gradient = design.T @ (weight * (p - y)) + penalty
    assert np.abs(gradient).max() < 1e-6 * n, gradient


@pytest.mark.parametrize("name", PROBLEMS)
def test_class_weighting_balances_the_classes(name: str) -> None:
    """With each class weighing half and a free intercept, the mean fraud score and the mean legit score
    add up to exactly one on the training rows (the intercept's optimality condition)."""
    x, y = PROBLEMS[name]
    p = baselines.logistic_regression_baseline(x, y, x)
    assert p[y == 1].mean() + p[y == 0].mean() == pytest.approx(1.0, abs=1e-7)


def test_a_columns_unit_and_origin_do_not_matter() -> None:
    x, y = PROBLEMS["overlapping classes"]
    x_test = _problem(50, 10, 0.7, 9)[0]
    scores = baselines.logistic_regression_baseline(x, y, x_test)
    scale, shift = np.array([0.01, 1000.0, 3.0]), np.array([500.0, -7.0, 2.0])  # cents, a count in thousands
    moved = baselines.logistic_regression_baseline(x * scale + shift, y, x_test * scale + shift)
    np.testing.assert_allclose(moved, scores, rtol=1e-9)
    # A constant column (a flag no training row sets) adds nothing.
    constant = baselines.logistic_regression_baseline(np.c_[x, np.full(len(x), 4.0)], y,
                                                    np.c_[x_test, np.full(len(x_test), 4.0)])
    np.testing.assert_allclose(constant, scores, rtol=1e-9)


def test_float32_features_are_fitted_in_double_precision() -> None:
    """The features come as float32 (features.compute): the fit is that of their float64 values."""
    x, y = PROBLEMS["overlapping classes"]
    x32 = (x * 1.37).astype(np.float32)
    exact = baselines.logistic_regression_baseline(x32.astype(np.float64), y, x32.astype(np.float64))
    np.testing.assert_array_equal(baselines.logistic_regression_baseline(x32, y.astype(np.float32), x32), exact)
    np.testing.assert_array_equal(baselines.logistic_regression_baseline(x32, y.astype(int), x32), exact)


def test_far_out_test_rows_score_strictly_inside_zero_and_one_without_warnings() -> None:
    """A test row far outside the training range (an amount of 1e12) must not overflow exp(): no numpy
    warning in the log, and a probability a log-loss can take (never exactly 0 or 1)."""
    x, y = PROBLEMS["overlapping classes"]
    far = np.array([[1e12, 4.0, 1.0], [-1e12, 4.0, 1.0], [30.0, 1e9, 0.0], [30.0, -1e9, 0.0]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        scores = baselines.logistic_regression_baseline(x, y, far)
    assert np.all((scores > 0) & (scores < 1)), scores
    assert scores[0] != scores[1] and scores[2] != scores[3]


def test_logistic_regression_baseline_learns_a_rare_class() -> None:
    rng = np.random.default_rng(0)
    n = 20000
    y = (rng.random(n) < 0.02).astype(np.float32)
    shift = np.array([2.0, 0.0, -1.0])
    x = np.c_[rng.normal(size=(n, 3)) + y[:, None] * shift, np.ones(n)]  # a constant column too
    x_test = np.c_[rng.normal(size=(n, 3)), np.ones(n)]
    y_test = (rng.random(n) < 0.02).astype(np.float32)
    x_test[:, :3] += y_test[:, None] * shift
    scores = baselines.logistic_regression_baseline(x, y, x_test, seed=0)
    assert scores.shape == (n,) and np.all((scores >= 0) & (scores <= 1))
    assert metrics.roc_auc(scores, y_test) > 0.9
    # Class weighting: frauds get probabilities above one half, not squashed to the base rate.
    assert np.median(scores[y_test == 1]) > 0.5
    np.testing.assert_array_equal(scores, baselines.logistic_regression_baseline(x, y, x_test, seed=0))
