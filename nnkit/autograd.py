"""Reverse-mode automatic differentiation: ``nk.Tensor``, ``nk.no_grad`` and the op set.

A ``Tensor`` wraps an array (NumPy, or CuPy on the GPU) in ``.data``. Every op on tensors
that require grad records a node: its parent tensors and a closure that maps the output's
gradient to one gradient per parent. ``backward()`` sorts the recorded graph topologically
(iteratively, so a long unrolled RNN does not hit Python's recursion limit), then walks it
in reverse, summing the gradients that reach a tensor along several paths.

Each closure is the backward half of a forward/backward pair; closures are dropped after
use, so calling ``backward`` twice through the same graph raises unless
``retain_graph=True``. Every op, the Tensor methods' included, is written one way: a pair
(forward -> (out, cache), backward(dy, cache, needs)) given to ``apply_op``; its
primitive ``make_result`` is public for users' own closures.

Examples
--------
>>> import nnkit as nk
>>> x = nk.tensor([1.0, 2.0, 3.0], requires_grad=True)
>>> y = (x * x).sum()
>>> y.backward()
>>> x.grad
array([2., 4., 6.], dtype=float32)
"""

from __future__ import annotations

import contextlib
import numbers
import sys
import threading
import weakref

import numpy as np

from ._backend import array_module, is_gpu_array, kernels_for, matmul, to_host, unbroadcast
from ._validation import axis_or_dim, check_real

USER_API = ["Tensor", "tensor", "no_grad", "enable_grad", "is_grad_enabled", "concat", "stack",
            "where", "maximum", "complex", "real", "imag"]  # what nk re-exports
# The rest is for writers of ops (nk.functional, nk.nn).
__all__ = [*USER_API, "as_tensor", "unbroadcast", "make_result", "apply_op", "records"]

_mode = threading.local()


def is_grad_enabled() -> bool:
    """True unless inside ``nk.no_grad()`` (per thread)."""
    return getattr(_mode, "enabled", True)


class _GradMode(contextlib.ContextDecorator):
    def __init__(self, enabled: bool):
        self.enabled = enabled

    def __enter__(self):
        self.previous = is_grad_enabled()
        _mode.enabled = self.enabled
        return self

    def __exit__(self, *exc):
        _mode.enabled = self.previous
        return False


def no_grad():
    """Context manager (or decorator) in which ops record no graph."""
    return _GradMode(False)


def enable_grad():
    """Context manager (or decorator) that turns recording back on inside ``no_grad``."""
    return _GradMode(True)


class _Node:
    """What backward needs of one op: its parents and the gradient closure."""

    __slots__ = ("parents", "backward", "name")

    def __init__(self, parents, backward, name):
        self.parents = parents
        self.backward = backward
        self.name = name


def _default_float(arr):
    """Python floats become float32 (torch's default); arrays keep their dtype."""
    return arr.astype(np.float32) if arr.dtype == np.float64 else arr


def _to_array(data, dtype=None, copy=False, name=None):
    """``data`` as a NumPy or CuPy array of numbers in native byte order; ``name`` (the
    argument it came from) is named in the errors."""
    if isinstance(data, Tensor):
        data = data.data
    if is_gpu_array(data):
        xp = array_module(data)
        arr = xp.asarray(data, dtype=dtype)
        return arr.copy() if copy else arr
    what = f"{name} must be an array or Tensor of numbers" if name else \
        "a tensor must hold numbers"
    from_python = not isinstance(data, (np.ndarray, np.generic))
    try:
        arr = np.array(data, dtype=dtype, copy=copy) if copy else np.asarray(data, dtype=dtype)
    except OverflowError as exc:
        raise ValueError(f"{name or 'a tensor'}: cannot make an array of dtype {dtype}: "
                         f"{exc}") from None
    except ValueError as exc:  # ragged nested lists, strings that are not numbers
        if not from_python:
            raise
        raise TypeError(f"{what}; got a {type(data).__name__} that is not one ({exc})") from None
    if arr.dtype.kind not in "biufc":
        raise TypeError(f"{what}; got {type(data).__name__} (dtype {arr.dtype})")
    if arr.dtype.byteorder == ">" or (arr.dtype.byteorder == "<" and sys.byteorder == "big"):
        arr = arr.astype(arr.dtype.newbyteorder("="))  # computed in native byte order
    if dtype is None and from_python:
        with np.errstate(over="ignore"):  # 1e39 -> inf in float32, as torch
            arr = _default_float(arr)
    return arr


def _check_grad_dtype(arr, requires_grad):
    if requires_grad and arr.dtype.kind not in "fc":
        raise TypeError(
            f"only floating-point and complex tensors can require gradients, got dtype {arr.dtype}"
        )


