"""Convolution and pooling: the kernels against the naive twins (hypothesis), central
differences, torch (values and gradients, nn.Conv2d after a state_dict copy), torch's
default initialisation, serial == parallel builds, and the validation at the boundary."""

import contextlib
import math
import os

import numpy as np
import pytest
from helpers import import_torch, run_simulator_cases, simulator_outcomes
from hypothesis import example, given
from hypothesis import strategies as st

import nnkit as nk
from nnkit._ext import conv_cpu
from nnkit.functional import conv as FC
from nnkit.kernels import conv as K
from nnkit.kernels.conv import algorithms, cpu_images, cpu_threads
from nnkit.kernels.reference import conv as R
from nnkit.nn.conv import AvgPool2d, Conv1d, Conv2d, MaxPool2d


def _assert_close(actual, expected, terms, dtype, msg=""):
    """|actual - expected| <= 16 eps(dtype) * terms * (1 + |expected|): sums of ``terms``
    products of entries bounded by 1 (float32 accumulation in the GEMM)."""
    actual = np.asarray(actual)
    assert actual.shape == np.shape(expected), f"{msg}: {actual.shape} != {np.shape(expected)}"
    assert actual.dtype == np.dtype(dtype), f"{msg}: dtype {actual.dtype}"
    eps = float(np.finfo(dtype).eps)
    np.testing.assert_allclose(actual.astype(np.float64), np.asarray(expected, np.float64),
                               rtol=16 * eps * max(terms, 1), atol=16 * eps * max(terms, 1),
                               err_msg=msg)


@st.composite
def conv_cases(draw):
    """A small conv2d problem that fits: shapes, stride, padding, dilation, groups, layout."""
    groups = draw(st.integers(1, 3))
    Cg, Kg = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    stride = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    dilation = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    kind = draw(st.sampled_from(["int", "pair", "valid", "same"]))
    if kind == "same":
        stride = (1, 1)
        padding = "same"
    elif kind == "valid":
        padding = "valid"
    elif kind == "int":
        padding = draw(st.integers(0, 2))
    else:
        padding = (draw(st.integers(0, 2)), draw(st.integers(0, 2)))
    ph, pw = {"same": (0, 0), "valid": (0, 0)}.get(padding, None) or (
        (padding, padding) if isinstance(padding, int) else padding)
    need_h = max(1, dilation[0] * (kh - 1) + 1 - 2 * ph)
    need_w = max(1, dilation[1] * (kw - 1) + 1 - 2 * pw)
    H, W = need_h + draw(st.integers(0, 3)), need_w + draw(st.integers(0, 3))
    N = draw(st.integers(1, 2))
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    layout = draw(st.sampled_from(["c", "strided", "transposed"]))
    bias = draw(st.booleans())
    seed = draw(st.integers(0, 2**16))
    return dict(N=N, C=Cg * groups, H=H, W=W, K=Kg * groups, kh=kh, kw=kw, stride=stride,
                padding=padding, dilation=dilation, groups=groups, dtype=dtype,
                layout=layout, bias=bias, seed=seed)


