"""Fused attention on the GPU (``nnkit._ext.attention_cuda``): kernels vs a float64 twin.

- the twin (``_twin``: softmax(Q K^T scale + mask) V, its gradients, straight from the
  formulas) is itself checked: central differences, and ``kernels.reference.attention``;
- the launch configuration chooser (``_tiles``) fits shared memory and divides the tiles;
- the CUDA kernels under Numba's simulator, in a child process (this file runs itself as a
  script with NUMBA_ENABLE_CUDASIM=1): tiles of 4 or 8 rows/keys with 2 x 2 or 2 x 4 threads,
  so shapes up to 9 cross tile edges; L != S, L or S = 1, E != Ev, E = 0, causal, additive
  masks as zero-stride broadcast views with -inf and fully masked rows, dropout (the mask
  equals ``attention_cpu.dropout_multipliers``: one hash on both backends), empty sizes;
- ``cuda``-marked tests on a real GPU with CuPy (skipped elsewhere): realistic shapes, both
  dtypes, masks, causal, dropout, against the twin, torch's CUDA SDPA and the CPU kernels;
  memory stays O(L E) at L = 16384; repeated runs are bitwise equal.
"""

import sys

import numpy as np
import pytest
from helpers import run_simulator_cases, simulator_outcomes

# ---- the float64 twin -------------------------------------------------------------------------


def _twin(q, k, v, mask=None, causal=False, scale=None, z=None, dout=None):
    """out, lse (and dq, dk, dv when ``dout`` is given) of attention in float64.

    q (B, H, L, E), k (B, H, S, E), v (B, H, S, Ev), mask additive, broadcastable to
    (B, H, L, S); z the dropout multipliers (B, H, L, S) or None. Rows with no key get
    out = 0, lse = -inf and zero gradients.
    """
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    L, E, S = q.shape[2], q.shape[3], k.shape[2]
    scale = 1 / np.sqrt(E) if scale is None else scale
    s = scale * np.einsum("bhle,bhse->bhls", q, k)  # (B, H, L, S)
    if mask is not None:
        s = s + np.asarray(mask, np.float64)
    if causal:
        s = np.where(np.tril(np.ones((L, S), bool)), s, -np.inf)
    m = s.max(axis=-1, keepdims=True) if S else np.full(s.shape[:3] + (1,), -np.inf)
    live = np.isfinite(m)
    e = np.where(np.isfinite(s), np.exp(s - np.where(live, m, 0)), 0.0)
    l = e.sum(axis=-1, keepdims=True)  # noqa: E741
    p = np.divide(e, l, out=np.zeros_like(e), where=l > 0)
    with np.errstate(divide="ignore"):
        lse = np.where(l[..., 0] > 0, m[..., 0] + np.log(l[..., 0]), -np.inf)
    z = np.ones_like(p) if z is None else np.asarray(z, np.float64)
    out = np.einsum("bhls,bhsv->bhlv", p * z, v)
    if dout is None:
        return out, lse
    dout = np.asarray(dout, np.float64)
    dpz = np.einsum("bhlv,bhsv->bhls", dout, v)  # d loss / d (P o Z)
    dv = np.einsum("bhls,bhlv->bhsv", p * z, dout)
    dp = dpz * z
    ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True))  # softmax backward
    dq = scale * np.einsum("bhls,bhse->bhle", ds, k)
    dk = scale * np.einsum("bhls,bhle->bhse", ds, q)
    return out, lse, dq, dk, dv


def _problem(seed, B, H, L, S, E, Ev, dtype):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, H, L, E)).astype(dtype)
    k = rng.standard_normal((B, H, S, E)).astype(dtype)
    v = rng.standard_normal((B, H, S, Ev)).astype(dtype)
    dout = rng.standard_normal((B, H, L, Ev)).astype(dtype)
    return q, k, v, dout


