"""The linear scan (kernels, F.linear_scan) against its sequential twin; gradients; bad input;
the linear-recurrent layers (MinGRU, MinLSTM, LRU)."""

import contextlib
import ctypes
import itertools
import math
import sys
import types

import numpy as np
import pytest
from helpers import run_simulator_cases, simulator_outcomes, tolerance
from hypothesis import example, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import nnkit as nk
from nnkit._ext import scan_cpu
from nnkit._ext import scan_rows as scan_rows_c
from nnkit.functional.scan import linear_scan
from nnkit.kernels import scan as K
from nnkit.kernels.reference import scan as R
from nnkit.nn.linear_recurrent import LRU, MinGRU, MinLSTM

DTYPES = (np.float32, np.float64, np.complex64, np.complex128)
PRIMES = (2, 3, 5, 7, 11, 13, 17, 31, 61)


def _draw(rng, shape, dtype, scale=1.0):
    x = rng.standard_normal(shape) * scale
    if np.dtype(dtype).kind == "c":
        x = x + 1j * rng.standard_normal(shape) * scale
    return x.astype(dtype)


def _problem(seed, B, T, D, dtype):
    """a inside the unit disc (|a| < 0.95), b and h0 standard normal."""
    rng = np.random.default_rng(seed)
    a = _draw(rng, (B, T, D), dtype, 0.5)
    a = (a / np.maximum(1.0, np.abs(a) / 0.95)).astype(dtype)
    return a, _draw(rng, (B, T, D), dtype), _draw(rng, (B, D), dtype), _draw(rng, (B, T, D), dtype)


def _factor(T):
    return 64 + 8 * T  # rounding grows with the chain length


