"""Recurrent layers through time: validated forward/backward pairs (Elman RNN, LSTM, GRU).

Each forward runs one layer in one direction over a whole sequence, in one compiled kernel
(``nnkit._ext.recurrent_cpu``): per step the GEMMs ``x_t @ W_ih^T`` and ``h_{t-1} @ W_hh^T``
(a packed-panel C kernel) and the gate nonlinearities fused with the cell update, blocks of
batch rows on separate threads. CuPy arrays take the input projection of all steps as one
cuBLAS GEMM first, then the whole time loop in one persistent Numba CUDA launch
(``nnkit._ext.recurrent_cuda``: a thread block per tile of batch rows, W_hh on chip when it
fits); every array stays on the device.

Each backward runs BPTT in one compiled kernel, which leaves the gradients with respect to
the gate pre-activations of every step; the parameter gradients are then products over all
steps at once::

    dW_ih = sum_t dA_t^T x_t,   dx_t = dA_t W_ih,   dW_hh = sum_t dA^h_t^T h_{t-1},
    db_ih = sum_t sum_b dA_t,   db_hh = sum_t sum_b dA^h_t

(dA^h = dA except for the GRU's n gate, where the hidden part is r * dA_n.) On the CPU the
BPTT kernel does dx_t step by step on its threads and leaves dA packed for the packed-panel
GEMM, and [dW_ih, dW_hh]^T = [x; h_prev]^T dA is one product over the panels (see
``recurrent_cpu.packed_weight_grads``); on the GPU each is one cuBLAS GEMM.

The pairs follow the kernels' convention, so ``nnkit.autograd.apply_op`` takes them as they
are: ``<cell>_forward(x, h0, [c0,] weight_ih, weight_hh, bias_ih, bias_hh, options) ->
((y, h_T[, c_T]), cache)`` and ``<cell>_backward((dy, dh_T[, dc_T]), cache, needs=None,
hidden_grads=None)`` -> one gradient per input, None where ``needs`` says not wanted.
``nnkit._backend.kernels_for`` picks the device module; ``recurrent_cpu`` and
``recurrent_cuda`` expose the same launchers (``<cell>_forward_layer``,
``<cell>_backward_layer``).

Gate orders and formulas are torch's (``torch.nn.RNN/LSTM/GRU``); ``nnkit.kernels.reference``
(``reference.recurrent``) holds the naive per-step twins.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from .._backend import array_module, is_gpu_array, kernels_for
from .._types import Array, Needs
from .._validation import (
    FLOATS,
    check_array,
    check_cache,
    check_choice,
    check_out,
    check_same_device,
    check_same_dtype,
)

__all__ = [
    "RecurrentCache",
    "rnn_forward",
    "rnn_backward",
    "lstm_forward",
    "lstm_backward",
    "gru_forward",
    "gru_backward",
]


@dataclass
class RecurrentCache:
    """What backward needs of one layer-direction: inputs, weights and the kernel's saves.

    ``saved`` maps names to arrays: RNN {y}, LSTM {y, gates, c}, GRU {y, gates, hn}.
    """

    cell: str
    x: np.ndarray
    h0: np.ndarray
    c0: np.ndarray | None
    weight_ih: np.ndarray
    weight_hh: np.ndarray
    has_bias: bool
    nonlinearity: str
    reverse: bool
    saved: dict


# ---- validation ------------------------------------------------------------------------

def _check_inputs(x, h0, weight_ih, weight_hh, bias_ih, bias_hh, gates, c0=None):
    """Validate one layer-direction's arrays; return them C-contiguous (biases may be None).

    States left None become zeros; c0 is checked (and returned) only for the LSTM (gates 4).
    """
    x = check_array(x, name="x", ndim=3, dtype=FLOATS)
    T, B, D = x.shape
    if T == 0:
        raise ValueError(f"x has shape {tuple(x.shape)}: an empty sequence (T = 0); "
                         "expected x of shape (T, B, input_size) with T >= 1")
    weight_ih = _check_param(weight_ih, "weight_ih", 2, x)
    GH = weight_ih.shape[0]
    if GH % gates or weight_ih.shape[1] != D:
        raise ValueError(f"weight_ih has shape {weight_ih.shape} but x has {D} features; "
                         f"expected ({gates} * hidden_size, {D})")
    H = GH // gates
    weight_hh = _check_param(weight_hh, "weight_hh", 2, x)
    if weight_hh.shape != (GH, H):
        raise ValueError(f"weight_hh has shape {weight_hh.shape}; expected ({GH}, {H}) "
                         f"for hidden_size={H}")
    if (bias_ih is None) != (bias_hh is None):
        raise ValueError("bias_ih and bias_hh must both be given or both be None")
    if bias_ih is not None:
        bias_ih = _check_param(bias_ih, "bias_ih", 1, x)
        bias_hh = _check_param(bias_hh, "bias_hh", 1, x)
        for b, name in ((bias_ih, "bias_ih"), (bias_hh, "bias_hh")):
            if b.shape != (GH,):
                raise ValueError(f"{name} has shape {b.shape}; expected ({GH},)")
    h0 = _check_state(h0, "h0", (B, H), x)
    c0 = _check_state(c0, "c0", (B, H), x) if gates == 4 else None
    return x, h0, c0, weight_ih, weight_hh, bias_ih, bias_hh


def _check_param(p, name, ndim, x):
    p = check_array(p, name=name, ndim=ndim, dtype=FLOATS)
    check_same_device(p, x, name=name)
    return check_same_dtype(p, x, name=name)


def _check_state(s, name, shape, x):
    if s is None:
        return array_module(x).zeros(shape, dtype=x.dtype)
    s = _check_param(s, name, 2, x)
    if s.shape != shape:
        raise ValueError(f"{name} has shape {s.shape} but x has shape {tuple(x.shape)} and "
                         f"hidden_size={shape[1]}; expected {name} of shape {shape}")
    return s


def _check_grad(g, name, like):
    """g as a C-contiguous array of like's shape, dtype and device (zeros for None)."""
    xp = array_module(like)
    if g is None:
        return xp.zeros(like.shape, dtype=like.dtype)
    g = check_array(g, name=name, dtype=FLOATS)
    if tuple(g.shape) != tuple(like.shape):
        raise ValueError(f"{name} has shape {tuple(g.shape)}; expected {tuple(like.shape)}")
    check_same_device(g, like, name=name, like_name="the forward's arrays")
    return xp.ascontiguousarray(g, dtype=like.dtype)