class Tensor:
    """An array with an optional gradient and the record of the op that made it.

    Parameters
    ----------
    data : array_like
        The values. NumPy arrays keep their dtype; Python floats and lists of floats become
        float32. CuPy arrays stay on the GPU.
    requires_grad : bool
        Record ops on this tensor and accumulate ``.grad`` in ``backward``.
    dtype : dtype, optional
        Cast the data to this dtype first.

    Attributes
    ----------
    data : ndarray
        The values (shared, not copied, with the array passed in when no cast is needed).
    grad : ndarray or None
        The accumulated gradient after ``backward`` (leaf tensors only), same shape as data.
    """

    __slots__ = ("data", "grad", "requires_grad", "_ctx", "__weakref__")
    __array_ufunc__ = None  # ndarray (op) Tensor defers to the Tensor's reflected op

    def __init__(self, data, requires_grad: bool = False, dtype=None):
        arr = _to_array(data, dtype)
        _check_grad_dtype(arr, requires_grad)
        self.data = arr
        self.grad = None
        self.requires_grad = bool(requires_grad)
        self._ctx = None

    # ----- basic properties -------------------------------------------------------------
    @property
    def shape(self) -> tuple:
        return tuple(self.data.shape)

    @property
    def dtype(self):
        return self.data.dtype

    @property
    def ndim(self) -> int:
        return self.data.ndim

    @property
    def is_leaf(self) -> bool:
        return self._ctx is None

    @property
    def T(self) -> Tensor:
        return self.transpose()

    @property
    def real(self) -> Tensor:
        """Re z, differentiable (``real(self)``); a real tensor is its own real part."""
        return real(self)

    @property
    def imag(self) -> Tensor:
        """Im z, differentiable (``imag(self)``); a real tensor has none (TypeError)."""
        return imag(self)

    def numel(self) -> int:
        return int(self.data.size)

    def __len__(self) -> int:
        return len(self.data)

    def numpy(self):
        """The data as a NumPy array (copied to the host for a GPU tensor)."""
        data = self.data
        return to_host(data)

    def item(self):
        return self.data.item()

    def detach(self) -> Tensor:
        """A tensor sharing the data, cut off from the graph."""
        return Tensor(self.data)

    def requires_grad_(self, requires_grad: bool = True) -> Tensor:
        _check_grad_dtype(self.data, requires_grad)
        self.requires_grad = bool(requires_grad)
        return self

    def astype(self, dtype) -> Tensor:
        """A differentiable cast (the gradient is cast back)."""
        return apply_op("cast", _cast_forward, _cast_backward, (self,), dtype)

    def float(self) -> Tensor:
        return self.astype(np.float32)

    def double(self) -> Tensor:
        return self.astype(np.float64)

    def __repr__(self) -> str:
        body = np.array2string(np.asarray(self.numpy()), separator=", ", prefix="tensor(")
        extra = f", dtype={self.dtype}" if self.dtype != np.float32 else ""
        grad = ", requires_grad=True" if self.requires_grad else ""
        return f"tensor({body}{extra}{grad})"

    def __array__(self, dtype=None, copy=None):
        arr = self.numpy()
        return arr if dtype is None else arr.astype(dtype)

    __hash__ = object.__hash__

    # ----- backward ---------------------------------------------------------------------
    def register_post_accumulate_grad_hook(self, hook) -> _HookHandle:
        """Call ``hook(self)`` in every ``backward`` once this leaf's ``.grad`` holds all of
        that backward's contributions (torch's hook of the same name). The walk reaches a
        leaf once the last op that uses it is done, before the ops that made that op's other
        inputs: a data-parallel wrapper can send a layer's gradients while the earlier
        layers' backward still runs.

        Returns a handle whose ``remove()`` unregisters the hook. The hooks are not part of
        the tensor's state: copies and pickles of it have none.
        """
        if not self.is_leaf:
            raise RuntimeError("post-accumulate-grad hooks can only be registered on leaf "
                               "tensors (parameters), not on results of ops")
        if not callable(hook):
            raise TypeError(f"hook must be callable, got {type(hook).__name__}")
        key = id(self)
        if key not in _GRAD_HOOKS or _GRAD_HOOKS[key][0]() is not self:
            _GRAD_HOOKS[key] = (weakref.ref(self, lambda _, k=key: _GRAD_HOOKS.pop(k, None)),
                                [])
        _GRAD_HOOKS[key][1].append(hook)
        return _HookHandle(key, hook)

    def backward(self, gradient=None, retain_graph: bool = False) -> None:
        """Accumulate d(self)/d(leaf) * gradient into every leaf's ``.grad``.

        Parameters
        ----------
        gradient : array_like, optional
            The upstream gradient, shape of ``self``; may be omitted for a one-element tensor.
        retain_graph : bool
            Keep the graph so that ``backward`` can run through it again.
        """
        if not self.requires_grad:
            raise RuntimeError(
                "backward() called on a tensor that does not require grad: no input of the "
                "computation had requires_grad=True (or it ran under nk.no_grad())"
            )
        xp = array_module(self.data)
        if gradient is None:
            if self.data.size != 1:
                raise RuntimeError(
                    f"backward() without a gradient needs a one-element tensor, got shape "
                    f"{self.shape}; pass gradient= of that shape"
                )
            gradient = xp.ones_like(self.data)
        else:
            gradient = xp.asarray(_to_array(gradient), dtype=self.data.dtype)
            if gradient.shape != self.data.shape:
                raise ValueError(
                    f"gradient has shape {tuple(gradient.shape)} but the tensor has shape "
                    f"{self.shape}"
                )
        _run_backward(self, gradient, retain_graph)

    # ----- arithmetic -------------------------------------------------------------------
    def __add__(self, other):
        return _add(self, other)

    def __radd__(self, other):
        return _add(self, other)

    def __sub__(self, other):
        return _add(self, -other if not isinstance(other, Tensor) else other.__neg__())

    def __rsub__(self, other):
        return _add(self.__neg__(), other)

    def __mul__(self, other):
        return _mul(self, other)

    def __rmul__(self, other):
        return _mul(self, other)

    def __truediv__(self, other):
        return _div(self, other)

    def __rtruediv__(self, other):
        return _div(as_tensor(other, like=self), self)

    def __neg__(self):
        return apply_op("neg", _neg_forward, _neg_backward, (self,))

    def __pos__(self):
        return self

    def __pow__(self, exponent):
        return _pow(self, exponent)

    def __rpow__(self, base):
        return _pow(as_tensor(base, like=self), self)

    def __matmul__(self, other):
        return _matmul(self, as_tensor(other, like=self))

    def __rmatmul__(self, other):
        return _matmul(as_tensor(other, like=self), self)

    # comparisons give plain boolean arrays: they have no gradient
    def __lt__(self, other):
        return _ordered(self, "<") < _ordered(other, "<")

    def __le__(self, other):
        return _ordered(self, "<=") <= _ordered(other, "<=")

    def __gt__(self, other):
        return _ordered(self, ">") > _ordered(other, ">")

    def __ge__(self, other):
        return _ordered(self, ">=") >= _ordered(other, ">=")

    # ----- elementwise ------------------------------------------------------------------
    def exp(self):
        return apply_op("exp", _exp_forward, _exp_backward, (self,))

    def log(self):
        return apply_op("log", _log_forward, _log_backward, (self,))

    def sqrt(self):
        return apply_op("sqrt", _sqrt_forward, _sqrt_backward, (self,))

    def abs(self):
        return apply_op("abs", _abs_forward, _abs_backward, (self,))

    def tanh(self):
        return apply_op("tanh", _tanh_forward, _tanh_backward, (self,))

    def sigmoid(self):
        """1 / (1 + exp(-x)); complex too, as torch (the gradient conjugated)."""
        return apply_op("sigmoid", _sigmoid_forward, _sigmoid_backward, (self,))

    def relu(self):
        """max(x, 0), as torch: relu(-inf) = 0 and NaN stays NaN. The gradient is 0 where
        x <= 0 (at 0 and -inf too) and the upstream one elsewhere (NaN included), as torch's
        threshold_backward (``_relu_forward``)."""
        check_real(self, name="input", op="relu")
        return apply_op("relu", _relu_forward, _relu_backward, (self,))

    def clip(self, min=None, max=None):
        """Clamp to [min, max]; the gradient flows where the value was not clamped."""
        check_real(self, name="input", op="clip")
        return apply_op("clip", _clip_forward, _clip_backward, (self,), min, max)

    # ----- reductions -------------------------------------------------------------------
    def sum(self, axis=None, keepdims: bool = False, *, dim=None):
        """Sum over ``axis`` (NumPy's name) or ``dim`` (torch's); all axes by default."""
        axis = axis_or_dim(axis, dim, default=None, op="sum")
        return apply_op("sum", _sum_forward, _sum_backward, (self,), axis, keepdims)

    def mean(self, axis=None, keepdims: bool = False, *, dim=None):
        """Mean over ``axis`` (NumPy's name) or ``dim`` (torch's); all axes by default."""
        axis = axis_or_dim(axis, dim, default=None, op="mean")
        return apply_op("mean", _mean_forward, _mean_backward, (self,), axis, keepdims)

    def max(self, axis=None, keepdims: bool = False, *, dim=None):
        """Largest value along ``axis`` (or torch's ``dim``); the gradient is split evenly
        between ties."""
        return self._extreme(axis_or_dim(axis, dim, default=None, op="max"), keepdims, "max")

    def min(self, axis=None, keepdims: bool = False, *, dim=None):
        """Smallest value along ``axis`` (or torch's ``dim``); the gradient is split evenly
        between ties."""
        return self._extreme(axis_or_dim(axis, dim, default=None, op="min"), keepdims, "min")

    def _extreme(self, axis, keepdims, kind):
        check_real(self, name="input", op=kind)
        if self.data.size == 0:
            raise ValueError(f"{kind}() of an empty tensor of shape {self.shape} is undefined")
        return apply_op(kind, _extreme_forward, _extreme_backward, (self,), axis, keepdims, kind)

    # ----- shape ------------------------------------------------------------------------
    def reshape(self, *shape):
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        return apply_op("reshape", _reshape_forward, _reshape_backward, (self,), shape)

    def view(self, *shape):
        return self.reshape(*shape)

    def flatten(self, start_dim: int = 0, end_dim: int = -1):
        shape = self.shape
        nd = len(shape)
        if nd == 0:
            return self.reshape(1)
        for name, d in (("start_dim", start_dim), ("end_dim", end_dim)):
            if not -nd <= d < nd:
                raise ValueError(f"{name}={d} is out of range for a {nd}-dimensional tensor "
                                 f"of shape {shape}; expected a dim in [{-nd}, {nd - 1}]")
        s, e = start_dim % nd, end_dim % nd
        if s > e:
            raise ValueError(f"flatten: start_dim={start_dim} comes after end_dim={end_dim} "
                             f"for a {nd}-dimensional tensor of shape {shape}; expected "
                             "start_dim <= end_dim")
        merged = int(np.prod(shape[s : e + 1]))
        return self.reshape(shape[:s] + (merged,) + shape[e + 1 :])

    def transpose(self, *axes):
        """Permute the axes as ``np.transpose`` (reversed when none are given)."""
        if len(axes) == 1 and isinstance(axes[0], (tuple, list)):
            axes = tuple(axes[0])
        if not axes:
            axes = tuple(range(self.ndim - 1, -1, -1))
        if sorted(a % max(self.ndim, 1) for a in axes) != list(range(self.ndim)):
            raise ValueError(
                f"transpose needs a permutation of all {self.ndim} axes, got {axes}; "
                "use swapaxes(a, b) to exchange two axes"
            )
        return apply_op("transpose", _transpose_forward, _transpose_backward, (self,), axes)

    def permute(self, *axes):
        """Alias of ``transpose(*axes)`` (torch's name)."""
        return self.transpose(*axes)

    def swapaxes(self, axis1: int, axis2: int):
        """Exchange two axes (torch's ``transpose(dim0, dim1)``)."""
        perm = list(range(self.ndim))
        perm[axis1], perm[axis2] = perm[axis2], perm[axis1]
        return self.transpose(perm)

    def unsqueeze(self, axis=None, *, dim=None):
        """A new axis of length 1 at ``axis`` (or torch's ``dim``)."""
        if axis is None and dim is None:
            raise TypeError("unsqueeze needs the position of the new axis (axis or dim)")
        axis = axis_or_dim(axis, dim, default=None, op="unsqueeze")
        return self.reshape(np.expand_dims(self.data, axis).shape)

    def squeeze(self, axis=None, *, dim=None):
        """Drop axes of length 1: ``axis`` (or torch's ``dim``), all of them by default."""
        axis = axis_or_dim(axis, dim, default=None, op="squeeze")
        return self.reshape(self.data.squeeze(axis=axis).shape)

    def __getitem__(self, index):
        return apply_op("getitem", _getitem_forward, _getitem_backward, (self,),
                        _data_index(index))


