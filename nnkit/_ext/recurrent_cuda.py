"""Persistent recurrent kernels on the GPU: one Numba CUDA launch per layer, direction and pass.

RNN, LSTM and GRU forward and backward through time each run the whole time loop inside one
kernel, as cuDNN's persistent RNNs and FlashRNN do. One thread block owns a tile of ``rows``
batch rows for all T steps (rows never meet, so blocks need no grid synchronisation); each
step it

1. forms the recurrent product of its rows: pre = h_{t-1} W_hh^T (forward, one thread per
   (row, gate unit)) or dA_t W_hh (backward, one thread per (row, hidden unit)), reading
   the state rows from shared memory; ``cuda.syncthreads()``;
2. applies the gate nonlinearities fused with the state update, one thread per (row, hidden
   unit), writing the new state to shared memory; ``cuda.syncthreads()``.

The input projection of all steps (x W_ih^T + b, one cuBLAS GEMM) precedes the forward, and
the weight gradients are products over all steps after the backward, which leaves the gate
gradients of every step (``nnkit.kernels.recurrent``): a forward or a backward makes the same
launches whatever T (tests/test_recurrent_persistent.py pins them).

On chip: the tile's state (h and the pre-activations; backward dL/dh, dL/dc and dA) in shared
memory, and W_hh beside it when both fit in ``shared_limit`` bytes (48 KiB, a block's shared
memory without the opt-in): an LSTM up to H = 54 in float32 (38 in float64) at one row per
block. A larger W_hh is read from global memory every step, where it stays L2-resident (a
float32 LSTM's of H = 256 is 1 MiB); a state too large for shared memory (an LSTM backward
beyond H = 2048 in float32, 1024 in float64) lives in a global workspace instead. So every
shape runs persistent; the per-step path (a GEMM and a cell launch per step) is gone.
Tile sizes are not tuned on a GPU yet: ``max_blocks`` tiles at most (rows = ceil(B /
max_blocks)), ``threads`` threads per block (the tests lower both).

Arithmetic, the state and the workspace are in the storage dtype (float32 like cuDNN's
persistent RNNs, whose recurrent products also accumulate in float32; the constants are typed,
``one = y.dtype.type(1)``, as a Python float would promote float32 to float64); the state
carried to the next step is y[t] as stored (and c_t as stored), as on the CPU
(``nnkit._ext.recurrent_cpu``, whose formulas and gate layouts these kernels share: LSTM (i,
f, g, o), GRU (r, z, n) with b_hn inside r * (W_hn h + b_hn)).

The kernel launchers (``rnn_forward_gpu`` ... ``gru_backward_gpu``) take CuPy arrays, or
NumPy arrays under ``NUMBA_ENABLE_CUDASIM=1`` (the tests); all C-contiguous, outputs
preallocated. The forwards take the projected input (x_proj (T, B, G H) becomes the
activated gates in place for the LSTM and GRU); the backwards leave dL/d(pre-activation) of
every step (T, B, G H), and dh (dc) as dL/dh0 (dL/dc0).

``nnkit.kernels.recurrent`` calls the layer launchers at the end of this module
(``rnn_forward_layer`` ... ``gru_backward_layer``), which have the signatures of
``nnkit._ext.recurrent_cpu``'s (``nnkit._backend.kernels_for`` picks the module): the
projection GEMM before a forward, the input and weight gradients (cuBLAS GEMMs over all
steps) after a backward.
"""

from __future__ import annotations

import math

from numba import cuda

from .._backend import array_module
from ._launch import device_empty, launch
from .launchers import launchers

__all__ = [*launchers("recurrent_cpu", "recurrent_cuda"), "threads", "max_blocks", "shared_limit",
           "rnn_forward_gpu", "rnn_backward_gpu", "lstm_forward_gpu", "lstm_backward_gpu",
           "gru_forward_gpu", "gru_backward_gpu"]

