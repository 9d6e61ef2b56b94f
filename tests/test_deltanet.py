"""``nn.DeltaNet`` (fla's DeltaNet token mixer) and ``nn.ShortConvolution``.

- Equal to a torch transcription of fla's ``DeltaNet.forward`` (projections, short
  convolutions with SiLU, per-head L2 norm, a step-by-step delta-rule loop, RMS norm / gated
  RMS norm, o_proj) fed the same ``state_dict``, to 1e-10 in float64 (torch optional).
- Finite-difference gradients in float64 through the input and the parameters.
- ``step`` token by token equals the full forward, goes on from
  ``forward(output_final_state=True)``, and a forward split in two with ``initial_state``
  equals the whole.
- fla's ``state_dict`` names and shapes; mode 'chunk' equals 'recurrent'; bad inputs named.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import import_torch

import nnkit as nk

SMALL = dict(hidden_size=8, num_heads=2, conv_size=3)
VARIANTS = [
    dict(SMALL),
    dict(SMALL, use_gate=True, conv_bias=True, expand_v=1.5),
    dict(SMALL, use_short_conv=False, use_beta=False),
    dict(SMALL, qk_activation="elu", qk_norm="sum", allow_neg_eigval=True, use_gate=True),
    dict(SMALL, qk_activation="relu", expand_k=0.5),
]


def _layer(seed=0, scale=0.3, **kwargs):
    """A float64 DeltaNet with its norm weights and conv biases moved off their init."""
    layer = nk.nn.DeltaNet(**kwargs, dtype=np.float64)
    rng = np.random.default_rng(seed)
    for name, p in layer.named_parameters():
        if "norm" in name or "bias" in name:
            p.data[...] += scale * rng.standard_normal(p.shape)
    return layer


def _x(batch=2, length=7, hidden=8, seed=1):
    return np.random.default_rng(seed).standard_normal((batch, length, hidden))


# ----- a torch transcription of fla.layers.DeltaNet.forward ------------------------------------
def _torch_deltanet(torch, sd, x, cfg):
    """fla's DeltaNet forward in plain torch, on ``sd`` (a state_dict of torch tensors)."""
    Fn = torch.nn.functional
    H = cfg["num_heads"]
    B, T, _ = x.shape
    act = cfg.get("qk_activation", "silu")

    def short_conv(name, u, silu):
        w = sd[f"{name}.weight"]  # (D, 1, K)
        K = w.shape[-1]
        y = Fn.conv1d(u.transpose(1, 2), w, sd.get(f"{name}.bias"), padding=K - 1,
                      groups=w.shape[0])[..., :T].transpose(1, 2)
        return Fn.silu(y) if silu else y

    q, k, v = (x @ sd[f"{n}_proj.weight"].T for n in "qkv")
    if cfg.get("use_short_conv", True):
        q = short_conv("q_conv1d", q, act == "silu")
        k = short_conv("k_conv1d", k, act == "silu")
        v = short_conv("v_conv1d", v, True)
    else:
        if act == "silu":
            q, k = Fn.silu(q), Fn.silu(k)
        v = Fn.silu(v)
    q, k = (u.reshape(B, T, H, -1) for u in (q, k))
    v = v.reshape(B, T, H, -1)
    if act == "relu":
        q, k = q.relu(), k.relu()
    elif act == "elu":
        q, k = Fn.elu(q) + 1, Fn.elu(k) + 1
    if cfg.get("qk_norm", "l2") == "sum":
        q, k = q / q.sum(-1, keepdim=True), k / k.sum(-1, keepdim=True)
    else:  # fla's l2norm: x * rsqrt(sum(x^2) + 1e-6)
        q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    if cfg.get("use_beta", True):
        beta = (x @ sd["b_proj.weight"].T).sigmoid()
    else:
        beta = torch.ones(B, T, H, dtype=x.dtype)
    if cfg.get("allow_neg_eigval", False):
        beta = beta * 2
    dk, dv = q.shape[-1], v.shape[-1]
    S = torch.zeros(B, H, dk, dv, dtype=x.dtype)
    outs = []
    for t in range(T):  # S = S + beta k (v - S^T k)^T; o = S^T q / sqrt(dk)
        kt, vt, qt, bt = k[:, t], v[:, t], q[:, t], beta[:, t]
        err = vt - torch.einsum("bhk,bhkv->bhv", kt, S)
        S = S + bt[..., None, None] * kt[..., :, None] * err[..., None, :]
        outs.append(torch.einsum("bhk,bhkv->bhv", qt * dk ** -0.5, S))
    o = torch.stack(outs, 1)  # (B, T, H, dv)
    eps = cfg.get("norm_eps", 1e-5)
    o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + eps) * sd["o_norm.weight"]
    if cfg.get("use_gate", False):
        g = (x @ sd["g_proj.weight"].T).reshape(B, T, H, dv)
        o = o * Fn.silu(g)
    return o.reshape(B, T, H * dv) @ sd["o_proj.weight"].T


