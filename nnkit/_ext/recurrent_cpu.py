"""Fused time loops of the Elman RNN, LSTM and GRU cells: Numba CPU kernels.

One call runs a whole layer-direction through time. The input projection of every step,
``x_proj = x @ W_ih^T + b`` (T, B, G*H), is computed before the call as one large GEMM;
inside the kernel each step does one small GEMM ``h @ W_hh^T`` (B, H) x (H, G*H), through
``np.dot`` (Numba calls BLAS in place: no Python between steps), then the gate
nonlinearities and the cell update fused in one pass over (B, H). Backward through time
(BPTT) mirrors it: one GEMM ``dgates_h @ W_hh`` per step and the gate derivatives fused;
the weight gradients are left to the caller as large GEMMs over all steps.

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
``w_hh_t`` is W_hh^T made contiguous, (H, G*H). ``nnkit.kernels.recurrent`` is the validated
entry point, and runs the kernels inside ``serial_step_blas()``.

Numerics. ``fastmath`` is off. The gate nonlinearities are the branch-free polynomial
``sigmoid``/``tanh`` below, which LLVM vectorises (libm's are called one element at a time):
float64 math for float64 arrays (<= 3 ulp), float32 math for float32 arrays (<= 2.5 ulp
measured), chosen by ``act_sigmoid``/``act_tanh`` from the argument type. NaN propagates;
inputs beyond the clamp give the limits (sigmoid(-inf) is 6e-39 in float32, not 0).
``error_model="numpy"`` drops Python's ZeroDivisionError check, whose branch alone kept the
sigmoid loop scalar (34 ms -> 3 ms per 2M elements).
"""

from __future__ import annotations

import contextlib
import functools
import math
import os

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic, overload

__all__ = [
    "rnn_forward_cpu",
    "rnn_backward_cpu",
    "lstm_forward_cpu",
    "lstm_backward_cpu",
    "gru_forward_cpu",
    "gru_backward_cpu",
    "fast_exp",
    "sigmoid",
    "tanh",
    "sigmoid32",
    "tanh32",
    "act_sigmoid",
    "act_tanh",
    "serial_step_blas",
]


# ---- the per-step GEMMs run on one BLAS thread ---------------------------------------------
# Numba's np.dot calls SciPy's BLAS (scipy.linalg.cython_blas). Its worker threads spin for a
# while after each call; in a time loop that alternates a small GEMM with the fused gate
# loop, the spinning worker takes the core the gate loop runs on. Measured on the LSTM
# forward (T, B, H) = (128, 32, 128), 2 cores: GEMMs alone 13 ms, gate loops alone 12 ms,
# together 39-160 ms with 2 BLAS threads but 25 ms with one. So the kernels below run with
# SciPy's BLAS limited to one thread (restored afterwards; ~1 us per switch).


@functools.cache
def _scipy_blas():
    """threadpoolctl's controller of the BLAS that numba's np.dot uses, or None."""
    try:
        import scipy
        from threadpoolctl import ThreadpoolController
    except ImportError:
        return None
    root = os.path.dirname(os.path.dirname(scipy.__file__))
    for lib in ThreadpoolController().lib_controllers:
        if lib.user_api == "blas" and os.path.abspath(lib.filepath).startswith(
                os.path.join(root, "scipy")):
            return lib
    return None


@contextlib.contextmanager
def serial_step_blas():
    """Run the block with numba's (SciPy's) BLAS on one thread."""
    lib = _scipy_blas()
    if lib is None:
        yield
        return
    before = lib.num_threads
    lib.set_num_threads(1)
    try:
        yield
    finally:
        lib.set_num_threads(before)


# ---- vectorisable exp, expm1, sigmoid, tanh -------------------------------------------------
# Numba calls libm for math.exp/tanh, one element at a time (no SIMD here, see PERF-NOTES): in
# the LSTM cell those calls cost ~6x the arithmetic. These versions are branch-free float64
# arithmetic that LLVM vectorises: exp(x) = 2^k exp(r), k = round(x / ln 2), |r| <= ln2 / 2,
# exp(r) by its Taylor series to degree 13 (truncation < 1e-17), 2^k built from its bits.
# Measured: max error 1.01 ulp (float64) over [-700, 700]; 1.3 ms per 1M elements against
# 8.3 ms for math.exp. Inputs are clamped to [-708, 709] (no overflow, no denormals), so
# exp(+inf) is 8.2e307 rather than inf: sigmoid and tanh still reach their limits exactly.
# NaN propagates (every clamp is written so that a NaN comparison keeps x).

