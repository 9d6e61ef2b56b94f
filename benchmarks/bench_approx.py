"""nk.approx targets, not timed tests:

* ``count_linear_regions`` of a one-hidden-layer ReLU net with m = 64 units on a 2-D box,
  exact (line arrangement): under one second. The sampling estimate on a 1024^2 grid is
  timed beside it for scale.
* ``sigmoid_bins(sin, 10000, (0, 10))`` built and evaluated on 10^6 points under one second
  on 2 cores, through ``eval_sigmoid_net`` (the module's forward would hold a 10^6 x 20000
  float64 matrix, 160 GB). Both ``w = 1e4`` (window ~16 units per point) and ``w=None``
  (scaled to 1e6, ~2 units per point).

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_approx.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve()


def _regions_net(m: int = 64, seed: int = 0):
    import nnkit as nk

    nk.manual_seed(seed)
    return nk.nn.Sequential(nk.nn.Linear(2, m, dtype=np.float64), nk.nn.ReLU(),
                            nk.nn.Linear(m, 1, dtype=np.float64))


def _contenders(quick: bool) -> dict:
    from nnkit import approx

    net = _regions_net()
    box = [(-1.0, 1.0), (-1.0, 1.0)]
    x = np.random.default_rng(0).uniform(0, 10, 10 ** 6)

    def bins(w):
        def build_and_eval():
            return approx.eval_sigmoid_net(approx.sigmoid_bins(np.sin, 10_000, (0, 10), w=w), x)
        return build_and_eval

    out = {"regions m=64 exact (arrangement)": lambda: approx.count_linear_regions(net, box),
           "sigmoid_bins m=1e4 build+eval 1e6, w=1e4": bins(1e4),
           "sigmoid_bins m=1e4 build+eval 1e6, w=None": bins(None)}
    if not quick:
        out["regions m=64 sampled 1024^2 (reference)"] = (
            lambda: approx.regions._count_sampled(net, box, 1024))
    return out


def run(quick: bool = False) -> list[dict]:
    import numba

    sys.path.insert(0, str(HERE.parent))
    from harness import median_times

    contenders = _contenders(quick)
    times = median_times(contenders, repeats=3 if quick else 11, warmup=1)
    targets = {"regions m=64 exact (arrangement)": 1.0,
               "sigmoid_bins m=1e4 build+eval 1e6, w=1e4": 1.0,
               "sigmoid_bins m=1e4 build+eval 1e6, w=None": 1.0}
    return [{"work": name, "median_ms": f"{t * 1e3:.1f}",
             "target": f"< {targets[name] * 1e3:.0f} ms" if name in targets else "",
             "ok": t < targets[name] if name in targets else "",
             "threads": numba.get_num_threads()} for name, t in times.items()]


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    sys.path.insert(0, str(HERE.parent))
    from harness import report

    report(run, argv)


if __name__ == "__main__":
    main()
