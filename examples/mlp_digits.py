"""An MLP on scikit-learn's 8x8 digits with Adam: the foundation end to end.
=========================================================================

    python examples/mlp_digits.py            # 30 epochs, ~97% test accuracy
    python examples/mlp_digits.py --small    # a few epochs (the smoke test)

Prints the test accuracy and writes mlp_digits.png (learning curves and the confusion matrix).
"""

from __future__ import annotations

import argparse

import numpy as np

import nnkit as nk
import nnkit.functional as F


def main(argv=None) -> float:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--small", action="store_true", help="few epochs, for a smoke test")
    parser.add_argument("--out", default="mlp_digits.png")
    args = parser.parse_args(argv)
    epochs = 3 if args.small else 30

    nk.manual_seed(0)
    data = nk.datasets.load_digits(random_state=0)
    model = nk.nn.Sequential(
        nk.nn.Linear(64, 128), nk.nn.ReLU(),
        nk.nn.Linear(128, 128), nk.nn.ReLU(),
        nk.nn.Linear(128, 10),
    )
    opt = nk.optim.Adam(model.parameters(), lr=1e-3)
    losses, accs = [], []
    for _ in range(epochs):
        epoch_loss = []
        for idx in nk.training.minibatches(len(data.X_train), 64):
            loss = F.cross_entropy(model(data.X_train[idx]), data.y_train[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            epoch_loss.append(loss.item())
        losses.append(np.mean(epoch_loss))
        accs.append(nk.training.accuracy(model, data.X_test, data.y_test))
    pred = nk.training.predict_classes(model, data.X_test)
    print(f"test accuracy after {epochs} epochs: {accs[-1]:.4f}")
    _plot(losses, accs, data.y_test, pred, args.out)
    return accs[-1]


def _plot(losses, accs, y_true, y_pred, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot")
        return
    confusion = np.zeros((10, 10), dtype=int)
    np.add.at(confusion, (y_true, y_pred), 1)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 4))
    ax1.plot(losses, label="train loss")
    ax1.plot(accs, label="test accuracy")
    ax1.set_xlabel("epoch")
    ax1.legend()
    ax2.imshow(confusion, cmap="Blues")
    ax2.set_xlabel("predicted")
    ax2.set_ylabel("true")
    ax2.set_title("confusion matrix (test)")
    for (i, j), n in np.ndenumerate(confusion):
        if n:
            ax2.text(j, i, n, ha="center", va="center", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
