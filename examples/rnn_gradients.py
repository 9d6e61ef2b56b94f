"""Vanishing and exploding gradients through time (notes §5), and how gates help.
==============================================================================

For an Elman RNN z_t = phi(U z_{t-1} + V x_t) and a loss on the last state,
||dL/dz_t|| <= ||dL/dz_T|| (alpha sigma_1(U))^(T-t), alpha = sup ``|phi'|``. With phi = ReLU,
U = s I and positive inputs every unit stays active, so the bound holds with equality: the
gradient shrinks like 0.5^(T-t) for s = 0.5 and grows like 1.5^(T-t) for s = 1.5. The LSTM's
cell path dL/dc_{t-1} = f * dL/dc_t has no U in it: at torch's default initialisation
(f ~ 1/2) it vanishes too, but once the forget gate is open (bias 4, f ~ 0.98; GRU: update
gate z ~ 0.98) the gradient survives 100 steps, whatever sigma_1(U). The gates let the
network learn when to keep it. ``nk.optim.clip_grad_norm_`` rescales the exploding gradient.

    python examples/rnn_gradients.py            # T = 100
    python examples/rnn_gradients.py --small    # T = 20 (the smoke test)

Prints ||dL/dz_0|| / ||dL/dz_T|| per model and writes rnn_gradients.png.
"""

from __future__ import annotations

import argparse

import numpy as np

import nnkit as nk
from nnkit.analysis import hidden_gradient_norms
from nnkit.nn.recurrent import GRU, LSTM, RNN


def last_state_loss(out):
    output, _ = out
    return output[-1].sum()  # L = sum of the last hidden state


def elman(s, hidden, rng):
    """ReLU RNN with U = s I and positive input weights (every unit active)."""
    rnn = RNN(4, hidden, nonlinearity="relu", dtype=np.float64)
    rnn.weight_hh_l0.data = s * np.eye(hidden)
    rnn.weight_ih_l0.data = np.abs(rng.standard_normal((hidden, 4))) * 0.1
    rnn.bias_ih_l0.data[:] = 0.0
    rnn.bias_hh_l0.data[:] = 0.0
    return rnn


def open_gate(model, bias=4.0):
    """Bias the LSTM forget gate (rows [H, 2H)) or the GRU update gate z (same rows) open."""
    H = model.hidden_size
    model.bias_ih_l0.data[H:2 * H] = bias
    return model


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--small", action="store_true", help="T = 20")
    parser.add_argument("--out", default="rnn_gradients.png")
    args = parser.parse_args(argv)
    T, hidden = (20, 16) if args.small else (100, 32)
    nk.manual_seed(0)
    rng = np.random.default_rng(0)
    x = rng.uniform(0.0, 1.0, (T, 8, 4))  # (T, B, F), positive
    models = {f"Elman ReLU, sigma_1(U) = {s}": elman(s, hidden, rng) for s in (0.5, 1.0, 1.5)}
    for cell in (LSTM, GRU):
        models[f"{cell.__name__} (default init)"] = cell(4, hidden, dtype=np.float64)
        models[f"{cell.__name__}, gate kept open"] = open_gate(cell(4, hidden, dtype=np.float64))
    norms = {name: hidden_gradient_norms(m, x, last_state_loss) for name, m in models.items()}
    for name, n in norms.items():
        print(f"{name:32s} ||dL/dz_0|| / ||dL/dz_T|| = {n[0] / n[-1]:.3g}")
    for s in (0.5, 1.5):
        n = norms[f"Elman ReLU, sigma_1(U) = {s}"]
        rate = np.exp(np.polyfit(np.arange(T), np.log(n), 1)[0])
        print(f"sigma_1(U) = {s}: measured growth per step backwards {1 / rate:.4f} (bound {s})")

    exploding = models["Elman ReLU, sigma_1(U) = 1.5"]
    last_state_loss(exploding(x)).backward()
    before = nk.optim.clip_grad_norm_(exploding.parameters(), max_norm=1.0)
    after = np.sqrt(sum(float((p.grad**2).sum()) for p in exploding.parameters()))
    print(f"exploding RNN: parameter gradient norm {before:.3g}, after clip_grad_norm_ {after:.3g}")
    _plot(norms, args.out)
    return norms


def _plot(norms, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot")
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, n in norms.items():
        ax.semilogy(n / n[-1], label=name)
    ax.set(xlabel="time step t", ylabel="||dL/dz_t|| / ||dL/dz_T||",
           title="gradient of a last-step loss through time")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