threads = 256  # threads per block, at most
max_blocks = 128  # batch tiles, at most (more rows per block beyond), unless shared memory
shared_limit = 48 * 1024  # dynamic shared memory per block, bytes


# ---- the parts every kernel shares -------------------------------------------------------

# The block's state and W_hh: dynamic shared memory (the state first, then W_hh, both in the
# storage dtype: every dynamic shared array starts at the same byte), or the block's slice of the
# global workspace and W_hh itself. Device functions cannot return arrays they did not
# receive, so each kernel picks them itself.

@cuda.jit(device=True)
def _copy(src, dst):
    """dst[:] = src[:], the block's threads striding."""
    for i in range(cuda.threadIdx.x, src.size, cuda.blockDim.x):
        dst[i] = src[i]


@cuda.jit(device=True)
def _product(src, n_in, w, n_out, dst, valid, accumulate):
    """dst[r, m] (+)= sum_k src[r, k] w[k, m] for the tile's first ``valid`` rows (flat
    row-major arrays), one thread per (r, m): the threads of a warp read consecutive m."""
    for idx in range(cuda.threadIdx.x, valid * n_out, cuda.blockDim.x):
        r = idx // n_out
        m = idx - r * n_out
        base = r * n_in
        acc = dst[idx] if accumulate else dst.dtype.type(0)
        for k in range(n_in):
            acc += src[base + k] * w[k * n_out + m]
        dst[idx] = acc


@cuda.jit(device=True)
def _sigmoid(a, one):
    """1 / (1 + exp(-a)) in a's type (``one``: 1 in that type), without overflow: exp of a
    non-positive argument only."""
    if a >= 0:
        return one / (one + math.exp(-a))
    e = math.exp(a)
    return e / (one + e)


@cuda.jit(device=True)
def _tile(rows, B):
    """(first batch row of the block, its rows that exist)."""
    b0 = cuda.blockIdx.x * rows
    return b0, rows if b0 + rows <= B else B - b0


# ---- Elman RNN -----------------------------------------------------------------------------

