"""Core differentiable functions: activations, softmax and losses, layer norm, linear, dropout,
embedding (re-exported by ``nnkit.functional``)."""

from __future__ import annotations

import numbers
from typing import Literal

import numpy as np

from .. import kernels
from .._backend import array_module, kernels_for, matmul
from .._random import get_rng
from .._types import Array
from .._validation import (
    axis_or_dim,
    check_array,
    check_bool,
    check_choice,
    check_real,
    check_scalar,
    describe_dtype,
)
from ..autograd import Tensor, _conj, apply_op, as_tensor, unbroadcast

__all__ = [
    "linear",
    "sigmoid",
    "tanh",
    "relu",
    "gelu",
    "softmax",
    "log_softmax",
    "cross_entropy",
    "mse_loss",
    "binary_cross_entropy_with_logits",
    "layer_norm",
    "dropout",
    "embedding",
]

_REDUCTIONS = ("mean", "sum", "none")
Reduction = Literal["mean", "sum", "none"]


def _float_tensor(x, name: str) -> Tensor:
    t = as_tensor(x, name=name)
    if t.dtype.kind not in "fc":
        raise TypeError(f"{name} must be a floating-point array or Tensor, got dtype {t.dtype}")
    return t


def _real_tensor(x, name: str, op: str) -> Tensor:
    """``x`` as a real floating-point Tensor, for ``op``s undefined on complex numbers."""
    return check_real(_float_tensor(x, name), name=name, op=op)


def _same_dtype(t: Tensor, name: str, weight: Tensor) -> None:
    """linear's operands have one dtype: torch refuses to mix precisions or real and
    complex, and a silent promotion would give a float32 model float64 gradients."""
    if t.dtype != weight.dtype:
        raise TypeError(
            f"linear: {name} has dtype {describe_dtype(t.dtype)} but weight has dtype "
            f"{describe_dtype(weight.dtype)}; they "
            f"must have the same dtype (cast {name} or weight with .astype, or a module "
            "with .float() / .double())"
        )


def _reduce(loss: Tensor, reduction: str) -> Tensor:
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    return loss


def linear(x: Tensor | Array, weight: Tensor | Array, bias: Tensor | Array | None = None) -> Tensor:
    """y = x @ weight.T + bias.

    Parameters
    ----------
    x : Tensor (..., in_features)
    weight : Tensor (out_features, in_features)
    bias : Tensor (out_features,) or None

    One dtype for all three, as torch (a mix is a TypeError). Complex gradients follow
    the conjugate convention: dx = g conj(W), dW = g^T conj(x), as ``x @ weight.T``.

    Returns
    -------
    Tensor (..., out_features)
    """
    x, weight = _float_tensor(x, "x"), _float_tensor(weight, "weight")
    _same_dtype(x, "x", weight)
    if weight.ndim != 2:
        raise ValueError(f"weight must be 2-D (out_features, in_features), got {weight.shape}")
    if x.ndim == 0 or x.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"x has shape {x.shape} but weight has shape {weight.shape}: the last axis of x "
            f"must have in_features={weight.shape[1]} entries"
        )
    if bias is not None:
        bias = _float_tensor(bias, "bias")
        _same_dtype(bias, "bias", weight)
        if bias.shape != (weight.shape[0],):
            raise ValueError(f"bias must have shape ({weight.shape[0]},), got {bias.shape}")
    return apply_op("linear", _linear_forward, _linear_backward, (x, weight, bias))


def _linear_forward(xd, wd, bd):
    x2 = xd.reshape(-1, xd.shape[-1])  # (M, in): one BLAS call for any leading shape
    y = matmul(x2, wd.T).reshape(xd.shape[:-1] + (wd.shape[0],))
    if bd is not None:
        y += bd
    return y, (x2, wd, xd.shape)


