"""Fused scaled-dot-product attention (kernels, F.scaled_dot_product_attention) against its
float64 twin and torch; gradients; dropout; bad input; the sinusoidal positional encoding."""

import contextlib
import math
import tracemalloc

import numpy as np
import pytest
from helpers import import_torch, tolerance
from hypothesis import example, given
from hypothesis import strategies as st

import nnkit as nk
from nnkit._ext import attention_cpu
from nnkit.functional.attention import (
    scaled_dot_product_attention,
    sinusoidal_positional_encoding,
)
from nnkit.kernels import attention as K
from nnkit.kernels.reference import attention as R

DTYPES = (np.float32, np.float64)


_TILE_NAMES = ("Q_TILE", "CAUSAL_Q_TILE", "K_TILE", "BWD_Q_TILE", "BWD_K_TILE")


@contextlib.contextmanager
def tiles(q_tile, k_tile):
    """Run the CPU kernels (forward and backward) with other tile sizes (small ones reach
    every tile boundary)."""
    before = [getattr(attention_cpu, name) for name in _TILE_NAMES]
    for name, value in zip(_TILE_NAMES, (q_tile, q_tile, k_tile, q_tile, k_tile), strict=True):
        setattr(attention_cpu, name, value)
    try:
        yield
    finally:
        for name, value in zip(_TILE_NAMES, before, strict=True):
            setattr(attention_cpu, name, value)


def _noncontiguous(x, layout):
    """The same values as a strided (every other column of a wider array) or reversed view."""
    if layout == "strided":
        wide = np.zeros(x.shape[:-1] + (2 * x.shape[-1],), x.dtype)
        wide[..., ::2] = x
        return wide[..., ::2]
    if layout == "reversed" and x.ndim >= 3:
        return np.ascontiguousarray(x[::-1])[::-1]
    return x


def _assert_close(actual, expected, dtype, factor, name=""):
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape, f"{name}: shape {actual.shape} != {expected.shape}"
    assert actual.dtype == np.dtype(dtype), f"{name}: dtype {actual.dtype}"
    np.testing.assert_allclose(actual.astype(np.float64), expected.astype(np.float64),
                               err_msg=name, **tolerance(dtype, factor))


def _check_against_twin(q, k, v, mask, causal, scale, dtype, factor, dropout_p=0.0, seed=0):
    """Forward (out, lse) and backward (of q, k, v and a float mask) of the kernels equal
    the twin's (the twin draws the dropout multipliers from its plain-NumPy hash)."""
    args = dict(attn_mask=mask, is_causal=causal, scale=scale, dropout_p=dropout_p, seed=seed)
    out, cache = K.attention_forward(q, k, v, **args)
    want, twin_cache = R.attention_forward(q, k, v, **args)
    batch = cache.batch
    L, Ev = out.shape[-2:]
    _assert_close(out, np.broadcast_to(want, batch + (L, Ev)), dtype, factor, "out")
    lse = cache.lse.reshape(batch + (L,))
    want_lse = np.broadcast_to(twin_cache.lse, batch + (L,))
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(want_lse))
    finite = np.isfinite(want_lse)
    _assert_close(lse[finite], want_lse[finite], dtype, factor, "lse")
    dout = np.random.default_rng(1).uniform(-1, 1, out.shape).astype(dtype)
    got = K.attention_backward(dout, cache)
    want_grads = R.attention_backward(dout, twin_cache)
    for name, g, w in zip(("dq", "dk", "dv", "dmask"), got, want_grads, strict=True):
        if w is None:
            assert g is None, name
        else:
            _assert_close(g, w, dtype, factor, name)


# ---- kernels against the twin -------------------------------------------------------------

