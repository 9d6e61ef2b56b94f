"""Convolution and pooling: validated forward/backward pairs with CPU/CUDA dispatch.

``conv2d_forward(x, weight, bias, stride, padding, dilation, groups) -> (y, cache)`` and
``conv2d_backward(dy, cache) -> (dx, dweight, dbias)``; ``conv1d_*`` run the same code on a
height-1 image; ``max_pool2d_*`` and ``avg_pool2d_*`` likewise. The formula (section 4.2 of
the notes, as torch computes it: a cross-correlation) is::

    y[n, k, a, b] = bias[k] + sum_{c in group(k), i, j}
                    w[k, c, i, j] xpad[n, c, a s_h + i d_h, b s_w + j d_w]

Algorithms (CPU), one per shape, chosen by ``_cpu_algorithm`` (its comment says why):

- ``window``: every other ungrouped layer whose padding is at most (k - 1) d: a C GEMM
  (``nnkit._ext.conv_window``) that reads its panels straight from the zero-padded image,
  since with stride 1 each tap's im2col row is a contiguous run of it on the padded width
  (with stride s, of one of the s_h s_w phase planes of the padded image); dx is the same
  kernel on dy with the flipped, transposed weight (stride 1; strided layers take
  ``image``'s dx), dW reads the rows of cols from the planes likewise. C threads (no GIL).
- ``winograd``: F(4x4, 3x3) for 3x3 stride-1 layers, when ``ALGORITHM`` asks for it: tile
  transforms in Numba (``nnkit._ext.winograd_cpu``) around a batched GEMM with a quarter of
  the multiplies; the backward runs the transforms' adjoints (dx through B, dW through G)
  around two more.
  float32 error up to ~100 eps of max|y| (against ~4 for im2col); see "Winograd" below.
- ``direct``: depthwise layers, Numba loops over padded planes (``conv_cpu.direct_*``).
- ``pointwise``: 1x1 stride 1 unpadded, y[n] = W @ x[n], numpy's batched GEMM.
- ``packed``: float32 layers with up to 64 outputs and a padding beyond (k - 1) d: an
  implicit GEMM image by image, each block of output pixels' im2col panels gathered straight
  into the layout of the packed C GEMM (``nnkit._ext.conv_packed_cpu`` on
  ``gemm_packed.h``); the backward is ``image``'s.
- ``image``: im2col + GEMM image by image (cols (C kh kw, Ho Wo) cache-resident, the GEMM
  writing NCHW directly); the backward recomputes each image's cols.
- ``im2col``: the batch at once, cols (C kh kw, N Ho Wo), then

    forward:  Y (K, N Ho Wo) = W (K, C kh kw) @ cols                 (numpy SGEMM/DGEMM)
    backward: dW = dY @ cols^T,   dcols = W^T @ dY,   dx = col2im(dcols)

  one GEMM per group. cols is kept from the forward for the backward and then overwritten by
  dcols (a backward called twice recomputes it); the buffers come from a small pool (at most
  4 kept), because a fresh array of tens of megabytes costs milliseconds of page faults.

Threads: every path but im2col splits the batch into one run of images per numba thread:
the window path on C threads (``nnkit/_ext/part_threads.h``, no GIL hand-offs), the others
each on a Python thread with numpy's BLAS on one thread and the Numba kernels' serial
GIL-free builds. Each core runs its images from end to end, and no OpenBLAS or OpenMP
workers spin between the steps. The batch-wide im2col path, around the GEMMs:

- The Numba kernels run their serial builds (``SERIAL_AROUND_BLAS``): a parallel kernel's
  OpenMP workers keep spinning after it returns and take the second core from the OpenBLAS
  GEMM that follows (up to 2x slower), and OpenBLAS's spinning threads slow the next Numba
  kernel likewise; a parallel kernel after an idle pause also pays to wake the second core.
- im2col is an indexed loop over flat arrays with unsigned indices, the padding handled by
  the valid column range of each row, so LLVM vectorises the copy (Numba's negative-index
  wraparound check blocked it): about twice as fast as slice copies, bit-identical output.

Figures: benchmarks/RESULTS.md, "Convolution algorithms by shape", "Convolution"
(against torch) and "Figures moved from docstrings".

GPU arrays (CuPy) run the batch-wide im2col: ``im2col`` and ``col2im`` are Numba CUDA kernels
(``nnkit._ext.conv_cuda``), the GEMMs cuBLAS through CuPy, one batched product over the
groups; the direct kernels (one thread per output) it replaced reached a few percent of
cuDNN (benchmarks/RESULTS.md, "On an NVIDIA H100").
"""

from __future__ import annotations

import numbers
import os
import threading
from dataclasses import dataclass

import numpy as np

from .._backend import array_module, backend, kernels_for, load_kernels
from .._validation import (
    FLOATS,
    check_array,
    check_bool,
    check_cache,
    check_grad,
    check_same_device,
    check_same_dtype,
    check_scalar,
)

__all__ = [
    "ConvCache",
    "conv2d_forward",
    "conv2d_backward",
    "conv1d_forward",
    "conv1d_backward",
    "conv_output_size",
    "pool_params",
    "pool_output_size",
    "max_pool2d_forward",
    "max_pool2d_backward",
    "avg_pool2d_forward",
    "avg_pool2d_backward",
]


# ---- argument normalisation ---------------------------------------------------------------

# Largest kernel_size, stride, padding or dilation accepted: the kernels compute indices such
# as ``a * stride - padding + i * dilation`` and the products of two of these in int64, which
# stay far below 2^63 when each factor is at most 2^31 - 1 (the output sizes and array
# extents are bounded by memory).
MAX_GEOMETRY = 2 ** 31 - 1


def _int_tuple(value, name, n, low):
    """An int or a length-n sequence of ints in [low, MAX_GEOMETRY], as a tuple."""
    if isinstance(value, (numbers.Integral, np.integer)) and not isinstance(value, bool):
        value = (value,) * n
    if not isinstance(value, (tuple, list)) or len(value) != n:
        raise TypeError(f"{name} must be an int or a tuple of {n} ints, got {value!r}")
    for v in value:
        check_scalar(v, name=name, kind=numbers.Integral, low=low)
        if v > MAX_GEOMETRY:
            raise ValueError(f"{name} must be at most 2**31 - 1 = {MAX_GEOMETRY}, got "
                             f"{value!r}")
    return tuple(int(v) for v in value)


