"""Differentiable scans: the linear scan (``F.linear_scan``, ``F.log_linear_scan``) and
the selective scan (``F.selective_scan``), each one autograd op over its ``nnkit.kernels``
forward/backward pair.
"""

from __future__ import annotations

from .._backend import array_module
from .._types import Array
from .._validation import check_real
from ..autograd import Tensor, apply_op, as_tensor
from ..kernels import scan as K
from ..kernels import selective_scan as KS
from ..kernels.scan import ScanAlgorithm
from ._packing import Packing

__all__ = ["linear_scan", "log_linear_scan", "selective_scan"]


def linear_scan(a: Tensor | Array, b: Tensor | Array, h0: Tensor | Array | None = None,
                reverse: bool = False,
                algorithm: ScanAlgorithm = "sequential") -> Tensor:
    """The diagonal linear recurrence h_t = a_t * h_{t-1} + b_t, all steps at once.

    Parameters
    ----------
    a, b : Tensor or array (B, T, D), float32/64 or complex64/128 (one dtype)
    h0 : Tensor or array (B, D) or None (zeros), the state before t = 0
    reverse : bool
        Run from t = T-1 down to 0, h_t = a_t * h_{t+1} + b_t (h0 the state after the end):
        the same as flipping a and b along T, scanning, and flipping back.
    algorithm : 'sequential' (default), 'hillis_steele' or 'blelloch' (tree scans of depth
        O(log T), CPU only; ``nnkit.kernels.tree_scan`` counts their levels and work)

    Returns
    -------
    Tensor (B, T, D), differentiable in a, b and h0. Backward is a reverse scan,
    g_t = dL/dh_t + conj(a_{t+1}) g_{t+1}, dL/db_t = g_t, dL/da_t = g_t conj(h_{t-1}),
    dL/dh0 = conj(a_0) g_0 (conjugate convention for complex, as ``nnkit.autograd``).

    Examples
    --------
    >>> import numpy as np, nnkit as nk
    >>> from nnkit.functional.scan import linear_scan
    >>> a = nk.tensor(np.full((1, 3, 1), 0.5), requires_grad=True)
    >>> h = linear_scan(a, np.ones((1, 3, 1)))
    >>> h.numpy()[0, :, 0].tolist()
    [1.0, 1.5, 1.75]
    >>> h.sum().backward(); a.grad[0, :, 0].tolist()
    [0.0, 1.5, 1.5]
    """
    a, b = as_tensor(a, name="a"), as_tensor(b, name="b")
    h0 = None if h0 is None else as_tensor(h0, name="h0")
    return apply_op("linear_scan", K.linear_scan_forward, K.linear_scan_backward, (a, b, h0),
                    reverse, algorithm=algorithm)


def log_linear_scan(log_a: Tensor | Array, log_b: Tensor | Array,
                    log_h0: Tensor | Array | None = None) -> Tensor:
    """The linear scan of positive coefficients in log space (Feng et al. 2024):
    log h_t = logaddexp(log a_t + log h_{t-1}, log b_t).

    Parameters
    ----------
    log_a, log_b : Tensor or array (B, T, D), float32/64
    log_h0 : Tensor or array (B, D) or None (h0 = 0)

    Returns
    -------
    Tensor (B, T, D), log h; differentiable in all inputs.

    Examples
    --------
    >>> import numpy as np
    >>> from nnkit.functional.scan import log_linear_scan
    >>> out = log_linear_scan(np.log(np.full((1, 2, 1), 0.5)), np.zeros((1, 2, 1)))
    >>> np.exp(out.numpy()).ravel().tolist()
    [1.0, 1.5]
    """
    log_a, log_b = as_tensor(log_a, name="log_a"), as_tensor(log_b, name="log_b")
    log_h0 = None if log_h0 is None else as_tensor(log_h0, name="log_h0")
    return apply_op("log_linear_scan", K.log_linear_scan_forward, K.log_linear_scan_backward,
                    (log_a, log_b, log_h0))