@st.composite
def problems(draw):
    """q, k, v with broadcasting batch dims and a mask of any broadcastable kind."""
    dtype = draw(st.sampled_from(DTYPES))
    batch = tuple(draw(st.lists(st.integers(1, 3), max_size=3)))
    L = draw(st.integers(0, 7))
    S = draw(st.integers(0, 7))
    E = draw(st.integers(0, 5))
    Ev = draw(st.integers(0, 4))
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)

    def own_batch():  # this tensor's batch dims: a suffix of batch, some of them 1
        keep = draw(st.integers(0, len(batch)))
        dims = batch[len(batch) - keep:]
        return tuple(1 if draw(st.booleans()) else n for n in dims)

    def tensor(rows, cols):
        x = rng.uniform(-2, 2, own_batch() + (rows, cols)).astype(dtype)
        return _noncontiguous(x, draw(st.sampled_from(["c", "strided", "reversed"])))

    q, k, v = tensor(L, E), tensor(S, E), tensor(S, Ev)
    kind = draw(st.sampled_from(["none", "bool", "float", "float-inf"]))
    mask = None
    if kind != "none":
        full = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2]) + (L, S)
        keep = draw(st.integers(0, len(full)))
        shape = tuple(1 if draw(st.booleans()) else n for n in full[len(full) - keep:])
        if kind == "bool":
            mask = rng.random(shape) < 0.7
        else:
            mask = rng.uniform(-2, 2, shape).astype(dtype)
            if kind == "float-inf":
                mask[rng.random(shape) < 0.3] = -np.inf
    causal = draw(st.booleans())
    scale = draw(st.sampled_from([None, 0.5, -1.3]))
    return q, k, v, mask, causal, scale, dtype


@given(problem=problems(), q_tile=st.sampled_from([1, 2, 3, 64]),
       k_tile=st.sampled_from([1, 2, 5, 256]), dropout_p=st.sampled_from([0.0, 0.0, 0.3]),
       seed=st.integers(0, 2**63 - 1))
@example(problem=(np.ones((1, 1, 1), np.float32), np.ones((1, 1, 1), np.float32),
                  np.ones((1, 1, 1), np.float32), None, True, None, np.float32),
         q_tile=1, k_tile=1, dropout_p=0.0, seed=0)
def test_kernels_match_twin(problem, q_tile, k_tile, dropout_p, seed):
    q, k, v, mask, causal, scale, dtype = problem
    with tiles(q_tile, k_tile):
        _check_against_twin(q, k, v, mask, causal, scale, dtype, 64, dropout_p, seed)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("L,S", [(63, 129), (64, 128), (255, 513), (257, 511), (129, 1),
                                 (1, 1025), (300, 130)])
@pytest.mark.parametrize("causal", [False, True])
def test_tile_boundaries_at_default_tiles(dtype, L, S, causal):
    """Lengths on either side of the default tile sizes, a (1, L, S) float mask, E != Ev."""
    rng = np.random.default_rng(L * 1000 + S)
    q = rng.standard_normal((2, 3, L, 16)).astype(dtype)
    k = rng.standard_normal((2, 3, S, 16)).astype(dtype)
    v = rng.standard_normal((2, 1, S, 8)).astype(dtype)
    mask = rng.uniform(-1, 1, (3, L, S)).astype(dtype)
    _check_against_twin(q, k, v, mask, causal, None, dtype, factor=256)


def test_rows_without_any_key_give_zeros_and_zero_gradients():
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((2, n, 4)) for n in (3, 5, 5))
    mask = np.ones((3, 5), bool)
    mask[1] = False
    out, cache = K.attention_forward(q, k, v, attn_mask=mask)
    np.testing.assert_array_equal(out[:, 1], 0.0)
    assert np.isneginf(cache.lse[..., 1]).all()
    dq, _, _, dmask = K.attention_backward(np.ones_like(out), cache)
    np.testing.assert_array_equal(dq[:, 1], 0.0)
    assert dmask is None  # a bool mask has none
    _check_against_twin(q, k, v, mask, True, None, np.float64, 64)