def _padding(padding, kernel, dilation, stride, nd):
    """(before, after) per spatial axis from int, tuple, 'valid' or 'same' (torch's split)."""
    if isinstance(padding, str):
        if padding not in ("valid", "same"):
            raise ValueError(f"padding must be 'valid', 'same', an int or a tuple of ints; "
                             f"got {padding!r}")
        if padding == "valid":
            return ((0, 0),) * nd
        if any(s != 1 for s in stride):
            raise ValueError(f"padding='same' needs stride 1 (as torch), got stride={stride}")
        totals = [d * (k - 1) for k, d in zip(kernel, dilation, strict=True)]
        return tuple((t // 2, t - t // 2) for t in totals)
    return tuple((p, p) for p in _int_tuple(padding, "padding", nd, 0))


def conv_output_size(size, kernel, stride, before, after, dilation):
    """floor((size + before + after - dilation (kernel - 1) - 1) / stride) + 1."""
    return (size + before + after - dilation * (kernel - 1) - 1) // stride + 1


# ---- validation ---------------------------------------------------------------------------

def _check_conv_inputs(x, weight, bias, groups, nd):
    """Arrays of one dtype and device; shapes consistent; raises naming the shapes."""
    letters = "(N, C, H, W)" if nd == 2 else "(N, C, L)"
    x = check_array(x, name="x", dtype=FLOATS)
    weight = check_array(weight, name="weight", dtype=FLOATS)
    if x.ndim != nd + 2:
        raise ValueError(f"x must be {nd + 2}-D {letters} for conv{nd}d, got shape "
                         f"{tuple(x.shape)}")
    if weight.ndim != nd + 2:
        raise ValueError(f"weight must be {nd + 2}-D (K, C/groups, "
                         f"{'kh, kw' if nd == 2 else 'k'}), got shape {tuple(weight.shape)}")
    groups = check_scalar(groups, name="groups", kind=numbers.Integral, low=1)
    C, K, Cg = x.shape[1], weight.shape[0], weight.shape[1]
    if C % groups or K % groups:
        raise ValueError(f"groups={groups} must divide the input channels (x shape "
                         f"{tuple(x.shape)}: C={C}) and the output channels (weight shape "
                         f"{tuple(weight.shape)}: K={K})")
    if Cg * groups != C:
        raise ValueError(f"channel mismatch: x has shape {tuple(x.shape)} (C={C}) but weight "
                         f"has shape {tuple(weight.shape)}, which expects C = weight.shape[1] "
                         f"* groups = {Cg} * {groups} = {Cg * groups}")
    if any(s == 0 for s in weight.shape[2:]):
        raise ValueError(f"weight has an empty kernel: shape {tuple(weight.shape)}")
    check_same_device(weight, x, name="weight")
    if bias is not None:
        check_same_device(bias, x, name="bias")
    check_same_dtype(weight, x, name="weight")
    if bias is not None:
        bias = check_array(bias, name="bias", dtype=FLOATS)
        if tuple(bias.shape) != (K,):
            raise ValueError(f"bias must have shape ({K},) for weight of shape "
                             f"{tuple(weight.shape)}, got {tuple(bias.shape)}")
        check_same_dtype(bias, x, name="bias")
    return x, weight, bias, int(groups)


def _check_window_fits(x_shape, kernel, pads, dilation, what="kernel"):
    sizes = x_shape[2:]
    for size, k, (p0, p1), d in zip(sizes, kernel, pads, dilation, strict=True):
        if size + p0 + p1 < d * (k - 1) + 1:
            raise ValueError(
                f"the {what} (size {tuple(kernel)}, dilation {tuple(dilation)}) is larger "
                f"than the padded input: x has shape {tuple(x_shape)}, padding "
                f"{tuple(pads)}; padded spatial size {size + p0 + p1} < {d * (k - 1) + 1}")


# ---- workspace pool -----------------------------------------------------------------------

class _Pool:
    """A few reusable flat buffers: a fresh large array costs its page faults at first touch."""

    def __init__(self, keep=4):
        self.keep = keep
        self.free = []
        self.lock = threading.Lock()

    def take(self, size, dtype):
        with self.lock:
            best = None
            for k, buf in enumerate(self.free):
                if buf.dtype == dtype and buf.size >= size and (
                        best is None or buf.size < self.free[best].size):
                    best = k
            if best is not None:
                return self.free.pop(best)[:size]
        return np.empty(size, dtype=dtype)

    def give(self, buf):
        base = buf if buf.base is None else buf.base
        with self.lock:
            if all(b is not base for b in self.free):
                self.free.append(base)
                if len(self.free) > self.keep:
                    self.free.sort(key=lambda b: b.size)
                    self.free.pop(0)


_pool = _Pool()


# ---- convolution --------------------------------------------------------------------------

@dataclass
class ConvCache:
    """What ``conv2d_backward`` needs: the inputs, the geometry, and the cols."""

    x: object
    weight: object
    has_bias: bool
    stride: tuple
    pads: tuple  # ((top, bottom), (left, right))
    dilation: tuple
    groups: int
    out_hw: tuple
    cols: object = None  # (C kh kw, N Ho Wo) from the forward, or None once consumed
    squeeze: bool = False  # a conv1d cache: drop the height axis of the gradients
    algorithm: str = "im2col"  # the CPU path ``_cpu_algorithm`` chose (the backward's too)
    wino_u: object = None  # Winograd: the transformed weight (36, K, C); cols holds V
    wino_chunks: object = None  # Winograd: the runs of images [(lo, hi)] each V covers


def conv2d_forward(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """2-D cross-correlation (torch's conv2d) with its cache for the backward.

    ``y[n, k, a, b] = bias[k] + sum_{c, i, j} w[k, c, i, j] xpad[n, g0 + c, a s + i d, b s + j d]``
    with g0 the first input channel of k's group.

    Parameters
    ----------
    x : ndarray (N, C, H, W), float32 or float64 (NumPy, or CuPy for the CUDA kernels)
    weight : ndarray (K, C / groups, kh, kw), x's dtype
    bias : ndarray (K,) or None
    stride, dilation : int or (int, int), >= 1
    padding : int, (int, int), 'valid' or 'same' (stride 1; odd totals put the extra row and
        column at the bottom/right, as torch)
    groups : int, divides C and K

    Returns
    -------
    y : ndarray (N, K, Ho, Wo), Ho = floor((H + 2 ph - dh (kh - 1) - 1) / sh) + 1
    cache : ConvCache

    Examples
    --------
    >>> import numpy as np
    >>> from nnkit.kernels.conv import conv2d_forward
    >>> y, _ = conv2d_forward(np.ones((1, 1, 3, 3)), np.ones((1, 1, 2, 2)))
    >>> y[0, 0]
    array([[4., 4.],
           [4., 4.]])
    """
    x, weight, bias, groups = _check_conv_inputs(x, weight, bias, groups, 2)
    kernel = weight.shape[2:]
    stride = _int_tuple(stride, "stride", 2, 1)
    dilation = _int_tuple(dilation, "dilation", 2, 1)
    pads = _padding(padding, kernel, dilation, stride, 2)
    return _forward(x, weight, bias, stride, pads, dilation, groups)


def _forward(x, weight, bias, stride, pads, dilation, groups, squeeze=False):
    """conv2d on validated arrays with explicit ((top, bottom), (left, right)) padding."""
    kernel = weight.shape[2:]
    _check_window_fits(x.shape, kernel, pads, dilation)
    out_hw = tuple(conv_output_size(s, k, st, p0, p1, d) for s, k, st, (p0, p1), d
                   in zip(x.shape[2:], kernel, stride, pads, dilation, strict=True))
    cache = ConvCache(x, weight, bias is not None, stride, pads, dilation, groups, out_hw,
                      squeeze=squeeze)
    if backend(x) == "cuda":
        return _conv2d_forward_cuda(x, weight, bias, cache), cache
    return _conv2d_forward_cpu(x, weight, bias, cache), cache


def _kernels(x):
    """conv_cpu for NumPy arrays, conv_cuda for GPU arrays (the pooling launchers)."""
    return kernels_for("conv_cpu", "conv_cuda", x)


def _cpu():
    """The CPU route's kernels (its helpers run on NumPy arrays by construction)."""
    return load_kernels("conv_cpu")


def _cuda():
    """The GPU route's kernels (the simulator tests drive this route with NumPy arrays)."""
    return load_kernels("conv_cuda")


# Serial Numba builds around the GEMMs (see the module docstring): a parallel
# kernel's spinning OpenMP workers and OpenBLAS's spinning threads steal each other's core.
SERIAL_AROUND_BLAS = True


def _around_blas(kernel):
    return kernel.serial if SERIAL_AROUND_BLAS else kernel


def _im2col(cache, out):
    conv_cpu = _cpu()
    (sh, sw), ((pt, _), (pl, _)), (dh, dw) = cache.stride, cache.pads, cache.dilation
    kh, kw = cache.weight.shape[2:]
    _around_blas(conv_cpu.im2col)(cache.x, kh, kw, sh, sw, pt, pl, dh, dw, *cache.out_hw,
                                  out)
    return out


# The CPU algorithm for a shape, each rule measured (benchmarks/RESULTS.md, "Convolution
# algorithms by shape", "implicit GEMM on the packed C kernel" and "the window GEMM"):
# - depthwise (groups = C > 1): direct loops; im2col would make C one-row GEMMs.
# - 1x1, stride 1, unpadded: one GEMM per image on x itself ('pointwise'), no copy.
# - other ungrouped layers with padding <= (k - 1) d: 'window' (operands read from the
#   padded image or its stride phases: no im2col, no gather). Faster than every path below
#   at every such shape measured, forward and forward+backward, small maps and strides
#   included. Winograd F(4x4, 3x3) is chosen only through 'ALGORITHM' now: on one thread
#   it is 5% faster forward+backward at (8, 128, 28, 28) -> 128, 10% slower at 56x56, and
#   1.6x slower forward at both.
# - other ungrouped layers (padding > (k - 1) d) with >= 256 outputs a plane, image by
#   image (cols in cache, NCHW written directly): float32 with K <= 64 'packed' (panels
#   gathered straight into the packed C GEMM, which beats OpenBLAS on so few rows), else
#   'image' (OpenBLAS).
# - the rest (small maps, other groups): im2col over the whole batch, one GEMM per group.
# ``ALGORITHM`` forces a path where it applies (the tests run every path).
ALGORITHM = None


def _numba_threads():
    import numba

    return numba.get_num_threads()


def _cpu_algorithm(x_shape, weight_shape, stride, pads, dilation, groups, out_hw,
                   dtype=np.float32):
    """'direct', 'pointwise', 'winograd', 'window', 'packed', 'image' or 'im2col' (the comment
    above)."""
    C, (K, _, kh, kw) = x_shape[1], weight_shape
    fits = {
        "direct": True,
        "pointwise": ((kh, kw) == (1, 1) and stride == (1, 1) and groups == 1
                      and pads == ((0, 0), (0, 0))),
        "winograd": ((kh, kw) == (3, 3) and stride == (1, 1) and dilation == (1, 1)
                     and groups == 1),
        "image": groups == 1,
        "window": _window_fits((kh, kw), stride, pads, dilation, groups),
        "packed": groups == 1,
        "im2col": True,
    }
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


def _summed(parts):
    """The images' weight-gradient parts added into the first (one per run of images)."""
    total = parts[0]
    for part in parts[1:]:
        total += part
    return total


def _cpu_paths():
    """algorithm -> (forward, backward) of the CPU paths other than the batch-wide im2col."""
    return {"winograd": (_winograd_forward, _winograd_backward),
            "direct": (_direct_forward, _direct_backward),
            "pointwise": (_pointwise_forward, _pointwise_backward),
            "image": (_image_forward, _image_backward),
            "packed": (_packed_forward, _image_backward),
            "window": (_window_forward, _window_backward)}


def _conv2d_forward_cpu(x, weight, bias, cache):
    cache.algorithm = _cpu_algorithm(x.shape, weight.shape, cache.stride, cache.pads,
                                     cache.dilation, cache.groups, cache.out_hw, x.dtype)
    if cache.algorithm != "im2col":
        return _cpu_paths()[cache.algorithm][0](x, weight, bias, cache)
    conv_cpu = _cpu()
    N, C, H, W = x.shape
    K, Cg, kh, kw = weight.shape
    G, P = cache.groups, cache.out_hw[0] * cache.out_hw[1]
    R = C * kh * kw
    cols = _im2col(cache, _pool.take(R * N * P, x.dtype).reshape(R, N * P))
    ykn = _pool.take(K * N * P, x.dtype).reshape(K, N * P)
    if G == 1:
        np.matmul(weight.reshape(K, R), cols, out=ykn)  # (K, N P)
    else:
        np.matmul(weight.reshape(G, K // G, Cg * kh * kw), cols.reshape(G, R // G, N * P),
                  out=ykn.reshape(G, K // G, N * P))  # (G, K/G, N P)
    y = np.empty((N, K, P), dtype=x.dtype)
    b = bias if bias is not None else np.zeros(1, dtype=x.dtype)
    _around_blas(conv_cpu.bias_transpose)(ykn.reshape(K, N, P), b, bias is not None,
                                          y)  # (N, K, P)
    _pool.give(ykn)
    cache.cols = cols
    return y.reshape(N, K, *cache.out_hw)


# ---- direct (thin groups, depthwise) and pointwise (1x1) -----------------------------------

def _geometry(cache):
    (sh, sw), ((pt, pb), (pl, pr)), (dh, dw) = cache.stride, cache.pads, cache.dilation
    return sh, sw, pt, pl, pb, pr, dh, dw


def _direct_forward(x, weight, bias, cache):
    """Direct loops (``conv_cpu.direct_forward``); no workspace kept for the backward."""
    x = cache.x = np.ascontiguousarray(x)
    N, K = x.shape[0], weight.shape[0]
    y = np.empty((N, K, *cache.out_hw), dtype=x.dtype)
    b = bias if bias is not None else np.zeros(K, dtype=x.dtype)
    _cpu().direct_forward(x, np.ascontiguousarray(weight), np.ascontiguousarray(b),
                          *_geometry(cache), y)
    return y


def _direct_backward(dy, cache, needs_input_grad, needs_weight_grad):
    conv_cpu = _cpu()
    x, weight = cache.x, np.ascontiguousarray(cache.weight)
    dy = np.ascontiguousarray(dy)
    dx = dweight = dbias = None
    if needs_weight_grad:
        dweight = np.empty(weight.shape, dtype=x.dtype)
        dbias = np.empty(weight.shape[0], dtype=x.dtype)
        conv_cpu.direct_backward_weight(x, dy, *_geometry(cache), dweight, dbias)
    if needs_input_grad:
        dx = np.empty(x.shape, dtype=x.dtype)
        conv_cpu.direct_backward_input(dy, weight, *_geometry(cache), dx)
    return dx, dweight, (dbias if cache.has_bias else None)


def _pointwise_forward(x, weight, bias, cache):
    """y[n] = W (K, C) @ x[n] (C, H W) for each image n: numpy's batched GEMM writes NCHW,
    one run of images per numba thread (``_over_images``)."""
    N, C, H, W = x.shape
    K = weight.shape[0]
    w = np.ascontiguousarray(weight).reshape(K, C)
    xr = x.reshape(N, C, H * W)
    y = np.empty((N, K, H * W), dtype=x.dtype)

    def run(lo, hi):
        np.matmul(w, xr[lo:hi], out=y[lo:hi])
        if bias is not None:
            y[lo:hi] += bias.reshape(1, K, 1)

    _over_images(run, _image_chunks(N))
    return y.reshape(N, K, H, W)


def _pointwise_backward(dy, cache, needs_input_grad, needs_weight_grad):
    """dx[n] = W^T @ dy[n]; dW = sum_n dy[n] @ x[n]^T (per run of images, then summed)."""
    x, weight = cache.x, cache.weight
    N, C, H, W = x.shape
    K = weight.shape[0]
    w = np.ascontiguousarray(weight).reshape(K, C)
    dyr = np.ascontiguousarray(dy).reshape(N, K, H * W)
    xr = x.reshape(N, C, H * W)
    dx = np.empty((N, C, H * W), dtype=x.dtype) if needs_input_grad else None

    def run(lo, hi):
        part = db = None
        if needs_weight_grad:
            part = np.matmul(dyr[lo:hi], xr[lo:hi].transpose(0, 2, 1)).sum(axis=0)  # (K, C)
            if cache.has_bias:  # pairwise per plane, as _image_backward (a float64 sum of
                # the whole dy on one thread took 30% of the backward at 56x56 -> 256)
                db = dyr[lo:hi].sum(axis=2).sum(axis=0, dtype=np.float64)
        if needs_input_grad:
            np.matmul(w.T, dyr[lo:hi], out=dx[lo:hi])
        return part, db

    parts = _over_images(run, _image_chunks(N))
    dweight = dbias = None
    if needs_weight_grad:
        dweight = _summed([p for p, _ in parts]).reshape(weight.shape).astype(x.dtype,
                                                                              copy=False)
        if cache.has_bias:
            dbias = _summed([db for _, db in parts]).astype(x.dtype)
    return (None if dx is None else dx.reshape(x.shape)), dweight, dbias


# ---- im2col + GEMM image by image (groups = 1) ---------------------------------------------
# The cols of one image (C kh kw, Ho Wo) stay in the L2 cache between im2col and the GEMM,
# and the GEMM writes the image's output in NCHW: no batch-wide cols (tens of MiB written
# and read back) and no output transpose. The backward recomputes each image's cols for
# dW += dY[n] cols^T and runs col2im on W^T dY[n] into dx[n] likewise; dy is read in place.
# The batch is split into one run of images per numba thread, each on a Python thread with
# numpy's BLAS on one thread and GIL-free im2col/col2im: every core runs its own images
# from end to end, with no OpenBLAS or OpenMP workers spinning between the steps (2 BLAS
# threads per image GEMM instead: 3.3x slower at (32, 16, 32, 32) -> 32, wall time, in
# benchmarks/RESULTS.md).

_threads_lock = threading.Lock()
# [ThreadPoolExecutor, the pid that created it, the CPU its workers are kept off]
_threads = []


def _current_cpu():
    """The CPU this thread runs on (Linux), else None."""
    if not _sched_getcpu:
        try:
            import ctypes

            _sched_getcpu.append(ctypes.CDLL(None).sched_getcpu)
        except (OSError, AttributeError, TypeError):
            _sched_getcpu.append(lambda: -1)
    cpu = _sched_getcpu[0]()
    return cpu if cpu >= 0 else None


_sched_getcpu = []  # libc's sched_getcpu, looked up on first use


def _keep_workers_off_this_cpu(pool, kept):
    """Keep the pool's worker threads off the CPU the caller runs on, which runs the first
    run of images itself: a virtual machine's idle CPU looks preempted to the guest's
    scheduler, which then wakes the worker on the caller's CPU, and the two runs go one
    after the other (2x slower at (8, 64, 56, 56) -> 256 1x1; the C threads of
    nnkit/_ext/part_threads.h do the same). Returns the CPU now kept off."""
    cpu = _current_cpu()
    if cpu is None or cpu == kept or not hasattr(os, "sched_setaffinity"):
        return kept
    allowed = os.sched_getaffinity(0) - {cpu}
    if not allowed:
        return kept
    for thread in list(pool._threads):
        try:
            os.sched_setaffinity(thread.native_id, allowed)
        except OSError:  # the thread has just ended
            return kept
    return cpu


def _image_chunks(N):
    """[(lo, hi)]: the batch in one contiguous run of images per numba thread."""
    parts = max(1, min(N, _numba_threads()))
    return [(N * p // parts, N * (p + 1) // parts) for p in range(parts)]


def _over_images(fn, chunks):
    """[fn(lo, hi) for (lo, hi) in chunks (``_image_chunks``)], on the worker threads."""
    if len(chunks) == 1:
        return [fn(*chunks[0])]
    from concurrent.futures import ThreadPoolExecutor

    from .._ext._dispatch import serial_numpy_blas

    with _threads_lock:
        # a new pool in a forked child too: the parent's worker threads do not exist there
        if (not _threads or _threads[1] != os.getpid()
                or _threads[0]._max_workers < len(chunks)):
            _threads[:] = [ThreadPoolExecutor(len(chunks), thread_name_prefix="nnkit-conv"),
                           os.getpid(), None]
        pool = _threads[0]
        _threads[2] = _keep_workers_off_this_cpu(pool, _threads[2])
    with serial_numpy_blas():
        futures = [pool.submit(fn, lo, hi) for lo, hi in chunks[1:]]  # the first run here
        try:
            first = fn(*chunks[0])
        finally:
            done = [f.result() for f in futures]
        return [first, *done]


def _image_geometry(cache):
    (sh, sw), ((pt, _), (pl, _)), (dh, dw) = cache.stride, cache.pads, cache.dilation
    kh, kw = cache.weight.shape[2:]
    return kh, kw, sh, sw, pt, pl, dh, dw, *cache.out_hw


def _image_forward(x, weight, bias, cache):
    x = cache.x = np.ascontiguousarray(x)
    conv_cpu = _cpu()
    N, K = x.shape[0], weight.shape[0]
    R, P = weight[0].size, cache.out_hw[0] * cache.out_hw[1]
    w = np.ascontiguousarray(weight).reshape(K, R)
    geometry = _image_geometry(cache)
    y = np.empty((N, K, P), dtype=x.dtype)

    def run(lo, hi):
        cols = np.empty((R, P), dtype=x.dtype)
        for n in range(lo, hi):
            conv_cpu.im2col_nogil(x[n:n + 1], *geometry, cols)
            np.matmul(w, cols, out=y[n])
            if bias is not None:
                y[n] += bias.reshape(K, 1)

    _over_images(run, _image_chunks(N))
    return y.reshape(N, K, *cache.out_hw)


def _image_backward(dy, cache, needs_input_grad, needs_weight_grad):
    """The image and packed paths' backward: per image, dW^T += cols(x[n]) @ dy[n]^T and
    dx[n] = col2im(W^T @ dy[n]), numpy's GEMMs."""
    conv_cpu = _cpu()
    x, weight = cache.x, cache.weight
    N, K = x.shape[0], weight.shape[0]
    R, P = weight[0].size, cache.out_hw[0] * cache.out_hw[1]
    w = np.ascontiguousarray(weight).reshape(K, R)
    dyr = np.ascontiguousarray(dy).reshape(N, K, P)
    geometry = _image_geometry(cache)
    dx = np.empty(x.shape, dtype=x.dtype) if needs_input_grad else None

    def run(lo, hi):
        cols = np.empty((R, P), dtype=x.dtype)
        dw = part = None
        if needs_weight_grad:  # transposed, dW^T (R, K): OpenBLAS ran cols @ dy[n]^T
            # 1.2-1.45x faster than dy[n] @ cols^T at (K, R, Ho Wo) = (32, 144, 1024),
            # (64, 576, 3136), (64, 147, 12544) (one thread; equal at (16, 27, 1024))
            dw = np.zeros((R, K), dtype=x.dtype)
            part = np.empty((R, K), dtype=x.dtype)
        for n in range(lo, hi):
            if needs_weight_grad:
                conv_cpu.im2col_nogil(x[n:n + 1], *geometry, cols)
                np.matmul(cols, dyr[n].T, out=part)
                dw += part
            if needs_input_grad:
                np.matmul(w.T, dyr[n], out=cols)
                conv_cpu.col2im_nogil(cols, *geometry, dx[n:n + 1])
        db = None
        if needs_weight_grad and cache.has_bias:  # on the runs' threads too: a float64
            # sum of the whole dy on one thread took ~10% of the backward at (32, 16, 32, 32)
            db = dyr[lo:hi].sum(axis=2).sum(axis=0, dtype=np.float64)  # pairwise per plane
        return dw, db

    parts = _over_images(run, _image_chunks(N))
    dweight = dbias = None
    if needs_weight_grad:
        dweight = np.ascontiguousarray(_summed([dw for dw, _ in parts]).T).reshape(
            weight.shape)
        if cache.has_bias:
            dbias = _summed([db for _, db in parts]).astype(x.dtype)
    return dx, dweight, dbias


# ---- implicit GEMM on the packed C kernel ---------------------------------------------------
# The per-image GEMM y[n] = W @ cols(x[n]) with cols never built: nnkit._ext.conv_packed_cpu
# gathers each block of output pixels' panels from the zero-padded image straight into the
# layout of the packed C GEMM (gemm_packed.h, 4-row register tiles) and multiplies them while
# they sit in L2. One Numba call (GIL released) per run of images. The backward is the
# per-image path's (``_image_backward``).


# Bytes of gathered panels per block of output pixels: a block larger than L2 (1-2 MiB a
# core) would be written out to L3 by the gather and read back by the GEMM. 1 MiB measured
# 1.1-1.3x faster than 256 KiB at (8, 64, 56, 56) -> 64 and stride 2 -> 128 (one thread),
# equal on the 32x32 maps (whose whole image, up to 0.6 MiB, is one block).
PACKED_BLOCK_BYTES = 1 << 20


def _packed():
    return load_kernels("conv_packed_cpu")


def _packed_forward(x, weight, bias, cache):
    x = cache.x = np.ascontiguousarray(x)
    N, K = x.shape[0], weight.shape[0]
    w = np.ascontiguousarray(weight).reshape(K, -1)
    kh, kw, sh, sw, pt, pl, dh, dw, Ho, Wo = _image_geometry(cache)
    y = np.empty((N, K, Ho * Wo), dtype=x.dtype)
    b = bias if bias is not None else np.zeros(1, dtype=x.dtype)
    forward = _packed().forward

    def run(lo, hi):
        forward(x, w, b, bias is not None, kh, kw, sh, sw, pt, pl, dh, dw, Ho, Wo, lo, hi,
                PACKED_BLOCK_BYTES, y)

    _over_images(run, _image_chunks(N))
    return y.reshape(N, K, Ho, Wo)


# ---- the window GEMM ------------------------------------------------------------------------
# nnkit._ext.conv_window (C, conv_window.h): with stride 1 the im2col row of each tap, laid
# out on the padded width, is a contiguous run of the zero-padded image (with stride s, of
# one of its phase planes), so the GEMM's right-hand panels are read straight from it (no
# im2col, no gather). The input gradient is the same kernel on dy with the flipped,
# transposed weight; the weight gradient reads the rows of cols from the planes likewise
# against dy packed once per image. One C call (GIL released, C threads) per pass.


def _window():
    from .._ext import conv_window

    return conv_window


def _window_fits(kernel, stride, pads, dilation, groups):
    """Ungrouped, every padding within 0 .. (k - 1) d (so that, with stride 1, dx is a
    convolution of dy with a non-negative padding) and a build with the vector kernels."""
    if groups != 1:
        return False
    if any(p > (k - 1) * d for k, pair, d in zip(kernel, pads, dilation, strict=True)
           for p in pair):
        return False
    try:
        return _window().AVAILABLE
    except ImportError:  # a checkout whose extensions are not built
        return False


def _window_pack(w2):
    """w2 (M, R) -> (ceil(M / 8), R, 8): tile t holds rows [8 t, 8 t + 8), zeros past M."""
    M, R = w2.shape
    tiles = -(-M // 8)
    packed = np.zeros((tiles * 8, R), dtype=w2.dtype)
    packed[:M] = w2
    return np.ascontiguousarray(packed.reshape(tiles, 8, R).transpose(0, 2, 1))


def _window_geometry(cache):
    """(C, H, W, K, kh, kw, pt, pl, dh, dw, Ho, Wo, sh, sw), as the C kernels take it."""
    _, C, H, W = cache.x.shape
    K, _, kh, kw = cache.weight.shape
    ((pt, _), (pl, _)), (dh, dw) = cache.pads, cache.dilation
    return (C, H, W, K, kh, kw, pt, pl, dh, dw, *cache.out_hw, *cache.stride)


def _window_forward(x, weight, bias, cache):
    x = cache.x = np.ascontiguousarray(x)
    K = weight.shape[0]
    wp = _window_pack(np.ascontiguousarray(weight).reshape(K, -1))
    y = np.empty((x.shape[0], K, *cache.out_hw), dtype=x.dtype)
    b = None if bias is None else np.ascontiguousarray(bias)
    _window().forward(x, wp, b, y, _window_geometry(cache), _numba_threads())
    return y


def _window_backward(dy, cache, needs_input_grad, needs_weight_grad):
    """dx = conv(dy, flipped W^T) and dW^T = sum_n cols(x[n]) @ dy[n]^T in one C call (one
    run of images per thread, each with its own dW^T and bias sums, added here). Strided:
    dx image by image (``_image_backward``), as dx is then no stride-1 convolution."""
    x, weight = cache.x, cache.weight
    K, C, kh, kw = weight.shape
    window, threads = _window(), _numba_threads()
    geometry = _window_geometry(cache)
    dx = wfp = acc = db = None
    strided = cache.stride != (1, 1)
    if needs_input_grad and not strided:
        dx = np.empty(x.shape, dtype=x.dtype)
        flipped = np.ascontiguousarray(weight[:, :, ::-1, ::-1].transpose(1, 0, 2, 3))
        wfp = _window_pack(flipped.reshape(C, K * kh * kw))
    if needs_weight_grad:
        acc = np.zeros(window.accumulator_shape(geometry, x.dtype, threads), dtype=x.dtype)
        db = np.zeros((threads, K)) if cache.has_bias else None
    if dx is not None or acc is not None:
        window.backward(x, np.ascontiguousarray(dy), wfp, dx, acc, db, geometry, threads)
    if needs_input_grad and strided:
        dx = _image_backward(dy, cache, True, False)[0]
    dweight = dbias = None
    if needs_weight_grad:
        dweight = np.ascontiguousarray(acc.sum(axis=0)[:C * kh * kw, :K].T).reshape(
            weight.shape)
        if cache.has_bias:
            dbias = db.sum(axis=0).astype(x.dtype)
    return dx, dweight, dbias


# ---- Winograd F(4x4, 3x3) -------------------------------------------------------------------
# y = A^T [U * V] A tile by tile (nnkit._ext.winograd_cpu), U = G g G^T (36, K, C) and
# V = B^T d B (36, C, T) for the T tiles (4x4 outputs, 6x6 inputs, one junk tile ending each
# tile row); the 36 products summed over channels are the batched GEMM M = U @ V (36, K, T).
# Backward, the exact adjoints of these linear maps: dM = A dY A^T (36, K, T), then
#     dU = dM @ V^T (36, K, C) and dW = G^T dU G;   dV = U^T @ dM and dx = B dV B^T added
# over the overlapping input windows: two batched GEMMs of a quarter of im2col's multiplies.
# float32 error against the float64 result (random normal data, the three benchmark shapes
# and (2, 256, 16, 16) -> 64): max|error| / max|exact| 2.6e-6 to 9.6e-6 in y, 1.6e-6 to 3.9e-6
# in dx, 3.2e-6 to 1.2e-5 in dW (about 15-100 eps), against 1.1e-7 to 5.4e-7 for im2col: the
# transforms' constants (1/24 .. 8) scale intermediate values by up to ~100. The bound
# tested (``test_winograd_float32_error_bound``): 2^-13 (1024 eps) of max|exact|.


def _wino():
    return load_kernels("winograd_cpu")


def _tiles(cache):
    """(TH, TW, S): tile rows and columns of one image and its tile count with junk tiles."""
    Ho, Wo = cache.out_hw
    TH, TW = -(-Ho // 4), -(-Wo // 4)
    return TH, TW, TH * (TW + 1)


def _kron_g(dtype):
    """G (x) G (36, 9): (G w G^T)[e1, e2] = sum_{i, j} G[e1, i] G[e2, j] w[i, j] as a matrix."""
    G = _wino().G
    return np.kron(G, G).astype(dtype)


def _winograd_weight(weight):
    """U[e1 6 + e2, k, c] = (G w[k, c] G^T)[e1, e2]: one GEMM (36, 9) @ (9, K C)."""
    K, C = weight.shape[:2]
    w = np.ascontiguousarray(weight).reshape(K * C, 9)
    return np.matmul(_kron_g(weight.dtype), w.T).reshape(36, K, C)


def _winograd_input(cache, lo, hi):
    """V (36, C, (hi - lo) S) of images [lo, hi) (the serial, GIL-free build)."""
    x = cache.x
    TH, TW, S = _tiles(cache)
    V = _pool.take(36 * x.shape[1] * (hi - lo) * S, x.dtype).reshape(36, x.shape[1], -1)
    _wino().wino_input(x[lo:hi], cache.pads[0][0], cache.pads[1][0], TH, TW, V)
    return V


# Like the per-image im2col path, the batch runs as one run of images per numba thread
# (``_over_images``): each thread transforms its images, runs its batched GEMM on one BLAS
# thread and transforms back, so the serial transforms use every core.

def _winograd_forward(x, weight, bias, cache):
    x = cache.x = np.ascontiguousarray(x)
    N, K = x.shape[0], weight.shape[0]
    TH, TW, S = _tiles(cache)
    U = cache.wino_u = _winograd_weight(weight)
    y = np.empty((N, K, *cache.out_hw), dtype=x.dtype)
    b = np.ascontiguousarray(bias if bias is not None else np.zeros(K, dtype=x.dtype))
    cache.wino_chunks = _image_chunks(N)

    def run(lo, hi):
        V = _winograd_input(cache, lo, hi)
        M = _pool.take(36 * K * (hi - lo) * S, x.dtype).reshape(36, K, -1)
        np.matmul(U, V, out=M)
        _wino().wino_output(M, TH, TW, b, y[lo:hi])
        _pool.give(M)
        return V

    cache.cols = _over_images(run, cache.wino_chunks)
    return y


def _winograd_backward(dy, cache, needs_input_grad, needs_weight_grad):
    x, weight = cache.x, cache.weight
    C, K = x.shape[1], weight.shape[0]
    TH, TW, S = _tiles(cache)
    wc = _wino()
    dy = np.ascontiguousarray(dy)
    dx = np.empty(x.shape, dtype=x.dtype) if needs_input_grad else None
    chunks = cache.wino_chunks
    cols = cache.cols if cache.cols is not None else [None] * len(chunks)
    cache.cols = None  # overwritten by dV below, or kept (weight gradient only)
    kept = [None] * len(chunks)

    def run(i):
        lo, hi = chunks[i]
        dM = _pool.take(36 * K * (hi - lo) * S, x.dtype).reshape(36, K, -1)
        wc.wino_output_adjoint(dy[lo:hi], TH, TW, dM)
        dU = None
        V = cols[i]
        if needs_weight_grad:
            V = V if V is not None else _winograd_input(cache, lo, hi)
            dU = np.matmul(dM, V.transpose(0, 2, 1))  # (36, K, C)
        if needs_input_grad:
            dV = V if V is not None else _pool.take(36 * C * (hi - lo) * S, x.dtype)
            dV = dV.reshape(36, C, -1)
            np.matmul(cache.wino_u.transpose(0, 2, 1), dM, out=dV)
            wc.wino_input_adjoint(dV, cache.pads[0][0], cache.pads[1][0], TH, TW, dx[lo:hi])
            _pool.give(dV)
        else:
            kept[i] = V
        _pool.give(dM)
        return dU

    parts = _over_images(lambda lo, hi: run(chunks.index((lo, hi))), chunks)
    if not needs_input_grad and needs_weight_grad:
        cache.cols = kept
    dweight = dbias = None
    if needs_weight_grad:
        dU = parts[0]
        for part in parts[1:]:
            dU += part
        # dW[k, c] = G^T dU[., k, c] G: (K C, 36) @ (36, 9)
        dweight = np.matmul(dU.reshape(36, K * C).T, _kron_g(x.dtype)).reshape(weight.shape)
        if cache.has_bias:
            dbias = dy.sum(axis=(0, 2, 3), dtype=np.float64).astype(x.dtype)
    return dx, dweight, dbias


def release(cache):
    """Return the forward's cols (Winograd: V of each run of images) to the workspace pool
    (when no backward will run)."""
    if isinstance(cache, ConvCache) and cache.cols is not None:
        for cols in (cache.cols if isinstance(cache.cols, list) else [cache.cols]):
            if cols is not None and backend(cols) == "cpu":
                _pool.give(cols)
        cache.cols = None


def conv2d_backward(dy, cache, needs_input_grad=True, needs_weight_grad=True):
    """Gradients of ``conv2d_forward``: (dx, dweight, dbias).

    ``dx = col2im(W^T dY)``, ``dweight = dY cols^T`` (per group),
    ``dbias[k] = sum_{n, a, b} dy[n, k, a, b]``.

    Parameters
    ----------
    dy : ndarray (N, K, Ho, Wo), the forward's dtype and device
    cache : ConvCache from ``conv2d_forward`` (or ``conv1d_forward``)
    needs_input_grad, needs_weight_grad : bool
        Skip dx (first layer) or dweight/dbias (frozen weights); the skipped ones are None.

    Returns
    -------
    dx : ndarray, shape of x, or None
    dweight : ndarray, shape of weight, or None
    dbias : ndarray (K,) or None (None also when the forward had no bias)
    """
    check_cache(cache, ConvCache, forward="conv2d_forward")
    x, weight = cache.x, cache.weight
    N, K = x.shape[0], weight.shape[0]
    if cache.squeeze:
        dy = dy[:, :, None, :] if getattr(dy, "ndim", 0) == 3 else dy
    dy = check_grad(dy, shape=(N, K, *cache.out_hw), dtype=x.dtype, device=backend(x))
    if backend(x) == "cuda":
        dx, dw, db = _conv2d_backward_cuda(dy, cache, needs_input_grad, needs_weight_grad)
    else:
        dx, dw, db = _conv2d_backward_cpu(dy, cache, needs_input_grad, needs_weight_grad)
    if cache.squeeze:
        dx = None if dx is None else dx[:, :, 0, :]
        dw = None if dw is None else dw[:, :, 0, :]
    return dx, dw, db


def _conv2d_backward_cpu(dy, cache, needs_input_grad, needs_weight_grad):
    if cache.algorithm != "im2col":
        return _cpu_paths()[cache.algorithm][1](dy, cache, needs_input_grad, needs_weight_grad)
    conv_cpu = _cpu()
    x, weight = cache.x, cache.weight
    N, C, H, W = x.shape
    K, Cg, kh, kw = weight.shape
    G, P = cache.groups, cache.out_hw[0] * cache.out_hw[1]
    R = C * kh * kw
    dyt = _pool.take(K * N * P, x.dtype).reshape(K, N * P)
    dbias = np.empty(K, dtype=x.dtype)
    _around_blas(conv_cpu.transpose_sum)(dy.reshape(N, K, P), dyt.reshape(K, N, P),
                                         dbias)  # (K, N, P)
    dweight = None
    if needs_weight_grad:
        cols = cache.cols
        if cols is None:  # consumed by an earlier backward through the same graph
            cols = _im2col(cache, _pool.take(R * N * P, x.dtype).reshape(R, N * P))
        dweight = np.empty(weight.shape, dtype=x.dtype)
        if G == 1:
            np.matmul(dyt, cols.T, out=dweight.reshape(K, R))
        else:
            np.matmul(dyt.reshape(G, K // G, N * P),
                      cols.reshape(G, R // G, N * P).transpose(0, 2, 1),
                      out=dweight.reshape(G, K // G, Cg * kh * kw))
        cache.cols = cols
    dx = None
    if needs_input_grad:
        dcols = cache.cols if cache.cols is not None else _pool.take(R * N * P, x.dtype)
        dcols = dcols.reshape(R, N * P)
        cache.cols = None  # overwritten below
        if G == 1:
            np.matmul(weight.reshape(K, R).T, dyt, out=dcols)
        else:
            np.matmul(weight.reshape(G, K // G, Cg * kh * kw).transpose(0, 2, 1),
                      dyt.reshape(G, K // G, N * P), out=dcols.reshape(G, R // G, N * P))
        dx = np.empty(x.shape, dtype=x.dtype)
        (sh, sw), ((pt, _), (pl, _)), (dh, dw) = cache.stride, cache.pads, cache.dilation
        _around_blas(conv_cpu.col2im)(dcols, kh, kw, sh, sw, pt, pl, dh, dw, *cache.out_hw,
                                      dx)
        _pool.give(dcols)
    _pool.give(dyt)
    return dx, dweight, (dbias if cache.has_bias and needs_weight_grad else None)


def conv1d_forward(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """1-D cross-correlation (torch's conv1d): ``conv2d_forward`` on a height-1 image.

    Parameters
    ----------
    x : ndarray (N, C, L); weight : ndarray (K, C / groups, k); bias : (K,) or None
    stride, dilation : int >= 1; padding : int, 'valid' or 'same'; groups : int

    Returns
    -------
    y : ndarray (N, K, Lo), Lo = floor((L + 2 p - d (k - 1) - 1) / s) + 1
    cache : ConvCache (for ``conv1d_backward``)
    """
    x, weight, bias, groups = _check_conv_inputs(x, weight, bias, groups, 1)
    stride = _int_tuple(stride, "stride", 1, 1)[0]
    dilation = _int_tuple(dilation, "dilation", 1, 1)[0]
    pads = _padding(padding, weight.shape[2:], (dilation,), (stride,), 1)
    if x.shape[2] + sum(pads[0]) < dilation * (weight.shape[2] - 1) + 1:
        _check_window_fits(x.shape, weight.shape[2:], pads, (dilation,))
    y, cache = _forward(x[:, :, None, :], weight[:, :, None, :], bias, (1, stride),
                        ((0, 0), pads[0]), (1, dilation), groups, squeeze=True)
    return y[:, :, 0, :], cache


def conv1d_backward(dy, cache, needs_input_grad=True, needs_weight_grad=True):
    """Gradients of ``conv1d_forward``: (dx (N, C, L), dweight (K, C/groups, k), dbias)."""
    return conv2d_backward(dy, cache, needs_input_grad, needs_weight_grad)


# ---- CUDA paths ---------------------------------------------------------------------------

def _cuda_geometry(cache):
    """``conv_cuda.im2col``/``col2im``'s geometry arguments, from the cache."""
    return (cache.weight.shape[2:], cache.stride, cache.pads, cache.dilation, cache.out_hw)


def _conv2d_forward_cuda(x, weight, bias, cache):
    """The CPU algorithm on the GPU: cols by ``conv_cuda.im2col``, Y = W @ cols per group in
    cuBLAS (CuPy's matmul; NumPy's under the simulator), bias added in the transpose."""
    conv_cuda = _cuda()
    xp = array_module(x)
    x, weight = xp.ascontiguousarray(x), xp.ascontiguousarray(weight)
    cache.x, cache.weight = x, weight
    N, C = x.shape[:2]
    K, G, P = weight.shape[0], cache.groups, cache.out_hw[0] * cache.out_hw[1]
    R = C * weight.shape[2] * weight.shape[3]
    cols = xp.empty((R, N * P), dtype=x.dtype)
    conv_cuda.im2col(x, *_cuda_geometry(cache), cols)
    ykn = xp.matmul(weight.reshape(G, K // G, R // G), cols.reshape(G, R // G, N * P))
    y = xp.empty((N, K, P), dtype=x.dtype)
    ynkp = ykn.reshape(K, N, P).transpose(1, 0, 2)
    if bias is None:
        y[...] = ynkp
    else:
        xp.add(ynkp, bias.reshape(1, K, 1), out=y)
    cache.cols = cols
    return y.reshape(N, K, *cache.out_hw)


def _conv2d_backward_cuda(dy, cache, needs_input_grad, needs_weight_grad):
    """dW = dY @ cols^T and dcols = W^T @ dY per group (cuBLAS), dx = col2im(dcols)."""
    conv_cuda = _cuda()
    xp = array_module(dy)
    x, weight = cache.x, cache.weight
    N, C = x.shape[:2]
    K, G, P = weight.shape[0], cache.groups, cache.out_hw[0] * cache.out_hw[1]
    R = C * weight.shape[2] * weight.shape[3]
    dyt = xp.ascontiguousarray(dy.reshape(N, K, P).transpose(1, 0, 2)).reshape(K, N * P)
    dx = dw = db = None
    if needs_weight_grad:
        cols = cache.cols
        if cols is None:  # a backward called twice: the first consumed the cols
            cols = xp.empty((R, N * P), dtype=x.dtype)
            conv_cuda.im2col(x, *_cuda_geometry(cache), cols)
        dw = xp.matmul(dyt.reshape(G, K // G, N * P),
                       cols.reshape(G, R // G, N * P).transpose(0, 2, 1)).reshape(weight.shape)
        if cache.has_bias:
            db = dyt.sum(axis=1, dtype=np.float64).astype(x.dtype)
    cache.cols = None
    if needs_input_grad:
        dcols = xp.matmul(weight.reshape(G, K // G, R // G).transpose(0, 2, 1),
                          dyt.reshape(G, K // G, N * P))
        dx = xp.empty(x.shape, dtype=x.dtype)
        conv_cuda.col2im(dcols.reshape(R, N * P), *_cuda_geometry(cache), dx)
    return dx, dw, db


# ---- pooling ------------------------------------------------------------------------------

@dataclass
class PoolCache:
    """What the pooling backward needs: x's shape, the geometry, and max pooling's argmax."""

    x_shape: tuple
    dtype: object
    kernel: tuple
    stride: tuple
    padding: tuple
    dilation: tuple
    count_include_pad: bool
    out_hw: tuple
    idx: object = None  # max pooling: int64 (N, C, Ho, Wo), h W + w of each routed maximum
    gpu: bool = False
    divisor: int = 0  # avg pooling's divisor_override, 0 for none


def check_divisor(divisor_override):
    """divisor_override as an int, 0 for None; torch's rule: a nonzero int."""
    if divisor_override is None:
        return 0
    check_scalar(divisor_override, name="divisor_override", kind=numbers.Integral,
                 low=-(2**63 - 1), high=2**63 - 1)
    if divisor_override == 0:
        raise ValueError("divisor_override must be a nonzero int or None (as torch), got 0")
    return int(divisor_override)


def pool_params(kernel_size, stride=None, padding=0, dilation=1):
    """(kernel, stride, padding, dilation) as int pairs, validated as torch does.

    stride None (or empty) means kernel_size; padding at most half the kernel per axis.
    """
    kernel = _int_tuple(kernel_size, "kernel_size", 2, 1)
    empty = isinstance(stride, (tuple, list)) and len(stride) == 0
    stride = kernel if stride is None or empty else _int_tuple(stride, "stride", 2, 1)
    pad = _int_tuple(padding, "padding", 2, 0)
    dilation = _int_tuple(dilation, "dilation", 2, 1)
    if any(2 * p > k for p, k in zip(pad, kernel, strict=True)):
        raise ValueError(f"padding {pad} must be at most half of kernel_size {kernel} "
                         f"(as torch)")
    return kernel, stride, pad, dilation


def pool_output_size(size, kernel, stride, pad, dilation, ceil_mode):
    """torch's pooling_output_shape: ``floor`` (or ``ceil``) of
    ``(size + 2 pad - dilation (kernel - 1) - 1) / stride``, plus 1; in ceil mode a last
    window that would start in the right padding is dropped."""
    span = size + 2 * pad - dilation * (kernel - 1) - 1
    out = (span + (stride - 1 if ceil_mode else 0)) // stride + 1
    if ceil_mode and (out - 1) * stride >= size + pad:
        out -= 1
    return out


def _pool_args(x, kernel_size, stride, padding, dilation, ceil_mode, what):
    x = check_array(x, name="x", dtype=FLOATS)
    if x.ndim != 4:
        raise ValueError(f"x must be 4-D (N, C, H, W) for {what}, got shape {tuple(x.shape)}")
    kernel, stride, pad, dilation = pool_params(kernel_size, stride, padding, dilation)
    ceil_mode = check_bool(ceil_mode, name="ceil_mode")
    out_hw = tuple(pool_output_size(s, k, st, p, d, ceil_mode) for s, k, st, p, d
                   in zip(x.shape[2:], kernel, stride, pad, dilation, strict=True))
    if min(x.shape[2:]) < 1:  # padding alone would make room for windows, all in the padding
        raise ValueError(f"{what}: x has shape {tuple(x.shape)}, an empty (H, W) plane; H and W "
                         f"must be >= 1 (as torch)")
    if min(out_hw) < 1:
        raise ValueError(f"{what}: output size {out_hw} is too small: x has shape "
                         f"{tuple(x.shape)}, kernel_size {kernel}, stride {stride}, padding "
                         f"{pad}, dilation {dilation}, ceil_mode={ceil_mode}")
    return x, kernel, stride, pad, dilation, out_hw


def max_pool2d_forward(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False):
    """Max pooling (torch's max_pool2d), with the argmax cache.

    ``y[n, c, a, b] = max{xpad[n, c, a s + i d, b s + j d] | i, j in [0, r)}``, padded with
    -inf; ``ceil_mode`` only adds windows (clipped at the input's edge), see
    ``pool_output_size``. The gradient goes to the first maximum in row-major window order
    (NaN wins).

    Parameters
    ----------
    x : ndarray (N, C, H, W), float32 or float64
    kernel_size : int or (int, int); stride : default kernel_size;
    padding : int or pair, at most half the kernel; dilation : int or pair; ceil_mode : bool

    Returns
    -------
    y : ndarray (N, C, Ho, Wo)
    cache : PoolCache; ``cache.idx`` int64 (N, C, Ho, Wo) holds torch's ``return_indices``:
        h W + w of each window's maximum in its (H, W) plane (-1 for a window lying wholly in
        the padding, possible with dilation, where y is -inf)

    Examples
    --------
    >>> import numpy as np
    >>> from nnkit.kernels.conv import max_pool2d_forward
    >>> max_pool2d_forward(np.arange(16.0).reshape(1, 1, 4, 4), 2)[0][0, 0]
    array([[ 5.,  7.],
           [13., 15.]])
    """
    x, kernel, stride, pad, dilation, out_hw = _pool_args(x, kernel_size, stride, padding,
                                                          dilation, ceil_mode, "max_pool2d")
    xp = array_module(x)
    y = xp.empty(x.shape[:2] + out_hw, dtype=x.dtype)
    idx = xp.empty(x.shape[:2] + out_hw, dtype=np.int64)
    cache = PoolCache(tuple(x.shape), x.dtype, kernel, stride, pad, dilation, True, out_hw,
                      idx, backend(x) == "cuda")
    kernels = _kernels(x)
    if cache.gpu:
        kernels.max_pool(xp.ascontiguousarray(x), kernel, stride, pad, dilation, y, idx)
    else:
        kernels.max_pool(x, *kernel, *stride, *pad, *dilation, y, idx)
    return y, cache


def _check_pool_dy(dy, cache):
    check_cache(cache, PoolCache, forward="the pooling forward")
    return check_grad(dy, shape=cache.x_shape[:2] + cache.out_hw, dtype=cache.dtype,
                      device="cuda" if cache.gpu else "cpu")


def max_pool2d_backward(dy, cache, needs=None):
    """dx (N, C, H, W): dy[n, c, a, b] added at each window's routed maximum. ``needs``:
    ``nnkit.autograd.apply_op``'s mask (the one input always needs its gradient)."""
    dy = _check_pool_dy(dy, cache)
    xp = array_module(dy)
    dx = xp.empty(cache.x_shape, dtype=cache.dtype)
    kernels = _kernels(dy)
    if cache.gpu:
        kernels.max_pool_backward(xp.ascontiguousarray(dy), cache.idx, cache.kernel,
                                  cache.stride, cache.padding, cache.dilation, dx)
    else:
        kernels.max_pool_backward(dy, cache.idx, dx)
    return dx


def avg_pool2d_forward(x, kernel_size, stride=None, padding=0, ceil_mode=False,
                       count_include_pad=True, divisor_override=None):
    """Average pooling (torch's avg_pool2d): arguments in torch's order.

    ``y[n, c, a, b] = sum of the in-bounds window entries / D``, with torch's D:
    ``divisor_override`` if given, else the window clipped to the padded input
    (``count_include_pad``, torch's default: kh kw except for ceil_mode's last windows), else
    the number of in-bounds entries.

    Parameters
    ----------
    x : ndarray (N, C, H, W), float32 or float64
    kernel_size, stride, padding : as ``max_pool2d_forward`` (no dilation)
    ceil_mode, count_include_pad : bool; divisor_override : nonzero int or None

    Returns
    -------
    y : ndarray (N, C, Ho, Wo); cache : PoolCache

    Examples
    --------
    >>> import numpy as np
    >>> from nnkit.kernels.conv import avg_pool2d_forward
    >>> avg_pool2d_forward(np.arange(16.0).reshape(1, 1, 4, 4), 2)[0][0, 0]
    array([[ 2.5,  4.5],
           [10.5, 12.5]])
    """
    x, kernel, stride, pad, dilation, out_hw = _pool_args(x, kernel_size, stride, padding, 1,
                                                          ceil_mode, "avg_pool2d")
    include = check_bool(count_include_pad, name="count_include_pad")
    divisor = check_divisor(divisor_override)
    xp = array_module(x)
    y = xp.empty(x.shape[:2] + out_hw, dtype=x.dtype)
    cache = PoolCache(tuple(x.shape), x.dtype, kernel, stride, pad, dilation, include, out_hw,
                      None, backend(x) == "cuda", divisor)
    kernels = _kernels(x)
    if cache.gpu:
        kernels.avg_pool(xp.ascontiguousarray(x), kernel, stride, pad, include, divisor, y)
    else:
        kernels.avg_pool(x, *kernel, *stride, *pad, include, divisor, y)
    return y, cache


def avg_pool2d_backward(dy, cache, needs=None):
    """dx (N, C, H, W): each window's dy / D spread over its in-bounds entries. ``needs``
    as in ``max_pool2d_backward``."""
    dy = _check_pool_dy(dy, cache)
    xp = array_module(dy)
    dx = xp.empty(cache.x_shape, dtype=cache.dtype)
    kernels = _kernels(dy)
    if cache.gpu:
        kernels.avg_pool_backward(xp.ascontiguousarray(dy), cache.kernel, cache.stride,
                                  cache.padding, cache.count_include_pad, cache.divisor, dx)
    else:
        kernels.avg_pool_backward(dy, *cache.kernel, *cache.stride, *cache.padding,
                                  cache.count_include_pad, cache.divisor, dx)
    return dx
