"""Softmax, log-softmax and cross-entropy over the rows of 2-D arrays: Numba CUDA kernels.

One thread block per row: each thread strides over the row's columns, then a tree reduction
in shared memory combines the per-thread partial max / sum. The block has a power-of-two
number of threads, at most ``MAX_THREADS``, chosen from the row length by ``threads_for``.
Max-shift throughout (exp never sees a positive argument), so logits of +-1e4 are fine.

Arithmetic follows the storage dtype (float32 in float32, as torch's kernels accumulate
float32 in float): constants are made in the arrays' dtype (``x.dtype.type``), ``math.exp``
of a float32 is the float32 ``expf``. Each thread's row sum is compensated (Kahan,
``_kahan_add``) and the block combines them by a tree, so a sum's error stays a few ulps
whatever the row length (a 256k-class vocabulary is ~1000 terms per thread). float64 is
left where the caller's arrays are float64: cross-entropy's ``lse`` and ``loss_rows`` (N,)
(the row's logsumexp widened once per row), the batch mean over them (``_mean_valid_kernel``)
and ``n_valid``; the backward splits the float64 ``lse`` once per row into two floats of the
logits' dtype, so the per-element exp stays float32.

Launchers take 2-D C-contiguous device arrays (CuPy arrays, Numba device arrays, or NumPy
arrays under ``NUMBA_ENABLE_CUDASIM=1``) and preallocated outputs; they validate nothing
(``nnkit.kernels.softmax`` is the validated entry point) and launch through
``_launch.launch`` (CuPy's current stream). A launch with zero rows does nothing. The
launchers have the names and signatures of ``nnkit._ext.softmax_cpu``'s; the targets of
cross-entropy are never read on the host (``first_invalid_target`` says None): a target
outside [0, C) gives a NaN loss instead, so that no call waits for the device.
"""

from __future__ import annotations

import math

from numba import cuda

from ._launch import launch
from .launchers import launchers

__all__ = [*launchers("softmax_cpu", "softmax_cuda"), "MAX_THREADS", "threads_for"]

MAX_THREADS = 256  # shared-memory size of every reduction buffer; a power of two
# Block-size range used by the launchers (powers of two, block_max <= MAX_THREADS). The tests
# lower them under the simulator to run the strided loops on rows of a few columns.
block_min = 32
block_max = MAX_THREADS


def threads_for(n_cols: int) -> int:
    """Threads per block for rows of ``n_cols``: the next power of two, clipped to
    [block_min, block_max]."""
    t = block_min
    while t < n_cols and t < block_max:
        t *= 2
    return t


@cuda.jit(device=True)
def _kahan_add(s, c, v, zero):
    """Kahan's compensated ``s += v``: returns (s, c), the sum being s - c (c the rounding
    error so far). Once the sum is inf or NaN, c stays ``zero`` (the value 0 in the sum's
    dtype), so the plain sum's inf/NaN carries through."""
    y = v - c
    t = s + y
    c = (t - s) - y
    if c - c != zero:  # t overflowed, or v is inf/NaN
        c = zero
    return t, c


@cuda.jit(device=True)
def _block_sum(buf, tid, value):
    """Sum of ``value`` over the block (power-of-two size), returned to every thread; ``buf``
    a shared array of value's dtype."""
    buf[tid] = value
    cuda.syncthreads()
    s = cuda.blockDim.x // 2
    while s > 0:
        if tid < s:
            buf[tid] += buf[tid + s]
        cuda.syncthreads()
        s //= 2
    total = buf[0]
    cuda.syncthreads()  # buf may be reused right after
    return total


@cuda.jit(device=True)
def _block_max(buf, tid, value):
    """Max of ``value`` over the block (power-of-two size), returned to every thread."""
    buf[tid] = value
    cuda.syncthreads()
    s = cuda.blockDim.x // 2
    while s > 0:
        if tid < s:
            buf[tid] = max(buf[tid], buf[tid + s])
        cuda.syncthreads()
        s //= 2
    total = buf[0]
    cuda.syncthreads()
    return total


@cuda.jit(device=True)
def _row_max_sumexp(x, row, buf, tid):
    """(m, s) with m = max_j x[row, j] and s = sum_j exp(x[row, j] - m), in x's dtype (the
    per-thread sums compensated: s within a few ulps for any row length)."""
    n = x.shape[1]
    step = cuda.blockDim.x
    zero = x.dtype.type(0)
    m = x.dtype.type(-math.inf)
    for j in range(tid, n, step):
        m = max(m, x[row, j])
    m = _block_max(buf, tid, m)
    s = zero
    c = zero
    for j in range(tid, n, step):
        s, c = _kahan_add(s, c, math.exp(x[row, j] - m), zero)
    s = _block_sum(buf, tid, s - c)
    return m, s


