"""Scaled-dot-product attention: validated forward/backward pair, backend dispatch.

    out = softmax(query key^T * scale + mask) value        (torch's F.scaled_dot_product_attention)

query (..., L, E), key (..., S, E), value (..., S, Ev); the leading (batch) dimensions
broadcast against each other as torch's do, and the output is (batch..., L, Ev).
``attn_mask`` broadcasts to (batch..., L, S): a bool mask says which keys take part (True),
a float mask (the query's dtype) is added to the scores. ``is_causal`` lets key j take part
for query i iff j <= i (top-left aligned, torch's ``ones(L, S).tril()``); unlike torch,
which refuses ``attn_mask`` together with ``is_causal``, both may be given and combine.
``scale`` defaults to 1/sqrt(E). ``dropout_p`` drops attention probabilities (kept ones are
scaled by 1/(1-p)) with a mask that is a pure function of ``seed`` and the element's index,
so the backward regenerates it (``nnkit._ext.attention_cpu`` documents the hash).

The compiled kernels see 4-D C-contiguous arrays (B, H, L, E): the broadcast batch shape
(b_1, ..., b_n) becomes B = b_1 ... b_{n-1}, H = b_n. Inputs whose batch dimensions were
broadcast are expanded for the kernels and their gradients summed back. The mask is never
expanded to (B, H, L, S): a bool mask becomes an additive 0/-inf mask of its own shape,
then a zero-stride broadcast view (only when the mask varies along a leading dimension
that cannot be folded into B without a copy is it copied over those leading dimensions,
still without its broadcast L or S axes).

NumPy arrays run on ``nnkit._ext.attention_cpu``, GPU arrays (CuPy) on
``nnkit._ext.attention_cuda`` (imported lazily; ``nnkit._backend.kernels_for`` chooses).
``attention_backward(dout, cache, needs)`` returns (dquery, dkey, dvalue, dmask): ``needs``
says which of (query, key, value, attn_mask) want a gradient. The mask's (dL/dscores, summed
to the mask's shape; None for a bool mask or none) is not fused: it builds one (L, S) slab
per (batch, head), so it runs only when ``needs`` asks for it.

Examples
--------
>>> import numpy as np
>>> from nnkit.kernels.attention import attention_forward, attention_backward
>>> q = np.zeros((2, 3, 4)); k = np.zeros((2, 5, 4)); v = np.arange(10.0).reshape(2, 5, 1)
>>> out, cache = attention_forward(q, k, v)
>>> out[:, 0, 0].tolist()  # uniform weights: the mean of the values
[2.0, 7.0]
>>> dq, dk, dv, dmask = attention_backward(np.ones_like(out), cache)
>>> dv[0, :, 0].round(12).tolist()
[0.6, 0.6, 0.6, 0.6, 0.6]
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np

from .._backend import array_module, kernels_for, unbroadcast
from .._types import Array, Needs
from .._validation import FLOATS, check_array, check_bool, check_same_device, check_scalar

__all__ = ["attention_forward", "attention_backward", "AttentionCache"]


@dataclass
class AttentionCache:
    """What the backward needs: the kernels' 4-D arrays, the options and the shapes to which
    the gradients are reduced."""

    q: object
    k: object
    v: object
    mask: object
    has_mask: bool
    causal: bool
    scale: float
    dropout_p: float
    seed: int
    out: object
    lse: object
    shapes: tuple  # original shapes of query, key, value
    batch: tuple  # the broadcast batch shape
    mask_shape: tuple | None  # a float attn_mask's shape (None: no mask, or a bool one)


# ---- validation ---------------------------------------------------------------------------

def _check_qkv(query, key, value):
    query = check_array(query, name="query", min_ndim=2, dtype=FLOATS, contiguous=False)
    key = check_array(key, name="key", min_ndim=2, dtype=FLOATS, contiguous=False)
    value = check_array(value, name="value", min_ndim=2, dtype=FLOATS, contiguous=False)
    if not query.dtype == key.dtype == value.dtype:
        raise TypeError(f"query, key and value must have one dtype, got {query.dtype}, "
                        f"{key.dtype} and {value.dtype}")
    check_same_device(key, query, name="key", like_name="query")
    check_same_device(value, query, name="value", like_name="query")
    if query.shape[-1] != key.shape[-1]:
        raise ValueError(f"query and key must have the same embedding size E (last axis): "
                         f"query {tuple(query.shape)} (..., L, E), key {tuple(key.shape)} "
                         f"(..., S, E)")
    if key.shape[-2] != value.shape[-2]:
        raise ValueError(f"key and value must have the same length S (second-last axis): "
                         f"key {tuple(key.shape)} (..., S, E), value {tuple(value.shape)} "
                         f"(..., S, Ev)")
    try:
        batch = np.broadcast_shapes(query.shape[:-2], key.shape[:-2], value.shape[:-2])
    except ValueError:
        raise ValueError(f"the batch dimensions of query {tuple(query.shape)}, key "
                         f"{tuple(key.shape)} and value {tuple(value.shape)} do not "
                         f"broadcast (all but the last two axes)") from None
    return query, key, value, tuple(batch)


def _check_mask(attn_mask, query, batch, L, S):
    if attn_mask is None:
        return None
    attn_mask = check_array(attn_mask, name="attn_mask", contiguous=False)
    if attn_mask.dtype != np.bool_ and attn_mask.dtype != query.dtype:
        raise TypeError(f"attn_mask must be bool (True = takes part) or have the query's dtype "
                        f"{query.dtype} (added to the scores), got {attn_mask.dtype}")
    check_same_device(attn_mask, query, name="attn_mask", like_name="query")
    target = batch + (L, S)
    try:
        ok = np.broadcast_shapes(tuple(attn_mask.shape), target) == target
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"attn_mask of shape {tuple(attn_mask.shape)} does not broadcast to "
                         f"the scores' shape {target} (batch..., L, S)")
    return attn_mask


def _check_options(is_causal, scale, dropout_p, seed, E):
    check_bool(is_causal, name="is_causal")
    if scale is None:
        scale = 1.0 / math.sqrt(E) if E > 0 else 1.0
    scale = float(check_scalar(scale, name="scale"))
    dropout_p = float(check_scalar(dropout_p, name="dropout_p", low=0.0, high=1.0,
                                   high_inclusive=False))
    if seed is None:
        from .._random import get_rng

        seed = int(get_rng().integers(0, 2**63 - 1)) if dropout_p > 0 else 0
    seed = int(check_scalar(seed, name="seed", kind=numbers.Integral, low=0,
                            high=2**63 - 1))
    return bool(is_causal), scale, dropout_p, seed


# ---- layout -------------------------------------------------------------------------------

def _bh(batch):
    """(B, H) of a batch shape: (prod of all but the last, last); (1, 1) for ()."""
    if not batch:
        return 1, 1
    return math.prod(batch[:-1]), batch[-1]


def _as_4d(x, batch, B, H, xp):
    """x (..., N, F) broadcast to batch + (N, F), C-contiguous, as (B, H, N, F)."""
    if tuple(x.shape[:-2]) != batch:
        x = xp.broadcast_to(x, batch + tuple(x.shape[-2:]))
    return xp.ascontiguousarray(x).reshape(B, H, x.shape[-2], x.shape[-1])


def _additive(mask, dtype, xp):
    """A bool mask as 0 (takes part) / -inf (excluded) of ``dtype``; a float mask unchanged."""
    if mask.dtype != np.bool_:
        return mask
    return xp.where(mask, xp.zeros((), dtype), xp.asarray(-np.inf, dtype))


def _mask_4d(additive, batch, B, H, L, S, xp):
    """A (B, H, L, S) view of the mask broadcast to batch + (L, S), without expanding it."""
    nb = len(batch)
    m = additive.reshape((1,) * (nb + 2 - additive.ndim) + tuple(additive.shape))
    if nb == 0:
        return xp.broadcast_to(m.reshape(1, 1, *m.shape[-2:]), (B, H, L, S))
    lead = xp.broadcast_to(m, batch[:-1] + tuple(m.shape[nb - 1:]))  # (b_1..b_{n-1}, h, l, s)
    # a view where the leading axes fold into one stride, else a copy of them (a mask that
    # varies along leading axes which do not fold), without the broadcast L or S axes
    folded = lead.reshape((B,) + tuple(m.shape[nb - 1:]))
    return xp.broadcast_to(folded, (B, H, L, S))


def _kernels(x):
    """attention_cpu for NumPy arrays, attention_cuda for GPU arrays."""
    return kernels_for("attention_cpu", "attention_cuda", x, name="query")


# ---- public pair --------------------------------------------------------------------------

def attention_forward(query: Array, key: Array, value: Array, attn_mask: Array | None = None,
                      is_causal: bool = False, scale: float | None = None,
                      dropout_p: float = 0.0, seed: int | None = None,
                      ) -> tuple[Array, AttentionCache]:
    """Fused scaled-dot-product attention (see the module docstring).

    Parameters
    ----------
    query : array (..., L, E), float32 or float64
    key : array (..., S, E), same dtype
    value : array (..., S, Ev), same dtype
    attn_mask : array broadcastable to (batch..., L, S), bool or the query's dtype; optional
    is_causal : bool
    scale : float or None (1/sqrt(E))
    dropout_p : float in [0, 1)
    seed : int in [0, 2^63) or None (drawn from nnkit's generator when dropout_p > 0)

    Returns
    -------
    out : array (batch..., L, Ev) of the query's dtype
    cache : AttentionCache, for ``attention_backward``
    """
    query, key, value, batch = _check_qkv(query, key, value)
    L, E = query.shape[-2:]
    S, Ev = value.shape[-2:]
    attn_mask = _check_mask(attn_mask, query, batch, L, S)
    is_causal, scale, dropout_p, seed = _check_options(is_causal, scale, dropout_p, seed, E)
    xp = array_module(query)
    B, H = _bh(batch)
    q, k, v = (_as_4d(x, batch, B, H, xp) for x in (query, key, value))
    has_mask = attn_mask is not None
    if has_mask:
        mask = _mask_4d(_additive(attn_mask, query.dtype, xp), batch, B, H, L, S, xp)
    else:
        mask = xp.broadcast_to(xp.zeros((), query.dtype), (B, H, L, S))
    out = xp.empty((B, H, L, Ev), query.dtype)
    lse = xp.empty((B, H, L), query.dtype)
    _kernels(query).attention_forward(q, k, v, mask, has_mask, is_causal, scale, dropout_p,
                                      seed, out, lse)
    float_mask = has_mask and attn_mask.dtype != np.bool_
    cache = AttentionCache(q, k, v, mask, has_mask, is_causal, scale, dropout_p, seed, out, lse,
                           (tuple(query.shape), tuple(key.shape), tuple(value.shape)), batch,
                           tuple(attn_mask.shape) if float_mask else None)
    return out.reshape(batch + (L, Ev)), cache


def attention_backward(dout: Array, cache: AttentionCache, needs: Needs = None,
                       ) -> tuple[Array | None, Array | None, Array | None, Array | None]:
    """Gradients of ``attention_forward``'s output.

    Parameters
    ----------
    dout : array (batch..., L, Ev), the upstream gradient, the forward's dtype
    cache : AttentionCache from ``attention_forward``
    needs : tuple of 4 bool, optional
        Which of (query, key, value, attn_mask) want a gradient (``nnkit.autograd.apply_op``'s
        mask; None: all). One fused kernel gives the three of query, key and value; the
        mask's is computed apart, only when asked for.

    Returns
    -------
    dquery, dkey, dvalue : arrays of the shapes of query, key and value (summed over the
        batch dimensions along which they were broadcast); None where not needed
    dmask : array of a float attn_mask's shape (dL/dscores summed to it); None where not
        needed, and for a bool mask or none
    """
    c = cache
    B, H, L, Ev = c.out.shape
    dout = check_array(dout, name="dout", dtype=(c.q.dtype,), contiguous=False)
    check_same_device(dout, c.q, name="dout", like_name="the forward's query")
    if tuple(dout.shape) != c.batch + (L, Ev):
        raise ValueError(f"dout must have the output's shape {c.batch + (L, Ev)}, got "
                         f"{tuple(dout.shape)}")
    needs = _check_needs(needs)
    xp = array_module(c.q)
    dout4 = xp.ascontiguousarray(dout).reshape(B, H, L, Ev)
    grads = _qkv_grads(dout4, c, needs[:3], xp) if any(needs[:3]) else (None, None, None)
    dmask = _mask_grad(dout4, c, xp) if needs[3] and c.mask_shape is not None else None
    return (*grads, dmask)


def _check_needs(needs):
    """``needs`` as a tuple of 4 bools (None: all)."""
    if needs is None:
        return (True, True, True, True)
    needs = tuple(bool(n) for n in needs)
    if len(needs) != 4:
        raise ValueError(f"needs must say for each of (query, key, value, attn_mask) whether it "
                         f"wants a gradient: 4 bools, got {len(needs)}")
    return needs


def _qkv_grads(dout4, c, needs, xp):
    """(dq, dk, dv) by the fused kernel, each reduced to its input's shape, None where not
    needed."""
    dq, dk, dv = xp.empty_like(c.q), xp.empty_like(c.k), xp.empty_like(c.v)
    _kernels(c.q).attention_backward(c.q, c.k, c.v, c.mask, c.has_mask, c.causal, c.scale,
                                     c.dropout_p, c.seed, c.out, c.lse, dout4, dq, dk, dv)
    grads = []
    for g, shape, need in zip((dq, dk, dv), c.shapes, needs, strict=True):
        full = g.reshape(c.batch + tuple(shape[-2:]))
        grads.append(xp.ascontiguousarray(unbroadcast(full, shape)) if need else None)
    return tuple(grads)


def _mask_grad(dout4, c, xp):
    """The gradient of a float ``attn_mask``: the scores' gradient dS, summed to the mask's
    shape (which may be (batch..., L, S) itself), one (batch, head) slab of (L, S) at a time
    (never (B, H, L, S) at once when the mask is smaller)."""
    B, H, L, _ = c.out.shape
    delta = (dout4 * c.out).sum(axis=-1, keepdims=True)  # (B, H, L, 1): D_i
    nb = len(c.batch)
    padded = (1,) * (nb + 2 - len(c.mask_shape)) + c.mask_shape
    lead = padded[: max(nb - 1, 0)]  # the mask's axes over b_1..b_{n-1}
    head_axis = padded[nb - 1] if nb >= 1 else 1
    grad = xp.zeros(lead + (head_axis,) + padded[-2:], dtype=c.q.dtype)
    # (prod lead, head_axis, l, s); the leading size spelt out: -1 is ambiguous when l s = 0
    grad_bh = grad.reshape((int(np.prod(lead, dtype=np.int64)),) + grad.shape[-3:])
    strides = [int(np.prod(c.batch[d + 1:-1], dtype=np.int64)) for d in range(len(lead))]
    z = xp.empty((1, 1, L, c.k.shape[2]), c.q.dtype) if c.dropout_p > 0 else None
    for bh in range(B * H):
        b, h = divmod(bh, H)
        ds = _score_grad_slab(dout4, delta, c, b, h, z, xp)
        idx = 0
        for d, stride in enumerate(strides):  # flat index of b in the mask's leading axes
            coord = (b // stride) % c.batch[d]
            idx = idx * lead[d] + (coord if lead[d] > 1 else 0)
        if padded[-2] == 1:
            ds = ds.sum(axis=0, keepdims=True)
        if padded[-1] == 1:
            ds = ds.sum(axis=1, keepdims=True)
        grad_bh[idx, h if head_axis > 1 else 0] += ds
    return grad.reshape(c.mask_shape)


def _score_grad_slab(dout4, delta, c, b, h, z, xp):
    """dS (L, S) of (batch, head) (b, h): P (dP - D), P = exp(s - lse), dP = (dout v^T) z;
    ``z`` a (1, 1, L, S) buffer for the dropout multipliers, None without dropout."""
    L, S = c.q.shape[2], c.k.shape[2]
    s = (c.q[b, h] @ c.k[b, h].T) * c.scale + c.mask[b, h]
    if c.causal:
        s = xp.where(xp.tril(xp.ones((L, S), dtype=bool)), s, -xp.inf)
    with np.errstate(invalid="ignore", over="ignore"):
        p = xp.where(xp.isneginf(c.lse[b, h])[:, None], 0.0, xp.exp(s - c.lse[b, h][:, None]))
    dp = dout4[b, h] @ c.v[b, h].T
    if z is not None:
        bh = b * c.q.shape[1] + h
        dp = dp * _kernels(c.q).fill_dropout_multipliers(c.seed, c.dropout_p, z, bh)[0, 0]
    return (p * (dp - delta[b, h])).astype(c.q.dtype)
