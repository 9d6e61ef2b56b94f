"""The linear-attention family (causal linear attention, gated linear attention / Mamba-2's
SSD, the delta rule, the gated delta rule): one validated forward/backward pair over one
recurrence, two ways to compute it.

Per (batch, head), with the state S (dk, dv) (keys index rows, flash-linear-attention's
layout) starting from ``initial_state`` (zeros when None):

    S_t = a_t S_{t-1} + beta_t k_t (v_t - [delta] (a_t S_{t-1})^T k_t)^T,   o_t = scale S_t^T q_t

a_t = exp(g_t): g (batch, heads, T) a scalar log-decay per step, (batch, heads, T, dk) one per
key (not with ``delta``), or None (a_t = 1). beta (batch, heads, T), None meaning ones. With
``delta`` the update is the delta rule's S (I - beta k k^T) + beta k v^T in this layout.

``mode="recurrent"`` walks the steps with the state in cache (``nnkit._ext
.linear_attention_cpu`` / ``_cuda``, which save it every 64 steps for the backward);
``mode="chunk"`` is the chunked parallel form (``nnkit.kernels.linear_attention_chunk``):
GEMMs inside chunks of ``chunk_size`` steps, a recurrence across them. The two agree to
rounding (float64: 1e-10). ``mode="auto"`` takes the recurrent form for NumPy arrays (on a
CPU the fused recurrence does fewer flops, and it measured faster than the chunked form at
most shapes, ``benchmarks/bench_linear_attention.py --modes``) and the chunked form for GPU
arrays (parallel over T, its work in cuBLAS GEMMs).

Examples
--------
>>> import numpy as np
>>> from nnkit.kernels.linear_attention import linear_attention_forward
>>> q = k = np.ones((1, 1, 3, 1)); v = np.arange(3.0).reshape(1, 1, 3, 1)
>>> (o, final), _ = linear_attention_forward(q, k, v, scale=1.0)
>>> o[0, 0, :, 0].tolist(), final.tolist()
([0.0, 1.0, 3.0], [[[[3.0]]]])
"""

from __future__ import annotations

import numbers
from typing import Literal, NamedTuple

from .._backend import array_module, backend, kernels_for
from .._types import Array, Needs
from .._validation import (
    FLOATS,
    check_array,
    check_bool,
    check_cache,
    check_choice,
    check_companion,
    check_grad,
    check_scalar,
)
from . import linear_attention_chunk as _chunk

__all__ = ["LinearAttentionCache", "linear_attention_forward", "linear_attention_backward"]

Mode = Literal["auto", "chunk", "recurrent"]


class LinearAttentionCache(NamedTuple):
    """What ``linear_attention_backward`` reads."""

    shape: tuple  # (batch, heads, T, dk, dv)
    given: tuple  # whether beta, g, initial_state were given
    g_ndim: int  # the user's rank of g (3 or 4), 0 when absent
    mode: str
    rows: tuple  # recurrent: (q, k, v, beta, g, scale, delta, checkpoints); chunk: ChunkCache


def _check_like(x, q, name, shape, what):
    return check_companion(x, q, name=name, like_name="q", shape=shape, what=what)


def _check_g(g, q, delta):
    """g as (rows, T, G), and its user rank."""
    batch, heads, T, dk = q.shape
    g = check_array(g, name="g", ndim=(3, 4), dtype=FLOATS)
    shape = (batch, heads, T) if g.ndim == 3 else (batch, heads, T, dk)
    what = "(batch, heads, T)" if g.ndim == 3 else "(batch, heads, T, dk)"
    g = _check_like(g, q, "g", shape, what)
    if g.ndim == 4 and delta:
        raise ValueError("g must be one log-decay per step, (batch, heads, T), with the delta "
                         f"rule; got a per-key decay of shape {tuple(g.shape)}")
    return g.reshape(batch * heads, T, 1 if g.ndim == 3 else dk), g.ndim


def check_inputs(q: Array, k: Array, v: Array, beta: Array | None, g: Array | None,
                 initial_state: Array | None, delta: bool) -> tuple:
    """The inputs validated, as rows: ((q, k, v, beta, g, S0) in the kernels' layouts,
    (batch, heads, T, dk, dv), which of beta, g, initial_state were given, g's rank)."""
    q = check_array(q, name="q", ndim=4, dtype=FLOATS)
    batch, heads, T, dk = q.shape
    k = _check_like(k, q, "k", q.shape, "(batch, heads, T, dk)")
    v = check_array(v, name="v", ndim=4, dtype=FLOATS)
    dv = v.shape[3]
    v = _check_like(v, q, "v", (batch, heads, T, dv), "(batch, heads, T, dv)")
    xp = array_module(q)
    BH = batch * heads
    beta_r = (xp.ones((BH, T), q.dtype) if beta is None
              else _check_like(beta, q, "beta", (batch, heads, T), "(batch, heads, T)")
              .reshape(BH, T))
    g_r, g_ndim = (xp.zeros((BH, T, 0), q.dtype), 0) if g is None else _check_g(g, q, delta)
    S0 = (xp.zeros((BH, dk, dv), q.dtype) if initial_state is None
          else _check_like(initial_state, q, "initial_state", (batch, heads, dk, dv),
                           "(batch, heads, dk, dv)").reshape(BH, dk, dv))
    rows = (q.reshape(BH, T, dk), k.reshape(BH, T, dk), v.reshape(BH, T, dv), beta_r, g_r, S0)
    given = (beta is not None, g is not None, initial_state is not None)
    return rows, (batch, heads, T, dk, dv), given, g_ndim