@pytest.mark.parametrize("cfg", VARIANTS, ids=lambda c: ",".join(f"{k}={v}" for k, v in
                                                                    c.items() if k not in SMALL))
def test_forward_equals_a_torch_transcription_of_fla(cfg):
    torch = import_torch()
    layer = _layer(**cfg)
    x = _x(length=9)
    sd = {name: torch.from_numpy(np.array(a)) for name, a in layer.state_dict().items()}
    want = _torch_deltanet(torch, sd, torch.from_numpy(x), cfg).numpy()
    np.testing.assert_allclose(layer(x).numpy(), want, rtol=1e-10, atol=1e-10)


# ----- gradients ---------------------------------------------------------------------------
@pytest.mark.parametrize("cfg", [VARIANTS[0], VARIANTS[1]], ids=["plain", "gated"])
def test_gradients_match_finite_differences(cfg):
    layer = _layer(**dict(cfg, hidden_size=4, conv_size=2), seed=3)
    x = nk.tensor(_x(batch=1, length=3, hidden=4, seed=4), requires_grad=True)
    named = dict(layer.named_parameters())
    names = ["q_proj.weight", "k_conv1d.weight", "v_proj.weight", "b_proj.weight",
             "o_norm.weight"] + (["g_proj.weight", "q_conv1d.bias"] if cfg.get("use_gate")
                                 else [])
    params = [named[n] for n in names]
    assert nk.gradcheck(lambda x, *_: layer(x), [x, *params], atol=1e-6, rtol=1e-5)


def test_every_parameter_gets_a_gradient():
    layer = _layer(**VARIANTS[1])
    layer(_x()).sum().backward()
    for name, p in layer.named_parameters():
        assert p.grad is not None and np.abs(p.grad).max() > 0, name