# ----- the Tensor methods' forward/backward pairs --------------------------------------------
# Each is (forward(x, *options) -> (y, cache), backward(g, cache, needs) -> dx), as
# ``apply_op`` takes them; holomorphic rules multiply by conj(f'(z)) (``_conj``).
def _cast_forward(x, dtype):
    return x.astype(dtype), x.dtype


def _cast_backward(g, src, needs):
    return g.astype(src)


def _neg_forward(x):
    return -x, None


def _neg_backward(g, cache, needs):
    return -g


def _exp_forward(x):
    y = array_module(x).exp(x)
    return y, y


def _exp_backward(g, y, needs):
    return g * _conj(y)


def _log_forward(x):
    return array_module(x).log(x), x


def _log_backward(g, x, needs):
    return g / _conj(x)


def _sqrt_forward(x):
    y = array_module(x).sqrt(x)
    return y, y


def _sqrt_backward(g, y, needs):
    return g / (2 * _conj(y))


def _abs_forward(x):
    return array_module(x).abs(x), x


def _abs_backward(g, x, needs):
    return g * array_module(x).sign(x)


def _tanh_forward(x):
    y = array_module(x).tanh(x)
    return y, y


def _tanh_backward(g, y, needs):
    return g * _conj(1 - y * y)


def _sigmoid_forward(x):
    if x.dtype.kind == "c":
        y = 1 / (1 + array_module(x).exp(-x))
    else:
        y = _elementwise(x).expit(x)
    return y, y


