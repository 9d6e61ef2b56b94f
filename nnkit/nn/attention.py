"""``nn.MultiheadAttention`` (Vaswani et al. 2017), torch-compatible.

MultiHead(Q, K, V) = Concat(head_1, ..., head_H) W^O with
head_i = softmax((Q W_i^Q)(K W_i^K)^T / sqrt(d) + M) (V W_i^V), d = embed_dim / num_heads.

Constructor arguments, parameter names and shapes (``in_proj_weight`` (3E, E) packed in
q, k, v order, or ``q_proj_weight`` (E, E), ``k_proj_weight`` (E, kdim), ``v_proj_weight``
(E, vdim) when kdim or vdim differ from embed_dim; ``in_proj_bias`` (3E,), ``out_proj``,
``bias_k``/``bias_v`` (1, 1, E)), initialisation (xavier_uniform_ in-projections, zero
biases) and mask conventions are torch's, so ``load_state_dict(torch_mha.state_dict())``
gives the same numbers.

Masks (torch's MultiheadAttention convention, the opposite of SDPA's for bool masks):
a bool mask is True where attention is NOT allowed; a float mask is added to the scores.
``key_padding_mask`` is (N, S) ((S,) unbatched); ``attn_mask`` is (L, S) or
(N * num_heads, L, S) (entry n * num_heads + h for batch n, head h).

Two paths compute the same attention. ``need_weights=True`` needs the probabilities, so it
composes the autograd ops (``attention_with_weights``: matmul, softmax, dropout, matmul).
``need_weights=False`` calls the fused ``F.scaled_dot_product_attention``
(``nnkit.functional.attention``), which never materialises the (L, S) matrix. As in torch, a
query row whose keys are all masked gives NaN on the first path and zeros on the second.
Self-attention on that path (one packed in-projection, no bias_k/add_zero_attn) runs the
fused kernels as one op over the packed projection (``packed_self_attention``): one copy
splits it into heads, and the gradients of q, k and v go back in one stack, instead of three
copies forward and three slices, two sums and three copies backward (CuPy kernels on the
GPU; benchmarks/RESULTS.md, "Fewer launches per step").
"""

from __future__ import annotations

import math
import numbers
import warnings

import numpy as np

from .. import functional as F
from .._backend import array_module, is_gpu_array
from .._random import get_rng
from .._validation import check_bool, check_scalar
from ..autograd import Tensor, apply_op, as_tensor, concat, where
from ..functional.attention import scaled_dot_product_attention
from ..kernels import attention as attention_kernels
from . import init
from .layers import Linear, _dtype
from .module import Module, Parameter

__all__ = ["MultiheadAttention", "attention_with_weights", "canonical_mask"]


# ----- masks ---------------------------------------------------------------------------------
def canonical_mask(mask, name: str, dtype, xp=np):
    """A mask as an additive float mask: bool True -> -inf, False -> 0; floats unchanged.

    Parameters
    ----------
    mask : bool or float array, Tensor, or None
        torch's MultiheadAttention convention: True = this position may NOT be attended.
    name : str
        The argument's name, for the messages.
    dtype : dtype of the scores (the float mask is cast to it).
    xp : numpy or cupy, where the result lives.

    Returns
    -------
    None, an array of ``dtype``, or a float Tensor (kept so that gradients reach it).
    """
    if mask is None:
        return None
    if isinstance(mask, Tensor):
        if mask.dtype.kind != "f":
            raise TypeError(f"{name} must be a bool or floating-point mask, got a Tensor of "
                            f"dtype {mask.dtype}")
        return mask if mask.requires_grad else xp.asarray(mask.data, dtype=dtype)
    mask = xp.asarray(mask)
    if mask.dtype == bool:
        return xp.where(mask, xp.full((), -np.inf, dtype=dtype), xp.zeros((), dtype=dtype))
    if mask.dtype.kind != "f":
        raise TypeError(f"{name} must be a bool or floating-point mask (True or -inf = not "
                        f"allowed), got dtype {mask.dtype}")
    return mask.astype(dtype, copy=False)


def _is_float_mask(mask) -> bool:
    if mask is None:
        return False
    dtype = mask.dtype if hasattr(mask, "dtype") else np.asarray(mask).dtype
    return dtype.kind == "f"


