"""Fused time loops of the Elman RNN, LSTM and GRU cells: Numba CPU kernels.

One call runs a whole layer-direction through time. Each step does two small GEMMs with
``gemm_cpu.step_gemm`` (a C kernel against weights packed once per call; no Python between
steps): ``x_t @ W_ih^T`` (B, D) x (D, G*H) into the gates buffer and ``h_{t-1} @ W_hh^T``
(B, H) x (H, G*H) (the LSTM does both as one, ``[x_t, h_{t-1}] @ [W_ih^T; W_hh^T]``), then
the gate nonlinearities, the biases and the cell update fused in one pass over the rows.
The input projection is done step by step inside the loop rather than as one large BLAS
GEMM before it: it runs on the kernel's threads (OpenBLAS's workers, spinning after a GEMM,
took a core from the time loop that followed, which made the LSTM forward several times
slower on a loaded machine), its rows are in L1 when the cell reads them, and the bias
costs no extra pass. Backward through time (BPTT) mirrors the loop: the gate
derivatives fused, the GEMMs ``dA_h @ W_hh`` and ``dA_x @ W_ih`` (dx) per step, and dA of
every step stored packed for the weight gradients, one product over all steps
(``packed_weight_grads``). The batch rows are independent sequences: blocks of rows run on
separate threads (see "Loop structure" below).

Gate layouts are torch's: LSTM (i, f, g, o), GRU (r, z, n); see ``nnkit.nn.recurrent``.

``reverse`` runs the loop from t = T-1 down to 0 (the backward direction of a
bidirectional layer) without copying: step s visits t = T-1-s, and the "previous" hidden
state of t is the one at t+1.

What forward keeps for backward (the cache):

- RNN: the outputs y (T, B, H) only (phi' is a function of phi: 1 - y^2, or y > 0).
- LSTM: the activated gates (T, B, 4H) and the cell states c (T, B, H); tanh(c_t) is
  recomputed in backward.
- GRU: the activated gates r, z, n (T, B, 3H) and hn = h_{t-1} W_hn^T + b_hn (T, B, H).

Kernels validate nothing: C-contiguous arrays of one float dtype, preallocated outputs.
``w_ih_t``, ``w_hh_t`` are W_ih^T (D, G*H) and W_hh^T (H, G*H), contiguous or the views
W.T (the packing reads those down their columns: no transposed copies). Each ``*_cpu``
kernel has a ``.serial`` and a ``.parallel`` build (tests hold them equal).

``nnkit.kernels.recurrent`` is the validated entry point; it calls the launchers
``rnn_forward_layer`` ... ``gru_backward_layer`` at the end of this module, which
``nnkit._ext.recurrent_cuda`` exposes with the same signatures (``nnkit._backend
.kernels_for`` picks the module): they allocate the buffers, run the kernels and, after
BPTT, form the weight gradients (``packed_weight_grads``).

Numerics. The time loops are compiled with ``fastmath={'contract'}`` and nothing else
(``JIT_OPTIONS``): a * b + c may become one fused multiply-add, which rounds once instead of
twice; no reassociation, NaN and inf behave as without it. The gate nonlinearities are
``simd_math.act_sigmoid``/``act_tanh``, branch-free polynomials that LLVM vectorises (libm's
are called one element at a time), inlined into the loops: float64 math for float64 arrays
(<= 3 ulp), float32 math for float32 arrays (<= 2.5 ulp measured, tests/test_recurrent.py),
chosen from the argument type. NaN propagates; inputs beyond the clamp give the limits
(sigmoid(-inf) is 6e-39 in float32, not 0). ``error_model="numpy"`` drops Python's
ZeroDivisionError check, whose branch alone kept the sigmoid loop scalar (several times slower).
The fused multiply-adds made the LSTM cell and its backward faster
(benchmarks/RESULTS.md, "Recurrent networks").
"""

from __future__ import annotations

import numba
import numpy as np
from numba import prange, types
from numba.extending import overload

from .._machine import parallel_pays, scaled_to_l2
from ._dispatch import serial_or_parallel
from .gemm_cpu import (
    PANEL_WIDTH,
    pack_panels,
    pack_stacked_panels,
    step_gemm,
    step_gemm_ld,
    stream_fence,
    stream_rows,
)
from .launchers import launchers
from .simd_math import act_sigmoid, act_tanh

__all__ = [*launchers("recurrent_cpu", "recurrent_cuda"), "rnn_forward_cpu", "rnn_backward_cpu",
           "lstm_forward_cpu", "lstm_backward_cpu", "gru_forward_cpu", "gru_backward_cpu",
           "MIN_CHUNK_ROWS", "packed_weight_grads", "transposed_inputs_cpu"]


# How the time loops are compiled (see "Numerics" above).
JIT_OPTIONS = {"error_model": "numpy", "fastmath": {"contract"}}


def one_like(a):
    """The number 1 in the dtype of array a: float32 for float32 arrays. A literal 1.0 is
    float64 to Numba, so ``1.0 - g[j]`` ran the float32 cells in float64 (half the SIMD
    lanes, plus conversions): the LSTM cell backward was markedly slower
    (benchmarks/RESULTS.md, "Recurrent networks")."""
    return 1.0