def assert_matches_reference(actual, expected, factor=64.0, err_msg=""):
    """Same shape and dtype as the twin, values within ``factor`` ulps (complex compared
    as complex, not cast to real)."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape and actual.dtype == expected.dtype, err_msg
    np.testing.assert_allclose(actual, expected, err_msg=err_msg,
                               **tolerance(actual.dtype, factor))


# ---- forward and backward against the twin ----------------------------------------------------

@given(B=st.integers(0, 4), T=st.one_of(st.sampled_from((0, 1) + PRIMES), st.integers(1, 40)),
       D=st.integers(0, 5), dtype=st.sampled_from(DTYPES), reverse=st.booleans(),
       with_h0=st.booleans(), seed=st.integers(0, 2**16))
@example(B=1, T=1, D=1, dtype=np.complex64, reverse=True, with_h0=True, seed=0)
def test_scan_matches_twin(B, T, D, dtype, reverse, with_h0, seed):
    a, b, h0, dh = _problem(seed, B, T, D, dtype)
    h0 = h0 if with_h0 else None
    h, cache = K.linear_scan_forward(a, b, h0, reverse)
    want_h, twin_cache = R.linear_scan_forward(a, b, h0, reverse)
    assert_matches_reference(h, want_h, factor=_factor(T))
    got = K.linear_scan_backward(dh, cache)
    want = R.linear_scan_backward(dh, twin_cache)
    for name, g, w in zip(("da", "db", "dh0"), got, want, strict=True):
        assert_matches_reference(g, w, factor=_factor(T), err_msg=name)


@given(B=st.integers(1, 3), T=st.integers(1, 80),
       n_chunks=st.integers(1, 40), lanes=st.integers(1, 9), dtype=st.sampled_from(DTYPES),
       reverse=st.booleans(), seed=st.integers(0, 2**16))
@example(B=1, T=17, n_chunks=17, lanes=8, dtype=np.float64, reverse=False, seed=1)
# more chunks than steps: empty chunks
@example(B=1, T=5, n_chunks=40, lanes=3, dtype=np.float32, reverse=True, seed=2)
def test_chunked_scan_matches_twin(B, T, n_chunks, lanes, dtype, reverse, seed):
    """The chunked path at every chunk boundary: chunks of 0, 1 and uneven lengths."""
    a, b, h0, dh = _problem(seed, B, T, 1, dtype)
    h = scan_cpu.scan_chunked(a, b, h0, np.empty_like(a), reverse, n_chunks, lanes)
    assert_matches_reference(h, R.linear_scan(a, b, h0, reverse), factor=_factor(T))
    got = scan_cpu.backward_chunked(dh, a, h, h0, np.empty_like(a), np.empty_like(a),
                                    np.empty_like(h0), reverse, n_chunks, lanes)
    for g, w in zip(got, R.linear_scan_backward(dh, (a, h, h0, reverse)), strict=True):
        assert_matches_reference(g, w, factor=_factor(T))


@pytest.mark.parametrize("dtype", DTYPES)
def test_plan_switches_to_chunks_for_one_long_sequence(dtype, monkeypatch):
    monkeypatch.setattr(scan_cpu, "CHUNK_MIN_T", 64)
    monkeypatch.setattr(scan_cpu, "CHUNK_MIN_THREADS", 1)
    assert scan_cpu.plan(1, 100, 1)[0] == "chunks"
    assert scan_cpu.plan(3, 100, 4)[0] == "rows"
    a, b, h0, dh = _problem(3, 1, 100, 1, dtype)
    h, cache = K.linear_scan_forward(a, b, h0)
    want_h, twin_cache = R.linear_scan_forward(a, b, h0)
    assert_matches_reference(h, want_h, factor=_factor(100))
    got, want = K.linear_scan_backward(dh, cache), R.linear_scan_backward(dh, twin_cache)
    for g, w in zip(got, want, strict=True):
        assert_matches_reference(g, w, factor=_factor(100))


@pytest.mark.parametrize("B,D", [(1, 300), (3, 130), (1, 64)])
def test_feature_blocks_cover_every_feature(B, D):
    """Small B cuts D into blocks (tasks for every thread); the last block is partial."""
    a, b, h0, dh = _problem(4, B, 9, D, np.float64)
    for block in (scan_cpu.plan(B, 9, D)[1], 64, 7):
        out = np.empty_like(a)
        scan_cpu.scan_rows(a, b, h0, out, False, block)
        np.testing.assert_allclose(out, R.linear_scan(a, b, h0), rtol=1e-12, atol=1e-12)


def test_cpu_and_cuda_modules_expose_the_same_launchers():
    """``kernels_for`` picks the module; the calls are the same on both devices."""
    from nnkit._ext import scan_cuda

    for name in ("linear_scan", "linear_scan_backward"):
        assert callable(getattr(scan_cpu, name)) and callable(getattr(scan_cuda, name))


def _shifted_empty(shape, dtype, shift):
    """An empty C-contiguous array starting ``shift`` elements into its buffer."""
    return np.empty(math.prod(shape) + shift, dtype)[shift:].reshape(shape)


@pytest.mark.parametrize("dtype", DTYPES)
def test_builds_and_streamed_stores_give_identical_results(dtype):
    """Serial and parallel builds, plain and non-temporal stores, and misaligned outputs
    (views one element in, so the streamed body starts after a head): bit-identical."""
    a, b, h0, dh = _problem(5, 8, 33, 40, dtype)
    results = []
    for build, nt, shift in [("serial", False, 0), ("parallel", False, 0),
                             ("parallel", True, 0), ("serial", True, 1)]:
        h, da, db, dh0 = (_shifted_empty(shape, dtype, shift)
                          for shape in (a.shape, a.shape, a.shape, h0.shape))
        getattr(scan_cpu.scan_rows_builds, build)(a, b, h0, h, True, 16, nt)
        getattr(scan_cpu.scan_rows_backward_builds, build)(dh, a, h, h0, da, db, dh0, True,
                                                           16, nt)
        results.append((h, da, db, dh0))
    want = R.linear_scan(a, b, h0, reverse=True)
    assert_matches_reference(results[0][0], want, factor=_factor(33))
    for got in results[1:]:
        for first, other in zip(results[0], got, strict=True):
            np.testing.assert_array_equal(other, first)


@pytest.mark.parametrize("dtype", DTYPES)
def test_row_kernels_on_one_task_from_python(dtype):
    """``row_forward``/``row_backward`` (one task: one batch row, features 1..3 of 5) called
    from Python touch only their block and equal the twin there."""
    a, b, h0, dh = _problem(9, 1, 6, 5, dtype)
    h = np.zeros_like(a)
    scan_cpu.row_forward(a[0, 0, 1:], b[0, 0, 1:], h0[0, 1:], h[0, 0, 1:], 6, 5, 3, False,
                         False)
    want = R.linear_scan(a, b, h0)
    assert_matches_reference(h[..., 1:4], want[..., 1:4], factor=_factor(6))
    assert not h[..., [0, 4]].any()
    da, db, dh0 = np.zeros_like(a), np.zeros_like(a), np.zeros_like(h0)
    scan_cpu.row_backward(dh[0, 0, 1:], a[0, 0, 1:], want[0, 0, 1:], h0[0, 1:], da[0, 0, 1:],
                          db[0, 0, 1:], dh0[0, 1:], 6, 5, 3, False, True)
    for got, ref in zip((da, db, dh0), R.linear_scan_backward(dh, (a, want, h0, False)),
                        strict=True):
        assert_matches_reference(got[..., 1:4], ref[..., 1:4], factor=_factor(6))
        assert not got[..., [0, 4]].any()


def _c_kernels(isa, dtype):
    """The forward and backward C row kernels of one instruction-set build, by ctypes."""
    name = {"float32": "f32", "float64": "f64", "complex64": "c64",
            "complex128": "c128"}[np.dtype(dtype).name]
    table = scan_rows_c.variant_addresses()[isa]
    ptr, size = ctypes.c_void_p, ctypes.c_ssize_t
    fwd = ctypes.CFUNCTYPE(None, *[ptr] * 4, size, size, size, ctypes.c_int,
                           ctypes.c_int)(table[f"nnkit_scan_fwd_{name}"])
    bwd = ctypes.CFUNCTYPE(None, *[ptr] * 7, size, size, size, ctypes.c_int,
                           ctypes.c_int)(table[f"nnkit_scan_bwd_{name}"])
    return fwd, bwd


@pytest.mark.parametrize("isa", sorted(scan_rows_c.variant_addresses()))
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_c_build_is_the_recurrence(isa, dtype):
    """Each instruction-set build of the C row kernels, called directly (one task covering
    the whole (1, T, D) problem, blocks wider than the kernel's chunk of 512 scalars
    included), forward and backward, both directions, streamed or not == the twin."""
    fwd, bwd = _c_kernels(isa, dtype)
    k = 2 if np.dtype(dtype).kind == "c" else 1
    for T, D, reverse, nt in [(1, 1, False, 1), (9, 700, False, 0), (9, 700, True, 1),
                              (4, 257, True, 0)]:
        a, b, h0, dh = _problem(T + D, 1, T, D, dtype)
        h, da, db, dh0 = (np.full_like(a, np.nan), np.full_like(a, np.nan),
                          np.full_like(a, np.nan), np.full_like(h0, np.nan))
        fwd(a.ctypes.data, b.ctypes.data, h0.ctypes.data, h.ctypes.data, T, k * D, k * D,
            reverse, nt)
        bwd(dh.ctypes.data, a.ctypes.data, h.ctypes.data, h0.ctypes.data, da.ctypes.data,
            db.ctypes.data, dh0.ctypes.data, T, k * D, k * D, reverse, nt)
        msg = f"{isa} {np.dtype(dtype).name} T={T} D={D} reverse={reverse} nt={nt}"
        assert_matches_reference(h, R.linear_scan(a, b, h0, reverse=reverse),
                                 factor=_factor(T), err_msg=msg)
        for got, want in zip((da, db, dh0), R.linear_scan_backward(dh, (a, h, h0, reverse)),
                             strict=True):
            assert_matches_reference(got, want, factor=_factor(T), err_msg=msg)


def _shifted_copy(x, shift):
    """A C-contiguous copy of ``x`` starting ``shift`` elements into its buffer."""
    out = _shifted_empty(x.shape, x.dtype, shift)
    out[...] = x
    return out


@pytest.mark.parametrize("isa", sorted(scan_rows_c.variant_addresses()))
@pytest.mark.parametrize("dtype", DTYPES)
def test_one_feature_kernels_vectorised_along_t(isa, dtype):
    """One feature (stride = n = one element): the kernels vectorised along T, in every build,
    == the twin: T around the vector widths (2-16) and the 512-step blocks, arrays starting
    0, 3 or 13 elements into their buffers (the blocks end where the output is 64-byte
    aligned), both directions, streamed or not."""
    fwd, bwd = _c_kernels(isa, dtype)
    k = 2 if np.dtype(dtype).kind == "c" else 1
    for T in (1, 2, 3, 7, 16, 17, 33, 511, 512, 513, 1100, 2049):
        a, b, h0, dh = _problem(T, 1, T, 1, dtype)
        want_h = {rev: R.linear_scan(a, b, h0, reverse=rev) for rev in (False, True)}
        want_g = {rev: R.linear_scan_backward(dh, (a, want_h[rev], h0, rev))
                  for rev in (False, True)}
        for shift, reverse, nt in itertools.product((0, 3, 13), (False, True), (0, 1)):
            a_, b_, dh_, h_ = (_shifted_copy(x, shift) for x in (a, b, dh, want_h[reverse]))
            h = _shifted_empty(a.shape, dtype, (shift + 1) % 16)
            da, db = (_shifted_empty(a.shape, dtype, (shift + k) % 16) for k in (2, 5))
            dh0 = np.full_like(h0, np.nan)
            fwd(a_.ctypes.data, b_.ctypes.data, h0.ctypes.data, h.ctypes.data, T, k, k,
                reverse, nt)
            bwd(dh_.ctypes.data, a_.ctypes.data, h_.ctypes.data, h0.ctypes.data, da.ctypes.data,
                db.ctypes.data, dh0.ctypes.data, T, k, k, reverse, nt)
            msg = f"{isa} T={T} shift={shift} reverse={reverse} nt={nt}"
            assert_matches_reference(h, want_h[reverse], factor=256, err_msg=msg)
            for got, want in zip((da, db, dh0), want_g[reverse], strict=True):
                assert_matches_reference(got, want, factor=256, err_msg=msg)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reverse", [False, True])
def test_one_feature_nan_reaches_every_later_step(dtype, reverse):
    """A NaN in b at step 37 of 100 (one feature, the vectorised kernel): every state after
    it in the walk is NaN, every state before it equals the loop's."""
    a, b, h0, _ = _problem(11, 2, 100, 1, dtype)
    b[0, 37, 0] = np.nan
    h, _ = K.linear_scan_forward(a, b, h0, reverse)
    later = np.arange(100) <= 37 if reverse else np.arange(100) >= 37
    assert np.isnan(h[0, later, 0].real).all()
    want = R.linear_scan(a, b, h0, reverse)
    assert_matches_reference(h[0, ~later], want[0, ~later], factor=256)
    assert_matches_reference(h[1], want[1], factor=256)


