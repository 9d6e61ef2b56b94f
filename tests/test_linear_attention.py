"""F.linear_attention, F.gated_linear_attention, F.delta_rule, F.gated_delta_rule: the chunked
form against the recurrent one (1e-10 in float64, outputs, final states and gradients), the
chunk size changing nothing beyond rounding, a sequence continued from its final state,
gradcheck, long-T stability in float32, properties from the theory, refusals.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from numpy.testing import assert_allclose

import nnkit as nk
import nnkit.functional as F

OPS = ("linear_attention", "gated_linear_attention", "gated_linear_attention_per_key",
       "delta_rule", "gated_delta_rule")


def make_problem(op, B, H, T, dk, dv, seed=0, dtype=np.float64, initial=True, g_scale=0.5):
    """Keyword arguments of ``op`` (keys of norm <= 1, beta in (0, 1): the delta rule stable)."""
    rng = np.random.default_rng(seed)
    k = rng.standard_normal((B, H, T, dk))
    k /= np.maximum(np.linalg.norm(k, axis=-1, keepdims=True), 1.0)
    kw = {"q": rng.standard_normal((B, H, T, dk)), "k": k,
          "v": rng.standard_normal((B, H, T, dv))}
    if op.startswith("gated"):
        shape = (B, H, T, dk) if op.endswith("per_key") else (B, H, T)
        kw["g"] = -g_scale * rng.uniform(0, 1, shape)
    if "delta" in op:
        kw["beta"] = rng.uniform(0.05, 0.95, (B, H, T))
    if initial:
        kw["initial_state"] = rng.standard_normal((B, H, dk, dv))
    return {n: a.astype(dtype) for n, a in kw.items()}


def run(op, kw, **options):
    fn = getattr(F, op.removesuffix("_per_key"))
    return fn(**kw, output_final_state=True, **options)


def outputs_and_grads(op, kw, seed=1, **options):
    """o, final state, and the gradients of a random linear function of both."""
    tensors = {n: nk.tensor(a, requires_grad=True) for n, a in kw.items()}
    o, final = run(op, tensors, **options)
    rng = np.random.default_rng(seed)
    loss = (o * rng.standard_normal(o.shape)).sum() + (final * rng.standard_normal(
        final.shape)).sum()
    loss.backward()
    return o.numpy(), final.numpy(), {n: t.grad for n, t in tensors.items()}


def assert_same(a, b, rtol=1e-10, atol=1e-10):
    o1, f1, g1 = a
    o2, f2, g2 = b
    assert_allclose(o1, o2, rtol=rtol, atol=atol, err_msg="o")
    assert_allclose(f1, f2, rtol=rtol, atol=atol, err_msg="final state")
    for name in g1:
        assert_allclose(g1[name], g2[name], rtol=rtol, atol=atol, err_msg=f"d{name}")


@given(op=st.sampled_from(OPS), T=st.sampled_from([0, 1, 5, 17, 64, 65, 130]),
       chunk=st.sampled_from([1, 3, 8, 64]), dk=st.integers(1, 6), dv=st.integers(1, 5),
       initial=st.booleans(), seed=st.integers(0, 2**16))
def test_chunk_equals_recurrent(op, T, chunk, dk, dv, initial, seed):
    kw = make_problem(op, 2, 2, T, dk, dv, seed=seed, initial=initial)
    assert_same(outputs_and_grads(op, kw, mode="chunk", chunk_size=chunk),
                outputs_and_grads(op, kw, mode="recurrent"))


@pytest.mark.parametrize("op", OPS)
def test_chunk_size_changes_nothing_beyond_rounding(op):
    kw = make_problem(op, 1, 2, 200, 16, 8, dtype=np.float32)
    base = run(op, kw, mode="chunk", chunk_size=64)
    for chunk in (16, 32, 50, 128):
        o, final = run(op, kw, mode="chunk", chunk_size=chunk)
        assert_allclose(o.numpy(), base[0].numpy(), rtol=1e-4, atol=1e-4)
        assert_allclose(final.numpy(), base[1].numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("mode", ["chunk", "recurrent"])
@pytest.mark.parametrize("op", OPS)
def test_a_sequence_continues_from_its_final_state(op, mode):
    kw = make_problem(op, 2, 1, 70, 4, 3)
    o, final = run(op, kw, mode=mode, chunk_size=16)
    split = 33
    first = {n: (a[:, :, :split] if a.ndim >= 3 and n != "initial_state" else a)
             for n, a in kw.items()}
    o1, s1 = run(op, first, mode=mode, chunk_size=16)
    second = {n: (a[:, :, split:] if a.ndim >= 3 and n != "initial_state" else a)
              for n, a in kw.items()}
    second["initial_state"] = s1.numpy()
    o2, s2 = run(op, second, mode=mode, chunk_size=16)
    assert_allclose(np.concatenate([o1.numpy(), o2.numpy()], axis=2), o.numpy(), rtol=1e-10,
                    atol=1e-12)
    assert_allclose(s2.numpy(), final.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("mode", ["chunk", "recurrent"])
@pytest.mark.parametrize("op", OPS)
def test_gradcheck(op, mode):
    kw = make_problem(op, 1, 2, 7, 3, 2)
    names = list(kw)

    def fn(*xs):
        return run(op, dict(zip(names, xs, strict=True)), mode=mode, chunk_size=3)

    assert nk.gradcheck(fn, [kw[n] for n in names])


def test_linear_attention_is_masked_attention_without_softmax():
    kw = make_problem("linear_attention", 2, 3, 9, 4, 5, initial=False)
    q, k, v = kw["q"], kw["k"], kw["v"]
    scores = np.tril(q @ k.swapaxes(-1, -2)) * 0.5
    o, final = F.linear_attention(q, k, v, scale=0.5, output_final_state=True)
    assert_allclose(o.numpy(), scores @ v, rtol=1e-12, atol=1e-12)
    assert_allclose(final.numpy(), k.swapaxes(-1, -2) @ v, rtol=1e-12, atol=1e-12)


def test_normalized_linear_attention_divides_by_the_key_sums():
    kw = make_problem("linear_attention", 1, 2, 6, 3, 2, initial=False)
    q, k, v = (np.abs(kw[n]) + 0.1 for n in ("q", "k", "v"))
    o, final = F.linear_attention(q, k, v, normalize=True)
    assert final is None
    scores = np.tril(q @ k.swapaxes(-1, -2))
    assert_allclose(o.numpy(), (scores @ v) / scores.sum(-1, keepdims=True), rtol=1e-12)
    o_elu, _ = F.linear_attention(q - 1, k - 1, v, feature_map="elu")
    phi = lambda x: np.where(x > 0, x + 1, np.exp(np.minimum(x, 0)))  # noqa: E731
    expected = np.tril(phi(q - 1) @ phi(k - 1).swapaxes(-1, -2)) @ v / np.sqrt(3)
    assert_allclose(o_elu.numpy(), expected, rtol=1e-12)


def test_delta_rule_with_orthonormal_keys_recalls_what_it_wrote():
    """beta = 1 overwrites the value stored at a key: after writing v_i at orthonormal keys
    (and twice at the first, the second value replacing the first), reading k_i gives v_i."""
    rng = np.random.default_rng(3)
    dk, dv, n = 8, 5, 6
    keys = np.linalg.qr(rng.standard_normal((dk, dk)))[0][:n]
    k = np.concatenate([keys, keys[:1]])[None, None]
    v = rng.standard_normal((1, 1, n + 1, dv))
    _, S = F.delta_rule(k, k, v, np.ones((1, 1, n + 1)), scale=1.0, output_final_state=True)
    recalled = keys @ S.numpy()[0, 0]
    assert_allclose(recalled[1:], v[0, 0, 1:n], atol=1e-12)
    assert_allclose(recalled[0], v[0, 0, n], atol=1e-12)


@pytest.mark.parametrize("mode", ["chunk", "recurrent"])
@pytest.mark.parametrize("op", ["gated_delta_rule", "gated_linear_attention_per_key"])
def test_long_sequences_with_extreme_gates_stay_finite_and_accurate(op, mode):
    """T = 65536 in float32 against float64: gates from no decay to exp(-30) per step, beta
    from 0 to 1; every exponent of the chunked form stays <= 0, so nothing overflows."""
    T = 65536
    kw = make_problem(op, 1, 1, T, 8, 4, initial=False)
    rng = np.random.default_rng(5)
    kw["g"] = np.where(rng.uniform(size=kw["g"].shape) < 0.01, -30.0, kw["g"] * 0.02)
    if "beta" in kw:
        kw["beta"] = rng.choice([0.0, 0.5, 1.0], size=kw["beta"].shape)
    wide, _ = run(op, kw, mode=mode)
    narrow, _ = run(op, {n: a.astype(np.float32) for n, a in kw.items()}, mode=mode)
    wide = wide.numpy()
    assert np.isfinite(narrow.numpy()).all()
    err = np.abs(narrow.numpy() - wide).max() / np.abs(wide).max()
    assert err < 1e-3


@pytest.mark.parametrize("call, error, pattern", [
    (lambda kw: F.delta_rule(**kw, chunk_size=0), ValueError, "chunk_size"),
    (lambda kw: F.delta_rule(**kw, mode="fast"), ValueError, "mode"),
    (lambda kw: F.delta_rule(**{**kw, "beta": kw["beta"][..., :3]}), ValueError, "beta"),
    (lambda kw: F.delta_rule(**{**kw, "v": kw["v"][:, :1]}), ValueError, "v"),
    (lambda kw: F.delta_rule(**{**kw, "k": kw["k"].astype(np.float32)}), TypeError, "k"),
    (lambda kw: F.delta_rule(**{**kw, "initial_state": kw["initial_state"][..., :1, :]}),
     ValueError, "initial_state"),
    (lambda kw: F.gated_delta_rule(**kw, g=np.zeros(kw["q"].shape)), ValueError, "g"),
    (lambda kw: F.linear_attention(kw["q"], kw["k"], kw["v"], normalize=True,
                                   initial_state=kw["initial_state"]),
     ValueError, "initial_state"),
    (lambda kw: F.linear_attention(kw["q"], kw["k"], kw["v"], feature_map="tanh"),
     ValueError, "feature_map"),
])
def test_refusals_name_the_argument(call, error, pattern):
    kw = make_problem("delta_rule", 1, 2, 5, 3, 2)
    with pytest.raises(error, match=pattern):
        call(kw)


def test_final_state_is_none_unless_asked_and_auto_mode_is_recurrent_on_the_cpu():
    kw = make_problem("delta_rule", 1, 1, 4, 2, 2)
    o, final = F.delta_rule(**kw)
    assert final is None and o.shape == (1, 1, 4, 2)
    from nnkit.kernels.linear_attention import linear_attention_forward
    _, cache = linear_attention_forward(kw["q"], kw["k"], kw["v"], kw["beta"], delta=True)
    assert cache.mode == "recurrent"


@pytest.mark.parametrize("mode", ["chunk", "recurrent"])
@pytest.mark.parametrize("op", OPS)
def test_packed_sequences_give_what_each_gives_alone(op, mode):
    """cu_seqlens: sequences of lengths 5, 0, 1, 70 and 3 packed along T; outputs, final
    states and gradients equal to running each sequence alone from its own initial state."""
    lengths = [5, 0, 1, 70, 3]
    cu = np.concatenate([[0], np.cumsum(lengths)])
    packed = make_problem(op, 1, 2, int(cu[-1]), 3, 2, seed=9, initial=False)
    states = np.random.default_rng(10).standard_normal((len(lengths), 2, 3, 2))
    packed["initial_state"] = states
    rng = np.random.default_rng(11)
    do = rng.standard_normal((1, 2, int(cu[-1]), 2))
    dfinal = rng.standard_normal(states.shape)
    together = grads_for(op, packed, do, dfinal, mode=mode, chunk_size=16, cu_seqlens=cu)
    for n in range(len(lengths)):
        alone = {name: (a[:, :, cu[n]:cu[n + 1]] if name != "initial_state" else a[n:n + 1])
                 for name, a in packed.items()}
        o, final, grads = grads_for(op, alone, do[:, :, cu[n]:cu[n + 1]], dfinal[n:n + 1],
                                    mode=mode, chunk_size=16)
        assert_allclose(together[0][:, :, cu[n]:cu[n + 1]], o, rtol=1e-10, atol=1e-12)
        assert_allclose(together[1][n:n + 1], final, rtol=1e-10, atol=1e-12)
        for name, grad in grads.items():
            part = (together[2][name][n:n + 1] if name == "initial_state"
                    else together[2][name][:, :, cu[n]:cu[n + 1]])
            assert_allclose(part, grad, rtol=1e-10, atol=1e-12, err_msg=f"d{name}, {n}")


def grads_for(op, kw, do, dfinal, **options):
    """o, final state, and the gradients of sum(o * do) + sum(final * dfinal)."""
    tensors = {n: nk.tensor(a, requires_grad=True) for n, a in kw.items()}
    o, final = run(op, tensors, **options)
    ((o * do).sum() + (final * dfinal).sum()).backward()
    return o.numpy(), final.numpy(), {n: t.grad for n, t in tensors.items()}


def test_packed_normalized_linear_attention_and_no_sequences():
    q, k, v = (np.abs(np.random.default_rng(2).standard_normal((1, 1, 9, 2))) + 0.1
               for _ in range(3))
    cu = np.array([0, 4, 9])
    o, _ = F.linear_attention(q, k, v, normalize=True, cu_seqlens=cu)
    first, _ = F.linear_attention(q[:, :, :4], k[:, :, :4], v[:, :, :4], normalize=True)
    assert_allclose(o.numpy()[:, :, :4], first.numpy(), rtol=1e-12)
    empty = np.zeros((1, 1, 0, 2))
    o, final = F.delta_rule(empty, empty, empty, np.zeros((1, 1, 0)), cu_seqlens=np.array([0]),
                            output_final_state=True)
    assert o.shape == (1, 1, 0, 2) and final.shape == (0, 1, 2, 2)


@pytest.mark.parametrize("cu, error, pattern", [
    (np.array([0, 3, 2, 5]), ValueError, "cu_seqlens"),
    (np.array([1, 5]), ValueError, "cu_seqlens"),
    (np.array([0, 4]), ValueError, "cu_seqlens"),
    (np.array([0.0, 5.0]), TypeError, "cu_seqlens"),
    (np.array([[0, 5]]), ValueError, "cu_seqlens"),
])
def test_packed_refusals(cu, error, pattern):
    kw = make_problem("delta_rule", 1, 2, 5, 3, 2, initial=False)
    with pytest.raises(error, match=pattern):
        F.delta_rule(**kw, cu_seqlens=cu)
    with pytest.raises(ValueError, match="initial_state"):
        F.delta_rule(**kw, initial_state=np.zeros((3, 2, 3, 2)), cu_seqlens=np.array([0, 5]))
    with pytest.raises(ValueError, match="q"):
        F.delta_rule(**make_problem("delta_rule", 2, 2, 5, 3, 2, initial=False),
                     cu_seqlens=np.array([0, 5]))
