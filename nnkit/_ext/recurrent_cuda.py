"""Per-step recurrent cells on the GPU: Numba CUDA kernels, forward and backward.

One time step of each cell, the gate nonlinearities fused with the state update, one thread
per (batch row b, hidden unit j) on a 2-D grid. The GEMMs around them (the input projection
for all steps, h_{t-1} W_hh^T per step, and the weight gradients) are left to cuBLAS through
CuPy, as in the CPU path (``nnkit._ext.recurrent_cpu``, whose formulas and gate layouts
these kernels share: LSTM (i, f, g, o), GRU (r, z, n)). Arithmetic is in float64 whatever
the storage dtype.

Each cell takes the two halves of its pre-activation (xg = x W_ih^T + b, hg = h W_hh^T)
and, backwards, the two parts of dL/dh_t (dy_t from above, dh from step t+1) separately and
adds them itself, so that a step is one GEMM and one launch: a launch or a CuPy operation
costs tens of microseconds of host time, far more than the step's arithmetic
(benchmarks/RESULTS.md, "On an NVIDIA H100").
Backward cells also write the total dL/dh_t to ``hidden`` when ``keep`` is set.

Launchers take CuPy arrays, Numba device arrays, or NumPy arrays under
``NUMBA_ENABLE_CUDASIM=1`` (the tests); all arrays C-contiguous, outputs preallocated:

- ``rnn_cell_forward(xg, hg, relu, h)``: h = phi(xg + hg), (B, H) each.
- ``rnn_cell_backward(dy, dh, h, relu, keep, hidden, da)``: da = (dy + dh) * phi'(.).
- ``lstm_cell_forward(xg, hg, c_prev, gates, c, h)``: xg, hg (B, 4H); gates (B, 4H)
  activated (may be xg itself: each thread reads its elements before writing them), c, h.
- ``lstm_cell_backward(dy, dh, dc, gates, c, c_prev, keep, hidden, dpre, dc_prev)``: dc the
  gradient at c_t from step t+1 (dc_prev may be dc itself); dpre (B, 4H).
- ``gru_cell_forward(xg, hg, h_prev, gates, hn, h)``: xg = x W_ih^T + b_ih, hg = h W_hh^T +
  b_hh (B, 3H); gates (B, 3H) (may be xg), hn (B, H) the cache, h (B, H).
- ``gru_cell_backward(dy, dh, gates, hn, h_prev, keep, hidden, dxg, dhg, dh_prev)``: dxg,
  dhg (B, 3H) gradients with respect to xg and hg; dh_prev (B, H) the direct part g * z
  (may be dh itself; add dhg W_hh).

Through time: ``rnn_forward_gpu`` ... ``gru_backward_gpu`` take exactly the arguments of
their CPU twins in ``nnkit._ext.recurrent_cpu`` (same layouts, same in-place use of x_proj,
same saves) and run the time loop from the host: per step one cuBLAS GEMM through CuPy
(NumPy under the simulator) and one fused cell launch (``_launch.launch``).
Nothing leaves the device; the cost is the host's per-step overhead, which is what cuDNN's
persistent kernels avoid (benchmarks/RESULTS.md has the comparison).
"""

from __future__ import annotations

import math

from numba import cuda, float64

from .._backend import array_module
from ._launch import launch
from .simd_math import sigmoid_dev

__all__ = [
    "block",
    "rnn_cell_forward",
    "rnn_cell_backward",
    "lstm_cell_forward",
    "lstm_cell_backward",
    "gru_cell_forward",
    "gru_cell_backward",
    "rnn_forward_gpu",
    "rnn_backward_gpu",
    "lstm_forward_gpu",
    "lstm_backward_gpu",
    "gru_forward_gpu",
    "gru_backward_gpu",
]

block = (8, 32)  # threads per block (batch rows, hidden units); the tests lower it


@cuda.jit
def _rnn_cell_fwd(xg, hg, relu, h):
    b, j = cuda.grid(2)
    if b < h.shape[0] and j < h.shape[1]:
        v = float64(xg[b, j]) + float64(hg[b, j])
        if relu:
            h[b, j] = v if not (v <= 0) else 0.0 * v
        else:
            h[b, j] = math.tanh(v)


@cuda.jit
def _rnn_cell_bwd(dy, dh, h, relu, keep, hidden, da):
    b, j = cuda.grid(2)
    if b < h.shape[0] and j < h.shape[1]:
        g = float64(dy[b, j]) + float64(dh[b, j])
        if keep:
            hidden[b, j] = g
        v = float64(h[b, j])
        if relu:
            da[b, j] = g if v > 0 else 0.0 * g
        else:
            da[b, j] = g * (1.0 - v * v)


