"""Yardsticks the trained network must beat, for `make bench` (bench/quality.py) only: no worker runs them.

`logistic_regression_baseline` lived in workload/model/metrics.py while nothing in the product called it.
"""

from __future__ import annotations

import numpy as np


def logistic_regression_baseline(
    x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray, *, seed: int = 0
) -> np.ndarray:
    """Scores of a class-weighted, lightly L2-regularised logistic regression on standardised inputs.

    The yardstick the trained network must beat. It minimises the log-loss with each class weighing half
    of the rows, plus ``1e-3 * rows / 2`` times the squared coefficients of the standardised features (the
    intercept is free), computed in float64 whatever the input's dtype. Scores lie strictly inside (0, 1):
    logits are clipped to +-30, so exp() never overflows and a log-loss stays finite. Fitted by Newton's
    method (full batch), which is deterministic and converges in a few steps on a few dozen features;
    ``seed`` is accepted for symmetry with the trainer and unused.
    """
    del seed
    x = np.asarray(x_train, dtype=np.float64)
    y = (np.asarray(y_train, dtype=np.float64).ravel() > 0.5).astype(np.float64)
    mean = x.mean(axis=0)
    std = x.std(axis=0)
    std[std == 0] = 1.0
    design = np.c_[(x - mean) / std, np.ones(len(x))]
    n_pos = y.sum()
    n_neg = len(y) - n_pos
    weight = np.where(y == 1, len(y) / (2 * max(n_pos, 1)), len(y) / (2 * max(n_neg, 1)))
    ridge = 1e-3 * len(y) * np.eye(design.shape[1])
    ridge[-1, -1] = 0.0  # the intercept is not shrunk
    coef = np.zeros(design.shape[1])
    for _ in range(50):
        p = 1 / (1 + np.exp(-np.clip(design @ coef, -30, 30)))
        gradient = design.T @ (weight * (p - y)) + ridge @ coef
        hessian = (design * (weight * p * (1 - p))[:, None]).T @ design + ridge
        step = np.linalg.solve(hessian + 1e-9 * np.eye(len(coef)), gradient)
        coef -= step
        if np.abs(step).max() < 1e-8:
            break
    test = (np.asarray(x_test, dtype=np.float64) - mean) / std
    return 1 / (1 + np.exp(-np.clip(np.c_[test, np.ones(len(test))] @ coef, -30, 30)))