def _pad_key_axis(mask):
    """Append one zero (allowed) column on the last (key) axis of an additive mask."""
    if mask is None:
        return None
    if isinstance(mask, Tensor):
        xp = array_module(mask.data)
        return concat([mask, Tensor(xp.zeros(mask.shape[:-1] + (1,), dtype=mask.dtype))],
                      axis=-1)
    xp = array_module(mask)
    return xp.concatenate([mask, xp.zeros(mask.shape[:-1] + (1,), dtype=mask.dtype)], axis=-1)


def _add_masks(a, b):
    """Sum of two additive masks (either may be None, an array or a Tensor)."""
    if a is None:
        return b
    if b is None:
        return a
    if isinstance(a, Tensor) or isinstance(b, Tensor):
        return as_tensor(a) + as_tensor(b)
    return a + b


# ----- the composed attention core -----------------------------------------------------------
def attention_with_weights(query, key, value, mask=None, dropout_p: float = 0.0,
                           zero_masked_rows: bool = False):
    """softmax(q k^T / sqrt(d) + mask) v, returning the probabilities too (autograd ops).

    Parameters
    ----------
    query : Tensor (N, H, L, d)
    key : Tensor (N, H, S, d)
    value : Tensor (N, H, S, dv)
    mask : additive float array or Tensor broadcasting to (N, H, L, S), or None
        (0 = allowed, -inf = not allowed; see ``canonical_mask``).
    dropout_p : float
        Dropout on the probabilities (pass 0 outside training).
    zero_masked_rows : bool
        A query row whose keys are all masked gets zero probabilities (and output), as
        torch's fused attention; otherwise NaN, as torch's composed path.

    Returns
    -------
    output : Tensor (N, H, L, dv)
    weights : Tensor (N, H, L, S), the probabilities after dropout.
    """
    d = query.shape[-1]
    scores = (query * math.sqrt(1.0 / d)) @ key.swapaxes(-1, -2)  # (N, H, L, S)
    if mask is not None:
        scores = scores + mask
    dead = None
    if zero_masked_rows:
        xp = array_module(scores.data)
        dead = xp.isneginf(scores.data).all(axis=-1, keepdims=True)
        if dead.any():  # (N, H, L, 1): softmax of an all -inf row is NaN; give it zeros
            scores = where(dead, xp.zeros((), dtype=scores.dtype), scores)
        else:
            dead = None
    weights = F.softmax(scores, axis=-1)
    if dead is not None:
        weights = weights * ~dead
    if dropout_p > 0.0:
        weights = F.dropout(weights, dropout_p, training=True)
    return weights @ value, weights


def _fused_attention():
    """``F.scaled_dot_product_attention`` from ``nnkit.functional.attention`` (the tests
    replace this function to force the composed path)."""
    return scaled_dot_product_attention


def packed_self_attention(qkv, num_heads: int, batch_first: bool, attn_mask=None,
                          dropout_p: float = 0.0, is_causal: bool = False) -> Tensor:
    """``F.scaled_dot_product_attention`` of the heads of a packed self-attention projection,
    as one op.

    ``qkv`` (N, L, 3E) with ``batch_first``, else (L, N, 3E): q, k, v side by side, each
    split into ``num_heads`` heads of E / num_heads features (MultiheadAttention's in-
    projection). Returns the attention (N, H, L, d), the fused path's ``_attend``, computed
    the same way (the same kernels on the same values); ``attn_mask`` an additive array (no
    gradient) broadcasting to (N, H, L, L), or None. One copy makes q, k and v (3, N, H, L, d)
    in the forward; the backward stacks dq, dk, dv into the gradient of ``qkv`` in one pass.
    """
    shape = qkv.shape
    H = num_heads
    d = shape[-1] // (3 * H)
    into_heads = (2, 0, 3, 1, 4) if batch_first else (2, 1, 3, 0, 4)  # -> (3, N, H, L, d)
    out_of_heads = (0, 2, 1, 3) if batch_first else (2, 0, 1, 3)  # (N, H, L, d) -> (., ., H, d)
    seed = int(get_rng().integers(0, 2**63 - 1)) if dropout_p > 0 else None

    def forward(x):
        xp = array_module(x)
        heads = xp.ascontiguousarray(x.reshape(shape[0], shape[1], 3, H, d).transpose(
            into_heads))
        return attention_kernels.attention_forward(heads[0], heads[1], heads[2], attn_mask,
                                                   is_causal, None, dropout_p, seed)

    def backward(g, cache, needs):
        xp = array_module(g)
        grads = attention_kernels.attention_backward(g, cache, (True, True, True, False))[:3]
        packed = xp.empty((shape[0], shape[1], 3, H, d), dtype=g.dtype)  # C order: a view
        xp.stack([t.transpose(out_of_heads) for t in grads], axis=2, out=packed)  # of (.., 3E)
        return (packed.reshape(shape),)

    return apply_op("packed_self_attention", forward, backward, (qkv,))