@overload(one_like)
def _one_like(a):
    if a.dtype == types.float32:
        return lambda a: np.float32(1.0)
    return lambda a: 1.0


def _step_index(s, T, reverse):
    return T - 1 - s if reverse else s


step_index = numba.njit(cache=True, inline="always", error_model="numpy")(_step_index)


def _prev(first, s0, seq, tp):
    """The state the step reads: the initial one at the first step, else seq[tp]."""
    return s0 if first else seq[tp]


prev = numba.njit(cache=True, inline="always", error_model="numpy")(_prev)


# Loop structure. The rows of a batch are independent sequences, so a kernel splits them
# into ``chunks`` contiguous blocks and runs the whole time loop of each block in its own
# thread (``prange``): no barrier per step. Each step does one ``step_gemm`` on the block's
# rows, then the cell's elementwise work row by row, in short loops over 0-based views of
# one gate (a loop indexed g[2 * H + j] or writing many arrays LLVM cannot prove distinct is
# left scalar: the LSTM gate loop ran several times slower with offset indexing;
# benchmarks/RESULTS.md, "Recurrent networks"). The state of step t is read back
# from the outputs (y[t-1], c[t-1]) instead of being copied.


def _chunk_rows(k, chunks, B):
    """Rows [b0, b1) of block k of ``chunks`` near-equal blocks of B rows."""
    return k * B // chunks, (k + 1) * B // chunks


chunk_rows = numba.njit(cache=True, inline="always")(_chunk_rows)


def _add_direct_grad(dh, dy, keep, hidden_grads, t, b):
    """dh (H) += dy (H): the total dL/dh_t of row b at step t, kept in hidden_grads[t, b]
    when ``keep``."""
    for j in range(dh.shape[0]):
        dh[j] += dy[j]
    if keep:
        hidden_grads[t, b, :] = dh


add_direct_grad = numba.njit(cache=True, inline="always",
                             error_model="numpy")(_add_direct_grad)


def _copy_into(dst, src):
    """dst[:] = src for 1-D arrays, as a plain loop (numba's slice assignment checks the two
    for overlap on every call, a visible share of the small LSTM forward for its 16-row x
    copies: benchmarks/RESULTS.md, "Figures moved from code comments")."""
    for j in range(src.shape[0]):
        dst[j] = src[j]


copy_into = numba.njit(cache=True, inline="always")(_copy_into)


# ---- Elman RNN: h_t = phi(x_t W_ih^T + b + h_{t-1} W_hh^T) ------------------------------

def _rnn_forward(x, w_ih_t, bias, x_proj, h0, w_hh_t, relu, reverse, y, h, chunks):
    """y[t] = phi(x[t] @ w_ih_t + bias + h_{t-1} @ w_hh_t); x (T, B, D); w_ih_t (D, H);
    bias (H,); x_proj, y (T, B, H) (x_proj receives x[t] @ w_ih_t); h0, h (B, H): h ends as
    h_T."""
    T, B, H = y.shape
    wp_ih, wp_hh = pack_panels(w_ih_t), pack_panels(w_hh_t)
    for k in prange(chunks):
        b0, b1 = chunk_rows(k, chunks, B)
        for s in range(T):
            t = step_index(s, T, reverse)
            step_gemm(x[t][b0:b1], wp_ih, x_proj[t][b0:b1])
            step_gemm(prev(s == 0, h0, y, t + 1 if reverse else t - 1)[b0:b1], wp_hh,
                      y[t][b0:b1])
            for b in range(b0, b1):
                row, xrow = y[t, b], x_proj[t, b]
                if relu:
                    one = one_like(row)
                    zero = one - one  # 0 in the row's dtype (a literal is int64 or float64)
                    for j in range(H):
                        v = row[j] + xrow[j] + bias[j]
                        row[j] = v if not (v <= 0) else zero * v  # NaN stays NaN
                else:
                    for j in range(H):
                        row[j] = act_tanh(row[j] + xrow[j] + bias[j])
    h[:, :] = y[T - 1 if not reverse else 0]


def _rnn_backward(dy, dh_T, y, w_hh, w_ih, relu, reverse, dx, gp, work, dh, hidden_grads,
                  chunks):
    """BPTT: dx (T, B, D) = dA @ W_ih; gp receives dA = dL/d(pre-activations) of every step
    packed (see ``store_packed``); work (B, H) workspace; dh (B, H) ends as dL/dh0;
    hidden_grads (T, B, H) receives the total dL/dh_t unless it is empty (size 0). An empty
    dx (gp) skips the dx product (the packing of dA): a gradient nobody asked for."""
    T, B, H = y.shape
    keep, need_dx, keep_da = hidden_grads.size > 0, dx.size > 0, gp.size > 0
    wp, wp_ih = pack_panels(w_hh), pack_panels(w_ih)
    dh[:, :] = dh_T
    for k in prange(chunks):
        b0, b1 = chunk_rows(k, chunks, B)
        for s in range(T):
            t = step_index(T - 1 - s, T, reverse)
            for b in range(b0, b1):
                drow, dyrow, yrow, dhrow = work[b], dy[t, b], y[t, b], dh[b]
                for j in range(H):
                    drow[j] = dhrow[j] + dyrow[j]  # total dL/dh_t
                if keep:
                    hidden_grads[t, b, :] = drow
                one = one_like(drow)
                if relu:
                    zero = one - one
                    for j in range(H):
                        drow[j] = drow[j] if yrow[j] > 0 else zero * drow[j]
                else:
                    for j in range(H):
                        drow[j] = drow[j] * (one - yrow[j] * yrow[j])
            if keep_da:
                store_packed(work[b0:b1], gp, t * B + b0)
            step_gemm(work[b0:b1], wp, dh[b0:b1])  # (rows, H) @ (H, H)
            if need_dx:
                step_gemm(work[b0:b1], wp_ih, dx[t][b0:b1])  # (rows, H) @ (H, D)
        stream_fence()  # the packed dA streamed by store_packed


