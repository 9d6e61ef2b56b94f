"""Softmax, log-softmax and cross-entropy over the rows of 2-D arrays: Numba CUDA kernels.

One thread block per row: each thread strides over the row's columns, then a tree reduction
in shared memory combines the per-thread partial max / sum. The block has a power-of-two
number of threads, at most ``MAX_THREADS``, chosen from the row length by ``threads_for``.
Max-shift throughout (exp never sees a positive argument), so logits of +-1e4 are fine.

Accumulators are float64 for both float32 and float64 inputs (the per-element exp too); the
results are cast to the output's dtype. On data-centre GPUs float64 runs at half rate, and
these kernels are memory-bound.

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

from numba import cuda, float64

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
def _block_sum(buf, tid, value):
    """Sum of ``value`` over the block (power-of-two size), returned to every thread."""
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
    """(m, s) with m = max_j x[row, j] and s = sum_j exp(x[row, j] - m), in float64."""
    n = x.shape[1]
    step = cuda.blockDim.x
    m = -math.inf
    for j in range(tid, n, step):
        m = max(m, float64(x[row, j]))
    m = _block_max(buf, tid, m)
    s = 0.0
    for j in range(tid, n, step):
        s += math.exp(float64(x[row, j]) - m)
    s = _block_sum(buf, tid, s)
    return m, s


@cuda.jit
def _softmax_kernel(x, out):
    buf = cuda.shared.array(MAX_THREADS, float64)
    row = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    m, s = _row_max_sumexp(x, row, buf, tid)
    inv = 1.0 / s
    for j in range(tid, x.shape[1], cuda.blockDim.x):
        out[row, j] = math.exp(float64(x[row, j]) - m) * inv


@cuda.jit
def _log_softmax_kernel(x, out):
    buf = cuda.shared.array(MAX_THREADS, float64)
    row = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    m, s = _row_max_sumexp(x, row, buf, tid)
    lse = m + math.log(s)
    for j in range(tid, x.shape[1], cuda.blockDim.x):
        out[row, j] = float64(x[row, j]) - lse


@cuda.jit
def _softmax_backward_kernel(dy, y, out):
    buf = cuda.shared.array(MAX_THREADS, float64)
    row = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    n = y.shape[1]
    dot = 0.0
    for j in range(tid, n, cuda.blockDim.x):
        dot += float64(dy[row, j]) * float64(y[row, j])
    dot = _block_sum(buf, tid, dot)
    for j in range(tid, n, cuda.blockDim.x):
        out[row, j] = float64(y[row, j]) * (float64(dy[row, j]) - dot)


@cuda.jit
def _log_softmax_backward_kernel(dy, y, out):
    buf = cuda.shared.array(MAX_THREADS, float64)
    row = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    n = y.shape[1]
    s = 0.0
    for j in range(tid, n, cuda.blockDim.x):
        s += float64(dy[row, j])
    s = _block_sum(buf, tid, s)
    for j in range(tid, n, cuda.blockDim.x):
        out[row, j] = float64(dy[row, j]) - math.exp(float64(y[row, j])) * s


@cuda.jit
def _cross_entropy_kernel(logits, target, ignore_index, lse, loss_rows):
    buf = cuda.shared.array(MAX_THREADS, float64)
    row = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    m, s = _row_max_sumexp(logits, row, buf, tid)
    if tid == 0:
        value = m + math.log(s)
        lse[row] = value
        t = target[row]
        if t == ignore_index:
            loss_rows[row] = 0.0
        elif 0 <= t < logits.shape[1]:
            loss_rows[row] = value - float64(logits[row, t])
        else:  # out of range: validated upstream; never read out of bounds
            loss_rows[row] = math.nan


@cuda.jit(device=True)
def _cross_entropy_backward_row(logits, target, lse, scale, ignore_index, out, row):
    """out[row] = scale (softmax(logits[row]) - onehot(target[row])), 0 for an ignored row;
    the block's threads stride over the columns."""
    tid = cuda.threadIdx.x
    t = target[row]
    if t == ignore_index:
        for j in range(tid, logits.shape[1], cuda.blockDim.x):
            out[row, j] = 0.0
    else:
        value = float64(lse[row])
        for j in range(tid, logits.shape[1], cuda.blockDim.x):
            p = math.exp(float64(logits[row, j]) - value)
            if j == t:
                p -= 1.0
            out[row, j] = p * scale


@cuda.jit
def _cross_entropy_backward_kernel(logits, target, lse, scale, ignore_index, out):
    _cross_entropy_backward_row(logits, target, lse, scale, ignore_index, out, cuda.blockIdx.x)


@cuda.jit
def _mean_valid_kernel(loss_rows, target, ignore_index, loss, n_valid):
    """One block: n_valid[0] = #(target != ignore_index) and loss[0] = sum(loss_rows) /
    n_valid[0] (NaN when no row is valid)."""
    buf = cuda.shared.array(MAX_THREADS, float64)
    tid = cuda.threadIdx.x
    s = 0.0
    c = 0.0
    for i in range(tid, loss_rows.shape[0], cuda.blockDim.x):
        s += loss_rows[i]
        if target[i] != ignore_index:
            c += 1.0
    total = _block_sum(buf, tid, s)
    count = _block_sum(buf, tid, c)
    if tid == 0:
        loss[0] = total / count if count > 0.0 else math.nan
        n_valid[0] = count


@cuda.jit
def _cross_entropy_mean_backward_kernel(logits, target, lse, dloss, n_valid, ignore_index,
                                        out):
    count = n_valid[0]
    scale = float64(dloss[0]) / count if count > 0.0 else 0.0  # dloss / n_valid, on device
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
            lse, float(scale), int(ignore_index), out)


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
