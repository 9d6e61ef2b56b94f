"""The Hopfield network's capacity: the phase transition near alpha = s/n ~ 0.138.
===============================================================================

    python examples/hopfield_capacity.py            # n = 500, 1000, 2000
    python examples/hopfield_capacity.py --small    # n = 200, 400, fewer loads (smoke test)

For each n and load alpha, s random patterns are stored (Hebbian); each probe starts at a
stored pattern and runs asynchronously to a fixed point. Below alpha ~ 0.138 the fixed point
stays within a few percent of the pattern (overlap ~ 0.97 and above); beyond it errors
avalanche and the overlap collapses, more sharply as n grows. The one-step flip rate of the
stored bits follows (1 - erf(sqrt(1 / (2 alpha)))) / 2 of notes §1.4. Prints the overlap on
both sides of the transition for the largest n, the load where the share of retrieved probes
(final overlap >= 0.9) falls below 1/2 for each n (it moves down toward 0.138 as n grows), and
writes the two curves.
"""

from __future__ import annotations

import argparse

import numpy as np

from nnkit.classic.hopfield import retrieval_curve
from nnkit.theory import hopfield_flip_probability


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--small", action="store_true", help="small sizes, for a smoke test")
    parser.add_argument("--out", default="hopfield_capacity.png")
    args = parser.parse_args(argv)
    sizes = (200, 400) if args.small else (500, 1000, 2000)
    alphas = np.linspace(0.04, 0.24, 6 if args.small else 21)
    curves = [retrieval_curve(n, alphas, n_probes=10 if args.small else 40, random_state=n)
              for n in sizes]
    big = curves[-1]
    below = big.overlap[np.argmin(abs(alphas - 0.12))]
    above = big.overlap[np.argmin(abs(alphas - 0.16))]
    print(f"n = {big.n}: final overlap {below:.3f} at alpha = 0.12, {above:.3f} at alpha = 0.16")
    where = {c.n: c.transition() for c in curves}
    print("retrieved share crosses 1/2 at alpha = "
          + ", ".join(f"{a:.3f} (n = {n})" for n, a in where.items()))
    worst = max(np.max(abs(c.flip_rate - hopfield_flip_probability(alphas))) for c in curves)
    print(f"flip rate vs (1 - erf(sqrt(1/(2 alpha))))/2: largest gap {worst:.4f}")
    _plot(curves, alphas, args.out)
    return {"overlap_0.12": below, "overlap_0.16": above, "transition": where}


def _plot(curves, alphas, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot")
        return
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for c in curves:
        ax1.errorbar(c.alphas, c.overlap, yerr=c.overlap_std, marker="o", ms=3, capsize=2,
                     label=f"n = {c.n}")
        ax2.plot(c.alphas, c.flip_rate, "o", ms=3, label=f"n = {c.n}")
    fine = np.linspace(alphas[0], alphas[-1], 200)
    ax2.plot(fine, hopfield_flip_probability(fine), "k-", label="(1 - erf(sqrt(1/2a)))/2")
    ax1.axvline(0.138, color="gray", linestyle=":", label="alpha = 0.138")
    ax1.set_xlabel("load alpha = s / n")
    ax1.set_ylabel("overlap of the fixed point with the pattern")
    ax1.legend()
    ax2.set_xlabel("load alpha = s / n")
    ax2.set_ylabel("one-step flip rate of stored bits")
    ax2.legend()
    fig.suptitle("Hopfield network: retrieval from the stored patterns (async, Hebbian)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