_CELLS = {"rnn": (1, ("y",)), "lstm": (4, ("y", "gates", "c")), "gru": (3, ("y", "gates", "hn"))}


def _check_cache(cache, cell):
    """Raise unless ``cache`` is what ``{cell}_forward`` returned: that cell's, with arrays
    of one forward's shapes, dtype and device (the kernels index them unchecked)."""
    check_cache(cache, RecurrentCache, forward=f"{cell}_forward")
    if cache.cell != cell:
        raise ValueError(f"cache comes from {cache.cell}_forward; {cell}_backward needs the "
                         f"cache of {cell}_forward")
    x = check_array(cache.x, name="cache.x", ndim=3, dtype=FLOATS, contiguous=False)
    w_hh = check_array(cache.weight_hh, name="cache.weight_hh", ndim=2, contiguous=False)
    (T, B, D), H, (G, names) = x.shape, w_hh.shape[1], _CELLS[cell]
    saved = cache.saved if isinstance(cache.saved, dict) else {}
    arrays = {"weight_ih": (cache.weight_ih, (G * H, D)), "weight_hh": (w_hh, (G * H, H)),
              "h0": (cache.h0, (B, H)), **({"c0": (cache.c0, (B, H))} if G == 4 else {})}
    for name in names:
        arrays[f"saved[{name!r}]"] = (saved.get(name), (T, B, G * H if name == "gates" else H))
    gpu = " on the GPU" if is_gpu_array(x) else ""
    for name, (a, shape) in arrays.items():
        if not (hasattr(a, "shape") and hasattr(a, "dtype") and tuple(a.shape) == shape
                and a.dtype == x.dtype and is_gpu_array(a) == bool(gpu)):
            raise ValueError(f"cache.{name} must be a {x.dtype} array of shape {shape}{gpu} "
                             f"for the x of shape {tuple(x.shape)} of {cell}_forward, got "
                             f"{_describe(a)}")


