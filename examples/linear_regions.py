"""Activation regions of 2-D ReLU networks, coloured by activation pattern (notes §2.5).
=====================================================================================

One hidden layer of m units cuts the plane into at most R(m) = 1 + m + C(m, 2) regions
(Zaslavsky), counted exactly here; a second layer folds them (counted by dense sampling, a
lower bound); Montufar et al.'s construction reaches R(m) floor(m/n)^{n(L-1)}.

    python examples/linear_regions.py [--small] [--out linear_regions.png]
"""

import argparse
import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

import nnkit as nk
from nnkit import approx, nn

BOX = [(-1.0, 1.0), (-1.0, 1.0)]


def relu_net(sizes):
    mods = []
    for a, b in zip(sizes[:-1], sizes[1:], strict=True):
        mods += [nn.Linear(a, b, dtype=np.float64), nn.ReLU()]
    return nn.Sequential(*mods, nn.Linear(sizes[-1], 1, dtype=np.float64))


def colour_by_pattern(ax, net, bounds, res):
    """Draw each activation region in its own colour; return how many patterns were seen."""
    (x0, x1), (y0, y1) = bounds
    xs, ys = np.linspace(x0, x1, res), np.linspace(y0, y1, res)
    X = np.stack(np.meshgrid(xs, ys), axis=-1).reshape(-1, 2)  # (res*res, 2)
    packed = np.packbits(approx.activation_patterns(net, X), axis=1)  # (res*res, bytes)
    keys = packed.view(np.dtype((np.void, packed.shape[1]))).ravel()  # one key per pattern
    _, ids = np.unique(keys, return_inverse=True)
    shuffled = np.random.default_rng(0).permutation(ids.max() + 1)[ids.ravel()]
    ax.imshow(shuffled.reshape(res, res), origin="lower", extent=(x0, x1, y0, y1),
              cmap="tab20", interpolation="nearest")
    return ids.max() + 1


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--small", action="store_true", help="coarser pictures")
    parser.add_argument("--out", default="linear_regions.png")
    args = parser.parse_args()
    res = 200 if args.small else 500
    nk.manual_seed(0)
    m = 12
    one = relu_net((2, m))
    two = relu_net((2, m, m))
    montufar = approx.montufar_network(4, 2, 3)
    exact = approx.count_linear_regions(one, BOX)
    deep = approx.count_linear_regions(two, BOX, resolution=3 * res)
    folded = approx.count_linear_regions(montufar, [(0, 1), (0, 1)], resolution=3 * res)
    bound = (1 + 4 + 6) * 2 ** (2 * 2)
    print(f"one layer, {m} units, box [-1, 1]^2: {int(exact)} regions ({exact.method}, exact="
          f"{exact.exact}); Zaslavsky's bound on R^2 is {1 + m + math.comb(m, 2)}")
    print(f"two layers of {m}: {int(deep)} regions seen ({deep.method}, a lower bound)")
    print(f"Montufar construction, m=4, n=2, L=3 on [0, 1]^2: {int(folded)} regions "
          f"({folded.method}); lower bound R(4) * 2^(2*2) = {bound}")
    fig, axes = plt.subplots(1, 3, figsize=(13, 4.4))
    panels = [(one, BOX, f"1 layer x {m}: {int(exact)} regions (exact)"),
              (two, BOX, f"2 layers x {m}: >= {int(deep)} regions (sampled)"),
              (montufar, [(0, 1), (0, 1)], f"Montufar m=4, L=3: {int(folded)} regions")]
    for ax, (net, bounds, title) in zip(axes, panels, strict=True):
        colour_by_pattern(ax, net, bounds, res)
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(args.out, dpi=100)
    print(f"plot written to {args.out}")


if __name__ == "__main__":
    main()
