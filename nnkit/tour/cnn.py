"""The ``nnkit tour`` section for convolution: a LeNet-style CNN on the 8x8 digits, and the
conv2d kernel checked against its naive twin and the 1-D signal identities of notes §4.1.

``cnn_section(ctx) -> list of rows``; seconds on a CPU with ``ctx.quick``.
"""

from __future__ import annotations

import time

import numpy as np

from ..training.cnn import train_cnn_digits
from .common import INFO, tour_row

__all__ = ["cnn_section"]

SECTION = "CNN on digits"


def _row(result, value, target="", ok=INFO):
    return tour_row(SECTION, result, value, target, ok)


def _kernel_rows(seed):
    """conv2d (strided, dilated, grouped) and its backward against the quadruple loop."""
    from .. import signal
    from ..kernels import conv
    from ..kernels.reference import conv as reference_conv

    rng = np.random.default_rng(seed)
    x, w = rng.standard_normal((2, 4, 7, 6)), rng.standard_normal((6, 2, 3, 2))
    args = ((2, 1), 1, (1, 2), 2)
    y, cache = conv.conv2d_forward(x, w, None, *args)
    dy = rng.standard_normal(y.shape)
    ry, rcache = reference_conv.conv2d_forward(x, w, None, *args)
    err = max(np.abs(y - ry).max(),
              *(np.abs(a - b).max() for a, b in zip(
                  conv.conv2d_backward(dy, cache)[:2],
                  reference_conv.conv2d_backward(dy, rcache)[:2], strict=True)))
    f, h = rng.standard_normal(50), rng.standard_normal(7)
    sig = max(np.abs(signal.toeplitz(h, 50) @ f - signal.convolve(f, h)).max(),
              np.abs(signal.fft_convolve(f, h) - np.convolve(f, h)).max())
    found = signal.convolution_kernel(lambda f: signal.fft_convolve(f, h), 50)
    kernel_err = float(np.abs(found - h).max())
    refused = not signal.is_shift_equivariant(lambda f: signal.convolve(f, h, "same"), 50)
    return [_row("conv2d fwd+bwd vs naive twin (max abs err, f64)", f"{err:.1e}", "< 1e-12",
                 err < 1e-12),
            _row("Toeplitz @ f and FFT vs convolve (max abs err)", f"{sig:.1e}", "< 1e-12",
                 sig < 1e-12),
            _row("Theorem 4.6: kernel of the FFT convolution recovered (max abs err); "
                 "'same' mode refused", f"{kernel_err:.1e}, {refused}", "< 1e-12, True",
                 kernel_err < 1e-12 and refused)]


def _plot(ctx, model, history, split, acc):
    from ..training import predict_classes
    from .common import pyplot

    plt = pyplot() if ctx.plots else None
    if plt is None:
        return
    pred = predict_classes(model, split.X_test)
    confusion = np.zeros((10, 10), dtype=int)
    np.add.at(confusion, (split.y_test, pred), 1)
    filters = model[0].weight.numpy()[:, 0]  # (16, 3, 3)
    fig = plt.figure(figsize=(10, 4))
    for k in range(16):
        ax = fig.add_subplot(4, 8, 8 * (k // 4) + k % 4 + 1)
        ax.imshow(filters[k], cmap="RdBu_r")
        ax.axis("off")
    ax = fig.add_subplot(1, 2, 2)
    ax.imshow(confusion, cmap="Blues")
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    fig.suptitle(f"LeNet-style CNN on digits: first-layer filters, confusion (acc {acc:.3f})")
    fig.savefig(ctx.out_dir / "cnn_digits.png", dpi=110)
    plt.close(fig)


def cnn_section(ctx) -> list[dict]:
    """Train the CNN (target >= 0.97 test accuracy) and check the kernels against the twins."""
    start = time.perf_counter()
    model, history, split = train_cnn_digits(epochs=6 if ctx.quick else 15, seed=ctx.seed)
    seconds = time.perf_counter() - start
    acc = history["test_accuracy"][-1]
    _plot(ctx, model, history, split, acc)
    target = 0.95 if ctx.quick else 0.97
    return [_row("test accuracy" + (" (quick: 6 epochs)" if ctx.quick else ""), f"{acc:.4f}",
                 f">= {target}", acc >= target),
            _row("training time", f"{seconds:.1f} s"),
            *_kernel_rows(ctx.seed)]
