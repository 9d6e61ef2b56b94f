"""Fused scaled-dot-product attention on the CPU: Numba kernels around BLAS tile GEMMs.

Launchers (the interface shared with ``nnkit._ext.attention_cuda``; no validation,
C-contiguous inputs of one float dtype, preallocated outputs; ``nnkit.kernels.attention``
is the validated entry point):

- ``attention_forward(q, k, v, mask, has_mask, causal, scale, dropout_p, seed, out, lse)``
- ``attention_backward(q, k, v, mask, has_mask, causal, scale, dropout_p, seed, out, lse,
  dout, dq, dk, dv)``
- ``fill_dropout_multipliers(seed, dropout_p, out, bh0=0)``

Shapes: q (B, H, L, E), k (B, H, S, E), v (B, H, S, Ev), mask (B, H, L, S) additive float
(a zero-stride broadcast view; read only when ``has_mask``), out (B, H, L, Ev), lse (B, H, L).

Forward (online softmax, Milakov & Gimelshein 2018; flash attention). Tasks are
(batch, head, query tile of ``Q_TILE`` rows, ``CAUSAL_Q_TILE`` when causal), run in
``prange`` (query tiles in the order 0, n-1, 1, n-2, ...: balanced causal halves). A task
keeps, per query row i, the running maximum m_i, the running sum l_i = sum_j exp(s_ij - m_i)
and the unnormalised output acc_i, and walks the key tiles of ``K_TILE`` keys:

    s = (q_tile * scale) @ k_tile^T + mask_tile   (BLAS GEMM into a (Q_TILE, K_TILE) scratch)
    m_new = max(m, rowmax s);  p = exp(s - m_new);  l = l exp(m - m_new) + rowsum p
    acc = acc exp(m - m_new) + dropout(p) @ v_tile                      (BLAS GEMM)

and finally out_i = acc_i / l_i, lse_i = m_i + log l_i. Only one (Q_TILE, K_TILE) scratch
per task exists: the (L, S) matrix is never materialised. With ``causal`` (torch's
``is_causal``: key j takes part for query i iff j <= i) key tiles right of the diagonal are
skipped. A row where no key takes part gets out = 0 and lse = -inf, as torch 2.13's CPU
kernel returns (zeros, zero gradients).

Backward (flash attention 2). D_i = sum_e dout_ie out_ie. Tasks are (batch, head, key
chunk): chunk c of ``n_chunks`` owns the key tiles (``BWD_K_TILE`` keys) c, c + n_chunks, ...
(interleaved so that causal chunks carry equal work). For each key tile it keeps dK and dV
accumulators and walks the query tiles of ``BWD_Q_TILE`` rows (from the diagonal on, when
causal), recomputing P from lse:

    p = exp(q_tile @ (scale k_tile)^T + mask - lse);  dp = dout_tile @ v_tile^T
    dV += (p z)^T @ dout_tile;  ds = p (dp z - D);  dK += ds^T @ q_tile;  dQ += ds @ (scale k)

with z the dropout multiplier (0 or 1/(1-p)). dK and dV of a key tile belong to one task;
dQ rows receive contributions from every chunk, so each chunk accumulates into its own
partial dQ (n_chunks, B, H, L, E), summed at the end. ``n_chunks`` = 1 (no extra memory)
when B H alone gives every thread two tasks, else one chunk per thread: the extra memory is
(threads - 1) copies of dQ, O(L E). Five GEMMs per tile pair, as flash attention 2 (a
separate dQ pass parallel over query tiles, free of partial sums, would recompute s and dp:
seven).

Dropout. Element (b, h, i, j) is kept iff u >= dropout_p, where u is SplitMix64's output
number n + 1 for the given seed, n = ((b H + h) L + i) S + j:

    z = seed + (n + 1) * 0x9E3779B97F4A7C15 (mod 2^64)
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9;  z = (z ^ (z >> 27)) * 0x94D049BB133111EB
    u = ((z ^ (z >> 31)) >> 11) * 2^-53

(``simd_math.splitmix64`` and ``uniform53``, compiled for the CUDA kernels too), so the
backward regenerates the forward's mask and no mask is stored; kept probabilities are
scaled by 1 / (1 - dropout_p). ``fill_dropout_multipliers`` writes a (B, H, L, S) matrix of
multipliers (never used by the fused kernels: for the gradient of a mask, one (L, S) slab at
a time), ``dropout_multipliers`` returns a new one (for the tests).

Speed. The GEMMs go through Numba's ``np.dot`` (SciPy's BLAS, limited to one thread by
``serial_step_blas`` while the kernels run: the tasks already fill the cores; two threads
calling it concurrently do overlap, measured). The elementwise work uses
``simd_math.exp_approx`` (a vectorisable polynomial exp: Numba compiles ``math.exp`` to a
scalar libm call, one element at a time) and ``simd_math.fmax`` (a row maximum that
vectorises). The kernels are GEMM-bound: the GEMMs take most of the forward and nearly all
of the backward on one thread (benchmarks/RESULTS.md, "Figures moved from docstrings").
The prange runs over ``_TASK_GROUPS`` contiguous groups of tasks, each allocating its
scratch once: a score tile allocated per task (512 KiB, served by mmap and page faults)
made the small causal forward markedly slower. The
parallel build runs when there are two tasks and ``PARALLEL_MIN_WORK`` multiply-adds (the
element count of q, which ``serial_or_parallel`` would use, says little here: the work is
L S (E + Ev)).

Tile sizes, from a sweep of query/key tiles (benchmarks/RESULTS.md, "Figures moved from
docstrings"): ``Q_TILE`` = 256, ``K_TILE`` = 512 (forward), ``CAUSAL_Q_TILE`` = 64 (small
query tiles skip more of the masked triangle), ``BWD_Q_TILE`` = 64, ``BWD_K_TILE`` = 128
(small scratch tiles).

Numerics. The row sums are compiled with ``fastmath={'reassoc'}`` only (vector partial
sums; NaN and inf still propagate); everything else is strict. The running sum l_i is kept
in float64.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numba import prange

from .._machine import parallel_pays
from ._dispatch import serial_or_parallel, serial_step_blas
from .launchers import launchers
from .simd_math import exp_approx, fmax, splitmix64, uniform53

__all__ = [*launchers("attention_cpu", "attention_cuda"), "dropout_multipliers", "Q_TILE",
           "CAUSAL_Q_TILE", "K_TILE", "BWD_Q_TILE", "BWD_K_TILE", "backward_chunks"]

# Tile sizes, measured (see the module docstring); tests shrink them to reach every tile
# boundary. Forward: query rows per task, keys per step. Backward: keys per tile (a task's
# unit), query rows per inner step.
Q_TILE = 256
CAUSAL_Q_TILE = 64  # causal: smaller query tiles skip more of the masked upper triangle
K_TILE = 512
BWD_Q_TILE = 64
BWD_K_TILE = 128

_TASK_GROUPS = 64  # prange iterations; each allocates its workspace once for its tasks


# ---- small helpers ----------------------------------------------------------------------------

def _zigzag(t, n):
    """A bijection of [0, n) pairing early and late tiles: 0, n-1, 1, n-2, ... (a
    contiguous half of tasks then carries half of the causal work)."""
    half = t // 2
    return half if t % 2 == 0 else n - 1 - half


_zigzag_jit = numba.njit(cache=True, inline="always")(_zigzag)


def _prepare_scores(row, mrow, has_mask, lim, neg):
    """row[:lim] += mrow[:lim] (when has_mask); row[lim:] = neg (-inf of the row's dtype);
    returns the row's max."""
    w = row.shape[0]
    mx = neg
    if has_mask:
        for c in range(lim):
            x = row[c] + mrow[c]
            row[c] = x
            mx = fmax(mx, x)
    else:
        for c in range(lim):
            mx = fmax(mx, row[c])
    for c in range(max(lim, 0), w):
        row[c] = neg
    return mx


_prepare_scores_jit = numba.njit(cache=True)(_prepare_scores)


def _mask_scores(row, mrow, has_mask, lim, neg):
    """row[:lim] += mrow[:lim] (when has_mask); row[lim:] = neg (no maximum)."""
    if has_mask:
        for c in range(lim):
            row[c] += mrow[c]
    for c in range(max(lim, 0), row.shape[0]):
        row[c] = neg


_mask_scores_jit = numba.njit(cache=True)(_mask_scores)


def _exp_shift_sum(row, shift, zero):
    """row = exp(row - shift) in place; returns the row's sum (float64). ``zero`` is 0 in
    the row's dtype (the accumulator's type)."""
    s = zero
    for c in range(row.shape[0]):
        e = exp_approx(row[c] - shift)
        row[c] = e
        s += e
    return np.float64(s)


_exp_shift_sum_jit = numba.njit(cache=True, fastmath={"reassoc"})(_exp_shift_sum)


def _dropout_row(row, seed, n0, p, keep_scale, zero):
    """row[c] *= z(n0 + c): 0 with probability p, else keep_scale (row's dtype)."""
    for c in range(row.shape[0]):
        u = uniform53(splitmix64(seed, n0 + c))
        row[c] = row[c] * keep_scale if u >= p else zero
    return row


_dropout_row_jit = numba.njit(cache=True)(_dropout_row)


def _constants(dtype, scale, p):
    """(scale, -inf, 1 / (1 - p), 0) as scalars of ``dtype`` (float32 math stays float32)."""
    c = np.empty(4, dtype)
    c[0] = scale
    c[1] = -np.inf
    c[2] = 1.0 / (1.0 - p)
    c[3] = 0.0
    return c[0], c[1], c[2], c[3]


_constants_jit = numba.njit(cache=True)(_constants)


def _add_into(dst, src):
    """dst += src (2-D, same shape)."""
    for r in range(dst.shape[0]):
        for c in range(dst.shape[1]):
            dst[r, c] += src[r, c]


_add_into_jit = numba.njit(cache=True)(_add_into)


# ---- forward ------------------------------------------------------------------------------

def _forward_block(qm, km, vm, mm, has_mask, causal, scale, p, seed, row0, om, lsem, i0, i1,
                   k_tile, ws, ws64):
    """Rows i0..i1 of one (batch, head): om (L, Ev) and lsem (L,) written. qm (L, E),
    km (S, E), vm (S, Ev), mm (L, S); row0 = (b H + h) L (the dropout counter's base).
    ws, ws64: flat scratch of the inputs' dtype and float64 (``_forward_workspace``)."""
    E = qm.shape[1]
    S = km.shape[0]
    Ev = vm.shape[1]
    n = i1 - i0
    sc, neg_inf, keep_scale, zero = _constants_jit(qm.dtype, scale, p)
    o_s = n * E  # offsets of the pieces of ws: qs, pv, acc, m, then the score tile
    o_pv = o_s + n * Ev
    o_acc = o_pv + n * Ev
    o_m = o_acc + n
    qs = ws[:o_s].reshape((n, E))
    for r in range(n):
        for e in range(E):
            qs[r, e] = qm[i0 + r, e] * sc
    pv = ws[o_s:o_pv].reshape((n, Ev))
    acc = ws[o_pv:o_acc].reshape((n, Ev))  # written by the first key tile's GEMM
    m = ws[o_acc:o_m]
    m[:] = neg_inf
    sbuf = ws[o_m:]
    lsum = ws64[:n]
    lsum[:] = 0.0
    j_end = min(S, i1) if causal else S
    for j0 in range(0, j_end, k_tile):
        j1 = min(j_end, j0 + k_tile)
        w = j1 - j0
        st = sbuf[: n * w].reshape((n, w))
        np.dot(qs, km[j0:j1].T, st)  # (n, w) scaled scores
        for r in range(n):
            i = i0 + r
            row = st[r]
            lim = min(w, i + 1 - j0) if causal else w
            mx = _prepare_scores_jit(row, mm[i, j0:j1], has_mask, lim, neg_inf)
            m_old = m[r]
            m_new = fmax(m_old, mx)
            shift = m_new if m_new != neg_inf else zero
            alpha = exp_approx(m_old - shift)
            lsum[r] = lsum[r] * alpha + _exp_shift_sum_jit(row, shift, zero)
            if j0 > 0 and alpha != 1:
                for e in range(Ev):
                    acc[r, e] *= alpha
            m[r] = m_new
            if p > 0:
                _dropout_row_jit(row, seed, (row0 + i) * S + j0, p, keep_scale, zero)
        if j0 == 0:
            np.dot(st, vm[j0:j1], acc)  # (n, w) @ (w, Ev)
        else:
            np.dot(st, vm[j0:j1], pv)
            _add_into_jit(acc, pv)
    for r in range(n):
        i = i0 + r
        if lsum[r] == 0:  # no key takes part (every score -inf): torch returns zeros
            for e in range(Ev):
                om[i, e] = 0.0
            lsem[i] = -np.inf
        else:  # (NaN scores give NaN sums and propagate)
            inv = 1.0 / lsum[r]
            for e in range(Ev):
                om[i, e] = acc[r, e] * inv
            lsem[i] = m[r] + math.log(lsum[r])


_forward_block_jit = numba.njit(cache=True)(_forward_block)


def _task_range(g, n_groups, n_tasks):
    """[lo, hi): the tasks of group g when n_tasks are cut into n_groups contiguous groups."""
    return g * n_tasks // n_groups, (g + 1) * n_tasks // n_groups


_task_range_jit = numba.njit(cache=True, inline="always")(_task_range)


def _forward_tasks(q, k, v, mask, has_mask, causal, scale, p, seed, out, lse, q_tile, k_tile):
    """prange over groups of (batch, head, query tile) tasks, one workspace per group; see
    the module docstring."""
    B, H, L, E = q.shape
    S = k.shape[2]
    Ev = v.shape[3]
    n_qt = (L + q_tile - 1) // q_tile
    n_tasks = B * H * n_qt
    n_groups = min(n_tasks, _TASK_GROUPS)
    ws_size = q_tile * (E + 2 * Ev + 1 + min(k_tile, S))
    for g in prange(n_groups):
        ws = np.empty(ws_size, q.dtype)
        ws64 = np.empty(q_tile)
        lo, hi = _task_range_jit(g, n_groups, n_tasks)
        for task in range(lo, hi):
            bh = task // n_qt
            qt = _zigzag_jit(task % n_qt, n_qt)
            b = bh // H
            h = bh % H
            i0 = qt * q_tile
            i1 = min(L, i0 + q_tile)
            _forward_block_jit(q[b, h], k[b, h], v[b, h], mask[b, h], has_mask, causal, scale,
                               p, seed, bh * L, out[b, h], lse[b, h], i0, i1, k_tile, ws, ws64)


forward_tasks = serial_or_parallel(_forward_tasks)


# ---- backward -----------------------------------------------------------------------------

def _backward_block(qm, km, vm, mm, has_mask, causal, scale, p, seed, row0, lsem, dom,
                    deltam, dqm, dkm, dvm, j0, j1, q_tile, ws):
    """Key rows j0..j1 of one (batch, head): dkm, dvm rows written, dqm (L, E) accumulated.
    ws: flat scratch of the inputs' dtype (``_backward_tasks`` sizes it)."""
    L, E = qm.shape
    S = km.shape[0]
    Ev = vm.shape[1]
    w = j1 - j0
    sc, neg_inf, keep_scale, zero = _constants_jit(qm.dtype, scale, p)
    o1 = w * E  # offsets of the pieces of ws
    o2 = o1 + w * E
    o3 = o2 + w * Ev
    o4 = o3 + w * E
    o5 = o4 + w * Ev
    o6 = o5 + q_tile * w
    o7 = o6 + q_tile * w
    ks = ws[:o1].reshape((w, E))  # scale * k_tile
    for c in range(w):
        for e in range(E):
            ks[c, e] = km[j0 + c, e] * sc
    vt = vm[j0:j1]
    dk_acc = ws[o1:o2].reshape((w, E))
    dk_acc[:] = 0  # zero: causal tiles may see no query at all
    dv_acc = ws[o2:o3].reshape((w, Ev))
    dv_acc[:] = 0
    tmp_k = ws[o3:o4].reshape((w, E))
    tmp_v = ws[o4:o5].reshape((w, Ev))
    sbuf = ws[o5:o6]
    dpbuf = ws[o6:o7]
    tqbuf = ws[o7 : o7 + q_tile * E]
    dbuf = ws[o7 + q_tile * E :]
    i_start = (j0 // q_tile) * q_tile if causal else 0
    for i0 in range(i_start, L, q_tile):
        i1 = min(L, i0 + q_tile)
        n = i1 - i0
        st = sbuf[: n * w].reshape((n, w))
        dpt = dpbuf[: n * w].reshape((n, w))
        tq = tqbuf[: n * E].reshape((n, E))
        np.dot(qm[i0:i1], ks.T, st)  # (n, w) scaled scores
        np.dot(dom[i0:i1], vt.T, dpt)  # (n, w) dout v^T
        for r in range(n):
            i = i0 + r
            row = st[r]
            dprow = dpt[r]
            lim = min(w, i + 1 - j0) if causal else w
            lse_i = lsem[i]
            if lse_i == neg_inf or lim <= 0:
                for c in range(w):
                    row[c] = zero
                    dprow[c] = zero
                continue
            _mask_scores_jit(row, mm[i, j0:j1], has_mask, lim, neg_inf)
            _exp_shift_sum_jit(row, lse_i, zero)  # row = P
            dbuf[0] = deltam[i]
            d_i = dbuf[0]
            if p > 0:
                n0 = (row0 + i) * S + j0
                for c in range(w):
                    z = keep_scale if uniform53(splitmix64(seed, n0 + c)) >= p else zero
                    pc = row[c]
                    dprow[c] = pc * (dprow[c] * z - d_i)
                    row[c] = pc * z
            else:
                for c in range(w):
                    dprow[c] = row[c] * (dprow[c] - d_i)
        if i0 == i_start:
            np.dot(st.T, dom[i0:i1], dv_acc)  # (w, Ev): (p z)^T dout
            np.dot(dpt.T, qm[i0:i1], dk_acc)  # (w, E): ds^T q
        else:
            np.dot(st.T, dom[i0:i1], tmp_v)
            _add_into_jit(dv_acc, tmp_v)
            np.dot(dpt.T, qm[i0:i1], tmp_k)
            _add_into_jit(dk_acc, tmp_k)
        np.dot(dpt, ks, tq)  # (n, E): ds (scale k)
        _add_into_jit(dqm[i0:i1], tq)
    for c in range(w):
        for e in range(E):
            dkm[j0 + c, e] = dk_acc[c, e] * sc
        for e in range(Ev):
            dvm[j0 + c, e] = dv_acc[c, e]


_backward_block_jit = numba.njit(cache=True)(_backward_block)


def _backward_tasks(q, k, v, mask, has_mask, causal, scale, p, seed, lse, dout, delta,
                    dq_part, dk, dv, q_tile, k_tile):
    """prange over (batch, head, key chunk); dq_part (n_chunks, B, H, L, E) zeroed by the
    caller and accumulated; see the module docstring."""
    B, H, L, E = q.shape
    S = k.shape[2]
    Ev = v.shape[3]
    n_chunks = dq_part.shape[0]
    n_kt = (S + k_tile - 1) // k_tile
    n_tasks = B * H * n_chunks
    n_groups = min(n_tasks, _TASK_GROUPS)
    kw = min(k_tile, S)
    ws_size = kw * (3 * E + 2 * Ev) + q_tile * (2 * kw + E) + 1
    for g in prange(n_groups):
        ws = np.empty(ws_size, q.dtype)
        lo, hi = _task_range_jit(g, n_groups, n_tasks)
        for task in range(lo, hi):
            bh = task // n_chunks
            c = task % n_chunks
            b = bh // H
            h = bh % H
            for kt in range(c, n_kt, n_chunks):
                j0 = kt * k_tile
                j1 = min(S, j0 + k_tile)
                _backward_block_jit(q[b, h], k[b, h], v[b, h], mask[b, h], has_mask, causal,
                                    scale, p, seed, bh * L, lse[b, h], dout[b, h],
                                    delta[b, h], dq_part[c, b, h], dk[b, h], dv[b, h], j0, j1,
                                    q_tile, ws)


backward_tasks = serial_or_parallel(_backward_tasks)


def _row_dots(a, b, out):
    """out[r] = sum_e a[r, e] b[r, e] in float64; a, b (R, E), out (R,)."""
    for r in prange(a.shape[0]):
        s = 0.0
        for e in range(a.shape[1]):
            s += np.float64(a[r, e]) * np.float64(b[r, e])
        out[r] = s


row_dots = serial_or_parallel(_row_dots, fastmath={"reassoc"})


def _dropout_multipliers(seed, p, bh0, out):
    """out[b, h, i, j] = z(bh0 + b H + h, i, j): 0 if dropped, 1 / (1 - p) if kept;
    out (B, H, L, S); bh0 offsets the (batch, head) counter (one slab at a time)."""
    B, H, L, S = out.shape
    keep_scale = 1.0 / (1.0 - p)
    for b in range(B):
        for h in range(H):
            for i in range(L):
                n0 = ((bh0 + b * H + h) * L + i) * S
                for j in range(S):
                    u = uniform53(splitmix64(seed, n0 + j))
                    out[b, h, i, j] = keep_scale if u >= p else 0.0


_dropout_multipliers_jit = numba.njit(cache=True)(_dropout_multipliers)


# ---- launchers ------------------------------------------------------------------------------

def backward_chunks(B, H, S, k_tile):
    """Key chunks per (batch, head) in the backward: 1 when B H >= 2 x threads (no partial
    dQ), else enough chunks for one task per thread (at most one chunk per key tile)."""
    threads = numba.get_num_threads()
    n_kt = max(1, -(-S // k_tile))
    if B * H >= 2 * threads:
        return 1
    return max(1, min(n_kt, -(-threads // max(B * H, 1))))


# Multiply-adds of the score and output GEMMs below which the serial build runs: about as
# much work as waking the thread pool costs on a busy machine (see ``_dispatch``;
# benchmarks/RESULTS.md, "Figures moved from code comments")
PARALLEL_MIN_WORK = 1 << 23


def _build(launcher, n_tasks, work):
    """The parallel build for at least two tasks and work that pays (``PARALLEL_MIN_WORK``
    at two threads, ``nnkit._machine.parallel_pays``), else serial."""
    if n_tasks >= 2 and parallel_pays(work, PARALLEL_MIN_WORK):
        return launcher.parallel
    return launcher.serial


def _pad_empty_features(q, k, v):
    """E = 0 or Ev = 0 (scores all 0, or an empty output) as one zero feature: same math."""
    if q.shape[3] == 0:
        q = np.zeros(q.shape[:3] + (1,), q.dtype)
        k = np.zeros(k.shape[:3] + (1,), k.dtype)
    if v.shape[3] == 0:
        v = np.zeros(v.shape[:3] + (1,), v.dtype)
    return q, k, v


def attention_forward(q, k, v, mask, has_mask, causal, scale, dropout_p, seed, out, lse):
    """Fused attention forward; writes out (B, H, L, Ev) and lse (B, H, L). See the module
    docstring for the arguments; returns (out, lse)."""
    B, H, L, _ = q.shape
    S = k.shape[2]
    if B * H * L == 0:
        return out, lse
    if S == 0:
        out[...] = 0
        lse[...] = -np.inf
        return out, lse
    q, k, v = _pad_empty_features(q, k, v)
    target = out if out.shape[3] == v.shape[3] else np.empty(q.shape[:3] + (1,), q.dtype)
    q_tile = CAUSAL_Q_TILE if causal else Q_TILE
    work = B * H * L * S * (q.shape[3] + v.shape[3])
    build = _build(forward_tasks, B * H * -(-L // q_tile), work)
    with serial_step_blas():
        build(q, k, v, mask, bool(has_mask), bool(causal), float(scale),
                      float(dropout_p), np.int64(seed), target, lse, q_tile, K_TILE)
    return out, lse


def attention_backward(q, k, v, mask, has_mask, causal, scale, dropout_p, seed, out, lse, dout,
                       dq, dk, dv):
    """Fused attention backward; writes dq, dk, dv (the shapes of q, k, v). See the module
    docstring; returns (dq, dk, dv)."""
    B, H, L, E = q.shape
    S = k.shape[2]
    Ev = v.shape[3]
    dq[...] = 0
    if B * H * L == 0 or S == 0 or (E == 0 and Ev == 0):
        dk[...] = 0
        dv[...] = 0
        return dq, dk, dv
    delta = np.empty((B, H, L), np.float64)
    if Ev == 0:
        delta[...] = 0
    else:
        row_dots(dout.reshape(-1, Ev), out.reshape(-1, Ev), delta.reshape(-1))
    q_, k_, v_ = _pad_empty_features(q, k, v)
    dout_ = dout if Ev > 0 else np.zeros(v_.shape[:2] + (L, 1), q.dtype)
    dq_, dk_ = (dq, dk) if E > 0 else (np.zeros_like(q_), np.empty_like(k_))
    dv_ = dv if Ev > 0 else np.empty_like(v_)
    n_chunks = backward_chunks(B, H, S, BWD_K_TILE)
    dq_part = dq_.reshape((1,) + dq_.shape) if n_chunks == 1 else np.zeros(
        (n_chunks,) + dq_.shape, q.dtype)
    build = _build(backward_tasks, B * H * n_chunks, B * H * L * S * (q_.shape[3] + v_.shape[3]))
    with serial_step_blas():
        build(q_, k_, v_, mask, bool(has_mask), bool(causal), float(scale),
                       float(dropout_p), np.int64(seed), lse, dout_, delta, dq_part, dk_, dv_,
                       BWD_Q_TILE, BWD_K_TILE)
    if n_chunks > 1:
        np.sum(dq_part, axis=0, out=dq_)
    return dq, dk, dv


def fill_dropout_multipliers(seed, dropout_p, out, bh0=0):
    """Fill ``out`` (B, H, L, S) with the dropout multipliers the kernels apply: 0 or
    1 / (1 - dropout_p). ``bh0``: the flat (batch, head) index of the first slab (the rest
    follow in order). Returns ``out``."""
    _dropout_multipliers_jit(np.int64(seed), float(dropout_p), int(bh0), out)
    return out


def dropout_multipliers(seed, dropout_p, shape, dtype=np.float64, bh0=0):
    """A new (B, H, L, S) array of ``fill_dropout_multipliers``."""
    return fill_dropout_multipliers(seed, dropout_p, np.empty(shape, dtype), bh0)
