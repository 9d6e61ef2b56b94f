"""layer_norm: the CPU kernels against the naive twin, torch, central differences, the
serial plain functions, and the validation at the public boundary."""

import math

import numba
import numpy as np
import pytest
from helpers import FLOAT_DTYPES, arrays, assert_matches_reference, import_torch
from hypothesis import example, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from nnkit._ext import layer_norm_cpu
from nnkit.kernels import layer_norm_backward, layer_norm_forward, reference

EPS64 = float(np.finfo(np.float64).eps)
FACTOR = 64.0


def _assert_close(actual, expected, scale, dtype, err_msg=""):
    """|actual - expected| <= FACTOR * (eps(dtype) * (|expected| + scale) + eps64 * cond).

    ``scale`` (broadcastable to expected) is the size of the terms that are added to form each
    output, so cancellation among them is allowed for; both outputs come from float64 sums,
    and the float64 term covers a row mean differing by an ulp (amplified by rstd).
    """
    actual = np.asarray(actual)
    assert actual.shape == np.shape(expected), f"shape {actual.shape} != {np.shape(expected)}"
    assert actual.dtype == np.dtype(dtype), f"dtype {actual.dtype} != {np.dtype(dtype)}"
    eps = float(np.finfo(dtype).eps)
    expected = np.asarray(expected, dtype=np.float64)
    err = np.abs(actual.astype(np.float64) - expected)
    bound = FACTOR * ((eps + EPS64) * (np.abs(expected) + scale) + EPS64)
    bad = err > bound
    assert not bad.any(), (
        f"{err_msg}: {bad.sum()} of {bad.size} differ; max excess {np.max(err - bound):.3g}\n"
        f"actual   {actual[bad][:5]}\nexpected {expected[bad][:5]}"
    )


def _rows64(a, D):
    return np.asarray(a, dtype=np.float64).reshape(-1, D)


def _expected(x, ns, weight, bias, dy, eps):
    """float64 twin results for x (..., *ns) on its (M, D) rows, with term scales."""
    D = math.prod(ns)
    x2, dy2 = _rows64(x, D), _rows64(dy, D)
    w = np.ones(D) if weight is None else np.asarray(weight, np.float64).reshape(D)
    b = np.zeros(D) if bias is None else np.asarray(bias, np.float64).reshape(D)
    y, cache = reference.layer_norm_forward(x2, w, b, eps=eps)
    dx, dw, db = reference.layer_norm_backward(dy2, cache)
    mean = x2.mean(axis=1)
    rstd = 1.0 / np.sqrt(((x2 - mean[:, None]) ** 2).mean(axis=1) + eps)
    xhat = (x2 - mean[:, None]) * rstd[:, None]
    g = dy2 * w
    # cond: how much an ulp in x or the mean moves xhat, per row
    cond = (np.abs(x2).max(axis=1, initial=0) * rstd)[:, None]
    mean_gx = (g * xhat).mean(axis=1, keepdims=True)
    scales = {
        "y": np.abs(xhat * w) + np.abs(b) + cond * np.abs(w),
        "dx": rstd[:, None] * (np.abs(g) + np.abs(g).mean(axis=1, keepdims=True)
                               + np.abs(xhat) * np.abs(mean_gx)
                               + cond * (np.abs(g) + np.abs(mean_gx))),
        "dweight": (np.abs(dy2 * xhat) + np.abs(dy2) * cond).sum(axis=0),
        "dbias": np.abs(dy2).sum(axis=0),
    }
    return {"y": y, "dx": dx, "dweight": dw, "dbias": db, "mean": mean, "rstd": rstd}, scales


@st.composite
def layer_norm_cases(draw, min_dims=1, max_dims=3):
    """x (any layout), normalized_shape = its trailing k axes, optional weight/bias, dy."""
    x = draw(arrays(min_dims=min_dims, max_dims=max_dims, max_side=5))
    k = draw(st.integers(1, x.ndim))
    ns = tuple(x.shape[x.ndim - k:])
    elements = st.floats(-3, 3, allow_subnormal=False, width=x.dtype.itemsize * 8)
    param = hnp.arrays(x.dtype, ns, elements=elements)
    weight = draw(st.none() | param)
    bias = draw(st.none() | param)
    dy = draw(hnp.arrays(x.dtype, x.shape, elements=elements))
    eps = draw(st.sampled_from([1e-5, 1e-3, 0.5]))
    return x, ns, weight, bias, dy, eps


