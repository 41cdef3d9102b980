"""Fitting a user vector lambda from preference-pair features (device side of CARD).

The reward is linear in lambda, `R(y) = lambda . g(y)`, so the Bradley-Terry loss over pairs is a
logistic regression on `d_i = g(y+_i) - g(y-_i)` with every label positive and no intercept,
regularised towards a prior `lambda_0 = w * lambda_c` (a multiple of the cluster's default vector):

    minimise  sum_i log(1 + exp(-lambda . d_i)) + (c / 2) ||lambda - lambda_0||^2

The device uses w = 0 (`DEFAULT_PRIOR_WEIGHT`), a plain L2 shrink towards zero. Shrinking towards the
cluster default (w = 1) was the first design, but the published defaults already rank ~95% of a new
author's pairs correctly with large margins, so the loss is flat there and the "fitted" vector stayed
the default to seven digits, for every test author; decoding with it also lowered ROUGE. Measured in
docs/RESULTS.md. scikit-learn's LogisticRegression cannot shrink towards a non-zero prior, so this
solves the convex problem with L-BFGS (scipy, which scikit-learn depends on). This module knows
nothing of models or files.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DEFAULT_REGULARISATION = 1.0
DEFAULT_PRIOR_WEIGHT = 0.0  # lambda_0 = w * cluster default; 0 = shrink towards zero (see the docstring)


@dataclass
class VectorFit:
    """A fitted vector and how well it ranks pairs."""

    vector: np.ndarray
    regularisation: float
    train_accuracy: float
    heldout_accuracy: float | None
    heldout_accuracy_default: float | None
    n_train: int
    n_heldout: int


def pair_accuracy(differences: np.ndarray, vector: np.ndarray) -> float:
    """Fraction of pairs with R(y+) > R(y-), i.e. lambda . d > 0."""
    if len(differences) == 0:
        return float("nan")
    return float(np.mean(differences @ vector > 0))


def fit_vector(differences: np.ndarray, prior: np.ndarray, regularisation: float) -> np.ndarray:
    """The lambda minimising the regularised Bradley-Terry loss (convex; L-BFGS converges globally)."""
    from scipy.optimize import minimize  # here, not at the top: scipy adds ~0.3 s to every command's start

    d = np.asarray(differences, dtype=np.float64)
    lambda_0 = np.asarray(prior, dtype=np.float64)

    def loss_and_gradient(lam: np.ndarray) -> tuple[float, np.ndarray]:
        margins = d @ lam
        loss = np.logaddexp(0.0, -margins).sum() + 0.5 * regularisation * np.sum((lam - lambda_0) ** 2)
        weights = -0.5 * (1.0 - np.tanh(0.5 * margins))  # = -sigmoid(-margin), stable
        gradient = d.T @ weights + regularisation * (lam - lambda_0)
        return float(loss), gradient

    result = minimize(
        loss_and_gradient, lambda_0.copy(), jac=True, method="L-BFGS-B", options={"maxiter": 500}
    )
    return result.x.astype(np.float32)


def fit_with_heldout(
    differences: np.ndarray,
    prior: np.ndarray,
    *,
    regularisation: float = DEFAULT_REGULARISATION,
    heldout_fraction: float = 0.25,
    min_heldout: int = 2,
    seed: int = 0,
    reference: np.ndarray | None = None,
) -> VectorFit:
    """Measure on a held-out split (when there are enough pairs), then refit on all pairs.

    The regularisation is fixed rather than tuned on the split, so the held-out accuracy is an
    honest estimate rather than the best of several tries. `reference` (default: the prior) is the
    vector whose held-out accuracy is reported next to the fitted one, e.g. the cluster default.
    """
    d = np.asarray(differences, dtype=np.float32)
    prior = np.asarray(prior, dtype=np.float32)
    n = len(d)
    n_heldout = int(round(n * heldout_fraction))
    heldout_accuracy = heldout_accuracy_default = None
    if n_heldout >= min_heldout and n - n_heldout >= 2:
        order = np.random.default_rng(seed).permutation(n)
        heldout, train = d[order[:n_heldout]], d[order[n_heldout:]]
        heldout_accuracy = pair_accuracy(heldout, fit_vector(train, prior, regularisation))
        heldout_accuracy_default = pair_accuracy(heldout, prior if reference is None else reference)
    else:
        n_heldout = 0
    vector = fit_vector(d, prior, regularisation)
    return VectorFit(
        vector=vector,
        regularisation=regularisation,
        train_accuracy=pair_accuracy(d, vector),
        heldout_accuracy=heldout_accuracy,
        heldout_accuracy_default=heldout_accuracy_default,
        n_train=n - n_heldout,
        n_heldout=n_heldout,
    )
