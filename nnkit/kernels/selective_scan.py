"""The selective scan (Mamba's S6 recurrence, Gu and Dao 2023): validated forward/backward
pair, dispatch.

    dt_t = softplus(delta_t + delta_bias)   (without ``delta_softplus``: delta_t + delta_bias)
    x_t = exp(dt_t A) * x_{t-1} + dt_t B_t u_t,   x_{-1} = 0          (per channel d: (N,))
    y_t = <C_t, x_t> + D u_t,   times silu(z_t) when z is given

with mamba_ssm's ``selective_scan_ref`` layouts: u, delta, z (batch, dim, L); A (dim, N);
B and C time-invariant (dim, N), varying (batch, N, L), or varying in G groups
(batch, G, N, L), channel d reading group d // (dim // G); D, delta_bias (dim,). Real
float32/float64, one dtype for all (the reference computes in float32 whatever its input;
here float64 inputs compute in float64).

The kernels never materialise the (batch, dim, L, N) tensors exp(dt A) and dt B u: the
CPU's (``nnkit._ext.selective_scan_cpu``) walk each (b, d) row with its (N,) state in L1,
the GPU's (``nnkit._ext.selective_scan_cuda``) one thread per row with the state in a
coalesced per-thread scratch (any N). The forward keeps the state every ``CHUNK`` = 64
steps; the backward recomputes a chunk's states from there and walks it backwards:

    g_t = dL/dx_t = dy'_t C_t + exp(dt_{t+1} A) g_{t+1}   (g_{L-1} starts from dL/dx_{L-1}),
    dA += g_t x_{t-1} exp(dt_t A) dt_t,  dB_t += g_t dt_t u_t,  dC_t += dy'_t x_t,
    ddt_t = sum_n g_t (x_{t-1} exp(dt_t A) A + B_t u_t),  du_t = dy'_t D + sum_n g_t dt_t B_t

(dy' the gradient of y before the gate; the softplus' derivative is the sigmoid).

Examples
--------
>>> import numpy as np
>>> from nnkit.kernels.selective_scan import selective_scan_forward
>>> u = np.ones((1, 1, 3)); A = np.array([[-np.log(2.0)]])
>>> y, _ = selective_scan_forward(u, np.ones((1, 1, 3)), A, np.ones((1, 1)), np.ones((1, 1)))
>>> y[0, 0].tolist()
[1.0, 1.5, 1.75]
"""

from __future__ import annotations

from typing import NamedTuple

from .._backend import array_module, backend, kernels_for
from .._types import Array, Needs
from .._validation import (
    FLOATS,
    check_array,
    check_bool,
    check_cache,
    check_companion,
    check_grad,
    check_same_device,
)

__all__ = ["SelectiveScanCache", "selective_scan_forward", "selective_scan_backward", "CHUNK"]

CHUNK = 64  # steps between two saved states (the CPU and GPU kernels' ``CHUNK``)


class SelectiveScanCache(NamedTuple):
    """What ``selective_scan_backward`` reads: the forward's inputs in the kernels' layouts,
    and the states it saved."""

    u: object  # (batch, dim, L)
    delta: object  # (batch, dim, L)
    A: object  # (dim, N)
    Bm: object  # (batch, G, L, N) varying, or (1, dim, 1, N) time-invariant
    Cm: object
    D: object  # (dim,) zeros when absent
    z: object  # (batch, dim, L), or (0, 0, 0) when absent
    bias: object  # (dim,) zeros when absent
    delta_softplus: bool
    B_ndim: int  # the user's rank of B (2, 3 or 4), to give dB that layout
    C_ndim: int
    given: tuple  # whether D, z, delta_bias were given
    checkpoints: object  # (batch, dim, ceil(L / CHUNK), N) the state before every chunk
    return_last_state: bool


# ---- validation ---------------------------------------------------------------------------

def _check_like(x, u, name, shape, what):
    return check_companion(x, u, name=name, like_name="u", shape=shape, what=what)