# ---- properties --------------------------------------------------------------------------

@given(T=st.integers(1, 30), dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**16))
def test_reverse_is_flip_scan_flip(T, dtype, seed):
    a, b, h0, _ = _problem(seed, 2, T, 3, dtype)
    flipped = K.linear_scan_forward(a[:, ::-1], b[:, ::-1], h0)[0][:, ::-1]
    assert_matches_reference(K.linear_scan_forward(a, b, h0, reverse=True)[0], flipped,
                             factor=_factor(T))


def test_unit_coefficients_give_cumsum_and_zero_give_b():
    rng = np.random.default_rng(6)
    b = rng.standard_normal((2, 50, 3))
    np.testing.assert_allclose(K.linear_scan_forward(np.ones_like(b), b)[0],
                               np.cumsum(b, axis=1), rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(K.linear_scan_forward(np.zeros_like(b), b)[0], b)


def test_splitting_the_sequence_carries_the_state():
    """Scanning T in two halves, the second from the first's last state, is one scan."""
    a, b, h0, _ = _problem(7, 2, 20, 3, np.complex128)
    first, _ = K.linear_scan_forward(a[:, :11], b[:, :11], h0)
    second, _ = K.linear_scan_forward(a[:, 11:], b[:, 11:], first[:, -1])
    np.testing.assert_allclose(np.concatenate([first, second], axis=1),
                               K.linear_scan_forward(a, b, h0)[0], rtol=1e-13, atol=1e-13)


# ---- autograd ------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", (np.float64, np.complex128))
@pytest.mark.parametrize("reverse", (False, True))
@pytest.mark.parametrize("with_h0", (False, True))
def test_gradcheck(dtype, reverse, with_h0):
    a, b, h0, _ = _problem(8, 2, 7, 3, dtype)
    inputs = [nk.tensor(x, requires_grad=True) for x in (a, b, h0)]
    if with_h0:
        assert nk.gradcheck(lambda a, b, h0: linear_scan(a, b, h0, reverse), inputs)
    else:
        assert nk.gradcheck(lambda a, b: linear_scan(a, b, reverse=reverse), inputs[:2])


def test_gradient_matches_composition_of_autograd_ops():
    """F.linear_scan's backward equals autograd through the unrolled recurrence (complex)."""
    a, b, h0, dh = _problem(9, 2, 6, 3, np.complex128)
    ta, tb, th = (nk.tensor(x, requires_grad=True) for x in (a, b, h0))
    (linear_scan(ta, tb, th) * nk.tensor(dh.conj())).sum().backward()
    ua, ub, uh = (nk.tensor(x, requires_grad=True) for x in (a, b, h0))
    state, total = uh, 0
    for t in range(6):
        state = ua[:, t] * state + ub[:, t]
        total = total + (state * nk.tensor(dh[:, t].conj())).sum()
    total.backward()
    for x, y in ((ta, ua), (tb, ub), (th, uh)):
        np.testing.assert_allclose(x.grad, y.grad, rtol=1e-12, atol=1e-12)


# ---- the log-space scan against its twin ---------------------------------------------------

def _logs(draw, shape, dtype, minus_inf):
    """Finite logs in [-4, 4], some -inf (a zero) where ``minus_inf``."""
    elements = st.floats(-4, 4, allow_subnormal=False, width=np.dtype(dtype).itemsize * 8)
    if minus_inf:
        elements = st.one_of(elements, st.just(-np.inf))
    return draw(hnp.arrays(dtype, shape, elements=elements))


@st.composite
def log_scan_problems(draw):
    B, T, D = draw(st.integers(0, 3)), draw(st.integers(0, 9)), draw(st.integers(0, 3))
    dtype = draw(st.sampled_from((np.float32, np.float64)))
    zeros = draw(st.booleans())  # a = 0 or b = 0 somewhere; h = 0 where both meet
    log_a = _logs(draw, (B, T, D), dtype, zeros)
    log_b = _logs(draw, (B, T, D), dtype, zeros)
    log_h0 = _logs(draw, (B, D), dtype, zeros) if draw(st.booleans()) else None
    dlog_h = _logs(draw, (B, T, D), dtype, False)
    return log_a, log_b, log_h0, dlog_h


@given(problem=log_scan_problems())
@example(problem=(np.full((1, 3, 1), -np.inf), np.full((1, 3, 1), -np.inf), None,
                  np.ones((1, 3, 1))))  # h = 0 at every step: all of G goes to log_b
def test_log_scan_backward_matches_twin(problem):
    """log_linear_scan's pair against its twin's: the twin takes each term's share of h_t
    (a_t h_{t-1} / h_t and b_t / h_t) from its own log, the kernel one share and 1 minus
    it."""
    log_a, log_b, log_h0, dlog_h = problem
    log_h, cache = K.log_linear_scan_forward(log_a, log_b, log_h0)
    want_h, twin_cache = R.log_linear_scan_forward(log_a, log_b, log_h0)
    T = log_a.shape[1]
    np.testing.assert_array_equal(np.isneginf(log_h), np.isneginf(want_h))
    finite = np.isfinite(want_h)
    assert_matches_reference(log_h[finite], want_h[finite], factor=_factor(T))
    got = K.log_linear_scan_backward(dlog_h, cache)
    want = R.log_linear_scan_backward(dlog_h, twin_cache)
    for name, g, w in zip(("dlog_a", "dlog_b", "dlog_h0"), got, want, strict=True):
        assert_matches_reference(g, w, factor=_factor(T), err_msg=name)


def test_log_scan_gradcheck():
    """F.log_linear_scan against central differences in float64, with and without log_h0."""
    rng = np.random.default_rng(12)
    log_a, log_b = rng.uniform(-2, 1, (2, 6, 3)), rng.uniform(-2, 1, (2, 6, 3))
    log_h0 = rng.uniform(-2, 1, (2, 3))
    inputs = [nk.tensor(x, requires_grad=True) for x in (log_a, log_b, log_h0)]
    assert nk.gradcheck(lambda a, b, h0: nk.functional.log_linear_scan(a, b, h0), inputs)
    assert nk.gradcheck(lambda a, b: nk.functional.log_linear_scan(a, b), inputs[:2])


def test_backward_returns_none_where_not_needed():
    a, b, h0, dh = _problem(13, 2, 5, 3, np.float64)
    _, cache = K.linear_scan_forward(a, b, h0)
    everything = K.linear_scan_backward(dh, cache)
    da, db, dh0 = K.linear_scan_backward(dh, cache, needs=(False, True, False))
    assert da is None and dh0 is None
    np.testing.assert_array_equal(db, everything[1])
    _, log_cache = K.log_linear_scan_forward(a, b, h0)
    all_logs = K.log_linear_scan_backward(dh, log_cache)
    dla, dlb, dlh0 = K.log_linear_scan_backward(dh, log_cache, needs=(True, False, True))
    assert dlb is None
    np.testing.assert_array_equal(dla, all_logs[0])
    np.testing.assert_array_equal(dlh0, all_logs[2])


# ---- bad input -------------------------------------------------------------------------------

def test_bad_input_messages():
    a = np.zeros((2, 5, 3))
    with pytest.raises(ValueError, match="a and b must have the same shape"):
        K.linear_scan_forward(a, np.zeros((2, 4, 3)))
    with pytest.raises(ValueError, match=r"h0 must have shape \(B, D\) = \(2, 3\)"):
        K.linear_scan_forward(a, a, np.zeros((2, 4)))
    with pytest.raises(TypeError, match="mixed real and complex"):
        K.linear_scan_forward(a, a.astype(np.complex128))
    with pytest.raises(TypeError, match="h0 must have the dtype"):
        K.linear_scan_forward(a, a, np.zeros((2, 3), np.float32))
    with pytest.raises(TypeError, match="a must have dtype"):
        K.linear_scan_forward(a.astype(np.int64), a)
    with pytest.raises(ValueError, match="a must be 3-dimensional"):
        linear_scan(np.zeros((5, 3)), np.zeros((5, 3)))
    with pytest.raises(TypeError, match="reverse must be a bool"):
        K.linear_scan_forward(a, a, reverse=1)
    _, cache = K.linear_scan_forward(a, a)
    with pytest.raises(ValueError, match=r"dh must have shape \(2, 5, 3\) like the forward's "
                                         r"output, got shape \(2, 4, 3\)"):
        K.linear_scan_backward(np.zeros((2, 4, 3)), cache)
    with pytest.raises(TypeError, match="dh must have dtype float64 like the forward's output, "
                                        "got complex128"):
        K.linear_scan_backward(a.astype(np.complex128), cache)
    with pytest.raises(TypeError, match="cache must be the ScanCache returned by "
                                        "linear_scan_forward, got tuple"):
        K.linear_scan_backward(a, (a, a, None, False))
    _, log_cache = K.log_linear_scan_forward(a, a)
    with pytest.raises(TypeError, match="dlog_h must have dtype float64 like the forward's "
                                        "output, got float32"):
        K.log_linear_scan_backward(a.astype(np.float32), log_cache)
    with pytest.raises(TypeError, match="cache must be the LogScanCache returned by "
                                        "log_linear_scan_forward, got ScanCache"):
        K.log_linear_scan_backward(a, cache)


def test_preallocated_outputs_are_checked_before_the_kernels_write_them():
    """``out`` is written in place by unchecked kernels: a wrong shape, dtype or layout, a
    read-only array or a non-array is refused, naming it (it corrupted memory before)."""
    a, b = np.full((1, 4, 2), 0.5), np.ones((1, 4, 2))
    wide = np.zeros((1, 4, 4))
    cases = [(np.zeros((1, 1, 1)), ValueError, r"out must have shape \(1, 4, 2\)"),
             (np.zeros((1, 4, 2), np.float32), TypeError,
              r"out must have dtype float64 \(that of a\), got float32"),
             (wide[:, :, ::2], ValueError, "out must be C-contiguous"),
             (np.frombuffer(bytes(64)).reshape(1, 4, 2), ValueError, "out is read-only"),
             ([1, 2], TypeError, "out must be a NumPy array like a, got list")]
    for out, error, message in cases:
        with pytest.raises(error, match=message):
            K.linear_scan_forward(a, b, out=out)
    assert not wide.any()
    _, cache = K.linear_scan_forward(a, b)
    good = (np.empty_like(a), np.empty_like(a), np.empty((1, 2)))
    with pytest.raises(TypeError, match="tuple of 3 arrays .* got 2 arrays"):
        K.linear_scan_backward(b, cache, out=good[:2])
    with pytest.raises(ValueError, match=r"out\[2\] \(dh0\) must have shape \(1, 2\)"):
        K.linear_scan_backward(b, cache, out=good[:2] + (np.empty((1, 1)),))
    got = K.linear_scan_backward(b, cache, out=good)
    assert all(g is o for g, o in zip(got, good, strict=True))


_anything = st.one_of(
    st.none(), st.integers(-3, 3), st.floats(allow_nan=True), st.text(max_size=3),
    st.lists(st.floats(-2, 2), max_size=4),
    st.builds(lambda s, d: np.zeros(s, d),
              st.lists(st.integers(0, 3), min_size=0, max_size=4).map(tuple),
              st.sampled_from((np.float32, np.float64, np.complex64, np.int32, np.bool_))),
)


@given(a=_anything, b=_anything, h0=_anything, reverse=st.one_of(st.booleans(), _anything))
def test_boundary_fuzz_only_value_or_type_errors(a, b, h0, reverse):
    try:
        linear_scan(a, b, h0, reverse)
    except (ValueError, TypeError):
        pass


# ---- layers: MinGRU, MinLSTM, LRU ------------------------------------------------------------

def _unrolled(layer, x, h):
    ys = []
    for t in range(x.shape[1]):
        y, h = layer.step(x[:, t], h)
        ys.append(y.numpy())
    return np.stack(ys, axis=1)


@pytest.mark.parametrize("cls", (MinGRU, MinLSTM))
@pytest.mark.parametrize("log_space", (False, True))
@pytest.mark.parametrize("dtype", (np.float32, np.float64))
def test_min_rnn_scan_equals_step(cls, log_space, dtype):
    rng = np.random.default_rng(10)
    layer = cls(3, 5, log_space=log_space, dtype=dtype)
    x = rng.standard_normal((2, 13, 3)).astype(dtype)
    h0 = (rng.random((2, 5)) + 0.1).astype(dtype)
    np.testing.assert_allclose(layer(x, h0).numpy(), _unrolled(layer, x, nk.tensor(h0)),
                               **tolerance(dtype, 256))
    np.testing.assert_allclose(layer(x).numpy(), _unrolled(layer, x, None),
                               **tolerance(dtype, 256))


def test_min_gru_matches_its_formula_and_batch_first():
    rng = np.random.default_rng(11)
    layer = MinGRU(2, 3, dtype=np.float64)
    x = rng.standard_normal((4, 6, 2))
    W, bias = layer.linear.weight.data, layer.linear.bias.data
    h, want = np.zeros((4, 3)), []
    for t in range(6):
        k = x[:, t] @ W.T + bias
        z = 1 / (1 + np.exp(-k[:, :3]))
        h = (1 - z) * h + z * k[:, 3:]
        want.append(h)
    np.testing.assert_allclose(layer(x).numpy(), np.stack(want, 1), rtol=1e-12, atol=1e-12)
    time_major = MinGRU(2, 3, batch_first=False, dtype=np.float64)
    time_major.load_state_dict(layer.state_dict())
    np.testing.assert_allclose(time_major(x.transpose(1, 0, 2)).numpy().transpose(1, 0, 2),
                               layer(x).numpy(), rtol=1e-12)


def test_min_lstm_gates_are_normalised():
    """f' + i' = 1: with h~ = h0 = c constant the state stays c."""
    layer = MinLSTM(2, 3, bias=False, dtype=np.float64)
    layer.linear.weight.data[6:] = 0.0  # h~ = 0
    h = layer(np.random.default_rng(12).standard_normal((1, 9, 2)), np.zeros((1, 3)))
    np.testing.assert_allclose(h.numpy(), 0.0, atol=1e-15)


def test_log_space_survives_a_long_sequence():
    """float32, T = 20000: the log-space state stays finite and positive."""
    rng = np.random.default_rng(13)
    plain, logs = MinGRU(2, 4), MinGRU(2, 4, log_space=True)
    logs.load_state_dict(plain.state_dict())
    x = rng.standard_normal((1, 20000, 2)).astype(np.float32)
    y = logs(x).numpy()
    assert np.isfinite(y).all() and (y > 0).all()


@pytest.mark.parametrize("cls", (MinGRU, MinLSTM))
@pytest.mark.parametrize("log_space", (False, True))
def test_min_rnn_gradcheck(cls, log_space):
    rng = np.random.default_rng(14)
    layer = cls(3, 4, log_space=log_space, dtype=np.float64)
    x, h0 = rng.standard_normal((2, 5, 3)), rng.random((2, 4)) + 0.1
    params = [layer.linear.weight, layer.linear.bias]
    assert nk.gradcheck(lambda x, h0, *_: layer(x, h0), [x, h0, *params])


def _lru(**kw):
    return LRU(3, 6, dtype=np.float64, random_state=0, **kw)


def test_lru_scan_equals_step_and_formula():
    rng = np.random.default_rng(15)
    lru = _lru(r_min=0.4, r_max=0.95)
    x = rng.standard_normal((2, 11, 3))
    y = lru(x).numpy()
    np.testing.assert_allclose(y, _unrolled(lru, x, None), rtol=1e-12, atol=1e-12)
    lam, gamma = lru.eigenvalues(), np.exp(lru.gamma_log.data)
    Bc = lru.B_re.data + 1j * lru.B_im.data
    Cc = lru.C_re.data + 1j * lru.C_im.data
    h, want = np.zeros((2, 6), complex), []
    for t in range(11):
        h = lam * h + gamma * (x[:, t] @ Bc.T)
        want.append((h @ Cc.T).real + lru.D.data * x[:, t])
    np.testing.assert_allclose(y, np.stack(want, 1), rtol=1e-12, atol=1e-12)


def test_lru_ring_initialisation():
    lru = LRU(2, 4000, r_min=0.5, r_max=0.9, max_phase=math.pi / 4, random_state=1)
    r, phase = np.abs(lru.eigenvalues()), np.angle(lru.eigenvalues())
    assert r.min() >= 0.5 - 1e-6 and r.max() <= 0.9 + 1e-6
    assert phase.min() >= 0 and phase.max() <= math.pi / 4 + 1e-6
    # uniform on the ring's area: |lambda|^2 uniform on [r_min^2, r_max^2]
    assert abs(np.mean(r ** 2) - (0.25 + 0.81) / 2) < 0.01
    np.testing.assert_allclose(np.exp(lru.gamma_log.data), np.sqrt(1 - r ** 2), rtol=1e-5)


def test_lru_gradcheck_all_parameters():
    lru = _lru(r_min=0.3, r_max=0.9)
    x = np.random.default_rng(16).standard_normal((2, 5, 3))
    params = [p for _, p in lru.named_parameters()]
    assert nk.gradcheck(lambda x, *_: lru(x), [x, *params])


def test_lru_stable_for_a_long_sequence():
    """T = 10^5 with |lambda| up to 0.999: the output stays bounded (|lambda| < 1, gamma
    normalisation keeps the state at unit scale)."""
    lru = LRU(2, 16, r_min=0.99, r_max=0.999, random_state=2)
    x = np.random.default_rng(17).standard_normal((1, 100_000, 2)).astype(np.float32)
    y = lru(x).numpy()
    assert np.isfinite(y).all() and np.abs(y).max() < 100
    assert np.all(np.abs(lru.eigenvalues()) < 1)


def test_section_5_2_lru_with_an_mlp_readout_fits_what_a_linear_readout_cannot():
    """Notes §5.2: a linear recurrence loses no representational power when the output map
    carries it. On y_t = x_{t-2} x_{t-5} an LRU read by a position-wise MLP reaches a small
    held-out MSE within 150 Adam steps; the same model without the Tanh (the same parameters,
    linear in the input sequence) stays at the best linear predictor's 27/32, since y is
    uncorrelated with every input."""
    from nnkit.training.recurrent import delayed_product, lru_readout_model, train_lru_readout

    x, y = delayed_product(3, 8, random_state=0)
    np.testing.assert_array_equal(y[:, :5], 0)
    np.testing.assert_allclose(y[:, 5:, 0], x[:, 3:6, 0] * x[:, 0:3, 0], rtol=1e-6)
    sizes = [sum(p.numel() for p in lru_readout_model(nl).parameters()) for nl in (True, False)]
    assert sizes[0] == sizes[1]
    mlp = train_lru_readout(True, steps=150, every=50)
    linear = train_lru_readout(False, steps=150, every=50)
    assert mlp[-1] < 0.1 < 0.8 < linear[-1], (mlp, linear)
    assert linear[-1] == pytest.approx(27 / 32, rel=0.05)


def test_layer_bad_input():
    with pytest.raises(ValueError, match="input_size=3"):
        MinGRU(3, 4)(np.zeros((2, 5, 2), np.float32))
    with pytest.raises(ValueError, match="h0 must have shape"):
        MinGRU(3, 4)(np.zeros((2, 5, 3), np.float32), np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError, match="r_min must be < r_max"):
        LRU(2, 3, r_min=0.9, r_max=0.5)
    with pytest.raises(TypeError, match="log_space must be a bool"):
        MinLSTM(2, 3, log_space="yes")
    with pytest.raises(ValueError, match="h0 must be positive"):
        MinGRU(2, 3, log_space=True)(np.zeros((1, 4, 2), np.float32), np.zeros((1, 3), np.float32))
    with pytest.raises(ValueError, match="hidden_size"):
        MinGRU(2, 0)


# ---- CUDA kernels under Numba's simulator (in a child process) -------------------------------
# The simulator must be switched on before numba.cuda is first imported, so this file runs
# itself as a script in a child process (tests/helpers.py; NNKIT_CUDA_CASES=device runs it on a
# real GPU). Blocks of 4 or 5 threads and chunks of 2 steps put several blocks along T, and
# several chunks or several sequence groups in a block, on tiny shapes.

@contextlib.contextmanager
def _blocks_last_first():
    """Under the simulator, start a launch's blocks from the last one. The simulator runs
    them in index order, which the hardware does not promise; a block that waited on a
    block of lower index, not on an earlier ticket, would spin for ever here."""
    from numba import config

    if not config.ENABLE_CUDASIM:
        yield
        return
    from numba.cuda.simulator import kernel

    real = kernel.np
    kernel.np = types.SimpleNamespace(**vars(real))
    kernel.np.ndindex = lambda *shape: reversed(list(real.ndindex(*shape)))
    try:
        yield
    finally:
        kernel.np = real


def _cuda_cases():
    from nnkit._ext import scan_cuda as C

    C.seq_threads, C.steps_per_thread = 3, 2
    # (rows_min, block, publish_states, order): one thread per sequence; the look-back scan
    # with blocks of 4 or 5 threads; the look-back over published maps only (back to t = 0);
    # blocks started last first
    modes = {"rows": (0, 4, True, contextlib.nullcontext),
             "look-back 4": (10**9, 4, True, contextlib.nullcontext),
             "look-back 5": (10**9, 5, True, contextlib.nullcontext),
             "maps only": (10**9, 4, False, contextlib.nullcontext),
             "last first": (10**9, 4, True, _blocks_last_first)}
    failures = []
    for dtype in (np.float32, np.complex128):  # the real and the complex shared-memory scan
        for reverse in (False, True):
            # S = 1, 6, 1, 0, 2, 2, 4 sequences; T across chunk and block edges; empty B, T
            for B, T, D in ((1, 9, 1), (2, 5, 3), (1, 8, 1), (0, 3, 2), (2, 0, 1),
                            (1, 1, 2), (2, 7, 2), (1, 23, 2)):
                for mode, (C.rows_min, C.block, C.publish_states, order) in modes.items():
                    a, b, h0, dh = _problem(B * 100 + T + D, B, T, D, dtype)
                    out = np.zeros_like(a)
                    grads = [np.zeros_like(a), np.zeros_like(a), np.zeros_like(h0)]
                    with order():
                        C.linear_scan(a, b, h0, out, reverse)
                        C.linear_scan_backward(dh, a, out, h0, *grads, reverse)
                    want = [R.linear_scan(a, b, h0, reverse),
                            *R.linear_scan_backward(dh, (a, out, h0, reverse))]
                    for name, got, w in zip(("h", "da", "db", "dh0"), [out, *grads], want,
                                            strict=True):
                        if not np.allclose(got, w, **tolerance(dtype, _factor(T))):
                            failures.append(f"{name} {np.dtype(dtype)} rev={reverse} "
                                            f"{(B, T, D)} {mode}")
    # Numba device arrays: the look-back status is zeroed by a kernel (_fill_zero)
    from numba import cuda

    C.rows_min, C.block, C.publish_states = 10**9, 4, True
    a, b, h0, _ = _problem(11, 2, 7, 2, np.float64)
    out = cuda.device_array(a.shape, a.dtype)
    C.linear_scan(*map(cuda.to_device, (a, b, h0)), out, False)
    if not np.allclose(out.copy_to_host(), R.linear_scan(a, b, h0, False), **tolerance(a.dtype)):
        failures.append("h on Numba device arrays")
    return failures


def _case_scan_kernels():
    failures = _cuda_cases()
    assert not failures, failures


def test_cuda_kernels_under_simulator(tmp_path):
    outcome = simulator_outcomes(__file__, tmp_path)["scan"]
    assert outcome == "ok", outcome


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex64, np.complex128])
@pytest.mark.parametrize("shape", [(16, 4096, 256), (1, 100_003, 1), (3, 1, 5), (4, 777, 33)])
@pytest.mark.parametrize("reverse", [False, True])
def test_public_scan_on_gpu_matches_cpu(dtype, shape, reverse):
    """F.linear_scan forward and backward on CuPy arrays (real GPU) against the CPU kernels."""
    cupy = pytest.importorskip("cupy")
    a, b, h0, dh = _problem(sum(shape), *shape, dtype)
    want_h, cache = K.linear_scan_forward(a, b, h0, reverse=reverse)
    want = K.linear_scan_backward(dh, cache)
    ga, gb, gh0, gdh = (cupy.asarray(v) for v in (a, b, h0, dh))
    got_h, gcache = K.linear_scan_forward(ga, gb, gh0, reverse=reverse)
    got = K.linear_scan_backward(gdh, gcache)
    tol = tolerance(dtype, _factor(shape[1]))
    np.testing.assert_allclose(cupy.asnumpy(got_h), want_h, **tol, err_msg="h")
    for name, g, w in zip(("da", "db", "dh0"), got, want, strict=True):
        np.testing.assert_allclose(cupy.asnumpy(g), w, **tol, err_msg=name)


