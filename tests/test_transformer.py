"""nn.MultiheadAttention and the Transformer layers: torch equivalence, gradcheck, errors.

- torch.nn.MultiheadAttention after a state_dict copy: outputs, attention weights (averaged
  and per head), every parameter gradient and the input gradients, for self-, cross- and
  kdim/vdim attention, bias on/off, add_bias_kv/add_zero_attn, bool and float masks (2-D,
  3-D, key padding), batch_first both ways, need_weights both ways, unbatched inputs.
- torch.nn.TransformerEncoderLayer/DecoderLayer/Encoder/Decoder/Transformer the same way,
  post-norm and pre-norm, relu/gelu/callable activations, masks, eval-mode dropout.
- the composed attention against a naive per-head loop twin (hypothesis), a float64
  finite-difference gradcheck of a small MHA (parameters included), the fused-attention
  path's plumbing (mask conversion, the is_causal hint), dropout, initialisation, errors.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
from helpers import import_torch
from hypothesis import given, settings
from hypothesis import strategies as st

import nnkit as nk
import nnkit.functional as F
from nnkit.functional.attention import scaled_dot_product_attention
from nnkit.nn import attention as attention_module
from nnkit.nn.attention import MultiheadAttention, attention_with_weights, canonical_mask
from nnkit.nn.transformer import (
    Transformer,
    TransformerDecoder,
    TransformerDecoderLayer,
    TransformerEncoder,
    TransformerEncoderLayer,
    _detect_is_causal_mask,
    generate_square_subsequent_mask,
)

TOL64 = {"rtol": 1e-9, "atol": 1e-10}
TOL32 = {"rtol": 2e-4, "atol": 2e-5}


# ----- helpers -------------------------------------------------------------------------------
def _perturbed_copy(torch, torch_module, nnkit_module, scale=0.1, seed=0):
    """Jitter the torch parameters (its biases start at 0) and load them into nnkit."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in torch_module.parameters():
            p.add_(scale * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    nnkit_module.load_state_dict(torch_module.state_dict())


def _assert_param_grads(nnkit_module, torch_module, tol):
    torch_params = dict(torch_module.named_parameters())
    assert [n for n, _ in nnkit_module.named_parameters()] == list(torch_params)
    for name, p in nnkit_module.named_parameters():
        expected = torch_params[name].grad
        if expected is None:
            assert p.grad is None or not np.any(p.grad), name
            continue
        assert p.grad is not None, f"{name} got no gradient"
        np.testing.assert_allclose(p.grad, expected.numpy(), err_msg=name, **tol)


def _weighted_sum(outputs, upstream):
    """sum of <output, upstream> over the non-None outputs (nnkit or torch alike)."""
    total = 0
    for out, g in zip(outputs, upstream, strict=True):
        if out is not None:
            total = total + (out * g).sum()
    return total


def _sdpa_twin(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    """torch's SDPA semantics in nnkit ops (bool True = takes part; a float mask is added;
    is_causal = lower-triangular, top-left aligned; an all-masked row gives zeros)."""
    assert dropout_p == 0.0
    L, S, d = query.shape[-2], key.shape[-2], query.shape[-1]
    scale = 1 / math.sqrt(d) if scale is None else scale
    scores = (query * scale) @ key.swapaxes(-1, -2)
    bias = np.zeros((L, S), dtype=query.dtype)
    if is_causal:
        bias = np.where(np.tril(np.ones((L, S), dtype=bool)), bias, -np.inf)
    if attn_mask is not None:
        mask = attn_mask.data if isinstance(attn_mask, nk.Tensor) else attn_mask
        bias = bias + (np.where(mask, 0.0, -np.inf) if mask.dtype == bool else mask)
    scores = scores + bias.astype(query.dtype)
    dead = np.isneginf(scores.data).all(axis=-1, keepdims=True)
    scores = nk.where(dead, query.dtype.type(0), scores)
    return (F.softmax(scores) * ~dead) @ value


def _random_masks(rng, kind, N, H, L, S, batched=True):
    """(attn_mask, key_padding_mask) of the given kind; no query row is masked entirely
    (key 0 is always allowed), except where a test asks for it."""
    attn = kpm = None
    if kind in ("bool_attn", "both_bool"):
        attn = rng.random((L, S)) < 0.4
        attn[:, 0] = False
    if kind in ("float_attn3d", "both_float"):
        attn = rng.standard_normal((N * H, L, S))
        attn[rng.random(attn.shape) < 0.3] = -np.inf
        attn[..., 0] = 0.5
    if kind in ("bool_kpm", "both_bool"):
        kpm = np.zeros((N, S), dtype=bool)
        kpm[-1, S // 2 + 1:] = True
    if kind in ("float_kpm", "both_float"):
        kpm = rng.standard_normal((N, S))
        kpm[-1, S // 2 + 1:] = -np.inf
    if not batched and kpm is not None:
        kpm = kpm[0]
    return attn, kpm


def _torch_mask(torch, mask):
    return None if mask is None else torch.tensor(mask)


def _torch_dtype(torch, dtype):
    return torch.float64 if dtype == np.float64 else torch.float32


# ----- MultiheadAttention vs torch -----------------------------------------------------------
MHA_CONFIGS = {
    "self": dict(kind="self"),
    "cross": dict(kind="cross"),
    "separate": dict(kind="separate"),
    "kvdim": dict(kind="separate", kdim=5, vdim=3),
    "no_bias": dict(kind="self", bias=False),
    "bias_kv": dict(kind="cross", add_bias_kv=True),
    "zero_attn": dict(kind="separate", add_zero_attn=True),
    "bias_kv_zero_attn_kvdim": dict(kind="separate", add_bias_kv=True, add_zero_attn=True,
                                    kdim=3, vdim=7),
}
MASK_KINDS = ["none", "bool_attn", "float_attn3d", "bool_kpm", "float_kpm", "both_bool",
              "both_float"]
WEIGHT_MODES = ["average", "per_head", "none"]


def _mha_inputs(rng, kind, N, L, S, E, kdim, vdim, batch_first, batched=True):
    def shaped(T, D):
        if not batched:
            return rng.standard_normal((T, D))
        return rng.standard_normal((N, T, D) if batch_first else (T, N, D))

    q = shaped(L, E)
    if kind == "self":
        return q, q, q
    k = shaped(S, kdim)
    return (q, k, k) if kind == "cross" and kdim == vdim else (q, k, shaped(S, vdim))


def _run_mha_pair(torch, cfg, mask_kind, batch_first, weight_mode, dtype=np.float64,
                  batched=True, N=3, L=4, S=6, E=8, H=2, seed=0):
    """Build, copy, run forward and backward in both; return what to compare."""
    cfg = dict(cfg)
    kind = cfg.pop("kind")
    if kind == "self":
        S = L
    kdim, vdim = cfg.get("kdim", E), cfg.get("vdim", E)
    torch.manual_seed(seed)
    tm = torch.nn.MultiheadAttention(E, H, batch_first=batch_first, **cfg).to(
        _torch_dtype(torch, dtype))
    nm = MultiheadAttention(E, H, batch_first=batch_first, dtype=dtype, **cfg)
    _perturbed_copy(torch, tm, nm)
    rng = np.random.default_rng(seed)
    arrays = [a.astype(dtype) for a in _mha_inputs(rng, kind, N, L, S, E, kdim, vdim,
                                                   batch_first, batched)]
    attn, kpm = _random_masks(rng, mask_kind, N, H, L, S, batched)
    if attn is not None and attn.dtype.kind == "f":
        attn = attn.astype(dtype)
    if kpm is not None and kpm.dtype.kind == "f":
        kpm = kpm.astype(dtype)
    if not batched and attn is not None and attn.ndim == 3:
        attn = attn[:H]
    kwargs = dict(need_weights=weight_mode != "none",
                  average_attn_weights=weight_mode == "average")

    distinct = list(dict.fromkeys(id(a) for a in arrays))  # same object -> same tensor
    by_id = {id(a): a for a in arrays}
    n_in = {i: nk.tensor(by_id[i], requires_grad=True) for i in distinct}
    t_in = {i: torch.tensor(by_id[i], requires_grad=True) for i in distinct}
    n_out = nm(*(n_in[id(a)] for a in arrays), key_padding_mask=kpm, attn_mask=attn, **kwargs)
    t_out = tm(*(t_in[id(a)] for a in arrays), key_padding_mask=_torch_mask(torch, kpm),
               attn_mask=_torch_mask(torch, attn), **kwargs)
    upstream = [rng.standard_normal(o.shape).astype(dtype) if o is not None else None
                for o in t_out]
    _weighted_sum(n_out, upstream).backward()
    _weighted_sum(t_out, [None if g is None else torch.tensor(g) for g in upstream]).backward()
    return nm, tm, n_out, t_out, [(n_in[i], t_in[i]) for i in distinct]


def _compare(nm, tm, n_out, t_out, inputs, tol):
    for a, b in zip(n_out, t_out, strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            assert a.shape == tuple(b.shape)
            np.testing.assert_allclose(a.numpy(), b.detach().numpy(), **tol)
    for n_x, t_x in inputs:
        np.testing.assert_allclose(n_x.grad, t_x.grad.numpy(), err_msg="input grad", **tol)
    _assert_param_grads(nm, tm, tol)


@pytest.mark.parametrize("weight_mode", WEIGHT_MODES)
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("mask_kind", MASK_KINDS)
@pytest.mark.parametrize("config", list(MHA_CONFIGS))
def test_mha_matches_torch(config, mask_kind, batch_first, weight_mode):
    torch = import_torch()
    result = _run_mha_pair(torch, MHA_CONFIGS[config], mask_kind, batch_first, weight_mode)
    _compare(*result, TOL64)


@pytest.mark.parametrize("weight_mode", WEIGHT_MODES)
@pytest.mark.parametrize("config", ["self", "kvdim", "bias_kv"])
def test_mha_matches_torch_float32(config, weight_mode):
    torch = import_torch()
    result = _run_mha_pair(torch, MHA_CONFIGS[config], "both_bool", True, weight_mode,
                           dtype=np.float32)
    assert result[2][0].dtype == np.float32
    _compare(*result, TOL32)


@pytest.mark.parametrize("weight_mode", WEIGHT_MODES)
@pytest.mark.parametrize("mask_kind", ["none", "bool_attn", "float_attn3d", "bool_kpm"])
@pytest.mark.parametrize("config", ["self", "kvdim", "bias_kv_zero_attn_kvdim"])
def test_mha_unbatched_matches_torch(config, mask_kind, weight_mode):
    torch = import_torch()
    nm, tm, n_out, t_out, inputs = _run_mha_pair(torch, MHA_CONFIGS[config], mask_kind, True,
                                                 weight_mode, batched=False)
    assert n_out[0].ndim == 2
    _compare(nm, tm, n_out, t_out, inputs, TOL64)


@pytest.mark.parametrize("need_weights", [True, False])
def test_mha_composed_fallback_matches_torch(monkeypatch, need_weights):
    """Without the fused kernel, need_weights=False takes the composed path, same numbers."""
    torch = import_torch()
    monkeypatch.setattr(attention_module, "_fused_attention", lambda: None)
    for mask_kind in ("both_bool", "float_attn3d"):
        result = _run_mha_pair(torch, MHA_CONFIGS["cross"], mask_kind, False,
                               "average" if need_weights else "none")
        _compare(*result, TOL64)


def test_mha_mixed_mask_types_warn_and_match_torch():
    torch = import_torch()
    rng = np.random.default_rng(3)
    torch.manual_seed(0)
    tm = torch.nn.MultiheadAttention(4, 2).double()
    nm = MultiheadAttention(4, 2, dtype=np.float64)
    _perturbed_copy(torch, tm, nm)
    x = rng.standard_normal((3, 2, 4))
    attn = rng.standard_normal((3, 3))
    kpm = np.array([[False, False, True], [False, False, False]])
    with pytest.warns(UserWarning, match="deprecat"):
        out, w = nm(x, x, x, key_padding_mask=kpm, attn_mask=attn)
    with pytest.warns(UserWarning):
        t_out, t_w = tm(*(torch.tensor(x),) * 3, key_padding_mask=torch.tensor(kpm),
                        attn_mask=torch.tensor(attn))
    np.testing.assert_allclose(out.numpy(), t_out.detach().numpy(), **TOL64)
    np.testing.assert_allclose(w.numpy(), t_w.detach().numpy(), **TOL64)


@pytest.mark.parametrize("need_weights", [True, False])
def test_mha_learned_float_mask_gets_torch_gradient(need_weights):
    """A float attn_mask that requires grad (a learned bias) receives torch's gradient."""
    torch = import_torch()
    rng = np.random.default_rng(4)
    torch.manual_seed(0)
    tm = torch.nn.MultiheadAttention(6, 3, batch_first=True).double()
    nm = MultiheadAttention(6, 3, batch_first=True, dtype=np.float64)
    _perturbed_copy(torch, tm, nm)
    x, bias = rng.standard_normal((2, 4, 6)), rng.standard_normal((4, 4))
    nb, tb = nk.tensor(bias, requires_grad=True), torch.tensor(bias, requires_grad=True)
    out = nm(x, x, x, attn_mask=nb, need_weights=need_weights)[0]
    t_out = tm(*(torch.tensor(x),) * 3, attn_mask=tb, need_weights=need_weights)[0]
    g = rng.standard_normal(out.shape)
    (out * g).sum().backward()
    (t_out * torch.tensor(g)).sum().backward()
    np.testing.assert_allclose(out.numpy(), t_out.detach().numpy(), **TOL64)
    np.testing.assert_allclose(nb.grad, tb.grad.numpy(), **TOL64)


@pytest.mark.parametrize("need_weights", [True, False])
def test_fully_masked_row_nan_or_zero_as_torch(need_weights):
    """A query whose keys are all padding: NaN on the weights path, zeros on the fused
    path (torch's two behaviours); the other batch entries are unaffected and finite."""
    torch = import_torch()
    torch.manual_seed(0)
    tm = torch.nn.MultiheadAttention(4, 2).double()
    nm = MultiheadAttention(4, 2, dtype=np.float64)
    _perturbed_copy(torch, tm, nm)
    x = np.random.default_rng(5).standard_normal((3, 2, 4))
    kpm = np.array([[True, True, True], [False, True, False]])
    xt = nk.tensor(x, requires_grad=True)
    out = nm(xt, xt, xt, key_padding_mask=kpm, need_weights=need_weights)[0]
    t_out = tm(*(torch.tensor(x),) * 3, key_padding_mask=torch.tensor(kpm),
               need_weights=need_weights)[0]
    np.testing.assert_allclose(out.numpy(), t_out.detach().numpy(), **TOL64)  # NaNs equal
    assert np.isfinite(out.numpy()[:, 1]).all()
    assert np.isnan(out.numpy()[:, 0]).all() == need_weights
    if not need_weights:
        out.sum().backward()
        assert np.isfinite(xt.grad).all()


# ----- the fused path's plumbing --------------------------------------------------------------
class _Spy:
    """Stands in for F.scaled_dot_product_attention; records how MHA calls it."""

    def __init__(self):
        self.calls = []

    def __call__(self, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                 scale=None):
        self.calls.append(dict(shapes=(query.shape, key.shape, value.shape),
                               attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal))
        return _sdpa_twin(query, key, value, attn_mask, dropout_p, is_causal, scale)


@pytest.fixture
def spy(monkeypatch):
    s = _Spy()
    monkeypatch.setattr(attention_module, "_fused_attention", lambda: s)
    return s


@pytest.mark.parametrize("mask_kind", MASK_KINDS)
@pytest.mark.parametrize("config", ["self", "kvdim", "bias_kv_zero_attn_kvdim"])
def test_fused_path_plumbing_matches_torch(spy, config, mask_kind):
    """need_weights=False hands (N, H, L, d) heads and the merged additive mask to SDPA;
    with torch's SDPA semantics in the twin, the result is torch's."""
    torch = import_torch()
    result = _run_mha_pair(torch, MHA_CONFIGS[config], mask_kind, True, "none")
    _compare(*result, TOL64)
    (call,) = spy.calls
    N, H, L, d = call["shapes"][0]
    assert (N, H, d) == (3, 2, 4)
    assert call["is_causal"] is False
    assert (call["attn_mask"] is None) == (mask_kind == "none")


def test_fused_path_gets_is_causal_hint_and_matches(spy):
    torch = import_torch()
    torch.manual_seed(0)
    tm = torch.nn.MultiheadAttention(8, 2, batch_first=True).double()
    nm = MultiheadAttention(8, 2, batch_first=True, dtype=np.float64)
    _perturbed_copy(torch, tm, nm)
    x = np.random.default_rng(6).standard_normal((2, 5, 8))
    causal = generate_square_subsequent_mask(5, np.float64)
    out = nm(x, x, x, attn_mask=causal, is_causal=True, need_weights=False)[0]
    (call,) = spy.calls
    assert call["is_causal"] is True and call["attn_mask"] is None
    t_out = tm(*(torch.tensor(x),) * 3, attn_mask=torch.tensor(causal), is_causal=True,
               need_weights=False)[0]
    np.testing.assert_allclose(out.numpy(), t_out.detach().numpy(), **TOL64)
    # with padding as well the hint is dropped and the merged mask is passed (as torch)
    kpm = np.array([[False] * 5, [False, False, False, True, True]])
    nm(x, x, x, attn_mask=causal, key_padding_mask=kpm, is_causal=True, need_weights=False)
    assert spy.calls[-1]["is_causal"] is False
    assert spy.calls[-1]["attn_mask"].shape == (2, 1, 5, 5)
    # the weights path reads the mask itself
    _, w = nm(x, x, x, attn_mask=causal, is_causal=True)
    assert len(spy.calls) == 2
    assert not np.any(np.triu(w.numpy()[0], k=1))


def test_weights_path_does_not_call_fused(spy):
    x = np.ones((2, 3, 4), np.float32)
    MultiheadAttention(4, 2)(x, x, x, need_weights=True)
    assert spy.calls == []


def test_real_fused_attention_matches_torch():
    """nnkit.functional.attention's fused SDPA behind need_weights=False."""
    torch = import_torch()
    assert attention_module._fused_attention() is scaled_dot_product_attention
    for config, mask_kind in (("self", "both_bool"), ("kvdim", "float_attn3d"),
                              ("bias_kv", "bool_kpm"), ("cross", "none")):
        result = _run_mha_pair(torch, MHA_CONFIGS[config], mask_kind, True, "none")
        _compare(*result, {"rtol": 1e-7, "atol": 1e-9})


# ----- the composed core against a naive twin ------------------------------------------------
def _mha_twin(state, q, k, v, H, blocked, batch_first):
    """MultiheadAttention straight from the formula, with loops over batch and heads.

    q (L, N, E) (or batch first), blocked (L, S) bool: True = not allowed. Packed weights.
    """
    if batch_first:
        q, k, v = (a.transpose(1, 0, 2) for a in (q, k, v))
    L, N, E = q.shape
    S, d = k.shape[0], E // H
    W, b = state["in_proj_weight"], state["in_proj_bias"]
    out = np.zeros((L, N, E))
    weights = np.zeros((N, H, L, S))
    for n in range(N):
        qp = q[:, n] @ W[:E].T + b[:E]
        kp = k[:, n] @ W[E:2 * E].T + b[E:2 * E]
        vp = v[:, n] @ W[2 * E:].T + b[2 * E:]
        heads = np.zeros((L, E))
        for h in range(H):
            cols = slice(h * d, (h + 1) * d)
            for i in range(L):
                scores = np.array([qp[i, cols] @ kp[j, cols] / math.sqrt(d) for j in range(S)])
                scores = np.where(blocked[i], -np.inf, scores)
                p = np.exp(scores - scores.max())
                p /= p.sum()
                weights[n, h, i] = p
                heads[i, cols] = p @ vp[:, cols]
        out[:, n] = heads @ state["out_proj.weight"].T + state["out_proj.bias"]
    return (out.transpose(1, 0, 2) if batch_first else out), weights


@settings(max_examples=25)
@given(N=st.integers(1, 3), L=st.integers(1, 4), S=st.integers(1, 5), H=st.sampled_from([1, 2]),
       d=st.integers(1, 3), batch_first=st.booleans(), seed=st.integers(0, 2**16))
def test_mha_matches_naive_twin(N, L, S, H, d, batch_first, seed):
    rng = np.random.default_rng(seed)
    E = H * d
    nm = MultiheadAttention(E, H, batch_first=batch_first, dtype=np.float64)
    for _, p in nm.named_parameters():
        p.data[...] = rng.standard_normal(p.shape)
    shape = (lambda T, D: (N, T, D)) if batch_first else (lambda T, D: (T, N, D))
    q, k, v = rng.standard_normal(shape(L, E)), rng.standard_normal(shape(S, E)), \
        rng.standard_normal(shape(S, E))
    blocked = rng.random((L, S)) < 0.5
    blocked[:, rng.integers(S)] = False  # one allowed key per query
    out, w = nm(q, k, v, attn_mask=blocked, average_attn_weights=False)
    ref_out, ref_w = _mha_twin(nm.state_dict(), q, k, v, H, blocked, batch_first)
    np.testing.assert_allclose(w.numpy(), ref_w, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(out.numpy(), ref_out, rtol=1e-10, atol=1e-10)


def test_attention_with_weights_zero_masked_rows():
    rng = np.random.default_rng(7)
    q, k, v = (nk.tensor(rng.standard_normal((1, 1, 2, 3)), requires_grad=True)
               for _ in range(3))
    mask = np.array([[0.0, -np.inf], [-np.inf, -np.inf]])
    out, w = attention_with_weights(q, k, v, mask, zero_masked_rows=True)
    assert np.array_equal(w.numpy()[0, 0], [[1.0, 0.0], [0.0, 0.0]])
    np.testing.assert_allclose(out.numpy()[0, 0, 0], v.numpy()[0, 0, 0])
    assert not np.any(out.numpy()[0, 0, 1])
    out.sum().backward()
    assert np.isfinite(q.grad).all() and not np.any(q.grad[0, 0, 1])
    _, w_nan = attention_with_weights(q, k, v, mask)
    assert np.isnan(w_nan.numpy()[0, 0, 1]).all()


def test_canonical_mask():
    m = canonical_mask(np.array([True, False]), "m", np.float32)
    assert m.dtype == np.float32 and np.array_equal(m, [-np.inf, 0.0])
    f = canonical_mask(np.array([0.5, -1.0]), "m", np.float64)
    assert f.dtype == np.float64 and np.array_equal(f, [0.5, -1.0])
    assert canonical_mask(None, "m", np.float32) is None
    with pytest.raises(TypeError, match="key_padding_mask must be a bool or floating"):
        canonical_mask(np.array([0, 1]), "key_padding_mask", np.float32)


# ----- gradcheck ----------------------------------------------------------------------------
@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize("extras", [{}, {"add_bias_kv": True, "add_zero_attn": True, "kdim": 3}])
def test_mha_gradcheck(need_weights, extras):
    rng = np.random.default_rng(8)
    nk.manual_seed(0)
    mha = MultiheadAttention(4, 2, batch_first=True, dtype=np.float64, **extras)
    for p in mha.parameters():
        p.data[...] = rng.standard_normal(p.shape) * 0.5
    kdim = extras.get("kdim", 4)
    q, k, v = (rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 2, kdim)),
               rng.standard_normal((2, 2, 4)))
    attn = rng.standard_normal((3, 2))
    kpm = np.array([[False, False], [False, True]])

    def fn(q, k, v, *params):
        out, w = mha(q, k, v, key_padding_mask=kpm, attn_mask=attn, need_weights=need_weights,
                     average_attn_weights=False)
        return (out, w) if need_weights else out

    nk.gradcheck(fn, [q, k, v, *mha.parameters()], eps=1e-6, atol=1e-7, rtol=1e-5)


# ----- Transformer layers vs torch -----------------------------------------------------------
def _activation_pair(torch, name):
    if name == "tanh_callable":
        return (lambda x: torch.tanh(x)), (lambda x: x.tanh())
    return name, name


def _layer_masks(rng, N, T, S, kind):
    if kind == "none":
        return {}
    causal = generate_square_subsequent_mask(T, np.float64)
    kpm = np.zeros((N, S), dtype=bool)
    kpm[0, -1] = True
    tkpm = np.zeros((N, T), dtype=bool)
    tkpm[-1, -2:] = True
    if kind == "bool":
        return dict(tgt=np.triu(np.ones((T, T), dtype=bool), k=1), tkpm=tkpm, kpm=kpm,
                    mem=rng.random((T, S)) < 0.3)
    as_float = lambda m: np.where(m, -np.inf, 0.0)  # noqa: E731
    return dict(tgt=causal, tkpm=as_float(tkpm), kpm=as_float(kpm),
                mem=rng.standard_normal((T, S)))


def _to_torch_kwargs(torch, kwargs):
    return {k: (torch.tensor(v) if isinstance(v, np.ndarray) else v) for k, v in kwargs.items()}


def _run_and_compare(torch, nm, tm, n_args, kwargs, tol=TOL64, seed=0):
    n_in = [nk.tensor(a, requires_grad=True) for a in n_args]
    t_in = [torch.tensor(a, requires_grad=True) for a in n_args]
    out = nm(*n_in, **kwargs)
    t_out = tm(*t_in, **_to_torch_kwargs(torch, kwargs))
    np.testing.assert_allclose(out.numpy(), t_out.detach().numpy(), **tol)
    g = np.random.default_rng(seed).standard_normal(out.shape).astype(out.dtype)
    (out * g).sum().backward()
    (t_out * torch.tensor(g)).sum().backward()
    for a, b in zip(n_in, t_in, strict=True):
        np.testing.assert_allclose(a.grad, b.grad.numpy(), err_msg="input grad", **tol)
    _assert_param_grads(nm, tm, tol)


@pytest.mark.parametrize("mask_kind", ["none", "bool", "float"])
@pytest.mark.parametrize("activation", ["relu", "gelu", "tanh_callable"])
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_layer_matches_torch(norm_first, batch_first, activation, mask_kind):
    torch = import_torch()
    t_act, n_act = _activation_pair(torch, activation)
    torch.manual_seed(0)
    kw = dict(dim_feedforward=12, dropout=0.1, batch_first=batch_first, norm_first=norm_first)
    tm = torch.nn.TransformerEncoderLayer(8, 2, activation=t_act, **kw).double().eval()
    nm = TransformerEncoderLayer(8, 2, activation=n_act, dtype=np.float64, **kw).eval()
    _perturbed_copy(torch, tm, nm)
    rng = np.random.default_rng(1)
    N, T = 3, 5
    src = rng.standard_normal((N, T, 8) if batch_first else (T, N, 8))
    m = _layer_masks(rng, N, T, T, mask_kind)
    kwargs = {} if not m else dict(src_mask=m["tgt"], src_key_padding_mask=m["tkpm"])
    _run_and_compare(torch, nm, tm, [src], kwargs)


@pytest.mark.parametrize("mask_kind", ["none", "bool", "float"])
@pytest.mark.parametrize("activation", ["relu", "gelu", "tanh_callable"])
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_layer_matches_torch(norm_first, batch_first, activation, mask_kind):
    torch = import_torch()
    t_act, n_act = _activation_pair(torch, activation)
    torch.manual_seed(0)
    kw = dict(dim_feedforward=12, dropout=0.2, batch_first=batch_first, norm_first=norm_first)
    tm = torch.nn.TransformerDecoderLayer(8, 4, activation=t_act, **kw).double().eval()
    nm = TransformerDecoderLayer(8, 4, activation=n_act, dtype=np.float64, **kw).eval()
    _perturbed_copy(torch, tm, nm)
    rng = np.random.default_rng(2)
    N, T, S = 2, 4, 6
    shape = (lambda L: (N, L, 8)) if batch_first else (lambda L: (L, N, 8))
    tgt, memory = rng.standard_normal(shape(T)), rng.standard_normal(shape(S))
    m = _layer_masks(rng, N, T, S, mask_kind)
    kwargs = {} if not m else dict(tgt_mask=m["tgt"], memory_mask=m["mem"],
                                   tgt_key_padding_mask=m["tkpm"],
                                   memory_key_padding_mask=m["kpm"])
    _run_and_compare(torch, nm, tm, [tgt, memory], kwargs)


def test_layers_unbatched_and_float32_match_torch():
    torch = import_torch()
    torch.manual_seed(0)
    tm = torch.nn.TransformerDecoderLayer(8, 2, dim_feedforward=16, dropout=0.0)
    nm = TransformerDecoderLayer(8, 2, dim_feedforward=16, dropout=0.0)
    _perturbed_copy(torch, tm, nm)
    rng = np.random.default_rng(3)
    tgt, memory = (rng.standard_normal((4, 8)).astype(np.float32),
                   rng.standard_normal((6, 8)).astype(np.float32))
    mask = generate_square_subsequent_mask(4)
    _run_and_compare(torch, nm, tm, [tgt, memory], dict(tgt_mask=mask), tol=TOL32)
    te = torch.nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0,
                                          batch_first=True)
    ne = TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0, batch_first=True)
    _perturbed_copy(torch, te, ne)
    _run_and_compare(torch, ne, te, [rng.standard_normal((2, 5, 8)).astype(np.float32)],
                     {}, tol=TOL32)


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("norm_first", [False, True])
def test_transformer_matches_torch(norm_first, batch_first):
    torch = import_torch()
    torch.manual_seed(0)
    kw = dict(d_model=8, nhead=2, num_encoder_layers=2, num_decoder_layers=2,
              dim_feedforward=16, dropout=0.1, batch_first=batch_first, norm_first=norm_first,
              activation="gelu")
    tm = torch.nn.Transformer(**kw).double().eval()
    nm = Transformer(dtype=np.float64, **kw).eval()
    assert list(nm.state_dict()) == list(tm.state_dict())
    _perturbed_copy(torch, tm, nm)
    rng = np.random.default_rng(4)
    N, S, T = 2, 6, 4
    shape = (lambda L: (N, L, 8)) if batch_first else (lambda L: (L, N, 8))
    src, tgt = rng.standard_normal(shape(S)), rng.standard_normal(shape(T))
    src_kpm = np.zeros((N, S), dtype=bool)
    src_kpm[1, -2:] = True
    kwargs = dict(tgt_mask=Transformer.generate_square_subsequent_mask(T, np.float64),
                  src_key_padding_mask=src_kpm, memory_key_padding_mask=src_kpm,
                  src_mask=rng.standard_normal((S, S)))
    _run_and_compare(torch, nm, tm, [src, tgt], kwargs)


def test_encoder_decoder_stacks_match_torch_without_norm():
    torch = import_torch()
    torch.manual_seed(0)
    t_layer = torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0)
    n_layer = TransformerEncoderLayer(8, 2, 16, dropout=0.0)
    n_layer.load_state_dict(t_layer.state_dict())
    te = torch.nn.TransformerEncoder(t_layer, 3, enable_nested_tensor=False)
    ne = TransformerEncoder(n_layer, 3)
    assert list(ne.state_dict()) == list(te.state_dict())
    _perturbed_copy(torch, te, ne)
    x = np.random.default_rng(5).standard_normal((5, 2, 8)).astype(np.float32)
    _run_and_compare(torch, ne, te, [x], dict(mask=generate_square_subsequent_mask(5)),
                     tol=TOL32)
    t_dl = torch.nn.TransformerDecoderLayer(8, 2, 16, dropout=0.0)
    n_dl = TransformerDecoderLayer(8, 2, 16, dropout=0.0)
    td, nd = torch.nn.TransformerDecoder(t_dl, 2), TransformerDecoder(n_dl, 2)
    _perturbed_copy(torch, td, nd)
    mem = np.random.default_rng(6).standard_normal((3, 2, 8)).astype(np.float32)
    _run_and_compare(torch, nd, td, [x, mem], {}, tol=TOL32)


# ----- causal masks --------------------------------------------------------------------------
def test_generate_square_subsequent_mask_matches_torch():
    torch = import_torch()
    for n in (0, 1, 4):
        ours = generate_square_subsequent_mask(n)
        assert ours.dtype == np.float32
        np.testing.assert_array_equal(
            ours, torch.nn.Transformer.generate_square_subsequent_mask(n).numpy())
    assert generate_square_subsequent_mask(3, np.float64).dtype == np.float64


def test_detect_is_causal_mask():
    causal = generate_square_subsequent_mask(4)
    assert _detect_is_causal_mask(causal, None, 4)
    assert _detect_is_causal_mask(np.triu(np.ones((4, 4), bool), k=1), None, 4)
    assert not _detect_is_causal_mask(causal, None, 5)
    assert not _detect_is_causal_mask(causal.T, None, 4)
    assert not _detect_is_causal_mask(None, None, 4)
    assert _detect_is_causal_mask(None, True, 4)
    assert not _detect_is_causal_mask(causal, False, 4)


def test_encoder_detects_causal_mask_for_the_fused_kernel(spy):
    layer = TransformerEncoderLayer(8, 2, 16, dropout=0.0)
    enc = TransformerEncoder(layer, 2)
    x = np.random.default_rng(9).standard_normal((5, 2, 8)).astype(np.float32)
    enc(x, mask=generate_square_subsequent_mask(5))
    assert [c["is_causal"] for c in spy.calls] == [True, True]
    enc(x, mask=generate_square_subsequent_mask(5), is_causal=False)
    assert [c["is_causal"] for c in spy.calls[2:]] == [False, False]


# ----- modes, dropout, init, copies ------------------------------------------------------------
def test_attention_dropout_in_training_only():
    nk.manual_seed(0)
    mha = MultiheadAttention(8, 2, dropout=0.5, batch_first=True)
    x = np.random.default_rng(10).standard_normal((2, 5, 8)).astype(np.float32)
    mha.eval()
    out_eval, w_eval = mha(x, x, x, average_attn_weights=False)
    out_eval2, _ = mha(x, x, x, need_weights=False)
    np.testing.assert_allclose(out_eval.numpy(), out_eval2.numpy(), **TOL32)
    mha.train()
    _, w_train = mha(x, x, x, average_attn_weights=False)
    ratio = w_train.numpy() / w_eval.numpy()
    dropped = np.isclose(ratio, 0.0)
    assert np.all(dropped | np.isclose(ratio, 2.0, rtol=1e-5))
    assert 0.2 < dropped.mean() < 0.8


def test_layer_dropout_active_in_training_mode():
    x = np.random.default_rng(11).standard_normal((4, 2, 8)).astype(np.float32)
    layer = TransformerEncoderLayer(8, 2, 16, dropout=0.5)
    a, b = layer(x).numpy(), layer(x).numpy()
    assert not np.allclose(a, b)
    layer.eval()
    np.testing.assert_array_equal(layer(x).numpy(), layer(x).numpy())


def test_mha_initialisation_as_torch():
    nk.manual_seed(0)
    E = 64
    mha = MultiheadAttention(E, 4)
    bound = math.sqrt(6.0 / (E + 3 * E))  # xavier_uniform_ on (3E, E)
    w = mha.in_proj_weight.numpy()
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.9 * bound
    assert not np.any(mha.in_proj_bias.numpy()) and not np.any(mha.out_proj.bias.numpy())
    assert np.abs(mha.out_proj.weight.numpy()).max() <= 1 / math.sqrt(E)
    sep = MultiheadAttention(E, 4, kdim=32, vdim=16, add_bias_kv=True)
    assert sep.in_proj_weight is None and sep.k_proj_weight.shape == (E, 32)
    assert np.abs(sep.k_proj_weight.numpy()).max() <= math.sqrt(6.0 / (E + 32))
    assert abs(sep.bias_k.numpy().std() - math.sqrt(1.0 / E)) < 0.5 * math.sqrt(1.0 / E)


def test_state_dict_names_and_shapes_match_torch():
    torch = import_torch()
    cases = [
        (dict(embed_dim=8, num_heads=2), {}),
        (dict(embed_dim=8, num_heads=2, kdim=3, vdim=5, bias=False, add_bias_kv=True), {}),
    ]
    for kw, _ in cases:
        ours = MultiheadAttention(**kw).state_dict()
        theirs = torch.nn.MultiheadAttention(**kw).state_dict()
        assert list(ours) == list(theirs)
        assert [v.shape for v in ours.values()] == [tuple(v.shape) for v in theirs.values()]
    for cls, tcls in ((TransformerEncoderLayer, torch.nn.TransformerEncoderLayer),
                      (TransformerDecoderLayer, torch.nn.TransformerDecoderLayer)):
        for bias in (True, False):
            ours = cls(8, 2, 16, bias=bias).state_dict()
            theirs = tcls(8, 2, 16, bias=bias).state_dict()
            assert list(ours) == list(theirs)
            assert [v.shape for v in ours.values()] == [tuple(v.shape) for v in theirs.values()]


def test_transformer_init_and_clones():
    nk.manual_seed(1)
    model = Transformer(16, 4, 2, 2, 32, batch_first=True)
    layers = model.encoder.layers
    assert len(layers) == 2 and layers[0] is not layers[1]
    w0, w1 = layers[0].linear1.weight, layers[1].linear1.weight
    assert w0 is not w1 and w0.data is not w1.data
    bound = math.sqrt(6.0 / (16 + 32))  # every matrix re-drawn xavier_uniform_
    assert np.abs(w0.numpy()).max() <= bound
    enc = TransformerEncoder(TransformerEncoderLayer(8, 2, 16), 3)
    a, b = enc.layers[0].self_attn.in_proj_weight, enc.layers[2].self_attn.in_proj_weight
    np.testing.assert_array_equal(a.numpy(), b.numpy())  # clones start equal, as torch
    a.data[...] = 0
    assert np.any(b.numpy())
    copied = copy.deepcopy(enc)
    assert list(copied.state_dict()) == list(enc.state_dict())
    enc.eval()
    assert not any(m.training for m in enc.modules())
    custom = Transformer(8, 2, num_decoder_layers=1, dim_feedforward=16, custom_encoder=enc)
    assert custom.encoder is enc and len(custom.decoder.layers) == 1
    out = custom(np.ones((5, 2, 8), np.float32), np.ones((3, 2, 8), np.float32))
    assert out.shape == (3, 2, 8) and np.isfinite(out.numpy()).all()


def test_activation_module_and_callable():
    layer = TransformerEncoderLayer(8, 2, 16, activation=nk.nn.GELU())
    assert "activation" in dict(layer.named_children())
    x = np.ones((3, 2, 8), np.float32)
    assert layer(x).shape == (3, 2, 8)
    assert TransformerDecoderLayer(8, 2, 16, activation="gelu").activation is F.gelu


# ----- errors ----------------------------------------------------------------------------------
def test_constructor_errors():
    with pytest.raises(ValueError, match="embed_dim=10 is not divisible by num_heads=3"):
        MultiheadAttention(10, 3)
    with pytest.raises(ValueError, match="embed_dim must be >= 1"):
        MultiheadAttention(0, 1)
    with pytest.raises(ValueError, match="dropout must be <= 1"):
        MultiheadAttention(4, 2, dropout=1.5)
    with pytest.raises(ValueError, match="activation must be 'relu', 'gelu' or a callable"):
        TransformerEncoderLayer(4, 2, 8, activation="swish")
    with pytest.raises(TypeError, match="activation"):
        TransformerDecoderLayer(4, 2, 8, activation=3)
    with pytest.raises(ValueError, match="d_model=6 is not divisible by nhead=4"):
        TransformerEncoderLayer(6, 4, 8)


def test_mha_input_errors():
    mha = MultiheadAttention(8, 2, kdim=4)
    q, k, v = np.zeros((3, 2, 8)), np.zeros((5, 2, 4)), np.zeros((5, 2, 8))
    with pytest.raises(ValueError, match=r"query has 6 features .* embed_dim=8"):
        mha(np.zeros((3, 2, 6)), k, v)
    with pytest.raises(ValueError, match=r"key has 8 features .* kdim=4"):
        mha(q, np.zeros((5, 2, 8)), v)
    with pytest.raises(ValueError, match=r"value has 4 features .* vdim=8"):
        mha(q, k, np.zeros((5, 2, 4)))
    with pytest.raises(ValueError, match="same sequence length and batch size"):
        mha(q, k, np.zeros((4, 2, 8)))
    with pytest.raises(ValueError, match="different batch sizes"):
        mha(q, np.zeros((5, 3, 4)), np.zeros((5, 3, 8)))
    with pytest.raises(ValueError, match="same number of dimensions"):
        mha(q, k[:, 0], v)
    with pytest.raises(ValueError, match="query must be 3-D"):
        mha(np.zeros(8), k, v)
    with pytest.raises(TypeError, match="query must be a floating-point"):
        mha(np.zeros((3, 2, 8), dtype=int), k, v)


def test_mha_mask_errors():
    mha = MultiheadAttention(8, 2)
    x, mem = np.zeros((3, 2, 8)), np.zeros((5, 2, 8))
    with pytest.raises(ValueError, match=r"attn_mask has shape \(3, 3\) but must be \(L, S\) "
                                         r"= \(3, 5\) or \(N \* num_heads, L, S\) = \(4, 3, 5\)"):
        mha(x, mem, mem, attn_mask=np.zeros((3, 3), bool))
    with pytest.raises(ValueError, match=r"attn_mask has shape \(2, 3, 5\)"):
        mha(x, mem, mem, attn_mask=np.zeros((2, 3, 5)))
    with pytest.raises(ValueError, match=r"key_padding_mask has shape \(5, 2\) but must be "
                                         r"\(2, 5\)"):
        mha(x, mem, mem, key_padding_mask=np.zeros((5, 2), bool))
    with pytest.raises(ValueError, match=r"key_padding_mask has shape \(2, 5\) but must be "
                                         r"\(5,\)"):
        mha(x[:, 0], mem[:, 0], mem[:, 0], key_padding_mask=np.zeros((2, 5), bool))
    with pytest.raises(TypeError, match="attn_mask must be a bool or floating-point mask"):
        mha(x, mem, mem, attn_mask=np.zeros((3, 5), dtype=np.int64))
    with pytest.raises(ValueError, match="is_causal=True needs attn_mask"):
        mha(x, x, x, is_causal=True)


def test_transformer_input_errors():
    model = Transformer(8, 2, 1, 1, 16)
    with pytest.raises(ValueError, match="different batch sizes"):
        model(np.zeros((5, 2, 8)), np.zeros((4, 3, 8)))
    with pytest.raises(ValueError, match="d_model=8"):
        model(np.zeros((5, 2, 8)), np.zeros((4, 2, 6)))
    with pytest.raises(ValueError, match="both be batched"):
        model(np.zeros((5, 2, 8)), np.zeros((4, 8)))
    layer = TransformerEncoderLayer(8, 2, 16)
    with pytest.raises(ValueError, match=r"src has shape \(5, 2, 7\) .* d_model=8"):
        layer(np.zeros((5, 2, 7), np.float32))
    with pytest.raises(ValueError, match=r"memory has shape"):
        TransformerDecoderLayer(8, 2, 16)(np.zeros((4, 2, 8)), np.zeros((4, 2, 3)))
    with pytest.raises(TypeError, match="encoder_layer must be a Module"):
        TransformerEncoder("layer", 2)


# ----- real GPU ------------------------------------------------------------------------------
def _to_gpu(module, cupy):
    for p in module.parameters():
        p.data = cupy.asarray(p.data)
    return module


@pytest.mark.cuda
@pytest.mark.parametrize("need_weights", [True, False])
def test_mha_and_encoder_layer_on_gpu_match_cpu(need_weights):
    cupy = pytest.importorskip("cupy")
    rng = np.random.default_rng(12)
    nk.manual_seed(0)
    cpu = MultiheadAttention(16, 4, batch_first=True, kdim=8, vdim=8, dtype=np.float64)
    gpu = _to_gpu(copy.deepcopy(cpu), cupy)
    q, kv = rng.standard_normal((2, 5, 16)), rng.standard_normal((2, 7, 8))
    attn, kpm = rng.random((5, 7)) < 0.3, np.zeros((2, 7), bool)
    attn[:, 0], kpm[1, -3:] = False, True
    results = []
    for module, xp in ((cpu, np), (gpu, cupy)):
        qt, kt = nk.tensor(xp.asarray(q), requires_grad=True), nk.tensor(xp.asarray(kv))
        out, w = module(qt, kt, kt, attn_mask=xp.asarray(attn), key_padding_mask=kpm,
                        need_weights=need_weights)
        assert isinstance(out.data, xp.ndarray)
        dead_kpm = xp.asarray(np.ones((2, 7), bool))  # every key padded: NaN or zero rows
        dead = module(qt, kt, kt, key_padding_mask=dead_kpm, need_weights=need_weights)[0]
        assert bool(xp.isnan(dead.data).all()) == need_weights
        out.sum().backward()
        grads = [qt.grad] + [p.grad for p in module.parameters()]
        results.append([out.data] + ([] if w is None else [w.data]) + grads)
    for a, b in zip(*results, strict=True):
        np.testing.assert_allclose(cupy.asnumpy(b), a, rtol=1e-9, atol=1e-10)
    layer = TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True,
                                    dtype=np.float64)
    want = layer(q).numpy()
    got = _to_gpu(layer, cupy)(cupy.asarray(q))
    np.testing.assert_allclose(cupy.asnumpy(got.data), want, rtol=1e-9, atol=1e-10)
