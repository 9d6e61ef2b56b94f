"""Numba kernels for the diagonal linear recurrence h_t = a_t * h_{t-1} + b_t.

Arrays are C-contiguous (B, T, D) (real or complex, one dtype); ``h0`` is (B, D). Nothing is
validated here (``nnkit.kernels.scan`` does that); outputs are preallocated by the caller.

Two ways to be parallel, chosen by ``nnkit.kernels.scan``:

- over sequences (``scan_rows``, ``scan_rows_backward``): the B x D recurrences are
  independent. A task is one batch row and a block of ``block`` consecutive features; it walks
  T sequentially with the feature loop innermost (contiguous, vectorised). Work-efficient:
  a, b read once, h written once (the bandwidth bound).
- chunked along T (``chunk_reduce``, ``chunk_carries``, ``chunk_apply``, on (S, T) views of
  S = B sequences when D = 1) when there are too few sequences to feed the threads
  (B = D = 1, T = 10^7). Reduce-then-scan: each chunk c reduces its
  pairs to one affine map h -> A_c h + H_c (in parallel, the last chunk skipped), a short serial
  scan over the chunks gives each chunk's incoming state, and every chunk rescans from it
  (in parallel). Five array passes instead of three, but the T-long dependency chain is cut
  into chunks that run at once.

The reverse direction (h_t = a_t * h_{t+1} + b_t, t from T-1 down) walks the same arrays
backwards. ``fastmath`` is off: NaN and inf propagate as in the sequential loop.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import prange

from ._dispatch import serial_or_parallel

__all__ = ["scan_rows", "scan_rows_backward", "scan_rows_real", "scan_rows_pairs",
           "scan_rows_backward_real", "scan_rows_backward_pairs", "chunk_reduce",
           "chunk_carries", "chunk_apply", "conj_shift", "log_scan_rows", "copy"]


def _scan_rows(a, b, h0, out, reverse, block):
    """out[i, t] = a[i, t] * out[i, t -+ 1] + b[i, t], tasks over (batch, feature block).

    The feature loop runs over 1-D views of one time step: indexing the 3-D arrays inside
    it did not vectorise (measured at (16, 4096, 256) float32: 16.0 ms with 3-D indexing,
    6.9 ms with the views, a copy of one array 6.1 ms).
    """
    B, T, D = a.shape
    nblk = (D + block - 1) // block
    step = -1 if reverse else 1
    first = T - 1 if reverse else 0
    for task in prange(B * nblk):
        i = task // nblk
        d0 = (task % nblk) * block
        d1 = min(D, d0 + block)
        if T == 0:
            continue
        t = first
        prev = h0[i, d0:d1]
        for _ in range(T):
            h, a_t, b_t = out[i, t, d0:d1], a[i, t, d0:d1], b[i, t, d0:d1]
            for d in range(d1 - d0):
                h[d] = a_t[d] * prev[d] + b_t[d]
            prev = h
            t += step


def _scan_rows_pairs(a, b, h0, out, reverse, block):
    """``_scan_rows`` for complex arrays given as their float views (B, T, 2D): the complex
    product spelled out on (re, im) pairs, which LLVM vectorises where it does not vectorise
    Numba's complex type (complex64 at (16, 4096, 256): 34 ms -> 18 ms, a copy 11 ms).
    ``block`` counts complex features."""
    B, T, D2 = a.shape
    D = D2 // 2
    nblk = (D + block - 1) // block
    step = -1 if reverse else 1
    first = T - 1 if reverse else 0
    for task in prange(B * nblk):
        i = task // nblk
        d0 = 2 * ((task % nblk) * block)
        d1 = 2 * min(D, (task % nblk) * block + block)
        if T == 0:
            continue
        t = first
        prev = h0[i, d0:d1]
        for _ in range(T):
            h, a_t, b_t = out[i, t, d0:d1], a[i, t, d0:d1], b[i, t, d0:d1]
            for k in range((d1 - d0) // 2):  # range(0, n, 2) did not vectorise
                d = 2 * k
                ar, ai, pr, pi = a_t[d], a_t[d + 1], prev[d], prev[d + 1]
                h[d] = ar * pr - ai * pi + b_t[d]
                h[d + 1] = ar * pi + ai * pr + b_t[d + 1]
            prev = h
            t += step


def _scan_rows_backward(dh, a, h, h0, da, db, dh0, reverse, block):
    """Reverse scan of the gradients (conjugate convention, g = dL/dRe + i dL/dIm).

    g_t = dh_t + conj(a_{t+1}) g_{t+1} (forward direction; t-1 for ``reverse``) is written to
    ``db``; da_t = g_t * conj(h_{t-1}) (h_{-1} = h0); dh0 = conj(a_first) * g_first.
    """
    B, T, D = a.shape
    nblk = (D + block - 1) // block
    step = 1 if reverse else -1  # the direction of the gradient walk
    last = 0 if reverse else T - 1  # where the gradient walk starts
    for task in prange(B * nblk):
        i = task // nblk
        d0 = (task % nblk) * block
        d1 = min(D, d0 + block)
        if T == 0:
            for d in range(d0, d1):
                dh0[i, d] = 0
            continue
        t = last
        for d in range(d0, d1):
            db[i, t, d] = dh[i, t, d]
        for _ in range(1, T):
            t += step
            # one loop over 1-D views (indexing the 3-D arrays in it did not vectorise)
            g_new, g_old = db[i, t, d0:d1], db[i, t - step, d0:d1]
            a_old, dh_new = a[i, t - step, d0:d1], dh[i, t, d0:d1]
            da_old, h_new = da[i, t - step, d0:d1], h[i, t, d0:d1]
            for d in range(d1 - d0):
                g = g_old[d]
                g_new[d] = dh_new[d] + a_old[d].conjugate() * g
                da_old[d] = g * h_new[d].conjugate()
        for d in range(d0, d1):
            da[i, t, d] = db[i, t, d] * h0[i, d].conjugate()
            dh0[i, d] = a[i, t, d].conjugate() * db[i, t, d]


def _scan_rows_backward_pairs(dh, a, h, h0, da, db, dh0, reverse, block):
    """``_scan_rows_backward`` for complex arrays given as float views (B, T, 2D), (B, 2D):
    conj(a) g = (ar gr + ai gi, ar gi - ai gr), g conj(h) = (gr hr + gi hi, gi hr - gr hi)."""
    B, T, D2 = a.shape
    D = D2 // 2
    nblk = (D + block - 1) // block
    step = 1 if reverse else -1
    last = 0 if reverse else T - 1
    for task in prange(B * nblk):
        i = task // nblk
        d0 = 2 * ((task % nblk) * block)
        d1 = 2 * min(D, (task % nblk) * block + block)
        if T == 0:
            for d in range(d0, d1):
                dh0[i, d] = 0
            continue
        t = last
        for d in range(d0, d1):
            db[i, t, d] = dh[i, t, d]
        for _ in range(1, T):
            t += step
            g_new, g_old = db[i, t, d0:d1], db[i, t - step, d0:d1]
            a_old, dh_new = a[i, t - step, d0:d1], dh[i, t, d0:d1]
            da_old, h_new = da[i, t - step, d0:d1], h[i, t, d0:d1]
            for k in range((d1 - d0) // 2):
                d = 2 * k
                ar, ai, gr, gi = a_old[d], a_old[d + 1], g_old[d], g_old[d + 1]
                hr, hi = h_new[d], h_new[d + 1]
                g_new[d] = dh_new[d] + (ar * gr + ai * gi)
                g_new[d + 1] = dh_new[d + 1] + (ar * gi - ai * gr)
                da_old[d] = gr * hr + gi * hi
                da_old[d + 1] = gi * hr - gr * hi
        g, h_0, a_t, da_t = db[i, t, d0:d1], h0[i, d0:d1], a[i, t, d0:d1], da[i, t, d0:d1]
        for d in range(0, d1 - d0, 2):
            gr, gi = g[d], g[d + 1]
            da_t[d] = gr * h_0[d] + gi * h_0[d + 1]
            da_t[d + 1] = gi * h_0[d] - gr * h_0[d + 1]
            dh0[i, d0 + d] = a_t[d] * gr + a_t[d + 1] * gi
            dh0[i, d0 + d + 1] = a_t[d] * gi - a_t[d + 1] * gr


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
    log h_t for h_t = a_t h_{t-1} + b_t with a, b > 0 given as logs (-inf allowed)."""
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
                if hi == -np.inf:
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
scan_rows_real = serial_or_parallel(_scan_rows)
scan_rows_pairs = serial_or_parallel(_scan_rows_pairs)
scan_rows_backward_real = serial_or_parallel(_scan_rows_backward)
scan_rows_backward_pairs = serial_or_parallel(_scan_rows_backward_pairs)
chunk_reduce = serial_or_parallel(_chunk_reduce)
chunk_apply = serial_or_parallel(_chunk_apply)
conj_shift = serial_or_parallel(_conj_shift)
log_scan_rows = serial_or_parallel(_log_scan_rows)
copy = serial_or_parallel(_copy)
chunk_carries = numba.njit(cache=True)(_chunk_carries)


def _as_pairs(*arrays):
    """Float views of complex arrays: the last axis holds (re, im) pairs."""
    return tuple(x.view(x.real.dtype) for x in arrays)


def scan_rows(a, b, h0, out, reverse, block):
    """The forward scan over sequences (``_scan_rows``; complex arrays as (re, im) pairs)."""
    if a.dtype.kind == "c":
        return scan_rows_pairs(*_as_pairs(a, b, h0, out), reverse, block)
    return scan_rows_real(a, b, h0, out, reverse, block)


def scan_rows_backward(dh, a, h, h0, da, db, dh0, reverse, block):
    """The gradient scan over sequences (``_scan_rows_backward``; complex as pairs)."""
    if a.dtype.kind == "c":
        return scan_rows_backward_pairs(*_as_pairs(dh, a, h, h0, da, db, dh0), reverse, block)
    return scan_rows_backward_real(dh, a, h, h0, da, db, dh0, reverse, block)


def num_threads() -> int:
    """Numba's thread count (the parallel builds use this many)."""
    return numba.get_num_threads()