def _make_inputs(case):
    rng = np.random.default_rng(case["seed"])
    N, C, H, W = case["N"], case["C"], case["H"], case["W"]
    dtype = case["dtype"]
    if case["layout"] == "strided":
        x = rng.uniform(-1, 1, (N, C, H, 2 * W)).astype(dtype)[..., ::2]
    elif case["layout"] == "transposed":
        x = rng.uniform(-1, 1, (W, H, C, N)).astype(dtype).T
    else:
        x = rng.uniform(-1, 1, (N, C, H, W)).astype(dtype)
    w = rng.uniform(-1, 1, (case["K"], C // case["groups"], case["kh"], case["kw"]))
    b = rng.uniform(-1, 1, case["K"]).astype(dtype) if case["bias"] else None
    return x, w.astype(dtype), b, rng


def _case(**kw):
    base = dict(N=1, C=1, H=3, W=3, K=1, kh=3, kw=3, stride=(1, 1), padding=0,
                dilation=(1, 1), groups=1, dtype=np.float64, layout="c", bias=True, seed=0)
    base.update(kw)
    return base


def _conv_forward(x, w, b, stride, padding, dilation, groups):
    """conv2d_forward, or with per-side padding (t, b, l, r) the validated-array entry
    ``_forward`` (the public API pads asymmetrically only for 'same')."""
    if isinstance(padding, tuple) and len(padding) == 4:
        pt, pb, pl, pr = padding
        return K._forward(x, w, b, tuple(stride), ((pt, pb), (pl, pr)), tuple(dilation), groups)
    return K.conv2d_forward(x, w, b, stride, padding, dilation, groups)


def _check_twin(case, algorithm=None):
    """conv2d forward and backward on ``case``'s inputs against the twin; ``algorithm``
    forces that CPU path. Returns the forward's cache."""
    x, w, b, rng = _make_inputs(case)
    args = (case["stride"], case["padding"], case["dilation"], case["groups"])
    with _algorithm(algorithm) if algorithm else contextlib.nullcontext():
        y, cache = _conv_forward(x, w, b, *args)
    ry, rcache = R.conv2d_forward(x, w, b, *args)
    _assert_close(y, ry, w[0].size + 1, case["dtype"], "y")
    dy = rng.uniform(-1, 1, y.shape).astype(case["dtype"])
    dx, dw, db = K.conv2d_backward(dy, cache)
    rdx, rdw, rdb = R.conv2d_backward(dy, rcache)
    _assert_close(dx, rdx, w.size, case["dtype"], "dx")
    _assert_close(dw, rdw, dy[:, 0].size, case["dtype"], "dweight")
    if b is None:
        assert db is None
    else:
        _assert_close(db, rdb, dy[:, 0].size, case["dtype"], "dbias")
    return cache


@given(case=conv_cases())
@example(case=_case())  # kernel == input size: a 1x1 output
@example(case=_case(kh=1, kw=1, H=4, W=5, C=3, K=2, N=1))  # 1x1 kernel, batch 1
@example(case=_case(kh=2, kw=2, padding="same", dilation=(2, 1), layout="transposed"))
@example(case=_case(C=4, K=4, groups=4, kh=2, kw=3, H=5, W=4, stride=(2, 2), padding=(1, 2)))
def test_conv2d_matches_twin(case):
    _check_twin(case)


@given(N=st.integers(1, 2), Cg=st.integers(1, 2), Kg=st.integers(1, 2), groups=st.integers(1, 2),
       k=st.integers(1, 4), L=st.integers(0, 5), stride=st.integers(1, 3),
       dilation=st.integers(1, 2), padding=st.sampled_from([0, 1, 2, "same", "valid"]),
       dtype=st.sampled_from([np.float32, np.float64]), seed=st.integers(0, 99))
def test_conv1d_matches_twin(N, Cg, Kg, groups, k, L, stride, dilation, padding, dtype, seed):
    p = 0 if isinstance(padding, str) else padding
    L = max(1, dilation * (k - 1) + 1 - 2 * p) + L
    stride = 1 if padding == "same" else stride
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, (N, Cg * groups, L)).astype(dtype)
    w = rng.uniform(-1, 1, (Kg * groups, Cg, k)).astype(dtype)
    b = rng.uniform(-1, 1, Kg * groups).astype(dtype)
    y, cache = K.conv1d_forward(x, w, b, stride, padding, dilation, groups)
    ry, rcache = R.conv1d_forward(x, w, b, stride, padding, dilation, groups)
    _assert_close(y, ry, w[0].size + 1, dtype)
    dy = rng.uniform(-1, 1, y.shape).astype(dtype)
    got = K.conv1d_backward(dy, cache)
    for name, a, e in zip(("dx", "dw", "db"), got, R.conv1d_backward(dy, rcache),
                          strict=True):
        _assert_close(a, e, dy.size + w.size, dtype, name)


@st.composite
def pool_cases(draw):
    kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    stride = draw(st.one_of(st.none(), st.tuples(st.integers(1, 3), st.integers(1, 3))))
    padding = (draw(st.integers(0, kh // 2)), draw(st.integers(0, kw // 2)))
    dilation = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    H = max(1, dilation[0] * (kh - 1) + 1 - 2 * padding[0]) + draw(st.integers(0, 3))
    W = max(1, dilation[1] * (kw - 1) + 1 - 2 * padding[1]) + draw(st.integers(0, 3))
    shape = (draw(st.integers(1, 2)), draw(st.integers(1, 2)), H, W)
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    # few distinct values: ties inside windows are the rule, not the exception
    x = np.array(draw(st.lists(st.sampled_from([-1.0, 0.0, 0.5, 2.0]), min_size=math.prod(shape),
                               max_size=math.prod(shape)))).reshape(shape).astype(dtype)
    avg = dict(ceil_mode=draw(st.booleans()), count_include_pad=draw(st.booleans()),
               divisor_override=draw(st.sampled_from([None, None, 1, 4, -3])))
    return x, (kh, kw), stride, padding, dilation, avg


@given(case=pool_cases(), seed=st.integers(0, 99))
@example(case=(np.arange(20.0).reshape(1, 1, 4, 5), (3, 2), (2, 2), (1, 1), (1, 1),
               dict(ceil_mode=True, count_include_pad=True, divisor_override=None)), seed=0)
def test_pooling_matches_twin(case, seed):
    x, kernel, stride, padding, dilation, avg = case
    ceil = avg["ceil_mode"]
    y, cache = K.max_pool2d_forward(x, kernel, stride, padding, dilation, ceil)
    ry, ridx = R.max_pool2d(x, kernel, stride, padding, dilation, ceil, return_indices=True)
    np.testing.assert_array_equal(y, ry)
    np.testing.assert_array_equal(cache.idx, ridx)
    dy = np.random.default_rng(seed).uniform(-1, 1, y.shape).astype(x.dtype)
    rcache = R.max_pool2d_forward(x, kernel, stride, padding, dilation, ceil)[1]
    _assert_close(K.max_pool2d_backward(dy, cache), R.max_pool2d_backward(dy, rcache), 9,
                  x.dtype)
    y, cache = K.avg_pool2d_forward(x, kernel, stride, padding, **avg)
    ry, rcache = R.avg_pool2d_forward(x, kernel, stride, padding, **avg)
    _assert_close(y, ry, 9, x.dtype, "avg")
    dy = np.random.default_rng(seed).uniform(-1, 1, y.shape).astype(x.dtype)
    _assert_close(K.avg_pool2d_backward(dy, cache), R.avg_pool2d_backward(dy, rcache), 9,
                  x.dtype)


@pytest.mark.parametrize("size, k, s, p, d, floor_out, ceil_out", [
    (5, 2, 2, 0, 1, 2, 3),  # ceil adds a clipped last window
    (4, 2, 2, 0, 1, 2, 2),  # exact fit: nothing to add
    (5, 3, 3, 1, 1, 2, 2),  # the extra window would start in the right padding: dropped
    (8, 2, 3, 1, 2, 3, 3),  # likewise, with dilation
    (6, 3, 2, 1, 1, 3, 4),
    (3, 4, 2, 0, 1, 0, 1),  # a window larger than the input, only in ceil mode (as torch)
])
def test_pool_output_size_is_torchs_rule(size, k, s, p, d, floor_out, ceil_out):
    assert K.pool_output_size(size, k, s, p, d, False) == floor_out
    assert K.pool_output_size(size, k, s, p, d, True) == ceil_out


def test_max_pool_nan_wins_as_torch():
    x = np.array([[[[1.0, np.nan], [3.0, np.nan]]]])
    y, cache = K.max_pool2d_forward(x, 2)
    assert np.isnan(y).all()
    dx = K.max_pool2d_backward(np.ones_like(y), cache)
    np.testing.assert_array_equal(
        dx, R.max_pool2d_backward(np.ones_like(y), R.max_pool2d_forward(x, 2)[1]))
    assert dx[0, 0, 1, 1] == 1.0  # torch's loop keeps the last NaN


# ---- the formulas of notes §4.1 and §4.2 -----------------------------------------------------
def _notes_convolution_2d(image, kernel):
    """Notes §4.2 as printed: (I * W)[i, j] = sum_k sum_l I[i - k, j - l] W[k, l], with I and
    W zero outside their arrays; every (i, j) where it can be non-zero, (H + kh - 1, W + kw - 1)."""
    H, W_ = image.shape
    kh, kw = kernel.shape
    out = np.zeros((H + kh - 1, W_ + kw - 1))
    for i in range(out.shape[0]):
        for j in range(out.shape[1]):
            for k in range(kh):
                for l in range(kw):  # noqa: E741  (the index of notes §4.2)
                    if 0 <= i - k < H and 0 <= j - l < W_:
                        out[i, j] += image[i - k, j - l] * kernel[k, l]
    return out


def _notes_cross_correlation_2d(image, kernel):
    """Definition 4.8 in two dimensions, (W star I)[i, j] = sum_k sum_l W[k, l] I[i + k, j + l],
    where the window lies inside the image: (H - kh + 1, W - kw + 1)."""
    kh, kw = kernel.shape
    out = np.zeros((image.shape[0] - kh + 1, image.shape[1] - kw + 1))
    for i in range(out.shape[0]):
        for j in range(out.shape[1]):
            for k in range(kh):
                for l in range(kw):  # noqa: E741
                    out[i, j] += kernel[k, l] * image[i + k, j + l]
    return out


@given(C=st.integers(1, 3), K_out=st.integers(1, 2), H=st.integers(3, 7), W=st.integers(3, 7),
       kh=st.integers(1, 3), kw=st.integers(1, 3), seed=st.integers(0, 2**31))
def test_section_4_2_conv2d_is_cross_correlation_and_a_flipped_kernel_gives_convolution(
        C, K_out, H, W, kh, kw, seed):
    """F.conv2d (torch's) is the cross-correlation of notes §4.1 (Definition 4.8), not the
    convolution: conv2d(x, w)[a, b] = sum_{k,l} w[k, l] x[a + k, b + l]. With the kernel flipped,
    w_bar[k, l] = w[kh-1-k, kw-1-l] (the Remark after Definition 4.8), and padding kh - 1,
    kw - 1 it equals (I * W)[i, j] = sum_{k,l} I[i - k, j - l] W[k, l] of notes §4.2 at every
    (i, j); each output channel sums its kernels over the input channels."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((1, C, H, W))
    w = rng.standard_normal((K_out, C, kh, kw))
    correlation = FC.conv2d(x, w).numpy()[0]
    convolution = FC.conv2d(x, w[:, :, ::-1, ::-1].copy(), padding=(kh - 1, kw - 1)).numpy()[0]
    for k in range(K_out):
        expected_corr = sum(_notes_cross_correlation_2d(x[0, c], w[k, c]) for c in range(C))
        expected_conv = sum(_notes_convolution_2d(x[0, c], w[k, c]) for c in range(C))
        np.testing.assert_allclose(correlation[k], expected_corr, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(convolution[k], expected_conv, rtol=1e-12, atol=1e-12)
    if kh * kw > 1 and not np.allclose(w, w[:, :, ::-1, ::-1]):  # an asymmetric kernel:
        valid = convolution[:, kh - 1:H, kw - 1:W]  # the convolution where the window fits
        assert not np.allclose(correlation, valid)  # is not the cross-correlation


# ---- gradcheck -------------------------------------------------------------------------------

def test_gradcheck_conv2d(rng):
    x = rng.standard_normal((2, 4, 5, 4))
    w = rng.standard_normal((6, 2, 2, 3))
    b = rng.standard_normal(6)
    nk.gradcheck(lambda x, w, b: FC.conv2d(x, w, b, stride=(2, 1), padding=1, dilation=(1, 2),
                                           groups=2), [x, w, b])
    w2 = rng.standard_normal((3, 4, 2, 2))  # even kernel: 'same' pads bottom/right more
    nk.gradcheck(lambda x, w: FC.conv2d(x, w, padding="same"), [x, w2])


def test_gradcheck_conv1d(rng):
    x, w, b = rng.standard_normal((2, 3, 7)), rng.standard_normal((2, 3, 4)), rng.standard_normal(2)
    nk.gradcheck(lambda x, w, b: FC.conv1d(x, w, b, stride=2, padding=1, dilation=2), [x, w, b])
    nk.gradcheck(lambda x, w: FC.conv1d(x, w, padding="same"), [x, w])


def test_gradcheck_pooling(rng):
    x = rng.permutation(2 * 3 * 6 * 5).reshape(2, 3, 6, 5) / 7.0  # distinct: no ties
    nk.gradcheck(lambda x: FC.max_pool2d(x, 3, stride=2, padding=1), [x])
    nk.gradcheck(lambda x: FC.avg_pool2d(x, (2, 3), stride=1, padding=1), [x])
    nk.gradcheck(lambda x: FC.avg_pool2d(x, 3, padding=1, count_include_pad=False), [x])


@pytest.mark.parametrize("fn", [
    lambda x: FC.max_pool2d(x, 2, ceil_mode=True),
    lambda x: FC.max_pool2d(x, (3, 2), (2, 3), 1, (1, 2), True, True)[0],
    lambda x: FC.avg_pool2d(x, 2, ceil_mode=True),
    lambda x: FC.avg_pool2d(x, 3, 2, 1, True),  # count_include_pad with clipped windows
    lambda x: FC.avg_pool2d(x, 3, 2, 1, True, False),
    lambda x: FC.avg_pool2d(x, (2, 3), 1, (1, 0), False, True, 5),
    lambda x: FC.avg_pool2d(x, 2, 3, 1, True, False, -2),
], ids=["max-ceil", "max-ceil-dilated-indices", "avg-ceil", "avg-ceil-pad",
        "avg-ceil-nopad", "avg-divisor", "avg-ceil-negative-divisor"])
def test_gradcheck_pooling_new_modes(rng, fn):
    x = rng.permutation(2 * 3 * 7 * 6).reshape(2, 3, 7, 6) / 11.0  # distinct: no ties
    nk.gradcheck(fn, [x])


def test_second_backward_recomputes_cols(rng):
    x = nk.tensor(rng.standard_normal((2, 3, 6, 6)), requires_grad=True)
    w = nk.tensor(rng.standard_normal((4, 3, 3, 3)), requires_grad=True)
    y = FC.conv2d(x, w, padding=1).sum()
    y.backward(retain_graph=True)
    g1 = (x.grad.copy(), w.grad.copy())
    y.backward()
    np.testing.assert_allclose(x.grad, 2 * g1[0], rtol=1e-12)
    np.testing.assert_allclose(w.grad, 2 * g1[1], rtol=1e-12)


# ---- torch -----------------------------------------------------------------------------------

def _torch_grads(torch, fn, arrays):
    ts = [torch.tensor(a, requires_grad=True) for a in arrays]
    out = fn(*ts)
    dy = np.random.default_rng(0).standard_normal(tuple(out.shape)).astype(arrays[0].dtype)
    out.backward(torch.tensor(dy))
    return out.detach().numpy(), [t.grad.numpy() for t in ts], dy


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kw", [dict(stride=1, padding=1), dict(stride=(2, 1), padding=(0, 2),
                                dilation=(2, 1), groups=2), dict(padding="same", dilation=2),
                                dict(padding="valid", groups=4)])
def test_conv2d_matches_torch(rng, dtype, kw):
    torch = import_torch()
    x = rng.standard_normal((3, 4, 9, 8)).astype(dtype)
    w = rng.standard_normal((8, 4 // kw.get("groups", 1), 3, 2)).astype(dtype)
    b = rng.standard_normal(8).astype(dtype)
    _conv2d_matches_torch(torch, x, w, b, dtype, **kw)


@pytest.mark.parametrize("kw", [dict(stride=2, padding=1), dict(padding="same", dilation=3),
                                dict(groups=3, dilation=2)])
@pytest.mark.filterwarnings("ignore:Using padding=.same.")
def test_conv1d_matches_torch(rng, kw):
    torch = import_torch()
    x, w, b = rng.standard_normal((2, 3, 11)), rng.standard_normal((6, 3 // kw.get("groups", 1),
                                                                     4)), rng.standard_normal(6)
    ty, tg, dy = _torch_grads(torch, lambda x, w, b: torch.nn.functional.conv1d(x, w, b, **kw),
                              [x, w, b])
    args = [nk.tensor(a, requires_grad=True) for a in (x, w, b)]
    y = FC.conv1d(*args, **kw)
    y.backward(dy)
    np.testing.assert_allclose(y.numpy(), ty, rtol=1e-10, atol=1e-12)
    for a, g in zip(args, tg, strict=True):
        np.testing.assert_allclose(a.grad, g, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kw", [dict(kernel_size=2), dict(kernel_size=3, stride=1, padding=1),
                                dict(kernel_size=(3, 2), stride=(2, 1), padding=(1, 0))])
def test_pooling_matches_torch_with_ties(rng, kw):
    torch = import_torch()
    x = rng.integers(0, 3, (2, 3, 7, 6)).astype(np.float32)  # many ties
    for ours, theirs in ((FC.max_pool2d, torch.nn.functional.max_pool2d),
                         (FC.avg_pool2d, torch.nn.functional.avg_pool2d)):
        ty, (tgx,), dy = _torch_grads(torch, lambda x, f=theirs: f(x, **kw), [x])
        xt = nk.tensor(x, requires_grad=True)
        y = ours(xt, **kw)
        y.backward(dy)
        np.testing.assert_allclose(y.numpy(), ty, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(xt.grad, tgx, rtol=1e-6, atol=1e-6)


_POOL_SHAPES = [(2, 3, 7, 6), (1, 2, 5, 5), (1, 1, 4, 9)]
_POOL_GEOMETRY = [  # kernel_size, stride, padding, dilation
    (2, None, 0, 1), (3, 2, 1, 1), ((3, 2), (2, 3), (1, 0), 1), (2, 3, 1, 2),
    (3, 1, 1, (2, 1)), ((2, 4), (3, 2), (1, 2), 1), (1, 2, 0, 1),
]


def _pool_vs_torch(torch, ours, theirs, x, args):
    ty, (tgx,), dy = _torch_grads(torch, lambda t: theirs(t, *args), [x])
    xt = nk.tensor(x, requires_grad=True)
    y = ours(xt, *args)
    y.backward(dy)
    tol = dict(rtol=1e-5, atol=1e-6) if x.dtype == np.float32 else dict(rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(y.numpy(), ty, **tol)
    np.testing.assert_allclose(xt.grad, tgx, **tol)


@pytest.mark.parametrize("shape", _POOL_SHAPES)
@pytest.mark.parametrize("geometry", _POOL_GEOMETRY)
@pytest.mark.parametrize("ceil_mode", [False, True])
def test_max_pool2d_matches_torch_positionally(rng, shape, geometry, ceil_mode):
    """torch's positional order (..., dilation, ceil_mode, return_indices): values, indices,
    gradients."""
    torch = import_torch()
    x = rng.integers(0, 4, shape).astype(np.float64)  # ties
    args = (*geometry, ceil_mode)
    _pool_vs_torch(torch, FC.max_pool2d, torch.nn.functional.max_pool2d, x, args)
    ty, ti = torch.nn.functional.max_pool2d(torch.tensor(x), *args, True)
    xt = nk.tensor(x, requires_grad=True)
    y, idx = FC.max_pool2d(xt, *args, True)
    assert idx.dtype == np.int64 and not idx.requires_grad
    np.testing.assert_array_equal(idx.numpy(), ti.numpy())
    np.testing.assert_array_equal(y.numpy(), ty.numpy())
    y.sum().backward()  # the values still carry the gradient
    np.testing.assert_array_equal(xt.grad, np.bincount(
        (idx.numpy() + x.shape[2] * x.shape[3] * np.arange(x.shape[0] * x.shape[1]).reshape(
            x.shape[0], x.shape[1], 1, 1)).ravel(), minlength=x.size).reshape(x.shape))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", _POOL_SHAPES)
@pytest.mark.parametrize("geometry", [g[:3] for g in _POOL_GEOMETRY])
@pytest.mark.parametrize("ceil_mode", [False, True])
@pytest.mark.parametrize("count_include_pad", [True, False])
@pytest.mark.parametrize("divisor_override", [None, 3, -2])
def test_avg_pool2d_matches_torch_positionally(rng, dtype, shape, geometry, ceil_mode,
                                               count_include_pad, divisor_override):
    """torch's positional order (..., padding, ceil_mode, count_include_pad,
    divisor_override): values and gradients, clipped ceil-mode windows included."""
    torch = import_torch()
    x = rng.standard_normal(shape).astype(dtype)
    _pool_vs_torch(torch, FC.avg_pool2d, torch.nn.functional.avg_pool2d, x,
                   (*geometry, ceil_mode, count_include_pad, divisor_override))


@pytest.mark.parametrize("make", [
    lambda nn: nn.AvgPool2d(3, 1, 1, False),  # 4th positional: ceil_mode, not count_include_pad
    lambda nn: nn.AvgPool2d(3, 2, 1, True, False),
    lambda nn: nn.AvgPool2d((3, 2), (2, 2), (1, 1), True, True, 4),
    lambda nn: nn.MaxPool2d(3, 2, 1, 1, False, True),
    lambda nn: nn.MaxPool2d(2, 3, 1, 2, True, True),
    lambda nn: nn.MaxPool2d((2, 3), None, 0, 1, True),
])
def test_pool_modules_take_torchs_positional_arguments(make):
    torch = import_torch()
    x = np.arange(2 * 35, dtype=np.float32).reshape(1, 2, 5, 7) % 11
    ours, theirs = make(nk.nn)(x), make(torch.nn)(torch.tensor(x))
    if isinstance(theirs, tuple):
        np.testing.assert_array_equal(ours[1].numpy(), theirs[1].numpy())
        ours, theirs = ours[0], theirs[0]
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-6, atol=1e-6)


def test_pool_modules_keep_torchs_attributes():
    m = MaxPool2d(3, 2, 1, 2, True, True)
    assert (m.kernel_size, m.stride, m.padding, m.dilation) == ((3, 3), (2, 2), (1, 1), (2, 2))
    assert m.return_indices and m.ceil_mode and "ceil_mode=True" in repr(m)
    a = AvgPool2d(2, None, 1, True, False, 3)
    assert a.stride == (2, 2) and a.ceil_mode and not a.count_include_pad
    assert a.divisor_override == 3 and list(a.state_dict()) == []


def test_conv2d_module_matches_torch_after_state_dict_copy(rng):
    torch = import_torch()
    torch.manual_seed(0)
    tnet = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                               torch.nn.MaxPool2d(2), torch.nn.Conv2d(8, 4, (2, 3), stride=2,
                                                                      groups=2, bias=False),
                               torch.nn.AvgPool2d(2, 1), torch.nn.Flatten())
    net = nk.nn.Sequential(Conv2d(3, 8, 3, padding=1), nk.nn.ReLU(), MaxPool2d(2),
                           Conv2d(8, 4, (2, 3), stride=2, groups=2, bias=False),
                           AvgPool2d(2, 1), nk.nn.Flatten())
    assert list(net.state_dict()) == list(tnet.state_dict())
    net.load_state_dict(tnet.state_dict())
    x = rng.standard_normal((2, 3, 16, 16)).astype(np.float32)
    ty = tnet(torch.tensor(x))
    ty.sum().backward()
    y = net(x)
    y.sum().backward()
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-4, atol=1e-5)
    for (name, p), tp in zip(net.named_parameters(), tnet.parameters(), strict=True):
        np.testing.assert_allclose(p.grad, tp.grad.numpy(), rtol=1e-4, atol=1e-4, err_msg=name)


def test_conv1d_module_matches_torch(rng):
    torch = import_torch()
    tm = torch.nn.Conv1d(4, 6, 3, padding="same", groups=2)
    m = Conv1d(4, 6, 3, padding="same", groups=2)
    m.load_state_dict(tm.state_dict())
    x = rng.standard_normal((2, 4, 10)).astype(np.float32)
    np.testing.assert_allclose(m(x).numpy(), tm(torch.tensor(x)).detach().numpy(), rtol=1e-5,
                               atol=1e-6)


@pytest.mark.parametrize("cls, args, fan_in", [(Conv2d, (6, 8, (3, 2)), 36),
                                               (Conv2d, (6, 9, 3, 1, 0, 1, 3), 18),
                                               (Conv1d, (4, 5, 7), 28)])
def test_default_init_is_torchs(cls, args, fan_in):
    nk.manual_seed(0)
    m = cls(*args)
    bound = 1 / math.sqrt(fan_in)  # kaiming_uniform(a=sqrt(5)) and the bias rule agree
    assert m.weight.dtype == np.float32 and m.weight.shape[0] == args[1]
    assert m.weight.shape[1] * math.prod(m.weight.shape[2:]) == fan_in
    for p in (m.weight.data, m.bias.data):
        assert np.abs(p).max() <= bound
    assert np.abs(m.weight.data).max() > 0.8 * bound  # uniform on the whole interval
    assert abs(m.weight.data.std() - bound / math.sqrt(3)) < 0.25 * bound


# ---- kernels ---------------------------------------------------------------------------------

def test_parallel_builds_match_serial(rng):
    x = rng.standard_normal((3, 4, 9, 7))
    Ho, Wo = 5, 4
    R_, P = 4 * 3 * 3, 3 * Ho * Wo
    a, b = np.empty((R_, P)), np.empty((R_, P))
    conv_cpu.im2col.serial(x, 3, 3, 2, 2, 1, 1, 1, 1, Ho, Wo, a)
    conv_cpu.im2col.parallel(x, 3, 3, 2, 2, 1, 1, 1, 1, Ho, Wo, b)
    np.testing.assert_array_equal(a, b)
    dxa, dxb = np.empty_like(x), np.empty_like(x)
    conv_cpu.col2im.serial(a, 3, 3, 2, 2, 1, 1, 1, 1, Ho, Wo, dxa)
    conv_cpu.col2im.parallel(a, 3, 3, 2, 2, 1, 1, 1, 1, Ho, Wo, dxb)
    np.testing.assert_array_equal(dxa, dxb)
    dy = rng.standard_normal((3, 4, 20))
    t1, t2, s1, s2 = np.empty((4, 3, 20)), np.empty((4, 3, 20)), np.empty(4), np.empty(4)
    conv_cpu.transpose_sum.serial(dy, t1, s1)
    conv_cpu.transpose_sum.parallel(dy, t2, s2)
    np.testing.assert_array_equal(t1, t2)
    np.testing.assert_array_equal(s1, s2)


def test_pool_parallel_builds_match_serial(rng):
    x = rng.standard_normal((2, 3, 7, 6))
    out = (2, 3) + tuple(K.pool_output_size(n, 3, 2, 1, 1, True) for n in (7, 6))  # ceil mode
    for include, divisor in ((True, 0), (False, 0), (True, -3)):
        a, b, da, db = np.empty(out), np.empty(out), np.empty_like(x), np.empty_like(x)
        conv_cpu.avg_pool.serial(x, 3, 3, 2, 2, 1, 1, include, divisor, a)
        conv_cpu.avg_pool.parallel(x, 3, 3, 2, 2, 1, 1, include, divisor, b)
        np.testing.assert_array_equal(a, b)
        conv_cpu.avg_pool_backward.serial(a, 3, 3, 2, 2, 1, 1, include, divisor, da)
        conv_cpu.avg_pool_backward.parallel(a, 3, 3, 2, 2, 1, 1, include, divisor, db)
        np.testing.assert_array_equal(da, db)


def test_im2col_col2im_are_adjoint(rng):
    """<im2col(x), c> == <x, col2im(c)>: col2im is the transpose the backward needs."""
    x = rng.standard_normal((2, 3, 6, 5))
    Ho, Wo = 3, 5
    cols = np.empty((3 * 2 * 3, 2 * Ho * Wo))
    conv_cpu.im2col(x, 2, 3, 2, 1, 1, 1, 2, 1, Ho, Wo, cols)
    c = rng.standard_normal(cols.shape)
    back = np.empty_like(x)
    conv_cpu.col2im(c, 2, 3, 2, 1, 1, 1, 2, 1, Ho, Wo, back)
    assert math.isclose((cols * c).sum(), (x * back).sum(), rel_tol=1e-12)


def test_float32_large_layer_matches_float64(rng):
    """A layer big enough for the parallel builds and the pooled workspaces."""
    x = rng.standard_normal((4, 16, 20, 20))
    w = rng.standard_normal((32, 16, 3, 3)) / 12
    y64, c64 = K.conv2d_forward(x, w, None, 1, 1)
    y32, c32 = K.conv2d_forward(x.astype(np.float32), w.astype(np.float32), None, 1, 1)
    np.testing.assert_allclose(y32, y64, rtol=1e-4, atol=1e-4)
    dy = rng.standard_normal(y64.shape)
    for a, b in zip(K.conv2d_backward(dy.astype(np.float32), c32)[:2],
                    K.conv2d_backward(dy, c64)[:2], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-3 * np.abs(b).max())


# ---- validation ------------------------------------------------------------------------------

@pytest.mark.parametrize("x_shape, w_shape, kw, match", [
    ((2, 3, 5, 5), (4, 2, 3, 3), {}, r"channel mismatch: x has shape \(2, 3, 5, 5\)"),
    ((2, 4, 5, 5), (6, 2, 3, 3), dict(groups=3), r"groups=3 must divide .*\(2, 4, 5, 5\)"),
    ((2, 3, 2, 5), (4, 3, 3, 3), {}, r"larger than the padded input: x has shape \(2, 3, 2, 5\)"),
    ((5, 5), (4, 3, 3, 3), {}, r"x must be 3-D .* or 4-D .* got shape \(5, 5\)"),
    ((2, 3, 5, 5), (4, 3, 3), {}, r"weight must be 4-D .* got shape \(4, 3, 3\)"),
    ((2, 3, 5, 5), (4, 3, 3, 3), dict(padding="same", stride=2), "stride 1"),
    ((2, 3, 5, 5), (4, 3, 3, 3), dict(padding="full"), "padding must be"),
])
def test_conv2d_bad_shapes_raise_naming_them(x_shape, w_shape, kw, match):
    with pytest.raises(ValueError, match=match):
        FC.conv2d(np.zeros(x_shape, np.float32), np.zeros(w_shape, np.float32), **kw)


_UNBATCHED = [  # (nnkit module, torch module name, args, unbatched input shape)
    (Conv2d, "Conv2d", (3, 4, 3), dict(padding=1, stride=(1, 2)), (3, 6, 7)),
    (Conv2d, "Conv2d", (4, 6, (2, 3)), dict(groups=2, bias=False), (4, 5, 5)),
    (Conv1d, "Conv1d", (3, 4, 3), dict(padding="same", dilation=2), (3, 9)),
    (MaxPool2d, "MaxPool2d", (3, 2, 1), {}, (2, 7, 6)),
    (AvgPool2d, "AvgPool2d", (2,), dict(ceil_mode=True), (2, 5, 7)),
]


@pytest.mark.parametrize("cls, torch_name, args, kw, shape", _UNBATCHED)
def test_unbatched_input_matches_torch(rng, cls, torch_name, args, kw, shape):
    # torch treats a (C, H, W) / (C, L) input as a batch of one and drops the batch axis;
    # before, the modules blamed in_channels and the functions asked for 4-D
    torch = import_torch()
    tm = getattr(torch.nn, torch_name)(*args, **kw).double()
    m = cls(*args, **kw)
    if list(tm.state_dict()):
        m.load_state_dict(tm.state_dict())
        m.double()
    x = rng.standard_normal(shape)
    xt = torch.tensor(x, requires_grad=True)
    ty = tm(xt)
    xn = nk.tensor(x, requires_grad=True)
    y = m(xn)
    assert y.shape == tuple(ty.shape) == m(x[None]).shape[1:]
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-12, atol=1e-12)
    dy = rng.standard_normal(y.shape)
    ty.backward(torch.tensor(dy))
    y.backward(dy)
    np.testing.assert_allclose(xn.grad, xt.grad.numpy(), rtol=1e-12, atol=1e-12)
    for (name, p), tp in zip(m.named_parameters(), tm.parameters(), strict=True):
        np.testing.assert_allclose(p.grad, tp.grad.numpy(), rtol=1e-12, atol=1e-12,
                                   err_msg=name)


def test_unbatched_max_pool_indices_as_torch(rng):
    torch = import_torch()
    x = rng.standard_normal((2, 6, 5))
    y, idx = FC.max_pool2d(x, 2, return_indices=True)
    ty, tidx = torch.nn.functional.max_pool2d(torch.tensor(x), 2, return_indices=True)
    np.testing.assert_array_equal(idx.numpy(), tidx.numpy())
    np.testing.assert_array_equal(y.numpy(), ty.numpy())


@pytest.mark.parametrize("call, match", [
    (lambda: Conv2d(3, 4, 3)(np.zeros((8, 8), np.float32)),
     r"x must be 3-D \(C, H, W\) unbatched or 4-D \(N, C, H, W\) for Conv2d, got shape \(8, 8\)"),
    (lambda: Conv1d(3, 4, 3)(np.zeros((1, 2, 3, 8), np.float32)),
     r"x must be 2-D \(C, L\) unbatched or 3-D \(N, C, L\) for Conv1d, got shape \(1, 2, 3, 8\)"),
    (lambda: Conv2d(3, 4, 3)(np.zeros((2, 8, 8), np.float32)),
     r"x has 2 channels \(shape \(2, 8, 8\), unbatched \(C, H, W\)\) but Conv2d was built "
     r"with in_channels=3; expected shape \(3, H, W\) or \(N, 3, H, W\)"),
    (lambda: FC.conv2d(np.zeros((8, 8)), np.zeros((4, 3, 3, 3))),
     r"x must be 3-D \(C, H, W\) unbatched or 4-D \(N, C, H, W\) for conv2d, got shape"),
    (lambda: FC.max_pool2d(np.zeros((8, 8)), 2),
     r"x must be 3-D \(C, H, W\) unbatched or 4-D \(N, C, H, W\) for max_pool2d"),
    (lambda: FC.avg_pool2d(np.zeros((1, 1, 1, 8, 8)), 2),
     r"x must be 3-D \(C, H, W\) unbatched or 4-D \(N, C, H, W\) for avg_pool2d"),
])
def test_wrong_rank_names_the_accepted_ranks(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_bad_types_and_bias():
    x, w = np.zeros((1, 2, 4, 4), np.float32), np.zeros((3, 2, 2, 2), np.float32)
    with pytest.raises(TypeError, match="weight has dtype float64"):
        K.conv2d_forward(x, w.astype(np.float64))
    with pytest.raises(ValueError, match=r"bias must have shape \(3,\)"):
        K.conv2d_forward(x, w, np.zeros(2, np.float32))
    with pytest.raises(TypeError, match="stride"):
        K.conv2d_forward(x, w, stride=1.5)
    with pytest.raises(ValueError, match="padding"):
        K.max_pool2d_forward(x, 2, padding=2)
    with pytest.raises(ValueError, match="in_channels=3"):
        Conv2d(3, 4, 3)(np.zeros((1, 2, 5, 5), np.float32))
    with pytest.raises(ValueError, match="groups=2"):
        Conv2d(3, 4, 3, groups=2)


@pytest.mark.parametrize("call, error, match", [
    (lambda x: FC.max_pool2d(x, 2, padding=2), ValueError, r"padding \(2, 2\) must be at most"),
    (lambda x: FC.avg_pool2d(x, (3, 1), padding=(1, 1)), ValueError, "at most half"),
    (lambda x: FC.max_pool2d(x, 2, ceil_mode=1), TypeError, "ceil_mode must be a bool"),
    (lambda x: FC.max_pool2d(x, 2, return_indices="yes"), TypeError, "return_indices"),
    (lambda x: FC.avg_pool2d(x, 2, count_include_pad=None), TypeError, "count_include_pad"),
    (lambda x: FC.avg_pool2d(x, 2, divisor_override=0), ValueError, "divisor_override"),
    (lambda x: FC.avg_pool2d(x, 2, divisor_override=2.5), TypeError, "divisor_override"),
    (lambda x: FC.avg_pool2d(x, 2, divisor_override=True), TypeError, "divisor_override"),
    (lambda x: FC.max_pool2d(x, 2, stride=0), ValueError, "stride"),
    (lambda x: FC.max_pool2d(x, 2, dilation=0), ValueError, "dilation"),
    (lambda x: FC.max_pool2d(x, (2, 2, 2)), TypeError, "kernel_size"),
    (lambda x: FC.max_pool2d(x, 5), ValueError, r"output size \(0, 0\) is too small"),
    (lambda x: FC.avg_pool2d(x, 3, 1, 0, True), ValueError, "too small"),
    (lambda x: FC.max_pool2d(x[0, 0], 2), ValueError, "3-D .* or 4-D"),
    (lambda x: FC.avg_pool2d(x.astype(np.int64), 2), TypeError, "float32 or float64"),
    (lambda x: MaxPool2d(2, 2, 0, 1, 1), TypeError, "return_indices"),
    (lambda x: MaxPool2d(3, 1, 2), ValueError, "at most half"),
    (lambda x: AvgPool2d(2, 2, 0, "no"), TypeError, "ceil_mode"),
    (lambda x: AvgPool2d(2, divisor_override=0), ValueError, "divisor_override"),
])
def test_pool_bad_arguments_raise_naming_them(call, error, match):
    with pytest.raises(error, match=match):
        call(np.zeros((1, 1, 2, 2), np.float32))


def test_pool_ceil_mode_window_larger_than_input_as_torch():
    """floor mode rejects a kernel larger than the input; ceil mode keeps one clipped window."""
    x = np.arange(9.0).reshape(1, 1, 3, 3)
    assert FC.max_pool2d(x, 4, 2, ceil_mode=True).numpy().item() == 8.0
    assert FC.avg_pool2d(x, 4, 2, ceil_mode=True).numpy().item() == 4.0  # 36 / 9


def test_max_pool_window_wholly_in_padding():
    """Dilation can put a whole window in the padding: y = -inf (as torch), index -1 (torch
    returns an out-of-plane position there) and no gradient."""
    x = nk.tensor(np.arange(4.0).reshape(1, 1, 2, 2), requires_grad=True)
    y, idx = FC.max_pool2d(x, 2, 1, 1, 3, return_indices=True)
    assert y.numpy().item() == -np.inf and idx.numpy().item() == -1
    y.backward(np.ones((1, 1, 1, 1)))
    np.testing.assert_array_equal(x.grad, 0.0)


# ---- fuzzer-found regressions: huge dilation/padding, int64 overflow, huge pooling windows ---

@given(n_out=st.integers(0, 8), size=st.integers(1, 8), stride=st.integers(1, 2**31 - 1),
       offset=st.integers(-(2**33), 2**33))
@example(n_out=4, size=4, stride=1, offset=-5)  # padding='same', dilation (1, 5), W = 4
def test_valid_range_stays_within_the_outputs(n_out, size, stride, offset):
    """im2col zeroes [0, lo) and [hi, n_out) of each row: both ends must lie in [0, n_out]."""
    lo, hi = conv_cpu._valid_range(n_out, size, stride, offset)
    assert 0 <= lo <= hi <= n_out
    valid = [b for b in range(n_out) if 0 <= b * stride + offset < size]
    assert valid == list(range(lo, hi))


_HUGE_DILATION = [  # (x shape, weight shape, kwargs): im2col used to write past its buffer
    ((1, 1, 2), (1, 1, 3), dict(dilation=500, padding="same")),
    ((1, 1, 2), (1, 1, 2), dict(padding=500, dilation=900)),
    ((1, 1, 2, 2), (1, 1, 2, 2), dict(padding=(0, 500), dilation=(1, 900))),
    ((2, 2, 3, 4), (3, 2, 2, 3), dict(padding="same", dilation=(1, 5))),
    ((1, 2, 3, 4), (2, 1, 3, 2), dict(padding=(2, 7), dilation=(3, 11), groups=2)),
]


@pytest.mark.parametrize("x_shape, w_shape, kw", _HUGE_DILATION)
def test_conv_with_dilation_beyond_the_input_matches_torch(rng, x_shape, w_shape, kw):
    torch = import_torch()
    x = rng.uniform(-1, 1, x_shape)
    w = rng.uniform(-1, 1, w_shape)
    b = rng.uniform(-1, 1, w_shape[0])
    ours = FC.conv1d if len(x_shape) == 3 else FC.conv2d
    theirs = getattr(torch.nn.functional, "conv1d" if len(x_shape) == 3 else "conv2d")
    ty, tg, dy = _torch_grads(torch, lambda x, w, b: theirs(x, w, b, **kw), [x, w, b])
    arrays = [nk.tensor(a, requires_grad=True) for a in (x, w, b)]
    y = ours(*arrays, **kw)
    np.testing.assert_allclose(y.numpy(), ty, rtol=1e-12, atol=1e-12)
    y.backward(dy)
    for a, g in zip(arrays, tg, strict=True):
        np.testing.assert_allclose(a.grad, g, rtol=1e-12, atol=1e-12)


def test_conv1d_module_with_huge_dilation_runs():
    m = Conv1d(1, 1, kernel_size=3, dilation=500, padding="same")
    y = m(np.ones((1, 1, 2), np.float32))
    w = m.weight.numpy()[0, 0, 1]  # only the centre tap meets the input
    np.testing.assert_allclose(y.numpy(), w + m.bias.numpy()[0], rtol=1e-6)


@pytest.mark.parametrize("call, match", [
    (lambda: K.conv2d_forward(np.arange(4.).reshape(1, 1, 2, 2), np.ones((1, 1, 1, 1)),
                              padding=(0, 3 * 2**61), stride=(1, 2**62)),
     r"stride must be at most 2\*\*31 - 1"),
    (lambda: K.conv2d_forward(np.ones((1, 1, 2, 2)), np.ones((1, 1, 1, 1)),
                              padding=(0, 3 * 2**61)), r"padding must be at most 2\*\*31 - 1"),
    (lambda: K.conv1d_forward(np.ones((1, 1, 2)), np.ones((1, 1, 1)), dilation=2**31),
     r"dilation must be at most 2\*\*31 - 1 = 2147483647"),
    (lambda: FC.max_pool2d(np.ones((1, 1, 1, 2)), (1, 2**33), padding=(0, 2**32)),
     r"kernel_size must be at most 2\*\*31 - 1"),
    (lambda: FC.avg_pool2d(np.ones((1, 1, 2, 2)), (2**32 + 1, 2**32 + 1), padding=2**31),
     r"kernel_size must be at most 2\*\*31 - 1"),
    (lambda: FC.max_pool2d(np.ones((1, 1, 2, 2)), 2, 2**31), r"stride must be at most"),
])
def test_geometry_beyond_int32_raises(call, match):
    """Each of kernel_size, stride, padding, dilation <= 2^31 - 1: no int64 overflow below."""
    with pytest.raises(ValueError, match=match):
        call()


def test_max_pool_with_a_huge_window_visits_only_in_bounds_taps():
    """kernel (1, 2^31 - 1): the forward used to loop over every tap of every window."""
    torch = import_torch()
    x = np.array([[[[1.0, 2.0]]]])
    args = ((1, 2**31 - 1), 1, (0, 2**30 - 1))
    ty, ti = torch.nn.functional.max_pool2d(torch.tensor(x), *args, return_indices=True)
    t = nk.tensor(x, requires_grad=True)
    y, idx = FC.max_pool2d(t, *args, return_indices=True)
    np.testing.assert_array_equal(y.numpy(), ty.numpy())
    np.testing.assert_array_equal(idx.numpy(), ti.numpy())
    y.backward(np.ones(y.shape))
    np.testing.assert_array_equal(t.grad, [[[[0.0, 2.0]]]])


def test_avg_pool_divisor_of_a_huge_window_as_torch():
    """(2^31 - 1)^2 fits int64: the divisor of the largest accepted kernel is exact."""
    torch = import_torch()
    x = np.ones((1, 1, 2, 2))
    for include in (True, False):
        args = ((2**31 - 1, 2**31 - 1), None, 2**30 - 1, False, include)
        ty = torch.nn.functional.avg_pool2d(torch.tensor(x), *args)
        np.testing.assert_allclose(FC.avg_pool2d(x, *args).numpy(), ty.numpy(), rtol=1e-15)


_ANY = st.one_of(st.integers(-2, 4), st.tuples(st.integers(-1, 3), st.integers(-1, 3)),
                 st.sampled_from(["same", "valid", "full", None, 1.5, (1, 2, 3)]))


@given(x_shape=st.lists(st.integers(0, 4), min_size=2, max_size=5),
       w_shape=st.lists(st.integers(0, 4), min_size=2, max_size=5),
       stride=_ANY, padding=_ANY, dilation=_ANY, groups=st.one_of(st.integers(-1, 3), _ANY),
       pool=st.booleans(), ceil=st.sampled_from([False, True, 1]),
       divisor=st.sampled_from([None, 0, 2, -1, 1.5]))
def test_fuzz_boundary_raises_only_value_or_type_errors(x_shape, w_shape, stride, padding,
                                                        dilation, groups, pool, ceil, divisor):
    x = np.zeros(x_shape, np.float32)
    try:
        if pool:
            K.max_pool2d_forward(x, tuple(w_shape[:2]), stride, padding, dilation, ceil)
            K.avg_pool2d_forward(x, tuple(w_shape[:2]), stride, padding, ceil, True, divisor)
        else:
            y, cache = K.conv2d_forward(x, np.ones(w_shape, np.float32), None, stride, padding,
                                        dilation, groups)
            K.conv2d_backward(np.ones_like(y), cache)
    except (ValueError, TypeError):
        pass


# ---- CUDA kernels: under Numba's simulator in a child process, on a real GPU when present ----
# The simulator must be on before numba.cuda is first imported, and the rest of this file runs
# without it: the child runs this file as a script with NUMBA_ENABLE_CUDASIM=1 and writes each
# case's outcome ("ok" or the traceback) to JSON. Shapes are tiny; blocks of 4 threads so
# every launch spans several blocks with a ragged last one.

_SIM_CONV = [  # (N, C, H, W, K, kh, kw, stride, pads, dilation, groups)
    (1, 1, 3, 3, 1, 3, 3, (1, 1), ((0, 0), (0, 0)), (1, 1), 1),
    (2, 4, 5, 4, 2, 2, 3, (2, 1), ((1, 1), (1, 1)), (1, 2), 2),
    (1, 2, 4, 5, 3, 1, 1, (1, 2), ((0, 0), (2, 2)), (1, 1), 1),
    (1, 1, 4, 4, 2, 2, 2, (1, 1), ((0, 1), (0, 1)), (1, 1), 1),  # 'same' for an even kernel
]


def _sim_conv():
    """The GPU composition (im2col and col2im kernels, GEMMs through the array module) on
    NumPy arrays routed to the CUDA launchers under the simulator, against the naive twin:
    with and without bias, a second backward through the same cache (its cols consumed),
    one gradient at a time."""
    from nnkit._backend import numpy_on_gpu_route
    from nnkit._ext import conv_cuda

    conv_cuda.threads = 4
    rng = np.random.default_rng(5)
    for N, C, H, W, Kc, kh, kw, stride, pads, dil, groups in _SIM_CONV:
        for dtype, has_bias in ((np.float32, True), (np.float64, True), (np.float64, False)):
            x = rng.uniform(-1, 1, (N, C, H, W)).astype(dtype)
            w = rng.uniform(-1, 1, (Kc, C // groups, kh, kw)).astype(dtype)
            b = rng.uniform(-1, 1, Kc).astype(dtype) if has_bias else None
            pad4 = (*pads[0], *pads[1])
            ref, rcache = R.conv2d_forward(x, w, b, stride, pad4, dil, groups)
            with numpy_on_gpu_route():
                assert K._kernels(x) is conv_cuda
                y, cache = K._forward(x, w, b, stride, pads, dil, groups)
            _assert_close(y, ref, w[0].size + 1, dtype, "y")
            dy = rng.uniform(-1, 1, y.shape).astype(dtype)
            rdx, rdw, rdb = R.conv2d_backward(dy, rcache)
            for needs in ((True, True, True), (True, True, True), (False, True, True),
                          (True, False, False), (False, False, True), (True, True, False)):
                with numpy_on_gpu_route():
                    dx, dw, db = K.conv2d_backward(dy, cache, needs)
                for name, a, e, needed in (("dx", dx, rdx, needs[0]), ("dw", dw, rdw, needs[1]),
                                           ("db", db, rdb, needs[2] and has_bias)):
                    if needed:
                        _assert_close(a, e, dy.size, dtype, f"{name} {needs}")
                    else:
                        assert a is None, name


def _sim_pool():
    from nnkit._ext import conv_cuda

    conv_cuda.threads = 4
    rng = np.random.default_rng(6)
    for kernel, stride, pad, dil, ceil in (((2, 2), (2, 2), (0, 0), (1, 1), False),
                                           ((3, 2), (1, 2), (1, 1), (1, 1), False),
                                           ((2, 3), (2, 1), (1, 0), (2, 1), False),
                                           ((2, 2), (2, 2), (0, 0), (1, 1), True),
                                           ((3, 2), (2, 3), (1, 1), (1, 2), True)):
        x = rng.integers(0, 3, (2, 2, 5, 6)).astype(np.float64)  # ties
        y_ref, idx_ref = R.max_pool2d(x, kernel, stride, pad, dil, ceil, return_indices=True)
        y, idx = np.empty_like(y_ref), np.empty(y_ref.shape, np.int64)
        conv_cuda.max_pool(x, kernel, stride, pad, dil, y, idx)
        np.testing.assert_array_equal(y, y_ref)
        np.testing.assert_array_equal(idx, idx_ref)
        dy = rng.uniform(-1, 1, y.shape)
        dx = np.empty_like(x)
        conv_cuda.max_pool_backward(dy, idx, kernel, stride, pad, dil, dx)
        rcache = R.max_pool2d_forward(x, kernel, stride, pad, dil, ceil)[1]
        np.testing.assert_allclose(dx, R.max_pool2d_backward(dy, rcache), atol=1e-12)
        for include, divisor in ((True, None), (False, None), (True, 5)):
            args = (kernel, stride, pad, ceil, include, divisor)
            y_ref, rcache = R.avg_pool2d_forward(x, *args)
            y = np.empty_like(y_ref)
            conv_cuda.avg_pool(x, kernel, stride, pad, include, divisor or 0, y)
            np.testing.assert_allclose(y, y_ref, atol=1e-12)
            dy = rng.uniform(-1, 1, y.shape)
            conv_cuda.avg_pool_backward(dy, kernel, stride, pad, include, divisor or 0, dx)
            np.testing.assert_allclose(dx, R.avg_pool2d_backward(dy, rcache), atol=1e-12)
    # windows of 2^31 - 1 taps: the kernels visit only the in-bounds ones (the CPU kernels,
    # already checked against torch, are the reference)
    x = rng.uniform(-1, 1, (1, 2, 2, 3))
    for kernel, stride, pad, dil in ((((1, 2**31 - 1), (1, 1), (0, 2**30 - 1), (1, 1))),
                                     ((2**31 - 1, 3), (2**31 - 1, 1), (2**30 - 1, 1), (1, 2))):
        out = tuple(K.pool_output_size(s, k, st, p, d, False) for s, k, st, p, d
                    in zip(x.shape[2:], kernel, stride, pad, dil, strict=True))
        y_ref, idx_ref = np.empty(x.shape[:2] + out), np.empty(x.shape[:2] + out, np.int64)
        conv_cpu.max_pool(x, *kernel, *stride, *pad, *dil, y_ref, idx_ref)
        y, idx = np.empty_like(y_ref), np.empty_like(idx_ref)
        conv_cuda.max_pool(x, kernel, stride, pad, dil, y, idx)
        np.testing.assert_array_equal(y, y_ref)
        np.testing.assert_array_equal(idx, idx_ref)
        dy = rng.uniform(-1, 1, y.shape)
        dx, dx_ref = np.empty_like(x), np.empty_like(x)
        conv_cpu.max_pool_backward(dy, idx_ref, dx_ref)
        conv_cuda.max_pool_backward(dy, idx, kernel, stride, pad, dil, dx)
        np.testing.assert_allclose(dx, dx_ref, atol=1e-12)
        if dil == (1, 1):
            for include in (True, False):
                y_ref, y = np.empty(dy.shape), np.empty(dy.shape)
                conv_cpu.avg_pool(x, *kernel, *stride, *pad, include, 0, y_ref)
                conv_cuda.avg_pool(x, kernel, stride, pad, include, 0, y)
                np.testing.assert_allclose(y, y_ref, rtol=1e-12, atol=0)
                conv_cpu.avg_pool_backward(dy, *kernel, *stride, *pad, include, 0, dx_ref)
                conv_cuda.avg_pool_backward(dy, kernel, stride, pad, include, 0, dx)
                np.testing.assert_allclose(dx, dx_ref, rtol=1e-12, atol=0)


_SIM_CASES = {"conv2d": _sim_conv, "pooling": _sim_pool}


@pytest.fixture(scope="module")
def cuda_simulator(tmp_path_factory):
    return simulator_outcomes(__file__, tmp_path_factory.mktemp("conv_cudasim"))


@pytest.mark.parametrize("case", list(_SIM_CASES))
def test_cuda_kernels_under_simulator(cuda_simulator, case):
    if cuda_simulator[case] != "ok":
        pytest.fail(f"{case} failed under the CUDA simulator:\n{cuda_simulator[case]}",
                    pytrace=False)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_public_functions_on_gpu_match_cpu(rng, dtype):
    cupy = pytest.importorskip("cupy")
    x = rng.standard_normal((4, 6, 13, 11)).astype(dtype)
    w = rng.standard_normal((8, 3, 3, 2)).astype(dtype)
    b = rng.standard_normal(8).astype(dtype)
    kw = dict(stride=(2, 1), padding=1, dilation=(1, 2), groups=2)
    y, cache = K.conv2d_forward(x, w, b, **kw)
    gy, gcache = K.conv2d_forward(cupy.asarray(x), cupy.asarray(w), cupy.asarray(b), **kw)
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == np.float32 else dict(rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(cupy.asnumpy(gy), y, **tol)
    dy = rng.standard_normal(y.shape).astype(dtype)
    for c, g in zip(K.conv2d_backward(dy, cache), K.conv2d_backward(cupy.asarray(dy), gcache),
                    strict=True):
        np.testing.assert_allclose(cupy.asnumpy(g), c, **tol)
    for fwd, bwd, args in ((K.max_pool2d_forward, K.max_pool2d_backward, (3, 2, 1)),
                           (K.max_pool2d_forward, K.max_pool2d_backward, (2, 3, 1, 2, True)),
                           (K.avg_pool2d_forward, K.avg_pool2d_backward, (2, 1, 1)),
                           (K.avg_pool2d_forward, K.avg_pool2d_backward, (3, 2, 1, True)),
                           (K.avg_pool2d_forward, K.avg_pool2d_backward,
                            (3, 2, 1, True, False, 4))):
        y, c = fwd(x, *args)
        gy, gc = fwd(cupy.asarray(x), *args)
        np.testing.assert_allclose(cupy.asnumpy(gy), y, **tol)
        dy = rng.standard_normal(y.shape).astype(dtype)
        np.testing.assert_allclose(cupy.asnumpy(bwd(cupy.asarray(dy), gc)), bwd(dy, c), **tol)


@pytest.mark.parametrize("shape", [(1, 1, 0, 4), (1, 1, 4, 0), (2, 3, 0, 0)])
@pytest.mark.parametrize("call", [
    lambda x: FC.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False),
    lambda x: FC.avg_pool2d(x, 2, 1, 1),
    lambda x: FC.avg_pool2d(x, 2),
    lambda x: FC.max_pool2d(x, 2, 1, 1, ceil_mode=True),
    lambda x: K.avg_pool2d_forward(x, 2, 2, 1, True, False),
    lambda x: AvgPool2d(3, 2, 1, ceil_mode=True, count_include_pad=False)(x),
    lambda x: MaxPool2d(2, 1, 1)(x),
])
def test_pool_refuses_an_empty_plane(call, shape):
    """H = 0 or W = 0 with padding gave windows wholly in the padding: avg_pool2d returned
    zeros and max_pool2d -inf, where torch (and these calls without padding) refuse the
    input. Now a ValueError naming the input shape, with or without padding."""
    x = np.zeros(shape, np.float32)
    with pytest.raises(ValueError, match=rf"x has shape \({shape[0]}, {shape[1]}, {shape[2]}, "
                                         rf"{shape[3]}\), an empty \(H, W\) plane"):
        call(x)
    torch = import_torch()
    with pytest.raises(RuntimeError):
        torch.nn.functional.avg_pool2d(torch.zeros(shape), 3, 2, 1, True, False)


if __name__ == "__main__":
    import sys

    run_simulator_cases(_SIM_CASES, sys.argv[1])


# ---- the CPU algorithms by shape: Winograd F(4x4, 3x3) -----------------------------------------

@contextlib.contextmanager
def _algorithm(name):
    """Force the CPU path ``name`` wherever it applies (Winograd: 3x3, stride 1, no
    dilation, groups 1); the shape-based choice again afterwards."""
    algorithms.ALGORITHM = name
    try:
        yield
    finally:
        algorithms.ALGORITHM = None


@pytest.fixture
def winograd():
    with _algorithm("winograd"):
        yield


@st.composite
def winograd_cases(draw):
    """3x3 stride-1 problems of every padding kind, sizes around the 4x4 tile's edges."""
    kind = draw(st.sampled_from(["int", "pair", "valid", "same"]))
    padding = {"int": draw(st.integers(0, 2)), "pair": (draw(st.integers(0, 2)),
               draw(st.integers(0, 2))), "valid": "valid", "same": "same"}[kind]
    ph, pw = {"valid": (0, 0), "same": (1, 1)}.get(padding, None) or (
        (padding, padding) if isinstance(padding, int) else padding)
    H = max(1, 3 - 2 * ph) + draw(st.integers(0, 9))
    W = max(1, 3 - 2 * pw) + draw(st.integers(0, 9))
    return _case(N=draw(st.integers(1, 2)), C=draw(st.integers(1, 4)), K=draw(st.integers(1, 4)),
                 H=H, W=W, padding=padding, dtype=draw(st.sampled_from([np.float32, np.float64])),
                 layout=draw(st.sampled_from(["c", "strided"])), bias=draw(st.booleans()),
                 seed=draw(st.integers(0, 2**16)))


def _assert_winograd_close(actual, expected, dtype, msg):
    """Winograd's rounding: |error| <= 1024 eps(dtype) (1 + max|expected|). Its transforms
    scale intermediate values by up to ~100 (the constants 1/24 .. 8 of B, G and A), so its
    float32 error is ~10-100x im2col's; measured up to ~100 eps of max|y| (see
    test_winograd_float32_error_bound)."""
    actual, expected = np.asarray(actual), np.asarray(expected, np.float64)
    assert actual.shape == expected.shape and actual.dtype == np.dtype(dtype), msg
    bound = 1024 * float(np.finfo(dtype).eps) * (1 + np.abs(expected).max())
    err = np.abs(actual.astype(np.float64) - expected).max()
    assert err <= bound, f"{msg}: max error {err:.3g} > {bound:.3g}"


@given(case=winograd_cases())
@example(case=_case(N=2, C=2, K=3, H=9, W=5, padding=1))  # partial tiles at both edges
@example(case=_case(H=1, W=1, padding="same"))  # one output, all taps but the centre padding
def test_winograd_matches_twin(case):
    x, w, b, rng = _make_inputs(case)
    with _algorithm("winograd"):
        y, cache = K.conv2d_forward(x, w, b, 1, case["padding"])
    assert cache.algorithm == "winograd"
    ry, rcache = R.conv2d_forward(x, w, b, 1, case["padding"])
    _assert_winograd_close(y, ry, case["dtype"], "y")
    dy = rng.uniform(-1, 1, y.shape).astype(case["dtype"])
    dx, dw, db = K.conv2d_backward(dy, cache)
    rdx, rdw, rdb = R.conv2d_backward(dy, rcache)
    _assert_winograd_close(dx, rdx, case["dtype"], "dx")
    _assert_winograd_close(dw, rdw, case["dtype"], "dweight")
    if b is None:
        assert db is None
    else:
        _assert_close(db, rdb, dy[:, 0].size, case["dtype"], "dbias")


def test_winograd_float32_error_bound(rng):
    """float32 Winograd against the float64 result (im2col in float64) on the widest
    benchmark layer, unit-variance output: max error <= 2^-13 max|exact| (1024 eps) for y,
    dx and dweight; measured ~7.6e-6, 3.5e-6 and 1.2e-5 (about 60-100 eps), against
    ~5e-7 (4 eps) for float32 im2col."""
    x = rng.standard_normal((2, 64, 56, 56)).astype(np.float32)
    w = (rng.standard_normal((64, 64, 3, 3)) / 24).astype(np.float32)
    dy = rng.standard_normal((2, 64, 56, 56)).astype(np.float32)
    with _algorithm("winograd"):
        y, cache = K.conv2d_forward(x, w, None, 1, 1)
    assert cache.algorithm == "winograd"
    got = (y, *K.conv2d_backward(dy, cache)[:2])
    with _algorithm("im2col"):
        y64, c64 = K.conv2d_forward(x.astype(np.float64), w.astype(np.float64), None, 1, 1)
        exact = (y64, *K.conv2d_backward(dy.astype(np.float64), c64)[:2])
    for name, a, e in zip(("y", "dx", "dweight"), got, exact, strict=True):
        err = np.abs(a - e).max() / np.abs(e).max()
        assert err <= 2.0**-13, f"{name}: relative error {err:.3g}"
        assert err > 2 * float(np.finfo(np.float32).eps), f"{name}: not the float32 path?"


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("padding", [1, (0, 2), "same", "valid"])
def test_winograd_matches_torch(rng, winograd, dtype, padding):
    torch = import_torch()
    x = rng.standard_normal((2, 5, 11, 9)).astype(dtype)
    w = rng.standard_normal((6, 5, 3, 3)).astype(dtype)
    b = rng.standard_normal(6).astype(dtype)
    ty, tg, dy = _torch_grads(
        torch, lambda x, w, b: torch.nn.functional.conv2d(x, w, b, padding=padding), [x, w, b])
    args = [nk.tensor(a, requires_grad=True) for a in (x, w, b)]
    y = FC.conv2d(*args, padding=padding)
    y.backward(dy)
    eps = float(np.finfo(dtype).eps)
    for got, want in zip([y.numpy()] + [a.grad for a in args], [ty] + tg, strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1024 * eps * (1 + np.abs(want).max()))


def test_gradcheck_winograd(rng, winograd):
    x = rng.standard_normal((2, 3, 6, 7))
    w = rng.standard_normal((4, 3, 3, 3))
    b = rng.standard_normal(4)
    nk.gradcheck(lambda x, w, b: FC.conv2d(x, w, b, padding=1), [x, w, b])
    nk.gradcheck(lambda x, w: FC.conv2d(x, w, padding=(0, 2)), [x, w])


def test_winograd_second_backward_recomputes_v(rng, winograd):
    x = nk.tensor(rng.standard_normal((2, 3, 6, 6)), requires_grad=True)
    w = nk.tensor(rng.standard_normal((4, 3, 3, 3)), requires_grad=True)
    y = FC.conv2d(x, w, padding=1).sum()
    y.backward(retain_graph=True)
    g1 = (x.grad.copy(), w.grad.copy())
    y.backward()
    np.testing.assert_allclose(x.grad, 2 * g1[0], rtol=1e-12)
    np.testing.assert_allclose(w.grad, 2 * g1[1], rtol=1e-12)


def test_winograd_transforms_are_adjoint_and_parallel_matches_serial(rng):
    """<wino_input(x), v> == <x, wino_input_adjoint(v)> and likewise for the output
    transform (with the junk tiles of v zero): the backward is these adjoints. The
    parallel builds give bit-identical results."""
    from nnkit._ext import winograd_cpu as WC

    x = rng.standard_normal((2, 3, 9, 10))
    TH, TW = 3, 3  # outputs 9x10 with padding 1: 3 tile rows, 3 tile columns
    T = 2 * TH * (TW + 1)
    V = np.empty((36, 3, T))
    WC.wino_input(x, 1, 1, TH, TW, V)
    v = rng.standard_normal(V.shape)
    v.reshape(36, 3, 2, TH, TW + 1)[..., TW] = 0
    back = np.empty_like(x)
    WC.wino_input_adjoint(v, 1, 1, TH, TW, back)
    assert math.isclose((V * v).sum(), (x * back).sum(), rel_tol=1e-12)
    m = rng.standard_normal((36, 3, T))
    m.reshape(36, 3, 2, TH, TW + 1)[..., TW] = 0
    y = np.empty((2, 3, 9, 10))
    WC.wino_output(m, TH, TW, np.zeros(3), y)
    g = rng.standard_normal(y.shape)
    dm = np.empty_like(m)
    WC.wino_output_adjoint(g, TH, TW, dm)
    assert math.isclose((y * g).sum(), (m * dm).sum(), rel_tol=1e-12)
    for fn, args, out in ((WC.wino_input, (x, 1, 1, TH, TW), V),
                          (WC.wino_input_adjoint, (v, 1, 1, TH, TW), back),
                          (WC.wino_output, (m, TH, TW, np.ones(3)), y),
                          (WC.wino_output_adjoint, (g, TH, TW), dm)):
        fn(*args, out)
        serial = out.copy()
        fn(*args, out, parallel=True)
        np.testing.assert_array_equal(out, serial)


@pytest.mark.parametrize("x_shape, w_shape, kw, algorithm", [
    ((8, 64, 56, 56), (64, 64, 3, 3), dict(padding=1), "window"),
    ((2, 128, 28, 28), (128, 128, 3, 3), dict(padding=1), "window"),
    ((2, 256, 14, 14), (256, 256, 3, 3), dict(padding=1), "window"),
    ((32, 32, 32, 32), (32, 32, 3, 3), dict(padding=1), "window"),
    ((32, 16, 32, 32), (32, 16, 3, 3), dict(padding=1), "window"),
    ((32, 3, 32, 32), (16, 3, 3, 3), dict(padding=1), "window"),
    ((8, 3, 224, 224), (64, 3, 7, 7), dict(stride=2, padding=3), "window"),  # strides too
    ((32, 64, 8, 8), (64, 64, 3, 3), dict(padding=1), "window"),  # small maps too
    ((32, 1, 8, 8), (16, 1, 3, 3), dict(padding=1), "window"),  # C = 1: not depthwise
    ((32, 64, 1, 512), (64, 64, 1, 5), dict(padding=(0, 2)), "window"),  # conv1d
    ((32, 64, 1, 512), (64, 64, 1, 5), dict(padding=(0, 5)), "packed"),  # padding > k - 1
    ((32, 64, 1, 512), (64, 64, 1, 5), dict(padding=(0, 2), stride=(1, 2)), "window"),
    ((8, 64, 56, 56), (64, 64, 3, 3), dict(padding=1, stride=2), "window"),
    ((8, 64, 56, 56), (128, 64, 3, 3), dict(padding=1, stride=2), "window"),
    ((8, 64, 56, 56), (128, 64, 3, 3), dict(padding=3, stride=2), "image"),  # K = 128
    ((8, 64, 56, 56), (64, 64, 3, 3), dict(padding=2, dilation=2), "window"),
    ((8, 32, 56, 56), (64, 32, 3, 3), dict(padding=3), "packed"),  # padding > k - 1
    ((8, 64, 56, 56), (64, 32, 3, 3), dict(padding=1, groups=2), "im2col"),
    ((8, 64, 56, 56), (64, 64, 5, 5), dict(padding=2), "window"),
    ((8, 64, 56, 56), (64, 1, 3, 3), dict(padding=1, groups=64), "direct"),
    ((8, 64, 56, 56), (64, 1, 3, 3), dict(stride=2, padding=1, groups=64), "direct"),
    ((8, 64, 56, 56), (128, 1, 3, 3), dict(padding=1, groups=64), "direct"),  # multiplier 2
    ((8, 64, 56, 56), (64, 2, 3, 3), dict(padding=1, groups=32), "im2col"),
    ((8, 64, 56, 56), (256, 64, 1, 1), {}, "pointwise"),
    ((8, 64, 56, 56), (256, 64, 1, 1), dict(stride=2), "window"),
    ((8, 64, 56, 56), (256, 64, 1, 1), dict(padding=1), "image"),
])
def test_cpu_algorithm_by_shape(monkeypatch, x_shape, w_shape, kw, algorithm):
    """The choice, on one thread and on two alike."""
    x = np.zeros(x_shape, np.float32)
    w = np.zeros(w_shape, np.float32)
    for threads in (1, 2):
        monkeypatch.setattr(cpu_threads, "numba_threads", lambda threads=threads: threads)
        assert K.conv2d_forward(x, w, None, **kw)[1].algorithm == algorithm


def test_cpu_algorithm_float64():
    """The window path takes both float types; where it does not fit (padding 3 > k - 1),
    the packed path is chosen for float32 only (float64 panels are 16 pixels wide)."""
    x = np.zeros((4, 16, 32, 32))
    w = np.zeros((32, 16, 3, 3))
    assert K.conv2d_forward(x, w, None, padding=1, stride=2)[1].algorithm == "window"
    assert K.conv2d_forward(x, w, None, padding=3)[1].algorithm == "image"
    x32, w32 = x.astype(np.float32), w.astype(np.float32)
    assert K.conv2d_forward(x32, w32, None, padding=3)[1].algorithm == "packed"


# ---- direct (depthwise) and pointwise (1x1) paths ---------------------------------------------

@given(case=conv_cases())
@example(case=_case(C=3, K=3, groups=3, H=6, W=7, padding=1))  # depthwise
@example(case=_case(C=2, K=4, groups=2, H=7, W=7, stride=(2, 2), padding=(1, 2),
                    dilation=(2, 1), kh=3, kw=2, bias=False, dtype=np.float32))
@example(case=_case(C=4, K=2, groups=2, H=5, W=6, padding="same", layout="transposed"))
@example(case=_case(C=4, K=8, groups=2, H=9, W=11, stride=(2, 3), padding=(2, 1),
                    dilation=(2, 2), kh=3, kw=3, dtype=np.float32))  # 3x3: one pass of taps
def test_direct_matches_twin(case):
    """The direct loops for any groups (the dispatcher runs them for depthwise layers)."""
    assert _check_twin(case, "direct").algorithm == "direct"


@given(N=st.integers(1, 3), C=st.integers(1, 5), K_=st.integers(1, 5), H=st.integers(1, 6),
       W=st.integers(1, 6), dtype=st.sampled_from([np.float32, np.float64]),
       layout=st.sampled_from(["c", "strided", "transposed"]), bias=st.booleans(),
       seed=st.integers(0, 2**16))
def test_pointwise_matches_twin(N, C, K_, H, W, dtype, layout, bias, seed):
    case = _case(N=N, C=C, K=K_, H=H, W=W, kh=1, kw=1, dtype=dtype, layout=layout, bias=bias,
                 seed=seed)
    assert _check_twin(case).algorithm == "pointwise"  # chosen by shape


def _conv2d_matches_torch(torch, x, w, b, dtype, algorithm=None, **kw):
    """F.conv2d(x, w, b, **kw) (on the CPU path ``algorithm`` if given) and its gradients
    against torch's: 1e-4 in float32, 1e-10 in float64."""
    ty, tg, dy = _torch_grads(torch, lambda x, w, b: torch.nn.functional.conv2d(x, w, b, **kw),
                              [x, w, b])
    args = [nk.tensor(a, requires_grad=True) for a in (x, w, b)]
    with _algorithm(algorithm) if algorithm else contextlib.nullcontext():
        y = FC.conv2d(*args, **kw)
    y.backward(dy)
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == np.float32 else dict(rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(y.numpy(), ty, **tol)
    for a, g in zip(args, tg, strict=True):
        np.testing.assert_allclose(a.grad, g, **tol)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kw", [dict(padding=1), dict(stride=2, padding=(1, 0)),
                                dict(padding="same", dilation=(2, 1)), dict(stride=(1, 2))])
@pytest.mark.parametrize("kernel", [(3, 2), (3, 3)])  # 3x3: the nine taps in one pass
@pytest.mark.filterwarnings("ignore:Using padding=.same.")
def test_depthwise_matches_torch(rng, dtype, kw, kernel):
    """Depthwise layers run the direct loops (chosen by shape)."""
    torch = import_torch()
    x = rng.standard_normal((2, 6, 9, 8)).astype(dtype)
    w = rng.standard_normal((6, 1, *kernel)).astype(dtype)
    b = rng.standard_normal(6).astype(dtype)
    _conv2d_matches_torch(torch, x, w, b, dtype, groups=6, **kw)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_pointwise_matches_torch(rng, dtype):
    torch = import_torch()
    x = rng.standard_normal((3, 5, 7, 6)).astype(dtype)
    w = rng.standard_normal((4, 5, 1, 1)).astype(dtype)
    b = rng.standard_normal(4).astype(dtype)
    _conv2d_matches_torch(torch, x, w, b, dtype)


def test_gradcheck_direct_and_pointwise(rng):
    x = rng.standard_normal((2, 3, 6, 5))
    b = rng.standard_normal(3)
    with _algorithm("direct"):
        nk.gradcheck(lambda x, w, b: FC.conv2d(x, w, b, stride=(2, 1), padding=1,
                                               dilation=(1, 2), groups=3),
                     [x, rng.standard_normal((3, 1, 3, 2)), b])
    nk.gradcheck(lambda x, w, b: FC.conv2d(x, w, b), [x, rng.standard_normal((3, 3, 1, 1)), b])


def test_direct_parallel_builds_match_serial(rng):
    x = rng.standard_normal((2, 4, 9, 8))
    w = rng.standard_normal((6, 2, 3, 3))  # groups 2
    geometry = (2, 1, 1, 2, 0, 1, 1, 2)  # sh, sw, pt, pl, pb, pr, dh, dw
    y = np.empty((2, 6, 4, 7))
    outs = []
    for build in ("serial", "parallel"):
        getattr(conv_cpu.direct_forward, build)(x, w, np.ones(6), *geometry, y)
        dy = y.copy()
        dx, dw, db = np.empty_like(x), np.empty_like(w), np.empty(6)
        getattr(conv_cpu.direct_backward_input, build)(dy, w, *geometry, dx)
        getattr(conv_cpu.direct_backward_weight, build)(x, dy, *geometry, dw, db)
        outs.append((y.copy(), dx, dw, db))
    for a, b in zip(*outs, strict=True):
        np.testing.assert_array_equal(a, b)


# ---- im2col + GEMM image by image ------------------------------------------------------------

@given(case=conv_cases())
@example(case=_case(N=2, C=3, K=2, H=6, W=5, stride=(2, 1), padding=(1, 2), dilation=(1, 2)))
def test_image_path_matches_twin(case):
    """Per-image im2col + GEMM (groups 1; other groups fall back to the batch-wide path)."""
    cache = _check_twin(case, "image")
    assert cache.algorithm == ("image" if case["groups"] == 1 else "im2col")


@pytest.mark.parametrize("algorithm", ["image", "packed"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kw", [dict(padding=1), dict(stride=(2, 1), padding=(0, 2),
                                dilation=(2, 1)), dict(padding="same", dilation=2)])
@pytest.mark.filterwarnings("ignore:Using padding=.same.")
def test_image_and_packed_paths_match_torch(rng, algorithm, dtype, kw):
    torch = import_torch()
    x = rng.standard_normal((3, 4, 19, 18)).astype(dtype)
    w = rng.standard_normal((5, 4, 3, 2)).astype(dtype)
    b = rng.standard_normal(5).astype(dtype)
    _conv2d_matches_torch(torch, x, w, b, dtype, algorithm, **kw)


def test_gradcheck_image_path(rng):
    x = rng.standard_normal((2, 3, 6, 5))
    with _algorithm("image"):
        nk.gradcheck(lambda x, w, b: FC.conv2d(x, w, b, stride=(2, 1), padding=1,
                                               dilation=(1, 2)),
                     [x, rng.standard_normal((4, 3, 2, 3)), rng.standard_normal(4)])
        nk.gradcheck(lambda x, w: FC.conv1d(x, w, stride=2, padding=2),
                     [rng.standard_normal((2, 3, 9)), rng.standard_normal((2, 3, 4))])


@pytest.mark.parametrize("algorithm", ["image", "packed", "winograd", "pointwise"])
def test_runs_of_images_on_threads_match_one_run(rng, algorithm):
    """The pointwise, per-image (image, packed) and Winograd paths split the batch over
    numba's threads (one Python thread each, numpy's BLAS on one thread): the same y and dx
    as one run of the whole batch (bit for bit: each image is computed alike), dweight up
    to the order of its sum."""
    import numba

    x = rng.standard_normal((5, 4, 17, 16))
    k = 1 if algorithm == "pointwise" else 3
    w = rng.standard_normal((6, 4, k, k))
    dy = rng.standard_normal((5, 6, 17, 16))
    results = []
    threads = numba.get_num_threads()
    with _algorithm(algorithm):
        for n in (1, max(2, threads)):
            if n > numba.config.NUMBA_NUM_THREADS:
                pytest.skip("numba has a single thread here")
            numba.set_num_threads(n)
            try:
                y, cache = K.conv2d_forward(x, w, None, 1, k // 2)
                assert cache.algorithm == algorithm
                assert len(cpu_threads.image_chunks(5)) == n
                results.append((y, *K.conv2d_backward(dy, cache)[:2]))
            finally:
                numba.set_num_threads(threads)
    (y1, dx1, dw1), (y2, dx2, dw2) = results
    np.testing.assert_array_equal(y1, y2)
    np.testing.assert_array_equal(dx1, dx2)
    np.testing.assert_allclose(dw1, dw2, rtol=1e-12, atol=1e-12 * np.abs(dw1).max())


# ---- implicit GEMM on the packed C kernel -----------------------------------------------------

@given(case=conv_cases(), block=st.sampled_from([1, 4096, 1 << 20]))
@example(case=_case(N=2, C=3, K=5, H=9, W=40, padding=(1, 2)), block=1)  # panels straddle rows
@example(case=_case(N=2, C=2, K=9, H=11, W=13, kh=3, kw=2, stride=(2, 3), padding=(3, 1),
                    dilation=(1, 2), dtype=np.float32, layout="transposed"), block=1)
def test_packed_path_matches_twin(case, block):
    """The packed forward (groups 1; other groups fall back to the batch-wide path), with
    blocks of one panel, a few panels, or the whole image (one block then writes y[n]
    directly; more go through the block buffer), float32 and float64 (panels of 32 and 16
    pixels)."""
    default, cpu_images.PACKED_BLOCK_BYTES = cpu_images.PACKED_BLOCK_BYTES, block
    try:
        cache = _check_twin(case, "packed")
    finally:
        cpu_images.PACKED_BLOCK_BYTES = default
    assert cache.algorithm == ("packed" if case["groups"] == 1 else "im2col")


def test_gradcheck_packed_path(rng):
    with _algorithm("packed"):
        nk.gradcheck(lambda x, w, b: FC.conv2d(x, w, b, stride=(2, 1), padding=1,
                                               dilation=(1, 2)),
                     [rng.standard_normal((2, 3, 6, 5)), rng.standard_normal((4, 3, 2, 3)),
                      rng.standard_normal(4)])
        nk.gradcheck(lambda x, w: FC.conv1d(x, w, padding=2),
                     [rng.standard_normal((2, 3, 9)), rng.standard_normal((2, 3, 4))])


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is POSIX-only")
def test_runs_of_images_work_in_a_forked_child(rng):
    """The worker threads of the per-image paths do not survive fork(): a child gets its own
    pool (with the parent's it would wait forever)."""
    x = rng.standard_normal((4, 3, 16, 16))
    w = rng.standard_normal((2, 3, 3, 3))
    with _algorithm("image"):
        want = K.conv2d_forward(x, w, None, 1, 1)[0]  # the parent's pool exists now
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report, then leave without running pytest's teardown
            ok = 0
            try:
                import numba

                numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
                ok = int(np.array_equal(K.conv2d_forward(x, w, None, 1, 1)[0], want))
            finally:
                os.write(write, bytes([ok]))
                os._exit(0)
        os.close(write)
        import select
        import signal

        ready = select.select([read], [], [], 60)[0]  # a child stuck on dead workers: fail
        if not ready:
            os.kill(pid, signal.SIGKILL)
        status = os.waitpid(pid, 0)[1]
        assert ready, "the forked child's convolution did not finish in 60 s"
        assert os.read(read, 1) == b"\x01" and status == 0
