"""The CPU convolution algorithm for each shape: the one table, and why each shape goes where.

``cpu_algorithm`` names the path of ``nnkit.kernels.conv.cpu`` a layer runs (the forward
records it in ``cache.algorithm`` and the backward follows it):

- ``direct``: depthwise layers (groups = C > 1), Numba loops over zero-padded planes: im2col
  would make C GEMMs of one row each.
- ``pointwise``: 1x1, stride 1, unpadded: y[n] = W @ x[n], numpy's GEMM on x itself, with no
  copy to make.
- ``window``: every other ungrouped layer whose padding is at most (k - 1) d: the C GEMM
  reads its operands straight from the zero-padded image (with a stride, from one of its
  phase planes), so there is no im2col and no gather. It beat every path below at every such
  shape measured, forward and forward+backward, small maps and strides included.
- ``packed`` and ``image``: the other ungrouped layers (padding beyond (k - 1) d) with at
  least 256 outputs a plane, image by image, so that one image's cols stay in cache and the
  GEMM writes NCHW directly: float32 with K <= 64 runs ``packed`` (the panels gathered
  straight into the packed C GEMM, which beats OpenBLAS on so few rows), the rest ``image``
  (OpenBLAS).
- ``im2col``: the rest (small maps, other groups): im2col over the whole batch, one GEMM per
  group.
- ``winograd``: F(4x4, 3x3), only when ``ALGORITHM`` asks for it: on one thread it was about
  even with ``window`` forward+backward and slower forward.

The table does not depend on the thread count or the CPU; ``calibration`` (opt-in) picks
among ``candidates`` by timing them on the machine instead. Figures: benchmarks/RESULTS.md,
"Convolution algorithms by shape", "Convolution: implicit GEMM on the packed C kernel" and
"Convolution: the window GEMM" ("Every path, one thread").
"""

from __future__ import annotations

import numpy as np

__all__ = ["ALGORITHM", "cpu_algorithm", "candidates", "window_fits"]

# A path name forces that path wherever it applies (the tests run every path); None: the
# table below.
ALGORITHM = None


def window_fits(kernel, stride, pads, dilation, groups) -> bool:
    """Ungrouped, every padding within 0 .. (k - 1) d (so that, with stride 1, dx is a
    convolution of dy with a non-negative padding) and a build with the vector kernels."""
    if groups != 1:
        return False
    if any(p > (k - 1) * d for k, pair, d in zip(kernel, pads, dilation, strict=True)
           for p in pair):
        return False
    try:
        from ..._ext import conv_window
    except ImportError:  # a checkout whose extensions are not built
        return False
    return conv_window.AVAILABLE


def _fits(weight_shape, stride, pads, dilation, groups) -> dict:
    """{path: whether it computes this layer}."""
    kh, kw = weight_shape[2:]
    return {
        "direct": True,
        "pointwise": ((kh, kw) == (1, 1) and stride == (1, 1) and groups == 1
                      and pads == ((0, 0), (0, 0))),
        "winograd": ((kh, kw) == (3, 3) and stride == (1, 1) and dilation == (1, 1)
                     and groups == 1),
        "image": groups == 1,
        "window": window_fits((kh, kw), stride, pads, dilation, groups),
        "packed": groups == 1,
        "im2col": True,
    }


def candidates(x_shape, weight_shape, stride, pads, dilation, groups, out_hw,
               dtype=np.float32) -> list:
    """The paths worth timing for a layer (arguments as ``cpu_algorithm``'s): depthwise
    layers only ``direct`` (im2col would run one-row GEMMs), other grouped ones ``im2col``
    and ``direct``, ungrouped ones every path that computes them but ``direct``."""
    if groups == x_shape[1] > 1:
        return ["direct"]
    if groups > 1:
        return ["im2col", "direct"]
    fits = _fits(weight_shape, stride, pads, dilation, groups)
    return [p for p in ("window", "packed", "image", "pointwise", "winograd", "im2col")
            if fits[p]]


def cpu_algorithm(x_shape, weight_shape, stride, pads, dilation, groups, out_hw,
                  dtype=np.float32) -> str:
    """'direct', 'pointwise', 'winograd', 'window', 'packed', 'image' or 'im2col' for a
    layer: x (N, C, H, W), weight (K, C / groups, kh, kw), pads ((top, bottom), (left,
    right)), outputs ``out_hw`` (the module docstring says why)."""
    C, K = x_shape[1], weight_shape[0]
    fits = _fits(weight_shape, stride, pads, dilation, groups)
    if ALGORITHM is not None:
        return ALGORITHM if fits[ALGORITHM] else "im2col"
    if groups == C > 1:
        return "direct"
    if fits["pointwise"]:
        return "pointwise"
    if fits["window"]:
        return "window"
    if fits["image"] and out_hw[0] * out_hw[1] >= 256:
        return "packed" if K <= 64 and dtype == np.float32 else "image"
    return "im2col"