def test_empty_key_sequence_gives_zeros():
    q = np.ones((2, 3, 4))
    out, cache = K.attention_forward(q, np.ones((2, 0, 4)), np.ones((2, 0, 6)))
    assert out.shape == (2, 3, 6) and not out.any()
    dq, dk, dv, dmask = K.attention_backward(np.ones_like(out), cache)
    assert dq.shape == q.shape and not dq.any() and dk.shape == (2, 0, 4) and dmask is None


@pytest.mark.parametrize("causal", [False, True])
def test_parallel_build_equals_serial_build(causal):
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((2, 3, n, 8)).astype(np.float32) for n in (70, 90, 90))
    mask = np.broadcast_to(rng.standard_normal((1, 1, 70, 90)).astype(np.float32),
                           (2, 3, 70, 90))
    outs = []
    for build in (attention_cpu.forward_tasks.serial, attention_cpu.forward_tasks.parallel):
        out, lse = np.empty((2, 3, 70, 8), np.float32), np.empty((2, 3, 70), np.float32)
        build(q, k, v, mask, True, causal, 0.3, 0.1, np.int64(5), out, lse, 16, 32)
        outs.append((out, lse))
    np.testing.assert_array_equal(outs[0][0], outs[1][0])
    np.testing.assert_array_equal(outs[0][1], outs[1][1])
    out, lse = outs[0]
    dout = rng.standard_normal(out.shape).astype(np.float32)
    delta = np.einsum("bhle,bhle->bhl", dout.astype(np.float64), out.astype(np.float64))
    grads = []
    for build in (attention_cpu.backward_tasks.serial, attention_cpu.backward_tasks.parallel):
        dq = np.zeros((3, 2, 3, 70, 8), np.float32)
        dk, dv = np.empty_like(k), np.empty_like(v)
        build(q, k, v, mask, True, causal, 0.3, 0.1, np.int64(5), lse, dout, delta, dq, dk, dv,
              16, 32)
        grads.append((dq, dk, dv))
    for a, b in zip(*grads, strict=True):
        np.testing.assert_array_equal(a, b)


def test_backward_key_chunks_cover_every_key_tile():
    """1, 2 and more key chunks per (batch, head) give the same gradients."""
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((1, 1, n, 4)) for n in (20, 37, 37))
    out, cache = K.attention_forward(q, k, v, is_causal=True)
    dout = rng.standard_normal(out.shape)
    want = R.attention_backward(dout, R.attention_forward(q, k, v, is_causal=True)[1])[:3]
    for chunks in (1, 2, 5):
        with tiles(4, 3), _patched(attention_cpu, "backward_chunks", lambda *a, n=chunks: n):
            got = K.attention_backward(dout, cache)[:3]
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)


def test_backward_gives_only_what_needs_asks_for():
    """``needs`` over (query, key, value, attn_mask): None where not asked; the mask's only
    for a float mask; what is given equals the full backward's."""
    rng = np.random.default_rng(14)
    q, k, v = (rng.standard_normal(s) for s in ((2, 3, 4), (2, 5, 4), (2, 5, 3)))
    dout = rng.standard_normal((2, 3, 3))
    for mask in (rng.standard_normal((3, 5)), rng.random((3, 5)) < 0.7, None):
        _, cache = K.attention_forward(q, k, v, attn_mask=mask)
        every = K.attention_backward(dout, cache)
        float_mask = mask is not None and mask.dtype != bool
        assert (every[3] is not None) == float_mask
        if float_mask:
            assert every[3].shape == mask.shape
        for needs in ((True, False, False, False), (False, True, True, False),
                      (False, False, False, True)):
            got = K.attention_backward(dout, cache, needs)
            for need, g, want in zip(needs, got, every, strict=True):
                if need and want is not None:
                    np.testing.assert_array_equal(g, want)
                else:
                    assert g is None
    with pytest.raises(ValueError, match="needs must say .* 4 bools, got 3"):
        K.attention_backward(dout, cache, (True, True, True))