_LOG2E = 1.4426950408889634
_LN2_HI = 0.6931471803691238  # ln 2 split so that k * _LN2_HI is exact for |k| <= 1024
_LN2_LO = 1.9082149292705877e-10


@intrinsic
def _int64_bits_as_float64(typingctx, v):
    """Reinterpret the bits of an int64 as a float64 (an LLVM bitcast; vectorises)."""
    sig = types.float64(types.int64)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.DoubleType())

    return sig, codegen


def _expm1_parts(x):
    """(s, e) with exp(x) = s + e and expm1(x) = (s - 1) + e, s = 2^k exact, x float64."""
    x = x if not (x > 709.0) else 709.0
    x = x if not (x < -708.0) else -708.0
    k = math.floor(x * _LOG2E + 0.5)
    r = (x - k * _LN2_HI) - k * _LN2_LO
    q = 1.0 / 6227020800.0
    q = 1.0 / 479001600.0 + r * q
    q = 1.0 / 39916800.0 + r * q
    q = 1.0 / 3628800.0 + r * q
    q = 1.0 / 362880.0 + r * q
    q = 1.0 / 40320.0 + r * q
    q = 1.0 / 5040.0 + r * q
    q = 1.0 / 720.0 + r * q
    q = 1.0 / 120.0 + r * q
    q = 1.0 / 24.0 + r * q
    q = 1.0 / 6.0 + r * q
    q = 0.5 + r * q
    q = 1.0 + r * q  # exp(r) = 1 + r q
    s = _int64_bits_as_float64((np.int64(k) + 1023) << 52)
    return s, s * (r * q)


expm1_parts = numba.njit(cache=True, inline="always", error_model="numpy")(_expm1_parts)


def _fast_exp(x):
    s, e = expm1_parts(float(x))
    return s + e


def _fast_sigmoid(x):
    """1 / (1 + exp(-x)), float64; relative error ~2 ulp."""
    s, e = expm1_parts(-float(x))
    return 1.0 / (1.0 + (s + e))


def _fast_tanh(x):
    """tanh(x) = -u / (u + 2) with u = expm1(-2|x|), float64; relative error ~3 ulp."""
    a = float(x)
    s, e = expm1_parts(-2.0 * abs(a))
    u = (s - 1.0) + e  # in (-1, 0]
    t = abs(u) / (u + 2.0)
    return t if a >= 0 else -t


fast_exp = numba.njit(cache=True, inline="always", error_model="numpy")(_fast_exp)
sigmoid = numba.njit(cache=True, inline="always", error_model="numpy")(_fast_sigmoid)
tanh = numba.njit(cache=True, inline="always", error_model="numpy")(_fast_tanh)


# float32 twins of the above, for float32 arrays: twice the SIMD lanes. Same reduction, with
# inputs clamped to [-87, 88], the Taylor series to degree 8 (truncation < 3e-9 relative)
# and 2^k from float32 bits. Measured: max error 2 ulp (float32) over [-80, 80].
_F = np.float32
_LOG2E_F = _F(1.4426950408889634)
_LN2_HI_F = _F(0.693145751953125)  # 11 significant bits: k * _LN2_HI_F exact for |k| < 2^13
_LN2_LO_F = _F(1.4286068203094172e-06)