def _linear_backward(g, cache, needs):
    x2, wd, x_shape = cache
    g2 = g.reshape(-1, g.shape[-1])  # (M, out)
    gx = matmul(g2, _conj(wd)).reshape(x_shape) if needs[0] else None  # none for data
    gw = matmul(g2.T, _conj(x2)) if needs[1] else None  # (out, in)
    return gx, gw, g2.sum(axis=0) if needs[2] else None


def sigmoid(x: Tensor | Array) -> Tensor:
    """1 / (1 + exp(-x)), computed without overflow for real x; complex x as torch."""
    return _float_tensor(x, "x").sigmoid()


def tanh(x: Tensor | Array) -> Tensor:
    return _float_tensor(x, "x").tanh()


def relu(x: Tensor | Array) -> Tensor:
    """max(x, 0), as torch: relu(-inf) = 0 and NaN stays NaN; the gradient is 0 where
    x <= 0 and the upstream one elsewhere (NaN included), as torch's threshold_backward
    (``Tensor.relu``)."""
    return _real_tensor(x, "x", "relu").relu()


def gelu(x: Tensor | Array, approximate: Literal["none", "tanh"] = "none") -> Tensor:
    """x * Phi(x) (Phi the standard normal CDF), or its tanh approximation.

    approximate='tanh': 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), as torch.
    """
    check_choice(approximate, name="approximate", choices=("none", "tanh"))
    x = _real_tensor(x, "x", "gelu")
    # the fused kernels: one pass (or one launch) each way, either form
    return apply_op("gelu", kernels.gelu_forward, kernels.gelu_backward, (x,), approximate)


def softmax(x: Tensor | Array, dim: int | None = None, *, axis: int | None = None) -> Tensor:
    """exp(x - max) / sum exp(x - max) along ``dim`` (torch's name) or ``axis`` (NumPy's),
    -1 by default (fused kernel, forward and backward)."""
    axis = axis_or_dim(axis, dim, default=-1, op="softmax")
    x = _real_tensor(x, "x", "softmax")
    return apply_op("softmax", kernels.softmax_forward, kernels.softmax_backward, (x,), axis)


def log_softmax(x: Tensor | Array, dim: int | None = None, *, axis: int | None = None) -> Tensor:
    """x - logsumexp(x) along ``dim`` (torch's name) or ``axis`` (NumPy's), -1 by default
    (fused kernel, forward and backward)."""
    axis = axis_or_dim(axis, dim, default=-1, op="log_softmax")
    x = _real_tensor(x, "x", "log_softmax")
    return apply_op("log_softmax", kernels.log_softmax_forward, kernels.log_softmax_backward,
                    (x,), axis)


def _check_target(target, n: int, name="target"):
    target = check_array(target, name=name, ndim=1)
    if target.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integer class indices, got dtype {target.dtype}")
    if target.shape[0] != n:
        raise ValueError(f"{name} has {target.shape[0]} entries but the input has {n} rows")
    return target