def _masks(seed, B, H, L, S, dtype, xp=np):
    """Additive masks as zero-stride views of (B, H, L, S) (``xp.broadcast_to`` of small
    bases, on the device for ``xp`` = cupy): a float (1, H, L, S) bias with -inf holes, a
    (B, 1, 1, S) key-padding mask, and a (1, 1, L, S) mask with one row fully masked."""
    rng = np.random.default_rng(seed)
    bias = rng.standard_normal((1, H, L, S))
    bias[rng.random(bias.shape) < 0.25] = -np.inf
    pad = np.zeros((B, 1, 1, S))
    pad[..., S // 2:] = -np.inf
    pad[0, ..., :] = 0.0  # batch 0 keeps every key
    dead = np.zeros((1, 1, L, S))
    if L:
        dead[0, 0, L // 2] = -np.inf
    return {name: xp.broadcast_to(xp.asarray(m.astype(dtype)), (B, H, L, S))
            for name, m in (("bias", bias), ("padding", pad), ("dead_row", dead))}


def _check(name, got, want, tol):
    """Assert max |got - want| <= tol * max(1, max |want|), naming the array and the error;
    -inf entries (lse of empty rows) must match exactly."""
    got = np.asarray(got, np.float64)
    want = np.asarray(want, np.float64)
    assert got.shape == want.shape, f"{name}: shape {got.shape} != {want.shape}"
    inf_w, inf_g = np.isneginf(want), np.isneginf(got)
    assert np.array_equal(inf_g, inf_w), f"{name}: -inf entries differ"
    g, w = got[~inf_w], want[~inf_w]
    if w.size == 0:
        return
    assert np.all(np.isfinite(g)), f"{name}: non-finite values {g[~np.isfinite(g)][:5]}"
    err = float(np.max(np.abs(g - w)))
    bound = tol * max(1.0, float(np.max(np.abs(w))))
    assert err <= bound, f"{name}: max abs error {err:.3e} > {bound:.3e} (max |want| " \
                         f"{float(np.max(np.abs(w))):.3e})"


# ---- the twin against finite differences (parent process, NumPy only) -----------------------


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("with_mask", [False, True])
@pytest.mark.parametrize("dropout", [False, True])
def test_twin_gradients_match_central_differences(causal, with_mask, dropout):
    B, H, L, S, E, Ev = 1, 2, 4, 5, 3, 2
    q, k, v, dout = _problem(1, B, H, L, S, E, Ev, np.float64)
    mask = _masks(2, B, H, L, S, np.float64)["bias"] if with_mask else None
    z = (np.random.default_rng(3).random((B, H, L, S)) >= 0.3) / 0.7 if dropout else None
    grads = _twin(q, k, v, mask, causal, 0.7, z, dout)[2:]
    h = 1e-6
    for name, x, g in zip("qkv", (q, k, v), grads, strict=True):
        num = np.zeros_like(x)
        for idx in np.ndindex(x.shape):
            old = x[idx]
            x[idx] = old + h
            up = np.sum(_twin(q, k, v, mask, causal, 0.7, z)[0] * dout)
            x[idx] = old - h
            down = np.sum(_twin(q, k, v, mask, causal, 0.7, z)[0] * dout)
            x[idx] = old
            num[idx] = (up - down) / (2 * h)
        np.testing.assert_allclose(g, num, rtol=1e-6, atol=1e-8, err_msg=f"d{name}")


def test_twin_fully_masked_row_is_zero_like_torch():
    q, k, v, dout = _problem(4, 1, 1, 3, 4, 2, 2, np.float64)
    mask = np.zeros((1, 1, 3, 4))
    mask[0, 0, 1] = -np.inf
    out, lse, dq, dk, dv = _twin(q, k, v, mask, dout=dout)
    assert np.all(out[0, 0, 1] == 0) and lse[0, 0, 1] == -np.inf and np.all(dq[0, 0, 1] == 0)
    assert np.all(np.isfinite(out)) and np.all(np.isfinite(dk)) and np.all(np.isfinite(dv))


def test_twin_matches_reference_attention():
    from nnkit.kernels.reference import attention as R
    q, k, v, _ = _problem(5, 2, 1, 5, 6, 3, 4, np.float64)
    mask = _masks(6, 2, 1, 5, 6, np.float64)["bias"]
    for causal in (False, True):
        out, cache = R.attention_forward(q, k, v, attn_mask=mask, is_causal=causal, scale=0.5)
        got = _twin(q, k, v, mask, causal, 0.5)
        _check("out", got[0], out, 1e-12)
        _check("lse", got[1], cache.lse, 1e-12)


# ---- launch configuration (pure Python) -------------------------------------------------------


@pytest.mark.parametrize("itemsize, E, Ev", [
    (i, E, Ev) for i in (4, 8) for E, Ev in ((1, 1), (16, 16), (33, 7), (64, 64), (80, 128),
                                            (128, 128), (128, 1), (1, 128))
] + [(4, 256, 200), (4, 256, 256), (4, 1, 256)])
def test_tiles_fit_shared_memory_and_divide(itemsize, E, Ev):
    from nnkit._ext import attention_cuda as C

    for kind in ("forward", "dkv", "dq"):
        BM, BN, TY, TX, EP, EVP = C._tiles(kind, itemsize, E, Ev)
        assert EP >= E and EVP >= Ev and EP % TX == 0 and EVP % TX == 0, (kind, EP, EVP, TX)
        assert 32 % TX == 0 and TY * TX <= 1024
        rows, cols = (BN, BM) if kind == "dkv" else (BM, BN)  # split by TY, by TX
        assert rows % TY == 0 and cols % TX == 0, (kind, BM, BN, TY, TX)
        assert C._shared_bytes(kind, itemsize, BM, BN, TX, EP, EVP) <= C.SHARED_BYTES


def test_cpu_and_cuda_modules_expose_the_same_launchers():
    """``kernels_for`` picks the module; the calls are the same on both devices."""
    from nnkit._ext import attention_cpu
    from nnkit._ext import attention_cuda as C

    for name in ("attention_forward", "attention_backward", "fill_dropout_multipliers"):
        assert callable(getattr(attention_cpu, name)) and callable(getattr(C, name))


def test_tiles_refuse_head_dims_too_large():
    from nnkit._ext import attention_cuda as C

    with pytest.raises(ValueError, match="E=600, Ev=64 are too large"):
        C._tiles("forward", 8, 600, 64)
    with pytest.raises(ValueError, match="E=256, Ev=256 .* in 64-bit floats"):
        C._tiles("dkv", 8, 256, 256)
    with pytest.raises(ValueError, match="256 fits in float32"):
        C._tiles("dkv", 4, 512, 512)


def test_dropout_hash_is_the_cpu_kernels_stream():
    """The CUDA and the CPU kernels draw from the same SplitMix64 functions (simd_math: the
    device functions are compiled from the CPU functions' plain-Python bodies), whose
    stream is the plain-NumPy one of the twins (``nnkit._random.splitmix64``)."""
    from nnkit import _random
    from nnkit._ext import attention_cuda, simd_math

    assert attention_cuda.splitmix64_dev is simd_math.splitmix64_dev
    # the kernels test uniform53(z) < p as (z >> 11) < ceil(p 2**53): the same decisions,
    # also at the draws next to the threshold
    for p in (0.0, 0.1, 0.3, 0.5, 1 / 3, 0.9, 1 - 2.0**-53, 2.0**-60):
        _, below, _, _ = attention_cuda._scalars(np.float32, 1.0, p, 0)
        near = {int(below) - 1, int(below), int(below) + 1}
        for n in ({0, 1, 2**53 - 1} | near) - {-1, 2**53}:
            z = np.uint64(n) << np.uint64(11)
            assert (simd_math.uniform53(z) < p) == (np.uint64(n) < below), (p, n)
    for seed, n in ((0, 0), (12345, 77), (-3, 10**9), (2**40, 5)):
        seed = attention_cuda._seed(seed)
        with np.errstate(over="ignore"):
            got = simd_math.uniform53(np.uint64(simd_math.splitmix64(seed, np.int64(n))))
            plain = simd_math._uniform53(simd_math._splitmix64(seed, np.int64(n)))
        want = _random.uniform53(_random.splitmix64(int(seed) % 2**64, n))
        assert got == plain == want, (seed, n, got, plain, want)


# ---- the CUDA kernels under Numba's simulator (child process) --------------------------------
# Each case runs the kernels on NumPy arrays (the simulator's device arrays) and compares
# them with the twin; tiles of 4 or 8 with 2 x 2 / 2 x 4 threads cross every tile edge.

SIM_TILES = ((4, 4, 2, 2), (8, 4, 2, 4))  # (block_m, block_n, threads_y, threads_x)


def _set_tiles(C, tiles):
    C.block_m, C.block_n, C.threads_y, C.threads_x = tiles


def _run_kernels(C, q, k, v, mask, causal, scale, p, seed, dout):
    """Forward then backward through ``attention_cuda``; returns out, lse, dq, dk, dv."""
    from numba import cuda

    B, H, L, _ = q.shape
    has_mask = mask is not None
    m = mask if has_mask else np.broadcast_to(np.zeros((), q.dtype), (B, H, L, k.shape[2]))
    m = cuda.In(m)  # read-only view: the simulator must not copy it back
    out = np.full((B, H, L, v.shape[3]), np.nan, q.dtype)
    lse = np.full((B, H, L), np.nan, q.dtype)
    C.attention_forward(q, k, v, m, has_mask, causal, scale, p, seed, out, lse)
    dq, dk, dv = (np.full_like(a, np.nan) for a in (q, k, v))
    C.attention_backward(q, k, v, m, has_mask, causal, scale, p, seed, out, lse, dout, dq, dk,
                         dv)
    return out, lse, dq, dk, dv


def _compare(C, shape, dtype, *, causal=False, mask=None, p=0.0, seed=0, scale=None, label=""):
    B, H, L, S, E, Ev = shape
    q, k, v, dout = _problem(hash(shape) % 1000, B, H, L, S, E, Ev, dtype)
    scale = 1 / np.sqrt(max(E, 1)) if scale is None else scale
    z = None
    if p > 0:
        from nnkit._ext.attention_cpu import dropout_multipliers

        z = dropout_multipliers(seed, p, (B, H, L, S))
    got = _run_kernels(C, q, k, v, mask, causal, scale, p, seed, dout)
    want = _twin(q, k, v, mask, causal, scale, z, dout)
    tol = 1e-11 if dtype == np.float64 else 2e-5
    for name, g, w in zip(("out", "lse", "dq", "dk", "dv"), got, want, strict=True):
        _check(f"{name} {label} {shape} {np.dtype(dtype).name} causal={causal} p={p}", g, w,
               tol)


SIM_SHAPES = [  # (B, H, L, S, E, Ev)
    (2, 2, 9, 7, 5, 3),  # L != S, neither a multiple of the tiles
    (1, 2, 4, 8, 3, 5),  # whole tiles, Ev > E
    (1, 1, 1, 9, 2, 2),  # one query
    (2, 1, 9, 1, 4, 4),  # one key
]


def _case_shapes():
    from nnkit._ext import attention_cuda as C

    for tiles in SIM_TILES:
        _set_tiles(C, tiles)
        for shape in SIM_SHAPES:
            for dtype in (np.float64, np.float32):
                _compare(C, shape, dtype, label=f"tiles={tiles}")


def _case_causal():
    from nnkit._ext import attention_cuda as C

    _set_tiles(C, SIM_TILES[0])
    for shape in ((1, 2, 9, 6, 3, 2), (1, 1, 5, 9, 2, 3), (2, 1, 8, 8, 4, 4)):
        for dtype in (np.float64, np.float32):
            _compare(C, shape, dtype, causal=True, scale=0.9)


def _case_masks():
    from nnkit._ext import attention_cuda as C

    _set_tiles(C, SIM_TILES[1])
    B, H, L, S, E, Ev = shape = (2, 2, 9, 7, 3, 2)
    for dtype in (np.float64, np.float32):
        for name, mask in _masks(7, B, H, L, S, dtype).items():
            assert 0 in mask.strides  # a broadcast view, read in place
            for causal in (False, True):
                _compare(C, shape, dtype, causal=causal, mask=mask, label=name)


def _case_dropout():
    from numba import cuda

    from nnkit._ext import attention_cuda as C
    from nnkit._ext.attention_cpu import dropout_multipliers

    _set_tiles(C, SIM_TILES[0])
    for shape, causal in (((2, 2, 9, 7, 3, 2), False), ((1, 2, 6, 9, 2, 3), True)):
        _compare(C, shape, np.float64, causal=causal, p=0.3, seed=1234, label="dropout")
    # with q = 0 every weight is 1/S, and V = identity reads the dropout multipliers back
    B, H, L, S = 2, 1, 6, 5
    q, k = np.zeros((B, H, L, 2)), np.ones((B, H, S, 2))
    v = np.broadcast_to(np.eye(S), (B, H, S, S)).copy()
    out = np.empty((B, H, L, S))
    lse = np.empty((B, H, L))
    dummy = cuda.In(np.broadcast_to(np.zeros(()), (B, H, L, S)))
    C.attention_forward(q, k, v, dummy, False, False, 1.0, 0.4, -99, out, lse)
    _check("dropout multipliers", out * S, dropout_multipliers(-99, 0.4, (B, H, L, S)), 1e-12)


def _case_empty_and_degenerate():
    from nnkit._ext import attention_cuda as C

    _set_tiles(C, SIM_TILES[0])
    _compare(C, (1, 2, 5, 6, 0, 3), np.float64, label="E=0")  # every score 0: mean of v
    _compare(C, (1, 1, 5, 6, 3, 0), np.float64, label="Ev=0")
    _compare(C, (1, 2, 5, 0, 3, 2), np.float64, label="S=0")  # no keys: zeros, lse -inf
    for B, H, L, S in ((0, 2, 3, 3), (1, 0, 3, 3), (1, 1, 0, 4)):
        got = _run_kernels(C, *_problem(0, B, H, L, S, 2, 2, np.float64)[:3], None, False, 1.0,
                           0.0, 0, np.zeros((B, H, L, 2)))
        assert [g.shape for g in got[:2]] == [(B, H, L, 2), (B, H, L)]
        if L == 0:  # no query: dk, dv are zero
            assert np.all(got[3] == 0) and np.all(got[4] == 0)


def _case_hypothesis():
    """Property: the kernels equal the twin over drawn sizes, masks, causal, dropout, dtypes,
    tiles and seeds (a few derandomized examples: the simulator is slow)."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from nnkit._ext import attention_cuda as C

    @settings(max_examples=12, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(dims=st.tuples(st.integers(1, 2), st.integers(1, 2), st.integers(1, 9),
                          st.integers(1, 9), st.integers(0, 5), st.integers(1, 5)),
           causal=st.booleans(), mask_kind=st.sampled_from([None, "bias", "padding", "dead_row"]),
           p=st.sampled_from([0.0, 0.25]), dtype=st.sampled_from([np.float32, np.float64]),
           tiles=st.sampled_from(SIM_TILES), seed=st.integers(-(2**63), 2**63 - 1))
    def kernels_equal_twin(dims, causal, mask_kind, p, dtype, tiles, seed):
        _set_tiles(C, tiles)
        B, H, L, S, _, _ = dims
        mask = None if mask_kind is None else _masks(seed % 97, B, H, L, S, dtype)[mask_kind]
        _compare(C, dims, dtype, causal=causal, mask=mask, p=p, seed=seed, label=mask_kind)

    kernels_equal_twin()


def _case_dropout_multipliers_and_mask_gradient():
    """``fill_dropout_multipliers`` of both backends agree, and the gradient of a float mask
    with its dropout multipliers drawn slab by slab on the device (NumPy arrays routed to
    the CUDA kernels; the fused kernels there need read-only views, ``_run_kernels``) equals
    the CPU's."""
    from nnkit import _backend
    from nnkit._ext import attention_cpu
    from nnkit._ext import attention_cuda as C
    from nnkit.kernels import attention as K

    for shape, bh0 in (((2, 3, 4, 5), 0), ((1, 1, 3, 7), 5), ((1, 2, 0, 3), 0)):
        for dtype in (np.float32, np.float64):
            got = C.fill_dropout_multipliers(-42, 0.35, np.full(shape, np.nan, dtype), bh0)
            want = attention_cpu.dropout_multipliers(-42, 0.35, shape, dtype, bh0)
            assert got.dtype == want.dtype and np.array_equal(got, want), (shape, dtype)
    rng = np.random.default_rng(16)
    q, k, v = (rng.standard_normal(s) for s in ((2, 5, 3), (2, 6, 3), (2, 6, 2)))
    mask = rng.standard_normal((1, 5, 6))
    dout = rng.standard_normal((2, 5, 2))
    _, cache = K.attention_forward(q, k, v, attn_mask=mask, is_causal=True, dropout_p=0.3,
                                   seed=9)
    want = K.attention_backward(dout, cache)[3]
    with _backend.numpy_on_gpu_route():
        got = K.attention_backward(dout, cache, (False, False, False, True))
    assert got[:3] == (None, None, None)
    assert np.array_equal(got[3], want)


def _case_default_tiles():
    """The launch configuration real GPUs get (``_tiles``: 256-thread blocks, 64-row tiles)."""
    from nnkit._ext import attention_cuda as C

    _set_tiles(C, (None, None, None, None))
    _compare(C, (1, 1, 40, 70, 32, 16), np.float32, causal=True, label="default tiles")


SIM_CASES = {"shapes": _case_shapes, "causal": _case_causal, "masks": _case_masks,
             "dropout": _case_dropout, "empty_and_degenerate": _case_empty_and_degenerate,
             "hypothesis": _case_hypothesis, "default_tiles": _case_default_tiles,
             "dropout_multipliers_and_mask_gradient":
                 _case_dropout_multipliers_and_mask_gradient}


# ---- on a real GPU (cuda marker: skipped without one) ----------------------------------------


def _gpu_run(q, k, v, mask, causal, scale, p, seed, dout):
    """attention_cuda forward + backward on CuPy copies of NumPy inputs; ``mask`` is a CuPy
    zero-stride view or None. Returns NumPy out, lse, dq, dk, dv."""
    import cupy

    from nnkit._ext import attention_cuda as C

    g = [cupy.asarray(a) for a in (q, k, v, dout)]
    B, H, L, _ = q.shape
    has_mask = mask is not None
    m = mask if has_mask else cupy.broadcast_to(cupy.zeros((), q.dtype), (B, H, L, k.shape[2]))
    out = cupy.full((B, H, L, v.shape[3]), cupy.nan, q.dtype)
    lse = cupy.full((B, H, L), cupy.nan, q.dtype)
    C.attention_forward(g[0], g[1], g[2], m, has_mask, causal, scale, p, seed, out, lse)
    grads = [cupy.full_like(a, cupy.nan) for a in g[:3]]
    C.attention_backward(*g[:3], m, has_mask, causal, scale, p, seed, out, lse, g[3], *grads)
    return [cupy.asnumpy(a) for a in (out, lse, *grads)]


GPU_TOL = {np.float32: 1e-4, np.float64: 1e-11}  # x max(1, max |want|)
GPU_SHAPES = [  # (B, H, L, S, E, Ev)
    (2, 4, 300, 300, 64, 64),
    (1, 2, 1024, 1024, 128, 128),
    (3, 2, 77, 130, 40, 24),  # L != S, odd head dims, E != Ev
    (1, 1, 1, 1000, 64, 64),  # one query, long keys
    (2, 1, 513, 1, 32, 16),  # one key
    (1, 2, 200, 190, 256, 96),  # head dim 256 (the smallest tiles; float32 only)
]


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mask_kind", [None, "bias", "padding", "dead_row"])
def test_gpu_kernels_match_twin(dtype, shape, causal, mask_kind):
    cupy = pytest.importorskip("cupy")
    B, H, L, S, E, Ev = shape
    if dtype == np.float64 and E > 128:
        from nnkit._ext import attention_cuda as C

        with pytest.raises(ValueError, match="128 in float64"):
            C._tiles("dkv", 8, E, Ev)
        return
    q, k, v, dout = _problem(sum(shape), B, H, L, S, E, Ev, dtype)
    scale = 1 / np.sqrt(E)
    mask_np = mask_gpu = None
    if mask_kind is not None:
        mask_np = _masks(1, B, H, L, S, dtype)[mask_kind]
        mask_gpu = _masks(1, B, H, L, S, dtype, xp=cupy)[mask_kind]
        assert mask_gpu.base is not None  # a broadcast view of the small base
    got = _gpu_run(q, k, v, mask_gpu, causal, scale, 0.0, 0, dout)
    want = _twin(q, k, v, mask_np, causal, scale, None, dout)
    for name, g, w in zip(("out", "lse", "dq", "dk", "dv"), got, want, strict=True):
        _check(f"{name} {shape} {np.dtype(dtype).name} causal={causal} mask={mask_kind}", g,
               w, GPU_TOL[dtype])


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_dropout_matches_twin_with_the_cpu_multipliers(dtype, causal):
    pytest.importorskip("cupy")
    from nnkit._ext.attention_cpu import dropout_multipliers

    B, H, L, S, E, Ev = shape = (2, 4, 300, 257, 64, 48)
    q, k, v, dout = _problem(9, B, H, L, S, E, Ev, dtype)
    z = dropout_multipliers(2024, 0.2, (B, H, L, S))
    keep = float(np.mean(z > 0))
    assert abs(keep - 0.8) < 0.01, f"keep rate {keep:.4f}, expected 0.8"
    got = _gpu_run(q, k, v, None, causal, 0.125, 0.2, 2024, dout)
    want = _twin(q, k, v, None, causal, 0.125, z, dout)
    for name, g, w in zip(("out", "lse", "dq", "dk", "dv"), got, want, strict=True):
        _check(f"{name} dropout {shape} {np.dtype(dtype).name} causal={causal}", g, w,
               GPU_TOL[dtype])


@pytest.mark.cuda
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("with_mask", [False, True])
def test_gpu_matches_torch_cuda_sdpa(causal, with_mask):
    cupy = pytest.importorskip("cupy")
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    import torch.nn.functional as F

    B, H, L, S, E, Ev = 2, 4, 300, 300 if causal else 333, 64, 64
    q, k, v, dout = _problem(11, B, H, L, S, E, Ev, np.float32)
    mask_np = _masks(3, B, H, L, S, np.float32)["bias"] if with_mask else None
    mask_gpu = _masks(3, B, H, L, S, np.float32, xp=cupy)["bias"] if with_mask else None
    got = _gpu_run(q, k, v, mask_gpu, causal, 1 / 8, 0.0, 0, dout)
    tq, tk, tv = (torch.tensor(a, device="cuda", requires_grad=True) for a in (q, k, v))
    attn_mask = None if mask_np is None else torch.tensor(np.ascontiguousarray(mask_np),
                                                          device="cuda")
    tout = F.scaled_dot_product_attention(tq, tk, tv, attn_mask=attn_mask, is_causal=causal)
    tout.backward(torch.tensor(dout, device="cuda"))
    for name, g, w in zip(("out", "dq", "dk", "dv"), [got[0], *got[2:]],
                          (tout, tq.grad, tk.grad, tv.grad), strict=True):
        # a semantic check (masks, causal, scale); torch's float32 kernel may use TF32
        _check(f"{name} vs torch SDPA causal={causal} mask={with_mask}", g,
               w.detach().cpu().numpy(), 2e-3)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gpu_public_boundary_matches_cpu_kernels(dtype):
    cupy = pytest.importorskip("cupy")
    from nnkit.kernels import attention as K
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 3, 70, 32)).astype(dtype)  # (..., L, E) with two batch dims
    k = rng.standard_normal((2, 3, 90, 32)).astype(dtype)
    v = rng.standard_normal((2, 3, 90, 16)).astype(dtype)
    mask = rng.random((70, 90)) < 0.8  # bool: True takes part
    dout = rng.standard_normal((2, 3, 70, 16)).astype(dtype)
    for kw in (dict(attn_mask=mask), dict(is_causal=True), dict(dropout_p=0.3, seed=5)):
        cpu, cpu_cache = K.attention_forward(q, k, v, **kw)
        gkw = dict(kw, attn_mask=cupy.asarray(mask)) if "attn_mask" in kw else kw
        gpu, gpu_cache = K.attention_forward(*(cupy.asarray(a) for a in (q, k, v)), **gkw)
        assert isinstance(gpu, cupy.ndarray), type(gpu)
        _check(f"out {kw}", cupy.asnumpy(gpu), cpu, GPU_TOL[dtype])
        for name, c, g in zip("qkv", K.attention_backward(dout, cpu_cache)[:3],
                              K.attention_backward(cupy.asarray(dout), gpu_cache)[:3],
                              strict=True):
            _check(f"d{name} {kw}", cupy.asnumpy(g), c, GPU_TOL[dtype])


