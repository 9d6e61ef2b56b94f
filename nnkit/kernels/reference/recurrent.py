"""Naive twins of the recurrent kernels: plain per-step loops straight from the formulas.

Everything runs in float64 (results cast back to x's dtype), one time step at a time, with
no fusion and no caching tricks: the forward twins recompute every gate from the weights,
the backward twins apply the chain rule step by step (BPTT) with the gates recomputed from
the forward pass. ``nnkit.kernels.recurrent`` must agree with them.

``<cell>_forward``/``<cell>_backward`` have the signatures of ``nnkit.kernels.recurrent``'s
pair (``((y, h_T[, c_T]), cache)``; ``(douts, cache, needs=None, hidden_grads=None)`` ->
one gradient per input, None where ``needs`` says so or the bias is absent); the cache is
the forward's arguments. ``rnn``, ``lstm`` and ``gru`` give the outputs alone.

Shapes: x (T, B, D), h0/c0 (B, H), weight_ih (G*H, D), weight_hh (G*H, H), biases (G*H,)
or None, with G = 1 (RNN), 4 (LSTM, gates i, f, g, o), 3 (GRU, gates r, z, n).
``reverse=True`` runs t = T-1, ..., 0.
"""

from __future__ import annotations

import numpy as np

from ..._types import Array, Needs

__all__ = ["rnn", "rnn_forward", "rnn_backward", "lstm", "lstm_forward", "lstm_backward",
           "gru", "gru_forward", "gru_backward"]


def _sigmoid(a):
    return 1.0 / (1.0 + np.exp(-a))


def _f64(*arrays):
    return [None if a is None else np.asarray(a, dtype=np.float64) for a in arrays]


def _bias(b, n):
    return np.zeros(n) if b is None else b


def _order(T, reverse):
    return range(T - 1, -1, -1) if reverse else range(T)


def _state(s, x, weight_hh):
    """s, or zeros (B, H) in x's dtype for None."""
    if s is not None:
        return s
    return np.zeros((np.shape(x)[1], np.shape(weight_hh)[1]), dtype=np.asarray(x).dtype)


def _upstream(douts, like):
    """The output gradients in float64, zeros for None; ``like``: the outputs' shapes."""
    return [np.zeros(shape) if d is None else np.asarray(d, dtype=np.float64)
            for d, shape in zip(douts, like, strict=True)]


def _finish(grads, dtype, has_bias, needs, hidden, gs):
    """The gradients cast to ``dtype``, the bias ones None without biases, None where
    ``needs`` says so; ``hidden`` (if given) receives the per-step dL/dh_t ``gs``."""
    if hidden is not None:
        hidden[...] = gs
    grads = list(_cast(dtype, *grads))
    if not has_bias:
        grads[-2:] = [None, None]
    needs = (True,) * len(grads) if needs is None else needs
    return tuple(g if n else None for g, n in zip(grads, needs, strict=True))


def _rnn_steps(x, h0, w_ih, w_hh, b_ih, b_hh, nonlinearity, reverse):
    """Pre-activations a[t] and states h[t] (T, B, H), float64."""
    T = x.shape[0]
    H = w_hh.shape[0]
    b_ih, b_hh = _bias(b_ih, H), _bias(b_hh, H)
    a = np.zeros((T,) + h0.shape)
    hs = np.zeros((T,) + h0.shape)
    h = h0
    for t in _order(T, reverse):
        a[t] = x[t] @ w_ih.T + b_ih + h @ w_hh.T + b_hh
        h = np.tanh(a[t]) if nonlinearity == "tanh" else np.maximum(a[t], 0.0)
        hs[t] = h
    return a, hs


def rnn(x: Array, h0: Array | None, weight_ih: Array, weight_hh: Array,
        bias_ih: Array | None = None, bias_hh: Array | None = None,
        nonlinearity: str = "tanh", reverse: bool = False) -> tuple[Array, Array]:
    """h_t = phi(W_ih x_t + b_ih + W_hh h_{t-1} + b_hh) -> (y (T, B, H), h_T (B, H)); h0
    None: zeros."""
    dtype = np.asarray(x).dtype
    h0 = _state(h0, x, weight_hh)
    x, h0, w_ih, w_hh, b_ih, b_hh = _f64(x, h0, weight_ih, weight_hh, bias_ih, bias_hh)
    _, hs = _rnn_steps(x, h0, w_ih, w_hh, b_ih, b_hh, nonlinearity, reverse)
    last = hs[0] if reverse else hs[-1]
    return hs.astype(dtype), last.astype(dtype)