def _sigmoid_backward(g, y, needs):
    return g * _conj(y * (1 - y))


def _relu_forward(x):
    """y = max(x, 0), NaN propagated; cached for the backward: y <= 0 exactly where
    x <= 0 (y is 0 there, x itself elsewhere, NaN at NaN), so no mask is made or kept.
    Selected, not multiplied by a mask: x * (x > 0) made relu(-inf) = -inf * 0 = NaN, and
    an infinite upstream gradient NaN where it is off."""
    y = array_module(x).maximum(x, x.dtype.type(0))
    return y, y


def _relu_backward(g, y, needs):
    return array_module(y).where(y <= 0, g.dtype.type(0), g)


def _clip_forward(x, low, high):
    y = array_module(x).clip(x, low, high)
    return y, y == x


def _clip_backward(g, inside, needs):
    return g * inside


def _sum_forward(x, axis, keepdims):
    return x.sum(axis=axis, keepdims=keepdims), (x.shape, axis, keepdims)


def _sum_backward(g, cache, needs):
    return _expand_reduced(g, *cache)


def _mean_forward(x, axis, keepdims):
    count = x.size if axis is None else int(np.prod([x.shape[a] for a in _axes(axis)]))
    with np.errstate(invalid="ignore", divide="ignore"):
        y = x.sum(axis=axis, keepdims=keepdims) / count  # count 0: NaN, silently (torch)
    return y, (x.shape, axis, keepdims, count)


def _mean_backward(g, cache, needs):
    shape, axis, keepdims, count = cache
    return _expand_reduced(g, shape, axis, keepdims) / count


def _extreme_forward(x, axis, keepdims, kind):
    yk = x.max(axis=axis, keepdims=True) if kind == "max" else x.min(axis=axis, keepdims=True)
    y = yk if keepdims else (yk.reshape(()) if axis is None else yk.squeeze(axis=axis))
    return y, (x, yk, axis, keepdims)


def _extreme_backward(g, cache, needs):
    """The gradient split evenly between the ties (NaNs tie with a NaN result)."""
    x, yk, axis, keepdims = cache
    mask = (x == yk) | (array_module(x).isnan(x) & array_module(x).isnan(yk))
    share = mask / mask.sum(axis=axis, keepdims=True)
    return _expand_reduced(g, x.shape, axis, keepdims) * share


def _reshape_forward(x, shape):
    return x.reshape(shape), x.shape


def _reshape_backward(g, src, needs):
    return g.reshape(src)


def _getitem_forward(x, index):
    return x[index], (x.shape, index, _is_advanced(index))


def _getitem_backward(g, cache, needs):
    """g scattered back: summed where an integer-array index repeats a position."""
    shape, index, advanced = cache
    gx = array_module(g).zeros(shape, dtype=g.dtype)
    if advanced:
        _elementwise(gx).scatter_add(gx, index, g)
    else:
        gx[index] = g
    return gx


