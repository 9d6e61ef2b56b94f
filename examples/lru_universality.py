"""A linear recurrence loses no power if a position-wise MLP reads it (notes §5.2).
================================================================================

    python examples/lru_universality.py            # 600 Adam steps each (about a minute)
    python examples/lru_universality.py --small    # 60 steps (smoke test)

Target: y_t = x_{t-2} x_{t-5}, a product of delayed inputs (x uniform with unit variance,
T = 32). Two models with the same layers and the same parameter count: Linear(1, 8) -> LRU
(32 complex states) -> Linear(8, 32) -> Tanh -> Linear(32, 1), and the same without the Tanh.
The LRU's state holds the recent inputs (a linear filter bank); the MLP multiplies the two it
needs. Without the Tanh the whole model is linear in the input sequence, and since y is
uncorrelated with every x_s the best it can do is predict 0: MSE = mean y^2 = 27/32 = 0.84.
Prints both held-out MSEs and plots the learning curves.
"""

from __future__ import annotations

import argparse

from nnkit.training.recurrent import lru_readout_model, train_lru_readout

EVERY = 20


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--small", action="store_true", help="few steps, for a smoke test")
    parser.add_argument("--out", default="lru_universality.png")
    args = parser.parse_args(argv)
    steps = 60 if args.small else 600
    curves = {}
    for name, nonlinear in (("LRU + MLP readout", True), ("LRU + linear readout", False)):
        n_params = sum(p.numel() for p in lru_readout_model(nonlinear).parameters())
        curves[name] = train_lru_readout(nonlinear, steps=steps, every=EVERY)
        print(f"{name:22s} {n_params} parameters: held-out MSE {curves[name][-1]:.4f}")
    print("best linear predictor of y_t = x_{t-2} x_{t-5}: 0, MSE = 27/32 = 0.844")
    _plot(curves, args.out)
    return {name: curve[-1] for name, curve in curves.items()}


def _plot(curves, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for name, curve in curves.items():
        ax.semilogy([i * EVERY for i in range(len(curve))], curve, label=name)  # steps % 20 == 0
    ax.axhline(27 / 32, color="k", ls="--", lw=0.8, label="best linear map (27/32)")
    ax.set_xlabel("Adam step")
    ax.set_ylabel("held-out MSE")
    ax.set_title("y_t = x_{t-2} x_{t-5}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"plot written to {path}")


if __name__ == "__main__":
    main()