def _describe(a) -> str:
    """'float64 array of shape (2, 3)' (' on the GPU'), 'nothing' for None, else a's type."""
    if a is None or not (hasattr(a, "shape") and hasattr(a, "dtype")):
        return "nothing" if a is None else type(a).__name__
    where = " on the GPU" if is_gpu_array(a) else ""
    return f"{a.dtype} array of shape {tuple(a.shape)}{where}"


def _hidden_out(hidden_grads, y):
    """The kernel's hidden_grads argument: the caller's (T, B, H) array or an empty one."""
    if hidden_grads is None:
        return array_module(y).empty((0, 0, 0), dtype=y.dtype)
    return check_out(hidden_grads, y, name="hidden_grads", like_name="the forward's y")


def _kernels(x):
    """The launchers for x's device (``nnkit._ext.recurrent_cpu`` or ``recurrent_cuda``,
    chosen by ``nnkit._backend.kernels_for``; the two have the same names)."""
    return kernels_for("recurrent_cpu", "recurrent_cuda", x)


def _bias(xp, b_ih, b_hh, size, dtype):
    """The bias the step adds to x_t W_ih^T: b_ih (+ b_hh when given), zeros without one."""
    if b_ih is None:
        return xp.zeros(size, dtype=dtype)
    return b_ih if b_hh is None else b_ih + b_hh


def _douts(douts, names, cell):
    """The output gradients of ``{cell}_forward`` from ``douts`` (a tuple, one per output)."""
    if not isinstance(douts, (tuple, list)) or len(douts) != len(names):
        got = f"a {type(douts).__name__} of {len(douts)}" if isinstance(
            douts, (tuple, list)) else type(douts).__name__
        raise TypeError(f"douts must be a tuple ({', '.join(names)}) of {cell}_forward's "
                        f"output gradients (None for zeros), got {got}")
    return douts


def _needs(needs, count, cell):
    """``needs`` as a tuple of ``count`` bools (all True for None)."""
    if needs is None:
        return (True,) * count
    needs = tuple(bool(n) for n in needs)
    if len(needs) != count:
        raise ValueError(f"needs has {len(needs)} entries; {cell}_backward expects {count}, "
                         f"one per input of {cell}_forward")
    return needs


def _masked(grads, needs):
    """The gradients, None where ``needs`` says not wanted."""
    return tuple(g if n else None for g, n in zip(grads, needs, strict=True))


# ---- Elman RNN ---------------------------------------------------------------------------

