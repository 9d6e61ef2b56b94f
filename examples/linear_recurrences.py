"""Linear recurrences trained by the parallel scan: MinGRU and LRU against nn.LSTM.

Two tasks: scikit-learn's digits read one pixel at a time (T = 64, 10 classes), and the adding
problem (T = 1000: sum the two marked values; answering 1 scores MSE 1/6). MinGRU and LRU run
their recurrence as one fused scan (F.linear_scan), the LSTM steps through time. Prints a table
of accuracy / MSE and seconds per epoch, and plots the digits learning curves.

    python examples/linear_recurrences.py            # ~minutes on 2 cores
    python examples/linear_recurrences.py --small    # seconds (the smoke test)
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import nnkit as nk
import nnkit.functional as F
from nnkit.datasets import load_digits
from nnkit.datasets_sequences import adding_problem
from nnkit.nn.linear_recurrent import LRU, MinGRU
from nnkit.nn.recurrent import LSTM


class Reader(nk.nn.Module):
    """Encode each step (Linear), run the recurrent layer, read out the last step."""

    def __init__(self, kind, n_in, n_out, hidden=64):
        super().__init__()
        self.kind, self.encode = kind, nk.nn.Linear(n_in, 16)
        if kind == "MinGRU":
            self.rnn = MinGRU(16, hidden)
        elif kind == "LRU":
            self.rnn = LRU(16, hidden, r_min=0.9, r_max=0.999, random_state=0)
            hidden = 16
        else:
            self.rnn = LSTM(16, hidden, batch_first=True)
        self.head = nk.nn.Linear(hidden, n_out)

    def forward(self, x):  # x (B, T, n_in)
        h = self.rnn(self.encode(x))
        h = h[0] if isinstance(h, tuple) else h  # LSTM -> (out, (h_n, c_n))
        return self.head(h[:, -1])  # (B, n_out)


def fit(kind, X, y, X_test, y_test, loss_fn, score_fn, epochs, batch=64, lr=3e-3):
    nk.manual_seed(0)
    model = Reader(kind, X.shape[-1], 10 if loss_fn is F.cross_entropy else 1)
    opt = nk.optim.Adam(model.parameters(), lr=lr)
    rng, scores, seconds = np.random.default_rng(0), [], []
    for _ in range(epochs):
        start = time.perf_counter()
        for idx in np.array_split(rng.permutation(len(X)), max(1, len(X) // batch)):
            loss = loss_fn(model(X[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            nk.optim.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
        seconds.append(time.perf_counter() - start)
        with nk.no_grad():
            scores.append(score_fn(model(X_test), y_test))
    return scores, float(np.median(seconds))


def accuracy(logits, y):
    return float((logits.numpy().argmax(1) == y).mean())


def mse(pred, y):
    return float(((pred.numpy().reshape(-1) - y) ** 2).mean())


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--small", action="store_true")
    parser.add_argument("--out", default="linear_recurrences.png")
    args = parser.parse_args(argv)
    d = load_digits()
    n = 300 if args.small else len(d.X_train)
    Xd, Xd_test = d.X_train[:n, :, None], d.X_test[:, :, None]  # (N, 64, 1): pixel by pixel
    T, n_add = (100, 256) if args.small else (1000, 2048)
    Xa, ya = adding_problem(n_add, T, random_state=0)
    Xa_test, ya_test = adding_problem(256, T, random_state=1)
    epochs = 2 if args.small else 15
    rows, curves = [], {}
    for kind in ("MinGRU", "LRU", "LSTM"):
        acc, sec = fit(kind, Xd, d.y_train[:n], Xd_test, d.y_test, F.cross_entropy, accuracy,
                       epochs)
        err, sec_add = fit(kind, Xa, ya, Xa_test, ya_test,
                           lambda p, t: F.mse_loss(p.reshape(-1), t), mse, max(1, epochs // 3))
        curves[kind] = acc
        rows.append(f"{kind:7s}  digits acc {acc[-1]:.3f}  {sec:6.2f} s/epoch   "
                    f"adding T={T} MSE {err[-1]:.4f}  {sec_add:6.2f} s/epoch")
    print("\n".join(rows))
    _plot(curves, args.out)


def _plot(curves, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for kind, acc in curves.items():
        ax.plot(np.arange(1, len(acc) + 1), acc, marker="o", label=kind)
    ax.set(xlabel="epoch", ylabel="test accuracy", title="digits, pixel by pixel (T = 64)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