@given(case=layer_norm_cases())
@example(case=(np.zeros((0, 3), np.float32), (3,), None, None, np.zeros((0, 3), np.float32), 1e-5))
# a constant row: xhat is rounding noise times rstd = 1/sqrt(eps)
@example(case=(np.full((2, 3), 0.1), (3,), np.ones(3), None, np.ones((2, 3)), 1e-5))
# a 4-D x normalised over three axes
@example(case=(np.arange(24.0).reshape(1, 2, 3, 4), (2, 3, 4), None, np.ones((2, 3, 4)),
               np.ones((1, 2, 3, 4)), 1e-5))
def test_forward_backward_match_twin(case):
    x, ns, weight, bias, dy, eps = case
    dtype = x.dtype
    y, cache = layer_norm_forward(x, weight, bias, ns, eps=eps)
    mean, rstd = cache.mean, cache.rstd
    batch = x.shape[: x.ndim - len(ns)]
    assert y.shape == x.shape and y.dtype == dtype
    assert mean.shape == batch and rstd.shape == batch
    assert mean.dtype == dtype and rstd.dtype == dtype
    dx, dweight, dbias = layer_norm_backward(dy, cache)
    assert dx.shape == x.shape and dx.dtype == dtype
    assert (dweight is None) == (weight is None) and (dbias is None) == (bias is None)
    D = math.prod(ns)
    if D == 0:  # nothing to normalise: torch's convention
        assert np.all(mean == 0) and np.all(np.isnan(rstd))
        for g in (dweight, dbias):
            assert g is None or g.shape == ns
        return
    exp, scale = _expected(x, ns, weight, bias, dy, eps)
    _assert_close(y.reshape(-1, D), exp["y"], scale["y"], dtype, "y")
    _assert_close(mean.reshape(-1), exp["mean"], np.abs(x.astype(np.float64)).reshape(-1, D)
                  .max(axis=1, initial=0), dtype, "mean")
    _assert_close(rstd.reshape(-1), exp["rstd"], 0.0, dtype, "rstd")
    _assert_close(dx.reshape(-1, D), exp["dx"], scale["dx"], dtype, "dx")
    if weight is not None:
        assert dweight.shape == ns and dweight.dtype == dtype
        _assert_close(dweight.reshape(D), exp["dweight"], scale["dweight"], dtype, "dweight")
    if bias is not None:
        assert dbias.shape == ns and dbias.dtype == dtype
        expected_db = _rows64(dy, D).sum(axis=0)  # dbias_j = sum_i dy_ij
        _assert_close(dbias.reshape(D), expected_db, scale["dbias"], dtype, "dbias")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("shape, ns", [((4, 7), (7,)), ((1, 1), (1,)), ((5, 1), (1,)),
                                       ((2, 3, 4), (3, 4)), ((0, 6), (6,)), ((6,), (6,))])
def test_matches_twin_on_fixed_inputs(rng, dtype, shape, ns):
    x = rng.standard_normal(shape).astype(dtype)
    w = rng.standard_normal(ns).astype(dtype)
    b = rng.standard_normal(ns).astype(dtype)
    dy = rng.standard_normal(shape).astype(dtype)
    D = math.prod(ns)
    y, cache = layer_norm_forward(x, w, b, ns)
    ry, rcache = reference.layer_norm_forward(x.reshape(-1, D), w.ravel(), b.ravel())
    assert_matches_reference(y.reshape(-1, D), ry)
    dx, dw, db = layer_norm_backward(dy, cache)
    rdx, rdw, rdb = reference.layer_norm_backward(dy.reshape(-1, D), rcache)
    assert_matches_reference(dx.reshape(-1, D), rdx, dtype)
    assert_matches_reference(dw.ravel(), rdw, dtype, factor=256)
    assert_matches_reference(db.ravel(), rdb, dtype, factor=256)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("affine", [(True, True), (True, False), (False, True), (False, False)])