def rnn_forward(x: Array, h0: Array | None, weight_ih: Array, weight_hh: Array,
                bias_ih: Array | None = None, bias_hh: Array | None = None,
                nonlinearity: Literal["tanh", "relu"] = "tanh", reverse: bool = False,
                keep_cache: bool = True) -> tuple[tuple[Array, Array], RecurrentCache]:
    """Elman RNN over a sequence: h_t = phi(W_ih x_t + b_ih + W_hh h_{t-1} + b_hh).

    In the notation of notes §5, z_t = phi(U z_{t-1} + V x_t): U = weight_hh, V = weight_ih.

    Parameters
    ----------
    x : ndarray (T, B, D), float32 or float64, T >= 1
    h0 : ndarray (B, H) or None (zeros)
    weight_ih : ndarray (H, D);  weight_hh : ndarray (H, H)
    bias_ih, bias_hh : ndarray (H,), or both None
    nonlinearity : {'tanh', 'relu'}
    reverse : bool
        Run from t = T-1 down to 0 (the reverse direction of a bidirectional layer).
    keep_cache : bool
        False when no backward will follow (inference): the cache is None.

    Returns
    -------
    (y, h_T) : ndarray (T, B, H), ndarray (B, H)
        h_t for every t, and the last state (y[T-1], or y[0] when reverse).
    cache : RecurrentCache for ``rnn_backward``, or None without ``keep_cache``

    Examples
    --------
    >>> import numpy as np
    >>> from nnkit.kernels.recurrent import rnn_forward
    >>> (y, h), _ = rnn_forward(np.ones((3, 1, 1)), None, np.ones((1, 1)), np.zeros((1, 1)))
    >>> np.round(y.ravel(), 4)
    array([0.7616, 0.7616, 0.7616])
    """
    check_choice(nonlinearity, name="nonlinearity", choices=("tanh", "relu"))
    x, h0, _, w_ih, w_hh, b_ih, b_hh = _check_inputs(x, h0, weight_ih, weight_hh, bias_ih,
                                                     bias_hh, gates=1)
    bias = _bias(array_module(x), b_ih, b_hh, w_hh.shape[0], x.dtype)
    y, h = _kernels(x).rnn_forward_layer(x, w_ih, w_hh, bias, h0, nonlinearity == "relu",
                                         bool(reverse))
    if not keep_cache:
        return (y, h), None
    cache = RecurrentCache("rnn", x, h0, None, w_ih, w_hh, b_ih is not None, nonlinearity,
                           bool(reverse), {"y": y})
    return (y, h), cache


def _one_state_backward(cell, douts, cache, needs, hidden_grads):
    """The RNN's and the GRU's backward: one carried state, six gradients."""
    _check_cache(cache, cell)
    dy, dh_T = _douts(douts, ("dy", "dh_T"), cell)
    need = _needs(needs, 6, cell)
    y = cache.saved["y"]
    grads = getattr(_kernels(y), f"{cell}_backward_layer")(
        cache, _check_grad(dy, "dy", y), _check_grad(dh_T, "dh_T", cache.h0),
        _hidden_out(hidden_grads, y), need[0], any(need[2:]))
    return _masked(grads, need)


def rnn_backward(douts: tuple[Array | None, Array | None], cache: RecurrentCache,
                 needs: Needs = None, hidden_grads: Array | None = None
                 ) -> tuple[Array | None, ...]:
    """Gradients of ``rnn_forward`` by BPTT.

    With a_t the pre-activation and g_t = dL/dh_t (from dy and from step t+1)::

        dA_t = g_t * phi'(a_t),   dL/dh_{t-1} += dA_t W_hh

    Parameters
    ----------
    douts : tuple (dy, dh_T)
        dy (T, B, H) and dh_T (B, H), the gradients of the outputs (y, h_T); None: zeros.
    cache : RecurrentCache from ``rnn_forward``
    needs : tuple of 6 bool, optional
        Which of (x, h0, weight_ih, weight_hh, bias_ih, bias_hh) want a gradient
        (``nnkit.autograd.apply_op``'s mask); the others are None, and dx (the weight
        gradients, when none of the four is wanted) is not computed. None: all.
    hidden_grads : ndarray (T, B, H), x's dtype, optional
        Filled with the total dL/dh_t of every step (dL/dz_t of notes §5: the direct part
        dy[t] plus everything that flows back through later steps).

    Returns
    -------
    dx (T, B, D), dh0 (B, H), dweight_ih (H, D), dweight_hh (H, H), dbias_ih (H,),
    dbias_hh (H,) — None where ``needs`` says so, and the biases' when the forward had none.
    """
    return _one_state_backward("rnn", douts, cache, needs, hidden_grads)


# ---- LSTM --------------------------------------------------------------------------------