@pytest.mark.cuda
def test_gpu_long_sequence_memory_is_linear_in_length():
    """L = S = 16384, E = 64: forward + backward allocate O(L) beyond inputs and outputs (the
    (L, S) matrix would be 1 GiB); rows checked against the twin on those rows."""
    cupy = pytest.importorskip("cupy")
    from nnkit._ext import attention_cuda as C

    B, H, L, E = 1, 1, 16384, 64
    q, k, v, dout = _problem(12, B, H, L, L, E, E, np.float32)
    g = [cupy.asarray(a) for a in (q, k, v, dout)]
    out, lse = cupy.empty_like(g[0]), cupy.empty((B, H, L), np.float32)
    grads = [cupy.empty_like(a) for a in g[:3]]
    dummy = cupy.broadcast_to(cupy.zeros((), np.float32), (B, H, L, L))
    pool = cupy.get_default_memory_pool()
    cupy.cuda.Device().synchronize()
    pool.free_all_blocks()  # from here on, total_bytes() grows by every new allocation
    before = pool.total_bytes()
    C.attention_forward(*g[:3], dummy, False, True, 0.125, 0.0, 0, out, lse)
    C.attention_backward(*g[:3], dummy, False, True, 0.125, 0.0, 0, out, lse, g[3], *grads)
    cupy.cuda.Device().synchronize()
    extra = pool.total_bytes() - before
    assert extra <= 16 * L, f"{extra} bytes allocated beyond inputs/outputs (L = {L})"
    rows = np.r_[0:64, 8000:8064, L - 64:L]
    # causal: the twin sees a subset of rows, so their positions enter as an additive mask
    pos_mask = np.where(np.arange(L)[None, :] <= rows[:, None], 0.0, -np.inf)
    want = _twin(q[:, :, rows], k, v, pos_mask, False, 0.125, None, dout[:, :, rows])
    _check("out rows", cupy.asnumpy(out)[:, :, rows], want[0], 1e-4)
    _check("lse rows", cupy.asnumpy(lse)[:, :, rows], want[1], 1e-4)
    _check("dq rows", cupy.asnumpy(grads[0])[:, :, rows], want[2], 1e-4)
    assert all(bool(cupy.isfinite(a).all()) for a in grads)