@cuda.jit
def _rnn_seq_fwd(x_proj, h0, w, relu, reverse, rows, w_on_chip, state_on_chip, work, y, h):
    T, B, H = y.shape
    zero = y.dtype.type(0)
    b0, valid = _tile(rows, B)
    n = rows * H
    size = 2 * n
    state = (cuda.shared.array(0, y.dtype)[:size] if state_on_chip
             else work[cuda.blockIdx.x * size:(cuda.blockIdx.x + 1) * size])
    hs, pre = state[:n], state[n:]
    start = y.itemsize * size // w.itemsize if state_on_chip else 0
    wv = cuda.shared.array(0, w.dtype)[start:start + w.size] if w_on_chip else w
    if w_on_chip:
        _copy(w, wv)
    for idx in range(cuda.threadIdx.x, valid * H, cuda.blockDim.x):
        hs[idx] = h0[b0 + idx // H, idx % H]
    cuda.syncthreads()
    for s in range(T):
        t = T - 1 - s if reverse else s
        _product(hs, H, wv, H, pre, valid, False)
        cuda.syncthreads()
        for idx in range(cuda.threadIdx.x, valid * H, cuda.blockDim.x):
            b, j = b0 + idx // H, idx % H
            v = x_proj[t, b, j] + pre[idx]
            if relu:
                y[t, b, j] = v if not (v <= 0) else zero * v
            else:
                y[t, b, j] = math.tanh(v)
            hs[idx] = y[t, b, j]
        cuda.syncthreads()
    for idx in range(cuda.threadIdx.x, valid * H, cuda.blockDim.x):
        h[b0 + idx // H, idx % H] = hs[idx]


@cuda.jit
def _rnn_seq_bwd(dy, dh_T, y, w, relu, reverse, rows, w_on_chip, state_on_chip, work, keep,
                 hidden, da, dh):
    T, B, H = y.shape
    one, zero = y.dtype.type(1), y.dtype.type(0)
    b0, valid = _tile(rows, B)
    n = rows * H
    size = 2 * n
    state = (cuda.shared.array(0, y.dtype)[:size] if state_on_chip
             else work[cuda.blockIdx.x * size:(cuda.blockIdx.x + 1) * size])
    g_next, d = state[:n], state[n:]  # dL/dh from step t+1; dA_t of the tile
    start = y.itemsize * size // w.itemsize if state_on_chip else 0
    wv = cuda.shared.array(0, w.dtype)[start:start + w.size] if w_on_chip else w
    if w_on_chip:
        _copy(w, wv)
    for idx in range(cuda.threadIdx.x, valid * H, cuda.blockDim.x):
        g_next[idx] = dh_T[b0 + idx // H, idx % H]
    cuda.syncthreads()
    for s in range(T):
        t = s if reverse else T - 1 - s
        for idx in range(cuda.threadIdx.x, valid * H, cuda.blockDim.x):
            b, j = b0 + idx // H, idx % H
            g = dy[t, b, j] + g_next[idx]
            if keep:
                hidden[t, b, j] = g
            v = y[t, b, j]
            if relu:
                a = g if v > 0 else zero * g
            else:
                a = g * (one - v * v)
            da[t, b, j] = a
            d[idx] = a
        cuda.syncthreads()
        _product(d, H, wv, H, g_next, valid, False)  # each thread its own g_next[idx]
        cuda.syncthreads()
    for idx in range(cuda.threadIdx.x, valid * H, cuda.blockDim.x):
        dh[b0 + idx // H, idx % H] = g_next[idx]


# ---- LSTM ----------------------------------------------------------------------------------

@cuda.jit
def _lstm_seq_fwd(x_proj, h0, c0, w, reverse, rows, w_on_chip, state_on_chip, work, y, c_all,
                  h, c):
    T, B, H = y.shape
    one = y.dtype.type(1)
    G = 4 * H
    b0, valid = _tile(rows, B)
    n = rows * H
    size = n + rows * G
    state = (cuda.shared.array(0, y.dtype)[:size] if state_on_chip
             else work[cuda.blockIdx.x * size:(cuda.blockIdx.x + 1) * size])
    hs, pre = state[:n], state[n:]
    start = y.itemsize * size // w.itemsize if state_on_chip else 0
    wv = cuda.shared.array(0, w.dtype)[start:start + w.size] if w_on_chip else w
    if w_on_chip:
        _copy(w, wv)
    for idx in range(cuda.threadIdx.x, valid * H, cuda.blockDim.x):
        hs[idx] = h0[b0 + idx // H, idx % H]
    cuda.syncthreads()
    for s in range(T):
        t = T - 1 - s if reverse else s
        tp = t + 1 if reverse else t - 1
        _product(hs, H, wv, G, pre, valid, False)
        cuda.syncthreads()
        for idx in range(cuda.threadIdx.x, valid * H, cuda.blockDim.x):
            r = idx // H
            b, j, p = b0 + r, idx - r * H, r * G
            i = _sigmoid(x_proj[t, b, j] + pre[p + j], one)
            f = _sigmoid(x_proj[t, b, H + j] + pre[p + H + j], one)
            g = math.tanh(x_proj[t, b, 2 * H + j] + pre[p + 2 * H + j])
            o = _sigmoid(x_proj[t, b, 3 * H + j] + pre[p + 3 * H + j], one)
            cp = c0[b, j] if s == 0 else c_all[tp, b, j]
            cv = f * cp + i * g
            x_proj[t, b, j] = i
            x_proj[t, b, H + j] = f
            x_proj[t, b, 2 * H + j] = g
            x_proj[t, b, 3 * H + j] = o
            c_all[t, b, j] = cv
            y[t, b, j] = o * math.tanh(cv)
            hs[idx] = y[t, b, j]
        cuda.syncthreads()
    last = 0 if reverse else T - 1
    for idx in range(cuda.threadIdx.x, valid * H, cuda.blockDim.x):
        b, j = b0 + idx // H, idx % H
        h[b, j] = hs[idx]
        c[b, j] = c_all[last, b, j]


@cuda.jit
def _lstm_seq_bwd(dy, dh_T, dc_T, c0, gates, c_all, w, reverse, rows, w_on_chip,
                  state_on_chip, work, keep, hidden, dgates, dh, dc):
    T, B, H = c_all.shape
    one = c_all.dtype.type(1)
    G = 4 * H
    b0, valid = _tile(rows, B)
    n = rows * H
    size = 2 * n + rows * G
    state = (cuda.shared.array(0, c_all.dtype)[:size] if state_on_chip
             else work[cuda.blockIdx.x * size:(cuda.blockIdx.x + 1) * size])
    g_next, dcs, d = state[:n], state[n:2 * n], state[2 * n:]  # dL/dh, dL/dc from t+1; dA_t
    start = c_all.itemsize * size // w.itemsize if state_on_chip else 0
    wv = cuda.shared.array(0, w.dtype)[start:start + w.size] if w_on_chip else w
    if w_on_chip:
        _copy(w, wv)
    for idx in range(cuda.threadIdx.x, valid * H, cuda.blockDim.x):
        b, j = b0 + idx // H, idx % H
        g_next[idx] = dh_T[b, j]
        dcs[idx] = dc_T[b, j]
    cuda.syncthreads()
    for s in range(T):
        t = s if reverse else T - 1 - s
        tp = t + 1 if reverse else t - 1
        for idx in range(cuda.threadIdx.x, valid * H, cuda.blockDim.x):
            r = idx // H
            b, j, p = b0 + r, idx - r * H, r * G
            i = gates[t, b, j]
            f = gates[t, b, H + j]
            g = gates[t, b, 2 * H + j]
            o = gates[t, b, 3 * H + j]
            tc = math.tanh(c_all[t, b, j])
            gh = dy[t, b, j] + g_next[idx]
            if keep:
                hidden[t, b, j] = gh
            cp = c0[b, j] if s == T - 1 else c_all[tp, b, j]
            dcv = dcs[idx] + gh * o * (one - tc * tc)
            di = dcv * g * i * (one - i)
            df = dcv * cp * f * (one - f)
            dg = dcv * i * (one - g * g)
            do = gh * tc * o * (one - o)
            dgates[t, b, j] = di
            dgates[t, b, H + j] = df
            dgates[t, b, 2 * H + j] = dg
            dgates[t, b, 3 * H + j] = do
            d[p + j] = di
            d[p + H + j] = df
            d[p + 2 * H + j] = dg
            d[p + 3 * H + j] = do
            dcs[idx] = dcv * f
        cuda.syncthreads()
        _product(d, G, wv, H, g_next, valid, False)
        cuda.syncthreads()
    for idx in range(cuda.threadIdx.x, valid * H, cuda.blockDim.x):
        b, j = b0 + idx // H, idx % H
        dh[b, j] = g_next[idx]
        dc[b, j] = dcs[idx]


# ---- GRU -----------------------------------------------------------------------------------

@cuda.jit
def _gru_seq_fwd(x_proj, h0, w, b_hh, reverse, rows, w_on_chip, state_on_chip, work, y, hn, h):
    T, B, H = y.shape
    one = y.dtype.type(1)
    G = 3 * H
    b0, valid = _tile(rows, B)
    n = rows * H
    size = n + rows * G
    state = (cuda.shared.array(0, y.dtype)[:size] if state_on_chip
             else work[cuda.blockIdx.x * size:(cuda.blockIdx.x + 1) * size])
    hs, pre = state[:n], state[n:]
    start = y.itemsize * size // w.itemsize if state_on_chip else 0
    wv = cuda.shared.array(0, w.dtype)[start:start + w.size] if w_on_chip else w
    if w_on_chip:
        _copy(w, wv)
    for idx in range(cuda.threadIdx.x, valid * H, cuda.blockDim.x):
        hs[idx] = h0[b0 + idx // H, idx % H]
    cuda.syncthreads()
    for s in range(T):
        t = T - 1 - s if reverse else s
        _product(hs, H, wv, G, pre, valid, False)
        cuda.syncthreads()
        for idx in range(cuda.threadIdx.x, valid * H, cuda.blockDim.x):
            r = idx // H
            b, j, p = b0 + r, idx - r * H, r * G
            rv = _sigmoid(x_proj[t, b, j] + pre[p + j] + b_hh[j], one)
            z = _sigmoid(x_proj[t, b, H + j] + pre[p + H + j] + b_hh[H + j], one)
            hnv = pre[p + 2 * H + j] + b_hh[2 * H + j]
            nv = math.tanh(x_proj[t, b, 2 * H + j] + rv * hnv)
            x_proj[t, b, j] = rv
            x_proj[t, b, H + j] = z
            x_proj[t, b, 2 * H + j] = nv
            hn[t, b, j] = hnv
            y[t, b, j] = (one - z) * nv + z * hs[idx]
            hs[idx] = y[t, b, j]
        cuda.syncthreads()
    for idx in range(cuda.threadIdx.x, valid * H, cuda.blockDim.x):
        h[b0 + idx // H, idx % H] = hs[idx]


@cuda.jit
def _gru_seq_bwd(dy, dh_T, h0, y, gates, hn, w, reverse, rows, w_on_chip, state_on_chip, work,
                 keep, hidden, dgx, dgh, dh):
    T, B, H = y.shape
    one = y.dtype.type(1)
    G = 3 * H
    b0, valid = _tile(rows, B)
    n = rows * H
    size = n + rows * G
    state = (cuda.shared.array(0, y.dtype)[:size] if state_on_chip
             else work[cuda.blockIdx.x * size:(cuda.blockIdx.x + 1) * size])
    g_next, d = state[:n], state[n:]  # dL/dh from step t+1; the hidden part of dA_t
    start = y.itemsize * size // w.itemsize if state_on_chip else 0
    wv = cuda.shared.array(0, w.dtype)[start:start + w.size] if w_on_chip else w
    if w_on_chip:
        _copy(w, wv)
    for idx in range(cuda.threadIdx.x, valid * H, cuda.blockDim.x):
        g_next[idx] = dh_T[b0 + idx // H, idx % H]
    cuda.syncthreads()
    for s in range(T):
        t = s if reverse else T - 1 - s
        tp = t + 1 if reverse else t - 1
        for idx in range(cuda.threadIdx.x, valid * H, cuda.blockDim.x):
            r = idx // H
            b, j, p = b0 + r, idx - r * H, r * G
            rv = gates[t, b, j]
            z = gates[t, b, H + j]
            nv = gates[t, b, 2 * H + j]
            g = dy[t, b, j] + g_next[idx]
            if keep:
                hidden[t, b, j] = g
            hp = h0[b, j] if s == T - 1 else y[tp, b, j]
            dan = g * (one - z) * (one - nv * nv)
            dar = dan * hn[t, b, j] * rv * (one - rv)
            daz = g * (hp - nv) * z * (one - z)
            dgx[t, b, j] = dar
            dgx[t, b, H + j] = daz
            dgx[t, b, 2 * H + j] = dan
            dgh[t, b, j] = dar
            dgh[t, b, H + j] = daz
            dgh[t, b, 2 * H + j] = dan * rv
            d[p + j] = dar
            d[p + H + j] = daz
            d[p + 2 * H + j] = dan * rv
            g_next[idx] = g * z  # the direct part; the product adds dA^h_t W_hh
        cuda.syncthreads()
        _product(d, G, wv, H, g_next, valid, True)
        cuda.syncthreads()
    for idx in range(cuda.threadIdx.x, valid * H, cuda.blockDim.x):
        dh[b0 + idx // H, idx % H] = g_next[idx]


# ---- launchers -----------------------------------------------------------------------------

def _flat(w):
    """w as a flat C-contiguous array (a copy only when w is a transposed view)."""
    return array_module(w).ascontiguousarray(w).reshape(-1)


def _plan(B, state_per_row, w, items_per_row):
    """(blocks, threads per block, dynamic shared bytes, (rows, w_on_chip, state_on_chip,
    work)) for a tile state of ``state_per_row`` values per batch row, in the dtype of the flat
    weights w (the storage dtype)."""
    per_row = w.itemsize * state_per_row
    rows = max(1, min(-(-B // max_blocks), shared_limit // per_row))
    blocks = -(-B // rows)
    state_on_chip = rows * per_row <= shared_limit
    state_bytes = rows * per_row if state_on_chip else 0
    w_bytes = w.size * w.itemsize
    w_on_chip = state_bytes + w_bytes <= shared_limit
    shared = state_bytes + (w_bytes if w_on_chip else 0)
    work = device_empty(w, (1 if state_on_chip else blocks * rows * state_per_row,), w.dtype)
    nt = min(threads, 32 * -(-rows * items_per_row // 32))
    return blocks, nt, shared, (rows, w_on_chip, state_on_chip, work)


def _run(kernel, B, state_per_row, w, items_per_row, head, tail):
    blocks, nt, shared, config = _plan(B, state_per_row, w, items_per_row)
    launch(kernel, blocks, nt, *head, *config, *tail, shared=shared)


def _hidden(hidden_grads):
    """(keep, hidden_grads): keep False when it is empty."""
    return hidden_grads.size > 0, hidden_grads


def rnn_forward_gpu(x_proj, h0, w_hh_t, relu, reverse, y, h):
    """y[t] = phi(x_proj[t] + h_{t-1} @ w_hh_t), h = the last state."""
    B, H = h0.shape
    w = _flat(w_hh_t)
    _run(_rnn_seq_fwd, B, 2 * H, w, H, (x_proj, h0, w, bool(relu), bool(reverse)), (y, h))


def rnn_backward_gpu(dy, dh_T, y, w_hh, relu, reverse, da, dh, hidden_grads):
    """BPTT: da (T, B, H) = dL/d(pre-activations); dh = dL/dh0."""
    _, B, H = y.shape
    w = _flat(w_hh)
    _run(_rnn_seq_bwd, B, 2 * H, w, H, (dy, dh_T, y, w, bool(relu), bool(reverse)),
         (*_hidden(hidden_grads), da, dh))


def lstm_forward_gpu(x_proj, h0, c0, w_hh_t, reverse, y, c_all, h, c):
    """x_proj (T, B, 4H) becomes the gates in place; y, c_all (T, B, H); h, c the last
    states."""
    B, H = h0.shape
    w = _flat(w_hh_t)
    _run(_lstm_seq_fwd, B, 5 * H, w, 4 * H, (x_proj, h0, c0, w, bool(reverse)),
         (y, c_all, h, c))


def lstm_backward_gpu(dy, dh_T, dc_T, c0, gates, c_all, w_hh, reverse, dgates, dh, dc,
                      hidden_grads):
    """BPTT: dgates (T, B, 4H); dh, dc = dL/dh0, dL/dc0."""
    _, B, H = c_all.shape
    w = _flat(w_hh)
    _run(_lstm_seq_bwd, B, 6 * H, w, H, (dy, dh_T, dc_T, c0, gates, c_all, w, bool(reverse)),
         (*_hidden(hidden_grads), dgates, dh, dc))


def gru_forward_gpu(x_proj, h0, w_hh_t, b_hh, reverse, y, hn, h):
    """x_proj (T, B, 3H) = x W_ih^T + b_ih becomes r, z, n in place; hn (T, B, H) =
    h_{t-1} W_hn^T + b_hn; h the last state."""
    B, H = h0.shape
    w = _flat(w_hh_t)
    _run(_gru_seq_fwd, B, 4 * H, w, 3 * H, (x_proj, h0, w, b_hh, bool(reverse)), (y, hn, h))


def gru_backward_gpu(dy, dh_T, h0, y, gates, hn, w_hh, reverse, dgx, dgh, dh, hidden_grads):
    """BPTT: dgx, dgh (T, B, 3H) the gradients of x W_ih^T + b_ih and h W_hh^T + b_hh;
    dh = dL/dh0."""
    _, B, H = y.shape
    w = _flat(w_hh)
    _run(_gru_seq_bwd, B, 4 * H, w, H, (dy, dh_T, h0, y, gates, hn, w, bool(reverse)),
         (*_hidden(hidden_grads), dgx, dgh, dh))


# ---- the launchers of ``nnkit.kernels.recurrent`` (``recurrent_cpu`` has the same) -------
# One layer-direction through time each, as ``recurrent_cpu``'s: the forwards allocate
# their outputs and what the backward reads; the backwards take the forward's cache and
# return every gradient, dx None without ``need_dx``, the parameter gradients None without
# ``need_weights`` (the biases' also without biases).

def _projected(x, w_ih, bias, out):
    """out (T, B, G H) = x W_ih^T + bias: the input projection of every step as one GEMM
    (cuBLAS) before the time loop. (The CPU kernels project step by step on their
    threads.)"""
    T, B, D = x.shape
    flat = out.reshape(T * B, -1)
    array_module(x).matmul(x.reshape(T * B, D), w_ih.T, out=flat)
    flat += bias
    return out


def rnn_forward_layer(x, w_ih, w_hh, bias, h0, relu, reverse):
    """(y (T, B, H), h_T (B, H)) of the Elman layer: x (T, B, D); w_ih (H, D); w_hh (H, H);
    bias (H,) = b_ih + b_hh; h0 (B, H)."""
    xp = array_module(x)
    T, B, _ = x.shape
    y = xp.empty((T, B, w_hh.shape[0]), dtype=x.dtype)
    h = xp.empty_like(h0)
    x_proj = _projected(x, w_ih, bias, xp.empty_like(y))
    rnn_forward_gpu(x_proj, h0, w_hh.T, relu, reverse, y, h)
    return y, h


def lstm_forward_layer(x, w_ih, w_hh, bias, h0, c0, reverse, keep):
    """(y (T, B, H), h_T, c_T (B, H), gates (T, B, 4H), c (T, B, H)) of the LSTM layer:
    bias (4H,) = b_ih + b_hh. ``keep`` changes nothing here: the projection of every step
    is the gates buffer."""
    xp = array_module(x)
    T, B, _ = x.shape
    H = h0.shape[1]
    gates = _projected(x, w_ih, bias, xp.empty((T, B, 4 * H), dtype=x.dtype))
    y, c_all = xp.empty((T, B, H), dtype=x.dtype), xp.empty((T, B, H), dtype=x.dtype)
    h, c = xp.empty_like(h0), xp.empty_like(h0)
    lstm_forward_gpu(gates, h0, c0, w_hh.T, reverse, y, c_all, h, c)
    return y, h, c, gates, c_all


def gru_forward_layer(x, w_ih, w_hh, b_ih, b_hh, h0, reverse, keep):
    """(y (T, B, H), h_T (B, H), gates (T, B, 3H), hn (T, B, H)) of the GRU layer: b_ih,
    b_hh (3H,). ``keep`` changes nothing here (as ``lstm_forward_layer``'s)."""
    xp = array_module(x)
    T, B, _ = x.shape
    H = h0.shape[1]
    gates = _projected(x, w_ih, b_ih, xp.empty((T, B, 3 * H), dtype=x.dtype))
    y, hn = xp.empty((T, B, H), dtype=x.dtype), xp.empty((T, B, H), dtype=x.dtype)
    h = xp.empty_like(h0)
    gru_forward_gpu(gates, h0, w_hh.T, b_hh, reverse, y, hn, h)
    return y, h, gates, hn


def rnn_backward_layer(cache, dy, dh_T, hidden_grads, need_dx, need_weights):
    """(dx, dh0, dW_ih, dW_hh, db_ih, db_hh) of the Elman layer by BPTT; dy (T, B, H),
    dh_T (B, H); hidden_grads (T, B, H) receives dL/dh_t unless empty."""
    y = cache.saved["y"]
    xp = array_module(y)
    dh, da = xp.empty_like(cache.h0), xp.empty_like(y)
    rnn_backward_gpu(dy, dh_T, y, cache.weight_hh, cache.nonlinearity == "relu",
                     cache.reverse, da, dh, hidden_grads)
    dx, *weights = _input_and_weight_grads(cache, da, da, need_dx, need_weights)
    return dx, dh, *weights


def lstm_backward_layer(cache, dy, dh_T, dc_T, hidden_grads, need_dx, need_weights):
    """(dx, dh0, dc0, dW_ih, dW_hh, db_ih, db_hh) of the LSTM layer by BPTT."""
    gates = cache.saved["gates"]
    xp = array_module(gates)
    dh, dc, dgates = xp.empty_like(cache.h0), xp.empty_like(cache.h0), xp.empty_like(gates)
    lstm_backward_gpu(dy, dh_T, dc_T, cache.c0, gates, cache.saved["c"], cache.weight_hh,
                      cache.reverse, dgates, dh, dc, hidden_grads)
    dx, *weights = _input_and_weight_grads(cache, dgates, dgates, need_dx, need_weights)
    return dx, dh, dc, *weights


def gru_backward_layer(cache, dy, dh_T, hidden_grads, need_dx, need_weights):
    """(dx, dh0, dW_ih, dW_hh, db_ih, db_hh) of the GRU layer by BPTT."""
    gates = cache.saved["gates"]
    xp = array_module(gates)
    dh, dgx, dgh = xp.empty_like(cache.h0), xp.empty_like(gates), xp.empty_like(gates)
    gru_backward_gpu(dy, dh_T, cache.h0, cache.saved["y"], gates, cache.saved["hn"],
                     cache.weight_hh, cache.reverse, dgx, dgh, dh, hidden_grads)
    dx, *weights = _input_and_weight_grads(cache, dgx, dgh, need_dx, need_weights)
    return dx, dh, *weights


def _input_and_weight_grads(cache, dgx, dgh, need_dx, need_weights):
    """(dx, dW_ih, dW_hh, db_ih, db_hh) from the pre-activation gradients of all steps
    (T, B, G H), x-side dgx and hidden-side dgh: one cuBLAS GEMM each, skipped where not
    needed (None)."""
    x, y, h0 = cache.x, cache.saved["y"], cache.h0
    T, B, D = x.shape
    GH, H = cache.weight_hh.shape
    dgx2 = dgx.reshape(T * B, GH)  # (T*B, G*H)
    dx = (dgx2 @ cache.weight_ih).reshape(T, B, D) if need_dx else None
    if not need_weights:
        return dx, None, None, None, None
    # the step at t reads h_{t-1} = y[t-1] (y[t+1] in reverse), and h0 at the first step
    first, later, prev = (T - 1, slice(0, T - 1), slice(1, T)) if cache.reverse else (
        0, slice(1, T), slice(0, T - 1))
    dw_ih = dgx2.T @ x.reshape(T * B, D)
    dw_hh = dgh[first].T @ h0
    if T > 1:
        dw_hh += dgh[later].reshape(-1, GH).T @ y[prev].reshape(-1, H)
    if not cache.has_bias:
        return dx, dw_ih, dw_hh, None, None
    db_ih = dgx2.sum(axis=0)
    db_hh = db_ih.copy() if dgh is dgx else dgh.reshape(T * B, GH).sum(axis=0)
    return dx, dw_ih, dw_hh, db_ih, db_hh