def _kernels(q):
    return kernels_for("linear_attention_cpu", "linear_attention_cuda", q, name="q")


def linear_attention_forward(q: Array, k: Array, v: Array, beta: Array | None = None,
                             g: Array | None = None, initial_state: Array | None = None,
                             scale: float = 1.0, delta: bool = False,
                             mode: Mode = "auto", chunk_size: int = 64
                             ) -> tuple[tuple[Array, Array], LinearAttentionCache]:
    """The recurrence of the module docstring.

    Parameters
    ----------
    q, k : array (batch, heads, T, dk), float32/64 (one dtype for every input)
    v : array (batch, heads, T, dv)
    beta : array (batch, heads, T) or None (ones)
    g : array (batch, heads, T) or (batch, heads, T, dk) (not with ``delta``), log-decays,
        or None (no decay)
    initial_state : array (batch, heads, dk, dv) or None (zeros)
    scale : float
    delta : bool, the delta rule's update
    mode : 'auto' (recurrent on the CPU, chunk on a GPU), 'chunk' or 'recurrent'
    chunk_size : int >= 1, the chunk length of ``mode='chunk'``

    Returns
    -------
    (o (batch, heads, T, dv), final_state (batch, heads, dk, dv)), and the cache for
    ``linear_attention_backward``.
    """
    delta = check_bool(delta, name="delta")
    mode = check_choice(mode, name="mode", choices=("auto", "chunk", "recurrent"))
    scale = float(check_scalar(scale, name="scale"))
    chunk_size = int(check_scalar(chunk_size, name="chunk_size", kind=numbers.Integral, low=1))
    rows, shape, given, g_ndim = check_inputs(q, k, v, beta, g, initial_state, delta)
    batch, heads, T, dk, dv = shape
    q_r, k_r, v_r, beta_r, g_r, S0 = rows
    if mode == "auto":
        mode = "recurrent" if backend(q_r) == "cpu" else "chunk"
    if mode == "chunk":
        o, final, saved = _chunk.chunk_forward(q_r, k_r, v_r, beta_r, g_r, scale, S0, delta,
                                               chunk_size)
    else:
        xp = array_module(q_r)
        o, final = xp.empty_like(v_r), xp.empty_like(S0)
        kernels = _kernels(q_r)
        checkpoints = xp.empty((batch * heads, -(-T // kernels.CHUNK), dk, dv), q_r.dtype)
        kernels.recurrent_forward(q_r, k_r, v_r, beta_r, g_r, scale, S0, delta, o, final,
                                  checkpoints)
        saved = (q_r, k_r, v_r, beta_r, g_r, scale, delta, checkpoints)
    cache = LinearAttentionCache(shape, given, g_ndim, mode, saved)
    return (o.reshape(batch, heads, T, dv), final.reshape(batch, heads, dk, dv)), cache


def linear_attention_backward(douts: tuple[Array | None, Array | None],
                              cache: LinearAttentionCache, needs: Needs = None
                              ) -> tuple[Array | None, ...]:
    """Gradients of ``linear_attention_forward``.

    Parameters
    ----------
    douts : (do, dfinal): do (batch, heads, T, dv), dfinal (batch, heads, dk, dv), either
        None (zeros)
    cache : LinearAttentionCache from ``linear_attention_forward``
    needs : tuple of 6 bool over (q, k, v, beta, g, initial_state), optional (None: all)

    Returns
    -------
    dq, dk, dv, dbeta, dg, dinitial_state in the inputs' layouts; None for inputs that were
    None or are not needed.
    """
    c = check_cache(cache, LinearAttentionCache, forward="linear_attention_forward")
    batch, heads, T, dk, dv = c.shape
    BH = batch * heads
    like = c.rows[0] if c.mode == "recurrent" else c.rows.Q
    xp, device = array_module(like), backend(like)
    do, dfinal = douts
    do = (xp.zeros((BH, T, dv), like.dtype) if do is None else
          check_grad(do, shape=(batch, heads, T, dv), dtype=like.dtype, device=device,
                     name="do").reshape(BH, T, dv))
    dfinal = (xp.zeros((BH, dk, dv), like.dtype) if dfinal is None else
              check_grad(dfinal, shape=(batch, heads, dk, dv), dtype=like.dtype,
                         device=device, name="dfinal_state").reshape(BH, dk, dv))
    if c.mode == "chunk":
        dq, dk_, dv_, dbeta, dg, dS0 = _chunk.chunk_backward(do, dfinal, c.rows)
    else:
        q_r, k_r, v_r, beta_r, g_r, scale, delta, checkpoints = c.rows
        dq, dk_, dv_ = xp.empty_like(q_r), xp.empty_like(k_r), xp.empty_like(v_r)
        dbeta, dg, dS0 = xp.empty_like(beta_r), xp.empty_like(g_r), xp.empty_like(dfinal)
        _kernels(q_r).recurrent_backward(do, dfinal, q_r, k_r, v_r, beta_r, g_r, scale, delta,
                                         checkpoints, dq, dk_, dv_, dbeta, dg, dS0)
    beta_given, g_given, S0_given = c.given
    g_shape = (batch, heads, T) if c.g_ndim == 3 else (batch, heads, T, dk)
    grads = (dq.reshape(batch, heads, T, dk), dk_.reshape(batch, heads, T, dk),
             dv_.reshape(batch, heads, T, dv),
             dbeta.reshape(batch, heads, T) if beta_given else None,
             dg.reshape(g_shape) if g_given else None,
             dS0.reshape(batch, heads, dk, dv) if S0_given else None)
    if needs is None:
        return grads
    return tuple(x if need else None for x, need in zip(grads, needs, strict=True))