def selective_scan(u: Tensor | Array, delta: Tensor | Array, A: Tensor | Array,
                   B: Tensor | Array, C: Tensor | Array, D: Tensor | Array | None = None,
                   z: Tensor | Array | None = None, delta_bias: Tensor | Array | None = None,
                   delta_softplus: bool = False, return_last_state: bool = False,
                   cu_seqlens: Array | None = None) -> Tensor | tuple[Tensor, Tensor]:
    """Mamba's selective scan (S6), with mamba_ssm's ``selective_scan_ref`` semantics:

        dt_t = softplus(delta_t + delta_bias) with ``delta_softplus``, else delta_t + delta_bias
        x_t = exp(dt_t A) * x_{t-1} + dt_t B_t u_t,  x_{-1} = 0
        y_t = <C_t, x_t> + D u_t,  times silu(z_t) when z is given

    Fused: the (batch, dim, L, N) tensors exp(dt A) and dt B u are never built, forward or
    backward (``nnkit.kernels.selective_scan``).

    Parameters
    ----------
    u, delta : Tensor or array (batch, dim, L), float32/64 (one dtype for every input)
    A : (dim, N), real
    B, C : (dim, N) time-invariant, (batch, N, L), or (batch, G, N, L) with G dividing dim
        (channel d reads group d // (dim // G))
    D, delta_bias : (dim,) or None
    z : (batch, dim, L) or None (no gate)
    delta_softplus, return_last_state : bool
    cu_seqlens : integer array (S + 1,) or None
        S variable-length sequences packed along L: u, delta, z and varying B, C have batch
        1 and sequence s is steps cu_seqlens[s]:cu_seqlens[s + 1], each starting from a zero
        state; the last state is then (S, dim, N), one per sequence. Each sequence gives what
        it gives alone (empty and length-1 sequences included).

    Returns
    -------
    y : Tensor (batch, dim, L); with ``return_last_state``, (y, last_state (batch, dim, N)).
    Differentiable in every array input (and through the last state).

    Examples
    --------
    >>> import numpy as np
    >>> from nnkit.functional.scan import selective_scan
    >>> u = np.ones((1, 1, 3)); A = np.array([[-np.log(2.0)]])
    >>> y = selective_scan(u, np.ones((1, 1, 3)), A, np.ones((1, 1)), np.ones((1, 1)))
    >>> y.numpy()[0, 0].tolist()
    [1.0, 1.5, 1.75]
    """
    names = ("u", "delta", "A", "B", "C", "D", "z", "delta_bias")
    values = (u, delta, A, B, C, D, z, delta_bias)
    parents = tuple(None if v is None
                    else check_real(as_tensor(v, name=n), name=n, op="selective_scan")
                    for n, v in zip(names, values, strict=True))
    if cu_seqlens is not None:
        return _packed_selective_scan(parents, cu_seqlens, delta_softplus, return_last_state)
    return apply_op("selective_scan", KS.selective_scan_forward, KS.selective_scan_backward,
                    parents, delta_softplus=delta_softplus,
                    return_last_state=return_last_state)


def _packed_selective_scan(parents, cu_seqlens, delta_softplus, return_last_state):
    """The selective scan of sequences packed along L, as a padded batch: a pad step has
    u = z = 0 and a step size dt = 0 (delta + delta_bias = -1e30 under the softplus, 0
    without), so exp(dt A) = 1 and dt B u = 0 leave each sequence's last state alone. The
    bias is added before padding, so no gradient reaches it from a pad step."""
    u, delta, A, B, C, D, z, bias = parents
    if u.ndim != 3 or u.shape[0] != 1:
        raise ValueError("u must have shape (1, dim, L) with cu_seqlens (the sequences packed "
                         f"along L), got {tuple(u.shape)}")
    KS.check_inputs(*(None if p is None else p.data for p in parents))
    packing = Packing(cu_seqlens, u.shape[2])
    fill = array_module(u.data).full((1, u.shape[1], 1), -1e30 if delta_softplus else 0.0,
                                     u.dtype)
    if bias is not None:
        delta = delta + bias.reshape(1, -1, 1)
    B, C = (M if M.ndim == 2 else packing.pad(M, M.ndim - 1) for M in (B, C))
    z = None if z is None else packing.pad(z, 2)
    out = apply_op("selective_scan", KS.selective_scan_forward, KS.selective_scan_backward,
                   (packing.pad(u, 2), packing.pad(delta, 2, fill), A, B, C, D, z, None),
                   delta_softplus=delta_softplus, return_last_state=return_last_state)
    if return_last_state:
        return packing.unpad(out[0], 2), out[1]
    return packing.unpad(out, 2)
