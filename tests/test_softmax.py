"""Softmax family: kernels vs naive twins, properties, stability, torch, the boundary."""

from __future__ import annotations

import numba
import numpy as np
import pytest
from helpers import FLOAT_DTYPES, arrays, assert_matches_reference, import_torch
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from nnkit._ext import simd_math, softmax_cpu
from nnkit.kernels import reference as ref
from nnkit.kernels import softmax as S

FORWARD = [(S.softmax_forward, ref.softmax), (S.log_softmax_forward, ref.log_softmax)]
BACKWARD = [
    (S.softmax_forward, S.softmax_backward, ref.softmax_forward, ref.softmax_backward),
    (S.log_softmax_forward, S.log_softmax_backward, ref.log_softmax_forward,
     ref.log_softmax_backward),
]


def _twin_along(twin, axis, *arrays_):
    """Apply a last-axis twin along ``axis``: move it last, run, move back."""
    moved = [np.moveaxis(a, axis, -1) for a in arrays_]
    if moved[0].size == 0:  # the twins cannot reshape an empty last axis
        return np.empty(arrays_[0].shape, dtype=arrays_[0].dtype)
    return np.moveaxis(twin(*moved), -1, axis)


@st.composite
def array_and_axis(draw, **kwargs):
    x = draw(arrays(**kwargs))
    axis = draw(st.integers(-x.ndim, x.ndim - 1))
    return x, axis


# ---------------------------------------------------------------------------------------
# Public functions vs twins


@pytest.mark.parametrize(("fn", "twin"), FORWARD, ids=["softmax", "log_softmax"])
@given(case=array_and_axis())
def test_forward_matches_twin(fn, twin, case):
    x, axis = case
    y, cache = fn(x, axis=axis)
    assert cache.y is y and cache.axis == axis % x.ndim
    assert_matches_reference(y, _twin_along(twin, axis, x), dtype=x.dtype)


@pytest.mark.parametrize(("fwd", "bwd", "twin_fwd", "twin_bwd"), BACKWARD,
                         ids=["softmax", "log_softmax"])
@given(case=array_and_axis(), seed=st.integers(0, 2**16))
def test_backward_matches_twin(fwd, bwd, twin_fwd, twin_bwd, case, seed):
    """Each pair against the twins' pair: forward, then backward from its own cache."""
    x, axis = case
    _, cache = fwd(x, axis=axis)
    dy = np.random.default_rng(seed).uniform(-2, 2, x.shape).astype(x.dtype)
    dx = bwd(dy, cache)
    want = _twin_along(lambda dy_, x_: twin_bwd(dy_, twin_fwd(x_)[1]), axis, dy, x)
    assert_matches_reference(dx, want, dtype=x.dtype)


@st.composite
def ce_case(draw, max_n=6, max_c=6):
    dtype = draw(st.sampled_from(FLOAT_DTYPES))
    n = draw(st.integers(0, max_n))
    c = draw(st.integers(1, max_c))
    elements = st.floats(-8, 8, width=np.dtype(dtype).itemsize * 8)
    logits = draw(hnp.arrays(dtype, (n, c), elements=elements))
    ignore_index = draw(st.sampled_from([-100, -1, 0]))
    target = draw(st.lists(st.sampled_from(list(range(c)) + [ignore_index]), min_size=n,
                           max_size=n))
    return logits, np.array(target, dtype=np.int64), ignore_index


@given(case=ce_case(), dloss=st.floats(-3, 3))
def test_cross_entropy_matches_twin(case, dloss):
    logits, target, ignore_index = case
    loss, cache = S.cross_entropy_forward(logits, target, ignore_index=ignore_index)
    lse = cache.lse
    expected, twin_cache = ref.cross_entropy_forward(logits, target, ignore_index=ignore_index)
    assert loss.shape == () and loss.dtype == logits.dtype
    if np.isnan(expected):
        assert np.isnan(loss)
    else:
        assert_matches_reference(loss, expected, dtype=logits.dtype)
    if len(target):
        lse_twin = (logits.astype(np.float64) - ref.log_softmax(logits.astype(np.float64)))[:, 0]
        assert lse.dtype == np.float64
        assert_matches_reference(lse.astype(logits.dtype), lse_twin, dtype=logits.dtype)
    dlogits = S.cross_entropy_backward(dloss, cache)
    assert_matches_reference(dlogits, ref.cross_entropy_backward(dloss, twin_cache),
                             dtype=logits.dtype)