@pytest.mark.cuda
def test_gpu_runs_are_bitwise_reproducible_and_accept_numba_arrays():
    cupy = pytest.importorskip("cupy")
    from numba import cuda

    from nnkit._ext import attention_cuda as C

    B, H, L, S, E, Ev = 2, 2, 200, 150, 64, 32
    q, k, v, dout = _problem(13, B, H, L, S, E, Ev, np.float32)
    mask = _masks(4, B, H, L, S, np.float32, xp=cupy)["bias"]
    first = _gpu_run(q, k, v, mask, True, 0.2, 0.1, 77, dout)
    second = _gpu_run(q, k, v, mask, True, 0.2, 0.1, 77, dout)
    for a, b in zip(first, second, strict=True):
        assert np.array_equal(a, b, equal_nan=True), "two identical runs differ"
    # Numba device arrays instead of CuPy arrays (the backward allocates D with numba)
    d = [cuda.to_device(a) for a in (q, k, v, dout)]
    out, lse = cuda.device_array((B, H, L, Ev), np.float32), cuda.device_array((B, H, L),
                                                                                np.float32)
    C.attention_forward(*d[:3], mask, True, True, 0.2, 0.1, 77, out, lse)
    grads = [cuda.device_array(a.shape, np.float32) for a in (q, k, v)]
    C.attention_backward(*d[:3], mask, True, True, 0.2, 0.1, 77, out, lse, d[3], *grads)
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), (out, lse, *grads), first,
                          strict=True):
        assert np.array_equal(a.copy_to_host(), b), f"{name}: numba arrays != cupy arrays"


