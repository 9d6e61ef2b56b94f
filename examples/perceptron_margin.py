"""Perceptron updates against Novikoff's bound R^2/gamma^2 over many margins gamma.
================================================================================

    python examples/perceptron_margin.py            # 24 margins x 5 data sets, 2,000 points in R^20
    python examples/perceptron_margin.py --small    # a few margins (the smoke test)

For each margin, data in the unit ball (R <= 1) separated by a hyperplane through the origin
with margin >= gamma; the perceptron without bias (the setting of the proof in notes §1.2) runs
until it makes no mistake. Prints the largest ratio updates / bound (always <= 1) and writes
perceptron_margin.png.
"""

from __future__ import annotations

import argparse

import numpy as np

import nnkit.theory as theory
from nnkit.classic.perceptron import Perceptron, make_separable


def run(margins, n_samples, n_features, repeats, seed=0):
    """Rows (gamma, R, updates, bound) for every margin and data set."""
    rng = np.random.default_rng(seed)
    rows = []
    for margin in margins:
        for _ in range(repeats):
            X, y, w_star = make_separable(n_samples, n_features, margin, random_state=rng)
            gamma = float(np.min(y * (X @ w_star)))              # the true margin of w*
            R = float(np.max(np.linalg.norm(X, axis=1)))
            clf = Perceptron(fit_intercept=False, max_epochs=100_000).fit(X, y)
            rows.append((gamma, R, clf.n_updates_, theory.novikoff_bound(R, gamma)))
    return np.array(rows, dtype=float)


def main(argv=None) -> float:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--small", action="store_true", help="few margins, for a smoke test")
    parser.add_argument("--out", default="perceptron_margin.png")
    args = parser.parse_args(argv)
    margins = np.geomspace(0.01, 0.5, 6 if args.small else 24)
    rows = run(margins, 300 if args.small else 2000, 20, 2 if args.small else 5)
    ratio = rows[:, 2] / rows[:, 3]
    print(f"{len(rows)} runs: updates / Novikoff bound is at most {ratio.max():.3f} "
          f"(median {np.median(ratio):.3f}); within the bound in every run: {ratio.max() <= 1}")
    _plot(rows, args.out)
    return float(ratio.max())


def _plot(rows, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot")
        return
    inv = (rows[:, 1] / rows[:, 0]) ** 2                            # R^2 / gamma^2
    fig, ax = plt.subplots(figsize=(5.5, 4))
    ax.loglog(inv, rows[:, 2], "o", ms=4, alpha=0.7, label="perceptron updates")
    line = np.geomspace(inv.min(), inv.max(), 50)
    ax.loglog(line, line, "k--", label="Novikoff bound $R^2/\\gamma^2$")
    ax.set_xlabel("$R^2/\\gamma^2$")
    ax.set_ylabel("updates until no mistake")
    ax.set_title("Perceptron (no bias) on $\\gamma$-separable data in $R^{20}$")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