def test_log_linear_scan_propagates_nan_as_logaddexp():
    """NaN anywhere (log_a, log_b, log_h0) makes log h NaN from there on, as NumPy's logaddexp
    (a NaN in log_b was taken for -inf and gave finite numbers); logaddexp(-inf, -inf) = -inf
    and logaddexp(inf, inf) = inf stay. The public op, and both kernel builds, against the
    twin."""
    rng = np.random.default_rng(21)
    values = np.array([np.nan, np.inf, -np.inf, 0.0, -1.5, 2.0, -40.0])
    la, lb = rng.choice(values, (3, 7, 4)), rng.choice(values, (3, 7, 4))
    lh0 = rng.choice(values, (3, 4))
    lb[0, 2, 0], la[0, :, 0], lh0[0, 0] = np.nan, 0.0, 0.0  # only log_b's NaN in this lane
    with np.errstate(invalid="ignore"):  # inf - inf and NaN in the twin's NumPy ops
        expected = R.log_linear_scan(la, lb, lh0)
        assert np.isnan(expected[0, 2:, 0]).all()
        got = nk.functional.log_linear_scan(la, lb, lh0).numpy()
        np.testing.assert_allclose(got, expected, **tolerance(np.float64))
        for build in (scan_cpu.log_scan_rows.serial, scan_cpu.log_scan_rows.parallel):
            out = np.empty_like(la)
            build(la, lb, lh0, out, False, 2)
            np.testing.assert_allclose(out, expected, **tolerance(np.float64))
        lb32 = np.array([[[0.0], [np.nan], [0.0]]], np.float32)
        got32, _ = K.log_linear_scan_forward(np.zeros_like(lb32), lb32)
    np.testing.assert_array_equal(got32.ravel(), [0.0, np.nan, np.nan])


if __name__ == "__main__":
    run_simulator_cases({"scan": _case_scan_kernels}, sys.argv[1])