def lstm_forward(x: Array, h0: Array | None, c0: Array | None, weight_ih: Array,
                 weight_hh: Array, bias_ih: Array | None = None, bias_hh: Array | None = None,
                 reverse: bool = False, keep_cache: bool = True
                 ) -> tuple[tuple[Array, Array, Array], RecurrentCache]:
    """LSTM over a sequence, gates (i, f, g, o) as torch::

        [i, f, g, o] = [sig, sig, tanh, sig](W_ih x_t + b_ih + W_hh h_{t-1} + b_hh)
        c_t = f * c_{t-1} + i * g,    h_t = o * tanh(c_t)

    Parameters
    ----------
    x : ndarray (T, B, D), float32 or float64, T >= 1
    h0, c0 : ndarray (B, H) or None (zeros)
    weight_ih : ndarray (4H, D);  weight_hh : ndarray (4H, H)
    bias_ih, bias_hh : ndarray (4H,), or both None
    reverse : bool
    keep_cache : bool
        False when no backward will follow (inference): the gates and cell states of every
        step are not kept (on the CPU only one step's are held), and the cache is None.

    Returns
    -------
    (y, h_T, c_T) : ndarray (T, B, H), ndarray (B, H), ndarray (B, H)
    cache : RecurrentCache for ``lstm_backward``, or None without ``keep_cache``

    Examples
    --------
    >>> import numpy as np
    >>> from nnkit.kernels.recurrent import lstm_forward
    >>> (y, h, c), _ = lstm_forward(np.ones((2, 1, 1)), None, None, np.ones((4, 1)),
    ...                             np.zeros((4, 1)))
    >>> round(float(c[0, 0]), 4)
    0.9638
    """
    x, h0, c0, w_ih, w_hh, b_ih, b_hh = _check_inputs(
        x, h0, weight_ih, weight_hh, bias_ih, bias_hh, gates=4, c0=c0)
    bias = _bias(array_module(x), b_ih, b_hh, w_hh.shape[0], x.dtype)
    y, h, c, gates, c_all = _kernels(x).lstm_forward_layer(x, w_ih, w_hh, bias, h0, c0,
                                                           bool(reverse), bool(keep_cache))
    if not keep_cache:
        return (y, h, c), None
    cache = RecurrentCache("lstm", x, h0, c0, w_ih, w_hh, b_ih is not None, "", bool(reverse),
                           {"y": y, "gates": gates, "c": c_all})
    return (y, h, c), cache


def lstm_backward(douts: tuple[Array | None, Array | None, Array | None],
                  cache: RecurrentCache, needs: Needs = None,
                  hidden_grads: Array | None = None) -> tuple[Array | None, ...]:
    """Gradients of ``lstm_forward`` by BPTT.

    With g = dL/dh_t and dc = dL/dc_t (from dc_T and step t+1)::

        dc += g * o * (1 - tanh(c_t)^2)
        dA = [dc g i(1-i), dc c_{t-1} f(1-f), dc i (1-g^2), g tanh(c_t) o(1-o)]
        dL/dc_{t-1} = dc * f,   dL/dh_{t-1} = dA W_hh

    Parameters
    ----------
    douts : tuple (dy, dh_T, dc_T)
        The gradients of the outputs (y, h_T, c_T); None: zeros.
    cache : RecurrentCache from ``lstm_forward``
    needs : tuple of 7 bool, optional
        Which of (x, h0, c0, weight_ih, weight_hh, bias_ih, bias_hh) want a gradient, as in
        ``rnn_backward``. None: all.
    hidden_grads : ndarray (T, B, H), optional
        Filled with the total dL/dh_t of every step, as in ``rnn_backward``.

    Returns
    -------
    dx (T, B, D), dh0, dc0 (B, H), dweight_ih (4H, D), dweight_hh (4H, H), dbias_ih,
    dbias_hh (4H,) — None where ``needs`` says so, and the biases' without biases.
    """
    _check_cache(cache, "lstm")
    dy, dh_T, dc_T = _douts(douts, ("dy", "dh_T", "dc_T"), "lstm")
    need = _needs(needs, 7, "lstm")
    y = cache.saved["y"]
    grads = _kernels(y).lstm_backward_layer(
        cache, _check_grad(dy, "dy", y), _check_grad(dh_T, "dh_T", cache.h0),
        _check_grad(dc_T, "dc_T", cache.h0), _hidden_out(hidden_grads, y), need[0],
        any(need[3:]))
    return _masked(grads, need)


