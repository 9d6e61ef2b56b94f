"""The perceptron's section of ``nnkit tour``: theory checked against runs, in about a second.

Rows: perceptron updates against Novikoff's bound on separable data (no bias, as the proof),
Cover's count against a linear-programming brute force, and XOR's non-convergence. With
plots on, ``perceptron_novikoff.png`` shows updates against R^2/gamma^2 over margins.
"""

from __future__ import annotations

import itertools
import warnings

import numpy as np
from scipy.optimize import linprog
from sklearn.exceptions import ConvergenceWarning

from .. import theory
from ..classic.perceptron import Perceptron, make_separable
from .common import tour_row

__all__ = ["perceptron_section", "count_separable_dichotomies"]

SECTION = "Perceptron"


def count_separable_dichotomies(X) -> int:
    """Labellings y in {-1, +1}^s of the rows of ``X`` (s, n) with some w: y_i w^T x_i > 0.

    Brute force: one feasibility linear program (y_i w^T x_i >= 1, by scaling) per labelling,
    2^s programs; compare with ``nnkit.theory.cover_count(s, n)`` for points in general position.
    """
    s, n = X.shape
    count = 0
    for labels in itertools.product([-1.0, 1.0], repeat=s):
        y = np.array(labels)
        res = linprog(np.zeros(n), A_ub=-(y[:, None] * X), b_ub=-np.ones(s),
                      bounds=[(None, None)] * n, method="highs")
        count += res.status == 0
    return count


def _novikoff_runs(margins, n_samples, n_features, seed):
    """(R^2/gamma^2, updates) per margin: perceptron without bias on make_separable data."""
    out = []
    for i, margin in enumerate(margins):
        X, y, w_star = make_separable(n_samples, n_features, margin, random_state=seed + i)
        gamma = float(np.min(y * (X @ w_star)))
        R = float(np.max(np.linalg.norm(X, axis=1)))
        clf = Perceptron(fit_intercept=False, max_epochs=100_000).fit(X, y)
        out.append((R, gamma, clf.n_updates_))
    return out


def perceptron_section(ctx) -> list[dict]:
    """Rows for the tour table (keys section, result, value, target, ok)."""
    margins = np.geomspace(0.02, 0.5, 6 if ctx.quick else 16)
    runs = _novikoff_runs(margins, 500 if ctx.quick else 2000, 10, ctx.seed)
    worst = max(u / theory.novikoff_bound(R, g) for R, g, u in runs)
    R, gamma, updates = runs[0]
    s, n = (6, 3) if ctx.quick else (9, 3)
    X = np.random.default_rng(ctx.seed).standard_normal((s, n))
    counted = count_separable_dichotomies(X)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        xor = Perceptron(max_epochs=100).fit([[0, 0], [1, 1], [0, 1], [1, 0]], [1, 1, -1, -1])
    warned = any(issubclass(w.category, ConvergenceWarning) for w in caught)
    if ctx.plots:
        _plot(runs, ctx.out_dir / "perceptron_novikoff.png")
    bound, cover = theory.novikoff_bound(R, gamma), theory.cover_count(s, n)
    return [
        tour_row(SECTION, f"updates, gamma={gamma:.3f} (no bias)", str(updates),
                 f"<= R^2/gamma^2 = {bound}", updates <= bound),
        tour_row(SECTION, f"max updates / bound over {len(runs)} margins", f"{worst:.3f}",
                 "<= 1", worst <= 1),
        tour_row(SECTION, f"separable dichotomies, s={s} n={n} (LP)", str(counted),
                 f"= cover_count = {cover}", counted == cover),
        tour_row(SECTION, "XOR after 100 epochs", f"converged={xor.converged_}",
                 "False + ConvergenceWarning", (not xor.converged_) and warned),
    ]


def _plot(runs, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    inv = np.array([(R / g) ** 2 for R, g, _ in runs])
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.loglog(inv, [u for _, _, u in runs], "o", label="perceptron updates")
    ax.loglog(inv, inv, "k--", label="Novikoff bound")
    ax.set_xlabel("$R^2/\\gamma^2$")
    ax.set_ylabel("updates")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
