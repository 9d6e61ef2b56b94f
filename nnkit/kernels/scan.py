"""The diagonal linear recurrence (linear scan): validated forward/backward pair, dispatch.

    h_t = a_t * h_{t-1} + b_t,   t = 0..T-1,   h_{-1} = h0        (elementwise, (B, T, D))

``reverse=True`` runs t from T-1 down to 0 with h_t = a_t * h_{t+1} + b_t (h0 the state after
the end). Real (float32/64) and complex (complex64/128); a, b, h0 share one dtype.

Backward, for a real loss L and upstream dh = dL/dh (complex gradients in the conjugate
convention of ``nnkit.autograd``, g = dL/dRe + i dL/dIm), is a scan against the direction:

    g_t = dh_t + conj(a_{t+1}) g_{t+1},  dL/db_t = g_t,  dL/da_t = g_t conj(h_{t-1}),
    dL/dh0 = conj(a_0) g_0.

Each forward returns ``(h, cache)``; each backward takes ``(dh, cache, needs=None)`` and
returns the gradients of the forward's inputs in their order (a, b, h0), None where
``needs`` says an input wants none.

The backend is chosen by ``nnkit._backend.kernels_for``: NumPy arrays run on
``nnkit._ext.scan_cpu`` (over sequences, or chunked along T when there are too few of them
to feed the threads; its docstring says when and why), GPU arrays on ``nnkit._ext.scan_cuda``
(imported lazily: one thread per sequence when there are many sequences, else one
single-pass kernel with a decoupled look-back along T). Both expose ``linear_scan`` and
``linear_scan_backward``. The log-space scan runs on the CPU only.

Examples
--------
>>> import numpy as np
>>> from nnkit.kernels.scan import linear_scan_backward, linear_scan_forward
>>> a = np.full((1, 3, 1), 0.5); b = np.ones((1, 3, 1))
>>> h, cache = linear_scan_forward(a, b)
>>> h[0, :, 0].tolist()
[1.0, 1.5, 1.75]
>>> da, db, dh0 = linear_scan_backward(np.ones_like(h), cache)
>>> db[0, :, 0].tolist()
[1.75, 1.5, 1.0]
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import numpy as np

from .._backend import array_module, backend, kernels_for
from .._types import Array, Needs
from .._validation import (
    COMPLEX,
    FLOATS,
    check_array,
    check_bool,
    check_cache,
    check_choice,
    check_grad,
    check_out,
    check_same_device,
)

__all__ = ["ScanCache", "LogScanCache", "linear_scan_forward", "linear_scan_backward",
           "log_linear_scan_forward", "log_linear_scan_backward", "SCAN_ALGORITHMS"]

SCAN_ALGORITHMS = ("sequential", "hillis_steele", "blelloch")

SCAN_DTYPES = FLOATS + COMPLEX


ScanAlgorithm = Literal["sequential", "hillis_steele", "blelloch"]


class ScanCache(NamedTuple):
    """What ``linear_scan_backward`` reads."""

    a: object  # (B, T, D) the coefficients
    h: object  # (B, T, D) the forward's output (``out`` itself when one was given)
    h0: object  # (B, D) the initial state (zeros when the forward had none)
    reverse: bool


class LogScanCache(NamedTuple):
    """What ``log_linear_scan_backward`` reads."""

    log_a: object  # (B, T, D)
    log_b: object  # (B, T, D)
    log_h: object  # (B, T, D) the forward's output
    log_h0: object  # (B, D) (-inf when the forward had none)


# ---- validation ------------------------------------------------------------------------

def _check_pair(a, b, name_a="a", name_b="b"):
    a = check_array(a, name=name_a, ndim=3, dtype=SCAN_DTYPES)
    b = check_array(b, name=name_b, ndim=3, dtype=SCAN_DTYPES)
    check_same_device(b, a, name=name_b, like_name=name_a)
    if a.dtype != b.dtype:
        kind = ("mixed real and complex dtypes" if (a.dtype.kind == "c") != (b.dtype.kind == "c")
                else "different dtypes")
        raise TypeError(f"{name_a} and {name_b} must have the same dtype, got {a.dtype} and "
                        f"{b.dtype} ({kind}); cast one of them")
    if a.shape != b.shape:
        raise ValueError(f"{name_a} and {name_b} must have the same shape (B, T, D), got "
                         f"{tuple(a.shape)} and {tuple(b.shape)}")
    return a, b


def _check_h0(h0, a, names=("h0", "a", "b")):
    """The initial state (B, D) of ``a`` (B, T, D); ``names``: (state, a, b) as the caller
    calls them (the log-space scan's log_h0, log_a, log_b)."""
    h, na, nb = names
    B, _, D = a.shape
    if h0 is None:
        return array_module(a).zeros((B, D), dtype=a.dtype)
    h0 = check_array(h0, name=h, ndim=2, dtype=SCAN_DTYPES)
    check_same_device(h0, a, name=h, like_name=na)
    if h0.dtype != a.dtype:
        raise TypeError(f"{h} must have the dtype of {na} and {nb} ({a.dtype}), got {h0.dtype}")
    if tuple(h0.shape) != (B, D):
        raise ValueError(f"{h} must have shape (B, D) = {(B, D)} to match {na} of shape "
                         f"{tuple(a.shape)}, got {tuple(h0.shape)}")
    return h0


def _check_grads_out(out, a, h0):
    """``out`` of the backward: a tuple (da, db, dh0) of outputs, each as ``check_out``."""
    if not isinstance(out, (tuple, list)) or len(out) != 3:
        got = f"{len(out)} arrays" if isinstance(out, (tuple, list)) else type(out).__name__
        raise TypeError(f"out must be a tuple of 3 arrays (da, db, dh0), got {got}")
    return (check_out(out[0], a, name="out[0] (da)", like_name="a"),
            check_out(out[1], a, name="out[1] (db)", like_name="a"),
            check_out(out[2], h0, name="out[2] (dh0)", like_name="h0"))


# ---- public pair -----------------------------------------------------------------------

def _kernels(a, name="a"):
    """scan_cpu for NumPy arrays, scan_cuda for GPU arrays."""
    return kernels_for("scan_cpu", "scan_cuda", a, name=name)


def _needed(grads, needs):
    """``grads`` with None where ``needs`` (None: all) says an input wants no gradient."""
    if needs is None:
        return grads
    return tuple(g if need else None for g, need in zip(grads, needs, strict=True))


def _tree_into(a, b, h0, reverse, algorithm, out):
    """out = the tree scan of (a, b) (flipped along T for ``reverse``); CPU arrays only."""
    from .scan_tree import tree_scan  # scan_tree builds on this module's checks

    try:
        kernels_for("scan_tree_cpu", None, a, name="a")
    except TypeError as err:
        raise TypeError(f"{err}: algorithm={algorithm!r} is a tree scan on the CPU; use "
                        "algorithm='sequential' on the GPU") from None
    step = -1 if reverse else 1
    out[:, ::step] = tree_scan(a[:, ::step], b[:, ::step], h0, algorithm=algorithm)[0]


def linear_scan_forward(a: Array, b: Array, h0: Array | None = None, reverse: bool = False,
                        out: Array | None = None, algorithm: ScanAlgorithm = "sequential",
                        ) -> tuple[Array, ScanCache]:
    """h_t = a_t * h_{t-1} + b_t over (B, T, D) (``reverse``: h_t = a_t * h_{t+1} + b_t).

    Parameters
    ----------
    a, b : array (B, T, D), float32/64 or complex64/128, one dtype
    h0 : array (B, D) or None (zeros), same dtype
    reverse : bool
    out : array (B, T, D) of a's dtype, optional (C-contiguous; written and returned)
    algorithm : 'sequential' (default: sequential in T, the work-efficient kernels above),
        'hillis_steele' or 'blelloch' (the tree scans of ``nnkit.kernels.tree_scan``, depth
        O(log T); CPU only). The backward is the same reverse scan whichever ran.

    Returns
    -------
    h : array (B, T, D)
    cache : ScanCache, for ``linear_scan_backward`` (it holds ``h`` itself, not a copy)
    """
    a, b = _check_pair(a, b)
    h0 = _check_h0(h0, a)
    reverse = check_bool(reverse, name="reverse")
    algorithm = check_choice(algorithm, name="algorithm", choices=SCAN_ALGORITHMS)
    out = array_module(a).empty_like(a) if out is None else check_out(out, a, like_name="a")
    kernels = _kernels(a)
    if algorithm == "sequential":
        kernels.linear_scan(a, b, h0, out, reverse)
    else:
        _tree_into(a, b, h0, reverse, algorithm, out)
    return out, ScanCache(a, out, h0, reverse)


def linear_scan_backward(dh: Array, cache: ScanCache, needs: Needs = None,
                         out: tuple[Array, Array, Array] | None = None,
                         ) -> tuple[Array | None, Array | None, Array | None]:
    """Gradients of the linear scan (see the module docstring for the formulas).

    Parameters
    ----------
    dh : array (B, T, D), the upstream gradient dL/dh, h's dtype and device
    cache : ScanCache from ``linear_scan_forward``
    needs : tuple of 3 bool, optional
        ``nnkit.autograd.apply_op``'s mask over (a, b, h0) (None: all). One reverse scan
        gives all three; those not needed are returned as None.
    out : tuple (da, db, dh0) of preallocated C-contiguous arrays, optional

    Returns
    -------
    da, db : arrays (B, T, D); dh0 : array (B, D) (None where not needed)
    """
    a, h, h0, reverse = check_cache(cache, ScanCache, forward="linear_scan_forward")
    dh = check_grad(dh, shape=a.shape, dtype=a.dtype, device=backend(a), name="dh",
                    dtypes=SCAN_DTYPES)
    return _needed(_backward(dh, a, h, h0, reverse, out), needs)


def _backward(dh, a, h, h0, reverse, out):
    """(da, db, dh0) of the linear scan into ``out`` (or fresh arrays); checks ``out`` only."""
    xp = array_module(a)
    da, db, dh0 = ((xp.empty_like(a), xp.empty_like(a), xp.empty_like(h0)) if out is None
                   else _check_grads_out(out, a, h0))
    _kernels(a).linear_scan_backward(dh, a, h, h0, da, db, dh0, reverse)
    return da, db, dh0


# ---- the log-space scan (minGRU / minLSTM "log-space" variant) -------------------------------

def log_linear_scan_forward(log_a: Array, log_b: Array, log_h0: Array | None = None,
                            ) -> tuple[Array, LogScanCache]:
    """log h_t = logaddexp(log a_t + log h_{t-1}, log b_t): the scan of positive a, b in logs.

    Feng et al. (2024)'s log-space minGRU: for long sequences the products of many gates
    underflow in float32 while their logs do not.

    Parameters
    ----------
    log_a, log_b : array (B, T, D), float32/64 (-inf allowed: a or b = 0)
    log_h0 : array (B, D) or None (-inf: h0 = 0)

    Returns
    -------
    log_h : array (B, T, D)
    cache : LogScanCache, for ``log_linear_scan_backward``
    """
    log_a, log_b = _check_pair(log_a, log_b, "log_a", "log_b")
    kernels = kernels_for("scan_cpu", None, log_a, name="log_a")
    if log_a.dtype.kind != "f":
        raise TypeError(f"log_a and log_b must be real NumPy arrays, got {log_a.dtype}")
    B, T, D = log_a.shape
    log_h0 = (np.full((B, D), -np.inf, log_a.dtype) if log_h0 is None
              else _check_h0(log_h0, log_a, ("log_h0", "log_a", "log_b")))
    out = kernels.log_linear_scan(log_a, log_b, log_h0, np.empty_like(log_a))
    return out, LogScanCache(log_a, log_b, out, log_h0)


def log_linear_scan_backward(dlog_h: Array, cache: LogScanCache, needs: Needs = None,
                             ) -> tuple[Array | None, Array | None, Array | None]:
    """Gradients of the log-space scan. With w_t = exp(log a_t + log h_{t-1} - log h_t) (the
    share of the carried term, 0 where h_{t-1} = 0),

        G_t = dlog_h_t + w_{t+1} G_{t+1},  dlog_a_t = w_t G_t,  dlog_b_t = (1 - w_t) G_t,
        dlog_h0 = w_0 G_0,

    G by the (real) linear-scan backward kernel. ``dlog_h`` has log_h's shape and dtype;
    ``cache`` is ``log_linear_scan_forward``'s; ``needs`` as in ``linear_scan_backward``.
    Returns (dlog_a, dlog_b, dlog_h0), None where not needed.
    """
    log_a, _, log_h, log_h0 = check_cache(cache, LogScanCache,
                                          forward="log_linear_scan_forward")
    dlog_h = check_grad(dlog_h, shape=log_a.shape, dtype=log_a.dtype, device="cpu",
                        name="dlog_h")
    B, T, D = log_a.shape
    prev = np.concatenate([log_h0[:, None], log_h[:, :-1]], axis=1)  # (B, T, D) log h_{t-1}
    with np.errstate(invalid="ignore"):
        w = np.exp(log_a + prev - log_h)
    w = np.nan_to_num(w, nan=0.0)  # -inf - -inf: both terms zero, no share
    _, G, _ = _backward(dlog_h, w, np.zeros_like(w), np.zeros((B, D), log_a.dtype), False, None)
    dlog_a = w * G
    dlog_b = G - dlog_a
    dlog_h0 = w[:, 0] * G[:, 0] if T > 0 else np.zeros((B, D), log_a.dtype)
    return _needed((dlog_a, dlog_b, dlog_h0), needs)