@contextlib.contextmanager
def _patched(module, name, value):
    before = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, before)


def test_mask_is_never_expanded_to_the_score_shape():
    """A (B, 1, 1, S) key-padding bool mask reaches the kernel as a zero-stride view."""
    rng = np.random.default_rng(5)
    q = rng.standard_normal((4, 2, 6, 3))
    mask = rng.random((4, 1, 1, 7)) < 0.8
    _, cache = K.attention_forward(q, rng.standard_normal((4, 2, 7, 3)),
                                   rng.standard_normal((4, 2, 7, 3)), attn_mask=mask)
    assert cache.mask.shape == (4, 2, 6, 7)
    assert cache.mask.strides[1] == 0 and cache.mask.strides[2] == 0
    assert cache.mask.base is not None and cache.mask.base.size <= 4 * 7


def test_mask_varying_along_unfoldable_leading_axes():
    """batch (2, 3, 4) with a (3, 1, L, S) mask: B = 6 cannot be one stride of the view."""
    rng = np.random.default_rng(6)
    q, k, v = (rng.standard_normal((2, 3, 4, n, 3)) for n in (5, 6, 6))
    mask = rng.standard_normal((3, 1, 5, 6))
    _check_against_twin(q, k, v, mask, False, None, np.float64, 64)


# ---- dropout ------------------------------------------------------------------------------

def test_dropout_hash_matches_its_plain_python_twin():
    for p in (0.1, 0.5):
        np.testing.assert_array_equal(attention_cpu.dropout_multipliers(99, p, (2, 3, 4, 5)),
                                      R.dropout_multipliers(99, p, (2, 3, 4, 5)))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
def test_dropout_forward_and_backward_match_twin_with_its_mask(dtype, causal):
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((2, 3, n, 5)).astype(dtype) for n in (9, 11, 11))
    mask = rng.standard_normal((3, 9, 11)).astype(dtype)  # its gradient regenerates z too
    args = dict(attn_mask=mask, is_causal=causal, dropout_p=0.3, seed=1234)
    with tiles(4, 3):
        out, cache = K.attention_forward(q, k, v, **args)
        dout = rng.standard_normal(out.shape).astype(dtype)
        got = K.attention_backward(dout, cache)
    want, twin_cache = R.attention_forward(q, k, v, **args)
    np.testing.assert_array_equal(twin_cache.z, R.dropout_multipliers(1234, 0.3, (2, 3, 9, 11)))
    _assert_close(out, want, dtype, 64, "out")
    want_grads = R.attention_backward(dout, twin_cache)
    for name, g, w in zip(("dq", "dk", "dv", "dmask"), got, want_grads, strict=True):
        _assert_close(g, w, dtype, 64, name)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_dropout_keep_rate(p):
    """Uniform attention (q = 0) over S keys of value 1: out = kept / (S (1 - p)), whose
    mean over many rows is 1 (binomial, within 5 standard errors)."""
    S, rows = 64, 4096
    q = np.zeros((1, rows, 4))
    k = np.zeros((1, S, 4))
    v = np.ones((1, S, 1))
    out, _ = K.attention_forward(q, k, v, dropout_p=p, seed=11)
    kept = out[..., 0] * S * (1 - p)  # kept keys per row
    np.testing.assert_allclose(kept, np.round(kept), atol=1e-9)
    n = S * rows
    rate = kept.sum() / n
    assert abs(rate - (1 - p)) < 5 * math.sqrt(p * (1 - p) / n)
    assert abs(out.mean() - 1.0) < 5 * math.sqrt(p / (1 - p) / n)


def test_dropout_seeds_come_from_nnkit_generator():
    rng = np.random.default_rng(8)
    q, k, v = (rng.standard_normal((2, 6, 4)) for _ in range(3))
    nk.manual_seed(21)
    a = scaled_dot_product_attention(q, k, v, dropout_p=0.5).numpy()
    nk.manual_seed(21)
    b = scaled_dot_product_attention(q, k, v, dropout_p=0.5).numpy()
    c = scaled_dot_product_attention(q, k, v, dropout_p=0.5).numpy()
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


