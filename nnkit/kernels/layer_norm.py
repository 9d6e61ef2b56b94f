"""Layer normalisation: validated forward/backward with CPU/CUDA dispatch.

``layer_norm_forward`` normalises over the trailing ``len(normalized_shape)`` axes of ``x``
(biased variance, torch's ``layer_norm`` semantics) and returns ``(y, cache)``, the cache
holding x, the per-row ``mean`` and ``rstd`` it used and the weight;
``layer_norm_backward(dy, cache, needs=None)`` returns (dx, dweight, dbias), None for
those ``needs`` says are not wanted. NumPy arrays run on
``nnkit._ext.layer_norm_cpu`` (Numba, parallel over rows), GPU arrays (CuPy) on
``nnkit._ext.layer_norm_cuda`` (chosen by ``nnkit._backend.kernels_for``). Both accumulate
in float64; see those modules for the numerics and the deterministic reduction of
dweight/dbias.
"""

from __future__ import annotations

import math
import numbers
from typing import NamedTuple

import numpy as np

from .._backend import array_module, backend, is_gpu_array, kernels_for
from .._types import Array, Needs
from .._validation import (
    FLOATS,
    check_array,
    check_cache,
    check_grad,
    check_same_device,
    check_same_dtype,
    check_scalar,
)

__all__ = ["LayerNormCache", "layer_norm_forward", "layer_norm_backward"]


class LayerNormCache(NamedTuple):
    """What ``layer_norm_backward`` reads."""

    x: object  # the input, C-contiguous (..., *normalized_shape)
    mean: object  # (...,) x's dtype
    rstd: object  # (...,) 1 / sqrt(var + eps)
    weight: object  # normalized_shape, C-contiguous, or None (1)
    has_bias: bool  # whether a dbias is wanted


def _check_normalized_shape(normalized_shape) -> tuple[int, ...]:
    if isinstance(normalized_shape, (numbers.Integral, np.integer)) and not isinstance(
        normalized_shape, (bool, np.bool_)
    ):
        shape = (normalized_shape,)
    elif isinstance(normalized_shape, (tuple, list)):
        shape = tuple(normalized_shape)
    else:
        raise TypeError(
            f"normalized_shape must be an int or a tuple of ints, got {normalized_shape!r} "
            f"({type(normalized_shape).__name__})"
        )
    if not shape:
        raise ValueError("normalized_shape must have at least one dimension, got ()")
    for n in shape:
        check_scalar(n, name="normalized_shape entries", kind=numbers.Integral, low=0)
    return tuple(int(n) for n in shape)


def _check_param(p, name, shape, x):
    """weight/bias: None, or an array of ``shape`` with x's dtype on x's device."""
    if p is None:
        return None
    p = check_array(p, name=name, dtype=FLOATS)
    check_same_device(p, x, name=name)
    if tuple(p.shape) != shape:
        raise ValueError(
            f"{name} must have shape normalized_shape={shape}, got shape {tuple(p.shape)}"
        )
    return check_same_dtype(p, x, name=name)


def _kernels(x):
    """(kernel module, array module) for x: numpy + layer_norm_cpu, or cupy + layer_norm_cuda."""
    xp = array_module(x)
    if is_gpu_array(x) and xp is np:
        raise TypeError(
            f"GPU arrays must be CuPy arrays here, got {type(x).__name__}; wrap it with "
            "cupy.asarray(x)"
        )
    return kernels_for("layer_norm_cpu", "layer_norm_cuda", x), xp