def _transpose_forward(x, axes):
    return x.transpose(axes), tuple(np.argsort([a % x.ndim for a in axes]))


def _transpose_backward(g, inverse, needs):
    return g.transpose(inverse)


# ----- graph walking ------------------------------------------------------------------------
def _topological_order(root):
    """Tensors reachable from ``root`` that need grad, parents before children (iterative).

    A node's leaf parents are visited after its other parents, so that in the reversed order
    each leaf comes right after the last op that uses it, before the subgraph that made that
    op's other inputs (a layer's weights before the earlier layers' backward).
    """
    order, visited = [], set()
    stack = [(root, False)]
    while stack:
        t, done = stack.pop()
        if done:
            order.append(t)
            continue
        if id(t) in visited:
            continue
        visited.add(id(t))
        stack.append((t, True))
        ctx = t._ctx
        if ctx is not None:
            for leaves in (True, False):  # the last pushed is visited first
                for p in ctx.parents:
                    if p.requires_grad and id(p) not in visited and p.is_leaf is leaves:
                        stack.append((p, False))
    return order


def _weak(a):
    """A weak reference to the gradient array ``a``; for what takes none (NumPy scalars), a
    stand-in that answers "maybe the same" (so that it counts as shared: a copy at worst)."""
    try:
        return weakref.ref(a)
    except TypeError:
        return lambda: _UNSURE


_UNSURE = object()


def _among(table, a) -> bool:
    """Whether ``a`` is an array that ``table`` (id -> ``_weak``) holds: a freed array's id
    may be reused by a new one, which must not be taken for it (a needless copy)."""
    ref = table.get(id(a))
    if ref is None:
        return False
    held = ref()
    return held is a or held is _UNSURE


def _run_backward(root, gradient, retain_graph):
    grads = {id(root): gradient}
    # A leaf may keep the array it receives unless someone else holds it too: the caller's
    # root gradient, or one array that an op hands to several parents (x + y gives g to
    # both). Those are "shared" and the leaf stores a copy; everything else is fresh.
    handed, shared = {id(gradient): _weak(gradient)}, {id(gradient): _weak(gradient)}
    for t in reversed(_topological_order(root)):
        g = grads.pop(id(t), None)
        if g is None:
            continue
        ctx = t._ctx
        if ctx is None:
            _accumulate_leaf(t, g, own=not _among(shared, g))
            continue
        if ctx.backward is None:
            raise RuntimeError(
                f"trying to backward through the graph a second time (at a '{ctx.name}' op): "
                "its saved values were freed after the first backward; call "
                "backward(retain_graph=True) the first time if you need to go through it again"
            )
        parent_grads = ctx.backward(g)
        if not retain_graph:
            ctx.backward = None
        for p, pg in zip(ctx.parents, parent_grads, strict=True):
            if pg is None or not p.requires_grad:
                continue
            key = id(p)
            if _among(handed, pg):
                shared[id(pg)] = handed[id(pg)]
            handed[id(pg)] = _weak(pg)
            grads[key] = pg if key not in grads else grads[key] + pg


# Threads running backward through shared leaves (one model's parameters) add into the same
# ``.grad``: the read-add-write below holds this lock, since NumPy releases the GIL inside a
# large add and an unlocked one loses another thread's contribution. One lock for all
# leaves: it is held only for the add, a small part of a backward pass.
_leaf_lock = threading.Lock()


def _accumulate_leaf(t, g, own=False):
    """Add ``g`` into ``t.grad``; keep ``g`` itself only when ``own`` and not a view."""
    if isinstance(g, np.generic):
        g = np.asarray(g)
    if g.dtype.kind == "c" and t.data.dtype.kind != "c":
        g = g.real  # a real leaf of a complex graph: dL/dx is the real part
    if g.dtype != t.data.dtype:
        g = g.astype(t.data.dtype)
    if g.shape != t.data.shape:
        g = unbroadcast(g, t.data.shape)
    with _leaf_lock:
        if t.grad is None:
            t.grad = g if own and g.base is None and _writeable(g) else g.copy()
        else:
            t.grad = t.grad + g
    hooks = _GRAD_HOOKS.get(id(t))
    if hooks is not None and hooks[0]() is t:
        for hook in list(hooks[1]):
            hook(t)


# id(leaf) -> (a weak reference to it, its post-accumulate-grad hooks); an entry goes with
# its tensor. Kept outside the tensor so that copies and pickles carry no hooks.
_GRAD_HOOKS: dict = {}


class _HookHandle:
    """What ``register_post_accumulate_grad_hook`` returns: ``remove()`` unregisters."""

    def __init__(self, key, hook):
        self._key, self._hook = key, hook

    def remove(self) -> None:
        entry = _GRAD_HOOKS.get(self._key)
        if entry is not None and self._hook in entry[1]:
            entry[1].remove(self._hook)


# ----- op plumbing ------------------------------------------------------------------------
def records(parents) -> bool:
    """Whether ``make_result`` records an op on ``parents`` (so a backward may follow):
    grad mode on and some parent requiring grad. Ops consult it to skip keeping what only
    a backward reads."""
    return is_grad_enabled() and any(p.requires_grad for p in parents)


def make_result(data, parents, backward, name: str = "op") -> Tensor:
    """Wrap ``data`` as the output of an op on ``parents`` with gradient closure ``backward``.

    ``backward(g)`` returns one gradient (or None) per parent, in order, each the shape of
    that parent's data (broadcast gradients are reduced by the op itself or by
    ``unbroadcast``). No node is recorded under ``no_grad`` or when no parent needs grad.
    """
    return _wrap(data, parents, backward, name, records(parents))


