"""The ``nnkit tour`` section for recurrent networks (notes §5 and §5.1).

Rows: the fused kernels against their naive twins; the gradient bound of notes §5 for an Elman
RNN (vanishing and exploding, equality for ReLU with U = s I); the LSTM's open forget gate
keeping the gradient; the adding problem (LSTM and GRU learn it, an Elman RNN does not).
``ctx.quick`` shortens the adding problem to T = 10 (seconds); the full run uses T = 100.
"""

from __future__ import annotations

import numpy as np

from .._random import manual_seed
from ..analysis import hidden_gradient_norms
from ..datasets.sequences import ADDING_BASELINE_MSE
from ..kernels import recurrent as K
from ..kernels.reference import recurrent as R
from ..nn.recurrent import GRU, LSTM, RNN
from ..training.recurrent import train_adding_problem
from .common import INFO, tour_row

__all__ = ["rnn_section"]

SECTION = "recurrent"


def _row(result, value, target="", ok=INFO):
    return tour_row(SECTION, result, value, target, ok)


def _twin_rows(seed):
    """Largest relative difference, fused kernel vs per-step twin, forward and gradients."""
    rng = np.random.default_rng(seed)
    T, B, D, H = 20, 3, 4, 5
    x = rng.standard_normal((T, B, D))
    h0, c0 = rng.standard_normal((B, H)), rng.standard_normal((B, H))
    dy, dh, dc = rng.standard_normal((T, B, H)), rng.standard_normal((B, H)), rng.standard_normal(
        (B, H))
    rows = []
    for cell, G in (("rnn", 1), ("lstm", 4), ("gru", 3)):
        w = [rng.uniform(-0.5, 0.5, s) for s in ((G * H, D), (G * H, H), (G * H,), (G * H,))]
        states, douts = ((h0, c0), (dy, dh, dc)) if cell == "lstm" else ((h0,), (dy, dh))
        got, want = [], []
        for pairs, into in ((K, got), (R, want)):
            outs, cache = getattr(pairs, f"{cell}_forward")(x, *states, *w)
            into += [*outs, *getattr(pairs, f"{cell}_backward")(douts, cache)]
        err = max(float(np.abs(a - b).max() / max(1.0, np.abs(b).max()))
                  for a, b in zip(got, want, strict=True))
        rows.append(_row(f"{cell.upper()} fused kernel vs naive twin (T=20, fwd+grads)",
                         f"{err:.1e}", "<= 1e-12", err <= 1e-12))
    return rows


def _elman(s, hidden, rng):
    rnn = RNN(4, hidden, nonlinearity="relu", dtype=np.float64)
    rnn.weight_hh_l0.data = s * np.eye(hidden)
    rnn.weight_ih_l0.data = np.abs(rng.standard_normal((hidden, 4))) * 0.1
    rnn.bias_ih_l0.data[:] = 0.0
    rnn.bias_hh_l0.data[:] = 0.0
    return rnn


def _gradient_rows(seed):
    """Per-step growth of ||dL/dz_t|| backwards for U = s I (bound alpha s, alpha = 1)."""
    rng = np.random.default_rng(seed)
    manual_seed(seed)
    T = 60
    x = rng.uniform(0.0, 1.0, (T, 4, 4))

    def loss(out):
        return out[0][-1].sum()

    rows = []
    for s in (0.5, 1.5):
        n = hidden_gradient_norms(_elman(s, 16, rng), x, loss)
        rate = 1.0 / np.exp(np.polyfit(np.arange(T), np.log(n), 1)[0])
        kind = "vanishing" if s < 1 else "exploding"
        rows.append(_row(f"Elman ReLU U={s}I: ||dL/dz_t|| growth per step back ({kind})",
                         f"{rate:.4f}", f"{s} (bound, equality here)", abs(rate - s) < 1e-6))
    lstm = LSTM(4, 16, dtype=np.float64)
    lstm.bias_ih_l0.data[16:32] = 4.0  # forget gate open: f ~ 0.98
    n = hidden_gradient_norms(lstm, x, loss)
    rows.append(_row(f"LSTM, forget gate open: ||dL/dz_0|| / ||dL/dz_T|| (T={T})",
                     f"{n[0] / n[-1]:.3g}", "> 1e-3 (Elman U=0.5I: ~2e-18)", n[0] / n[-1] > 1e-3))
    return rows


def _adding_rows(ctx):
    T, steps = (10, 300) if ctx.quick else (100, 1500)
    curves = {cell.__name__: train_adding_problem(cell, T, steps, seed=ctx.seed)
              for cell in ((LSTM,) if ctx.quick else (RNN, LSTM, GRU))}
    rows = []
    for name, curve in curves.items():
        solved = name != "RNN"
        target = "< 0.05 (answer-1 baseline 0.167)" if solved else "> 0.1 (does not learn)"
        ok = curve[-1] < 0.05 if solved else curve[-1] > 0.1
        rows.append(_row(f"adding problem T={T}, {name}: test MSE after {steps} steps",
                         f"{curve[-1]:.4f}", target, ok))
    if ctx.plots:
        _plot(curves, T, ctx.out_dir / "adding_problem.png")
    return rows


def _plot(curves, T, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for name, curve in curves.items():
        ax.semilogy(np.arange(len(curve)) * 25, curve, label=name)
    ax.axhline(ADDING_BASELINE_MSE, color="gray", ls="--", label="answer 1")
    ax.set(xlabel="training step", ylabel="test MSE", title=f"adding problem, T = {T}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def rnn_section(ctx) -> list[dict]:
    """Rows of the recurrent section (seconds with ``ctx.quick``)."""
    return _twin_rows(ctx.seed) + _gradient_rows(ctx.seed) + _adding_rows(ctx)
