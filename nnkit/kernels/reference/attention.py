"""Naive twin of the fused attention kernels, straight from the formula, in float64.

    scores = q k^T * scale + mask   (mask additive; a bool mask: True = takes part)
    scores_ij = -inf where is_causal and j > i
    P = softmax(scores) (rows where no key takes part: P = 0)
    out = (P * Z) v,   lse_i = log sum_j exp(scores_ij)

Z: the dropout multipliers (``dropout_multipliers``, the kernels' hash of ``seed`` and the
element's index). Leading (batch) dimensions broadcast as in NumPy's matmul. Results are
cast back to the inputs' dtype (lse too). ``attention_forward``/``attention_backward`` mirror
``nnkit.kernels.attention``'s pair: the same arguments, ``(out, cache)``, and ``(dout,
cache, needs) -> (dq, dk, dv, dmask)``. Nothing here is meant to be fast: the tests hold
``nnkit.kernels.attention`` to these functions.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ..._backend import unbroadcast
from ..._random import splitmix64, uniform53
from ..._types import Array, Needs

__all__ = ["attention_forward", "attention_backward", "AttentionTwinCache",
           "dropout_multipliers"]


class AttentionTwinCache(NamedTuple):
    """The forward's inputs and options, its dropout multipliers and row log-sum-exp."""

    query: object
    key: object
    value: object
    attn_mask: object
    is_causal: bool
    scale: object
    z: object  # (batch..., L, S) dropout multipliers, or None without dropout
    lse: object  # (batch..., L), the inputs' dtype (-inf where no key takes part)


def _scores(q, k, mask, causal, scale):
    """(..., L, S) scores in float64, masked with -inf where a key does not take part."""
    q = np.asarray(q, np.float64)
    k = np.asarray(k, np.float64)
    L, E = q.shape[-2:]
    S = k.shape[-2]
    scale = (1.0 / math.sqrt(E) if E > 0 else 1.0) if scale is None else float(scale)
    s = np.matmul(q, np.swapaxes(k, -1, -2)) * scale
    if mask is not None:
        mask = np.asarray(mask)
        if mask.dtype == bool:
            mask = np.where(mask, 0.0, -np.inf)
        s = s + mask.astype(np.float64)
    if causal:
        allowed = np.arange(S)[None, :] <= np.arange(L)[:, None]  # (L, S): j <= i
        s = np.where(allowed, s, -np.inf)
    return s


def _softmax_rows(s):
    """P = softmax(s) over the last axis and lse; rows of all -inf give P = 0, lse = -inf."""
    m = s.max(axis=-1, keepdims=True) if s.shape[-1] > 0 else np.full(s.shape[:-1] + (1,),
                                                                      -np.inf)
    shift = np.where(np.isneginf(m), 0.0, m)
    e = np.exp(s - shift)
    total = e.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.where(total > 0, e / total, 0.0)
        lse = np.where(total > 0, shift + np.log(total), -np.inf)[..., 0]
    return p, lse


def attention_forward(query: Array, key: Array, value: Array, attn_mask: Array | None = None,
                      is_causal: bool = False, scale: float | None = None,
                      dropout_p: float = 0.0, seed: int | None = None,
                      ) -> tuple[Array, AttentionTwinCache]:
    """softmax(query key^T scale + attn_mask) (times the dropout multipliers) value.

    Parameters
    ----------
    query : array (..., L, E)
    key : array (..., S, E)
    value : array (..., S, Ev)
    attn_mask : array broadcastable to (batch..., L, S), or None
        Float (added) or bool (True = takes part).
    is_causal : bool
        Key j takes part for query i iff j <= i.
    scale : float or None (1 / sqrt(E))
    dropout_p : float in [0, 1)
    seed : int
        The dropout hash's seed; None draws it from nnkit's generator, as the kernels do
        (the same draw after ``nk.manual_seed``).

    Returns
    -------
    out : array (batch..., L, Ev)
    cache : AttentionTwinCache
        For ``attention_backward`` (``cache.lse``: the rows' log-sum-exp, (batch..., L)).
    """
    dtype = np.result_type(query, key, value)
    L, S = np.shape(query)[-2], np.shape(key)[-2]
    z = None
    if dropout_p > 0:
        if seed is None:
            from ..._random import get_rng

            seed = int(get_rng().integers(0, 2**63 - 1))
        batch = np.broadcast_shapes(*(np.shape(x)[:-2] for x in (query, key, value)))
        z = dropout_multipliers(seed, dropout_p, batch + (L, S))
    p, lse = _softmax_rows(_scores(query, key, attn_mask, is_causal, scale))
    if z is not None:
        p = p * z
    out = np.matmul(p, np.asarray(value, np.float64)).astype(dtype)
    return out, AttentionTwinCache(query, key, value, attn_mask, is_causal, scale, z,
                                   lse.astype(dtype))


def attention_backward(dout: Array, cache: AttentionTwinCache, needs: Needs = None,
                       ) -> tuple[Array | None, ...]:
    """Gradients of ``attention_forward``'s out. With P the softmax, Z the dropout
    multipliers and dO = dout:

        dV = (P Z)^T dO,  dP = (dO V^T) Z,  dS = P (dP - rowsum(P dP)),
        dQ = scale dS K,  dK = scale dS^T Q,  dmask = dS (a float mask: added to the scores).

    ``needs``: which of (query, key, value, attn_mask) want one (None: all). Returns (dq,
    dk, dv, dmask), each the shape and dtype of its input (summed over the dimensions it
    was broadcast along), None where not needed; dmask None for a bool mask or none.
    """
    c = cache
    q, k, v, mask = c.query, c.key, c.value, c.attn_mask
    dtype = np.result_type(q, k, v)
    E = np.shape(q)[-1]
    scale = (1.0 / math.sqrt(E) if E > 0 else 1.0) if c.scale is None else float(c.scale)
    p, _ = _softmax_rows(_scores(q, k, mask, c.is_causal, scale))
    z = np.ones(1) if c.z is None else c.z
    q64, k64, v64 = (np.asarray(a, np.float64) for a in (q, k, v))
    dout = np.asarray(dout, np.float64)
    dv = np.matmul(np.swapaxes(p * z, -1, -2), dout)
    dp = np.matmul(dout, np.swapaxes(v64, -1, -2)) * z
    ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True))
    dq = np.matmul(ds, k64) * scale
    dk = np.matmul(np.swapaxes(ds, -1, -2), q64) * scale
    float_mask = mask is not None and np.asarray(mask).dtype != np.bool_
    inputs = (q, k, v, mask if float_mask else None)
    needs = (True,) * 4 if needs is None else needs
    return tuple(None if x is None or not need else unbroadcast(g, np.shape(x)).astype(dtype)
                 for g, x, need in zip((dq, dk, dv, ds), inputs, needs, strict=True))


def dropout_multipliers(seed: int, p: float, shape: tuple[int, int, int, int]) -> Array:
    """The dropout multipliers z(b, h, i, j) of the kernels: SplitMix64 output n + 1 for
    ``seed`` (``nnkit._random.splitmix64``, plain NumPy) with n = ((b H + h) L + i) S + j,
    the C-order index; kept (z = 1 / (1 - p)) iff its top 53 bits / 2^53 >= p, else z = 0.
    ``shape`` = (B, H, L, S), or batch + (L, S) (the index is the same flat one)."""
    u = uniform53(splitmix64(seed, np.arange(math.prod(shape)).reshape(shape)))
    return np.where(u >= p, 1.0 / (1.0 - p), 0.0)