def rnn_forward(x: Array, h0: Array | None, weight_ih: Array, weight_hh: Array,
                bias_ih: Array | None = None, bias_hh: Array | None = None,
                nonlinearity: str = "tanh", reverse: bool = False, keep_cache: bool = True
                ) -> tuple[tuple[Array, Array], tuple | None]:
    """((y, h_T), cache): ``rnn``, and the arguments as the cache (None without
    ``keep_cache``)."""
    h0 = _state(h0, x, weight_hh)
    out = rnn(x, h0, weight_ih, weight_hh, bias_ih, bias_hh, nonlinearity, reverse)
    args = (x, h0, weight_ih, weight_hh, bias_ih, bias_hh, nonlinearity, reverse)
    return out, (args if keep_cache else None)


def _param_grads(dx_gates, dh_gates, x, h_prev, w_ih, w_hh):
    """Accumulate dW_ih, dW_hh, db_ih, db_hh, dx from per-step pre-activation gradients."""
    T = x.shape[0]
    dx = np.zeros_like(x)
    dw_ih, dw_hh = np.zeros_like(w_ih), np.zeros_like(w_hh)
    db_ih, db_hh = np.zeros(w_ih.shape[0]), np.zeros(w_hh.shape[0])
    for t in range(T):
        dx[t] = dx_gates[t] @ w_ih
        dw_ih += dx_gates[t].T @ x[t]
        dw_hh += dh_gates[t].T @ h_prev[t]
        db_ih += dx_gates[t].sum(axis=0)
        db_hh += dh_gates[t].sum(axis=0)
    return dx, dw_ih, dw_hh, db_ih, db_hh


def _prev_states(hs, h0, reverse):
    """h_prev[t]: the state the step at t reads (h0 for the first step visited)."""
    prev = np.zeros_like(hs)
    T = hs.shape[0]
    for t in range(T):
        if reverse:
            prev[t] = h0 if t == T - 1 else hs[t + 1]
        else:
            prev[t] = h0 if t == 0 else hs[t - 1]
    return prev


def _cast(dtype, *arrays):
    return tuple(a.astype(dtype) for a in arrays)


def rnn_backward(douts: tuple, cache: tuple, needs: Needs = None,
                 hidden_grads: Array | None = None) -> tuple[Array | None, ...]:
    """Gradients of ``rnn_forward`` for douts = (dy (T, B, H), dh_T (B, H)), None for zeros:
    (dx, dh0, dweight_ih, dweight_hh, dbias_ih, dbias_hh); ``hidden_grads`` (T, B, H), if
    given, receives the total dL/dh_t of every step."""
    x, h0, weight_ih, weight_hh, bias_ih, bias_hh, nonlinearity, reverse = cache
    dtype = np.asarray(x).dtype
    x, h0, w_ih, w_hh, b_ih, b_hh = _f64(x, h0, weight_ih, weight_hh, bias_ih, bias_hh)
    a, hs = _rnn_steps(x, h0, w_ih, w_hh, b_ih, b_hh, nonlinearity, reverse)
    dy, dh_T = _upstream(douts, (hs.shape, h0.shape))
    da, gs = np.zeros_like(a), np.zeros_like(a)
    dh = dh_T
    for t in reversed(list(_order(x.shape[0], reverse))):
        g = gs[t] = dh + dy[t]
        dphi = 1.0 - np.tanh(a[t]) ** 2 if nonlinearity == "tanh" else (a[t] > 0) * 1.0
        da[t] = g * dphi
        dh = da[t] @ w_hh
    dx, dw_ih, dw_hh, db_ih, db_hh = _param_grads(da, da, x, _prev_states(hs, h0, reverse),
                                                  w_ih, w_hh)
    return _finish((dx, dh, dw_ih, dw_hh, db_ih, db_hh), dtype, bias_ih is not None, needs,
                   hidden_grads, gs)


