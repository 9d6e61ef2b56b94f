"""The linear-attention family as differentiable functions: causal linear attention,
gated linear attention (Mamba-2's SSD with one decay per head and step), the delta rule
(DeltaNet) and the gated delta rule. One autograd op over ``nnkit.kernels.linear_attention``'s
pair each; flash-linear-attention's argument names, on ``F.scaled_dot_product_attention``'s
(batch, heads, T, dim) layout.

Every function returns ``(o, final_state)``: o (batch, heads, T, dv) and, with
``output_final_state``, the state S (batch, heads, dk, dv) after the last step (else None),
which a later call takes as its ``initial_state`` to continue the sequence.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from .._types import Array
from .._validation import check_bool, check_choice, check_real
from ..autograd import Tensor, apply_op, as_tensor, where
from ..kernels import linear_attention as K
from ..kernels.linear_attention import Mode
from ._packing import Packing

__all__ = ["linear_attention", "gated_linear_attention", "delta_rule", "gated_delta_rule"]

TensorLike = Tensor | Array
FeatureMap = str | Callable[[Tensor], Tensor] | None


def _recurrence(q, k, v, beta, g, scale, initial_state, output_final_state, delta, mode,
                chunk_size, op, g_given=False, cu_seqlens=None):
    names = ("q", "k", "v", "beta", "g", "initial_state")
    values = (q, k, v, beta, g, initial_state)
    required = (True, True, True, delta, g_given, False)
    for n, x, needed in zip(names, values, required, strict=True):
        if needed and x is None:
            raise TypeError(f"{n} must be a Tensor or an array, got None")
    parents = tuple(None if x is None else check_real(as_tensor(x, name=n), name=n, op=op)
                    for n, x in zip(names, values, strict=True))
    output_final_state = check_bool(output_final_state, name="output_final_state")
    dk = parents[0].shape[-1] if parents[0].ndim == 4 else 1
    scale = 1.0 / math.sqrt(max(dk, 1)) if scale is None else scale
    packing = None
    if cu_seqlens is not None:
        packing = _Packing(cu_seqlens, parents, delta)
        parents = packing.pad_all(parents)
    o, final = apply_op(op, K.linear_attention_forward, K.linear_attention_backward, parents,
                        scale=scale, delta=delta, mode=mode, chunk_size=chunk_size)
    if packing is not None:
        o = packing.unpad(o, 2)
    return o, (final if output_final_state else None)


class _Packing(Packing):
    """``Packing`` for the recurrence's inputs (time on axis 2); a zero step (k = v = beta =
    g = 0) leaves the state as it was."""

    def __init__(self, cu_seqlens, parents, delta):
        q = parents[0]
        if q.ndim != 4 or q.shape[0] != 1:
            raise ValueError("q must have shape (1, heads, T, dk) with cu_seqlens (the "
                             f"sequences packed along T), got {tuple(q.shape)}")
        K.check_inputs(*(None if p is None else p.data for p in parents[:5]), None, delta)
        super().__init__(cu_seqlens, q.shape[2])
        state = parents[5]
        if state is not None and state.shape[0] != self.N:
            raise ValueError(f"initial_state must hold one state per sequence, {self.N} "
                             f"(len(cu_seqlens) - 1), got shape {tuple(state.shape)}")

    def pad_all(self, parents):
        return tuple(None if p is None else self.pad(p, 2) for p in parents[:5]) + parents[5:]


def _feature(x: Tensor, feature_map: FeatureMap) -> Tensor:
    if callable(feature_map):
        return feature_map(x)
    name = check_choice("identity" if feature_map is None else feature_map,
                        name="feature_map", choices=("identity", "elu", "relu"))
    if name == "elu":  # elu(x) + 1 > 0
        return where(x.data > 0, x + 1, x.clip(max=0).exp())
    return x.relu() if name == "relu" else x


def linear_attention(q: TensorLike, k: TensorLike, v: TensorLike, scale: float | None = None,
                     feature_map: FeatureMap = None, normalize: bool = False,
                     initial_state: TensorLike | None = None,
                     output_final_state: bool = False, mode: Mode = "auto",
                     chunk_size: int = 64,
                     cu_seqlens: Array | None = None) -> tuple[Tensor, Tensor | None]:
    """Causal linear attention (fast weight programmers):

        S_t = S_{t-1} + phi(k_t) v_t^T,   o_t = scale S_t^T phi(q_t)

    Parameters
    ----------
    q, k : Tensor or array (batch, heads, T, dk), float32/64
    v : Tensor or array (batch, heads, T, dv)
    scale : float or None (1 / sqrt(dk))
    feature_map : None or 'identity', 'elu' (elu(x) + 1), 'relu', or a function of a Tensor,
        applied to q and k
    normalize : bool
        Divide o_t by scale phi(q_t) . z_t, z_t = sum_{s <= t} phi(k_s) (the normaliser counts
        this call's keys only, so it takes no ``initial_state``).
    initial_state : Tensor or array (batch, heads, dk, dv) or None (zeros)
    output_final_state : bool
    mode : 'auto' (default: 'recurrent' for NumPy arrays, 'chunk' for GPU arrays), 'chunk'
        (GEMMs inside chunks of ``chunk_size`` steps) or 'recurrent' (step by step, the state
        in cache); equal to rounding
    chunk_size : int >= 1
    cu_seqlens : integer array (N + 1,) or None
        Variable-length sequences packed along T: q, k, v (and beta, g) have batch 1 and
        sequence n is steps cu_seqlens[n]:cu_seqlens[n + 1]; initial_state and final_state
        are then (N, heads, dk, dv), one per sequence. Each sequence gives what it gives
        alone (empty and length-1 sequences included).

    Returns
    -------
    o : Tensor (batch, heads, T, dv);  final_state : Tensor (batch, heads, dk, dv) or None

    Examples
    --------
    >>> import numpy as np
    >>> from nnkit.functional import linear_attention
    >>> q = k = np.ones((1, 1, 3, 1)); v = np.arange(3.0).reshape(1, 1, 3, 1)
    >>> o, _ = linear_attention(q, k, v, scale=1.0)
    >>> o.numpy()[0, 0, :, 0].tolist()
    [0.0, 1.0, 3.0]
    """
    normalize = check_bool(normalize, name="normalize")
    if normalize and initial_state is not None:
        raise ValueError("linear_attention with normalize=True takes no initial_state (its "
                         "normaliser sums this call's keys only); pass normalize=False")
    q = _feature(as_tensor(q, name="q"), feature_map)
    k = _feature(as_tensor(k, name="k"), feature_map)
    o, final = _recurrence(q, k, v, None, None, scale, initial_state, output_final_state,
                           False, mode, chunk_size, "linear_attention", cu_seqlens=cu_seqlens)
    if normalize:
        ones = as_tensor(q.data[..., :1] * 0 + 1)
        z, _ = _recurrence(q, k, ones, None, None, scale, None, False, False, mode, chunk_size,
                           "linear_attention", cu_seqlens=cu_seqlens)
        o = o / z
    return o, final


def gated_linear_attention(q: TensorLike, k: TensorLike, v: TensorLike, g: TensorLike,
                           scale: float | None = None, initial_state: TensorLike | None = None,
                           output_final_state: bool = False, mode: Mode = "auto",
                           chunk_size: int = 64,
                           cu_seqlens: Array | None = None) -> tuple[Tensor, Tensor | None]:
    """Gated linear attention, decaying the state by a_t = exp(g_t) at every step:

        S_t = diag(a_t) S_{t-1} + k_t v_t^T,   o_t = scale S_t^T q_t

    With one decay per head and step (g of shape (batch, heads, T)) this is Mamba-2's SSD
    (q, k, v as C, B, x; g = dt A).

    Parameters
    ----------
    q, k : Tensor or array (batch, heads, T, dk), float32/64
    v : Tensor or array (batch, heads, T, dv)
    g : Tensor or array (batch, heads, T) (one decay per step) or (batch, heads, T, dk) (one
        per key), log-decays (<= 0 keeps every exponent of the chunked form <= 0)
    scale, initial_state, output_final_state, mode, chunk_size, cu_seqlens : as
        ``linear_attention``

    Returns
    -------
    o : Tensor (batch, heads, T, dv);  final_state : Tensor (batch, heads, dk, dv) or None
    """
    return _recurrence(q, k, v, None, g, scale, initial_state, output_final_state, False,
                       mode, chunk_size, "gated_linear_attention", g_given=True,
                       cu_seqlens=cu_seqlens)


def delta_rule(q: TensorLike, k: TensorLike, v: TensorLike, beta: TensorLike,
               scale: float | None = None, initial_state: TensorLike | None = None,
               output_final_state: bool = False, mode: Mode = "auto",
               chunk_size: int = 64,
               cu_seqlens: Array | None = None) -> tuple[Tensor, Tensor | None]:
    """The delta rule (DeltaNet): each step writes v_t at key k_t with strength beta_t,

        S_t = (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,   o_t = scale S_t^T q_t

    (S_t^T = S_{t-1}^T (I - beta_t k_t k_t^T) + beta_t v_t k_t^T in the (dv, dk) layout).
    Stable for ||k_t||^2 beta_t <= 2; DeltaNet L2-normalises k and takes beta in (0, 1).

    Parameters
    ----------
    q, k : Tensor or array (batch, heads, T, dk), float32/64
    v : Tensor or array (batch, heads, T, dv)
    beta : Tensor or array (batch, heads, T)
    scale, initial_state, output_final_state, mode, chunk_size, cu_seqlens : as
        ``linear_attention``
        ('chunk' uses the WY/UT form of the chunk's updates)

    Returns
    -------
    o : Tensor (batch, heads, T, dv);  final_state : Tensor (batch, heads, dk, dv) or None
    """
    return _recurrence(q, k, v, beta, None, scale, initial_state, output_final_state, True,
                       mode, chunk_size, "delta_rule", cu_seqlens=cu_seqlens)


def gated_delta_rule(q: TensorLike, k: TensorLike, v: TensorLike, g: TensorLike,
                     beta: TensorLike, scale: float | None = None,
                     initial_state: TensorLike | None = None,
                     output_final_state: bool = False, mode: Mode = "auto",
                     chunk_size: int = 64,
                     cu_seqlens: Array | None = None) -> tuple[Tensor, Tensor | None]:
    """The gated delta rule (Gated DeltaNet): the delta rule on a state decayed by
    a_t = exp(g_t),

        S_t = a_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,   o_t = scale S_t^T q_t

    Parameters
    ----------
    q, k : Tensor or array (batch, heads, T, dk), float32/64
    v : Tensor or array (batch, heads, T, dv)
    g : Tensor or array (batch, heads, T), log-decays
    beta : Tensor or array (batch, heads, T)
    scale, initial_state, output_final_state, mode, chunk_size, cu_seqlens : as
        ``linear_attention``

    Returns
    -------
    o : Tensor (batch, heads, T, dv);  final_state : Tensor (batch, heads, dk, dv) or None
    """
    return _recurrence(q, k, v, beta, g, scale, initial_state, output_final_state, True, mode,
                       chunk_size, "gated_delta_rule", g_given=True, cu_seqlens=cu_seqlens)