@intrinsic
def _int32_bits_as_float32(typingctx, v):
    """Reinterpret the bits of an int32 as a float32 (an LLVM bitcast; vectorises)."""
    sig = types.float32(types.int32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return sig, codegen


def _expm1_parts32(x):
    """(s, e) with exp(x) = s + e, s = 2^k exact; x and the results float32."""
    x = x if not (x > _F(88.0)) else _F(88.0)
    x = x if not (x < _F(-87.0)) else _F(-87.0)
    k = np.floor(x * _LOG2E_F + _F(0.5))
    r = (x - k * _LN2_HI_F) - k * _LN2_LO_F
    q = _F(1.0 / 40320.0)
    q = _F(1.0 / 5040.0) + r * q
    q = _F(1.0 / 720.0) + r * q
    q = _F(1.0 / 120.0) + r * q
    q = _F(1.0 / 24.0) + r * q
    q = _F(1.0 / 6.0) + r * q
    q = _F(0.5) + r * q
    q = _F(1.0) + r * q
    s = _int32_bits_as_float32((np.int32(k) + np.int32(127)) << np.int32(23))
    return s, s * (r * q)


expm1_parts32 = numba.njit(cache=True, inline="always", error_model="numpy")(_expm1_parts32)


def _sigmoid32(x):
    s, e = expm1_parts32(-x)
    return _F(1.0) / (_F(1.0) + (s + e))


def _tanh32(x):
    s, e = expm1_parts32(_F(-2.0) * abs(x))
    u = (s - _F(1.0)) + e  # in (-1, 0]
    t = abs(u) / (u + _F(2.0))
    return t if x >= 0 else -t


sigmoid32 = numba.njit(cache=True, inline="always", error_model="numpy")(_sigmoid32)
tanh32 = numba.njit(cache=True, inline="always", error_model="numpy")(_tanh32)


def act_sigmoid(x):
    """sigmoid in the precision of x: float32 math for float32, float64 otherwise."""
    return 1.0 / (1.0 + math.exp(-x))


def act_tanh(x):
    """tanh in the precision of x: float32 math for float32, float64 otherwise."""
    return math.tanh(x)


@overload(act_sigmoid)
def _act_sigmoid(x):
    if x == types.float32:
        return lambda x: sigmoid32(x)
    return lambda x: sigmoid(x)


@overload(act_tanh)
def _act_tanh(x):
    if x == types.float32:
        return lambda x: tanh32(x)
    return lambda x: tanh(x)


def _step_index(s, T, reverse):
    return T - 1 - s if reverse else s


step_index = numba.njit(cache=True, inline="always", error_model="numpy")(_step_index)


# Loop structure. Each step works on row views (one batch row, contiguous) in short loops
# that touch few arrays, so that LLVM vectorises them (a single loop writing many arrays it
# cannot prove distinct is left scalar: 60 ns per LSTM cell instead of ~8). The state of
# step t is read back from the outputs (y[t-1], c[t-1]) instead of being copied.


def _prev(first, s0, seq, tp):
    """The state the step reads: the initial one at the first step, else seq[tp]."""
    return s0 if first else seq[tp]


prev = numba.njit(cache=True, inline="always", error_model="numpy")(_prev)


# ---- Elman RNN: h_t = phi(x_proj_t + h_{t-1} W_hh^T) ------------------------------------

def _rnn_forward_cpu(x_proj, h0, w_hh_t, relu, reverse, y, h):
    """y[t] = phi(x_proj[t] + h_{t-1} @ w_hh_t); x_proj, y (T, B, H); h0, h (B, H): h ends
    as h_T."""
    T, B, H = x_proj.shape
    for s in range(T):
        t = step_index(s, T, reverse)
        yt = y[t]
        np.dot(prev(s == 0, h0, y, t + 1 if reverse else t - 1), w_hh_t, yt)  # (B, H)
        for b in range(B):
            row, xrow = yt[b], x_proj[t, b]
            if relu:
                for j in range(H):
                    v = row[j] + xrow[j]
                    row[j] = v if not (v <= 0) else 0.0 * v  # NaN stays NaN
            else:
                for j in range(H):
                    row[j] = act_tanh(row[j] + xrow[j])
    h[:, :] = y[T - 1 if not reverse else 0]


def _rnn_backward_cpu(dy, dh_T, y, w_hh, relu, reverse, da, dh, hidden_grads):
    """BPTT: da[t] = dL/d(pre-activation at t) (T, B, H); dh (B, H) ends as dL/dh0;
    hidden_grads (T, B, H) receives the total dL/dh_t unless it is empty (size 0)."""
    T, B, H = y.shape
    keep = hidden_grads.size > 0
    dh[:, :] = dh_T
    for s in range(T):
        t = step_index(T - 1 - s, T, reverse)
        for b in range(B):
            drow, dyrow, yrow, dhrow = da[t, b], dy[t, b], y[t, b], dh[b]
            for j in range(H):
                drow[j] = dhrow[j] + dyrow[j]  # total dL/dh_t
            if keep:
                hidden_grads[t, b, :] = drow
            if relu:
                for j in range(H):
                    drow[j] = drow[j] if yrow[j] > 0 else 0.0 * drow[j]
            else:
                for j in range(H):
                    drow[j] = drow[j] * (1.0 - yrow[j] * yrow[j])
        np.dot(da[t], w_hh, dh)  # (B, H) @ (H, H)


rnn_forward_cpu = numba.njit(cache=True, error_model="numpy")(_rnn_forward_cpu)
rnn_backward_cpu = numba.njit(cache=True, error_model="numpy")(_rnn_backward_cpu)


# ---- LSTM: gates (i, f, g, o); c_t = f c_{t-1} + i g; h_t = o tanh(c_t) -------------------

def _lstm_forward_cpu(x_proj, h0, c0, w_hh_t, reverse, y, c_all, h, c, work):
    """x_proj (T, B, 4H) holds x W_ih^T + b_ih + b_hh and is overwritten in place with the
    activated gates (no second 4H buffer to allocate and fault in); outputs y, c_all
    (T, B, H); h, c (B, H) end as h_T, c_T; work (B, 4H) workspace."""
    T, B, G = x_proj.shape
    H = G // 4
    for s in range(T):
        t = step_index(s, T, reverse)
        tp = t + 1 if reverse else t - 1
        np.dot(prev(s == 0, h0, y, tp), w_hh_t, work)  # (B, 4H)
        c_prev = prev(s == 0, c0, c_all, tp)
        for b in range(B):
            g, wrow = x_proj[t, b], work[b]
            for j in range(2 * H):  # i, f
                g[j] = act_sigmoid(g[j] + wrow[j])
            for j in range(2 * H, 3 * H):  # g
                g[j] = act_tanh(g[j] + wrow[j])
            for j in range(3 * H, 4 * H):  # o
                g[j] = act_sigmoid(g[j] + wrow[j])
            crow, cprow = c_all[t, b], c_prev[b]
            for j in range(H):
                crow[j] = g[H + j] * cprow[j] + g[j] * g[2 * H + j]
            yrow = y[t, b]
            for j in range(H):
                yrow[j] = g[3 * H + j] * act_tanh(crow[j])
    last = 0 if reverse else T - 1
    h[:, :] = y[last]
    c[:, :] = c_all[last]


def _lstm_backward_cpu(dy, dh_T, dc_T, c0, gates, c_all, w_hh, reverse, dgates, dh, dc,
                       hidden_grads):
    """BPTT: dgates[t] = dL/d(gate pre-activations) (T, B, 4H); dh, dc (B, H) end as
    dL/dh0, dL/dc0; hidden_grads (T, B, H) receives the total dL/dh_t unless empty."""
    T, B, G = gates.shape
    H = G // 4
    keep = hidden_grads.size > 0
    dh[:, :] = dh_T
    dc[:, :] = dc_T
    for s in range(T):
        t = step_index(T - 1 - s, T, reverse)
        c_prev = prev(s == T - 1, c0, c_all, t + 1 if reverse else t - 1)
        for b in range(B):
            g, d = gates[t, b], dgates[t, b]
            dhrow, dcrow, dyrow, crow, cprow = dh[b], dc[b], dy[t, b], c_all[t, b], c_prev[b]
            for j in range(H):
                dhrow[j] += dyrow[j]  # total dL/dh_t
            if keep:
                hidden_grads[t, b, :] = dhrow
            for j in range(H):
                tc = act_tanh(crow[j])
                og = g[3 * H + j]
                d[3 * H + j] = dhrow[j] * tc * og * (1.0 - og)
                dcrow[j] += dhrow[j] * og * (1.0 - tc * tc)  # total dL/dc_t
            for j in range(H):
                ig, fg, gg = g[j], g[H + j], g[2 * H + j]
                dcv = dcrow[j]
                d[j] = dcv * gg * ig * (1.0 - ig)
                d[H + j] = dcv * cprow[j] * fg * (1.0 - fg)
                d[2 * H + j] = dcv * ig * (1.0 - gg * gg)
                dcrow[j] = dcv * fg
        np.dot(dgates[t], w_hh, dh)  # (B, 4H) @ (4H, H)


lstm_forward_cpu = numba.njit(cache=True, error_model="numpy")(_lstm_forward_cpu)
lstm_backward_cpu = numba.njit(cache=True, error_model="numpy")(_lstm_backward_cpu)


# ---- GRU: gates (r, z, n); n = tanh(xn + r (h W_hn^T + b_hn)); h = (1 - z) n + z h --------

def _gru_forward_cpu(x_proj, h0, w_hh_t, b_hh, reverse, y, hn, h, gh):
    """x_proj (T, B, 3H) holds x W_ih^T + b_ih and is overwritten in place with the
    activated gates r, z, n; b_hh (3H,); outputs y, hn (T, B, H); h (B, H) ends as h_T;
    gh (B, 3H) workspace."""
    T, B, G = x_proj.shape
    H = G // 3
    for s in range(T):
        t = step_index(s, T, reverse)
        h_prev = prev(s == 0, h0, y, t + 1 if reverse else t - 1)
        np.dot(h_prev, w_hh_t, gh)  # (B, 3H)
        for b in range(B):
            g, ghrow = x_proj[t, b], gh[b]
            for j in range(2 * H):  # r, z
                g[j] = act_sigmoid(g[j] + ghrow[j] + b_hh[j])
            hnrow = hn[t, b]
            for j in range(H):
                hnrow[j] = ghrow[2 * H + j] + b_hh[2 * H + j]
            for j in range(H):
                g[2 * H + j] = act_tanh(g[2 * H + j] + g[j] * hnrow[j])
            yrow, hprow = y[t, b], h_prev[b]
            for j in range(H):
                z = g[H + j]
                yrow[j] = (1.0 - z) * g[2 * H + j] + z * hprow[j]
    h[:, :] = y[0 if reverse else T - 1]


def _gru_backward_cpu(dy, dh_T, h0, y, gates, hn, w_hh, reverse, dgx, dgh, dh, dh_gated,
                      hidden_grads):
    """BPTT: dgx[t] = dL/d(x-side pre-activations), dgh[t] = dL/d(h W_hh^T + b_hh)
    (T, B, 3H); dh (B, H) ends as dL/dh0; dh_gated (B, H) workspace; hidden_grads
    (T, B, H) receives the total dL/dh_t unless empty."""
    T, B, G = gates.shape
    H = G // 3
    keep = hidden_grads.size > 0
    dh[:, :] = dh_T
    for s in range(T):
        t = step_index(T - 1 - s, T, reverse)
        h_prev = prev(s == T - 1, h0, y, t + 1 if reverse else t - 1)
        for b in range(B):
            g, dx, dhh = gates[t, b], dgx[t, b], dgh[t, b]
            dhrow, dyrow, hprow, hnrow = dh[b], dy[t, b], h_prev[b], hn[t, b]
            for j in range(H):
                dhrow[j] += dyrow[j]  # total dL/dh_t
            if keep:
                hidden_grads[t, b, :] = dhrow
            for j in range(H):
                z, n = g[H + j], g[2 * H + j]
                dan = dhrow[j] * (1.0 - z) * (1.0 - n * n)
                dx[2 * H + j] = dan
                dx[H + j] = dhrow[j] * (hprow[j] - n) * z * (1.0 - z)
                dhrow[j] = dhrow[j] * z  # the direct path; the GEMM below adds the gated one
            for j in range(H):
                r = g[j]
                dx[j] = dx[2 * H + j] * hnrow[j] * r * (1.0 - r)
                dhh[2 * H + j] = dx[2 * H + j] * r
            for j in range(2 * H):
                dhh[j] = dx[j]
        np.dot(dgh[t], w_hh, dh_gated)  # (B, 3H) @ (3H, H)
        dh += dh_gated


gru_forward_cpu = numba.njit(cache=True, error_model="numpy")(_gru_forward_cpu)
gru_backward_cpu = numba.njit(cache=True, error_model="numpy")(_gru_backward_cpu)