def layer_norm_forward(x: Array, weight: Array | None, bias: Array | None,
                       normalized_shape: int | tuple[int, ...], eps: float = 1e-5,
                       ) -> tuple[Array, LayerNormCache]:
    """Layer normalisation over the trailing axes of ``x`` (Ba et al. 2016; torch semantics).

    With the statistics taken over the trailing ``len(normalized_shape)`` axes::

        y = (x - mean) / sqrt(var + eps) * weight + bias,   var biased (divides by D)

    Parameters
    ----------
    x : ndarray (..., *normalized_shape), float32 or float64
        NumPy array (CPU kernels) or CuPy array (CUDA kernels).
    weight, bias : ndarray of shape normalized_shape, x's dtype, or None
        Elementwise affine parameters; None means 1 and 0.
    normalized_shape : int or tuple of int
        The trailing shape of ``x`` to normalise over.
    eps : float
        Added to the variance; finite and > 0.

    The differentiable inputs come first, the options after them (the order of every
    ``nk.kernels`` forward); torch's ``F.layer_norm`` puts normalized_shape second.

    Returns
    -------
    y : ndarray, shape and dtype of x
    cache : LayerNormCache
        For ``layer_norm_backward``; its ``mean`` and ``rstd`` (x.shape[:-len(
        normalized_shape)], x's dtype) are the row mean and 1 / sqrt(var + eps).

    Examples
    --------
    >>> import numpy as np
    >>> from nnkit.kernels import layer_norm_forward
    >>> y, cache = layer_norm_forward(np.array([[1.0, 2.0, 3.0]]), None, None, 3)
    >>> np.round(y, 4), cache.mean
    (array([[-1.2247,  0.    ,  1.2247]]), array([2.]))
    """
    shape = _check_normalized_shape(normalized_shape)
    x = check_array(x, name="x", dtype=FLOATS)
    k = len(shape)
    if x.ndim < k or tuple(x.shape[x.ndim - k:]) != shape:
        raise ValueError(
            f"x has shape {tuple(x.shape)} but normalized_shape={shape}: the trailing {k} "
            f"axes of x must equal normalized_shape, i.e. x of shape (..., "
            f"{', '.join(str(n) for n in shape)})"
        )
    weight = _check_param(weight, "weight", shape, x)
    bias = _check_param(bias, "bias", shape, x)
    eps = float(check_scalar(eps, name="eps", low=0, low_inclusive=False))
    kernels, xp = _kernels(x)  # x, weight and bias are C-contiguous (check_array)

    batch = tuple(x.shape[: x.ndim - k])
    M, D = math.prod(batch), math.prod(shape)
    x2 = x.reshape(M, D)  # (M, D), a view of the contiguous x
    y = xp.empty((M, D), dtype=x.dtype)
    mean = xp.empty(M, dtype=x.dtype)
    rstd = xp.empty(M, dtype=x.dtype)
    if D == 0:  # torch: mean 0, rstd NaN (the variance of nothing)
        mean[...] = 0
        rstd[...] = math.nan
    else:
        w = xp.ones(D, dtype=x.dtype) if weight is None else weight.reshape(D)
        b = xp.zeros(D, dtype=x.dtype) if bias is None else bias.reshape(D)
        kernels.layer_norm_rows(x2, w, b, eps, y, mean, rstd)
    cache = LayerNormCache(x, mean.reshape(batch), rstd.reshape(batch), weight,
                           bias is not None)
    return y.reshape(x.shape), cache


def layer_norm_backward(dy: Array, cache: LayerNormCache, needs: Needs = None,
                        ) -> tuple[Array | None, Array | None, Array | None]:
    """Gradients of ``layer_norm_forward``: (dx, dweight, dbias).

    With xhat = (x - mean) * rstd and g = dy * weight, over the normalised axes::

        dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
        dweight = sum over the leading axes of dy * xhat;   dbias = sum of dy

    Parameters
    ----------
    dy : ndarray, the upstream gradient, x's shape, dtype and device
    cache : LayerNormCache from ``layer_norm_forward``
    needs : tuple of 3 bool, optional
        Which of (x, weight, bias) want a gradient (``nnkit.autograd.apply_op``'s mask);
        the others are None and dweight/dbias are not summed. None: all.

    Returns
    -------
    dx : ndarray, shape and dtype of x, or None
    dweight, dbias : ndarray of shape normalized_shape, or None
        None also when the forward had no weight (resp. bias).

    Examples
    --------
    >>> import numpy as np
    >>> from nnkit.kernels import layer_norm_backward, layer_norm_forward
    >>> x = np.array([[1.0, 2.0, 4.0]]); w = np.ones(3); b = np.zeros(3)
    >>> y, cache = layer_norm_forward(x, w, b, 3)
    >>> dx, dw, db = layer_norm_backward(np.ones_like(x), cache)
    >>> np.allclose(dx, 0), db
    (True, array([1., 1., 1.]))
    """
    x, mean, rstd, weight, has_bias = check_cache(cache, LayerNormCache,
                                                  forward="layer_norm_forward")
    need_x, need_w, need_b = (True, True, True) if needs is None else needs
    dy = check_grad(dy, shape=x.shape, dtype=x.dtype, device=backend(x))
    kernels, xp = _kernels(x)  # dy is C-contiguous (check_grad)
    nb = mean.ndim
    shape = tuple(x.shape[nb:])  # normalized_shape
    M, D = math.prod(x.shape[:nb]), math.prod(shape)
    dx = xp.empty((M, D), dtype=x.dtype)
    dweight = xp.empty(D, dtype=x.dtype) if weight is not None and need_w else None
    dbias = xp.empty(D, dtype=x.dtype) if has_bias and need_b else None
    if D > 0:
        w = xp.ones(D, dtype=x.dtype) if weight is None else weight.reshape(D)
        kernels.layer_norm_backward_rows(
            dy.reshape(M, D), x.reshape(M, D), mean.reshape(M), rstd.reshape(M), w, dx,
            dweight, dbias,
        )
    return (dx.reshape(x.shape) if need_x else None,
            None if dweight is None else dweight.reshape(shape),
            None if dbias is None else dbias.reshape(shape))