@cuda.jit
def _lstm_cell_fwd(xg, hg, c_prev, gates, c, h):
    b, j = cuda.grid(2)
    H = c.shape[1]
    if b < c.shape[0] and j < H:
        i = sigmoid_dev(float64(xg[b, j]) + float64(hg[b, j]))
        f = sigmoid_dev(float64(xg[b, H + j]) + float64(hg[b, H + j]))
        g = math.tanh(float64(xg[b, 2 * H + j]) + float64(hg[b, 2 * H + j]))
        o = sigmoid_dev(float64(xg[b, 3 * H + j]) + float64(hg[b, 3 * H + j]))
        cv = f * float64(c_prev[b, j]) + i * g
        gates[b, j] = i
        gates[b, H + j] = f
        gates[b, 2 * H + j] = g
        gates[b, 3 * H + j] = o
        c[b, j] = cv
        h[b, j] = o * math.tanh(cv)


@cuda.jit
def _lstm_cell_bwd(dy, dh, dc, gates, c, c_prev, keep, hidden, dpre, dc_prev):
    b, j = cuda.grid(2)
    H = c.shape[1]
    if b < c.shape[0] and j < H:
        i = float64(gates[b, j])
        f = float64(gates[b, H + j])
        g = float64(gates[b, 2 * H + j])
        o = float64(gates[b, 3 * H + j])
        tc = math.tanh(float64(c[b, j]))
        gh = float64(dy[b, j]) + float64(dh[b, j])
        if keep:
            hidden[b, j] = gh
        dcv = float64(dc[b, j]) + gh * o * (1.0 - tc * tc)
        dpre[b, j] = dcv * g * i * (1.0 - i)
        dpre[b, H + j] = dcv * float64(c_prev[b, j]) * f * (1.0 - f)
        dpre[b, 2 * H + j] = dcv * i * (1.0 - g * g)
        dpre[b, 3 * H + j] = gh * tc * o * (1.0 - o)
        dc_prev[b, j] = dcv * f


@cuda.jit
def _gru_cell_fwd(xg, hg, h_prev, gates, hn, h):
    b, j = cuda.grid(2)
    H = h.shape[1]
    if b < h.shape[0] and j < H:
        r = sigmoid_dev(float64(xg[b, j]) + float64(hg[b, j]))
        z = sigmoid_dev(float64(xg[b, H + j]) + float64(hg[b, H + j]))
        hnv = float64(hg[b, 2 * H + j])
        n = math.tanh(float64(xg[b, 2 * H + j]) + r * hnv)
        gates[b, j] = r
        gates[b, H + j] = z
        gates[b, 2 * H + j] = n
        hn[b, j] = hnv
        h[b, j] = (1.0 - z) * n + z * float64(h_prev[b, j])


@cuda.jit
def _gru_cell_bwd(dy, dh, gates, hn, h_prev, keep, hidden, dxg, dhg, dh_prev):
    b, j = cuda.grid(2)
    H = hn.shape[1]
    if b < hn.shape[0] and j < H:
        r = float64(gates[b, j])
        z = float64(gates[b, H + j])
        n = float64(gates[b, 2 * H + j])
        g = float64(dy[b, j]) + float64(dh[b, j])
        if keep:
            hidden[b, j] = g
        dan = g * (1.0 - z) * (1.0 - n * n)
        dar = dan * float64(hn[b, j]) * r * (1.0 - r)
        daz = g * (float64(h_prev[b, j]) - n) * z * (1.0 - z)
        dxg[b, j] = dar
        dxg[b, H + j] = daz
        dxg[b, 2 * H + j] = dan
        dhg[b, j] = dar
        dhg[b, H + j] = daz
        dhg[b, 2 * H + j] = dan * r
        dh_prev[b, j] = g * z


