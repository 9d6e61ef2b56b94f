"""A LeNet-style CNN on scikit-learn's 8x8 digits: convolution, pooling, Adam.
===========================================================================

    python examples/cnn_digits.py            # 15 epochs, ~97.3% test accuracy, seconds
    python examples/cnn_digits.py --small    # 2 epochs (the smoke test)

Prints the test accuracy and writes cnn_digits.png: the 16 learned first-layer 3x3 filters
and the test confusion matrix.
"""

from __future__ import annotations

import argparse

import numpy as np

import nnkit as nk
import nnkit.functional as F


def build_model():
    # (N, 1, 8, 8) -> (N, 16, 4, 4) -> (N, 32, 4, 4) -> (N, 512) -> (N, 10)
    return nk.nn.Sequential(
        nk.nn.Conv2d(1, 16, 3, padding=1), nk.nn.ReLU(), nk.nn.MaxPool2d(2),
        nk.nn.Conv2d(16, 32, 3, padding=1), nk.nn.ReLU(),
        nk.nn.Flatten(), nk.nn.Linear(512, 64), nk.nn.ReLU(), nk.nn.Linear(64, 10),
    )


def main(argv=None) -> float:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--small", action="store_true", help="2 epochs, for a smoke test")
    parser.add_argument("--out", default="cnn_digits.png")
    args = parser.parse_args(argv)
    epochs, lr = (2 if args.small else 15), 2e-3

    nk.manual_seed(0)
    data = nk.datasets.load_digits(flatten=False, random_state=0)  # images (n, 1, 8, 8)
    model = build_model()
    opt = nk.optim.Adam(model.parameters(), lr=lr)
    for epoch in range(epochs):
        for group in opt.param_groups:  # cosine learning-rate decay
            group["lr"] = lr * 0.5 * (1 + np.cos(np.pi * epoch / epochs))
        for idx in nk.training.minibatches(len(data.X_train), 32):
            loss = F.cross_entropy(model(data.X_train[idx]), data.y_train[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    pred = nk.training.predict_classes(model, data.X_test)
    acc = float(np.mean(pred == data.y_test))
    print(f"test accuracy after {epochs} epochs: {acc:.4f}")
    _plot(model[0].weight.numpy()[:, 0], data.y_test, pred, acc, args.out)
    return acc


def _plot(filters, y_true, y_pred, acc, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot")
        return
    confusion = np.zeros((10, 10), dtype=int)
    np.add.at(confusion, (y_true, y_pred), 1)
    fig = plt.figure(figsize=(10, 4.2))
    for k, f in enumerate(filters):  # (16, 3, 3), on a 4x4 grid at the left
        ax = fig.add_subplot(4, 8, 8 * (k // 4) + k % 4 + 1)
        ax.imshow(f, cmap="RdBu_r", vmin=-np.abs(f).max(), vmax=np.abs(f).max())
        ax.axis("off")
    ax = fig.add_subplot(1, 2, 2)
    ax.imshow(confusion, cmap="Blues")
    for (i, j), n in np.ndenumerate(confusion):
        if n:
            ax.text(j, i, n, ha="center", va="center", fontsize=7)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    fig.suptitle(f"first-layer filters (left) and test confusion matrix: accuracy {acc:.3f}")
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