@cuda.jit
def _softmax_kernel(x, out):
    buf = cuda.shared.array(MAX_THREADS, x.dtype)
    row = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    m, s = _row_max_sumexp(x, row, buf, tid)
    inv = x.dtype.type(1) / s
    for j in range(tid, x.shape[1], cuda.blockDim.x):
        out[row, j] = math.exp(x[row, j] - m) * inv


@cuda.jit
def _log_softmax_kernel(x, out):
    buf = cuda.shared.array(MAX_THREADS, x.dtype)
    row = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    m, s = _row_max_sumexp(x, row, buf, tid)
    log_s = math.log(s)
    for j in range(tid, x.shape[1], cuda.blockDim.x):
        out[row, j] = (x[row, j] - m) - log_s  # x - m first: exact near the max, even at 1e4


@cuda.jit
def _softmax_backward_kernel(dy, y, out):
    buf = cuda.shared.array(MAX_THREADS, y.dtype)
    row = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    n = y.shape[1]
    zero = y.dtype.type(0)
    dot = zero
    c = zero
    for j in range(tid, n, cuda.blockDim.x):
        dot, c = _kahan_add(dot, c, dy[row, j] * y[row, j], zero)
    dot = _block_sum(buf, tid, dot - c)
    for j in range(tid, n, cuda.blockDim.x):
        out[row, j] = y[row, j] * (dy[row, j] - dot)


@cuda.jit
def _log_softmax_backward_kernel(dy, y, out):
    buf = cuda.shared.array(MAX_THREADS, y.dtype)
    row = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    n = y.shape[1]
    zero = y.dtype.type(0)
    s = zero
    c = zero
    for j in range(tid, n, cuda.blockDim.x):
        s, c = _kahan_add(s, c, dy[row, j], zero)
    s = _block_sum(buf, tid, s - c)
    for j in range(tid, n, cuda.blockDim.x):
        out[row, j] = dy[row, j] - math.exp(y[row, j]) * s


@cuda.jit
def _cross_entropy_kernel(logits, target, ignore_index, lse, loss_rows):
    buf = cuda.shared.array(MAX_THREADS, logits.dtype)
    row = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    m, s = _row_max_sumexp(logits, row, buf, tid)
    if tid == 0:
        # lse and loss_rows are the caller's (float64 in nnkit's cache, so that the backward
        # keeps exp(logits - lse) exact at |logits| ~ 1e4): widened once per row
        wide = lse.dtype.type
        log_s = math.log(s)
        lse[row] = wide(m) + wide(log_s)
        t = target[row]
        lw = loss_rows.dtype.type
        if t == ignore_index:
            loss_rows[row] = lw(0)
        elif 0 <= t < logits.shape[1]:
            loss_rows[row] = (lw(m) - lw(logits[row, t])) + lw(log_s)
        else:  # out of range: validated upstream; never read out of bounds
            loss_rows[row] = lw(math.nan)


@cuda.jit(device=True)
def _cross_entropy_backward_row(logits, target, lse, scale, ignore_index, out, row):
    """out[row] = scale (softmax(logits[row]) - onehot(target[row])), 0 for an ignored row;
    the block's threads stride over the columns. ``scale`` in the logits' dtype."""
    tid = cuda.threadIdx.x
    dt = logits.dtype.type
    t = target[row]
    if t == ignore_index:
        zero = dt(0)
        for j in range(tid, logits.shape[1], cuda.blockDim.x):
            out[row, j] = zero
    else:
        # lse (float64 in nnkit's cache) = hi + lo, two numbers of the logits' dtype (once
        # per row), so that logits - lse is (logits - hi) - lo: exact where logits ~ hi
        hi = dt(lse[row])
        lo = dt(lse[row] - hi)
        one = dt(1)
        for j in range(tid, logits.shape[1], cuda.blockDim.x):
            p = math.exp((logits[row, j] - hi) - lo)
            if j == t:
                p -= one
            out[row, j] = p * scale


@cuda.jit
def _cross_entropy_backward_kernel(logits, target, lse, scale, ignore_index, out):
    _cross_entropy_backward_row(logits, target, lse, scale, ignore_index, out, cuda.blockIdx.x)