@pytest.mark.parametrize("shape, ns", [((3, 5, 8), (8,)), ((4, 3, 6), (3, 6)), ((2, 1), (1,)),
                                       ((9, 33), 33)])
def test_matches_torch(rng, dtype, affine, shape, ns):
    torch = import_torch()
    x = rng.standard_normal(shape).astype(dtype) * 3 + 1
    ns_t = (ns,) if isinstance(ns, int) else ns
    w = rng.standard_normal(ns_t).astype(dtype) if affine[0] else None
    b = rng.standard_normal(ns_t).astype(dtype) if affine[1] else None
    dy = rng.standard_normal(shape).astype(dtype)
    xt = torch.tensor(x, requires_grad=True)
    wt = None if w is None else torch.tensor(w, requires_grad=True)
    bt = None if b is None else torch.tensor(b, requires_grad=True)
    yt = torch.nn.functional.layer_norm(xt, ns_t, wt, bt, eps=1e-5)
    yt.backward(torch.tensor(dy))
    y, cache = layer_norm_forward(x, w, b, ns, eps=1e-5)
    dx, dw, db = layer_norm_backward(dy, cache)
    rstd = cache.rstd
    # Both are ulp-accurate relative to the size of the terms summed (torch float32 sums in
    # float32): scales are those sizes, per output.
    D = math.prod(ns_t)
    dy2 = np.abs(dy.astype(np.float64)).reshape(-1, D)
    w_max = 1.0 if w is None else float(np.abs(w).max())
    b_max = 0.0 if b is None else float(np.abs(b).max())
    xhat_max = float(np.abs(y - (0 if b is None else b)).max()) / w_max if y.size else 0.0
    rstd_max = float(rstd.max())
    # torch subtracts a mean rounded to x's dtype: xhat carries an error of ~ulp(|x|) * rstd
    xhat_max += float(np.abs(x).max()) * rstd_max
    _assert_close(y, yt.detach().numpy(), w_max * xhat_max + b_max, dtype, "y")
    _assert_close(dx, xt.grad.numpy(), rstd_max * dy2.max() * w_max * (2 + xhat_max**2), dtype,
                  "dx")
    if w is not None:
        _assert_close(dw, wt.grad.numpy(), (dy2.sum(axis=0) * xhat_max).reshape(ns_t), dtype,
                      "dweight")
    if b is not None:
        _assert_close(db, bt.grad.numpy(), dy2.sum(axis=0).reshape(ns_t), dtype, "dbias")
    assert (dw is None) == (w is None) and (db is None) == (b is None)