def cross_entropy(logits: Tensor | Array, target: Array, ignore_index: int = -100,
                  reduction: Reduction = "mean") -> Tensor:
    """Cross-entropy of class ``target`` under softmax(``logits``), torch's ``cross_entropy``.

    Parameters
    ----------
    logits : Tensor (N, C) float
    target : array (N,) int, class indices in [0, C) or ``ignore_index``
    ignore_index : int
        Rows with this target contribute nothing and are not counted in the mean.
    reduction : {'mean', 'sum', 'none'}
        'mean' (the fused kernel) averages over the non-ignored rows (NaN if there are
        none, as torch); 'none' returns the (N,) per-row losses (0 where ignored).

    On the GPU (CuPy logits and target) the 'mean' loss stays on the device: no value is
    copied to the host, so a target outside [0, C) gives a NaN loss instead of a
    ValueError (torch reports it by a device-side assert).
    """
    check_choice(reduction, name="reduction", choices=_REDUCTIONS)
    check_scalar(ignore_index, name="ignore_index", kind=numbers.Integral, low=-(2**63),
                 high=2**63 - 1)
    logits = _real_tensor(logits, "logits", "cross_entropy")
    if logits.ndim != 2:
        raise ValueError(f"logits must be 2-D (N, C), got shape {logits.shape}")
    target = _check_target(target, logits.shape[0])
    if reduction == "mean":  # the fused kernels; on the GPU without a host round trip
        return apply_op("cross_entropy", kernels.cross_entropy_forward,
                        kernels.cross_entropy_backward, (logits,), target, int(ignore_index))
    xp = array_module(logits.data)
    valid = target != ignore_index
    if bool((valid & ((target < 0) | (target >= logits.shape[1]))).any()):
        bad = target[valid & ((target < 0) | (target >= logits.shape[1]))][0]
        raise ValueError(
            f"target holds class {bad}, outside [0, {logits.shape[1]}) for C={logits.shape[1]}"
        )
    rows = xp.arange(logits.shape[0])
    picked = log_softmax(logits)[rows, xp.where(valid, target, 0)]
    per_row = -picked * valid.astype(logits.dtype)
    return _reduce(per_row, reduction)


def mse_loss(pred: Tensor | Array, target: Tensor | Array, reduction: Reduction = "mean") -> Tensor:
    """Mean (or sum, or elementwise) squared error; shapes must match or broadcast."""
    check_choice(reduction, name="reduction", choices=_REDUCTIONS)
    pred = _real_tensor(pred, "pred", "mse_loss")
    target = check_real(as_tensor(target, like=pred, name="target"), name="target",
                        op="mse_loss")
    try:
        np.broadcast_shapes(pred.shape, target.shape)
    except ValueError:
        raise ValueError(
            f"pred has shape {pred.shape} and target has shape {target.shape}: they do not "
            "broadcast"
        ) from None
    diff = pred - target
    return _reduce(diff * diff, reduction)


def binary_cross_entropy_with_logits(logits: Tensor | Array, target: Tensor | Array,
                                     weight: Tensor | Array | None = None,
                                     pos_weight: Tensor | Array | None = None,
                                     reduction: Reduction = "mean") -> Tensor:
    """-[p y log sigmoid(x) + (1 - y) log(1 - sigmoid(x))] computed stably, as torch.

    ``weight`` multiplies each element's loss; ``pos_weight`` (p, broadcast along the last
    axis) weights the positive term. The gradient with respect to the logits is
    ``sigmoid(x) (p y + 1 - y) - p y`` times the weight.
    """
    check_choice(reduction, name="reduction", choices=_REDUCTIONS)
    op = "binary_cross_entropy_with_logits"
    x = _real_tensor(logits, "logits", op)
    if target is None:
        raise TypeError(f"{op}: target must be an array of probabilities of the logits' "
                        "shape, got None")
    for name, value in (("target", target), ("weight", weight), ("pos_weight", pos_weight)):
        if value is not None:
            check_real(as_tensor(value, name=name), name=name, op=op)
    xd = x.data
    xp = array_module(xd)
    y = xp.asarray(target.data if isinstance(target, Tensor) else target, dtype=x.dtype)
    if y.shape != x.shape:
        raise ValueError(f"target has shape {y.shape} but logits have shape {x.shape}")
    p = 1.0 if pos_weight is None else xp.asarray(getattr(pos_weight, "data", pos_weight),
                                                    dtype=xd.dtype)
    w = 1.0 if weight is None else xp.asarray(getattr(weight, "data", weight), dtype=xd.dtype)
    for name, value in (("weight", w), ("pos_weight", p)):
        if np.ndim(value) and not _broadcasts_to(value.shape, x.shape):
            raise ValueError(f"{op}: {name} has shape {value.shape}, which does not "
                             f"broadcast to the logits' shape {x.shape}")
    per_elem = apply_op("bce_with_logits", _bce_forward, _bce_backward, (x,), y, p, w)
    return _reduce(per_elem, reduction)