# ---- autograd -----------------------------------------------------------------------------

GRAD_CASES = {
    "plain": dict(shapes=((2, 3, 4), (2, 5, 4), (2, 5, 3))),
    "causal L > S": dict(shapes=((1, 6, 3), (1, 4, 3), (1, 4, 2)), is_causal=True),
    "broadcast batch": dict(shapes=((2, 2, 3, 4), (2, 1, 5, 4), (5, 2))),
    "bool mask": dict(shapes=((2, 3, 4), (2, 5, 4), (2, 5, 3)), mask="bool"),
    "float mask + causal": dict(shapes=((3, 4), (4, 4), (4, 2)), mask="float",
                                is_causal=True),
    "scale": dict(shapes=((1, 4, 2), (1, 1, 2), (1, 1, 3)), scale=0.7),
}


@pytest.mark.parametrize("case", list(GRAD_CASES))
def test_gradcheck(case):
    spec = GRAD_CASES[case]
    rng = np.random.default_rng(9)
    q, k, v = (rng.standard_normal(s) for s in spec["shapes"])
    L, S = q.shape[-2], k.shape[-2]
    mask = None
    if spec.get("mask") == "bool":
        mask = rng.random((L, S)) < 0.7
        mask[:, 0] = True
    elif spec.get("mask") == "float":
        mask = rng.standard_normal((L, S))

    def fn(q, k, v):
        return scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                            is_causal=spec.get("is_causal", False),
                                            scale=spec.get("scale"))

    assert nk.gradcheck(fn, [q, k, v])


def test_gradcheck_float_mask_requiring_grad():
    rng = np.random.default_rng(10)
    q, k, v = (rng.standard_normal(s) for s in ((2, 3, 3, 4), (2, 3, 5, 4), (2, 3, 5, 2)))
    for shape in ((3, 5), (2, 1, 3, 5), (3, 1, 5), (1, 1)):
        mask = rng.standard_normal(shape)
        assert nk.gradcheck(lambda q, k, v, m: scaled_dot_product_attention(
            q, k, v, attn_mask=m, is_causal=True), [q, k, v, mask])


def test_gradcheck_with_dropout_and_a_fixed_seed():
    rng = np.random.default_rng(11)
    q, k, v = (rng.standard_normal(s) for s in ((2, 4, 3), (2, 5, 3), (2, 5, 2)))
    mask = rng.standard_normal((2, 4, 5))

    def fn(q, k, v, mask):
        nk.manual_seed(5)  # the same dropout mask at every evaluation
        return scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.4)

    assert nk.gradcheck(fn, [q, k, v, mask])


# ---- torch --------------------------------------------------------------------------------

