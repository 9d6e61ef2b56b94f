"""The "window" convolution path (nnkit._ext.conv_window, stride 1, padding <= (k - 1) d):
forced through conv2d against the naive twin (hypothesis), every ISA build of the C kernels
against each other, torch (values and gradients), gradcheck through autograd, the Python
boundary of the extension (bad arguments raise ValueError, never crash) and the dispatcher."""

import os
import signal
import time

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from test_conv import _algorithm, _check_twin, _make_inputs  # the conv tests' helpers

import nnkit as nk
from nnkit._ext import conv_window as CW
from nnkit.functional import conv as FC
from nnkit.kernels import conv as K
from nnkit.kernels.conv import algorithms, cpu_window
from nnkit.kernels.reference import conv as R

FLOATS = [np.float32, np.float64]
WORK = 100_000  # multiply-adds a twin example may cost (the twin is Python loops)


def _out(case):
    """(Ho, Wo) of ``case``."""
    (pt, pb, pl, pr), (dh, dw), (sh, sw) = case["pads"], case["dilation"], case["stride"]
    return ((case["H"] + pt + pb - dh * (case["kh"] - 1) - 1) // sh + 1,
            (case["W"] + pl + pr - dw * (case["kw"] - 1) - 1) // sw + 1)


@st.composite
def window_cases(draw, work=WORK):
    """An ungrouped conv2d the window path takes: kernel 1-5, dilation 1-3, stride 1 (half
    the cases) or 1-3, each padding in 0 .. (k - 1) d, H, W up to 12 (more only where the
    kernel needs it), K up to 40, C up to 20 within ``work`` multiply-adds, a C-contiguous
    or a strided/transposed x."""
    kh, kw = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    dh, dw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    pt, pb = (draw(st.integers(0, (kh - 1) * dh)) for _ in range(2))
    pl, pr = (draw(st.integers(0, (kw - 1) * dw)) for _ in range(2))
    need_h, need_w = max(1, dh * (kh - 1) + 1 - pt - pb), max(1, dw * (kw - 1) + 1 - pl - pr)
    H, W = draw(st.integers(need_h, max(need_h, 12))), draw(st.integers(need_w, max(need_w, 12)))
    stride = (1, 1) if draw(st.booleans()) else (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    Ho, Wo = _out(dict(H=H, W=W, kh=kh, kw=kw, pads=(pt, pb, pl, pr), dilation=(dh, dw),
                       stride=stride))
    N, Kout = draw(st.integers(1, 3)), draw(st.integers(1, 40))
    C = draw(st.integers(1, max(1, min(20, work // (N * Kout * Ho * Wo * kh * kw)))))
    return dict(N=N, C=C, H=H, W=W, K=Kout, kh=kh, kw=kw, pads=(pt, pb, pl, pr),
                dilation=(dh, dw), stride=stride, dtype=draw(st.sampled_from(FLOATS)),
                layout=draw(st.sampled_from(["c", "strided", "transposed"])),
                bias=draw(st.booleans()), seed=draw(st.integers(0, 2**16)))


def _case(**kw):
    base = dict(N=2, C=3, H=5, W=6, K=1, kh=3, kw=3, pads=(1, 1, 1, 1), dilation=(1, 1),
                stride=(1, 1), dtype=np.float32, layout="c", bias=True, seed=0)
    base.update(kw)
    return base


def _inputs(case):
    """x (C-contiguous, strided or transposed), w, b (or None) and the rng, as test_conv's."""
    return _make_inputs(dict(case, groups=1))


# ---- the naive twin ----------------------------------------------------------------------

@given(case=window_cases())
@example(case=_case(K=40, C=2, H=4, W=5, dtype=np.float32))  # 2 float32 panels, 8-row tail 0
@example(case=_case(K=37, C=1, H=3, W=7, kh=2, kw=5, pads=(0, 1, 4, 0), layout="transposed"))
@example(case=_case(K=19, C=2, H=6, W=3, dtype=np.float64, pads=(0, 2, 2, 1), bias=False))
@example(case=_case(K=5, C=20, H=2, W=2, kh=5, kw=5, dilation=(3, 3), pads=(12, 0, 0, 12)))
@example(case=_case(K=1, C=1, H=1, W=1, kh=1, kw=1, pads=(0, 0, 0, 0), N=1))
@example(case=_case(K=9, C=3, H=11, W=12, kh=3, kw=3, stride=(2, 2), pads=(1, 0, 1, 1)))
@example(case=_case(K=33, C=2, H=12, W=12, kh=5, kw=4, stride=(3, 2), dilation=(2, 1),
                    pads=(8, 3, 0, 3), dtype=np.float64, layout="strided"))
def test_window_matches_twin(case):
    """Forced window path: y, dx, dweight, dbias equal the naive twin (asymmetric padding,
    strides through the phase planes, K over several accumulator panels and 8-row tiles,
    non-contiguous x, batch split over the worker threads)."""
    cache = _check_twin(dict(case, groups=1, padding=case["pads"]), "window")
    assert cache.algorithm == "window"


# ---- every ISA build -----------------------------------------------------------------------

def _direct_args(case):
    """The conv_window arguments of ``case``: x, wp, bias, dy, wfp and the geometry."""
    x, w, b, rng = _inputs(case)
    x = np.ascontiguousarray(x)
    Kout, C, kh, kw = w.shape
    pt, _, pl, _ = case["pads"]
    (dh, dw), (_, _, H, W) = case["dilation"], x.shape
    Ho, Wo = _out(case)
    wp = cpu_window.pack(w.reshape(Kout, -1))
    wfp = cpu_window.pack(np.ascontiguousarray(
        w[:, :, ::-1, ::-1].transpose(1, 0, 2, 3)).reshape(C, -1))
    dy = rng.uniform(-1, 1, (x.shape[0], Kout, Ho, Wo)).astype(x.dtype)
    return x, wp, b, dy, wfp, (C, H, W, Kout, kh, kw, pt, pl, dh, dw, Ho, Wo, *case["stride"])


def _run_isa(case, isa, threads=1):
    """(y, dx, dW^T, db) from the ISA level ``isa`` on ``threads`` runs of images (the
    runs' parts of dW^T and db added up; the valid rows and columns of dW^T)."""
    x, wp, b, dy, wfp, g = _direct_args(case)
    R_, Kout = g[0] * g[4] * g[5], g[3]
    y = np.empty_like(dy)
    CW.forward(x, wp, b, y, g, threads, isa)
    dx = np.empty_like(x) if case["stride"] == (1, 1) else None  # dx: stride 1 only
    acc = np.zeros(CW.accumulator_shape(g, x.dtype, threads), x.dtype)
    db = np.zeros((threads, Kout))
    CW.backward(x, dy, wfp, dx, acc, db, g, threads, isa)
    return y, dx, acc.sum(axis=0)[:R_, :Kout], db.sum(axis=0)


def _agree(actual, expected, tol, msg):
    """Equal up to ``tol`` of expected's largest entry (both None: dx of a strided layer)."""
    if expected is None:
        assert actual is None, msg
        return
    np.testing.assert_allclose(actual, expected, rtol=tol,
                               atol=tol * max(1.0, np.abs(expected).max()), err_msg=msg)


@given(case=window_cases(work=400_000))
@example(case=_case(K=40, C=7, H=9, W=11, kh=3, kw=2, dtype=np.float32))
@example(case=_case(K=21, C=9, H=12, W=12, kh=5, kw=4, pads=(4, 0, 1, 3), dtype=np.float64))
def test_every_isa_build_agrees(case):
    """conv_window.forward/backward of every instruction set this CPU runs (baseline, AVX2,
    AVX-512: 4- and 8-row tiles, FMA or not) give the same y, dx and dweight up to a few
    roundings: 1e-6 (float32) / 1e-13 (float64) of the output's largest entry."""
    tol = 1e-6 if case["dtype"] == np.float32 else 1e-13
    first = _run_isa(case, 0)
    for isa in range(1, CW.CPU_LEVEL + 1):
        for name, a, e in zip(("y", "dx", "dweight", "dbias"), _run_isa(case, isa), first,
                              strict=True):
            _agree(a, e, tol, f"{name}: isa {isa} vs baseline")


@given(case=window_cases(work=400_000), threads=st.integers(2, 5))
def test_runs_of_images_agree(case, threads):
    """The batch split into 2-5 runs of images (C threads; more runs than images too): y and
    dx as from one run, dweight and dbias (the runs' parts added) up to rounding."""
    one, split = _run_isa(case, -1), _run_isa(case, -1, threads)
    tol = 1e-6 if case["dtype"] == np.float32 else 1e-13
    for name, a, e in zip(("y", "dx", "dweight", "dbias"), split, one, strict=True):
        _agree(a, e, tol, f"{name}: {threads} runs vs one")


def test_isa_names_cover_the_levels():
    """isa_names lists one build per level 0 .. CPU_LEVEL, the baseline first."""
    assert CW.AVAILABLE
    names = CW.isa_names()
    assert len(names) == CW.CPU_LEVEL + 1 and names[0] == "baseline"


# ---- torch ---------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("x_shape, Kout, kernel, kw", [
    ((2, 3, 32, 32), 16, (3, 3), dict(padding=1)),  # the benchmark shapes, smaller batches
    ((2, 16, 32, 32), 32, (3, 3), dict(padding=1)),
    ((1, 64, 56, 56), 64, (3, 3), dict(padding=1)),
    ((3, 5, 11, 9), 37, (3, 3), dict(padding=2, dilation=2)),
    ((2, 4, 7, 10), 9, (2, 4), dict(padding="same")),  # asymmetric: bottom/right pad more
    ((2, 6, 8, 8), 12, (5, 1), dict(padding=(0, 0))),
])
@pytest.mark.parametrize("needs", [(True, True, True), (False, True, True),
                                   (True, False, False), (False, False, True)],
                         ids=["all", "no-input-grad", "no-weight-grad", "bias-only"])
@pytest.mark.filterwarnings("ignore:Using padding=.same.")
def test_window_matches_torch(rng, dtype, x_shape, Kout, kernel, kw, needs):
    """y, dx, dweight, dbias equal torch's conv2d on the window path, with dx, dweight or
    dbias skipped (None) when not needed."""
    torch = pytest.importorskip("torch")
    x = rng.standard_normal(x_shape).astype(dtype)
    w = rng.standard_normal((Kout, x_shape[1], *kernel)).astype(dtype)
    b = rng.standard_normal(Kout).astype(dtype)
    ts = [torch.tensor(a, requires_grad=True) for a in (x, w, b)]
    ty = torch.nn.functional.conv2d(*ts, **kw)
    dy = rng.standard_normal(tuple(ty.shape)).astype(dtype)
    ty.backward(torch.tensor(dy))
    with _algorithm("window"):
        y, cache = K.conv2d_forward(x, w, b, **kw)
    assert cache.algorithm == "window"
    grads = K.conv2d_backward(dy, cache, needs)
    tol = dict(rtol=1e-4, atol=1e-3) if dtype == np.float32 else dict(rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(y, ty.detach().numpy(), **tol)
    for name, got, t, want in zip(("dx", "dweight", "dbias"), grads, ts, needs, strict=True):
        if want:
            np.testing.assert_allclose(got, t.grad.numpy(), err_msg=name, **tol)
        else:
            assert got is None, name


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("kw", [dict(padding=2), dict(padding=3, dilation=2),
                                dict(padding="same")])
@pytest.mark.filterwarnings("ignore:Using padding=.same.")
def test_conv1d_window_matches_torch(rng, dtype, kw):
    """conv1d (a 1 x k conv2d) with padding <= k - 1 takes the window path and equals
    torch's conv1d, gradients included."""
    torch = pytest.importorskip("torch")
    x = rng.standard_normal((3, 5, 17)).astype(dtype)
    w = rng.standard_normal((11, 5, 4)).astype(dtype)
    b = rng.standard_normal(11).astype(dtype)
    ts = [torch.tensor(a, requires_grad=True) for a in (x, w, b)]
    ty = torch.nn.functional.conv1d(*ts, **kw)
    dy = rng.standard_normal(tuple(ty.shape)).astype(dtype)
    ty.backward(torch.tensor(dy))
    y, cache = K.conv1d_forward(x, w, b, **kw)
    assert cache.algorithm == "window"
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == np.float32 else dict(rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(y, ty.detach().numpy(), **tol)
    for got, t in zip(K.conv1d_backward(dy, cache), ts, strict=True):
        np.testing.assert_allclose(got, t.grad.numpy(), **tol)


# ---- gradcheck -----------------------------------------------------------------------------

def test_gradcheck_window(rng, monkeypatch):
    """Central differences through nnkit's autograd agree with the window path's backward
    (float64, asymmetric 'same' padding and dilation); the path is counted, so it ran."""
    calls = []
    forward = cpu_window.forward
    monkeypatch.setattr(cpu_window, "forward", lambda *a: calls.append(1) or forward(*a))
    x, b = rng.standard_normal((2, 3, 5, 6)), rng.standard_normal(10)
    w, w2 = rng.standard_normal((10, 3, 2, 3)), rng.standard_normal((4, 3, 2, 2))
    with _algorithm("window"):
        nk.gradcheck(lambda x, w, b: FC.conv2d(x, w, b, padding=1, dilation=(1, 2)), [x, w, b])
        nk.gradcheck(lambda x, w: FC.conv2d(x, w, padding="same", dilation=2), [x, w2])
        nk.gradcheck(lambda x, w: FC.conv2d(x, w, stride=(2, 3), padding=1), [x, w2])
    assert calls


# ---- the Python boundary of nnkit._ext.conv_window -----------------------------------------

def _valid(dtype=np.float64):
    """A valid forward/backward call's arguments: N 2, C 3, 4x5 -> K 9, 2x3 kernel, pads
    (1, 2), dilation (1, 2), stride 1, so Ho, Wo = 5, 5."""
    g = (3, 4, 5, 9, 2, 3, 1, 2, 1, 2, 5, 5, 1, 1)
    nr = CW.NR[np.dtype(dtype)]
    z = lambda *shape: np.zeros(shape, dtype)  # noqa: E731
    return dict(x=z(2, 3, 4, 5), wp=z(2, 18, 8), bias=z(9), y=z(2, 9, 5, 5), dy=z(2, 9, 5, 5),
                wfp=z(1, 54, 8), dx=z(2, 3, 4, 5), acc=z(1, 24, nr), db=np.zeros((1, 9)),
                geometry=g, threads=1)


def _call(kind, a, isa=-1):
    if kind == "forward":
        CW.forward(a["x"], a["wp"], a["bias"], a["y"], a["geometry"], a["threads"], isa)
    else:
        CW.backward(a["x"], a["dy"], a["wfp"], a["dx"], a["acc"], a["db"], a["geometry"],
                    a["threads"], isa)


def test_input_gradient_of_a_strided_layer_is_a_value_error():
    """backward computes dx for stride 1 only (a strided layer's dx is no stride-1
    convolution of dy); with dx None the weight gradient of a strided layer runs."""
    a = _valid()
    a["geometry"] = (*_G[:10], 3, 5, 2, 1)  # stride (2, 1): Ho = (4 + 1 + 1 - 1 - 1) // 2 + 1
    a["dy"] = np.zeros((2, 9, 3, 5))
    with pytest.raises(ValueError, match="stride 1"):
        _call("backward", a)
    a["dx"] = None
    _call("backward", a)


def test_valid_boundary_call_runs():
    """The baseline of the fuzz below: _valid()'s arguments run both kernels at every level."""
    for dtype in FLOATS:
        for isa in range(-1, CW.CPU_LEVEL + 1):
            _call("forward", _valid(dtype), isa)
            _call("backward", _valid(dtype), isa)


def _replace(**changes):
    return lambda a: a.update({k: (v(a) if callable(v) else v) for k, v in changes.items()})


_G = _valid()["geometry"]
_BAD = {  # name -> (kinds it applies to, the change to _valid()'s arguments)
    "x-float16": ("fb", _replace(x=lambda a: a["x"].astype(np.float16))),
    "x-int": ("fb", _replace(x=lambda a: a["x"].astype(np.int64))),
    "wp-float32": ("f", _replace(wp=lambda a: a["wp"].astype(np.float32))),
    "bias-float32": ("f", _replace(bias=lambda a: a["bias"].astype(np.float32))),
    "y-float32": ("f", _replace(y=lambda a: a["y"].astype(np.float32))),
    "dy-float32": ("b", _replace(dy=lambda a: a["dy"].astype(np.float32))),
    "dx-int": ("b", _replace(dx=lambda a: a["dx"].astype(np.int64))),
    "acc-float32": ("b", _replace(acc=lambda a: a["acc"].astype(np.float32))),
    "x-transposed": ("fb", _replace(x=lambda a: np.zeros((5, 4, 3, 2)).T)),
    "y-strided": ("f", _replace(y=lambda a: np.zeros((2, 9, 5, 10))[..., ::2])),
    "wp-strided": ("f", _replace(wp=lambda a: np.zeros((2, 18, 16))[..., ::2])),
    "dy-strided": ("b", _replace(dy=lambda a: np.zeros((2, 9, 5, 10))[..., ::2])),
    "acc-fortran": ("b", _replace(acc=lambda a: np.asfortranarray(a["acc"]))),
    "x-short": ("fb", _replace(x=lambda a: a["x"][:, :, :3].copy())),
    "wp-short": ("f", _replace(wp=lambda a: a["wp"][:1].copy())),
    "y-short": ("f", _replace(y=lambda a: a["y"][:, :8].copy())),
    "bias-long": ("f", _replace(bias=lambda a: np.zeros(10))),
    "dy-short": ("b", _replace(dy=lambda a: a["dy"][:, :, :4].copy())),
    "dx-short": ("b", _replace(dx=lambda a: a["dx"][:1].copy())),
    "wfp-short": ("b", _replace(wfp=lambda a: a["wfp"][:, :53].copy())),
    "acc-short": ("b", _replace(acc=lambda a: a["acc"][:, :16].copy())),
    "acc-one-run-of-two": ("b", _replace(threads=2)),  # acc and db hold one run's parts
    "db-float32": ("b", _replace(db=lambda a: a["db"].astype(np.float32))),
    "db-short": ("b", _replace(db=lambda a: a["db"][:, :8].copy())),
    "wfp-none": ("b", _replace(wfp=None)),
    "geometry-11": ("fb", _replace(geometry=_G[:11])),
    "geometry-12": ("fb", _replace(geometry=_G[:12])),  # no strides
    "geometry-15": ("fb", _replace(geometry=(*_G, 1))),
    "sh-zero": ("fb", _replace(geometry=(*_G[:12], 0, 1))),
    "sw-negative": ("fb", _replace(geometry=(*_G[:13], -2))),
    "stride-too-large-for-Ho": ("fb", _replace(geometry=(*_G[:12], 2, 1))),  # Ho 5 > 3
    "C-zero": ("fb", _replace(geometry=(0, *_G[1:]))),
    "K-negative": ("fb", _replace(geometry=(*_G[:3], -9, *_G[4:]))),
    "kh-zero": ("fb", _replace(geometry=(*_G[:4], 0, *_G[5:]))),
    "pt-negative": ("fb", _replace(geometry=(*_G[:6], -1, *_G[7:]))),
    "dw-zero": ("fb", _replace(geometry=(*_G[:9], 0, *_G[10:]))),
    "Wo-zero": ("fb", _replace(geometry=(*_G[:11], 0, *_G[12:]))),
    "pt-over": ("fb", _replace(geometry=(*_G[:6], 2, *_G[7:]))),  # 2 > (kh - 1) dh = 1
    "pl-over": ("fb", _replace(geometry=(*_G[:7], 5, *_G[8:]))),  # 5 > (kw - 1) dw = 4
    "Ho-bottom-over": ("fb", _replace(geometry=(*_G[:10], 6, 5, 1, 1))),  # bottom pad 2 > 1
    "Ho-too-small": ("fb", _replace(geometry=(*_G[:10], 3, 5, 1, 1))),  # bottom pad -1
    "Wo-right-over": ("fb", _replace(geometry=(*_G[:11], 8, 1, 1))),  # right pad 5 > 4
    "K-past-int64": ("fb", _replace(geometry=(*_G[:4], 2**70, *_G[5:]))),
    "kh-huge": ("fb", _replace(geometry=(*_G[:4], 2**40, *_G[5:]))),
    "threads-zero": ("fb", _replace(threads=0)),
    "threads-negative": ("fb", _replace(threads=-1)),
    "threads-float": ("fb", _replace(threads=1.0)),
    "threads-past-max": ("fb", _replace(threads=10**6)),
    "x-list": ("fb", _replace(x=lambda a: a["x"].tolist())),
    "x-0d": ("fb", _replace(x=np.zeros(()))),
    "x-3d": ("fb", _replace(x=lambda a: a["x"].reshape(6, 4, 5))),
    "isa-beyond": ("fb", None),
}


@pytest.mark.parametrize("kind, bad", [(kind, bad) for bad in sorted(_BAD)
                                       for kind in ("forward", "backward")
                                       if kind[0] in _BAD[bad][0]])
def test_bad_arguments_raise_value_error(kind, bad):
    """Each wrong type, dtype, layout, size, geometry, thread count or ISA level is a
    ValueError (the C kernels read and write with no bounds checks)."""
    change = _BAD[bad][1]
    a = _valid()
    isa = CW.CPU_LEVEL + 1 if change is None else -1
    if change is not None:
        change(a)
    with pytest.raises(ValueError):
        _call(kind, a, isa)


@given(geometry=st.lists(st.integers(-2, 6), min_size=13, max_size=15).map(tuple),
       sizes=st.lists(st.integers(0, 40), min_size=7, max_size=7),
       N=st.integers(0, 2), threads=st.integers(-1, 3),
       dtype=st.sampled_from([np.float64, np.float32, np.float16]),
       kind=st.sampled_from(["forward", "backward"]), bias=st.booleans())
@example(geometry=_G, sizes=[120, 288, 9, 450, 432, 120, 384], N=2, threads=1,
         dtype=np.float64, kind="forward", bias=True)  # _valid()'s sizes: runs
@example(geometry=_G, sizes=[120, 288, 9, 450, 432, 120, 384], N=2, threads=1,
         dtype=np.float64, kind="backward", bias=False)
def test_fuzzed_geometry_runs_or_raises_value_error(geometry, sizes, N, threads, dtype, kind,
                                                    bias):
    """Random (mostly inconsistent) geometries with tiny arrays of random sizes: the call
    works or raises ValueError, nothing else (and no crash)."""
    x, wp, b, y, wfp, dx, acc = (np.zeros(s, dtype) for s in sizes)
    C, H, W = (geometry[:3] if len(geometry) == 12 and min(geometry[:3]) > 0 else (-1, 1, 1))
    fits = N and x.size == N * C * H * W
    x = x.reshape(N, C, H, W) if fits else x.reshape(1, -1, 1, 1)  # (N, C, H, W) where it can
    a = dict(x=x, wp=wp, bias=b if bias else None, y=y, dy=y, wfp=wfp,
             dx=dx, acc=acc, db=np.zeros((max(threads, 1), len(b))) if bias else None,
             geometry=geometry, threads=threads)
    try:
        _call(kind, a)
    except ValueError:
        pass


# ---- the dispatcher ------------------------------------------------------------------------

@pytest.mark.parametrize("kernel, stride, pads, dilation, groups, fits", [
    ((3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), 1, True),
    ((3, 3), (1, 1), ((2, 2), (2, 2)), (1, 1), 1, True),  # (k - 1) d exactly
    ((3, 3), (2, 2), ((1, 1), (1, 1)), (1, 1), 1, True),  # strides: the phase planes
    ((7, 7), (2, 2), ((3, 3), (3, 3)), (1, 1), 1, True),
    ((3, 3), (2, 2), ((3, 3), (3, 3)), (1, 1), 1, False),
    ((3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), 2, False),  # groups 2
    ((3, 3), (1, 1), ((3, 0), (0, 0)), (1, 1), 1, False),  # top over (k - 1) d
    ((3, 3), (1, 1), ((0, 3), (0, 0)), (1, 1), 1, False),  # bottom
    ((3, 3), (1, 1), ((0, 0), (3, 0)), (1, 1), 1, False),  # left
    ((3, 3), (1, 1), ((0, 0), (0, 3)), (1, 1), 1, False),  # right
    ((3, 3), (1, 1), ((0, 0), (0, 3)), (1, 2), 1, True),  # dilation makes room
    ((1, 1), (1, 1), ((0, 0), (1, 0)), (1, 1), 1, False),  # 1x1: no padding at all
])
def test_window_fits(kernel, stride, pads, dilation, groups, fits):
    """window_fits: ungrouped, every padding within 0 .. (k - 1) d (any stride)."""
    assert algorithms.window_fits(kernel, stride, pads, dilation, groups) is fits


def test_forcing_window_where_it_does_not_fit_falls_back(rng):
    """ALGORITHM = 'window' on a grouped or over-padded layer runs im2col (and is right)."""
    x = rng.standard_normal((1, 2, 6, 6))
    grouped, full = rng.standard_normal((4, 1, 3, 3)), rng.standard_normal((3, 2, 3, 3))
    with _algorithm("window"):
        for w, kw in ((grouped, dict(groups=2, padding=1)), (full, dict(stride=2, padding=3))):
            y, cache = K.conv2d_forward(x, w, **kw)
            assert cache.algorithm == "im2col"
            np.testing.assert_allclose(y, R.conv2d(x, w, None, **kw), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("k, padding, algorithm", [
    (3, 0, "window"), (3, 2, "window"), (5, "same", "window"), (3, 3, "im2col")])
def test_conv1d_dispatch(rng, k, padding, algorithm):
    """conv1d with padding <= k - 1 takes the window path by default; more padding does not."""
    x, w = rng.standard_normal((2, 3, 9)), rng.standard_normal((4, 3, k))
    _, cache = K.conv1d_forward(x, w, padding=padding)
    assert cache.algorithm == algorithm


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX-only")
def test_forked_child_runs_the_threaded_kernels(rng):
    """A child forked after the parent ran the kernels on C worker threads has none of those
    threads: it starts its own (part_threads.h's fork handler) and gets the same numbers."""
    x, w = rng.standard_normal((4, 3, 8, 8)), rng.standard_normal((5, 3, 3, 3))
    g = (3, 8, 8, 5, 3, 3, 1, 1, 1, 1, 8, 8, 1, 1)
    wp, y = cpu_window.pack(w.reshape(5, -1)), np.empty((4, 5, 8, 8))
    CW.forward(x, wp, None, y, g, 3)
    pid = os.fork()
    if pid == 0:  # the child: exit status 0 only if the threaded run agrees
        try:
            again = np.empty_like(y)
            CW.forward(x, wp, None, again, g, 3)
            os._exit(0 if np.array_equal(again, y) else 1)
        finally:
            os._exit(2)
    for _ in range(600):  # a child waiting for workers it does not have would hang: 60 s
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.1)
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("the forked child hung in the threaded kernel")
    assert os.waitstatus_to_exitcode(status) == 0
    np.testing.assert_allclose(y, R.conv2d(x, w, None, 1, 1), rtol=1e-12, atol=1e-12)


def test_threads_without_spinning_agree(rng):
    """With the spin before sleeping at 0 (every hand-off through the condition variables),
    two and three runs of images give one run's y; set_spin returns the previous value and
    refuses a negative one."""
    x, w = rng.standard_normal((5, 3, 9, 8)), rng.standard_normal((11, 3, 3, 2))
    g = (3, 9, 8, 11, 3, 2, 1, 1, 1, 1, 9, 9, 1, 1)
    wp, one = cpu_window.pack(w.reshape(11, -1)), np.empty((5, 11, 9, 9))
    CW.forward(x, wp, None, one, g, 1)
    before = CW.set_spin(0)
    try:
        assert CW.set_spin(0) == 0
        for threads in (2, 3):
            for _ in range(20):
                y = np.empty_like(one)
                CW.forward(x, wp, None, y, g, threads)
                np.testing.assert_array_equal(y, one)
    finally:
        CW.set_spin(before)
    with pytest.raises(ValueError, match="ns"):
        CW.set_spin(-1)