def _wrap(data, parents, backward, name, recorded: bool) -> Tensor:
    """``make_result`` with the recording decided by the caller."""
    out = Tensor.__new__(Tensor)
    out.data = np.asarray(data) if isinstance(data, np.generic) else data  # 0-d stays an array
    out.grad = None
    out.requires_grad = recorded
    out._ctx = _Node(parents, backward, name) if recorded else None
    return out


def apply_op(name: str, forward, backward, parents, *args, release=None, with_cache=False,
             **kwargs):
    """One differentiable op from a kernel pair: the one way nnkit writes an op.

    ``forward(*datas, *args, **kwargs) -> (out, cache)`` gets the parents' arrays (None for
    an absent optional parent, such as a missing bias); ``out`` is one array or a tuple of
    them (an LSTM's (y, h_T, c_T)). ``backward(dy, cache, needs)`` returns one gradient (or
    None) per parent, a tuple (the array alone for one parent), where ``needs[i]`` says
    whether parent i needs one, so that it computes only those; for a tuple ``out``, ``dy``
    is a tuple too, None for an output no gradient reached. The ``nk.kernels`` pairs have
    these signatures and are passed as they are. The node is recorded only when grad mode
    is on and some parent requires grad; otherwise ``release(cache)``, if given, frees what
    only a backward would read. Validation belongs to the public function before this
    call; ``backward`` trusts its cache. Returns the output Tensor (a tuple of Tensors for a
    tuple ``out``), or ``(result, cache)`` with ``with_cache`` (for an op that also returns
    something its cache holds).
    """
    complete = None not in parents  # identity tests: Tensor has no __eq__
    present = parents if complete else tuple(p for p in parents if p is not None)
    out, cache = forward(*[None if p is None else p.data for p in parents], *args, **kwargs)
    several = isinstance(out, tuple)
    needs = [p is not None and p.requires_grad for p in parents]
    if not (True in needs and is_grad_enabled()):
        if release is not None:
            release(cache)
        result = tuple(_wrap(o, present, None, name, False) for o in out) if several else \
            _wrap(out, present, None, name, False)
        return (result, cache) if with_cache else result
    needs = tuple(needs)
    single = len(parents) == 1

    def grad_fn(g):
        grads = backward(g.parts if several else g, cache, needs)
        if single and not isinstance(grads, tuple):
            return (grads,)
        return grads if complete else \
            tuple(grad for p, grad in zip(parents, grads, strict=True) if p is not None)

    if several:
        joint = _wrap(out[0], present, grad_fn, name, True)  # its data: for graph walks
        result = tuple(_wrap(o, (joint,), _OutputGrads.picker(i, len(out)), name, True)
                       for i, o in enumerate(out))
    else:
        result = _wrap(out, present, grad_fn, name, True)
    return (result, cache) if with_cache else result


class _OutputGrads:
    """The gradients reaching the outputs of a multi-output op, None for an output none
    reached: what one output hands the op's shared node (a Tensor that holds the first
    output's array, parent of every output), summed by merging."""

    __slots__ = ("parts",)

    def __init__(self, parts):
        self.parts = parts

    def __add__(self, other):
        return _OutputGrads(tuple(a if b is None else b if a is None else a + b
                                  for a, b in zip(self.parts, other.parts, strict=True)))

    @staticmethod
    def picker(i, n):
        """Output i's backward: its gradient in slot i of n."""
        def pick(g):
            return (_OutputGrads(tuple(g if j == i else None for j in range(n))),)
        return pick


def as_tensor(value, like: Tensor | None = None, name: str | None = None) -> Tensor:
    """``value`` as a Tensor (unchanged when it is one); numbers take ``like``'s dtype.
    ``name``: the argument ``value`` came from, named when it is not numbers."""
    if isinstance(value, Tensor):
        return value
    if like is not None and isinstance(value, (numbers.Number, np.bool_)):
        return Tensor(_elementwise(like.data).full_scalar(value, like.data))
    return Tensor(_to_array(value, name=name))


def _data(value):
    return value.data if isinstance(value, Tensor) else value


def _ordered(value, op):
    """The data of a comparison's operand; complex numbers have no order (TypeError)."""
    data = _data(value)
    if isinstance(data, numbers.Complex) and not isinstance(data, numbers.Real) \
            or getattr(data, "dtype", np.dtype(float)).kind == "c":
        kind = getattr(data, "dtype", "complex")
        raise TypeError(f"comparison ({op}): operands must be real, got {kind}; complex "
                        "numbers have no order")
    return data


def _on_device_of(value, like):
    """``value`` as a Tensor; a constant joins ``like``'s GPU (with the dtype it would have on
    the CPU; a scalar by a fill kernel, no host copy). CPU tensors: ``as_tensor(value)``."""
    t = as_tensor(value)
    if like is None or isinstance(value, Tensor):
        return t
    data = _elementwise(like.data).to_device_of(t.data, like.data)
    return t if data is t.data else Tensor(data)


def _elementwise(x):
    """The helpers (expit, scatter_add, full_scalar, to_device_of) for ``x``'s device:
    ``nnkit._ext.elementwise_cpu`` or ``elementwise_cuda``."""
    return kernels_for("elementwise_cpu", "elementwise_cuda", x)


def _axes(axis):
    return (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)