TORCH_CASES = {
    "plain": dict(shapes=((2, 3, 7, 8), (2, 3, 9, 8), (2, 3, 9, 5))),
    "causal": dict(shapes=((2, 3, 70, 8), (2, 3, 300, 8), (2, 3, 300, 8)), is_causal=True),
    "bool mask, broadcast": dict(shapes=((4, 2, 9, 8), (1, 2, 11, 8), (1, 2, 11, 8)),
                                 mask=("bool", (4, 1, 1, 11))),
    "float mask": dict(shapes=((2, 5, 8), (2, 6, 8), (2, 6, 3)), mask=("float", (5, 6)),
                       scale=0.2),
    "no batch": dict(shapes=((5, 4), (6, 4), (6, 4))),
    "fully masked rows": dict(shapes=((1, 2, 4, 8), (1, 2, 3, 8), (1, 2, 3, 8)),
                              mask=("bool-empty-row", (4, 3))),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", list(TORCH_CASES))
def test_matches_torch(case, dtype):
    torch = import_torch()
    spec = TORCH_CASES[case]
    rng = np.random.default_rng(12)
    arrays = [rng.standard_normal(s).astype(dtype) for s in spec["shapes"]]
    mask = None
    if "mask" in spec:
        kind, shape = spec["mask"]
        mask = rng.random(shape) < 0.7 if kind.startswith("bool") else rng.standard_normal(
            shape).astype(dtype)
        if kind == "bool-empty-row":
            mask[2] = False
    opts = dict(is_causal=spec.get("is_causal", False), scale=spec.get("scale"))
    ours = [nk.tensor(a, requires_grad=True) for a in arrays]
    out = scaled_dot_product_attention(*ours, attn_mask=mask, **opts)
    theirs = [torch.tensor(a, requires_grad=True) for a in arrays]
    t_out = torch.nn.functional.scaled_dot_product_attention(
        *theirs, attn_mask=None if mask is None else torch.tensor(mask), **opts)
    upstream = rng.standard_normal(out.shape).astype(dtype)
    (out * nk.tensor(upstream)).sum().backward()
    (t_out * torch.tensor(upstream)).sum().backward()
    tol = dict(rtol=2e-5, atol=2e-5) if dtype == np.float32 else dict(rtol=1e-11, atol=1e-11)
    np.testing.assert_allclose(out.numpy(), t_out.detach().numpy(), **tol)
    for name, a, b in zip("qkv", ours, theirs, strict=True):
        np.testing.assert_allclose(a.grad, b.grad.numpy(), err_msg=name, **tol)


# ---- memory -------------------------------------------------------------------------------

def test_forward_backward_memory_is_linear_in_T():
    """T = 4096: the (T, T) scores would be 64 MiB; NumPy's peak stays O(T d)."""
    T, d = 4096, 16
    rng = np.random.default_rng(13)
    q, k, v = (rng.standard_normal((1, 1, T, d)).astype(np.float32) for _ in range(3))
    for _ in range(2):  # the first run may compile; the second is measured
        tracemalloc.start()
        out, cache = K.attention_forward(q, k, v, is_causal=True)
        K.attention_backward(np.ones_like(out), cache)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert peak < 64 * T * d * 4, peak  # 64 arrays of (T, d): far below T^2 * 4 = 64 MiB


# ---- bad input ----------------------------------------------------------------------------

def test_bad_input_messages():
    q, k, v = np.zeros((2, 3, 4)), np.zeros((2, 5, 4)), np.zeros((2, 5, 6))
    sdpa = scaled_dot_product_attention
    with pytest.raises(ValueError, match=r"same embedding size E.*\(2, 5, 3\)"):
        sdpa(q, np.zeros((2, 5, 3)), v)
    with pytest.raises(ValueError, match=r"same length S.*\(2, 4, 6\)"):
        sdpa(q, k, np.zeros((2, 4, 6)))
    with pytest.raises(ValueError, match=r"batch dimensions .* do not broadcast"):
        sdpa(np.zeros((3, 3, 4)), k, v)
    with pytest.raises(ValueError, match=r"attn_mask of shape \(2, 2, 3, 5\) does not "
                                         r"broadcast to .*\(2, 3, 5\)"):
        sdpa(q, k, v, attn_mask=np.ones((2, 2, 3, 5), bool))
    with pytest.raises(ValueError, match=r"attn_mask of shape \(3, 4\)"):
        sdpa(q, k, v, attn_mask=np.ones((3, 4), bool))
    with pytest.raises(TypeError, match="attn_mask must be bool .* got int64"):
        sdpa(q, k, v, attn_mask=np.ones((3, 5), np.int64))
    with pytest.raises(TypeError, match="attn_mask must be bool .* float64.* got float32"):
        sdpa(q, k, v, attn_mask=np.ones((3, 5), np.float32))
    with pytest.raises(TypeError, match="one dtype, got float64, float32 and float64"):
        sdpa(q, k.astype(np.float32), v)
    with pytest.raises(TypeError, match="query must have dtype float32 or float64, got int64"):
        sdpa(q.astype(np.int64), k, v)
    with pytest.raises(ValueError, match="query must have at least 2 dimension"):
        sdpa(np.zeros(4), k, v)
    with pytest.raises(ValueError, match="dropout_p must be < 1.0"):
        sdpa(q, k, v, dropout_p=1.0)
    with pytest.raises(TypeError, match="is_causal must be a bool"):
        sdpa(q, k, v, is_causal=1)
    with pytest.raises(ValueError, match="scale must be finite"):
        sdpa(q, k, v, scale=float("nan"))
    out, cache = K.attention_forward(q, k, v)
    with pytest.raises(ValueError, match=r"dout must have the output's shape \(2, 3, 6\)"):
        K.attention_backward(np.zeros((2, 3, 5)), cache)


_anything = st.one_of(
    st.none(), st.integers(-3, 3), st.floats(allow_nan=True), st.text(max_size=3),
    st.lists(st.floats(-2, 2), max_size=4),
    st.builds(lambda s, d: np.zeros(s, d),
              st.lists(st.integers(0, 3), min_size=0, max_size=4).map(tuple),
              st.sampled_from((np.float32, np.float64, np.complex64, np.int32, np.bool_))),
)


@given(q=_anything, k=_anything, v=_anything, mask=_anything,
       dropout_p=st.one_of(st.just(0.0), _anything), is_causal=st.one_of(st.booleans(), _anything),
       scale=_anything)
def test_boundary_fuzz_only_value_or_type_errors(q, k, v, mask, dropout_p, is_causal, scale):
    try:
        scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p,
                                     is_causal=is_causal, scale=scale)
    except (ValueError, TypeError):
        pass


