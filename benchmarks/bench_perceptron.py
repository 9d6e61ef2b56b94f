"""Perceptron training on 100,000 x 100 linearly separable float64 data: nnkit vs scikit-learn.

scikit-learn's ``Perceptron(eta0=1, alpha=0, penalty=None, shuffle=False, tol=None)`` is the
same mistake-driven algorithm (w <- w + y x, b <- b + y on y (w.x + b) <= 0), so both are run
for the same number of passes (the passes nnkit needs to converge) and must reach the same
weights; the table says whether they did. Both are single-threaded; timings are medians of
interleaved runs (benchmarks/harness.py), each a whole ``fit`` (input checks included).

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_perceptron.py
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve()
N_SAMPLES, N_FEATURES, MARGIN = 100_000, 100, 0.01


def _contenders(X, y):
    from sklearn.linear_model import Perceptron as SkPerceptron

    from nnkit.classic.perceptron import Perceptron

    ours = Perceptron().fit(X, y)
    theirs = SkPerceptron(eta0=1.0, alpha=0.0, penalty=None, shuffle=False, tol=None,
                          max_iter=ours.n_iter_)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")           # sklearn warns when max_iter is reached
        same = np.allclose(theirs.fit(X, y).coef_, ours.coef_, rtol=1e-12, atol=1e-9)
    return ours, same, {"nnkit": lambda: Perceptron().fit(X, y),
                        "scikit-learn": lambda: theirs.fit(X, y)}


def run(quick: bool = False) -> list[dict]:
    sys.path.insert(0, str(HERE.parent))
    from harness import median_times

    from nnkit.classic.perceptron import make_separable

    n = N_SAMPLES // 5 if quick else N_SAMPLES
    X, y, _ = make_separable(n, N_FEATURES, MARGIN, random_state=0)
    ours, same, contenders = _contenders(X, y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        med = median_times(contenders, repeats=3 if quick else 9, warmup=1)
    work = f"perceptron fit {n}x{N_FEATURES} f64, {ours.n_iter_} passes, {ours.n_updates_} updates"
    return [{"work": work, "impl": impl, "median_ms": f"{t * 1e3:.1f}",
             "ms_per_pass": f"{t * 1e3 / ours.n_iter_:.2f}",
             "sklearn/impl": f"{med['scikit-learn'] / t:.2f}", "same_w": same, "threads": 1}
            for impl, t in med.items()]


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    sys.path.insert(0, str(HERE.parent))
    from harness import report

    report(run, argv)


if __name__ == "__main__":
    main()
