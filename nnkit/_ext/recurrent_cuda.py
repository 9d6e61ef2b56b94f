"""Per-step recurrent cells on the GPU: Numba CUDA kernels, forward and backward.

One time step of each cell, the gate nonlinearities fused with the state update, one thread
per (batch row b, hidden unit j) on a 2-D grid. The GEMMs around them (the input projection
for all steps, h_{t-1} W_hh^T per step, and the weight gradients) are left to cuBLAS through
CuPy, as in the CPU path (``nnkit._ext.recurrent_cpu``, whose formulas and gate layouts
these kernels share: LSTM (i, f, g, o), GRU (r, z, n)). Arithmetic is in float64 whatever
the storage dtype.

Launchers take CuPy arrays, Numba device arrays, or NumPy arrays under
``NUMBA_ENABLE_CUDASIM=1`` (the tests); all arrays C-contiguous, outputs preallocated:

- ``rnn_cell_forward(pre, relu, h)``: h = phi(pre), pre (B, H) the full pre-activation.
- ``rnn_cell_backward(dh, h, relu, da)``: da = dh * phi'(.) from h.
- ``lstm_cell_forward(pre, c_prev, gates, c, h)``: pre (B, 4H) pre-activations; gates (B, 4H)
  activated, c, h (B, H).
- ``lstm_cell_backward(dh, dc, gates, c, c_prev, dpre, dc_prev)``: dh, dc the total
  gradients at the step's outputs h_t, c_t (dc from step t+1 only; the h path is added
  inside); dpre (B, 4H), dc_prev (B, H).
- ``gru_cell_forward(xg, hg, h_prev, gates, hn, h)``: xg = x W_ih^T + b_ih, hg = h W_hh^T +
  b_hh (B, 3H); gates (B, 3H), hn (B, H) the cache, h (B, H).
- ``gru_cell_backward(dh, gates, hn, h_prev, dxg, dhg, dh_prev)``: dxg, dhg (B, 3H)
  gradients with respect to xg and hg; dh_prev (B, H) the direct part dh * z (add dhg W_hh).
"""

from __future__ import annotations

import math

from numba import cuda, float64

__all__ = [
    "block",
    "rnn_cell_forward",
    "rnn_cell_backward",
    "lstm_cell_forward",
    "lstm_cell_backward",
    "gru_cell_forward",
    "gru_cell_backward",
]

block = (8, 32)  # threads per block (batch rows, hidden units); the tests lower it


@cuda.jit(device=True)
def _sigmoid(a):
    if a >= 0:
        return 1.0 / (1.0 + math.exp(-a))
    e = math.exp(a)
    return e / (1.0 + e)


@cuda.jit
def _rnn_cell_fwd(pre, relu, h):
    b, j = cuda.grid(2)
    if b < h.shape[0] and j < h.shape[1]:
        v = float64(pre[b, j])
        if relu:
            h[b, j] = v if not (v <= 0) else 0.0 * v
        else:
            h[b, j] = math.tanh(v)


@cuda.jit
def _rnn_cell_bwd(dh, h, relu, da):
    b, j = cuda.grid(2)
    if b < h.shape[0] and j < h.shape[1]:
        g = float64(dh[b, j])
        v = float64(h[b, j])
        if relu:
            da[b, j] = g if v > 0 else 0.0 * g
        else:
            da[b, j] = g * (1.0 - v * v)


@cuda.jit
def _lstm_cell_fwd(pre, c_prev, gates, c, h):
    b, j = cuda.grid(2)
    H = c.shape[1]
    if b < c.shape[0] and j < H:
        i = _sigmoid(float64(pre[b, j]))
        f = _sigmoid(float64(pre[b, H + j]))
        g = math.tanh(float64(pre[b, 2 * H + j]))
        o = _sigmoid(float64(pre[b, 3 * H + j]))
        cv = f * float64(c_prev[b, j]) + i * g
        gates[b, j] = i
        gates[b, H + j] = f
        gates[b, 2 * H + j] = g
        gates[b, 3 * H + j] = o
        c[b, j] = cv
        h[b, j] = o * math.tanh(cv)


@cuda.jit
def _lstm_cell_bwd(dh, dc, gates, c, c_prev, dpre, dc_prev):
    b, j = cuda.grid(2)
    H = c.shape[1]
    if b < c.shape[0] and j < H:
        i = float64(gates[b, j])
        f = float64(gates[b, H + j])
        g = float64(gates[b, 2 * H + j])
        o = float64(gates[b, 3 * H + j])
        tc = math.tanh(float64(c[b, j]))
        gh = float64(dh[b, j])
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
        r = _sigmoid(float64(xg[b, j]) + float64(hg[b, j]))
        z = _sigmoid(float64(xg[b, H + j]) + float64(hg[b, H + j]))
        hnv = float64(hg[b, 2 * H + j])
        n = math.tanh(float64(xg[b, 2 * H + j]) + r * hnv)
        gates[b, j] = r
        gates[b, H + j] = z
        gates[b, 2 * H + j] = n
        hn[b, j] = hnv
        h[b, j] = (1.0 - z) * n + z * float64(h_prev[b, j])


@cuda.jit
def _gru_cell_bwd(dh, gates, hn, h_prev, dxg, dhg, dh_prev):
    b, j = cuda.grid(2)
    H = hn.shape[1]
    if b < hn.shape[0] and j < H:
        r = float64(gates[b, j])
        z = float64(gates[b, H + j])
        n = float64(gates[b, 2 * H + j])
        g = float64(dh[b, j])
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


def rnn_cell_forward(pre, relu, h):
    grid, threads = _grid(*h.shape)
    _rnn_cell_fwd[grid, threads](pre, bool(relu), h)


def rnn_cell_backward(dh, h, relu, da):
    grid, threads = _grid(*h.shape)
    _rnn_cell_bwd[grid, threads](dh, h, bool(relu), da)


def lstm_cell_forward(pre, c_prev, gates, c, h):
    grid, threads = _grid(*c.shape)
    _lstm_cell_fwd[grid, threads](pre, c_prev, gates, c, h)


def lstm_cell_backward(dh, dc, gates, c, c_prev, dpre, dc_prev):
    grid, threads = _grid(*c.shape)
    _lstm_cell_bwd[grid, threads](dh, dc, gates, c, c_prev, dpre, dc_prev)


def gru_cell_forward(xg, hg, h_prev, gates, hn, h):
    grid, threads = _grid(*h.shape)
    _gru_cell_fwd[grid, threads](xg, hg, h_prev, gates, hn, h)


def gru_cell_backward(dh, gates, hn, h_prev, dxg, dhg, dh_prev):
    grid, threads = _grid(*hn.shape)
    _gru_cell_bwd[grid, threads](dh, gates, hn, h_prev, dxg, dhg, dh_prev)
