"""Naive twin of the linear-attention recurrence family, one step at a time, in float64.

Per (batch, head) the state S (dk, dv) (keys index rows) starts from S0 (zeros when absent)
and for t = 0 .. T-1:

    S = exp(g_t) * S                 g_t a scalar log-decay, or exp(g_t)[:, None] * S with
                                     g_t (dk,) a per-key log-decay; no decay without g
    if delta:  S = S + beta_t * outer(k_t, v_t - S^T k_t)     (the delta rule)
    else:      S = S + beta_t * outer(k_t, v_t)
    o_t = scale * S^T q_t                                      (dv,)

the final state being S after step T-1. Causal linear attention (no g, no beta), gated
linear attention / Mamba-2's SSD (g), DeltaNet (delta, beta) and the gated delta rule
(delta, beta, g) are cases of it. ``linear_attention_steps_backward`` is the reverse-mode
derivative of the same loop, written out by hand. Results are cast back to q's dtype.
Layout (batch, heads, T, dim); nothing here is meant to be fast. ``<op>_forward`` /
``<op>_backward`` are the twins of ``F.linear_attention``, ``F.gated_linear_attention``,
``F.delta_rule`` and ``F.gated_delta_rule`` (scale None: 1 / sqrt(dk)), in the kernels'
convention: the forward returns (o, cache), the backward takes dL/do.
"""

from __future__ import annotations

import numpy as np

from ..._types import Array

__all__ = ["linear_attention_steps", "linear_attention_steps_backward",
           "linear_attention_forward", "linear_attention_backward",
           "gated_linear_attention_forward", "gated_linear_attention_backward",
           "delta_rule_forward", "delta_rule_backward",
           "gated_delta_rule_forward", "gated_delta_rule_backward"]


def _wide(x):
    return None if x is None else np.asarray(x, np.float64)


def _decay(g, b, h, t, dk):
    """exp(g_t) as a (dk, 1) column multiplying S's rows (ones without g)."""
    if g is None:
        return np.ones((dk, 1))
    if g.ndim == 3:  # (B, H, T): one scalar log-decay a step
        return np.full((dk, 1), np.exp(g[b, h, t]))
    return np.exp(g[b, h, t])[:, None]  # (B, H, T, dk): one log-decay a key


def _steps(q, k, v, beta, g, initial_state, delta, b, h):
    """The states of row (b, h): ``before[t]`` S' (after step t's decay, before its update),
    ``after[t]`` S_t (after step t), and r[t] (v_t - S'^T k_t with ``delta``, else v_t)."""
    T, dk = k.shape[2], k.shape[3]
    dv = v.shape[3]
    S = np.zeros((dk, dv)) if initial_state is None else initial_state[b, h].copy()
    before, after, rs = [], [], []
    for t in range(T):
        S = _decay(g, b, h, t, dk) * S
        before.append(S)
        kt, vt = k[b, h, t], v[b, h, t]
        r = vt - S.T @ kt if delta else vt
        bt = 1.0 if beta is None else beta[b, h, t]
        S = S + bt * np.outer(kt, r)
        after.append(S)
        rs.append(r)
    return before, after, rs, S


def linear_attention_steps(q: Array, k: Array, v: Array, beta: Array | None = None,
                           g: Array | None = None, scale: float = 1.0,
                           initial_state: Array | None = None,
                           delta: bool = False) -> tuple[Array, Array]:
    """The recurrence of the module docstring, step by step.

    Parameters
    ----------
    q, k : Array
        (B, H, T, dk) queries and keys.
    v : Array
        (B, H, T, dv) values.
    beta : Array or None
        (B, H, T) write strengths; None: ones.
    g : Array or None
        (B, H, T) scalar or (B, H, T, dk) per-key log-decays; None: no decay.
    scale : float
        Factor of the outputs.
    initial_state : Array or None
        (B, H, dk, dv) S0; None: zeros.
    delta : bool
        The delta rule (write v_t - S^T k_t instead of v_t).

    Returns
    -------
    o : Array
        (B, H, T, dv) outputs, q's dtype.
    final_state : Array
        (B, H, dk, dv) the state after the last step, q's dtype.
    """
    dtype = np.asarray(q).dtype
    q, k, v, beta, g, initial_state = map(_wide, (q, k, v, beta, g, initial_state))
    B, H, T, dk = q.shape
    dv = v.shape[3]
    o = np.zeros((B, H, T, dv))
    final = np.zeros((B, H, dk, dv))
    for b in range(B):
        for h in range(H):
            _, after, _, final[b, h] = _steps(q, k, v, beta, g, initial_state, delta, b, h)
            for t in range(T):
                o[b, h, t] = scale * after[t].T @ q[b, h, t]
    return o.astype(dtype), final.astype(dtype)


