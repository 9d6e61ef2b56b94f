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

Gate orders and formulas are torch's (``torch.nn.RNN/LSTM/GRU``); ``nnkit.kernels.reference``
(``reference.recurrent``) holds the naive per-step twins.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .._backend import array_module, backend, is_gpu_array, load_kernels
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


class _Steps(NamedTuple):
    """The forward time loops of one device (``nnkit._ext.recurrent_cpu`` or ``_cuda``), all
    with the CPU kernels' signature."""

    rnn_forward: Callable
    lstm_forward: Callable
    gru_forward: Callable


def _gpu_route(x) -> bool:
    """Whether x's layer runs on the GPU kernels (``nnkit._backend.backend``: CuPy arrays;
    tests send NumPy arrays down this route under the CUDA simulator by replacing this
    function)."""
    return backend(x) == "cuda"


def _steps(x) -> _Steps:
    """The kernels for x's device: Numba CPU for NumPy arrays, a cuBLAS GEMM and one
    persistent Numba CUDA launch for CuPy arrays."""
    if _gpu_route(x):
        g = _gpu_kernels()
        return _Steps(_projected(g.rnn_forward_gpu), _projected(g.lstm_forward_gpu),
                      _projected(g.gru_forward_gpu))
    c = _cpu_kernels()
    return _Steps(c.rnn_forward_cpu, c.lstm_forward_cpu, c.gru_forward_cpu)


def _cpu_kernels():
    return load_kernels("recurrent_cpu")


def _gpu_kernels():
    return load_kernels("recurrent_cuda")


def _projected(loop):
    """A GPU time loop behind the CPU kernels' signature ``(x, w_ih_t, bias, x_proj, *rest)``:
    the input projection of every step as one GEMM (cuBLAS) into ``x_proj``, the bias added,
    then ``loop(x_proj, *rest)``. (The CPU kernels project step by step on their threads.)"""

    def run(x, w_ih_t, bias, x_proj, *rest):
        T, B, D = x.shape
        flat = x_proj.reshape(T * B, -1)
        array_module(x).matmul(x.reshape(T * B, D), w_ih_t, out=flat)
        flat += bias
        return loop(x_proj, *rest)

    return run


# ---- shared GEMMs ------------------------------------------------------------------------

def _bias(xp, b_ih, b_hh, size, dtype):
    """The bias the step adds to x_t W_ih^T: b_ih (+ b_hh when given), zeros without one."""
    if b_ih is None:
        return xp.zeros(size, dtype=dtype)
    return b_ih if b_hh is None else b_ih + b_hh


