"""Differentiable scaled-dot-product attention (``F.scaled_dot_product_attention``), one
autograd op over ``nnkit.kernels.attention``'s fused forward/backward pair, and the
sinusoidal positional encoding (``F.sinusoidal_positional_encoding``).
"""

from __future__ import annotations

import numbers

import numpy as np
from numpy.typing import DTypeLike

from .._random import get_rng
from .._types import Array
from .._validation import check_scalar
from ..autograd import Tensor, apply_op, as_tensor
from ..kernels import attention as K

__all__ = ["scaled_dot_product_attention", "sinusoidal_positional_encoding"]


def scaled_dot_product_attention(query: Tensor | Array, key: Tensor | Array, value: Tensor | Array,
                                 attn_mask: Tensor | Array | None = None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: float | None = None,
                                 ) -> Tensor:
    """softmax(query key^T * scale + attn_mask) value, fused (torch's semantics).

    Parameters
    ----------
    query : Tensor or array (..., L, E), float32 or float64
    key : Tensor or array (..., S, E), same dtype; batch dims broadcast against query's
    value : Tensor or array (..., S, Ev), same dtype
    attn_mask : Tensor or array broadcastable to (batch..., L, S), optional
        bool: True = the key takes part; float (the query's dtype): added to the scores
        (use -inf to exclude). A float mask that requires grad receives dL/dscores.
    dropout_p : float in [0, 1)
        Probability of dropping an attention weight (applied whenever > 0, as torch; pass
        0.0 in evaluation). Seeds are drawn from nnkit's generator (``nk.manual_seed``).
    is_causal : bool
        Key j takes part for query i iff j <= i (torch's ``ones(L, S).tril()``). May be
        combined with ``attn_mask`` (torch refuses the combination).
    scale : float or None (1/sqrt(E))

    Returns
    -------
    Tensor (batch..., L, Ev), differentiable in query, key, value (and a float attn_mask).
    Rows where no key takes part are 0 (as torch's CPU kernel), with zero gradients.
    The (L, S) matrix is never materialised, in the forward or the backward (except for
    the gradient of a mask that requires grad, which has that shape itself).

    Examples
    --------
    >>> import numpy as np
    >>> from nnkit.functional.attention import scaled_dot_product_attention
    >>> q = np.zeros((1, 2, 4)); kv = np.eye(3, 4)[None]  # (1, 3, 4)
    >>> scaled_dot_product_attention(q, kv, kv).numpy()[0, 0].round(3).tolist()
    [0.333, 0.333, 0.333, 0.0]
    """
    q, k, v = (as_tensor(query, name="query"), as_tensor(key, name="key"),
               as_tensor(value, name="value"))
    mask = None if attn_mask is None else as_tensor(attn_mask, name="attn_mask")
    seed = None
    if dropout_p is not None and not isinstance(dropout_p, bool) and isinstance(
            dropout_p, numbers.Real) and dropout_p > 0:
        seed = int(get_rng().integers(0, 2**63 - 1))
    return apply_op("scaled_dot_product_attention", K.attention_forward, K.attention_backward,
                    (q, k, v, mask), is_causal, scale, dropout_p, seed)


_MAX_ENCODING = 2**31 - 1  # entries of one encoding (16 GiB in float64)


def sinusoidal_positional_encoding(T: int, d: int, base: float = 10000.0,
                                   dtype: DTypeLike = np.float32) -> Tensor:
    """The sinusoidal positional encoding of Vaswani et al. (2017), (T, d).

        p[t, 2i] = sin(t / base^(2i/d)),   p[t, 2i+1] = cos(t / base^(2i/d))

    (notes §6.3 writes omega_k = C^(k/d); the frequency is the
    reciprocal, base^(-2i/d), shared by the pair of columns 2i and 2i+1, as in the paper).
    Odd ``d`` works: the last column is a sine.

    Parameters
    ----------
    T : int >= 0, number of positions t = 0..T-1
    d : int >= 0, encoding size
    base : float > 0 (10000 in the paper)
    dtype : float32 (default) or float64; computed in float64, then rounded

    Returns
    -------
    Tensor (T, d), not requiring grad.

    Examples
    --------
    >>> from nnkit.functional.attention import sinusoidal_positional_encoding
    >>> sinusoidal_positional_encoding(2, 4, dtype=float).numpy()[1].round(4).tolist()
    [0.8415, 0.5403, 0.01, 1.0]
    """
    T = check_scalar(T, name="T", kind=numbers.Integral, low=0)
    d = check_scalar(d, name="d", kind=numbers.Integral, low=0)
    if T * d > _MAX_ENCODING:
        raise ValueError(f"T={T} positions of d={d} features make {T * d} entries, more than "
                         f"{_MAX_ENCODING} (2**31 - 1); encode fewer positions")
    base = check_scalar(base, name="base", low=0.0, low_inclusive=False)
    try:
        known = dtype is not None and np.dtype(dtype) in (np.dtype(np.float32),
                                                         np.dtype(np.float64))
    except TypeError:  # not a dtype at all ('foo', an object)
        known = False
    if not known:
        raise TypeError(f"dtype must be float32 or float64, got {dtype!r:.60}")
    t = np.arange(T, dtype=np.float64)[:, None]  # (T, 1)
    two_i = (np.arange(d) // 2 * 2).astype(np.float64)  # (d,): 2i for columns 2i and 2i+1
    angle = t / np.power(float(base), two_i / d) if d > 0 else np.zeros((T, 0))  # (T, d)
    enc = np.where(np.arange(d) % 2 == 0, np.sin(angle), np.cos(angle))
    return Tensor(enc.astype(dtype))