def _expand_reduced(g, shape, axis, keepdims):
    """Broadcast the gradient of a reduction back to the input's ``shape``."""
    xp = array_module(g)
    if axis is not None and not keepdims:
        axes = tuple(a % len(shape) for a in _axes(axis))
        g = g.reshape([1 if i in axes else n for i, n in enumerate(shape)])
    return xp.broadcast_to(g, shape)


def _data_index(index):
    if isinstance(index, Tensor):
        return index.data
    if isinstance(index, tuple):
        return tuple(i.data if isinstance(i, Tensor) else i for i in index)
    return index


def _is_advanced(index):
    """True when the index holds integer arrays, which may repeat positions."""
    items = index if isinstance(index, tuple) else (index,)
    for i in items:
        if isinstance(i, (int, np.integer, slice, type(None), type(Ellipsis))):
            continue
        if getattr(i, "dtype", None) is not None and i.dtype == bool:
            continue  # a boolean mask selects each position at most once
        return True
    return False


def _writeable(a):
    flags = getattr(a, "flags", None)
    return True if flags is None else bool(getattr(flags, "writeable", True))


def _conj(x):
    """Complex conjugate for complex arrays, the array itself otherwise.

    Backward rules of holomorphic ops multiply by conj(f'(z)): the gradient of a real loss
    with respect to z = x + iy is dL/dx + i dL/dy, as in torch.
    """
    return x.conj() if getattr(x, "dtype", None) is not None and x.dtype.kind == "c" else x


def _binary(a, b):
    """Operands as (Tensor, Tensor-or-constant array); constants never get a node."""
    if isinstance(b, Tensor):
        return a, b, b.data
    return a, None, b


def _add(a, b):
    a, bt, bd = _binary(a, b)
    return apply_op("add", _add_forward, _add_backward, (a, bt), bd)


def _add_forward(a, b, constant):
    b = constant if b is None else b
    return a + b, (a.shape, getattr(b, "shape", ()))


def _add_backward(g, shapes, needs):
    return unbroadcast(g, shapes[0]), unbroadcast(g, shapes[1]) if needs[1] else None


def _mul(a, b):
    a, bt, bd = _binary(a, b)
    return apply_op("mul", _mul_forward, _mul_backward, (a, bt), bd)


def _mul_forward(a, b, constant):
    b = constant if b is None else b
    return a * b, (a, b)


def _mul_backward(g, cache, needs):
    a, b = cache
    return unbroadcast(g * _conj(b), a.shape), \
        unbroadcast(g * _conj(a), b.shape) if needs[1] else None


def _div(a, b):
    a, bt, bd = _binary(a, b)
    return apply_op("div", _div_forward, _div_backward, (a, bt), bd)


def _div_forward(a, b, constant):
    b = constant if b is None else b
    y = a / b
    return y, (a.shape, b, y)


def _div_backward(g, cache, needs):
    a_shape, b, y = cache
    gb = unbroadcast(-g * _conj(y / b), b.shape) if needs[1] else None
    return unbroadcast(g / _conj(b), a_shape), gb


def _pow(a, exponent):
    if isinstance(exponent, Tensor):
        return apply_op("pow", _pow_forward, _pow_backward, (a, exponent), None)
    return apply_op("pow", _pow_forward, _pow_backward, (a, None), exponent)


def _pow_forward(a, p, constant):
    p = constant if p is None else p
    y = a**p
    return y, (a, p, y)


def _pow_backward(g, cache, needs):
    a, p, y = cache
    ga = unbroadcast(g * _conj(p * a ** (p - 1)), a.shape)
    if not needs[1]:
        return ga, None
    xp = array_module(a)
    if a.dtype.kind == "c" or p.dtype.kind == "c":
        log_a = xp.log(a.astype(np.complex128))
    else:
        with np.errstate(divide="ignore", invalid="ignore"):
            log_a = xp.where(a > 0, xp.log(xp.where(a > 0, a, 1)), 0)
    return ga, unbroadcast(g * _conj(y * log_a), p.shape)


def _matmul(a, b):
    ad, bd = a.data, b.data
    if ad.ndim == 0 or bd.ndim == 0:
        raise ValueError("matmul needs operands of at least 1 dimension; use * for scalars")
    inner = ad.shape[-1], bd.shape[-2] if bd.ndim > 1 else bd.shape[0]
    if inner[0] != inner[1]:
        raise ValueError(f"matmul: a has shape {ad.shape} and b has shape {bd.shape}; the last "
                         f"axis of a ({inner[0]}) must match b's rows ({inner[1]})")
    return apply_op("matmul", _matmul_forward, _matmul_backward, (a, b))


def _matmul_forward(a, b):
    return matmul(a, b), (a, b)


def _matmul_backward(g, cache, needs):
    ad, bd = cache
    if ad.ndim == 1 and bd.ndim == 1:  # inner product
        return g * _conj(bd), _conj(ad) * g
    a2 = ad[None, :] if ad.ndim == 1 else ad
    b2 = bd[:, None] if bd.ndim == 1 else bd
    g2 = g
    if ad.ndim == 1:
        g2 = g2[..., None, :]
    if bd.ndim == 1:
        g2 = g2[..., None]
    ga = matmul(g2, _conj(b2.swapaxes(-1, -2)))
    gb = matmul(_conj(a2.swapaxes(-1, -2)), g2)
    ga = unbroadcast(ga, a2.shape).reshape(ad.shape)
    gb = unbroadcast(gb, b2.shape).reshape(bd.shape)
    return ga, gb