# ---- LSTM: gates (i, f, g, o); c_t = f c_{t-1} + i g; h_t = o tanh(c_t) -------------------

def _lstm_cell(g, bias, c_prev, c, y, h_next):
    """One row: g (4H) pre-activations (x_t W_ih^T + h_{t-1} W_hh^T), overwritten with the
    activated gates; bias (4H); c_prev (H) -> c, y (H) (c_prev may be c: element j is read
    before it is written); h_next (H) receives y too (the next step's GEMM input)."""
    H = c.shape[0]
    gif, bif = g[:2 * H], bias[:2 * H]
    for j in range(2 * H):
        gif[j] = act_sigmoid(gif[j] + bif[j])
    gg, bg = g[2 * H:3 * H], bias[2 * H:3 * H]
    for j in range(H):
        gg[j] = act_tanh(gg[j] + bg[j])
    go, bo = g[3 * H:], bias[3 * H:]
    for j in range(H):
        go[j] = act_sigmoid(go[j] + bo[j])
    gi, gf = g[:H], g[H:2 * H]
    for j in range(H):
        c[j] = gf[j] * c_prev[j] + gi[j] * gg[j]
    for j in range(H):
        y[j] = go[j] * act_tanh(c[j])
    for j in range(H):
        h_next[j] = y[j]


lstm_cell = numba.njit(cache=True, inline="always", error_model="numpy")(_lstm_cell)


def _lstm_cell_backward(g, c, c_prev, dh, dc, d):
    """One row of BPTT: dh (H) the total dL/dh_t; dc (H) dL/dc_t from later steps, left as
    dL/dc_{t-1}; d (4H) receives the gate pre-activation gradients."""
    H, one = c.shape[0], one_like(c)
    gi, gf, gg, go = g[:H], g[H:2 * H], g[2 * H:3 * H], g[3 * H:]
    di, df, dg, do = d[:H], d[H:2 * H], d[2 * H:3 * H], d[3 * H:]
    for j in range(H):
        tc = act_tanh(c[j])
        do[j] = dh[j] * tc * go[j] * (one - go[j])
        dc[j] += dh[j] * go[j] * (one - tc * tc)  # total dL/dc_t
    for j in range(H):
        di[j] = dc[j] * gg[j] * gi[j] * (one - gi[j])
        df[j] = dc[j] * c_prev[j] * gf[j] * (one - gf[j])
        dg[j] = dc[j] * gi[j] * (one - gg[j] * gg[j])
    for j in range(H):
        dc[j] *= gf[j]


lstm_cell_backward = numba.njit(cache=True, inline="always",
                                error_model="numpy")(_lstm_cell_backward)


def _lstm_forward(x, w_ih_t, bias, gates, h0, c0, w_hh_t, reverse, y, c_all, h, c, xh,
                  chunks):
    """x (T, B, D); w_ih_t (D, 4H); bias (4H,) = b_ih + b_hh; gates (T, B, 4H) receives the
    activated gates; outputs y, c_all (T, B, H); h, c (B, H) end as h_T, c_T; xh (B, D + H)
    workspace: each step is one GEMM [x_t, h_{t-1}] @ [W_ih^T; W_hh^T] (K = D + H: one
    pass over the output tile instead of two, a few percent of the forward on one thread:
    benchmarks/RESULTS.md, "Recurrent networks").

    Without backward to feed, gates (1, B, 4H) and c_all (1, B, H) hold the current step
    only (the cell updates c in place): no (T, B, 4H) buffer to allocate and stream."""
    T, B, D = x.shape
    keep = gates.shape[0] == T
    wp = pack_stacked_panels(w_ih_t, w_hh_t)
    for k in prange(chunks):
        b0, b1 = chunk_rows(k, chunks, B)
        for b in range(b0, b1):
            copy_into(xh[b, D:], h0[b])
        for s in range(T):
            t = step_index(s, T, reverse)
            u = t if keep else 0  # the step's slot in gates and c_all
            for b in range(b0, b1):
                copy_into(xh[b, :D], x[t, b])
            step_gemm(xh[b0:b1], wp, gates[u][b0:b1])  # (rows, 4H)
            c_prev = prev(s == 0, c0, c_all, (t + 1 if reverse else t - 1) if keep else 0)
            for b in range(b0, b1):
                lstm_cell(gates[u, b], bias, c_prev[b], c_all[u, b], y[t, b], xh[b, D:])
    last = 0 if reverse else T - 1
    h[:, :] = y[last]
    c[:, :] = c_all[last if keep else 0]


