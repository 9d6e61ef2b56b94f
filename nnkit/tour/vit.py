"""The ``nnkit tour`` section for the Vision Transformer (notes §6.6).

A ViT (2x2 patches of the 8x8 digits, 3 pre-norm layers of width 64, 8 heads) learns
scikit-learn's digits from scratch; rows give its test accuracy and training time, the
fused-attention forward against the composed path that returns the weights, the [CLS]
attention rows as probability distributions, the linear patch embedding against the
equivalent stride-2 convolution, and how much of the [CLS] token's attention lands on patches
with ink. The plot shows the last layer's [CLS] attention over a few test digits.
The full run trains 30 epochs (under a minute on a 2-core machine: benchmarks/RESULTS.md,
"Figures moved from code comments"); ``ctx.quick`` trains 3 epochs (seconds; the accuracy
row is then information only).
"""

from __future__ import annotations

import time

import numpy as np

from ..training.vit import make_digits_vit, train_vit
from .common import INFO, tour_row

__all__ = ["vit_section"]

SECTION = "ViT on digits"


def _row(result, value, target="", ok=INFO):
    return tour_row(SECTION, result, value, target, ok)


def _check_rows(model, images):
    """The attention path against the fused one, [CLS] rows, patch embedding vs conv2d."""
    from .. import functional as F
    from ..autograd import no_grad
    from ..models.vit import patchify

    with no_grad():
        fused = model(images).numpy()
        composed, attention = model(images, return_attention=True)
        tokens = model.patch_embed(patchify(images, model.patch_size)).numpy()  # (B, n, D)
        D, C, (p, _) = model.dim, model.in_channels, model.patch_size
        conv = F.conv2d(images, model.patch_embed.weight.numpy().reshape(D, C, p, p),
                        model.patch_embed.bias, stride=p).numpy()  # (B, D, Hp, Wp)
    diff = float(np.abs(composed.numpy() - fused).max())
    sums = float(np.abs(attention.numpy()[:, :, :, 0].sum(axis=-1) - 1).max())
    conv_err = float(np.abs(tokens - conv.reshape(len(images), D, -1).transpose(0, 2, 1)).max())
    return [
        _row("logits, fused attention vs composed path with weights (max |diff|)",
             f"{diff:.1e}", "<= 1e-4", diff <= 1e-4),
        _row("[CLS] attention rows, max |sum - 1| over layers and heads", f"{sums:.1e}",
             "<= 1e-5", sums <= 1e-5),
        _row("linear patch embedding vs stride-2 conv2d (max |diff|)", f"{conv_err:.1e}",
             "<= 1e-5", conv_err <= 1e-5),
    ]


def _ink_row(model, images):
    """Share of the last layer's [CLS] attention (mean over heads) on patches with ink."""
    maps = model.cls_attention(images).mean(axis=1)  # (B, Hp, Wp)
    p = model.patch_size[0]
    B, _, H, W = images.shape
    ink = images.reshape(B, H // p, p, W // p, p).max(axis=(2, 4)) > 0.25  # (B, Hp, Wp)
    share = float((maps * ink).sum() / maps.sum())
    return _row("last-layer [CLS] attention on patches with ink (vs their share of patches)",
                f"{share:.2f} (vs {ink.mean():.2f})")


def _plot(ctx, model, images, predicted):
    from .common import pyplot

    plt = pyplot() if ctx.plots else None
    if plt is None:
        return
    maps = model.cls_attention(images).mean(axis=1)  # (B, Hp, Wp), mean over heads
    H, W = model.image_size
    fig, axes = plt.subplots(2, len(images), figsize=(1.8 * len(images), 4))
    for k, (image, weights) in enumerate(zip(images[:, 0], maps, strict=True)):
        axes[0, k].imshow(image, cmap="gray_r")
        axes[0, k].set_title(f"predicted {predicted[k]}", fontsize=9)
        axes[1, k].imshow(weights, cmap="viridis", extent=(-0.5, W - 0.5, H - 0.5, -0.5))
        axes[1, k].contour(image, levels=[0.5], colors="white", linewidths=1)  # the digit
        for ax in axes[:, k]:
            ax.axis("off")
    fig.suptitle("ViT on digits: last-layer [CLS] attention to the 2x2 patches")
    fig.tight_layout()
    fig.savefig(ctx.out_dir / "vit_attention.png", dpi=110)
    plt.close(fig)


def vit_section(ctx) -> list[dict]:
    """Rows of the ViT section (see the module docstring)."""
    from ..datasets import load_digits
    from ..training import accuracy, predict_classes

    data = load_digits(flatten=False, random_state=ctx.seed)  # images (n, 1, 8, 8)
    model = make_digits_vit(ctx.seed)
    epochs = 3 if ctx.quick else 30
    start = time.perf_counter()
    history = train_vit(model, data.X_train, data.y_train, epochs, seed=ctx.seed)
    seconds = time.perf_counter() - start
    acc = accuracy(model, data.X_test, data.y_test)
    rows = [
        _row(f"test accuracy after {epochs} epochs", f"{acc:.3f}",
             "(full run >= 0.95)" if ctx.quick else ">= 0.95", INFO if ctx.quick else acc >= 0.95),
        _row("training loss, first -> last epoch", f"{history[0]:.3f} -> {history[-1]:.3f}",
             "falls", history[-1] < history[0]),
        _row("training time", f"{seconds:.1f} s"),
    ]
    probe = data.X_test[:64]
    rows += _check_rows(model, probe)
    rows.append(_ink_row(model, probe))
    _plot(ctx, model, data.X_test[:6], predict_classes(model, data.X_test[:6]))
    return rows