def _xavier_normal_(tensor):
    """N(0, std^2), std = sqrt(2 / (fan_in + fan_out)) (torch's xavier_normal_, gain 1)."""
    fan_in, fan_out = init.calculate_fan_in_and_fan_out(tensor)
    return init.normal_(tensor, 0.0, math.sqrt(2.0 / (fan_in + fan_out)))


def _float_input(x, name: str) -> Tensor:
    if not isinstance(x, Tensor):
        x = x if is_gpu_array(x) else np.asarray(x)
    t = as_tensor(x)
    if t.dtype.kind != "f":
        raise TypeError(f"{name} must be a floating-point array or Tensor, got dtype {t.dtype}")
    return t


# ----- the module ----------------------------------------------------------------------------
class MultiheadAttention(Module):
    """Multi-head scaled dot-product attention, torch's ``nn.MultiheadAttention``.

    Parameters
    ----------
    embed_dim : int
        E, the model width (query features and output features).
    num_heads : int
        H; E must be divisible by H (each head has d = E / H features).
    dropout : float
        Dropout probability on the attention probabilities (training mode only).
    bias : bool
        Learn ``in_proj_bias`` (3E,) and ``out_proj.bias`` (E,), both initialised to 0.
    add_bias_kv : bool
        Learn ``bias_k``, ``bias_v`` (1, 1, E), appended as one extra key/value position.
    add_zero_attn : bool
        Append one all-zero key/value position (after ``bias_k``/``bias_v``).
    kdim, vdim : int or None
        Key and value features (default E). When either differs from E the projections are
        three separate weights ``q_proj_weight`` (E, E), ``k_proj_weight`` (E, kdim),
        ``v_proj_weight`` (E, vdim) instead of the packed ``in_proj_weight`` (3E, E).
    batch_first : bool
        Inputs and output are (N, L, E) instead of (L, N, E).
    dtype : float32 (default) or float64

    Examples
    --------
    >>> import numpy as np, nnkit as nk
    >>> from nnkit.nn.attention import MultiheadAttention
    >>> mha = MultiheadAttention(8, 2, batch_first=True)
    >>> x = np.zeros((3, 5, 8), dtype=np.float32)            # (N, L, E)
    >>> out, weights = mha(x, x, x)
    >>> out.shape, weights.shape
    ((3, 5, 8), (3, 5, 5))
    """

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 add_bias_kv: bool = False, add_zero_attn: bool = False, kdim=None, vdim=None,
                 batch_first: bool = False, dtype=None):
        super().__init__()
        self.embed_dim = check_scalar(embed_dim, name="embed_dim", kind=numbers.Integral, low=1)
        self.num_heads = check_scalar(num_heads, name="num_heads", kind=numbers.Integral, low=1)
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim={embed_dim} is not divisible by num_heads={num_heads}: "
                             "each head gets embed_dim // num_heads features")
        self.kdim = embed_dim if kdim is None else check_scalar(
            kdim, name="kdim", kind=numbers.Integral, low=1)
        self.vdim = embed_dim if vdim is None else check_scalar(
            vdim, name="vdim", kind=numbers.Integral, low=1)
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        self.dropout = float(check_scalar(dropout, name="dropout", low=0.0, high=1.0))
        self.batch_first = check_bool(batch_first, name="batch_first")
        self.head_dim = embed_dim // num_heads
        dtype = _dtype(dtype)
        E = embed_dim
        if self._qkv_same_embed_dim:  # registration order as torch, for state_dict order
            self.in_proj_weight = Parameter.empty((3 * E, E), dtype)
            for name in ("q_proj_weight", "k_proj_weight", "v_proj_weight"):
                self.register_parameter(name, None)
        else:
            self.q_proj_weight = Parameter.empty((E, E), dtype)
            self.k_proj_weight = Parameter.empty((E, self.kdim), dtype)
            self.v_proj_weight = Parameter.empty((E, self.vdim), dtype)
            self.register_parameter("in_proj_weight", None)
        if bias:
            self.in_proj_bias = Parameter.empty(3 * E, dtype)
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = Linear(E, E, bias=bias, dtype=dtype)
        if add_bias_kv:
            self.bias_k = Parameter.empty((1, 1, E), dtype)
            self.bias_v = Parameter.empty((1, 1, E), dtype)
        else:
            self.register_parameter("bias_k", None)
            self.register_parameter("bias_v", None)
        self.add_zero_attn = check_bool(add_zero_attn, name="add_zero_attn")
        self._reset_parameters()

    def _reset_parameters(self) -> None:
        """xavier_uniform_ on the in-projections, zero biases, xavier_normal_ bias_k/v."""
        if self._qkv_same_embed_dim:
            init.xavier_uniform_(self.in_proj_weight)
        else:
            for w in (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight):
                init.xavier_uniform_(w)
        if self.in_proj_bias is not None:
            init.zeros_(self.in_proj_bias)
            init.zeros_(self.out_proj.bias)
        if self.bias_k is not None:
            _xavier_normal_(self.bias_k)
            _xavier_normal_(self.bias_v)

    def extra_repr(self) -> str:
        extra = "" if self._qkv_same_embed_dim else f", kdim={self.kdim}, vdim={self.vdim}"
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, "
                f"dropout={self.dropout}, batch_first={self.batch_first}{extra}")

    # ----- forward ------------------------------------------------------------------------
    def forward(self, query, key, value, key_padding_mask=None, need_weights: bool = True,
                attn_mask=None, average_attn_weights: bool = True, is_causal: bool = False):
        """Attend from ``query`` to ``key``/``value``.

        Parameters
        ----------
        query : (L, N, E), or (N, L, E) with batch_first, or (L, E) unbatched
        key : (S, N, kdim), (N, S, kdim) or (S, kdim)
        value : (S, N, vdim), (N, S, vdim) or (S, vdim)
        key_padding_mask : bool or float (N, S), (S,) unbatched, optional
            True (or -inf) marks padding keys that no query may attend.
        need_weights : bool
            Return the attention probabilities (the composed path); False uses the fused
            ``F.scaled_dot_product_attention`` and returns None for them.
        attn_mask : bool or float (L, S) or (N * num_heads, L, S), optional
            True (or -inf) = not allowed; a float mask is added to the scores.
        average_attn_weights : bool
            Average the returned probabilities over the heads.
        is_causal : bool
            A hint that ``attn_mask`` is the causal mask (it must still be given, as torch):
            with need_weights=False and no key_padding_mask the fused kernel applies
            causality itself and the mask is not read.

        Returns
        -------
        output : Tensor shaped like ``query`` with E features
        weights : Tensor (N, L, S) averaged or (N, H, L, S) per head ((L, S) or (H, L, S)
            unbatched), or None when ``need_weights`` is False.
        """
        for name, flag in (("need_weights", need_weights),
                           ("average_attn_weights", average_attn_weights),
                           ("is_causal", is_causal)):
            check_bool(flag, name=name)
        same_qkv, same_kv = query is key and key is value, key is value
        query = _float_input(query, "query")
        key = query if same_qkv else _float_input(key, "key")
        value = key if same_kv else _float_input(value, "value")
        batched = self._check_inputs(query, key, value)
        batch_axis = 0 if self.batch_first else 1
        if not batched:  # (L, E) -> one batch entry in this module's layout
            query, key, value = (t.unsqueeze(batch_axis) for t in (query, key, value))
            if same_kv:
                value = key
            if same_qkv:
                key = value = query
        N = query.shape[batch_axis]
        L, S = query.shape[1 - batch_axis], key.shape[1 - batch_axis]
        kpm, mask = self._prepare_masks(key_padding_mask, attn_mask, query, N, L, S, batched)
        if is_causal and attn_mask is None:
            raise ValueError("is_causal=True needs attn_mask as well (the causal mask, as "
                             "torch): pass attn_mask=generate_square_subsequent_mask(L)")
        out = self._packed(query, same_qkv, mask, kpm, need_weights, is_causal)
        weights = None
        if out is None:
            q, k, v = self._project(query, key, value, same_qkv, same_kv)  # (N, H, L|S, d)
            k, v, mask, kpm = self._extend_keys(k, v, mask, kpm)
            out, weights = self._attend(q, k, v, mask, kpm, need_weights, is_causal)
        out = self.out_proj(self._merge_heads(out))
        if not need_weights:
            weights = None
        elif average_attn_weights:
            weights = weights.mean(axis=1)  # (N, L, S)
        if not batched:
            out = out.squeeze(batch_axis)
            weights = None if weights is None else weights.squeeze(0)
        return out, weights

    # ----- the steps --------------------------------------------------------------------
    def _packed(self, query, same_qkv, mask, kpm, need_weights, is_causal):
        """The fused path's self-attention as one op over the packed in-projection
        (``packed_self_attention``): (N, H, L, d), or None where the steps below run (the
        weights are needed, separate projections or key/value extras, SDPA replaced, a
        mask that needs a gradient)."""
        if (need_weights or not same_qkv or not self._qkv_same_embed_dim
                or self.bias_k is not None or self.add_zero_attn
                or _fused_attention() is not scaled_dot_product_attention):
            return None
        merged = _add_masks(mask, kpm)
        if isinstance(merged, Tensor):
            if merged.requires_grad:
                return None
            merged = merged.data
        causal_hint = is_causal and kpm is None  # as torch: padding breaks causality
        qkv = F.linear(query, self.in_proj_weight, self.in_proj_bias)  # (.., 3E)
        return packed_self_attention(qkv, self.num_heads, self.batch_first,
                                     None if causal_hint else merged,
                                     self.dropout if self.training else 0.0, causal_hint)

    def _attend(self, q, k, v, mask, kpm, need_weights, is_causal):
        """Attention over the heads: (N, H, L, dv) output and the probabilities (or None).

        The fused kernel when the probabilities are not needed (and no mask needs a
        gradient); the composed ops otherwise.
        """
        dropout_p = self.dropout if self.training else 0.0
        fused = None if need_weights else _fused_attention()
        merged = _add_masks(mask, kpm)
        if fused is None or (isinstance(merged, Tensor) and merged.requires_grad):
            return attention_with_weights(q, k, v, merged, dropout_p,
                                          zero_masked_rows=not need_weights)
        causal_hint = is_causal and kpm is None  # as torch: padding breaks causality
        out = fused(q, k, v, attn_mask=None if causal_hint else merged, dropout_p=dropout_p,
                    is_causal=causal_hint)
        return out, None

    def _check_inputs(self, query, key, value) -> bool:
        """Shapes of query, key and value; True when they are batched (3-D)."""
        if query.ndim not in (2, 3):
            raise ValueError(f"query must be 3-D (batched) or 2-D (unbatched), got shape "
                             f"{query.shape}")
        if key.ndim != query.ndim or value.ndim != query.ndim:
            raise ValueError(f"query, key and value must have the same number of dimensions; "
                             f"got query {query.shape}, key {key.shape}, value {value.shape}")
        for t, name, want, hint in ((query, "query", self.embed_dim, "embed_dim"),
                                    (key, "key", self.kdim, "kdim"),
                                    (value, "value", self.vdim, "vdim")):
            if t.shape[-1] != want:
                raise ValueError(
                    f"{name} has {t.shape[-1]} features (shape {t.shape}) but "
                    f"MultiheadAttention was built with {hint}={want}")
        if key.shape[:-1] != value.shape[:-1]:
            raise ValueError(f"key {key.shape} and value {value.shape} must have the same "
                             "sequence length and batch size")
        batched = query.ndim == 3
        b = 0 if self.batch_first else 1
        if batched and query.shape[b] != key.shape[b]:
            raise ValueError(
                f"query {query.shape} and key {key.shape} have different batch sizes "
                f"(axis {b}, batch_first={self.batch_first})")
        return batched

    def _prepare_masks(self, key_padding_mask, attn_mask, query, N, L, S, batched):
        """Both masks as additive float masks broadcasting to (N, H, L, S), shapes checked."""
        if (_is_float_mask(key_padding_mask) != _is_float_mask(attn_mask)
                and key_padding_mask is not None and attn_mask is not None):
            warnings.warn("key_padding_mask and attn_mask have different types (bool and "
                          "float); torch deprecates mixing them. Use one type for both.",
                          stacklevel=3)
        xp, dtype = array_module(query.data), query.dtype
        H = self.num_heads
        kpm = canonical_mask(key_padding_mask, "key_padding_mask", dtype, xp)
        if kpm is not None:
            want = (N, S) if batched else (S,)
            if tuple(kpm.shape) != want:
                raise ValueError(f"key_padding_mask has shape {tuple(kpm.shape)} but must be "
                                 f"{want} ({'(N, S)' if batched else '(S,) unbatched'})")
            kpm = kpm.reshape(N, 1, 1, S)
        mask = canonical_mask(attn_mask, "attn_mask", dtype, xp)
        if mask is not None:
            shape = tuple(mask.shape)
            if shape == (L, S):
                mask = mask.reshape(1, 1, L, S)
            elif shape == (N * H, L, S):
                mask = mask.reshape(N, H, L, S)  # entry n * H + h is batch n, head h
            else:
                raise ValueError(
                    f"attn_mask has shape {shape} but must be (L, S) = {(L, S)} or "
                    f"(N * num_heads, L, S) = {(N * H, L, S)} for query length L={L}, key "
                    f"length S={S}, batch N={N}, num_heads={H}")
        return kpm, mask

    def _project(self, query, key, value, same_qkv, same_kv):
        """In-projections, split into heads: q (N, H, L, d), k (N, H, S, d), v (N, H, S, d)."""
        E = self.embed_dim
        b = self.in_proj_bias
        biases = (None, None, None) if b is None else (b[:E], b[E:2 * E], b[2 * E:])
        if not self._qkv_same_embed_dim:
            weights = (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight)
            q, k, v = (F.linear(x, w, bb) for x, w, bb in zip((query, key, value), weights,
                                                              biases, strict=True))
        elif same_qkv:  # self-attention: one GEMM, then split the 3E features
            qkv = F.linear(query, self.in_proj_weight, b)  # (.., 3E)
            q, k, v = qkv[..., :E], qkv[..., E:2 * E], qkv[..., 2 * E:]
        else:
            w = self.in_proj_weight
            q = F.linear(query, w[:E], biases[0])
            if same_kv:  # cross-attention on one memory: keys and values in one GEMM
                kv = F.linear(key, w[E:], None if b is None else b[E:])  # (.., 2E)
                k, v = kv[..., :E], kv[..., E:]
            else:
                k = F.linear(key, w[E:2 * E], biases[1])
                v = F.linear(value, w[2 * E:], biases[2])
        return self._split_heads(q), self._split_heads(k), self._split_heads(v)

    def _split_heads(self, x):
        """(L, N, E) or (N, L, E) -> (N, H, L, d)."""
        H, d = self.num_heads, self.head_dim
        if self.batch_first:
            N, L = x.shape[:2]
            return x.reshape(N, L, H, d).transpose(0, 2, 1, 3)  # (N, H, L, d)
        L, N = x.shape[:2]
        return x.reshape(L, N, H, d).transpose(1, 2, 0, 3)  # (N, H, L, d)

    def _merge_heads(self, x):
        """(N, H, L, d) -> (L, N, E), or (N, L, E) with batch_first."""
        N, H, L, d = x.shape
        if self.batch_first:
            return x.transpose(0, 2, 1, 3).reshape(N, L, H * d)  # (N, L, E)
        return x.transpose(2, 0, 1, 3).reshape(L, N, H * d)  # (L, N, E)

    def _extend_keys(self, k, v, mask, kpm):
        """Append bias_k/bias_v, then a zero key/value, padding the masks with 'allowed'."""
        N, H, _, d = k.shape
        xp = array_module(k.data)
        if self.bias_k is not None:
            zeros = xp.zeros((N, H, 1, d), dtype=k.dtype)
            k = concat([k, self.bias_k.reshape(1, H, 1, d) + zeros], axis=2)  # (N, H, S+1, d)
            v = concat([v, self.bias_v.reshape(1, H, 1, d) + zeros], axis=2)
            mask, kpm = _pad_key_axis(mask), _pad_key_axis(kpm)
        if self.add_zero_attn:
            k = concat([k, Tensor(xp.zeros((N, H, 1, d), dtype=k.dtype))], axis=2)
            v = concat([v, Tensor(xp.zeros((N, H, 1, v.shape[-1]), dtype=v.dtype))], axis=2)
            mask, kpm = _pad_key_axis(mask), _pad_key_axis(kpm)
        return k, v, mask, kpm