@pytest.mark.parametrize("ns", [(5,), (2, 3)])
def test_backward_matches_central_differences(rng, ns):
    """float64 central differences of L = sum(dy * y) against a random dy."""
    x = rng.standard_normal((3,) + ns)
    w = rng.standard_normal(ns)
    b = rng.standard_normal(ns)
    dy = rng.standard_normal(x.shape)

    def loss(x_, w_, b_):
        return float(np.sum(dy * layer_norm_forward(x_, w_, b_, ns)[0]))

    grads = layer_norm_backward(dy, layer_norm_forward(x, w, b, ns)[1])
    h = 1e-6
    for k, arr in enumerate((x, w, b)):
        num = np.empty_like(arr)
        for idx in np.ndindex(arr.shape):
            args = [x.copy(), w.copy(), b.copy()]
            args[k][idx] += h
            up = loss(*args)
            args[k][idx] -= 2 * h
            num[idx] = (up - loss(*args)) / (2 * h)
        np.testing.assert_allclose(grads[k], num, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("M, D", [(1, 1), (7, 13), (70, 9), (3, 40)])
def test_parallel_matches_serial_plain_functions(rng, dtype, M, D):
    """Compiled (parallel, reassoc) vs the plain functions run by Python (prange = range).

    They differ only in the order of float64 row sums, so on these well-conditioned rows every
    output agrees within 8 ulps of the output dtype, measured against the largest magnitude of
    that output (dx cancels a little; float32 outputs are in practice identical).
    """
    x = (rng.standard_normal((M, D)) * 2 + 0.5).astype(dtype)
    w = rng.standard_normal(D).astype(dtype)
    b = rng.standard_normal(D).astype(dtype)
    dy = rng.standard_normal((M, D)).astype(dtype)
    outs = {}
    kernels = {
        "serial": (layer_norm_cpu._layer_norm_rows, layer_norm_cpu._layer_norm_backward_chunks,
                   layer_norm_cpu._sum_chunks),
        "parallel": (layer_norm_cpu.layer_norm_rows.parallel,
                     layer_norm_cpu.layer_norm_backward_chunks.parallel,
                     layer_norm_cpu.sum_chunks.parallel),
    }
    for mode, (fwd, bwd, tot) in kernels.items():
        y = np.empty_like(x)
        mean = np.empty(M, dtype)
        rstd = np.empty(M, dtype)
        fwd(x, w, b, 1e-5, y, mean, rstd)
        n = layer_norm_cpu.n_chunks_for(M)
        ws_w, ws_b = np.empty((n, D)), np.empty((n, D))
        dx = np.empty_like(x)
        bwd(dy, x, mean, rstd, w, dx, ws_w, ws_b, n, True)
        dw, db = np.empty(D, dtype), np.empty(D, dtype)
        tot(ws_w, dw)
        tot(ws_b, db)
        outs[mode] = (y, mean, rstd, dx, dw, db)
    for name, s, p in zip(["y", "mean", "rstd", "dx", "dweight", "dbias"], outs["serial"],
                          outs["parallel"], strict=True):
        eps = float(np.finfo(dtype).eps)
        atol = 8 * eps * float(np.abs(s).max(initial=0))
        np.testing.assert_allclose(p, s, rtol=8 * eps, atol=atol, err_msg=name)


def test_parameter_gradients_reproducible_across_thread_counts(rng):
    """The row blocks depend on M only, so dweight/dbias are bit-identical for 1 or n threads."""
    x = rng.standard_normal((300, 64)).astype(np.float32)
    dy = rng.standard_normal((300, 64)).astype(np.float32)
    w = rng.standard_normal(64).astype(np.float32)
    _, cache = layer_norm_forward(x, w, w, 64)
    first = layer_norm_backward(dy, cache)
    saved = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        single = layer_norm_backward(dy, cache)
    finally:
        numba.set_num_threads(saved)
    again = layer_norm_backward(dy, cache)
    for a, b, c in zip(first, single, again, strict=True):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)


def test_noncontiguous_input_equals_contiguous(rng):
    base = rng.standard_normal((6, 10)).astype(np.float32)
    x = base[:, ::2]  # (6, 5), strided
    xt = rng.standard_normal((5, 6)).astype(np.float32).T  # (6, 5), transposed
    for v in (x, xt):
        y, cache = layer_norm_forward(v, None, None, 5)
        y_c, cache_c = layer_norm_forward(np.ascontiguousarray(v), None, None, 5)
        np.testing.assert_array_equal(y, y_c)
        dx, _, _ = layer_norm_backward(v, cache)  # a strided dy, too
        dx_c, _, _ = layer_norm_backward(np.ascontiguousarray(v), cache_c)
        np.testing.assert_array_equal(dx, dx_c)


def test_empty_rows_give_zero_parameter_gradients():
    x = np.zeros((0, 4), np.float32)
    w = np.ones(4, np.float32)
    y, cache = layer_norm_forward(x, w, w, 4)
    assert y.shape == (0, 4) and cache.mean.shape == (0,)
    dx, dw, db = layer_norm_backward(x, cache)
    assert dx.shape == (0, 4)
    np.testing.assert_array_equal(dw, np.zeros(4, np.float32))
    np.testing.assert_array_equal(db, np.zeros(4, np.float32))


