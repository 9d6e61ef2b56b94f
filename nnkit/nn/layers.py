"""Basic layers: Linear, Embedding, LayerNorm, Dropout, activations, Flatten, Identity,
Residual. Constructor arguments, parameter names, shapes and default initialisation
are torch's, so ``load_state_dict(torch_module.state_dict())`` works."""

from __future__ import annotations

import math
import numbers

import numpy as np

from .. import functional as F
from .._backend import array_module, is_gpu_array
from .._budget import ensure_room
from .._validation import axis_or_dim, check_choice, check_input_dtype, check_scalar
from ..autograd import Tensor, as_tensor
from . import init
from .module import Module, Parameter

__all__ = [
    "Linear",
    "Embedding",
    "LayerNorm",
    "Dropout",
    "ReLU",
    "Sigmoid",
    "Tanh",
    "GELU",
    "Softmax",
    "Flatten",
    "Identity",
    "Residual",
]


def _dtype(dtype):
    dtype = np.dtype(np.float32 if dtype is None else dtype)
    if dtype.kind != "f":
        raise TypeError(f"dtype must be float32 or float64, got {dtype}")
    return dtype


def _add_weight_and_bias(module: Module, weight_shape: tuple, bias: bool, dtype) -> None:
    """Registers ``module.weight`` (weight_shape) and ``module.bias`` (weight_shape[0],), or
    a None bias; the caller's ``reset_parameters`` fills them."""
    module.weight = Parameter.empty(weight_shape, dtype)
    if bias:
        module.bias = Parameter.empty(weight_shape[0], dtype)
    else:
        module.register_parameter("bias", None)


def _check_size(value, name):
    return check_scalar(value, name=name, kind=numbers.Integral, low=1)


class Linear(Module):
    """y = x W^T + b.

    Parameters
    ----------
    in_features, out_features : int
    bias : bool
    dtype : float32 (default) or float64

    Attributes
    ----------
    weight : Parameter (out_features, in_features), U(-1/sqrt(in), 1/sqrt(in)) as torch
    bias : Parameter (out_features,) or None, same distribution

    Examples
    --------
    >>> import nnkit as nk
    >>> layer = nk.nn.Linear(3, 2)
    >>> layer(nk.tensor([[1.0, 2.0, 3.0]])).shape
    (1, 2)
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, dtype=None):
        super().__init__()
        self.in_features = _check_size(in_features, "in_features")
        self.out_features = _check_size(out_features, "out_features")
        dtype = _dtype(dtype)
        _add_weight_and_bias(self, (out_features, in_features), bias, dtype)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1 / math.sqrt(self.in_features)
            init.uniform_(self.bias, -bound, bound)

    def forward(self, x):
        x = as_tensor(x)
        if x.ndim == 0 or x.shape[-1] != self.in_features:
            raise ValueError(
                f"x has shape {x.shape} but {type(self).__name__} was built with "
                f"in_features={self.in_features}; expected shape (..., {self.in_features})"
            )
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}")


class Embedding(Module):
    """A lookup table: ``weight[ids]``; weight (num_embeddings, embedding_dim) ~ N(0, 1).

    ``padding_idx``: that row starts at zero and gets no gradient, as torch.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx=None, dtype=None):
        super().__init__()
        self.num_embeddings = _check_size(num_embeddings, "num_embeddings")
        self.embedding_dim = _check_size(embedding_dim, "embedding_dim")
        if padding_idx is not None:
            check_scalar(padding_idx, name="padding_idx", kind=numbers.Integral,
                         low=-num_embeddings, high=num_embeddings - 1)
            padding_idx = padding_idx % num_embeddings
        self.padding_idx = padding_idx
        self.weight = Parameter.empty((num_embeddings, embedding_dim), _dtype(dtype))
        init.normal_(self.weight)
        if padding_idx is not None:
            self.weight.data[padding_idx] = 0

    def forward(self, ids):
        out = F.embedding(ids, self.weight)
        if self.padding_idx is not None and out.requires_grad:
            ids = ids if is_gpu_array(ids) else np.asarray(ids)
            keep = (ids != self.padding_idx)[..., None].astype(out.dtype)
            out = out * keep + out.detach() * (1 - keep)
        return out

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}"


class LayerNorm(Module):
    """Layer normalisation over the trailing ``normalized_shape`` (weight 1, bias 0)."""

    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True,
                 bias: bool = True, dtype=None):
        super().__init__()
        if isinstance(normalized_shape, numbers.Integral):
            normalized_shape = (normalized_shape,)
        if not isinstance(normalized_shape, (tuple, list)):
            raise TypeError(f"normalized_shape must be an int or a tuple of ints, got "
                            f"{normalized_shape!r}")
        self.normalized_shape = tuple(
            int(check_scalar(n, name="normalized_shape entries", kind=numbers.Integral, low=0))
            for n in normalized_shape)
        self.eps = check_scalar(eps, name="eps", low=0.0, low_inclusive=False)
        self.elementwise_affine = elementwise_affine
        dtype = _dtype(dtype)
        if elementwise_affine:
            ensure_room(self.normalized_shape, dtype, f"normalized_shape={self.normalized_shape}")
            self.weight = Parameter(np.ones(self.normalized_shape, dtype=dtype))
            if bias:
                self.bias = Parameter(np.zeros(self.normalized_shape, dtype=dtype))
            else:
                self.register_parameter("bias", None)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)

    def forward(self, x):
        x = as_tensor(x)
        if self.weight is not None and x.dtype.kind == "f":
            check_input_dtype(x, self.weight.dtype, name="x", owner="LayerNorm")
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}"


