"""The adding problem at T = 100: LSTM and GRU learn it, an Elman RNN does not.
============================================================================

Each sequence carries values v_t ~ U(0, 1) and two markers; the target is the sum of the two
marked values, one in each half of the sequence (nnkit.datasets.sequences.adding_problem).
Always answering 1 scores MSE 1/6 = 0.167; a network that remembers the first marked value
for ~50 steps gets close to 0. Gradients are clipped to norm 1 (``nk.optim.clip_grad_norm_``).

    python examples/adding_problem.py            # T = 100, ~2 minutes on 2 cores
    python examples/adding_problem.py --small    # T = 20, seconds (the smoke test)

Prints the final test MSE per model and writes the learning curves to adding_problem.png.
"""

from __future__ import annotations

import argparse

import numpy as np

import nnkit as nk
import nnkit.functional as F
from nnkit.datasets.sequences import ADDING_BASELINE_MSE, adding_problem
from nnkit.nn.recurrent import GRU, LSTM, RNN


class Regressor(nk.nn.Module):
    """A recurrent layer read out at the last step: y = w . h_T + b."""

    def __init__(self, cell, hidden):
        super().__init__()
        self.rnn = cell(2, hidden, batch_first=True)
        self.head = nk.nn.Linear(hidden, 1)

    def forward(self, x):
        out, _ = self.rnn(x)  # (B, T, H)
        return self.head(out[:, -1]).reshape(-1)


def train(cell, T, steps, hidden=32, batch=64, lr=1e-2, seed=0):
    """Adam on fresh batches; returns the test MSE every 25 steps."""
    nk.manual_seed(seed)
    model = Regressor(cell, hidden)
    opt = nk.optim.Adam(model.parameters(), lr=lr)
    X_test, y_test = adding_problem(512, T, random_state=seed + 1)
    rng = np.random.default_rng(seed)
    curve = []
    for step in range(steps + 1):
        if step % 25 == 0:
            with nk.no_grad():
                curve.append(float(F.mse_loss(model(X_test), y_test).item()))
        X, y = adding_problem(batch, T, random_state=rng)
        loss = F.mse_loss(model(X), y)
        opt.zero_grad()
        loss.backward()
        nk.optim.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    return curve


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--small", action="store_true", help="T = 20, few steps")
    parser.add_argument("--out", default="adding_problem.png")
    args = parser.parse_args(argv)
    T, steps = (20, 50) if args.small else (100, 1500)
    curves = {cell.__name__: train(cell, T, steps) for cell in (RNN, LSTM, GRU)}
    for name, curve in curves.items():
        print(f"{name}: test MSE after {steps} steps at T = {T}: {curve[-1]:.4f} "
              f"(baseline {ADDING_BASELINE_MSE:.4f})")
    _plot(curves, T, args.out)
    return curves


def _plot(curves, T, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot")
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, curve in curves.items():
        ax.plot(np.arange(len(curve)) * 25, curve, label=name)
    ax.axhline(ADDING_BASELINE_MSE, color="gray", ls="--", label="answer 1 (1/6)")
    ax.set(xlabel="training step", ylabel="test MSE", yscale="log",
           title=f"adding problem, T = {T}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
