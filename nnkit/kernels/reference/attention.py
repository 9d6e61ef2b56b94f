"""Naive twin of the fused attention kernels, straight from the formula, in float64.

    scores = q k^T * scale + mask   (mask additive; a bool mask: True = takes part)
    scores_ij = -inf where is_causal and j > i
    P = softmax(scores) (rows where no key takes part: P = 0)
    out = (P * dropout_mask) v,   lse_i = log sum_j exp(scores_ij)

Leading (batch) dimensions broadcast as in NumPy's matmul. Results are cast back to the
inputs' dtype (lse too). Nothing here is meant to be fast: the tests hold
``nnkit.kernels.attention`` to these functions.
"""

from __future__ import annotations

import math

import numpy as np

from ..._backend import unbroadcast
from ..._random import splitmix64, uniform53

__all__ = ["attention_reference", "attention_reference_backward",
           "dropout_multipliers_reference"]


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


def attention_reference(q, k, v, mask=None, causal=False, scale=None, dropout_mask=None):
    """softmax(q k^T scale + mask) v, and the rows' log-sum-exp.

    Parameters
    ----------
    q : array (..., L, E); k : array (..., S, E); v : array (..., S, Ev)
    mask : array broadcastable to (..., L, S), float (added) or bool (True = takes part)
    causal : bool, key j takes part for query i iff j <= i
    scale : float or None (1 / sqrt(E))
    dropout_mask : array broadcastable to (..., L, S) or None: multipliers of P

    Returns
    -------
    out : array (..., L, Ev); lse : array (..., L) (-inf where no key takes part)
    """
    dtype = np.result_type(q, k, v)
    p, lse = _softmax_rows(_scores(q, k, mask, causal, scale))
    if dropout_mask is not None:
        p = p * np.asarray(dropout_mask, np.float64)
    out = np.matmul(p, np.asarray(v, np.float64))
    return out.astype(dtype), lse.astype(dtype)


def attention_reference_backward(dout, q, k, v, mask=None, causal=False, scale=None,
                                 dropout_mask=None):
    """Gradients of ``attention_reference``'s out (mask, causal, dropout fixed).

    With P the softmax, Z the dropout multipliers and dO = dout:
    dV = (P Z)^T dO,  dP = (dO V^T) Z,  dS = P (dP - rowsum(P dP)),
    dQ = scale dS K,  dK = scale dS^T Q.

    Returns (dq, dk, dv), each the shape and dtype of its input; also ``dscores`` (the
    gradient of the additive mask before broadcasting, (..., L, S)) as a fourth value.
    """
    dtype = np.result_type(q, k, v)
    E = np.shape(q)[-1]
    scale = (1.0 / math.sqrt(E) if E > 0 else 1.0) if scale is None else float(scale)
    p, _ = _softmax_rows(_scores(q, k, mask, causal, scale))
    z = np.ones(1) if dropout_mask is None else np.asarray(dropout_mask, np.float64)
    q64, k64, v64 = (np.asarray(a, np.float64) for a in (q, k, v))
    dout = np.asarray(dout, np.float64)
    dv = np.matmul(np.swapaxes(p * z, -1, -2), dout)
    dp = np.matmul(dout, np.swapaxes(v64, -1, -2)) * z
    ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True))
    dq = np.matmul(ds, k64) * scale
    dk = np.matmul(np.swapaxes(ds, -1, -2), q64) * scale
    grads = (unbroadcast(g, np.shape(x)) for g, x in ((dq, q), (dk, k), (dv, v)))
    return tuple(g.astype(dtype) for g in grads) + (ds,)


def dropout_multipliers_reference(seed, p, shape):
    """The dropout multipliers z(b, h, i, j) of the kernels: SplitMix64 output n + 1 for
    ``seed`` (``nnkit._random.splitmix64``, plain NumPy) with n = ((b H + h) L + i) S + j,
    the C-order index; kept (z = 1 / (1 - p)) iff its top 53 bits / 2^53 >= p, else z = 0.
    ``shape`` = (B, H, L, S)."""
    u = uniform53(splitmix64(seed, np.arange(math.prod(shape)).reshape(shape)))
    return np.where(u >= p, 1.0 / (1.0 - p), 0.0)
