"""A Vision Transformer on scikit-learn's 8x8 digits, and where its [CLS] token looks.
===================================================================================

    python examples/vit_digits.py            # 30 epochs, >= 95% test accuracy
    python examples/vit_digits.py --small    # 2 epochs (the smoke test)

Each image is cut into 16 patches of 2x2 pixels, projected to 64 features, prefixed with a
[CLS] token and run through 3 pre-norm encoder layers (8 heads); the head classifies the
[CLS] token's final state (notes §6.6). Prints the test accuracy and the training
time and writes vit_digits.png: a few test digits, each with the last layer's attention from
[CLS] to the 4x4 grid of patches (mean over heads).
"""

from __future__ import annotations

import argparse
import time

import nnkit as nk
from nnkit.models.vit import ViT
from nnkit.training import DIGITS_VIT, train_vit


def main(argv=None) -> float:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--small", action="store_true", help="2 epochs, for a smoke test")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--out", default="vit_digits.png")
    args = parser.parse_args(argv)
    epochs = 2 if args.small else args.epochs

    nk.manual_seed(0)
    data = nk.datasets.load_digits(flatten=False, random_state=0)  # images (n, 1, 8, 8)
    model = ViT(**DIGITS_VIT)
    start = time.perf_counter()
    history = train_vit(model, data.X_train, data.y_train, epochs)
    seconds = time.perf_counter() - start
    acc = nk.training.accuracy(model, data.X_test, data.y_test)
    print(f"loss per epoch: {' '.join(f'{v:.3f}' for v in history)}")
    print(f"test accuracy after {epochs} epochs: {acc:.4f} (training {seconds:.1f} s)")
    images = data.X_test[:6]
    maps = model.cls_attention(images).mean(axis=1)  # (6, 4, 4), mean over heads
    _plot(images[:, 0], maps, nk.training.predict_classes(model, images), acc, args.out)
    return acc


def _plot(images, maps, predicted, acc, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot")
        return
    fig, axes = plt.subplots(2, len(images), figsize=(1.8 * len(images), 4))
    for k, (image, weights) in enumerate(zip(images, maps, strict=True)):
        axes[0, k].imshow(image, cmap="gray_r")
        axes[0, k].set_title(f"predicted {predicted[k]}", fontsize=9)
        axes[1, k].imshow(weights, cmap="viridis", extent=(-0.5, 7.5, 7.5, -0.5))  # 4x4 grid
        axes[1, k].contour(image, levels=[0.5], colors="white", linewidths=1)  # the digit
        for ax in axes[:, k]:
            ax.axis("off")
    fig.suptitle(f"[CLS] attention to the 2x2 patches, last layer (test accuracy {acc:.3f})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