# ---- the claims of notes §6 about attention ---------------------------------------------------

def test_section_6_self_attention_is_permutation_equivariant_until_positions_are_added(rng):
    """Notes §6.3: "the attention mechanism is permutation equivariant". Permuting the tokens of
    nn.MultiheadAttention's input permutes its output rows and its weights' rows and columns
    the same way; after adding the sinusoidal positional encoding P (X + P) it no longer does."""
    mha = nk.nn.MultiheadAttention(12, 3, batch_first=True, dtype=np.float64)
    x = rng.standard_normal((2, 7, 12))
    perm = rng.permutation(7)
    out, weights = (t.numpy() for t in mha(x, x, x))
    out_p, weights_p = (t.numpy() for t in mha(x[:, perm], x[:, perm], x[:, perm]))
    np.testing.assert_allclose(out_p, out[:, perm], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(weights_p, weights[:, perm][:, :, perm], rtol=1e-12, atol=1e-14)
    pe = sinusoidal_positional_encoding(7, 12, dtype=np.float64).numpy()
    xp, xp_perm = x + pe, x[:, perm] + pe
    out_pe = mha(xp, xp, xp)[0].numpy()
    out_pe_perm = mha(xp_perm, xp_perm, xp_perm)[0].numpy()
    assert np.abs(out_pe_perm - out_pe[:, perm]).max() > 1e-3


@pytest.mark.parametrize("d", [4, 16, 64])
def test_section_6_2_dot_product_variance_is_d_and_the_scale_restores_one(d):
    """Notes §6.2: Var[x . y] = d for x, y ~ N(0, I_d), hence the division by sqrt(d_k).
    Sampled directly, and through nnkit's fused attention: with one query and two keys the
    log-ratio of the two weights is (q . k_1 - q . k_0) * scale, whose variance is 2 for the
    default scale 1/sqrt(d) (2 d without it). 100,000 seeded samples: the relative standard
    error of a sample variance here is below 1%, the tolerance 4%."""
    n = 100_000
    rng = np.random.default_rng(d)
    q = rng.standard_normal((n, 1, d))
    k = rng.standard_normal((n, 2, d))
    dots = (q * k[:, :1]).sum(-1).ravel()
    assert abs(dots.var() / d - 1) < 0.04
    weights = scaled_dot_product_attention(q, k, np.broadcast_to(np.eye(2), (n, 2, 2)))
    weights = weights.numpy()[:, 0]  # (n, 2): value = I makes the output the weights
    log_ratio = np.log(weights[:, 1] / weights[:, 0])
    np.testing.assert_allclose(log_ratio, (q[:, 0] * (k[:, 1] - k[:, 0])).sum(-1) / math.sqrt(d),
                               rtol=1e-9, atol=1e-9)
    assert abs(log_ratio.var() / 2 - 1) < 0.04


# ---- positional encoding --------------------------------------------------------------------

@pytest.mark.parametrize("d", [1, 2, 5, 8, 9])
def test_positional_encoding_values(d):
    T, base = 7, 100.0
    enc = sinusoidal_positional_encoding(T, d, base=base, dtype=np.float64).numpy()
    assert enc.shape == (T, d)
    for t in range(T):
        for col in range(d):
            i = col // 2
            angle = t / base ** (2 * i / d)
            want = math.sin(angle) if col % 2 == 0 else math.cos(angle)
            assert enc[t, col] == pytest.approx(want, abs=1e-14)


def test_positional_encoding_properties():
    T, d = 50, 16
    enc = sinusoidal_positional_encoding(T, d, dtype=np.float64).numpy()
    assert sinusoidal_positional_encoding(T, d).dtype == np.float32
    np.testing.assert_array_equal(enc[0], np.tile([0.0, 1.0], d // 2))  # t = 0
    np.testing.assert_allclose(enc[:, 0::2] ** 2 + enc[:, 1::2] ** 2, 1.0, atol=1e-14)
    # the first pair has frequency 1; the frequencies fall geometrically from there
    np.testing.assert_allclose(enc[:, 0], np.sin(np.arange(T)), atol=1e-14)
    # a shift by k positions is one fixed rotation per pair, whatever t
    k = 3
    freqs = 10000.0 ** (-np.arange(0, d, 2) / d)
    c, s = np.cos(k * freqs), np.sin(k * freqs)
    sin_t, cos_t = enc[:-k, 0::2], enc[:-k, 1::2]
    np.testing.assert_allclose(enc[k:, 0::2], sin_t * c + cos_t * s, atol=1e-12)
    np.testing.assert_allclose(enc[k:, 1::2], cos_t * c - sin_t * s, atol=1e-12)
    # distinct positions get distinct codes
    dist = np.linalg.norm(enc[:, None] - enc[None], axis=-1)
    assert (dist + np.eye(T) > 1e-3).all()


def test_positional_encoding_edges_and_errors():
    assert sinusoidal_positional_encoding(0, 4).shape == (0, 4)
    assert sinusoidal_positional_encoding(3, 0).shape == (3, 0)
    assert not sinusoidal_positional_encoding(3, 4).requires_grad
    with pytest.raises(ValueError, match="T must be >= 0"):
        sinusoidal_positional_encoding(-1, 4)
    with pytest.raises(TypeError, match="d must be an integer"):
        sinusoidal_positional_encoding(3, 2.5)
    with pytest.raises(ValueError, match="base must be > 0"):
        sinusoidal_positional_encoding(3, 4, base=0.0)
    with pytest.raises(TypeError, match="dtype must be float32 or float64"):
        sinusoidal_positional_encoding(3, 4, dtype=np.int32)


def test_nan_propagates():
    q, k, v = np.zeros((1, 2, 3)), np.zeros((1, 4, 3)), np.ones((1, 4, 2))
    k[0, 1, 0] = np.nan
    out, _ = K.attention_forward(q, k, v)
    assert np.isnan(out).all()