def _check_BC(M, name, u, N):
    """B or C in one of its three layouts -> (the kernels' (rows, G, L, N) array, rank)."""
    batch, dim, L = u.shape
    M = check_array(M, name=name, ndim=(2, 3, 4), dtype=FLOATS)
    check_same_device(M, u, name=name, like_name="u")
    if M.dtype != u.dtype:
        raise TypeError(f"{name} must have u's dtype ({u.dtype}), got {M.dtype}; cast it")
    if M.ndim == 2:
        if tuple(M.shape) != (dim, N):
            raise ValueError(f"{name} must have shape (dim, N) = {(dim, N)} (rank 2: "
                             f"time-invariant), got {tuple(M.shape)}")
        return M.reshape(1, dim, 1, N), 2
    G = 1 if M.ndim == 3 else M.shape[1]
    expected = (batch, N, L) if M.ndim == 3 else (batch, G, N, L)
    layout = "(batch, N, L)" if M.ndim == 3 else "(batch, G, N, L)"
    if tuple(M.shape) != expected or G == 0:
        raise ValueError(f"{name} must have shape {layout} = {expected} (rank {M.ndim}) for "
                         f"u of shape {tuple(u.shape)} and A with N = {N}, got "
                         f"{tuple(M.shape)}")
    if dim % G:
        raise ValueError(f"{name} has {G} groups, which must divide dim = {dim}")
    xp = array_module(u)
    return xp.ascontiguousarray(M.reshape(batch, G, N, L).transpose(0, 1, 3, 2)), M.ndim


def check_inputs(u: Array, delta: Array, A: Array, B: Array, C: Array, D: Array | None,
                 z: Array | None, delta_bias: Array | None) -> tuple:
    """The inputs validated, in the kernels' layouts: (u, delta, A, Bm, B's rank, Cm, C's
    rank, D, z, bias, which of D, z, delta_bias were given)."""
    u = check_array(u, name="u", ndim=3, dtype=FLOATS)
    batch, dim, L = u.shape
    delta = _check_like(delta, u, "delta", u.shape, "(batch, dim, L)")
    A = check_array(A, name="A", ndim=2, dtype=FLOATS)
    check_same_device(A, u, name="A", like_name="u")
    if A.dtype != u.dtype:
        raise TypeError(f"A must have u's dtype ({u.dtype}), got {A.dtype}; cast it")
    if A.shape[0] != dim:
        raise ValueError(f"A must have shape (dim, N) with dim = {dim} (u's axis 1), got "
                         f"{tuple(A.shape)}")
    N = A.shape[1]
    Bm, B_ndim = _check_BC(B, "B", u, N)
    Cm, C_ndim = _check_BC(C, "C", u, N)
    xp = array_module(u)
    given = (D is not None, z is not None, delta_bias is not None)
    D = xp.zeros(dim, u.dtype) if D is None else _check_like(D, u, "D", (dim,), "(dim,)")
    z = (xp.zeros((0, 0, 0), u.dtype) if z is None
         else _check_like(z, u, "z", u.shape, "(batch, dim, L)"))
    bias = (xp.zeros(dim, u.dtype) if delta_bias is None
            else _check_like(delta_bias, u, "delta_bias", (dim,), "(dim,)"))
    return u, delta, A, Bm, B_ndim, Cm, C_ndim, D, z, bias, given


# ---- the pair -----------------------------------------------------------------------------

def _kernels(u):
    return kernels_for("selective_scan_cpu", "selective_scan_cuda", u, name="u")