@pytest.mark.cuda
def test_gpu_no_keys_gives_zeros_and_empty_sizes_run():
    pytest.importorskip("cupy")
    q, k, v, dout = _problem(14, 1, 2, 7, 0, 16, 16, np.float32)
    out, lse, dq, dk, dv = _gpu_run(q, k, v, None, False, 0.25, 0.0, 0, dout)
    assert np.all(out == 0) and np.all(np.isneginf(lse)) and np.all(dq == 0)
    q, k, v, dout = _problem(15, 1, 2, 0, 9, 16, 16, np.float32)
    out, lse, dq, dk, dv = _gpu_run(q, k, v, None, False, 0.25, 0.0, 0, dout)
    assert out.shape == (1, 2, 0, 16) and np.all(dk == 0) and np.all(dv == 0)


@pytest.fixture(scope="module")
def simulator(tmp_path_factory):
    return simulator_outcomes(__file__, tmp_path_factory.mktemp("cudasim_attention"))


@pytest.mark.parametrize("case", list(SIM_CASES))
def test_cuda_attention_under_simulator(simulator, case):
    if simulator[case] != "ok":
        pytest.fail(f"{case} failed under the CUDA simulator:\n{simulator[case]}",
                    pytrace=False)


if __name__ == "__main__":
    run_simulator_cases(SIM_CASES, sys.argv[1])
