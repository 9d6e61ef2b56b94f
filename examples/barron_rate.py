"""Barron's O(1/m) rate (notes §2.4, Theorem 2.7): MSE against width m in d = 2, 8 and 32.
=======================================================================================

    python examples/barron_rate.py            # d = 2, 8, 32; m = 2..32 (about 2 minutes)
    python examples/barron_rate.py --small    # d = 2, 8; m = 2, 8; few steps (smoke test)

One-hidden-layer tanh networks of m units are trained with Adam (a fresh batch from the
uniform measure on [-1, 1]^d every step) on a target with finite Barron norm: 64 cosine
ridges with unit directions and weights 1/k (nk.approx.barron_target). The held-out mean
squared error is plotted against m on log-log axes beside a 1/m line, and the fitted slope
is printed for each d. Theorem 2.7 bounds the best network's error by C/m whatever d. The
trained networks follow 1/m in d = 8 (slope -0.96), fall faster in d = 2 (-1.83: the 64
ridges are one smooth function of two variables) and a little slower in d = 32 (-0.77),
where 1500 steps leave the wider networks further from the best ones (longer training
steepens it: benchmarks/RESULTS.md).
"""

from __future__ import annotations

import argparse

from nnkit.approx import barron_experiment


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--small", action="store_true", help="small sizes, for a smoke test")
    parser.add_argument("--out", default="barron_rate.png")
    args = parser.parse_args(argv)
    if args.small:
        res = barron_experiment(dims=(2, 8), widths=(2, 8), steps=200, batch_size=256)
    else:
        res = barron_experiment(dims=(2, 8, 32), widths=(2, 4, 8, 16, 32))
    print("  d  " + "".join(f"{f'm={m}':>10}" for m in res.widths) + "   slope   Var f")
    for d, mse in res.mse.items():
        print(f"{d:3d}  " + "".join(f"{e:10.2e}" for e in mse)
              + f"  {res.slopes[d]:6.2f}  {res.variance[d]:6.3f}")
    print("Theorem 2.7: the best m-unit network's MSE is O(1/m), slope <= -1, in any d.")
    _plot(res, args.out)
    return dict(res.slopes)


def _plot(res, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 4))
    res.plot(ax)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"plot written to {path}")


if __name__ == "__main__":
    main()