def _lstm_backward(dy, dh_T, dc_T, c0, gates, c_all, w_hh, w_ih, reverse, dx, gp, work, dh,
                   dc, hidden_grads, chunks):
    """BPTT: dx (T, B, D) = dA @ W_ih; gp receives dA = dL/d(gate pre-activations) of every
    step packed (see ``store_packed``); work (B, 4H) workspace; dh, dc (B, H) end as dL/dh0,
    dL/dc0; hidden_grads (T, B, H) receives the total dL/dh_t unless empty; an empty dx
    (gp) skips the dx product (the packing of dA)."""
    T, B, G = gates.shape
    keep, need_dx, keep_da = hidden_grads.size > 0, dx.size > 0, gp.size > 0
    wp, wp_ih = pack_panels(w_hh), pack_panels(w_ih)
    dh[:, :] = dh_T
    dc[:, :] = dc_T
    for k in prange(chunks):
        b0, b1 = chunk_rows(k, chunks, B)
        for s in range(T):
            t = step_index(T - 1 - s, T, reverse)
            c_prev = prev(s == T - 1, c0, c_all, t + 1 if reverse else t - 1)
            for b in range(b0, b1):
                add_direct_grad(dh[b], dy[t, b], keep, hidden_grads, t, b)
                lstm_cell_backward(gates[t, b], c_all[t, b], c_prev[b], dh[b], dc[b], work[b])
            if keep_da:
                store_packed(work[b0:b1], gp, t * B + b0)
            step_gemm(work[b0:b1], wp, dh[b0:b1])  # (rows, 4H) @ (4H, H)
            if need_dx:
                step_gemm(work[b0:b1], wp_ih, dx[t][b0:b1])  # (rows, 4H) @ (4H, D)
        stream_fence()  # the packed dA streamed by store_packed


# ---- GRU: gates (r, z, n); n = tanh(xn + r (h W_hn^T + b_hn)); h = (1 - z) n + z h --------

def _gru_cell(g, b_ih, gh, b_hh, h_prev, hn, y):
    """One row: g (3H) = x_t W_ih^T, overwritten with r, z, n; b_ih, b_hh (3H); gh (3H) =
    h_{t-1} W_hh^T; h_prev (H) -> hn = h_{t-1} W_hn^T + b_hn (H), y (H)."""
    H = y.shape[0]
    grz, xbrz, ghrz, brz = g[:2 * H], b_ih[:2 * H], gh[:2 * H], b_hh[:2 * H]
    for j in range(2 * H):
        grz[j] = act_sigmoid(grz[j] + xbrz[j] + ghrz[j] + brz[j])
    ghn, bn = gh[2 * H:], b_hh[2 * H:]
    for j in range(H):
        hn[j] = ghn[j] + bn[j]
    gr, gz, gn, xbn = g[:H], g[H:2 * H], g[2 * H:], b_ih[2 * H:]
    for j in range(H):
        gn[j] = act_tanh(gn[j] + xbn[j] + gr[j] * hn[j])
    one = one_like(y)
    for j in range(H):
        y[j] = (one - gz[j]) * gn[j] + gz[j] * h_prev[j]


gru_cell = numba.njit(cache=True, inline="always", error_model="numpy")(_gru_cell)


def _gru_cell_backward(g, h_prev, hn, dh, dx, dhh):
    """One row of BPTT: dh (H) the total dL/dh_t, left as its direct path z dh; dx, dhh (3H)
    receive dL/d(x-side) and dL/d(h-side) pre-activations."""
    H, one = dh.shape[0], one_like(dh)
    gr, gz, gn = g[:H], g[H:2 * H], g[2 * H:]
    dxr, dxz, dxn = dx[:H], dx[H:2 * H], dx[2 * H:]
    for j in range(H):
        z, n = gz[j], gn[j]
        dxn[j] = dh[j] * (one - z) * (one - n * n)
        dxz[j] = dh[j] * (h_prev[j] - n) * z * (one - z)
        dh[j] = dh[j] * z  # the direct path; the step's GEMM adds the gated one
    dhn = dhh[2 * H:]
    for j in range(H):
        r = gr[j]
        dxr[j] = dxn[j] * hn[j] * r * (one - r)
        dhn[j] = dxn[j] * r
    dhrz, dxrz = dhh[:2 * H], dx[:2 * H]
    for j in range(2 * H):
        dhrz[j] = dxrz[j]


gru_cell_backward = numba.njit(cache=True, inline="always",
                               error_model="numpy")(_gru_cell_backward)