def _cpu_grad_buffers(cache, count):
    """The CPU BPTT kernels' outputs: dx (T, B, D), then ``count`` packed dA buffers
    (P, T B, NR) and ``count`` (B, G H) workspaces."""
    x = cache.x
    T, B, _ = x.shape
    GH = cache.weight_hh.shape[0]
    nr = load_kernels("gemm_cpu").PANEL_WIDTH[x.dtype.name]
    packed = [_line_aligned(((GH + nr - 1) // nr, T * B, nr), x.dtype) for _ in range(count)]
    work = [np.empty((B, GH), dtype=x.dtype) for _ in range(count)]
    return np.empty_like(x), packed, work


def _line_aligned(shape, dtype):
    """An uninitialised array starting on a 64-byte cache line: the packed dA panels, whose
    rows the BPTT kernels write with non-temporal stores whole lines at a time."""
    dtype = np.dtype(dtype)
    size = int(np.prod(shape)) * dtype.itemsize
    raw = np.empty(size + 64, dtype=np.uint8)
    start = -raw.ctypes.data % 64
    return raw[start:start + size].view(dtype).reshape(shape)


def _rows_apart(shape, dtype):
    """An uninitialised (M, N) array whose rows are an odd number of 64-byte lines apart.
    The weight-gradient product reads 8 rows of it at a time down a block of columns; with
    N a power of two (T B = 8192 at the LSTM benchmark) those rows fell into the same few
    cache sets and evicted one another (the product ran ~15% slower; benchmarks/RESULTS.md,
    "The LSTM above torch again")."""
    M, N = shape
    per_line = 64 // np.dtype(dtype).itemsize
    lines = -(-N // per_line)
    lines += 1 - lines % 2
    return np.empty((M, lines * per_line), dtype=dtype)[:, :N]


def _cpu_weight_grads(cache, dx, gpx, gph):
    """(dx, dW_ih, dW_hh, db_ih, db_hh) from dx and the packed dA of the CPU BPTT kernels:
    [dW_ih, db, dW_hh]^T = [x; 1; h_prev]^T dA, one product when dA_x is dA_h (RNN, LSTM),
    else [dW_ih, db_ih]^T = [x; 1]^T dA_x and [dW_hh, db_hh]^T = [h_prev; 1]^T dA_h."""
    kernels = _cpu_kernels()
    packed_weight_grads, transposed_inputs_cpu = (kernels.packed_weight_grads,
                                                  kernels.transposed_inputs_cpu)
    x, y = cache.x, cache.saved["y"]
    T, B, D = x.shape
    GH, H = cache.weight_hh.shape
    shared = gph is gpx  # one product over [x; 1; h_prev]
    at = _rows_apart((D + 1 + H + (0 if shared else 1), T * B), x.dtype)
    at[D] = 1
    if not shared:
        at[D + 1 + H] = 1
    transposed_inputs_cpu(x.reshape(T * B, D), y, cache.h0, cache.reverse, at, D + 1)
    if shared:
        dw = packed_weight_grads(at, gpx)[:GH]  # (G H, D + 1 + H)
        dw_x, dw_h = dw[:, :D + 1], dw[:, D + 1:]
        db_x = db_h = dw[:, D]
    else:
        dw_x = packed_weight_grads(at[:D + 1], gpx)[:GH]  # (G H, D + 1)
        dw_h = packed_weight_grads(at[D + 1:], gph)[:GH]  # (G H, H + 1)
        db_x, db_h = dw_x[:, D], dw_h[:, H]
    dw_ih = np.ascontiguousarray(dw_x[:, :D])
    dw_hh = np.ascontiguousarray(dw_h[:, :H])
    if not cache.has_bias:
        return dx, dw_ih, dw_hh, None, None
    return dx, dw_ih, dw_hh, db_x.copy(), db_h.copy()


def _gpu_weight_grads(cache, dgx, dgh):
    """(dx, dW_ih, dW_hh, db_ih, db_hh) from the pre-activation gradients of all steps
    (T, B, G H) on the GPU: one cuBLAS GEMM each."""
    x, y, h0 = cache.x, cache.saved["y"], cache.h0
    T, B, D = x.shape
    GH, H = cache.weight_hh.shape
    # the step at t reads h_{t-1} = y[t-1] (y[t+1] in reverse), and h0 at the first step
    first, later, prev = (T - 1, slice(0, T - 1), slice(1, T)) if cache.reverse else (
        0, slice(1, T), slice(0, T - 1))
    dgx2 = dgx.reshape(T * B, GH)  # (T*B, G*H)
    dx = (dgx2 @ cache.weight_ih).reshape(T, B, D)
    dw_ih = dgx2.T @ x.reshape(T * B, D)
    dw_hh = dgh[first].T @ h0
    if T > 1:
        dw_hh += dgh[later].reshape(-1, GH).T @ y[prev].reshape(-1, H)
    if not cache.has_bias:
        return dx, dw_ih, dw_hh, None, None
    db_ih = dgx2.sum(axis=0)
    db_hh = db_ih.copy() if dgh is dgx else dgh.reshape(T * B, GH).sum(axis=0)
    return dx, dw_ih, dw_hh, db_ih, db_hh


# ---- Elman RNN ---------------------------------------------------------------------------

def rnn_forward(x, h0, weight_ih, weight_hh, bias_ih=None, bias_hh=None,
                nonlinearity="tanh", reverse=False):
    """Elman RNN over a sequence: h_t = phi(W_ih x_t + b_ih + W_hh h_{t-1} + b_hh).

    In the notes' notation z_t = phi(U z_{t-1} + V x_t): U = weight_hh, V = weight_ih.

    Parameters
    ----------
    x : ndarray (T, B, D), float32 or float64, T >= 1
    h0 : ndarray (B, H) or None (zeros)
    weight_ih : ndarray (H, D);  weight_hh : ndarray (H, H)
    bias_ih, bias_hh : ndarray (H,), or both None
    nonlinearity : {'tanh', 'relu'}
    reverse : bool
        Run from t = T-1 down to 0 (the reverse direction of a bidirectional layer).

    Returns
    -------
    y : ndarray (T, B, H)
        h_t for every t.
    h_T : ndarray (B, H)
        The last state (y[T-1], or y[0] when reverse).
    cache : RecurrentCache
        For ``rnn_backward``.

    Examples
    --------
    >>> import numpy as np
    >>> from nnkit.kernels.recurrent import rnn_forward
    >>> y, h, _ = rnn_forward(np.ones((3, 1, 1)), None, np.ones((1, 1)), np.zeros((1, 1)))
    >>> np.round(y.ravel(), 4)
    array([0.7616, 0.7616, 0.7616])
    """
    check_choice(nonlinearity, name="nonlinearity", choices=("tanh", "relu"))
    x, h0, _, w_ih, w_hh, b_ih, b_hh = _check_inputs(x, h0, weight_ih, weight_hh, bias_ih,
                                                     bias_hh, gates=1)
    T, B, _ = x.shape
    H = w_hh.shape[0]
    xp = array_module(x)
    y = xp.empty((T, B, H), dtype=x.dtype)
    h = xp.empty((B, H), dtype=x.dtype)
    steps = _steps(x)
    steps.rnn_forward(x, w_ih.T, _bias(xp, b_ih, b_hh, H, x.dtype), xp.empty_like(y), h0,
                      w_hh.T, nonlinearity == "relu", bool(reverse), y, h)
    cache = RecurrentCache("rnn", x, h0, None, w_ih, w_hh, b_ih is not None, nonlinearity,
                           bool(reverse), {"y": y})
    return y, h, cache


def rnn_backward(dy, dh_T, cache, hidden_grads=None):
    """Gradients of ``rnn_forward`` by BPTT.

    With a_t the pre-activation and g_t = dL/dh_t (from dy and from step t+1)::

        dA_t = g_t * phi'(a_t),   dL/dh_{t-1} += dA_t W_hh

    Parameters
    ----------
    dy : ndarray (T, B, H) or None (zeros)
    dh_T : ndarray (B, H) or None (zeros)
        Gradient with respect to the returned last state.
    cache : RecurrentCache from ``rnn_forward``
    hidden_grads : ndarray (T, B, H), x's dtype, optional
        Filled with the total dL/dh_t of every step (the notes' dL/dz_t: the direct part
        dy[t] plus everything that flows back through later steps).

    Returns
    -------
    dx (T, B, D), dh0 (B, H), dweight_ih (H, D), dweight_hh (H, H), dbias_ih (H,),
    dbias_hh (H,) — the biases' None when the forward had none.
    """
    _check_cache(cache, "rnn")
    y = cache.saved["y"]
    xp = array_module(y)
    dy = _check_grad(dy, "dy", y)
    dh_T = _check_grad(dh_T, "dh_T", cache.h0)
    dh = xp.empty_like(cache.h0)
    relu, hidden = cache.nonlinearity == "relu", _hidden_out(hidden_grads, y)
    if _gpu_route(y):
        da = xp.empty_like(y)
        _gpu_kernels().rnn_backward_gpu(dy, dh_T, y, cache.weight_hh, relu, cache.reverse, da,
                                        dh, hidden)
        grads = _gpu_weight_grads(cache, da, da)
    else:
        dx, (gp,), (work,) = _cpu_grad_buffers(cache, 1)
        _cpu_kernels().rnn_backward_cpu(dy, dh_T, y, cache.weight_hh, cache.weight_ih, relu,
                                        cache.reverse, dx, gp, work, dh, hidden)
        grads = _cpu_weight_grads(cache, dx, gp, gp)
    dx, dw_ih, dw_hh, db_ih, db_hh = grads
    return dx, dh, dw_ih, dw_hh, db_ih, db_hh


# ---- LSTM --------------------------------------------------------------------------------

def lstm_forward(x, h0, c0, weight_ih, weight_hh, bias_ih=None, bias_hh=None, reverse=False,
                 stacked=False, keep_cache=True):
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
    stacked : bool
        Return, in place of y, one (T + 1, B, H) array holding y (its first T slots) and
        c_T (the last; the c_T returned is a view of it), for a caller that wants them
        together without a copy.
    keep_cache : bool
        False when no backward will follow (inference): the gates and cell states of every
        step are not kept (on the CPU only one step's are held), and the cache is None.

    Returns
    -------
    y : ndarray (T, B, H) ((T + 1, B, H) with ``stacked``);  h_T, c_T : ndarray (B, H)
    cache : RecurrentCache, or None without ``keep_cache``

    Examples
    --------
    >>> import numpy as np
    >>> from nnkit.kernels.recurrent import lstm_forward
    >>> y, h, c, _ = lstm_forward(np.ones((2, 1, 1)), None, None, np.ones((4, 1)),
    ...                           np.zeros((4, 1)))
    >>> round(float(c[0, 0]), 4)
    0.9638
    """
    x, h0, c0, w_ih, w_hh, b_ih, b_hh = _check_inputs(
        x, h0, weight_ih, weight_hh, bias_ih, bias_hh, gates=4, c0=c0)
    T, B, _ = x.shape
    H = w_hh.shape[1]
    xp = array_module(x)
    gpu = _gpu_route(x)
    slots = T if keep_cache or gpu else 1  # steps whose gates and c the CPU kernel keeps
    gates = xp.empty((slots, B, 4 * H), dtype=x.dtype)
    if stacked:
        y_c = xp.empty((T + 1, B, H), dtype=x.dtype)
        y, c = y_c[:T], y_c[T]
    else:
        y, c = xp.empty((T, B, H), dtype=x.dtype), xp.empty_like(h0)
    c_all = xp.empty((slots, B, H), dtype=x.dtype)
    h = xp.empty_like(h0)
    # the CPU kernel's workspace: [x_t, h_{t-1}] rows (one GEMM per step); none on the GPU
    work = xp.empty((0, 0) if gpu else (B, x.shape[2] + H), dtype=x.dtype)
    _steps(x).lstm_forward(x, w_ih.T, _bias(xp, b_ih, b_hh, 4 * H, x.dtype), gates, h0, c0,
                           w_hh.T, bool(reverse), y, c_all, h, c, work)
    out = y_c if stacked else y
    if not keep_cache:
        return out, h, c, None
    cache = RecurrentCache("lstm", x, h0, c0, w_ih, w_hh, b_ih is not None, "", bool(reverse),
                           {"y": y, "gates": gates, "c": c_all})
    return out, h, c, cache


def lstm_backward(dy, dh_T, dc_T, cache, hidden_grads=None):
    """Gradients of ``lstm_forward`` by BPTT.

    With g = dL/dh_t and dc = dL/dc_t (from dc_T and step t+1)::

        dc += g * o * (1 - tanh(c_t)^2)
        dA = [dc g i(1-i), dc c_{t-1} f(1-f), dc i (1-g^2), g tanh(c_t) o(1-o)]
        dL/dc_{t-1} = dc * f,   dL/dh_{t-1} = dA W_hh

    Returns
    -------
    dx (T, B, D), dh0, dc0 (B, H), dweight_ih (4H, D), dweight_hh (4H, H), dbias_ih,
    dbias_hh (4H,) or None.
    """
    _check_cache(cache, "lstm")
    y, gates, c_all = cache.saved["y"], cache.saved["gates"], cache.saved["c"]
    xp = array_module(y)
    dy = _check_grad(dy, "dy", y)
    dh_T = _check_grad(dh_T, "dh_T", cache.h0)
    dc_T = _check_grad(dc_T, "dc_T", cache.h0)
    dh, dc = xp.empty_like(cache.h0), xp.empty_like(cache.h0)
    hidden = _hidden_out(hidden_grads, y)
    if _gpu_route(y):
        dgates = xp.empty_like(gates)
        _gpu_kernels().lstm_backward_gpu(dy, dh_T, dc_T, cache.c0, gates, c_all,
                                         cache.weight_hh, cache.reverse, dgates, dh, dc, hidden)
        grads = _gpu_weight_grads(cache, dgates, dgates)
    else:
        dx, (gp,), (work,) = _cpu_grad_buffers(cache, 1)
        _cpu_kernels().lstm_backward_cpu(dy, dh_T, dc_T, cache.c0, gates, c_all,
                                         cache.weight_hh, cache.weight_ih, cache.reverse, dx,
                                         gp, work, dh, dc, hidden)
        grads = _cpu_weight_grads(cache, dx, gp, gp)
    dx, dw_ih, dw_hh, db_ih, db_hh = grads
    return dx, dh, dc, dw_ih, dw_hh, db_ih, db_hh


# ---- GRU ---------------------------------------------------------------------------------

def gru_forward(x, h0, weight_ih, weight_hh, bias_ih=None, bias_hh=None, reverse=False,
                keep_cache=True):
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
    y : ndarray (T, B, H);  h_T : ndarray (B, H);  cache : RecurrentCache or None

    Examples
    --------
    >>> import numpy as np
    >>> from nnkit.kernels.recurrent import gru_forward
    >>> y, h, _ = gru_forward(np.ones((1, 1, 1)), None, np.ones((3, 1)), np.zeros((3, 1)))
    >>> round(float(h[0, 0]), 4)
    0.2048
    """
    x, h0, _, w_ih, w_hh, b_ih, b_hh = _check_inputs(x, h0, weight_ih, weight_hh, bias_ih,
                                                     bias_hh, gates=3)
    T, B, _ = x.shape
    H = w_hh.shape[1]
    xp = array_module(x)
    slots = T if keep_cache or _gpu_route(x) else 1  # steps whose gates the CPU keeps
    gates = xp.empty((slots, B, 3 * H), dtype=x.dtype)
    y = xp.empty((T, B, H), dtype=x.dtype)
    hn = xp.empty((slots, B, H), dtype=x.dtype)
    h = xp.empty_like(h0)
    gh = xp.empty((B, 3 * H), dtype=x.dtype)
    steps = _steps(x)
    steps.gru_forward(x, w_ih.T, _bias(xp, b_ih, None, 3 * H, x.dtype), gates, h0, w_hh.T,
                      _bias(xp, b_hh, None, 3 * H, x.dtype), bool(reverse), y, hn, h, gh)
    if not keep_cache:
        return y, h, None
    cache = RecurrentCache("gru", x, h0, None, w_ih, w_hh, b_ih is not None, "", bool(reverse),
                           {"y": y, "gates": gates, "hn": hn})
    return y, h, cache


def gru_backward(dy, dh_T, cache, hidden_grads=None):
    """Gradients of ``gru_forward`` by BPTT.

    With g = dL/dh_t and hn = W_hn h_{t-1} + b_hn::

        dA_n = g (1 - z)(1 - n^2),  dA_r = dA_n hn r(1-r),  dA_z = g (h_{t-1} - n) z(1-z)
        dL/dh_{t-1} = g z + [dA_r, dA_z, r dA_n] W_hh

    Returns
    -------
    dx (T, B, D), dh0 (B, H), dweight_ih (3H, D), dweight_hh (3H, H), dbias_ih, dbias_hh
    (3H,) or None.
    """
    _check_cache(cache, "gru")
    y, gates, hn = cache.saved["y"], cache.saved["gates"], cache.saved["hn"]
    xp = array_module(y)
    dy = _check_grad(dy, "dy", y)
    dh_T = _check_grad(dh_T, "dh_T", cache.h0)
    dh = xp.empty_like(cache.h0)
    hidden = _hidden_out(hidden_grads, y)
    if _gpu_route(y):
        dgx, dgh = xp.empty_like(gates), xp.empty_like(gates)
        _gpu_kernels().gru_backward_gpu(dy, dh_T, cache.h0, y, gates, hn, cache.weight_hh,
                                        cache.reverse, dgx, dgh, dh, hidden)
        grads = _gpu_weight_grads(cache, dgx, dgh)
    else:
        dx, (gpx, gph), (work_x, work_h) = _cpu_grad_buffers(cache, 2)
        _cpu_kernels().gru_backward_cpu(dy, dh_T, cache.h0, y, gates, hn, cache.weight_hh,
                                        cache.weight_ih, cache.reverse, dx, gpx, gph, work_x,
                                        work_h, dh, np.empty_like(dh), hidden)
        grads = _cpu_weight_grads(cache, dx, gpx, gph)
    dx, dw_ih, dw_hh, db_ih, db_hh = grads
    return dx, dh, dw_ih, dw_hh, db_ih, db_hh