def _lstm_steps(x, h0, c0, w_ih, w_hh, b_ih, b_hh, reverse):
    T = x.shape[0]
    H = w_hh.shape[1]
    b_ih, b_hh = _bias(b_ih, 4 * H), _bias(b_hh, 4 * H)
    gates = np.zeros((T, h0.shape[0], 4 * H))
    hs, cs = np.zeros((T,) + h0.shape), np.zeros((T,) + h0.shape)
    h, c = h0, c0
    for t in _order(T, reverse):
        pre = x[t] @ w_ih.T + b_ih + h @ w_hh.T + b_hh
        i = _sigmoid(pre[:, :H])
        f = _sigmoid(pre[:, H:2 * H])
        g = np.tanh(pre[:, 2 * H:3 * H])
        o = _sigmoid(pre[:, 3 * H:])
        c = f * c + i * g
        h = o * np.tanh(c)
        gates[t] = np.concatenate([i, f, g, o], axis=1)
        hs[t], cs[t] = h, c
    return gates, hs, cs


def lstm(x: Array, h0: Array | None, c0: Array | None, weight_ih: Array, weight_hh: Array,
         bias_ih: Array | None = None, bias_hh: Array | None = None, reverse: bool = False
         ) -> tuple[Array, Array, Array]:
    """LSTM (i, f, g, o): c_t = f c_{t-1} + i g, h_t = o tanh(c_t) -> (y, h_T, c_T); h0, c0
    None: zeros."""
    dtype = np.asarray(x).dtype
    h0, c0 = _state(h0, x, weight_hh), _state(c0, x, weight_hh)
    args = _f64(x, h0, c0, weight_ih, weight_hh, bias_ih, bias_hh)
    _, hs, cs = _lstm_steps(*args, reverse)
    k = 0 if reverse else -1
    return hs.astype(dtype), hs[k].astype(dtype), cs[k].astype(dtype)


def lstm_forward(x: Array, h0: Array | None, c0: Array | None, weight_ih: Array,
                 weight_hh: Array, bias_ih: Array | None = None, bias_hh: Array | None = None,
                 reverse: bool = False, keep_cache: bool = True
                 ) -> tuple[tuple[Array, Array, Array], tuple | None]:
    """((y, h_T, c_T), cache): ``lstm``, and the arguments as the cache."""
    h0, c0 = _state(h0, x, weight_hh), _state(c0, x, weight_hh)
    out = lstm(x, h0, c0, weight_ih, weight_hh, bias_ih, bias_hh, reverse)
    args = (x, h0, c0, weight_ih, weight_hh, bias_ih, bias_hh, reverse)
    return out, (args if keep_cache else None)


def lstm_backward(douts: tuple, cache: tuple, needs: Needs = None,
                  hidden_grads: Array | None = None) -> tuple[Array | None, ...]:
    """Gradients of ``lstm_forward`` for douts = (dy, dh_T, dc_T), None for zeros:
    (dx, dh0, dc0, dweight_ih, dweight_hh, dbias_ih, dbias_hh); ``hidden_grads`` as in
    ``rnn_backward``."""
    x, h0, c0, weight_ih, weight_hh, bias_ih, bias_hh, reverse = cache
    dtype = np.asarray(x).dtype
    x, h0, c0, w_ih, w_hh, b_ih, b_hh = _f64(x, h0, c0, weight_ih, weight_hh, bias_ih, bias_hh)
    gates, hs, cs = _lstm_steps(x, h0, c0, w_ih, w_hh, b_ih, b_hh, reverse)
    dy, dh_T, dc_T = _upstream(douts, (hs.shape, h0.shape, h0.shape))
    H = h0.shape[1]
    c_prev = _prev_states(cs, c0, reverse)
    dgates, gs = np.zeros_like(gates), np.zeros_like(hs)
    dh, dc = dh_T, dc_T
    for t in reversed(list(_order(x.shape[0], reverse))):
        i, f = gates[t, :, :H], gates[t, :, H:2 * H]
        g, o = gates[t, :, 2 * H:3 * H], gates[t, :, 3 * H:]
        gh = gs[t] = dh + dy[t]
        tc = np.tanh(cs[t])
        dc = dc + gh * o * (1 - tc**2)
        dgates[t] = np.concatenate([dc * g * i * (1 - i), dc * c_prev[t] * f * (1 - f),
                                    dc * i * (1 - g**2), gh * tc * o * (1 - o)], axis=1)
        dc = dc * f
        dh = dgates[t] @ w_hh
    dx, dw_ih, dw_hh, db_ih, db_hh = _param_grads(dgates, dgates, x,
                                                  _prev_states(hs, h0, reverse), w_ih, w_hh)
    return _finish((dx, dh, dc, dw_ih, dw_hh, db_ih, db_hh), dtype, bias_ih is not None, needs,
                   hidden_grads, gs)