def _gru_forward(x, w_ih_t, b_ih, gates, h0, w_hh_t, b_hh, reverse, y, hn, h, gh, chunks):
    """x (T, B, D); w_ih_t (D, 3H); b_ih, b_hh (3H,); gates (T, B, 3H) receives the
    activated gates r, z, n; outputs y, hn (T, B, H); h (B, H) ends as h_T; gh (B, 3H)
    workspace. Without backward to feed, gates (1, B, 3H) and hn (1, B, H) hold the current
    step only."""
    T, B = x.shape[0], x.shape[1]
    keep = gates.shape[0] == T
    wp_ih, wp_hh = pack_panels(w_ih_t), pack_panels(w_hh_t)
    for k in prange(chunks):
        b0, b1 = chunk_rows(k, chunks, B)
        for s in range(T):
            t = step_index(s, T, reverse)
            u = t if keep else 0  # the step's slot in gates and hn
            h_prev = prev(s == 0, h0, y, t + 1 if reverse else t - 1)
            step_gemm(x[t][b0:b1], wp_ih, gates[u][b0:b1])  # (rows, 3H) from x_t
            step_gemm(h_prev[b0:b1], wp_hh, gh[b0:b1])  # from h_{t-1}
            for b in range(b0, b1):
                gru_cell(gates[u, b], b_ih, gh[b], b_hh, h_prev[b], hn[u, b], y[t, b])
    h[:, :] = y[0 if reverse else T - 1]


def _gru_backward(dy, dh_T, h0, y, gates, hn, w_hh, w_ih, reverse, dx, gpx, gph, work_x,
                  work_h, dh, dh_gated, hidden_grads, chunks):
    """BPTT: dx (T, B, D) = dA_x @ W_ih; gpx, gph receive dA_x = dL/d(x-side
    pre-activations) and dA_h = dL/d(h W_hh^T + b_hh) of every step packed (see
    ``store_packed``); work_x, work_h (B, 3H) and dh_gated (B, H) workspaces; dh (B, H) ends
    as dL/dh0; hidden_grads (T, B, H) receives the total dL/dh_t unless empty; an empty dx
    (gpx) skips the dx product (the packing of dA_x and dA_h)."""
    T, B, G = gates.shape
    keep, need_dx, keep_da = hidden_grads.size > 0, dx.size > 0, gpx.size > 0
    wp, wp_ih = pack_panels(w_hh), pack_panels(w_ih)
    dh[:, :] = dh_T
    for k in prange(chunks):
        b0, b1 = chunk_rows(k, chunks, B)
        for s in range(T):
            t = step_index(T - 1 - s, T, reverse)
            h_prev = prev(s == T - 1, h0, y, t + 1 if reverse else t - 1)
            for b in range(b0, b1):
                add_direct_grad(dh[b], dy[t, b], keep, hidden_grads, t, b)
                gru_cell_backward(gates[t, b], h_prev[b], hn[t, b], dh[b], work_x[b],
                                  work_h[b])
            if keep_da:
                store_packed(work_x[b0:b1], gpx, t * B + b0)
                store_packed(work_h[b0:b1], gph, t * B + b0)
            step_gemm(work_h[b0:b1], wp, dh_gated[b0:b1])  # (rows, 3H) @ (3H, H)
            if need_dx:
                step_gemm(work_x[b0:b1], wp_ih, dx[t][b0:b1])  # (rows, 3H) @ (3H, D)
            for b in range(b0, b1):
                dhrow, grow = dh[b], dh_gated[b]
                for j in range(dhrow.shape[0]):
                    dhrow[j] += grow[j]
        stream_fence()  # the packed dA streamed by store_packed


# ---- the parameter gradients: products over all steps against the packed dA ------------
# BPTT leaves dA of every step in ``pack_panels`` layout (rows n = t B + b), written a
# thread's block of rows at a time as the loop produces them, so the weight gradients
# dW^T = [x; h_prev]^T dA run on step_gemm with no copy of dA (packing it afterwards cost
# as much as the product). The product runs near the core's FMA peak
# (benchmarks/RESULTS.md, "Recurrent networks").

def _store_packed(rows, gp, n0):
    """Rows n0, n0 + 1, ... of the packed matrix gp (P, N, NR) = rows (m, G):
    gp[p, n0 + i, q] = rows[i, p NR + q], zeros beyond G. Full panels with non-temporal
    stores (``stream_rows``; the caller's thread ends with ``stream_fence``): gp is read
    only after the time loop, and its panels' rows, N NR elements apart, otherwise filled
    the same few cache sets at every step, evicting the step weights from L2. The tail
    panel with a fixed-width loop (a variable width did not vectorise)."""
    m, G = rows.shape
    nr = gp.shape[2]
    full = G // nr
    for p in range(full):
        stream_rows(rows[:, p * nr:(p + 1) * nr], gp[p, n0:n0 + m])
    if full < gp.shape[0]:  # the tail panel, zero-padded
        j0 = full * nr
        for i in range(m):
            dst, src = gp[full, n0 + i], rows[i]
            for q in range(nr):
                dst[q] = src[j0 + q] if j0 + q < G else 0.0


store_packed = numba.njit(cache=True, inline="always", error_model="numpy")(_store_packed)


def _transpose_block(src, shift, dst, row0, n0, n1):
    """dst[row0 + j, n] = src[n + shift, j] for n in [n0, n1): a block of columns of dst,
    written row by row (writing column by column touched D + H pages per element)."""
    for j in range(src.shape[1]):
        drow = dst[row0 + j]
        for n in range(n0, n1):
            drow[n] = src[n + shift, j]