def _bce_forward(xd, y, p, w):
    """Per-element losses (the shape of the logits ``xd``) and what the backward reads."""
    xp = array_module(xd)
    coef = p * y + 1 - y
    # log(1 + exp(-|x|)) + max(-x, 0) = -log sigmoid(x), without overflow
    softplus_neg = xp.log1p(xp.exp(-xp.abs(xd))) + xp.maximum(-xd, 0)
    loss = w * ((1 - y) * xd + coef * softplus_neg)
    sig = kernels_for("elementwise_cpu", "elementwise_cuda", xd).expit(xd)
    return xp.asarray(loss, dtype=xd.dtype), (sig, coef, w, p, y, xd.shape)


def _bce_backward(g, cache, needs):
    sig, coef, w, p, y, shape = cache
    return unbroadcast(g * w * (sig * coef - p * y), shape)


def _broadcasts_to(shape, target) -> bool:
    try:
        return np.broadcast_shapes(shape, target) == tuple(target)
    except ValueError:
        return False


def layer_norm(x: Tensor | Array, normalized_shape: int | tuple[int, ...],
               weight: Tensor | Array | None = None, bias: Tensor | Array | None = None,
               eps: float = 1e-5) -> Tensor:
    """(x - mean) / sqrt(var + eps) * weight + bias over the trailing ``normalized_shape``.

    Parameters
    ----------
    x : Tensor (..., *normalized_shape)
    weight, bias : Tensor of shape ``normalized_shape`` or None
    """
    x = _real_tensor(x, "x", "layer_norm")
    w = _real_tensor(weight, "weight", "layer_norm") if weight is not None else None
    b = _real_tensor(bias, "bias", "layer_norm") if bias is not None else None

    return apply_op("layer_norm", kernels.layer_norm_forward, kernels.layer_norm_backward,
                    (x, w, b), normalized_shape, eps)


def dropout(x: Tensor | Array, p: float = 0.5, training: bool = True,
            rng: int | np.random.Generator | None = None) -> Tensor:
    """Zero each element with probability ``p`` and scale the rest by 1/(1-p) (training only).

    ``rng`` defaults to nnkit's global generator (``nk.manual_seed``). One seed is taken
    from it per call, and element i's draw is a splitmix64 hash of that seed and i
    (``kernels.dropout_forward``, one parallel pass making the mask and the output; on the
    GPU one launch, drawing on the device: no host mask, no copy): reproducible under
    ``nk.manual_seed``, and the same mask on either device.
    """
    check_scalar(p, name="p", low=0.0, high=1.0)
    training = check_bool(training, name="training")
    x = _float_tensor(x, "x")
    if not training or p == 0.0:
        return x  # as torch: the identity, complex too
    check_real(x, name="x", op="dropout")
    xp = array_module(x.data)
    if p == 1.0:
        return x * xp.zeros_like(x.data)
    seed = int(get_rng(rng, "rng").integers(0, 2**63 - 1))
    return apply_op("dropout", kernels.dropout_forward, kernels.dropout_backward, (x,), p, seed)


def embedding(ids: Array, weight: Tensor | Array) -> Tensor:
    """Rows of ``weight`` (num_embeddings, dim) picked by integer ``ids`` (any shape)."""
    weight = _float_tensor(weight, "weight")
    ids = check_array(ids, name="ids", contiguous=False)
    if ids.dtype.kind not in "iu":
        raise TypeError(f"ids must be integer token indices, got dtype {ids.dtype}")
    if weight.ndim != 2:
        raise ValueError(f"weight must be 2-D (num_embeddings, embedding_dim), got shape "
                         f"{weight.shape}")
    n = weight.shape[0]
    if ids.size and (ids.min() < 0 or ids.max() >= n):
        raise ValueError(
            f"ids must lie in [0, {n}) for num_embeddings={n}; got values in "
            f"[{ids.min()}, {ids.max()}]"
        )
    return weight[ids]