def _gru_steps(x, h0, w_ih, w_hh, b_ih, b_hh, reverse):
    T = x.shape[0]
    H = w_hh.shape[1]
    b_ih, b_hh = _bias(b_ih, 3 * H), _bias(b_hh, 3 * H)
    gates, hn = np.zeros((T, h0.shape[0], 3 * H)), np.zeros((T,) + h0.shape)
    hs = np.zeros((T,) + h0.shape)
    h = h0
    for t in _order(T, reverse):
        gx = x[t] @ w_ih.T + b_ih
        gh = h @ w_hh.T + b_hh
        r = _sigmoid(gx[:, :H] + gh[:, :H])
        z = _sigmoid(gx[:, H:2 * H] + gh[:, H:2 * H])
        n = np.tanh(gx[:, 2 * H:] + r * gh[:, 2 * H:])
        h = (1 - z) * n + z * h
        gates[t] = np.concatenate([r, z, n], axis=1)
        hn[t], hs[t] = gh[:, 2 * H:], h
    return gates, hn, hs


def gru(x: Array, h0: Array | None, weight_ih: Array, weight_hh: Array,
        bias_ih: Array | None = None, bias_hh: Array | None = None, reverse: bool = False
        ) -> tuple[Array, Array]:
    """GRU (r, z, n): n = tanh(W_in x + b_in + r (W_hn h + b_hn)), h = (1 - z) n + z h
    -> (y, h_T); h0 None: zeros."""
    dtype = np.asarray(x).dtype
    h0 = _state(h0, x, weight_hh)
    _, _, hs = _gru_steps(*_f64(x, h0, weight_ih, weight_hh, bias_ih, bias_hh), reverse)
    return hs.astype(dtype), hs[0 if reverse else -1].astype(dtype)


def gru_forward(x: Array, h0: Array | None, weight_ih: Array, weight_hh: Array,
                bias_ih: Array | None = None, bias_hh: Array | None = None,
                reverse: bool = False, keep_cache: bool = True
                ) -> tuple[tuple[Array, Array], tuple | None]:
    """((y, h_T), cache): ``gru``, and the arguments as the cache."""
    h0 = _state(h0, x, weight_hh)
    out = gru(x, h0, weight_ih, weight_hh, bias_ih, bias_hh, reverse)
    args = (x, h0, weight_ih, weight_hh, bias_ih, bias_hh, reverse)
    return out, (args if keep_cache else None)


def gru_backward(douts: tuple, cache: tuple, needs: Needs = None,
                  hidden_grads: Array | None = None) -> tuple[Array | None, ...]:
    """Gradients of ``gru_forward`` for douts = (dy, dh_T), None for zeros:
    (dx, dh0, dweight_ih, dweight_hh, dbias_ih, dbias_hh); ``hidden_grads`` as in
    ``rnn_backward``."""
    x, h0, weight_ih, weight_hh, bias_ih, bias_hh, reverse = cache
    dtype = np.asarray(x).dtype
    x, h0, w_ih, w_hh, b_ih, b_hh = _f64(x, h0, weight_ih, weight_hh, bias_ih, bias_hh)
    gates, hn, hs = _gru_steps(x, h0, w_ih, w_hh, b_ih, b_hh, reverse)
    dy, dh_T = _upstream(douts, (hs.shape, h0.shape))
    H = h0.shape[1]
    h_prev = _prev_states(hs, h0, reverse)
    dgx, dgh, gs = np.zeros_like(gates), np.zeros_like(gates), np.zeros_like(hs)
    dh = dh_T
    for t in reversed(list(_order(x.shape[0], reverse))):
        r, z, n = gates[t, :, :H], gates[t, :, H:2 * H], gates[t, :, 2 * H:]
        g = gs[t] = dh + dy[t]
        dan = g * (1 - z) * (1 - n**2)
        dar = dan * hn[t] * r * (1 - r)
        daz = g * (h_prev[t] - n) * z * (1 - z)
        dgx[t] = np.concatenate([dar, daz, dan], axis=1)
        dgh[t] = np.concatenate([dar, daz, dan * r], axis=1)
        dh = g * z + dgh[t] @ w_hh
    dx, dw_ih, dw_hh, db_ih, db_hh = _param_grads(dgx, dgh, x, h_prev, w_ih, w_hh)
    return _finish((dx, dh, dw_ih, dw_hh, db_ih, db_hh), dtype, bias_ih is not None, needs,
                   hidden_grads, gs)