transpose_block = numba.njit(cache=True, inline="always", error_model="numpy")(_transpose_block)


def _transposed_inputs(x2, y, h0, reverse, at, h_row):
    """Rows [0, D) of at (M, T B) = x^T and rows [h_row, h_row + H) = h_prev^T: column
    n = t B + b holds x[t, b] and the state step t read (h0 at the first step, else
    y[t - 1, b], y[t + 1, b] in reverse); other rows are left as they are.
    x2 (T B, D); y (T, B, H); h0 (B, H)."""
    T, B, H = y.shape
    N, D = x2.shape
    y2 = y.reshape(N, H)
    # h_prev row n is h0[n - edge] on one side of ``edge`` and y2[n -+ B] on the other
    edge = N - B if reverse else B
    lo, lo_shift = (y2, B) if reverse else (h0, 0)
    hi, hi_shift = (h0, -edge) if reverse else (y2, -B)
    for blk in prange((N + 63) // 64):
        n0, n1 = blk * 64, min(N, blk * 64 + 64)
        transpose_block(x2, 0, at, 0, n0, n1)
        m = min(max(edge, n0), n1)
        transpose_block(lo, lo_shift, at, h_row, n0, m)
        transpose_block(hi, hi_shift, at, h_row, m, n1)


def _packed_products(at, gp, out, dw, parts, kb):
    """dw[p NR:(p + 1) NR] (NR, M) = (at (M, N) @ panel p of gp (P, N, NR))^T through the
    scratch out[p] (M, NR); ``parts`` blocks of panels, one per task, each tile then
    transposed in cache into dw (instead of a strided copy of the whole product after).

    The sum over N runs in blocks of ``kb`` columns of at, each block multiplied into every
    panel of the task before the next (out[p] += at[:, block] @ gp[p, block]): the block of
    at (M x kb) is read from cache by all the panels instead of all of at (M x N, 3-13 MiB
    at the LSTM benchmark's shapes) streaming from memory once per panel."""
    P, N, nr = gp.shape
    for w in prange(parts):
        p0, p1 = chunk_rows(w, parts, P)
        for k0 in range(0, max(N, 1), kb):  # N = 0: one empty product, zeros
            k1 = min(N, k0 + kb)
            for p in range(p0, p1):
                step_gemm_ld(at[:, k0:k1], gp[p:p + 1, k0:k1], out[p], k0 > 0)
        for p in range(p0, p1):
            tile, block = out[p], dw[p * nr:(p + 1) * nr]
            for q in range(nr):
                row = block[q]
                for m in range(at.shape[0]):
                    row[m] = tile[m, q]


transposed_inputs_cpu = serial_or_parallel(_transposed_inputs, error_model="numpy")
packed_products_cpu = serial_or_parallel(_packed_products, error_model="numpy")

# A weight-gradient product of fewer flops than this ran faster on one thread at two threads
# (waking the pool costs tens of microseconds, ~4 Mflop at these kernels' speed);
# ``nnkit._machine.parallel_pays`` carries it to other thread counts.
MIN_PARALLEL_FLOPS = 1 << 22
# Columns of at per block of the weight-gradient sum (``_packed_products``) on a 512 KiB L2:
# a block of the LSTM's [x; 1; h_prev]^T, 193-385 rows, is 193-385 KiB in float32, well
# inside it. Scaled to this machine's L2 (``nnkit._machine.scaled_to_l2``).
PRODUCT_BLOCK = 256


def packed_weight_grads(at, gp, block=None):
    """dW (P NR, M) = dA^T @ at^T, i.e. (at (M, N) @ dA)^T, where gp (P, N, NR) holds dA
    (N, G) packed; the rows from G on are the panels' zero padding, for the caller to cut.
    A row of ones in at gives the bias gradient, the column sums of dA, in the same
    product (a separate float64 pass over the panels took a tenth of the kernel's time).
    ``block``: columns of at per block (default ``PRODUCT_BLOCK`` scaled to the L2)."""
    P, N, nr = gp.shape
    if at.strides[1] != at.itemsize:  # rows may be apart (see ``_rows_apart``), not columns
        at = np.ascontiguousarray(at)
    out = np.empty((P, at.shape[0], nr), dtype=at.dtype)
    dw = np.empty((P * nr, at.shape[0]), dtype=at.dtype)
    parallel = P > 1 and parallel_pays(2 * at.size * P * nr, MIN_PARALLEL_FLOPS)
    parts = min(P, numba.get_num_threads()) if parallel else 1
    parallel = parallel and parts > 1
    block = scaled_to_l2(PRODUCT_BLOCK) if block is None else block
    (packed_products_cpu.parallel if parallel else packed_products_cpu.serial)(
        at, gp, out, dw, parts, block)
    return dw


# ---- entry points: a serial and a parallel build, the batch split chosen by rows ---------

# A block of fewer rows than this runs no faster on its own thread: 4 rows are one register
# tile of step_gemm, and waking the pool costs tens of microseconds per call.
MIN_CHUNK_ROWS = 4


def _launcher(fn):
    """``fn(..., chunks)`` -> ``launch(*args)``: chunks = min(threads, B // MIN_CHUNK_ROWS)
    blocks of rows (B = the second axis of the first argument, x or dy), the serial build
    for one."""
    builds = serial_or_parallel(fn, **JIT_OPTIONS)

    def launch(*args):
        chunks = max(1, min(numba.get_num_threads(), args[0].shape[1] // MIN_CHUNK_ROWS))
        build = builds.parallel if chunks > 1 else builds.serial
        return build(*args, chunks)

    launch.serial, launch.parallel = builds.serial, builds.parallel
    launch.__name__ = launch.__qualname__ = builds.__name__ + "_cpu"
    launch.__doc__ = fn.__doc__
    return launch


rnn_forward_cpu = _launcher(_rnn_forward)
rnn_backward_cpu = _launcher(_rnn_backward)
lstm_forward_cpu = _launcher(_lstm_forward)
lstm_backward_cpu = _launcher(_lstm_backward)
gru_forward_cpu = _launcher(_gru_forward)
gru_backward_cpu = _launcher(_gru_backward)


# ---- the launchers of ``nnkit.kernels.recurrent`` (``recurrent_cuda`` has the same) ------
# One layer-direction through time each. The forwards allocate their outputs and what the
# backward reads; the backwards take the forward's cache (``kernels.recurrent
# .RecurrentCache``) and return every gradient: dx None without ``need_dx``, the four
# parameter gradients None without ``need_weights`` (the biases' also without biases).

def rnn_forward_layer(x, w_ih, w_hh, bias, h0, relu, reverse):
    """(y (T, B, H), h_T (B, H)) of the Elman layer: x (T, B, D); w_ih (H, D); w_hh (H, H);
    bias (H,) = b_ih + b_hh; h0 (B, H)."""
    T, B, _ = x.shape
    y = np.empty((T, B, w_hh.shape[0]), dtype=x.dtype)
    h = np.empty_like(h0)
    rnn_forward_cpu(x, w_ih.T, bias, np.empty_like(y), h0, w_hh.T, relu, reverse, y, h)
    return y, h


def lstm_forward_layer(x, w_ih, w_hh, bias, h0, c0, reverse, keep):
    """(y (T, B, H), h_T, c_T (B, H), gates (T, B, 4H), c (T, B, H)) of the LSTM layer:
    w_ih (4H, D); w_hh (4H, H); bias (4H,) = b_ih + b_hh. Without ``keep`` (no backward
    follows) gates and c hold the current step only."""
    T, B, D = x.shape
    H = h0.shape[1]
    slots = T if keep else 1
    gates = np.empty((slots, B, 4 * H), dtype=x.dtype)
    y, c = np.empty((T, B, H), dtype=x.dtype), np.empty_like(h0)
    c_all = np.empty((slots, B, H), dtype=x.dtype)
    h = np.empty_like(h0)
    xh = np.empty((B, D + H), dtype=x.dtype)  # [x_t, h_{t-1}] rows: one GEMM per step
    lstm_forward_cpu(x, w_ih.T, bias, gates, h0, c0, w_hh.T, reverse, y, c_all, h, c, xh)
    return y, h, c, gates, c_all


def gru_forward_layer(x, w_ih, w_hh, b_ih, b_hh, h0, reverse, keep):
    """(y (T, B, H), h_T (B, H), gates (T, B, 3H), hn (T, B, H)) of the GRU layer: w_ih
    (3H, D); w_hh (3H, H); b_ih, b_hh (3H,). Without ``keep`` gates and hn hold one step."""
    T, B, _ = x.shape
    H = h0.shape[1]
    slots = T if keep else 1
    gates = np.empty((slots, B, 3 * H), dtype=x.dtype)
    y = np.empty((T, B, H), dtype=x.dtype)
    hn = np.empty((slots, B, H), dtype=x.dtype)
    h = np.empty_like(h0)
    gh = np.empty((B, 3 * H), dtype=x.dtype)
    gru_forward_cpu(x, w_ih.T, b_ih, gates, h0, w_hh.T, b_hh, reverse, y, hn, h, gh)
    return y, h, gates, hn


def rnn_backward_layer(cache, dy, dh_T, hidden_grads, need_dx, need_weights):
    """(dx, dh0, dW_ih, dW_hh, db_ih, db_hh) of the Elman layer by BPTT; dy (T, B, H),
    dh_T (B, H); hidden_grads (T, B, H) receives dL/dh_t unless empty."""
    dx, (gp,), (work,) = _grad_buffers(cache, 1, need_dx, need_weights)
    dh = np.empty_like(cache.h0)
    rnn_backward_cpu(dy, dh_T, cache.saved["y"], cache.weight_hh, cache.weight_ih,
                     cache.nonlinearity == "relu", cache.reverse, dx, gp, work, dh,
                     hidden_grads)
    return (dx if need_dx else None), dh, *_weight_grads(cache, gp, gp, need_weights)


def lstm_backward_layer(cache, dy, dh_T, dc_T, hidden_grads, need_dx, need_weights):
    """(dx, dh0, dc0, dW_ih, dW_hh, db_ih, db_hh) of the LSTM layer by BPTT."""
    dx, (gp,), (work,) = _grad_buffers(cache, 1, need_dx, need_weights)
    dh, dc = np.empty_like(cache.h0), np.empty_like(cache.h0)
    lstm_backward_cpu(dy, dh_T, dc_T, cache.c0, cache.saved["gates"], cache.saved["c"],
                      cache.weight_hh, cache.weight_ih, cache.reverse, dx, gp, work, dh, dc,
                      hidden_grads)
    return (dx if need_dx else None), dh, dc, *_weight_grads(cache, gp, gp, need_weights)


def gru_backward_layer(cache, dy, dh_T, hidden_grads, need_dx, need_weights):
    """(dx, dh0, dW_ih, dW_hh, db_ih, db_hh) of the GRU layer by BPTT."""
    dx, (gpx, gph), (work_x, work_h) = _grad_buffers(cache, 2, need_dx, need_weights)
    dh = np.empty_like(cache.h0)
    gru_backward_cpu(dy, dh_T, cache.h0, cache.saved["y"], cache.saved["gates"],
                     cache.saved["hn"], cache.weight_hh, cache.weight_ih, cache.reverse, dx,
                     gpx, gph, work_x, work_h, dh, np.empty_like(dh), hidden_grads)
    return (dx if need_dx else None), dh, *_weight_grads(cache, gpx, gph, need_weights)


def _grad_buffers(cache, count, need_dx=True, need_da=True):
    """The BPTT kernels' outputs: dx (T, B, D), then ``count`` packed dA buffers
    (P, T B, NR) and ``count`` (B, G H) workspaces; dx (the packed dA) empty without
    ``need_dx`` (``need_da``), which the kernels read as "skip it"."""
    x = cache.x
    T, B, _ = x.shape
    GH = cache.weight_hh.shape[0]
    nr = PANEL_WIDTH[x.dtype.name]
    shape = ((GH + nr - 1) // nr, T * B, nr) if need_da else (0, 0, nr)
    packed = [_line_aligned(shape, x.dtype) for _ in range(count)]
    work = [np.empty((B, GH), dtype=x.dtype) for _ in range(count)]
    return (np.empty_like(x) if need_dx else np.empty((0, 0, 0), dtype=x.dtype)), packed, work


def _line_aligned(shape, dtype):
    """An uninitialised array starting on a 64-byte cache line: the packed dA panels, whose
    rows the BPTT kernels write with non-temporal stores whole lines at a time."""
    dtype = np.dtype(dtype)
    size = int(np.prod(shape)) * dtype.itemsize
    raw = np.empty(size + 64, dtype=np.uint8)
    start = -raw.ctypes.data % 64
    return raw[start:start + size].view(dtype).reshape(shape)


def _rows_apart(shape, dtype):
    """An uninitialised (M, N) array whose rows are an odd number of 64-byte lines apart.
    The weight-gradient product reads 8 rows of it at a time down a block of columns; with
    N a power of two (T B = 8192 at the LSTM benchmark) those rows fell into the same few
    cache sets and evicted one another (the product ran slower; benchmarks/RESULTS.md,
    "The LSTM above torch again")."""
    M, N = shape
    per_line = 64 // np.dtype(dtype).itemsize
    lines = -(-N // per_line)
    lines += 1 - lines % 2
    return np.empty((M, lines * per_line), dtype=dtype)[:, :N]


def _weight_grads(cache, gpx, gph, need=True):
    """(dW_ih, dW_hh, db_ih, db_hh) from the packed dA of the BPTT kernels (all None without
    ``need``): [dW_ih, db, dW_hh]^T = [x; 1; h_prev]^T dA, one product when dA_x is dA_h
    (RNN, LSTM), else [dW_ih, db_ih]^T = [x; 1]^T dA_x and [dW_hh, db_hh]^T =
    [h_prev; 1]^T dA_h."""
    if not need:
        return None, None, None, None
    x, y = cache.x, cache.saved["y"]
    T, B, D = x.shape
    GH, H = cache.weight_hh.shape
    shared = gph is gpx  # one product over [x; 1; h_prev]
    at = _rows_apart((D + 1 + H + (0 if shared else 1), T * B), x.dtype)
    at[D] = 1
    if not shared:
        at[D + 1 + H] = 1
    transposed_inputs_cpu(x.reshape(T * B, D), y, cache.h0, cache.reverse, at, D + 1)
    if shared:
        dw = packed_weight_grads(at, gpx)[:GH]  # (G H, D + 1 + H)
        dw_x, dw_h = dw[:, :D + 1], dw[:, D + 1:]
        db_x = db_h = dw[:, D]
    else:
        dw_x = packed_weight_grads(at[:D + 1], gpx)[:GH]  # (G H, D + 1)
        dw_h = packed_weight_grads(at[D + 1:], gph)[:GH]  # (G H, H + 1)
        db_x, db_h = dw_x[:, D], dw_h[:, H]
    dw_ih = np.ascontiguousarray(dw_x[:, :D])
    dw_hh = np.ascontiguousarray(dw_h[:, :H])
    if not cache.has_bias:
        return dw_ih, dw_hh, None, None
    return dw_ih, dw_hh, db_x.copy(), db_h.copy()