# ----- functions over several tensors --------------------------------------------------------
def concat(tensors, axis: int | None = None, *, dim: int | None = None) -> Tensor:
    """Join tensors along an existing axis (``np.concatenate``); ``axis`` or torch's ``dim``,
    0 by default."""
    axis = axis_or_dim(axis, dim, default=0, op="concat")
    tensors = [as_tensor(t) for t in tensors]
    if not tensors:
        raise ValueError("concat needs at least one tensor, got an empty sequence")
    return apply_op("concat", _concat_forward, _concat_backward, tuple(tensors), axis=axis)


def _concat_forward(*arrays, axis):
    bounds = np.cumsum([a.shape[axis] for a in arrays])[:-1].tolist()
    return array_module(arrays[0]).concatenate(arrays, axis=axis), (bounds, axis)


def _concat_backward(g, cache, needs):
    bounds, axis = cache
    return tuple(array_module(g).split(g, bounds, axis=axis))


def stack(tensors, axis: int | None = None, *, dim: int | None = None) -> Tensor:
    """Join tensors along a new axis (``np.stack``); ``axis`` or torch's ``dim``, 0 by
    default."""
    axis = axis_or_dim(axis, dim, default=0, op="stack")
    tensors = [as_tensor(t) for t in tensors]
    if not tensors:
        raise ValueError("stack needs at least one tensor, got an empty sequence")
    return apply_op("stack", _stack_forward, _stack_backward, tuple(tensors), axis=axis)


def _stack_forward(*arrays, axis):
    return array_module(arrays[0]).stack(arrays, axis=axis), axis


def _stack_backward(g, axis, needs):
    return tuple(array_module(g).moveaxis(g, axis, 0))


def where(condition, x, y) -> Tensor:
    """``x`` where ``condition`` else ``y``, elementwise with broadcasting."""
    cond = _data(condition)
    like = x if isinstance(x, Tensor) else y if isinstance(y, Tensor) else None
    xt, yt = _on_device_of(x, like), _on_device_of(y, like)
    return apply_op("where", _where_forward, _where_backward, (xt, yt), cond)


def _where_forward(x, y, cond):
    return array_module(x).where(cond, x, y), (cond, x.shape, y.shape)


def _where_backward(g, cache, needs):
    cond, xs, ys = cache
    xp = array_module(g)
    zero = xp.zeros_like(g)
    return unbroadcast(xp.where(cond, g, zero), xs), unbroadcast(xp.where(cond, zero, g), ys)


def maximum(x, y) -> Tensor:
    """Elementwise maximum; at ties the gradient goes to ``x``."""
    like = x if isinstance(x, Tensor) else y if isinstance(y, Tensor) else None
    xt, yt = _on_device_of(x, like), _on_device_of(y, like)
    check_real(xt, name="x", op="maximum")
    check_real(yt, name="y", op="maximum")
    return where(xt.data >= yt.data, xt, yt)


_COMPLEX_OF = {np.dtype(np.float32): np.complex64, np.dtype(np.float64): np.complex128}


def complex(real, imag) -> Tensor:  # torch's name; in this module it hides the builtin
    """``real + i imag`` from two real tensors of one float dtype, broadcast together, as
    ``torch.complex``: float32 -> complex64, float64 -> complex128. Gradients Re g and Im g
    (the gradient of a real loss with respect to z = x + iy is dL/dx + i dL/dy)."""
    re, im = as_tensor(real, name="real"), as_tensor(imag, name="imag")
    if re.dtype not in _COMPLEX_OF or im.dtype != re.dtype:
        raise TypeError(f"complex: real and imag must be float32 or float64 of one dtype, got "
                        f"{re.dtype} and {im.dtype}")
    return apply_op("complex", _complex_forward, _complex_backward, (re, im))


def _complex_forward(re, im):
    z = (re + 1j * im).astype(_COMPLEX_OF[re.dtype], copy=False)
    return z, (re.shape, im.shape)


def _complex_backward(g, shapes, needs):
    xp = array_module(g)
    return unbroadcast(xp.ascontiguousarray(g.real), shapes[0]), \
        unbroadcast(xp.ascontiguousarray(g.imag), shapes[1])


def real(z) -> Tensor:
    """Re z as a new real tensor (``torch.real``; a real ``z`` is returned as is). Its
    gradient g enters z as g + 0i."""
    z = as_tensor(z, name="z")
    if z.dtype.kind != "c":
        return z
    return apply_op("real", _real_forward, _real_backward, (z,))


def _real_forward(z):
    return array_module(z).ascontiguousarray(z.real), z.dtype


def _real_backward(g, dtype, needs):
    return g.astype(dtype)


def imag(z) -> Tensor:
    """Im z as a new real tensor (``torch.imag``; TypeError for a real ``z``, as torch). Its
    gradient g enters z as 0 + i g."""
    z = as_tensor(z, name="z")
    if z.dtype.kind != "c":
        raise TypeError(f"imag is defined for complex tensors only, got dtype {z.dtype}")
    return apply_op("imag", _imag_forward, _imag_backward, (z,))


def _imag_forward(z):
    return array_module(z).ascontiguousarray(z.imag), z.dtype


def _imag_backward(g, dtype, needs):
    return 1j * g.astype(dtype)


def tensor(data, requires_grad: bool = False, dtype=None) -> Tensor:
    """A new leaf tensor holding a copy of ``data`` (see ``Tensor``)."""
    t = Tensor.__new__(Tensor)
    arr = _to_array(data, dtype, copy=True)
    _check_grad_dtype(arr, requires_grad)
    t.data, t.grad, t.requires_grad, t._ctx = arr, None, bool(requires_grad), None
    return t