class Dropout(Module):
    """Inverted dropout with probability ``p`` in training mode; identity in eval mode."""

    def __init__(self, p: float = 0.5):
        super().__init__()
        self.p = check_scalar(p, name="p", low=0.0, high=1.0)

    def forward(self, x):
        return F.dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"


class ReLU(Module):
    def forward(self, x):
        return F.relu(x)


class Sigmoid(Module):
    def forward(self, x):
        return F.sigmoid(x)


class Tanh(Module):
    def forward(self, x):
        return F.tanh(x)


class GELU(Module):
    def __init__(self, approximate: str = "none"):
        super().__init__()
        self.approximate = check_choice(approximate, name="approximate", choices=("none", "tanh"))

    def forward(self, x):
        return F.gelu(x, self.approximate)


class Softmax(Module):
    """Softmax along ``dim`` (torch's name; NumPy's ``axis`` is accepted too)."""

    def __init__(self, dim: int | None = None, *, axis: int | None = None):
        super().__init__()
        self.dim = axis_or_dim(axis, dim, default=-1, op="Softmax")

    def forward(self, x):
        return F.softmax(x, axis=self.dim)


class Flatten(Module):
    """Merge axes ``start_dim..end_dim`` (default: all but the batch axis), as torch.

    ``start_dim`` must not come after ``end_dim``: when both have one sign that is checked
    here, otherwise (and the range of both) against each input's ndim.
    """

    def __init__(self, start_dim: int = 1, end_dim: int = -1):
        super().__init__()
        check_scalar(start_dim, name="start_dim", kind=numbers.Integral)
        check_scalar(end_dim, name="end_dim", kind=numbers.Integral)
        if (start_dim < 0) == (end_dim < 0) and start_dim > end_dim:
            raise ValueError(f"Flatten: start_dim={start_dim} comes after end_dim={end_dim}, "
                             f"for an input of any ndim; Flatten merges dims start_dim.."
                             f"end_dim, so pass start_dim <= end_dim")
        self.start_dim, self.end_dim = int(start_dim), int(end_dim)

    def forward(self, x):
        x = as_tensor(x)
        nd, start, end = x.ndim, self.start_dim, self.end_dim
        if nd and -nd <= start < nd and -nd <= end < nd and start % nd > end % nd:
            def dim(name, d):  # 'end_dim=-3 (dim 1)'
                return f"{name}={d}" + (f" (dim {d % nd})" if d < 0 else "")
            raise ValueError(f"Flatten: {dim('start_dim', start)} comes after "
                             f"{dim('end_dim', end)} for an input of shape {x.shape} "
                             f"({nd}-dimensional); expected start_dim <= end_dim")
        return x.flatten(start, end)  # out-of-range dims: its message names them


class Identity(Module):
    def forward(self, x):
        return as_tensor(x)


class Residual(Module):
    """The residual layer of notes §2.3: x -> P x + (fn(x) - fn(0)), so zero weights give
    P x.

    With ``projection=None``, P is the identity (input and output sizes must agree); a
    ``projection`` module (e.g. ``Linear(n, m, bias=False)``, V of notes §2.3) maps
    dimensions. With ``subtract_origin=False`` it is the usual x -> P x + fn(x).

    Examples
    --------
    >>> import nnkit as nk
    >>> block = nk.nn.Residual(nk.nn.Sequential(nk.nn.Linear(4, 4), nk.nn.Sigmoid()))
    >>> for p in block.parameters():
    ...     p.data[...] = 0
    >>> x = nk.tensor([[1.0, 2.0, 3.0, 4.0]])
    >>> bool((block(x).numpy() == x.numpy()).all())  # F[0, 0] = Id
    True
    """

    def __init__(self, fn: Module, projection: Module | None = None,
                 subtract_origin: bool = True):
        super().__init__()
        self.fn = fn
        self.projection = projection
        self.subtract_origin = subtract_origin

    def forward(self, x):
        x = as_tensor(x)
        skip = x if self.projection is None else self.projection(x)
        out = self.fn(x)
        if self.subtract_origin:
            out = out - self.fn(Tensor(array_module(x.data).zeros_like(x.data)))  # fn(0)
        if out.shape[-1] != skip.shape[-1]:
            raise ValueError(
                f"Residual: fn gives {out.shape[-1]} features but the skip path has "
                f"{skip.shape[-1]}; pass projection= (V of notes §2.3) to map dimensions"
            )
        return skip + out