def selective_scan_forward(u: Array, delta: Array, A: Array, B: Array, C: Array,
                           D: Array | None = None, z: Array | None = None,
                           delta_bias: Array | None = None, delta_softplus: bool = False,
                           return_last_state: bool = False):
    """The selective scan (see the module docstring).

    Parameters
    ----------
    u, delta : array (batch, dim, L), float32/64
    A : array (dim, N)
    B, C : array (dim, N), (batch, N, L) or (batch, G, N, L), G dividing dim
    D, delta_bias : array (dim,) or None
    z : array (batch, dim, L) or None (no gate)
    delta_softplus : bool
    return_last_state : bool

    Returns
    -------
    y : array (batch, dim, L), or (y, last_state (batch, dim, N)) with ``return_last_state``
    cache : SelectiveScanCache, for ``selective_scan_backward``
    """
    u, delta, A, Bm, B_ndim, Cm, C_ndim, D, z, bias, given = check_inputs(
        u, delta, A, B, C, D, z, delta_bias)
    softplus_on = check_bool(delta_softplus, name="delta_softplus")
    return_last_state = check_bool(return_last_state, name="return_last_state")
    xp = array_module(u)
    batch, dim, L = u.shape
    N = A.shape[1]
    y = xp.empty_like(u)
    last = xp.empty((batch, dim, N), u.dtype)
    checkpoints = xp.empty((batch, dim, -(-L // CHUNK), N), u.dtype)
    _kernels(u).selective_scan_forward(u, delta, A, Bm, Cm, D, z, bias, softplus_on, given[1],
                                       B_ndim > 2, C_ndim > 2, y, last, checkpoints)
    cache = SelectiveScanCache(u, delta, A, Bm, Cm, D, z, bias, softplus_on, B_ndim, C_ndim,
                               given, checkpoints, return_last_state)
    return ((y, last) if return_last_state else y), cache


def selective_scan_backward(douts, cache: SelectiveScanCache, needs: Needs = None):
    """Gradients of the selective scan (formulas in the module docstring).

    Parameters
    ----------
    douts : array (batch, dim, L), dL/dy; with ``return_last_state`` a tuple (dy, dlast)
        whose entries may be None (zeros), dlast (batch, dim, N)
    cache : SelectiveScanCache from ``selective_scan_forward``
    needs : tuple of 8 bool over (u, delta, A, B, C, D, z, delta_bias), optional (None:
        all). One pass gives them all; those not needed are returned as None.

    Returns
    -------
    du, ddelta, dA, dB, dC, dD, dz, ddelta_bias, in the inputs' layouts; None for inputs
    that were None or are not needed.
    """
    c = check_cache(cache, SelectiveScanCache, forward="selective_scan_forward")
    u = c.u
    xp = array_module(u)
    batch, dim, L = u.shape
    N = c.A.shape[1]
    dy, dlast = douts if c.return_last_state else (douts, None)
    device = backend(u)
    dy = (xp.zeros_like(u) if dy is None
          else check_grad(dy, shape=u.shape, dtype=u.dtype, device=device, name="dy"))
    dlast = (xp.zeros((batch, dim, N), u.dtype) if dlast is None
             else check_grad(dlast, shape=(batch, dim, N), dtype=u.dtype, device=device,
                             name="dlast_state"))
    du, ddelta, dA = xp.empty_like(u), xp.empty_like(u), xp.empty_like(c.A)
    dBm, dCm = xp.empty_like(c.Bm), xp.empty_like(c.Cm)
    dD, dbias, dz = xp.empty_like(c.D), xp.empty_like(c.bias), xp.empty_like(c.z)
    _kernels(u).selective_scan_backward(
        dy, dlast, u, c.delta, c.A, c.Bm, c.Cm, c.D, c.z, c.bias, c.delta_softplus,
        c.given[1], c.B_ndim > 2, c.C_ndim > 2, c.checkpoints, du, ddelta, dz, dA, dBm, dCm,
        dD, dbias)
    D_given, z_given, bias_given = c.given
    grads = (du, ddelta, dA, _user_layout(dBm, c.B_ndim, batch, dim, L, N),
             _user_layout(dCm, c.C_ndim, batch, dim, L, N), dD if D_given else None,
             dz if z_given else None, dbias if bias_given else None)
    if needs is None:
        return grads
    return tuple(g if need else None for g, need in zip(grads, needs, strict=True))


def _user_layout(dM, ndim, batch, dim, L, N):
    """A gradient in the kernels' (rows, G, L, N) layout, back in the user's rank-``ndim``
    layout of B or C."""
    if ndim == 2:
        return dM.reshape(dim, N)
    dM = array_module(dM).ascontiguousarray(dM.transpose(0, 1, 3, 2))  # (batch, G, N, L)
    return dM.reshape(batch, N, L) if ndim == 3 else dM