def test_stable_for_large_offsets():
    """float32 rows of 1e4 + noise of std 0.1: the float64 accumulators keep the variance,
    and the backward corrects the cached float32 mean (off by up to 5e-4, 5e-3 in xhat)."""
    rng = np.random.default_rng(0)
    x = (1e4 + 0.1 * rng.standard_normal((4, 64))).astype(np.float32)
    dy = rng.standard_normal((4, 64)).astype(np.float32)
    w = np.ones(64, np.float32)
    y, cache = layer_norm_forward(x, w, w, 64)
    ry, rcache = reference.layer_norm_forward(x, w, w)
    assert_matches_reference(y, ry)
    dx, dw, _ = layer_norm_backward(dy, cache)
    rdx, rdw, _ = reference.layer_norm_backward(dy, rcache)
    assert_matches_reference(dx, rdx, factor=256)
    assert_matches_reference(dw, rdw, factor=256)


# ---- the public boundary -------------------------------------------------------------------

def test_message_names_x_shape_and_normalized_shape():
    with pytest.raises(ValueError, match=r"x has shape \(2, 3\) but normalized_shape=\(4,\)"):
        layer_norm_forward(np.zeros((2, 3)), None, None, 4)
    with pytest.raises(ValueError, match=r"normalized_shape=\(2, 3\)"):
        layer_norm_forward(np.zeros((3,)), None, None, (2, 3))


def test_messages_for_weight_bias_eps_dy():
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(ValueError, match=r"weight must have shape normalized_shape=\(3,\)"):
        layer_norm_forward(x, np.ones(4, np.float32), None, 3)
    with pytest.raises(TypeError, match="bias has dtype float64 but x has dtype float32"):
        layer_norm_forward(x, None, np.ones(3), 3)
    with pytest.raises(ValueError, match="eps must be > 0"):
        layer_norm_forward(x, None, None, 3, eps=0.0)
    with pytest.raises(ValueError, match="eps must be finite"):
        layer_norm_forward(x, None, None, 3, eps=float("nan"))
    with pytest.raises(TypeError, match="eps must be a real number"):
        layer_norm_forward(x, None, None, 3, eps="1e-5")
    with pytest.raises(TypeError, match="x must have dtype float32 or float64, got int64"):
        layer_norm_forward(np.zeros((2, 3), np.int64), None, None, 3)
    with pytest.raises(ValueError, match="normalized_shape must have at least one dimension"):
        layer_norm_forward(x, None, None, ())
    _, cache = layer_norm_forward(x, None, None, 3)
    with pytest.raises(ValueError, match=r"dy must have shape \(2, 3\) like the forward's "
                                         r"output, got shape \(3, 2\)"):
        layer_norm_backward(np.zeros((3, 2), np.float32), cache)
    with pytest.raises(TypeError, match="cache must be the LayerNormCache returned by "
                                        "layer_norm_forward, got tuple"):
        layer_norm_backward(x, (x, np.zeros(3, np.float32), np.zeros(3, np.float32)))
    with pytest.raises(TypeError, match="dy must have dtype float32 like the forward's output, "
                                        "got float64"):
        layer_norm_backward(np.zeros((2, 3)), cache)


_BAD_ARRAYS = st.sampled_from([
    np.zeros((2, 3), np.int64), np.zeros((2, 3), np.int8), np.zeros((2, 3), np.uint16),
    np.zeros((2, 3), np.complex64), np.zeros((2, 3), np.complex128), np.zeros((2, 3), bool),
    np.zeros((2, 3), np.float16), np.array([[None, 1.0, 2.0]] * 2, dtype=object),
    "abc", None, [[1, 2, 3], [4, 5]], np.zeros((2, 4), np.float32), np.zeros((), np.float32),
])
_BAD_NS = st.one_of(
    st.sampled_from([4, (2, 3, 1), (), -3, (3, -1), 3.0, "3", None, (True,), True, [2.5]]),
    st.integers(4, 100), st.integers(-100, -1),
)
_BAD_EPS = st.one_of(
    st.sampled_from([0, 0.0, -1, -1e-5, float("nan"), float("inf"), -float("inf"), "1e-5",
                     None, True, np.array([1e-5]), 1j]),
    st.floats(max_value=0.0),
)
_BAD_PARAMS = st.sampled_from([
    np.ones(4, np.float32), np.ones((1, 3), np.float32), np.ones(3, np.float64),
    np.ones(3, np.int32), np.ones(3, bool), "w", np.ones(3, np.complex64),
])