@cuda.jit
def _mean_valid_kernel(loss_rows, target, ignore_index, loss, n_valid):
    """One block: n_valid[0] = #(target != ignore_index) and loss[0] = sum(loss_rows) /
    n_valid[0] (NaN when no row is valid). The sum runs in loss_rows' dtype: float64 from
    nnkit's caller, whatever the logits' (a mean over a large batch)."""
    buf = cuda.shared.array(MAX_THREADS, loss_rows.dtype)
    tid = cuda.threadIdx.x
    acc = loss_rows.dtype.type
    s = acc(0)
    c = acc(0)
    for i in range(tid, loss_rows.shape[0], cuda.blockDim.x):
        s += loss_rows[i]
        if target[i] != ignore_index:
            c += acc(1)
    total = _block_sum(buf, tid, s)
    count = _block_sum(buf, tid, c)
    if tid == 0:
        loss[0] = total / count if count > acc(0) else acc(math.nan)
        n_valid[0] = count


@cuda.jit
def _cross_entropy_mean_backward_kernel(logits, target, lse, dloss, n_valid, ignore_index,
                                        out):
    dt = logits.dtype.type
    count = dt(n_valid[0])  # float64 (N,) from cross_entropy_mean: converted once
    scale = dt(dloss[0]) / count if count > dt(0) else dt(0)  # dloss / n_valid, on device
    _cross_entropy_backward_row(logits, target, lse, scale, ignore_index, out, cuda.blockIdx.x)


def _launch(kernel, rows, cols, *args):
    if rows == 0:
        return
    launch(kernel, rows, threads_for(cols), *args)


def softmax_rows(x, out):
    """out[i] = softmax(x[i]) for x, out (N, C)."""
    _launch(_softmax_kernel, x.shape[0], x.shape[1], x, out)


def log_softmax_rows(x, out):
    """out[i] = log_softmax(x[i]) = x[i] - logsumexp(x[i]) for x, out (N, C)."""
    _launch(_log_softmax_kernel, x.shape[0], x.shape[1], x, out)


def softmax_backward_rows(dy, y, out):
    """out = y * (dy - sum_j dy * y) row-wise, y = softmax(x); all (N, C)."""
    _launch(_softmax_backward_kernel, y.shape[0], y.shape[1], dy, y, out)


def log_softmax_backward_rows(dy, y, out):
    """out = dy - exp(y) * sum_j dy row-wise, y = log_softmax(x); all (N, C)."""
    _launch(_log_softmax_backward_kernel, y.shape[0], y.shape[1], dy, y, out)


def cross_entropy_rows(logits, target, ignore_index, lse, loss_rows):
    """lse (N,) = logsumexp of each row of logits (N, C); loss_rows (N,) = lse_i -
    logits[i, target_i], 0 where target_i == ignore_index (NaN for an out-of-range target)."""
    _launch(_cross_entropy_kernel, logits.shape[0], logits.shape[1], logits, target,
            int(ignore_index), lse, loss_rows)


def cross_entropy_backward_rows(logits, target, lse, scale, ignore_index, out):
    """out (N, C) = (softmax(logits) - onehot(target)) * scale, softmax = exp(logits - lse);
    rows where target == ignore_index are zero. ``scale`` is dloss / n_valid."""
    _launch(_cross_entropy_backward_kernel, logits.shape[0], logits.shape[1], logits, target,
            lse, logits.dtype.type(scale), int(ignore_index), out)


def cross_entropy_mean(loss_rows, target, ignore_index, loss, n_valid):
    """The mean over the valid rows, on the device: n_valid (1,) float64 = the rows whose
    target is not ``ignore_index``, loss (1,) (the logits' dtype) = sum(loss_rows) / n_valid
    (NaN when none is valid); loss_rows from ``cross_entropy_rows``. One block."""
    launch(_mean_valid_kernel, 1, threads_for(loss_rows.shape[0]), loss_rows, target,
           int(ignore_index), loss, n_valid)


def cross_entropy_mean_backward_rows(logits, target, lse, dloss, n_valid, ignore_index, out):
    """``cross_entropy_backward_rows`` with scale = dloss[0] / n_valid[0] read on the device
    (0 when no row is valid): dloss (1,) the upstream gradient, n_valid (1,) from
    ``cross_entropy_mean``. No host round trip."""
    _launch(_cross_entropy_mean_backward_kernel, logits.shape[0], logits.shape[1], logits,
            target, lse, dloss, n_valid, int(ignore_index), out)


def first_invalid_target(target, C, ignore_index):
    """None: the targets stay on the device, unread (the kernels give a NaN loss for a
    target outside [0, C); torch reports it by a device-side assert)."""
    return None