# ---- GRU ---------------------------------------------------------------------------------

def gru_forward(x: Array, h0: Array | None, weight_ih: Array, weight_hh: Array,
                bias_ih: Array | None = None, bias_hh: Array | None = None,
                reverse: bool = False, keep_cache: bool = True
                ) -> tuple[tuple[Array, Array], RecurrentCache]:
    """GRU over a sequence, gates (r, z, n) as torch::

        r = sig(W_ir x + b_ir + W_hr h + b_hr),  z = sig(W_iz x + b_iz + W_hz h + b_hz)
        n = tanh(W_in x + b_in + r * (W_hn h + b_hn)),  h_t = (1 - z) * n + z * h_{t-1}

    Parameters
    ----------
    x : ndarray (T, B, D), float32 or float64, T >= 1
    h0 : ndarray (B, H) or None (zeros)
    weight_ih : ndarray (3H, D);  weight_hh : ndarray (3H, H)
    bias_ih, bias_hh : ndarray (3H,), or both None
    reverse : bool
    keep_cache : bool
        False when no backward will follow: as ``lstm_forward``'s (the gates and hn of
        every step are not kept), and the cache is None.

    Returns
    -------
    (y, h_T) : ndarray (T, B, H), ndarray (B, H)
    cache : RecurrentCache for ``gru_backward``, or None without ``keep_cache``

    Examples
    --------
    >>> import numpy as np
    >>> from nnkit.kernels.recurrent import gru_forward
    >>> (y, h), _ = gru_forward(np.ones((1, 1, 1)), None, np.ones((3, 1)), np.zeros((3, 1)))
    >>> round(float(h[0, 0]), 4)
    0.2048
    """
    x, h0, _, w_ih, w_hh, b_ih, b_hh = _check_inputs(x, h0, weight_ih, weight_hh, bias_ih,
                                                     bias_hh, gates=3)
    xp, GH = array_module(x), w_hh.shape[0]
    y, h, gates, hn = _kernels(x).gru_forward_layer(
        x, w_ih, w_hh, _bias(xp, b_ih, None, GH, x.dtype), _bias(xp, b_hh, None, GH, x.dtype),
        h0, bool(reverse), bool(keep_cache))
    if not keep_cache:
        return (y, h), None
    cache = RecurrentCache("gru", x, h0, None, w_ih, w_hh, b_ih is not None, "", bool(reverse),
                           {"y": y, "gates": gates, "hn": hn})
    return (y, h), cache


def gru_backward(douts: tuple[Array | None, Array | None], cache: RecurrentCache,
                 needs: Needs = None, hidden_grads: Array | None = None
                 ) -> tuple[Array | None, ...]:
    """Gradients of ``gru_forward`` by BPTT.

    With g = dL/dh_t and hn = W_hn h_{t-1} + b_hn::

        dA_n = g (1 - z)(1 - n^2),  dA_r = dA_n hn r(1-r),  dA_z = g (h_{t-1} - n) z(1-z)
        dL/dh_{t-1} = g z + [dA_r, dA_z, r dA_n] W_hh

    Parameters
    ----------
    douts : tuple (dy, dh_T)
        The gradients of the outputs (y, h_T); None: zeros.
    cache : RecurrentCache from ``gru_forward``
    needs : tuple of 6 bool, optional
        Which of (x, h0, weight_ih, weight_hh, bias_ih, bias_hh) want a gradient, as in
        ``rnn_backward``. None: all.
    hidden_grads : ndarray (T, B, H), optional
        Filled with the total dL/dh_t of every step, as in ``rnn_backward``.

    Returns
    -------
    dx (T, B, D), dh0 (B, H), dweight_ih (3H, D), dweight_hh (3H, H), dbias_ih, dbias_hh
    (3H,) — None where ``needs`` says so, and the biases' without biases.
    """
    return _one_state_backward("gru", douts, cache, needs, hidden_grads)