@given(which=st.sampled_from(["x", "normalized_shape", "eps", "weight", "bias", "dy"]),
       bad_array=_BAD_ARRAYS, bad_ns=_BAD_NS, bad_eps=_BAD_EPS, bad_param=_BAD_PARAMS)
def test_boundary_fuzz_raises_value_or_type_error(which, bad_array, bad_ns, bad_eps,
                                                  bad_param):
    x = np.ones((2, 3), np.float32)
    x[0, 0] = 2.0
    args = {"x": x, "normalized_shape": 3, "weight": None, "bias": None, "eps": 1e-5}
    with pytest.raises((ValueError, TypeError)):
        if which == "dy":
            layer_norm_backward(bad_array, layer_norm_forward(x, None, None, 3)[1])
        else:
            args[which] = {"x": bad_array, "normalized_shape": bad_ns, "eps": bad_eps,
                           "weight": bad_param, "bias": bad_param}[which]
            layer_norm_forward(**args)


@pytest.mark.parametrize("scale", [1e154, 1e200, 1e300, 2.0**1023])
def test_float64_rows_beyond_1e154_are_normalised_not_zeroed(scale):
    """In float64 the squares of |x| > ~1.3e154 overflow: the variance was inf, rstd 0 and y
    all zeros (torch gives NaN). Such rows are now normalised in units of a power of two near
    max |x|: y as for the unscaled row (eps is negligible there), mean and rstd scaled, the
    backward scaled by 1 / scale; a constant row gives y = 0, as at any scale. Both kernel
    builds."""
    rng = np.random.default_rng(21)
    x0 = rng.uniform(-1.0, 1.0, (5, 7))
    x0[2] = 0.75  # constant row: var 0, y = 0
    x0[3, 0] = 1.0  # max |x| exactly the scale (2**1023 + its negation do not overflow x - mean)
    x = x0 * scale
    w, b = rng.standard_normal(7), rng.standard_normal(7)
    expected = reference.layer_norm(x0, w, b, eps=1e-300)  # row 2: 0 / 1e-150 = 0, y = b
    y, cache = layer_norm_forward(x, w, b, 7)
    mean, rstd = cache.mean, cache.rstd
    assert_matches_reference(y, expected)
    np.testing.assert_allclose(mean / scale, x0.mean(axis=1), rtol=1e-14, atol=1e-15)
    std = x0.std(axis=1)
    np.testing.assert_allclose(rstd[std > 0], 1.0 / (std[std > 0] * scale), rtol=1e-14)
    assert rstd[2] == 1.0 / math.sqrt(1e-5)
    for build in (layer_norm_cpu.layer_norm_rows.serial, layer_norm_cpu.layer_norm_rows.parallel):
        y2, mean2, rstd2 = np.empty_like(x), np.empty(5), np.empty(5)
        build(x, w, b, 1e-5, y2, mean2, rstd2)
        np.testing.assert_array_equal(y2, y)
    if scale <= 1e200:  # x - mean stays finite in the backward
        dy = rng.standard_normal((5, 7))
        dx, dw, db = layer_norm_backward(dy, cache)
        keep = std > 0
        rcache = reference.layer_norm_forward(x0[keep], w, b, eps=1e-300)[1]
        rdx, rdw, rdb = reference.layer_norm_backward(dy[keep], rcache)
        assert_matches_reference(dx[keep] * scale, rdx, factor=256)
        g = dy[2] * w  # constant row: xhat = 0, dx = rstd (g - mean g)
        assert_matches_reference(dx[2], (g - g.mean()) / math.sqrt(1e-5), factor=256)
        assert_matches_reference(dw, rdw, factor=256)
        assert_matches_reference(db, dy.sum(axis=0))


def test_float64_rows_with_inf_or_nan_stay_nan():
    """The overflow path leaves NaN and inf inputs as they were: NaN rows (as torch)."""
    x = np.array([[1e200, np.inf, 0.0], [1e200, np.nan, -1e200], [np.nan, 1.0, 2.0]])
    with np.errstate(invalid="ignore"):
        y, cache = layer_norm_forward(x, None, None, 3)
    assert np.isnan(y).all() and np.isnan(cache.rstd).all()
