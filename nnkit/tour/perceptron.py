"""The perceptron's section of ``nnkit tour``: theory checked against runs, in about a second.

Rows: perceptron updates against Novikoff's bound on separable data (no bias, as the proof),
his two lemmas at every update of those runs, Cover's count against a linear-programming
brute force, and XOR's non-convergence. With
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
    """(R, gamma, updates) per margin, perceptron without bias on make_separable data, and the
    lemmas' slack over all updates of all runs: min_t (w*^T w_t - t gamma) / (t gamma) (Lemma
    1.1, >= 0) and max_t (||w_t|| - R sqrt t) / (R sqrt t) (Lemma 1.2, <= 0), t >= 1."""
    out, slack_1, slack_2 = [], np.inf, -np.inf
    for i, margin in enumerate(margins):
        X, y, w_star = make_separable(n_samples, n_features, margin, random_state=seed + i)
        clf = Perceptron(fit_intercept=False, max_epochs=100_000, record_path=True).fit(X, y)
        lem = theory.novikoff_lemmas(clf.coef_path_, X, y, w_star)
        out.append((lem.R, lem.gamma, clf.n_updates_))
        a, ab, nm, nb = (v[1:] for v in (lem.alignment, lem.alignment_bound, lem.norm,
                                          lem.norm_bound))
        if a.size:
            slack_1 = min(slack_1, float(np.min((a - ab) / ab)))
            slack_2 = max(slack_2, float(np.max((nm - nb) / nb)))
    return out, (slack_1, slack_2)


def perceptron_section(ctx) -> list[dict]:
    """Rows for the tour table (keys section, result, value, target, ok)."""
    margins = np.geomspace(0.02, 0.5, 6 if ctx.quick else 16)
    runs, (slack_1, slack_2) = _novikoff_runs(margins, 500 if ctx.quick else 2000, 10,
                                              ctx.seed)
    n_updates = sum(u for _, _, u in runs)
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
        tour_row(SECTION, f"Lemmas 1.1 / 1.2 at all {n_updates} updates: slack",
                 f"{slack_1:+.3f} / {slack_2:+.3f}",
                 "w*.w_t >= t gamma / ||w_t|| <= R sqrt t: >= 0 / <= 0",
                 slack_1 >= 0 and slack_2 <= 0),
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