# ----- decoding ----------------------------------------------------------------------------
@pytest.mark.parametrize("cfg", VARIANTS, ids=[str(i) for i in range(len(VARIANTS))])
def test_step_by_step_equals_the_full_forward(cfg):
    layer = _layer(**cfg, seed=5)
    x = _x(batch=3, length=6, seed=6)
    full, last = layer(x, output_final_state=True)
    state, outs = None, []
    for t in range(x.shape[1]):
        y, state = layer.step(x[:, t], state)
        outs.append(y)
    np.testing.assert_allclose(np.stack(outs, 1), full.numpy(), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(state.recurrent_state, last.recurrent_state, atol=1e-12)
    if layer.use_short_conv:
        for a, b in zip(state.conv_state, last.conv_state, strict=True):
            np.testing.assert_array_equal(a, b)
    else:
        assert state.conv_state is None and last.conv_state is None


@pytest.mark.parametrize("split", [1, 2, 5])
def test_state_carries_across_calls(split):
    layer = _layer(**VARIANTS[1], seed=7)
    x = _x(length=8, seed=8)
    whole = layer(x).numpy()
    head, state = layer(x[:, :split], output_final_state=True)
    tail = layer(x[:, split:], initial_state=state)
    np.testing.assert_allclose(np.concatenate([head.numpy(), tail.numpy()], 1), whole,
                               rtol=1e-10, atol=1e-10)
    y, _ = layer.step(x[:, split], state)  # step goes on from forward's state
    np.testing.assert_allclose(y, whole[:, split], rtol=1e-10, atol=1e-10)


# ----- names, modes, refusals -------------------------------------------------------------
def test_state_dict_names_and_shapes():
    layer = nk.nn.DeltaNet(hidden_size=8, num_heads=2, expand_k=0.5, expand_v=2.0,
                           conv_size=4, use_gate=True, conv_bias=True)
    assert {n: tuple(a.shape) for n, a in layer.state_dict().items()} == {
        "q_proj.weight": (4, 8), "k_proj.weight": (4, 8), "v_proj.weight": (16, 8),
        "b_proj.weight": (2, 8),
        "q_conv1d.weight": (4, 1, 4), "q_conv1d.bias": (4,),
        "k_conv1d.weight": (4, 1, 4), "k_conv1d.bias": (4,),
        "v_conv1d.weight": (16, 1, 4), "v_conv1d.bias": (16,),
        "g_proj.weight": (16, 8), "o_norm.weight": (8,), "o_proj.weight": (8, 16),
    }
    plain = nk.nn.DeltaNet(hidden_size=8, num_heads=2, use_short_conv=False, use_beta=False)
    assert sorted(plain.state_dict()) == ["k_proj.weight", "o_norm.weight", "o_proj.weight",
                                          "q_proj.weight", "v_proj.weight"]
    assert plain.q_proj.weight.dtype == np.float32
    np.testing.assert_array_equal(plain.o_norm.weight.data, 1)
    bound = 8 ** -0.5  # torch's Linear default: U(+-1/sqrt(in_features))
    assert np.abs(plain.q_proj.weight.data).max() <= bound


def test_load_state_dict_round_trip():
    a, b = _layer(**VARIANTS[1], seed=9), nk.nn.DeltaNet(**VARIANTS[1], dtype=np.float64)
    b.load_state_dict(a.state_dict())
    x = _x()
    np.testing.assert_array_equal(a(x).numpy(), b(x).numpy())


def test_chunk_mode_equals_recurrent_mode():
    x = _x(length=11, seed=10)
    chunk = _layer(**VARIANTS[1], mode="chunk", chunk_size=4, seed=11)
    rec = nk.nn.DeltaNet(**VARIANTS[1], mode="recurrent", dtype=np.float64)
    rec.load_state_dict(chunk.state_dict())
    np.testing.assert_allclose(chunk(x).numpy(), rec(x).numpy(), rtol=1e-10, atol=1e-10)
    assert nk.nn.DeltaNet(**SMALL, mode="fused_recurrent").mode == "recurrent"


def test_float32_runs_and_matches_float64():
    layer64 = _layer(**SMALL, seed=12)
    layer32 = nk.nn.DeltaNet(**SMALL)
    layer32.load_state_dict({n: np.asarray(a, np.float32)
                             for n, a in layer64.state_dict().items()})
    x = _x(length=5, seed=13)
    y32 = layer32(x.astype(np.float32)).numpy()
    assert y32.dtype == np.float32
    np.testing.assert_allclose(y32, layer64(x).numpy(), rtol=1e-4, atol=1e-4)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="num_heads"):
        nk.nn.DeltaNet(hidden_size=6, num_heads=4)
    with pytest.raises(ValueError, match="qk_activation"):
        nk.nn.DeltaNet(**SMALL, qk_activation="gelu")
    with pytest.raises(ValueError, match="mode"):
        nk.nn.DeltaNet(**SMALL, mode="fused_chunk")
    layer = nk.nn.DeltaNet(**SMALL)
    with pytest.raises(ValueError, match="hidden_size=8"):
        layer(np.zeros((1, 3, 5), np.float32))
    with pytest.raises(TypeError, match="x"):
        layer(np.zeros((1, 3, 8), np.float64))
    with pytest.raises(ValueError, match="DeltaNetState"):
        layer.step(np.zeros((2, 8), np.float32), layer.initial_state(3))