def _grid(B, H):
    return ((B + block[0] - 1) // block[0], (H + block[1] - 1) // block[1]), block


def rnn_cell_forward(xg, hg, relu, h):
    launch(_rnn_cell_fwd, *_grid(*h.shape), xg, hg, bool(relu), h)


def rnn_cell_backward(dy, dh, h, relu, keep, hidden, da):
    launch(_rnn_cell_bwd, *_grid(*h.shape), dy, dh, h, bool(relu), bool(keep), hidden, da)


def lstm_cell_forward(xg, hg, c_prev, gates, c, h):
    launch(_lstm_cell_fwd, *_grid(*c.shape), xg, hg, c_prev, gates, c, h)


def lstm_cell_backward(dy, dh, dc, gates, c, c_prev, keep, hidden, dpre, dc_prev):
    launch(_lstm_cell_bwd, *_grid(*c.shape), dy, dh, dc, gates, c, c_prev, bool(keep), hidden,
           dpre, dc_prev)


def gru_cell_forward(xg, hg, h_prev, gates, hn, h):
    launch(_gru_cell_fwd, *_grid(*h.shape), xg, hg, h_prev, gates, hn, h)


def gru_cell_backward(dy, dh, gates, hn, h_prev, keep, hidden, dxg, dhg, dh_prev):
    launch(_gru_cell_bwd, *_grid(*hn.shape), dy, dh, gates, hn, h_prev, bool(keep), hidden, dxg,
           dhg, dh_prev)


# ---- whole sequences: the CPU kernels' signatures, a host loop over T ----------------------

def _order(T, reverse):
    """Step times in the order the forward visits them."""
    return range(T - 1, -1, -1) if reverse else range(T)


def _hidden(hidden_grads):
    """(keep, hidden_grads (T, B, H) or None) — keep False when it is empty."""
    keep = hidden_grads.size > 0
    return keep, (hidden_grads if keep else None)


def rnn_forward_gpu(x_proj, h0, w_hh_t, relu, reverse, y, h):
    """y[t] = phi(x_proj[t] + h_{t-1} @ w_hh_t), as ``recurrent_cpu.rnn_forward_cpu``."""
    xp = array_module(x_proj)
    hg = xp.empty_like(h0)
    h_prev = h0
    for t in _order(x_proj.shape[0], reverse):
        xp.matmul(h_prev, w_hh_t, out=hg)
        h_prev = y[t]
        rnn_cell_forward(x_proj[t], hg, relu, h_prev)
    h[...] = h_prev


def rnn_backward_gpu(dy, dh_T, y, w_hh, relu, reverse, da, dh, hidden_grads):
    """BPTT as ``recurrent_cpu.rnn_backward_cpu``, leaving da = dL/d(pre-activations)
    (T, B, H) for the caller's GEMMs (the CPU kernel packs it and does dx itself); dh ends as
    dL/dh0."""
    xp = array_module(y)
    keep, hidden = _hidden(hidden_grads)
    dh[...] = dh_T
    for t in reversed(_order(y.shape[0], reverse)):
        rnn_cell_backward(dy[t], dh, y[t], relu, keep, hidden[t] if keep else dh, da[t])
        xp.matmul(da[t], w_hh, out=dh)


def lstm_forward_gpu(x_proj, h0, c0, w_hh_t, reverse, y, c_all, h, c, work):
    """As ``recurrent_cpu.lstm_forward_cpu``: x_proj (T, B, 4H) becomes the gates in place."""
    xp = array_module(x_proj)
    h_prev, c_prev = h0, c0
    for t in _order(x_proj.shape[0], reverse):
        xp.matmul(h_prev, w_hh_t, out=work)
        gates, h_prev, c_t = x_proj[t], y[t], c_all[t]
        lstm_cell_forward(gates, work, c_prev, gates, c_t, h_prev)
        c_prev = c_t
    h[...] = h_prev
    c[...] = c_all[0 if reverse else -1]


def lstm_backward_gpu(dy, dh_T, dc_T, c0, gates, c_all, w_hh, reverse, dgates, dh, dc,
                      hidden_grads):
    """BPTT as ``recurrent_cpu.lstm_backward_cpu``, leaving dgates (T, B, 4H) for the
    caller's GEMMs; dh, dc end as dL/dh0, dL/dc0."""
    xp = array_module(gates)
    T = gates.shape[0]
    keep, hidden = _hidden(hidden_grads)
    dh[...] = dh_T
    dc[...] = dc_T
    first = T - 1 if reverse else 0
    for t in reversed(_order(T, reverse)):
        c_prev = c0 if t == first else c_all[t + 1 if reverse else t - 1]
        lstm_cell_backward(dy[t], dh, dc, gates[t], c_all[t], c_prev, keep,
                           hidden[t] if keep else dh, dgates[t], dc)
        xp.matmul(dgates[t], w_hh, out=dh)


def gru_forward_gpu(x_proj, h0, w_hh_t, b_hh, reverse, y, hn, h, gh):
    """As ``recurrent_cpu.gru_forward_cpu``: x_proj (T, B, 3H) becomes r, z, n in place."""
    xp = array_module(x_proj)
    h_prev = h0
    for t in _order(x_proj.shape[0], reverse):
        xp.matmul(h_prev, w_hh_t, out=gh)
        gh += b_hh
        gates, h_t = x_proj[t], y[t]
        gru_cell_forward(gates, gh, h_prev, gates, hn[t], h_t)
        h_prev = h_t
    h[...] = h_prev


def gru_backward_gpu(dy, dh_T, h0, y, gates, hn, w_hh, reverse, dgx, dgh, dh, dh_gated,
                     hidden_grads):
    """BPTT as ``recurrent_cpu.gru_backward_cpu``, leaving dgx, dgh (T, B, 3H) for the
    caller's GEMMs; dh ends as dL/dh0."""
    xp = array_module(gates)
    T = gates.shape[0]
    keep, hidden = _hidden(hidden_grads)
    dh[...] = dh_T
    first = T - 1 if reverse else 0
    for t in reversed(_order(T, reverse)):
        h_prev = h0 if t == first else y[t + 1 if reverse else t - 1]
        gru_cell_backward(dy[t], dh, gates[t], hn[t], h_prev, keep, hidden[t] if keep else dh,
                          dgx[t], dgh[t], dh)  # dh becomes g * z, in place
        xp.matmul(dgh[t], w_hh, out=dh_gated)
        dh += dh_gated