def linear_attention_steps_backward(do: Array, dfinal: Array | None, q: Array, k: Array, v: Array,
                       beta: Array | None = None, g: Array | None = None, scale: float = 1.0,
                       initial_state: Array | None = None,
                       delta: bool = False) -> tuple[Array | None, ...]:
    """Gradients of a loss through ``linear_attention_steps``, walking t backwards.

    With G = dL/dS_t (from ``dfinal`` at t = T-1), S' the state after step t's decay and
    r = v_t - S'^T k_t (delta) or v_t: G += scale outer(q_t, do_t), dq_t = scale S_t do_t,
    dbeta_t = k_t^T G r, dr = beta_t G^T k_t, dv_t = dr, dk_t = beta_t G r (- S' dr with
    delta), dS' = G (- outer(k_t, dr) with delta), dg_t = sum(dS' * S') (per row for a
    per-key g), G <- exp(g_t) dS'; finally dS0 = G.

    Parameters
    ----------
    do : Array
        (B, H, T, dv) dL/do.
    dfinal : Array or None
        (B, H, dk, dv) dL/d(final state); None: zeros.
    q, k, v, beta, g, scale, initial_state, delta
        As in ``linear_attention_steps``.

    Returns
    -------
    tuple
        (dq, dk (B, H, T, dk), dv (B, H, T, dv), dbeta (B, H, T), dg (g's shape),
        dinitial_state (B, H, dk, dv)), q's dtype; None for beta, g, initial_state that were
        None.
    """
    dtype = np.asarray(q).dtype
    do, dfinal, q, k, v, beta, g, initial_state = map(
        _wide, (do, dfinal, q, k, v, beta, g, initial_state))
    B, H, T, dk = q.shape
    dv = v.shape[3]
    dq, dk_, dv_ = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    dbeta = np.zeros((B, H, T))
    dg = None if g is None else np.zeros_like(g)
    dS0 = np.zeros((B, H, dk, dv))
    for b in range(B):
        for h in range(H):
            before, after, rs, _ = _steps(q, k, v, beta, g, initial_state, delta, b, h)
            G = np.zeros((dk, dv)) if dfinal is None else dfinal[b, h].copy()
            for t in range(T - 1, -1, -1):
                qt, kt, dot, r, Sp = q[b, h, t], k[b, h, t], do[b, h, t], rs[t], before[t]
                bt = 1.0 if beta is None else beta[b, h, t]
                G = G + scale * np.outer(qt, dot)
                dq[b, h, t] = scale * after[t] @ dot
                dbeta[b, h, t] = kt @ G @ r
                dr = bt * G.T @ kt
                dv_[b, h, t] = dr
                dk_[b, h, t] = bt * G @ r
                if delta:
                    dk_[b, h, t] -= Sp @ dr
                    G = G - np.outer(kt, dr)
                if g is not None:
                    rows = (G * Sp).sum(axis=1)  # (dk,)
                    dg[b, h, t] = rows.sum() if g.ndim == 3 else rows
                G = _decay(g, b, h, t, dk) * G
            dS0[b, h] = G

    def out(x, given=True):
        return x.astype(dtype) if given else None

    return (out(dq), out(dk_), out(dv_), out(dbeta, beta is not None), out(dg, g is not None),
            out(dS0, initial_state is not None))


def _op_forward(q, k, v, beta, g, scale, initial_state, delta):
    scale = 1.0 / np.sqrt(np.shape(q)[-1]) if scale is None else scale
    o, _ = linear_attention_steps(q, k, v, beta, g, scale, initial_state, delta)
    return o, (q, k, v, beta, g, scale, initial_state, delta)


def _op_backward(do, cache):
    q, k, v, beta, g, scale, initial_state, delta = cache
    return linear_attention_steps_backward(do, None, q, k, v, beta, g, scale, initial_state,
                                           delta)


def linear_attention_forward(q: Array, k: Array, v: Array, scale: float | None = None,
                             initial_state: Array | None = None) -> tuple[Array, tuple]:
    """``F.linear_attention``'s twin (identity feature map, no normaliser): (o, cache)."""
    return _op_forward(q, k, v, None, None, scale, initial_state, False)


def linear_attention_backward(do: Array, cache: tuple) -> tuple[Array | None, ...]:
    """(dq, dk, dv, dinitial_state) for upstream do = dL/do."""
    dq, dk, dv, _, _, dS0 = _op_backward(do, cache)
    return dq, dk, dv, dS0


def gated_linear_attention_forward(q: Array, k: Array, v: Array, g: Array,
                                   scale: float | None = None,
                                   initial_state: Array | None = None) -> tuple[Array, tuple]:
    """``F.gated_linear_attention``'s twin: (o, cache)."""
    return _op_forward(q, k, v, None, g, scale, initial_state, False)


def gated_linear_attention_backward(do: Array, cache: tuple) -> tuple[Array | None, ...]:
    """(dq, dk, dv, dg, dinitial_state) for upstream do = dL/do."""
    dq, dk, dv, _, dg, dS0 = _op_backward(do, cache)
    return dq, dk, dv, dg, dS0


def delta_rule_forward(q: Array, k: Array, v: Array, beta: Array, scale: float | None = None,
                       initial_state: Array | None = None) -> tuple[Array, tuple]:
    """``F.delta_rule``'s twin: (o, cache)."""
    return _op_forward(q, k, v, beta, None, scale, initial_state, True)


def delta_rule_backward(do: Array, cache: tuple) -> tuple[Array | None, ...]:
    """(dq, dk, dv, dbeta, dinitial_state) for upstream do = dL/do."""
    dq, dk, dv, dbeta, _, dS0 = _op_backward(do, cache)
    return dq, dk, dv, dbeta, dS0


def gated_delta_rule_forward(q: Array, k: Array, v: Array, g: Array, beta: Array,
                             scale: float | None = None,
                             initial_state: Array | None = None) -> tuple[Array, tuple]:
    """``F.gated_delta_rule``'s twin: (o, cache)."""
    return _op_forward(q, k, v, beta, g, scale, initial_state, True)


def gated_delta_rule_backward(do: Array, cache: tuple) -> tuple[Array | None, ...]:
    """(dq, dk, dv, dg, dbeta, dinitial_state) for upstream do = dL/do."""
    dq, dk, dv, dbeta, dg, dS0 = _op_backward(do, cache)
    return dq, dk, dv, dg, dbeta, dS0
