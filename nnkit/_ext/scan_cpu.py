"""CPU kernels for the diagonal linear recurrence h_t = a_t * h_{t-1} + b_t.

Arrays are C-contiguous (B, T, D) (real or complex, one dtype); ``h0`` is (B, D). Nothing is
validated here (``nnkit.kernels.scan`` does that); outputs are preallocated by the caller.

Launchers (``linear_scan`` and ``linear_scan_backward`` have the names and signatures of
``nnkit._ext.scan_cuda``'s; ``log_linear_scan`` is CPU only):

- ``linear_scan(a, b, h0, out, reverse)``
- ``linear_scan_backward(dh, a, h, h0, da, db, dh0, reverse)``
- ``log_linear_scan(log_a, log_b, log_h0, out)``

They choose between two ways to be parallel (``plan``):

- over sequences (``scan_rows``, ``scan_rows_backward``): the B x D recurrences are
  independent. A task is one batch row and a block of ``block`` consecutive features; it walks
  T sequentially with the feature loop innermost (contiguous, vectorised). Work-efficient:
  a, b read once, h written once (the bandwidth bound). Each task is one call of a C kernel
  (scan_rows.h, through ``row_forward``/``row_backward``) that keeps the carried state in L1,
  streams large outputs past the caches and walks down through T in descending address
  order; see that header for the measurements behind each choice. Feature blocks are whole
  rows (D) unless B is smaller than twice the thread count; then D is cut into blocks of at
  least ``MIN_BLOCK`` features (short blocks defeat the hardware prefetcher: block 32 of
  D = 256 ran many times slower than whole rows: benchmarks/RESULTS.md, "Figures moved
  from code comments"). With one feature (D = 1) a task is one sequence contiguous in T,
  and the C kernel vectorises along T instead (``scan_time_body.h``: each vector of 1-16
  steps is composed in registers, and only one multiply-add per vector waits for the
  previous state), so a single sequence streams at memory speed on one core, several times
  the one-chain loop (benchmarks/RESULTS.md, "Linear recurrences"). Its products of
  consecutive coefficients reassociate the loop: equal to rounding, NaN reaches every later
  step, but an infinite coefficient may give NaN where the loop gives +-inf.
- chunked along T (``chunk_reduce``, ``chunk_carries``, ``chunk_apply``, on (S, T) views of
  S = B sequences when D = 1; ``scan_chunked``, ``backward_chunked``) when there are too few
  sequences to feed the threads: D = 1 problems with B < ``CHUNK_MAX_SEQUENCES`` and
  T >= ``CHUNK_MIN_T``, and only with at least ``CHUNK_MIN_THREADS`` = 16 threads.
  Reduce-then-scan over ``CHUNK_LANES`` x threads chunks: each chunk c reduces its pairs to
  one affine map h -> A_c h + H_c (in parallel, the last chunk skipped), a short serial scan
  over the chunks gives each chunk's incoming state, and every chunk rescans from it (in
  parallel), each task walking ``CHUNK_LANES`` chunks in lockstep (independent dependency
  chains overlap on one core). Five array passes instead of three, each chunk a scalar
  chain: against the one-thread vectorised kernel the chunks on two threads lose by far at
  (1, 10^7, 1) (benchmarks/RESULTS.md, "Linear recurrences"), so they need several times
  the threads just to draw level, and then the memory bandwidth of more than one core to
  win: 16 is an estimate of where that starts, not a measurement (the machine measured has
  2 cores). The tests hold the chunked kernels to the sequential twin whatever ``plan``
  says.

The reverse direction (h_t = a_t * h_{t+1} + b_t, t from T-1 down) walks the same arrays
backwards. ``fastmath`` is off: NaN and inf propagate as in the sequential loop.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import binding
from numba import prange, types
from numba.extending import overload

from .._machine import stream_min_bytes
from . import scan_rows as _c
from ._dispatch import serial_or_parallel
from .launchers import launchers

__all__ = [*launchers("scan_cpu", "scan_cuda"), "log_linear_scan", "plan", "scan_chunked",
           "backward_chunked", "scan_rows", "scan_rows_backward", "scan_rows_builds",
           "scan_rows_backward_builds", "STREAM_MIN_BYTES", "MIN_BLOCK", "CHUNK_MAX_SEQUENCES",
           "CHUNK_MIN_T", "CHUNK_MIN_THREADS", "CHUNK_LANES", "chunk_reduce", "chunk_carries",
           "chunk_apply", "conj_shift", "log_scan_rows", "copy", "num_threads"]

MIN_BLOCK = 64  # features of a task at least, when D is cut into blocks
# Chunk along T only when fewer independent sequences than this and at least this many steps.
CHUNK_MAX_SEQUENCES = 2
CHUNK_MIN_T = 1 << 20
CHUNK_MIN_THREADS = 16
CHUNK_LANES = 8  # chunks a task walks in lockstep


# ---- over sequences: the C row kernels of scan_rows.h ---------------------------------------

for _name, _address in _c.addresses().items():
    binding.add_symbol(_name, _address)
_FWD_SIGNATURE = types.void(*[types.voidptr] * 4, types.intp, types.intp, types.intp,
                            types.intc, types.intc)
_BWD_SIGNATURE = types.void(*[types.voidptr] * 7, types.intp, types.intp, types.intp,
                            types.intc, types.intc)
_TYPE_NAMES = {types.float32: "f32", types.float64: "f64", types.complex64: "c64",
               types.complex128: "c128"}

# Output arrays of at least this many bytes are written with non-temporal stores: from 4 MB
# per array on, streamed stores were as fast as plain ones forward and faster backward, and
# below it slower (a sweep of (16, T, 256) float32: benchmarks/RESULTS.md, "Linear
# recurrences" and "Figures moved from docstrings"). That is one core's share of a 32 MiB L3
# shared by 8 cores; ``nnkit._machine.stream_min_bytes`` is that share on this machine.
STREAM_MIN_BYTES = stream_min_bytes()


def _c_kernel(way, dtype):
    """(the C kernel of ``way`` for this Numba dtype, scalars per element)."""
    signature = _FWD_SIGNATURE if way == "fwd" else _BWD_SIGNATURE
    kernel = types.ExternalFunction(f"nnkit_scan_{way}_{_TYPE_NAMES[dtype]}", signature)
    return kernel, 2 if isinstance(dtype, types.Complex) else 1


def row_forward(a, b, h0, out, T, D, n, reverse, nt):
    """The C forward kernel on one task: a, b, out at (i, 0, d0), h0 at (i, d0); T steps
    D features apart, n features; inlined into the Numba kernels (the overload below), and
    callable from Python too."""
    _row_forward_jit(a, b, h0, out, T, D, n, reverse, nt)


@overload(row_forward, inline="always")
def _row_forward(a, b, h0, out, T, D, n, reverse, nt):
    kernel, k = _c_kernel("fwd", a.dtype)

    def impl(a, b, h0, out, T, D, n, reverse, nt):
        kernel(a.ctypes, b.ctypes, h0.ctypes, out.ctypes, T, k * D, k * n, reverse, nt)

    return impl


def row_backward(dh, a, h, h0, da, db, dh0, T, D, n, reverse, nt):
    """The C backward kernel on one task (pointers as ``row_forward``); callable from
    Python too."""
    _row_backward_jit(dh, a, h, h0, da, db, dh0, T, D, n, reverse, nt)


@overload(row_backward, inline="always")
def _row_backward(dh, a, h, h0, da, db, dh0, T, D, n, reverse, nt):
    kernel, k = _c_kernel("bwd", a.dtype)

    def impl(dh, a, h, h0, da, db, dh0, T, D, n, reverse, nt):
        kernel(dh.ctypes, a.ctypes, h.ctypes, h0.ctypes, da.ctypes, db.ctypes, dh0.ctypes, T,
               k * D, k * n, reverse, nt)

    return impl


@numba.njit(cache=True)
def _row_forward_jit(a, b, h0, out, T, D, n, reverse, nt):
    row_forward(a, b, h0, out, T, D, n, reverse, nt)


@numba.njit(cache=True)
def _row_backward_jit(dh, a, h, h0, da, db, dh0, T, D, n, reverse, nt):
    row_backward(dh, a, h, h0, da, db, dh0, T, D, n, reverse, nt)


def _scan_rows(a, b, h0, out, reverse, block, nt):
    """out[i, t] = a[i, t] * out[i, t -+ 1] + b[i, t]: tasks of (batch row, ``block``
    features), each one call of the C kernel (which walks T); T >= 1."""
    B, T, D = a.shape
    nblk = (D + block - 1) // block
    for task in prange(B * nblk):
        i = task // nblk
        d0 = (task % nblk) * block
        n = min(D, d0 + block) - d0
        row_forward(a[i, 0, d0:], b[i, 0, d0:], h0[i, d0:], out[i, 0, d0:], T, D, n,
                    reverse, nt)


def _scan_rows_backward(dh, a, h, h0, da, db, dh0, reverse, block, nt):
    """The gradient scan (conjugate convention, g = dL/dRe + i dL/dIm): g_t = dh_t +
    conj(a_{t+1}) g_{t+1} (t - 1 for ``reverse``) into db, da_t = g_t conj(h_{t-1}) (h_{-1} =
    h0), dh0 = conj(a_first) g_first; tasks as ``_scan_rows``; T >= 1."""
    B, T, D = a.shape
    nblk = (D + block - 1) // block
    for task in prange(B * nblk):
        i = task // nblk
        d0 = (task % nblk) * block
        n = min(D, d0 + block) - d0
        row_backward(dh[i, 0, d0:], a[i, 0, d0:], h[i, 0, d0:], h0[i, d0:], da[i, 0, d0:],
                     db[i, 0, d0:], dh0[i, d0:], T, D, n, reverse, nt)


scan_rows_builds = serial_or_parallel(_scan_rows)
scan_rows_backward_builds = serial_or_parallel(_scan_rows_backward)


def scan_rows(a, b, h0, out, reverse, block, nt=None):
    """``_scan_rows``; ``nt`` (default: by size, STREAM_MIN_BYTES) streams the output past
    the caches."""
    if a.shape[1] == 0:
        return
    nt = out.nbytes >= STREAM_MIN_BYTES if nt is None else nt
    scan_rows_builds(a, b, h0, out, bool(reverse), block, bool(nt))


def scan_rows_backward(dh, a, h, h0, da, db, dh0, reverse, block, nt=None):
    """``_scan_rows_backward``; ``nt`` as in ``scan_rows``."""
    if a.shape[1] == 0:
        dh0[...] = 0
        return
    nt = da.nbytes >= STREAM_MIN_BYTES if nt is None else nt
    scan_rows_backward_builds(dh, a, h, h0, da, db, dh0, bool(reverse), block, bool(nt))


def _lane_table(bounds, S, q0, q1):
    """For pieces q0..q1-1 (piece q = chunk q // S of sequence q % S): their chunk, sequence,
    first and one-past-last scan positions, and the longest piece."""
    n = q1 - q0
    cs = np.empty(n, np.int64)
    ss = np.empty(n, np.int64)
    k0 = np.empty(n, np.int64)
    k1 = np.empty(n, np.int64)
    longest = 0
    for l in range(n):
        cs[l], ss[l] = (q0 + l) // S, (q0 + l) % S
        k0[l], k1[l] = bounds[cs[l]], bounds[cs[l] + 1]
        longest = max(longest, k1[l] - k0[l])
    return cs, ss, k0, k1, longest


def _chunk_reduce(a, b, bounds, A, H, reverse, lanes):
    """Sequences a, b (S, T) contiguous in T. For chunk c < C-1 (scan positions
    bounds[c]:bounds[c+1]) the affine map of its pairs, h_end = A[c] * h_start + H[c] with
    A, H (C, S): the product of a and the state from zero.

    A task walks ``lanes`` (chunk, sequence) pieces in lockstep: their dependency chains are
    independent, so one core overlaps them (one chain alone is latency-bound).
    """
    S, T = a.shape
    C = bounds.shape[0] - 1
    n = (C - 1) * S
    for task in prange((n + lanes - 1) // lanes):
        cs, ss, k0, k1, longest = _lane_table(bounds, S, task * lanes,
                                              min(n, (task + 1) * lanes))
        h = np.zeros(cs.shape[0], a.dtype)
        p = np.ones(cs.shape[0], a.dtype)
        for j in range(longest):
            for l in range(cs.shape[0]):
                k = k0[l] + j
                if k < k1[l]:
                    t = T - 1 - k if reverse else k
                    h[l] = a[ss[l], t] * h[l] + b[ss[l], t]
                    p[l] = p[l] * a[ss[l], t]
        for l in range(cs.shape[0]):
            A[cs[l], ss[l]] = p[l]
            H[cs[l], ss[l]] = h[l]


def _chunk_carries(A, H, h0, carry):
    """carry[0] = h0, carry[c+1] = A[c] * carry[c] + H[c]: the state entering each chunk."""
    C = carry.shape[0]
    carry[0] = h0
    for c in range(C - 1):
        carry[c + 1] = A[c] * carry[c] + H[c]


def _chunk_apply(a, b, bounds, carry, out, reverse, lanes):
    """Rescan every (chunk, sequence) piece from its incoming state carry[c, s], ``lanes``
    pieces a task in lockstep."""
    S, T = a.shape
    C = bounds.shape[0] - 1
    n = C * S
    for task in prange((n + lanes - 1) // lanes):
        cs, ss, k0, k1, longest = _lane_table(bounds, S, task * lanes,
                                              min(n, (task + 1) * lanes))
        h = np.empty(cs.shape[0], a.dtype)
        for l in range(cs.shape[0]):
            h[l] = carry[cs[l], ss[l]]
        for j in range(longest):
            for l in range(cs.shape[0]):
                k = k0[l] + j
                if k < k1[l]:
                    t = T - 1 - k if reverse else k
                    h[l] = a[ss[l], t] * h[l] + b[ss[l], t]
                    out[ss[l], t] = h[l]


def _log_scan_rows(la, lb, lh0, out, reverse, block):
    """The scan in the log semiring (real): out_t = logaddexp(la_t + out_{t-1}, lb_t), i.e.
    log h_t for h_t = a_t h_{t-1} + b_t with a, b > 0 given as logs (-inf allowed); NaN
    propagates, as NumPy's logaddexp."""
    B, T, D = la.shape
    nblk = (D + block - 1) // block
    step = -1 if reverse else 1
    first = T - 1 if reverse else 0
    for task in prange(B * nblk):
        i = task // nblk
        d0 = (task % nblk) * block
        d1 = min(D, d0 + block)
        t = first
        for k in range(T):
            for d in range(d0, d1):
                prev = lh0[i, d] if k == 0 else out[i, t - step, d]
                x = la[i, t, d] + prev
                y = lb[i, t, d]
                hi = max(x, y)
                if x != x or y != y:  # NaN in, NaN out (max(x, NaN) is x)
                    out[i, t, d] = x + y
                elif hi == -np.inf or hi == np.inf:  # logaddexp(inf, inf) = inf
                    out[i, t, d] = hi
                else:
                    out[i, t, d] = hi + np.log1p(np.exp(min(x, y) - hi))
            t += step


def _copy(src, dst):
    """dst = src over (B, T, D), parallel over B: the bandwidth reference of the benchmarks."""
    for i in prange(src.shape[0]):
        dst[i] = src[i]


def _conj_shift(a, out, reverse):
    """out[:, t] = conj(a[:, t + 1]) (``reverse``: t - 1), 0 past the end: the coefficients
    of the gradient recurrence, for the chunked backward."""
    B, T, D = a.shape
    for i in prange(B):
        for t in range(T):
            s = t - 1 if reverse else t + 1
            for d in range(D):
                out[i, t, d] = a[i, s, d].conjugate() if 0 <= s < T else 0


_lane_table = numba.njit(cache=True)(_lane_table)  # called by the chunk kernels
chunk_reduce = serial_or_parallel(_chunk_reduce)
chunk_apply = serial_or_parallel(_chunk_apply)
conj_shift = serial_or_parallel(_conj_shift)
log_scan_rows = serial_or_parallel(_log_scan_rows)
copy = serial_or_parallel(_copy)
chunk_carries = numba.njit(cache=True)(_chunk_carries)


def num_threads() -> int:
    """Numba's thread count (the parallel builds use this many)."""
    return numba.get_num_threads()


# ---- the launchers --------------------------------------------------------------------------

def plan(B, T, D):
    """('chunks', n_chunks) or ('rows', feature block) for a (B, T, D) problem (see the
    module docstring)."""
    threads = num_threads()
    if (threads >= CHUNK_MIN_THREADS and D == 1 and B < CHUNK_MAX_SEQUENCES
            and T >= CHUNK_MIN_T):
        return "chunks", threads * CHUNK_LANES
    if B >= 2 * threads or D <= MIN_BLOCK:
        return "rows", max(D, 1)
    pieces = -(-2 * threads // B)
    return "rows", max(MIN_BLOCK, -(-D // pieces))


def scan_chunked(a, b, h0, out, reverse, n_chunks, lanes=None):
    """The chunked scan on D = 1 problems, as (B, T) sequences (views, no copies); returns
    ``out``."""
    B, T, _ = a.shape
    a2, b2, out2 = a.reshape(B, T), b.reshape(B, T), out.reshape(B, T)  # (S, T), S = B
    lanes = CHUNK_LANES if lanes is None else lanes
    bounds = np.linspace(0, T, n_chunks + 1).astype(np.int64)
    A = np.empty((n_chunks, B), a.dtype)
    H = np.empty_like(A)
    carry = np.empty_like(A)
    chunk_reduce(a2, b2, bounds, A, H, reverse, lanes)
    chunk_carries(A, H, h0.reshape(B), carry)
    chunk_apply(a2, b2, bounds, carry, out2, reverse, lanes)
    return out


def backward_chunked(dh, a, h, h0, da, db, dh0, reverse, n_chunks, lanes=None):
    """g by the chunked scan with coefficients conj(a) shifted by one step (into db), then
    da and dh0; returns (da, db, dh0)."""
    coef = np.empty_like(a)
    conj_shift(a, coef, reverse)
    scan_chunked(coef, dh, np.zeros_like(h0), db, not reverse, n_chunks, lanes)
    if reverse:  # h_prev(t) = h_{t+1}, h0 after the end
        np.multiply(db[:, :-1], h[:, 1:].conj(), out=da[:, :-1])
        np.multiply(db[:, -1], h0.conj(), out=da[:, -1])
        np.multiply(a[:, -1].conj(), db[:, -1], out=dh0)
    else:
        np.multiply(db[:, 1:], h[:, :-1].conj(), out=da[:, 1:])
        np.multiply(db[:, 0], h0.conj(), out=da[:, 0])
        np.multiply(a[:, 0].conj(), db[:, 0], out=dh0)
    return da, db, dh0


def linear_scan(a, b, h0, out, reverse):
    """h = scan(a, b) from h0 into ``out`` (B, T, D), over sequences or chunked along T
    (``plan``); returns ``out``."""
    mode, n = plan(*a.shape)
    if mode == "chunks":
        return scan_chunked(a, b, h0, out, reverse, n)
    scan_rows(a, b, h0, out, reverse, n)
    return out


def linear_scan_backward(dh, a, h, h0, da, db, dh0, reverse):
    """Fill da, db (B, T, D) and dh0 (B, D): the adjoint recurrence walked backwards, over
    sequences or chunked along T (``plan``)."""
    mode, n = plan(*a.shape)
    if mode == "chunks":
        backward_chunked(dh, a, h, h0, da, db, dh0, reverse, n)
    else:
        scan_rows_backward(dh, a, h, h0, da, db, dh0, reverse, n)


def log_linear_scan(log_a, log_b, log_h0, out):
    """log h = the scan of (a, b) in the log semiring, forward in T, into ``out`` (B, T, D);
    tasks over sequences (whole rows D when ``plan`` would chunk). Returns ``out``."""
    B, T, D = log_a.shape
    mode, n = plan(B, T, D)
    log_scan_rows(log_a, log_b, log_h0, out, False, n if mode == "rows" else D)
    return out