# ---------------------------------------------------------------------------------------
# Both builds of the compiled kernels held to the twins directly, over widths that cross the
# vector lanes, the 1024-column sum blocks and the 4096-column cross-entropy scratch.

WIDTHS = [1, 15, 16, 17, 1000, 2500, 5000]


def _build(launcher, build):
    """The serial or parallel Numba build of a launcher."""
    return getattr(launcher, build)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("C", WIDTHS)
@pytest.mark.parametrize("build", ["serial", "parallel"])
def test_row_kernels_match_twin(build, C, dtype, rng):
    x = (rng.standard_normal((3, C)) * 4).astype(dtype)
    for launcher, twin in [(softmax_cpu.softmax_rows, ref.softmax),
                           (softmax_cpu.log_softmax_rows, ref.log_softmax)]:
        out = np.empty_like(x)
        _build(launcher, build)(x, out)
        assert_matches_reference(out, twin(x), dtype=dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("C", WIDTHS)
@pytest.mark.parametrize("build", ["serial", "parallel"])
def test_numba_backward_and_cross_entropy_kernels_match_twin(build, C, dtype, rng):
    x = (rng.standard_normal((4, C)) * 4).astype(dtype)
    dy = rng.standard_normal((4, C)).astype(dtype)
    y, ly = ref.softmax(x), ref.log_softmax(x)
    out = np.empty_like(x)
    _build(softmax_cpu.softmax_backward_rows, build)(dy, y, out)
    assert_matches_reference(out, ref.softmax_backward(dy, ref.softmax_forward(x)[1]))
    _build(softmax_cpu.log_softmax_backward_rows, build)(dy, ly, out)
    assert_matches_reference(out, ref.log_softmax_backward(dy, ref.log_softmax_forward(x)[1]))
    target = np.array([0, C - 1, -100, C // 2])
    lse, loss_rows = np.empty(4), np.empty(4)
    _build(softmax_cpu.cross_entropy_rows, build)(x, target, -100, lse, loss_rows)
    assert_matches_reference((loss_rows.sum() / 3).astype(dtype), ref.cross_entropy(x, target))
    _build(softmax_cpu.cross_entropy_backward_rows, build)(x, target, lse, 0.5 / 3, -100, out)
    assert_matches_reference(out, ref.cross_entropy_backward(0.5, (x, target, -100)))


def test_cpu_and_cuda_modules_expose_the_same_launchers():
    """``kernels_for`` picks the module; the calls are the same on both devices."""
    from nnkit._ext import softmax_cuda

    for name in ("softmax_rows", "log_softmax_rows", "softmax_backward_rows",
                 "log_softmax_backward_rows", "cross_entropy_rows",
                 "cross_entropy_backward_rows", "cross_entropy_mean",
                 "cross_entropy_mean_backward_rows", "first_invalid_target"):
        assert callable(getattr(softmax_cpu, name)) and callable(getattr(softmax_cuda, name))


def test_plain_python_launchers_match_compiled(rng):
    """The uncompiled functions (the debugging path) compute what the compiled ones do."""
    x = rng.standard_normal((3, 20)).astype(np.float32)
    for name in ["softmax_rows", "log_softmax_rows"]:
        a, b = np.empty_like(x), np.empty_like(x)
        getattr(softmax_cpu, "_" + name)(x, a)
        getattr(softmax_cpu, name)(x, b)
        assert_matches_reference(a, b, factor=4)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_exp_approx_within_two_ulp(dtype):
    lo, hi = (-87.0, 88.0) if dtype == np.float32 else (-707.0, 709.0)
    z = np.concatenate([np.linspace(lo, hi, 200_001), np.linspace(-1, 1, 10_001)]).astype(dtype)
    out = np.empty_like(z)
    _exp_loop(z, out)
    exact = np.exp(z.astype(np.longdouble))
    ulps = np.abs(out - exact) / np.spacing(exact.astype(dtype))
    assert float(ulps.max()) <= 2.0
    special = np.array([-np.inf, np.inf, np.nan, 0.0, -1e30, 1e30, -200.0], dtype=dtype)
    out = np.empty_like(special)
    _exp_loop(special, out)
    np.testing.assert_array_equal(out[[0, 1, 3, 4, 5]], np.array([0, np.inf, 1, 0, np.inf]))
    assert np.isnan(out[2]) and out[6] == np.exp(special[6].astype(np.float64)).astype(dtype)


@numba.njit
def _exp_loop(z, out):
    for i in range(z.shape[0]):
        out[i] = simd_math.exp_approx(z[i])


def test_exp_approx_subnormal_range():
    z = np.linspace(-103.9, -87.5, 1001).astype(np.float32)
    out = np.empty_like(z)
    _exp_loop(z, out)
    exact = np.exp(z.astype(np.float64))  # subnormal float32 results: absolute ulps
    assert np.abs(out - exact).max() <= np.finfo(np.float32).smallest_subnormal


@numba.njit
def _exp_normal32_loop(z, out):
    for i in range(z.shape[0]):
        out[i] = simd_math.exp_normal32(z[i])


def test_exp_normal32_within_two_ulp():
    """The unclamped one-factor float32 exp (GELU's Gaussian), over the range it serves."""
    z = np.concatenate([np.linspace(-87.0, 88.0, 200_001), np.linspace(-1, 1, 10_001)])
    z = z.astype(np.float32)
    out = np.empty_like(z)
    _exp_normal32_loop(z, out)
    exact = np.exp(z.astype(np.longdouble))
    assert float((np.abs(out - exact) / np.spacing(exact.astype(np.float32))).max()) <= 2.0


@numba.njit
def _mul_error_loop(a, b, out):
    for i in range(a.shape[0]):
        out[i] = simd_math.mul_error(a[i], b[i], a[i] * b[i])


@numba.njit
def _dekker_loop(a, b, split, out):
    for i in range(a.shape[0]):
        out[i] = simd_math._dekker_jit(a[i], b[i], a[i] * b[i], split)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_mul_error_is_the_exact_rounding_error(dtype):
    """a * b - fl(a * b), exactly, on this CPU's path (FMA or not) and on Dekker's split
    (the path of CPUs without FMA) alike; checked with exact rationals."""
    from fractions import Fraction

    rng = np.random.default_rng(5)
    a = (rng.standard_normal(2000) * 10.0 ** rng.integers(-8, 8, 2000)).astype(dtype)
    b = (rng.standard_normal(2000) * 10.0 ** rng.integers(-8, 8, 2000)).astype(dtype)
    split = np.float32(4097.0) if dtype == np.float32 else 134217729.0
    for loop in (_mul_error_loop, lambda a, b, out: _dekker_loop(a, b, split, out)):
        out = np.empty_like(a)
        loop(a, b, out)
        for ai, bi, oi in zip(a.tolist(), b.tolist(), out.tolist(), strict=True):
            p = float(dtype(ai) * dtype(bi))
            assert Fraction(oi) == Fraction(ai) * Fraction(bi) - Fraction(p)
    assert simd_math.mul_error(dtype(3.1), dtype(7.3), dtype(3.1) * dtype(7.3)) == \
        float(Fraction(float(dtype(3.1))) * Fraction(float(dtype(7.3)))
              - Fraction(float(dtype(3.1) * dtype(7.3))))


# ---------------------------------------------------------------------------------------
# Properties


@given(case=array_and_axis(min_side=1))
def test_softmax_rows_sum_to_one_and_log_softmax_is_its_log(case):
    x, axis = case
    y, _ = S.softmax_forward(x, axis=axis)
    tol = 64 * np.finfo(x.dtype).eps
    np.testing.assert_allclose(y.sum(axis=axis, dtype=np.float64), 1.0, rtol=tol)
    np.testing.assert_allclose(np.exp(S.log_softmax_forward(x, axis=axis)[0]), y, rtol=tol,
                               atol=tol)


@given(case=array_and_axis(min_side=1), shift=st.sampled_from([-64.0, -3.0, 0.5, 20.0, 1e3]))
def test_softmax_is_shift_invariant(case, shift):
    x, axis = case
    shifted = (x.astype(np.float64) + shift).astype(x.dtype)
    # the shift is exact only up to x's rounding at the shifted magnitude
    tol = 64 * np.finfo(x.dtype).eps * max(1.0, abs(shift))
    np.testing.assert_allclose(S.softmax_forward(shifted, axis=axis)[0],
                               S.softmax_forward(x, axis=axis)[0], rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_stable_at_large_logits(dtype, rng):
    x = rng.choice([-1e4, 1e4, 0.0, 9999.5], size=(6, 9)).astype(dtype)
    for fn, twin in FORWARD:
        y, _ = fn(x)
        assert np.isfinite(y).all()
        assert_matches_reference(y, twin(x.astype(np.float64)), dtype=dtype)
    target = np.array([0, 3, 8, 1, -100, 5])
    loss, cache = S.cross_entropy_forward(x, target)
    assert np.isfinite(loss) and np.isfinite(cache.lse).all()
    assert_matches_reference(loss, ref.cross_entropy(x.astype(np.float64), target), dtype=dtype)
    grad = S.cross_entropy_backward(1.0, cache)
    assert np.isfinite(grad).all()
    # The cached lse ~ 1e4 carries a rounding of |lse| * eps(float64), which the gradient
    # inherits (softmax's own conditioning at that magnitude): ~1e4 float64 ulps, far below
    # float32's; float32 logits are held to 64 float32 ulps.
    factor = 64.0 if dtype == np.float32 else 64.0 * 1e4
    twin_cache = ref.cross_entropy_forward(x.astype(np.float64), target)[1]
    assert_matches_reference(grad, ref.cross_entropy_backward(1.0, twin_cache), dtype=dtype,
                             factor=factor)


def test_minus_inf_entries_and_rows():
    torch = import_torch()
    x = np.array([[-np.inf, 0.0, 1.0], [-np.inf, -np.inf, -np.inf], [2.0, -np.inf, 2.0]])
    for dtype in FLOAT_DTYPES:
        xd = x.astype(dtype)
        expected = torch.softmax(torch.from_numpy(xd), -1).numpy()
        got, _ = S.softmax_forward(xd)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
        assert_matches_reference(got[[0, 2]], expected[[0, 2]])
        expected = torch.log_softmax(torch.from_numpy(xd), -1).numpy()
        got, _ = S.log_softmax_forward(xd)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
        np.testing.assert_array_equal(np.isneginf(got), np.isneginf(expected))
        finite = np.isfinite(expected)
        assert_matches_reference(got[finite], expected[finite])


def test_empty_shapes():
    for shape, axis in [((0, 4), -1), ((3, 0), -1), ((0,), 0), ((2, 0, 3), 1), ((0, 3), 0)]:
        x = np.zeros(shape, np.float32)
        for fwd, bwd, _, _ in BACKWARD:
            y, cache = fwd(x, axis=axis)
            assert y.shape == shape
            assert bwd(x, cache).shape == shape
    loss, cache = S.cross_entropy_forward(np.zeros((0, 5)), np.zeros(0, np.int64))
    assert np.isnan(loss) and cache.lse.shape == (0,)
    assert S.cross_entropy_backward(1.0, cache).shape == (0, 5)


def test_out_is_filled_and_returned(rng):
    x = rng.standard_normal((4, 5, 6)).astype(np.float32)
    for fn, twin in FORWARD:
        for axis in (-1, 1):
            out = np.empty_like(x)
            y, cache = fn(x, axis=axis, out=out)
            assert y is out and cache.y is out
            assert_matches_reference(out, _twin_along(twin, axis, x))


def test_noncontiguous_input(rng):
    x = rng.standard_normal((6, 10))[:, ::2]  # strided view
    assert_matches_reference(S.softmax_forward(x)[0], ref.softmax(np.ascontiguousarray(x)))
    logits = rng.standard_normal((8, 5)).T  # (5, 8), F-ordered
    target = np.arange(10)[::2] % 8
    loss, _ = S.cross_entropy_forward(logits, target)
    assert_matches_reference(loss, ref.cross_entropy(np.ascontiguousarray(logits), target))


# ---------------------------------------------------------------------------------------
# ignore_index and torch equivalence


def test_all_ignored_gives_nan_loss_and_zero_gradient():
    torch = import_torch()
    logits = np.arange(12.0).reshape(3, 4)
    target = np.full(3, -100)
    loss, cache = S.cross_entropy_forward(logits, target)
    t_logits = torch.tensor(logits, requires_grad=True)
    t_loss = torch.nn.functional.cross_entropy(t_logits, torch.from_numpy(target))
    t_loss.backward()
    assert np.isnan(loss) and torch.isnan(t_loss)
    grad = S.cross_entropy_backward(1.0, cache)
    np.testing.assert_array_equal(grad, t_logits.grad.numpy())


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_softmax_and_log_softmax_match_torch(dtype, axis, rng):
    torch = import_torch()
    x = (rng.standard_normal((5, 7, 3)) * 3).astype(dtype)
    dy = rng.standard_normal(x.shape).astype(dtype)
    for ours, ours_back, theirs in [
        (S.softmax_forward, S.softmax_backward, torch.softmax),
        (S.log_softmax_forward, S.log_softmax_backward, torch.log_softmax),
    ]:
        tx = torch.tensor(x, requires_grad=True)
        ty = theirs(tx, axis)
        ty.backward(torch.from_numpy(dy))
        y, cache = ours(x, axis=axis)
        assert_matches_reference(y, ty.detach().numpy())
        assert_matches_reference(ours_back(dy, cache), tx.grad.numpy())


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("ignore_index", [-100, 2])
def test_cross_entropy_matches_torch(dtype, ignore_index, rng):
    torch = import_torch()
    logits = (rng.standard_normal((64, 37)) * 5).astype(dtype)
    target = rng.integers(0, 37, 64)
    target[::5] = ignore_index
    tl = torch.tensor(logits, requires_grad=True)
    t_loss = torch.nn.functional.cross_entropy(tl, torch.from_numpy(target),
                                               ignore_index=ignore_index)
    t_loss.backward(torch.tensor(0.7, dtype=tl.dtype))
    loss, cache = S.cross_entropy_forward(logits, target, ignore_index=ignore_index)
    assert_matches_reference(loss, t_loss.detach().numpy())
    grad = S.cross_entropy_backward(np.asarray(0.7, dtype), cache)
    assert_matches_reference(grad, tl.grad.numpy())


# ---------------------------------------------------------------------------------------
# The validated boundary


def test_error_messages():
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(TypeError, match="x must have dtype float32 or float64, got int64"):
        S.softmax_forward(np.zeros((2, 3), np.int64))
    with pytest.raises(ValueError, match="x must have at least 1 dimension"):
        S.softmax_forward(np.float32(1.0))
    with pytest.raises(ValueError, match=r"axis 2 is out of range for x with 2 dimension"):
        S.log_softmax_forward(x, axis=2)
    with pytest.raises(TypeError, match="axis must be an integer"):
        S.softmax_forward(x, axis=1.0)
    _, cache = S.softmax_forward(x)
    _, log_cache = S.log_softmax_forward(x)
    with pytest.raises(ValueError, match=r"dy must have shape \(2, 3\) like the forward's "
                                         r"output, got shape \(2, 2\)"):
        S.softmax_backward(np.zeros((2, 2), np.float32), cache)
    with pytest.raises(TypeError, match="dy must have dtype float32 like the forward's output, "
                                        "got float64"):
        S.log_softmax_backward(np.zeros((2, 3)), log_cache)
    with pytest.raises(TypeError, match="dy must have dtype float32 or float64, got int64"):
        S.softmax_backward(np.zeros((2, 3), np.int64), cache)
    with pytest.raises(TypeError, match="cache must be the SoftmaxCache returned by "
                                        "log_softmax_forward, got the one of softmax_forward"):
        S.log_softmax_backward(np.zeros((2, 3), np.float32), cache)
    with pytest.raises(TypeError, match="cache must be the SoftmaxCache returned by "
                                        "softmax_forward, got ndarray"):
        S.softmax_backward(np.zeros((2, 3), np.float32), x)
    with pytest.raises(ValueError, match=r"out must have shape \(2, 3\) .*, got \(3, 2\)"):
        S.softmax_forward(x, out=np.empty((3, 2), np.float32))
    with pytest.raises(TypeError, match=r"out must have dtype float32 .*, got float64"):
        S.softmax_forward(x, out=np.empty((2, 3)))
    with pytest.raises(ValueError, match="out must be C-contiguous"):
        S.softmax_forward(x, out=np.empty((3, 2), np.float32).T)
    with pytest.raises(ValueError, match=r"target\[1\] = 3 is out of range .* C=3 classes"):
        S.cross_entropy_forward(x, np.array([0, 3]))
    with pytest.raises(ValueError, match=r"target\[0\] = -1 is out of range"):
        S.cross_entropy_forward(x, np.array([-1, 0]))
    with pytest.raises(TypeError, match="target must have dtype int8"):
        S.cross_entropy_forward(x, np.array([0.0, 1.0]))
    with pytest.raises(ValueError, match=r"target has 3 entries but logits has 2 rows"):
        S.cross_entropy_forward(x, np.array([0, 1, 2]))
    with pytest.raises(ValueError, match="logits must be 2-dimensional"):
        S.cross_entropy_forward(x[0], np.array([0]))
    _, ce_cache = S.cross_entropy_forward(x, np.array([0, 1]))
    with pytest.raises(ValueError, match="dloss must be 0-dimensional"):
        S.cross_entropy_backward(np.ones(2, np.float32), ce_cache)
    with pytest.raises(TypeError, match="cache must be the CrossEntropyCache returned by "
                                        "cross_entropy_forward, got tuple"):
        S.cross_entropy_backward(1.0, (x, np.array([0, 1]), x[:, 0]))
    with pytest.raises(TypeError, match="ignore_index must be an integer"):
        S.cross_entropy_forward(x, np.array([0, 1]), ignore_index=None)


BAD_DTYPES = [np.int32, np.int64, np.complex64, np.complex128, object, np.bool_, np.float16]


@st.composite
def bad_call(draw):
    """A call with at least one bad argument: dtype, rank, shape, axis, out or target."""
    which = draw(st.sampled_from(["fwd", "bwd", "ce", "ce_back"]))
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4))
    dtype = draw(st.sampled_from(BAD_DTYPES + list(FLOAT_DTYPES)))
    x = np.zeros(shape, dtype=dtype)
    axis = draw(st.one_of(st.integers(-5, 5), st.just(1.5), st.just("0"), st.none()))
    other = np.zeros(draw(hnp.array_shapes(min_dims=0, max_dims=3, max_side=4)),
                     dtype=draw(st.sampled_from(BAD_DTYPES + list(FLOAT_DTYPES))))
    return which, x, axis, other


@given(call=bad_call())
def test_boundary_fuzz_raises_only_value_or_type_errors(call):
    which, x, axis, other = call
    _, ce_cache = S.cross_entropy_forward(np.zeros((2, 3)), np.array([0, -100]))
    fn = {
        "fwd": lambda: S.softmax_forward(x, axis=axis, out=other),
        "bwd": lambda: S.log_softmax_backward(other, S.log_softmax_forward(x, axis=axis)[1]),
        "ce": lambda: S.cross_entropy_forward(x, other, ignore_index=axis),
        "ce_back": lambda: S.cross_entropy_backward(other, ce_cache),
    }[which]
    try:
        fn()
    except (ValueError, TypeError):
        pass


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("fn, twin", [(S.softmax_forward, ref.softmax),
                                      (S.log_softmax_forward, ref.log_softmax)])
def test_out_overlapping_x_gives_the_result_of_a_fresh_out(fn, twin, dtype):
    """An ``out`` sharing memory with x (x itself, or shifted by a row or by one element) was
    overwritten while the kernel still read x: wrong numbers. Now the result is computed
    aside and copied into out, as NumPy's ufuncs handle overlapping out= (x is then
    overwritten, as asked)."""
    rng = np.random.default_rng(6)
    buf = rng.standard_normal(4 * 5 + 1).astype(dtype)
    views = {
        "out is x": (slice(0, 20), slice(0, 20)),
        "out one row on": (slice(0, 15), slice(5, 20)),
        "out one row back": (slice(5, 20), slice(0, 15)),
        "out one element on": (slice(0, 20), slice(1, 21)),
    }
    for name, (xs, outs) in views.items():
        for axis in (-1, 0):
            b = buf.copy()
            x = b[xs].reshape(-1, 5)  # (M, 5), C-contiguous
            out = b[outs].reshape(-1, 5)
            expected = _twin_along(twin, axis, x.copy())
            assert fn(x, axis=axis, out=out)[0] is out
            assert_matches_reference(out, expected, err_msg=f"{name}, axis {axis}")


def test_kernels_and_functions_take_dim_or_axis():
    """torch's ``dim`` and NumPy's ``axis`` name the same axis; -1 when neither is given."""
    import nnkit as nk
    from nnkit import functional as F
    from nnkit import kernels

    x = np.random.default_rng(0).normal(size=(3, 4))
    y, cache = kernels.softmax_forward(x, axis=0)
    np.testing.assert_array_equal(kernels.softmax_forward(x, dim=0)[0], y)
    np.testing.assert_array_equal(F.softmax(x, dim=0).numpy(), y)
    np.testing.assert_array_equal(F.softmax(x, 0).numpy(), y)  # torch's positional dim
    np.testing.assert_array_equal(F.log_softmax(x).numpy(), kernels.log_softmax_forward(x)[0])
    np.testing.assert_array_equal(nk.nn.Softmax(axis=0)(x).numpy(), y)
    dy = np.ones_like(x)
    np.testing.assert_array_equal(kernels.softmax_backward(dy, cache),
                                  kernels.softmax_backward(dy, kernels.softmax_forward(x, 0)[1]))
    for call in (lambda: F.softmax(x, 0, axis=1), lambda: kernels.softmax_forward(x, 0, dim=1),
                 lambda: nk.nn.Softmax(0, axis=1)):
        with pytest.raises(TypeError, match="not both"):
            call()
