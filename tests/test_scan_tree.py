"""The tree scans of the linear recurrence (``nk.kernels.tree_scan``): Hillis-Steele and
Blelloch against the sequential recurrence, their twins, and their depth and work counted
against the closed forms (notes §5.2: the scan's O(log n) is its depth)."""

import math

import numpy as np
import pytest
from helpers import tolerance
from hypothesis import given
from hypothesis import strategies as st

import nnkit as nk
from nnkit._ext import scan_tree_cpu
from nnkit.kernels import tree_scan, tree_scan_counts
from nnkit.kernels.reference import scan as R
from nnkit.kernels.reference import scan_tree as RT

DTYPES = (np.float32, np.float64, np.complex64, np.complex128)
ALGORITHMS = ("hillis_steele", "blelloch")


def _problem(seed, B, T, D, dtype):
    """a inside the unit disc (|a| <= 0.95), b and h0 standard normal."""
    rng = np.random.default_rng(seed)
    complex_ = np.dtype(dtype).kind == "c"

    def draw(shape):
        x = rng.standard_normal(shape)
        return x + 1j * rng.standard_normal(shape) if complex_ else x

    a = draw((B, T, D))
    a = 0.95 * a / np.maximum(1.0, np.abs(a))
    return a.astype(dtype), draw((B, T, D)).astype(dtype), draw((B, D)).astype(dtype)


def _levels_and_combines(T, algorithm):
    """The counts as the textbooks state them, written out level by level."""
    L = math.ceil(math.log2(T)) if T > 1 else 0
    if algorithm == "hillis_steele":  # level k combines every t >= 2^k
        return L, sum(T - 2 ** k for k in range(L))
    n = 2 ** L  # Blelloch: up- and down-sweep over a complete tree of n leaves
    return 2 * L, sum(n // 2 ** (k + 1) for k in range(L)) * 2


@given(B=st.integers(0, 3), T=st.integers(0, 70), D=st.integers(0, 4),
       dtype=st.sampled_from(DTYPES), algorithm=st.sampled_from(ALGORITHMS),
       with_h0=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_tree_scan_equals_the_sequential_recurrence(B, T, D, dtype, algorithm, with_h0, seed):
    """h by the tree equals h_t = a_t h_{t-1} + b_t walked in order (float64 and complex128
    to a few ulps; float32 within ulps growing with T: the tree reassociates the products)."""
    a, b, h0 = _problem(seed, B, T, D, dtype)
    h0 = h0 if with_h0 else None
    h, stats = tree_scan(a, b, h0, algorithm=algorithm)
    want = R.linear_scan(a, b, h0)
    assert h.shape == a.shape and h.dtype == a.dtype and h.flags.c_contiguous
    np.testing.assert_allclose(h, want, **tolerance(dtype, 64 + 8 * T))
    assert (stats.algorithm, stats.length) == (algorithm, T)


@given(T=st.integers(0, 40), dtype=st.sampled_from(DTYPES), algorithm=st.sampled_from(ALGORITHMS),
       seed=st.integers(0, 2 ** 16))
def test_tree_scan_twin_equals_the_sequential_recurrence(T, dtype, algorithm, seed):
    a, b, h0 = _problem(seed, 2, T, 2, dtype)
    h, _, _ = RT.tree_scan(a, b, h0, algorithm)
    np.testing.assert_allclose(h, R.linear_scan(a, b, h0), **tolerance(dtype, 64 + 8 * T))


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("T", [0, 1, 2, 3, 4, 5, 7, 8, 9, 31, 32, 33, 100, 1024, 1025])
def test_section_5_2_depth_and_work_counted(T, algorithm):
    """The kernel counts its levels and combines as it runs; the twin counts its loops; both
    equal the closed forms: depth ceil(log2 T) (Hillis-Steele) or 2 ceil(log2 T)
    (Blelloch), work sum_k (T - 2^k) or 2 (2^ceil(log2 T) - 1)."""
    a, b, h0 = _problem(T, 1, T, 1, np.float64)
    _, stats = tree_scan(a, b, h0, algorithm=algorithm)
    _, levels, combines = RT.tree_scan(a, b, h0, algorithm)
    want = _levels_and_combines(T, algorithm)
    assert (stats.levels, stats.combines) == (levels, combines) == want
    assert tree_scan_counts(T, algorithm) == want


def test_section_5_2_log_n_is_the_depth_not_the_work():
    """O(log T) levels, but never fewer than the T - 1 combines of the sequential loop:
    Hillis-Steele's work grows as T log2 T, Blelloch's stays below 4 T."""
    for T in (2 ** k for k in range(1, 16)):
        L = int(math.log2(T))
        hs, bl = tree_scan_counts(T, "hillis_steele"), tree_scan_counts(T, "blelloch")
        assert tree_scan_counts(T, "sequential") == (T - 1, T - 1)
        assert hs[0] == L and bl[0] == 2 * L
        assert hs[1] == T * L - T + 1 and bl[1] == 2 * T - 2
        assert hs[1] >= T - 1 and bl[1] >= T - 1
    assert tree_scan_counts(1024, "hillis_steele") == (10, 9217)
    assert tree_scan_counts(1024, "blelloch") == (20, 2046)


@pytest.mark.parametrize("dtype", DTYPES)
def test_serial_and_parallel_levels_agree(dtype):
    a, b, _ = _problem(3, 2, 50, 3, dtype)
    for build in ("serial", "parallel"):
        A, H = a.copy(), b.copy()
        out_a, out_h = np.empty_like(A), np.empty_like(H)
        getattr(scan_tree_cpu.hillis_steele_level, build)(A, H, out_a, out_h, 4)
        if build == "serial":
            first = out_a.copy(), out_h.copy()
    np.testing.assert_array_equal(first[0], out_a)
    np.testing.assert_array_equal(first[1], out_h)
    pad = np.ones((2, 64, 3), dtype), np.zeros((2, 64, 3), dtype)
    pad[0][:, :50], pad[1][:, :50] = a, b
    results = []
    for build in ("serial", "parallel"):
        A, H = pad[0].copy(), pad[1].copy()
        getattr(scan_tree_cpu.blelloch_up_level, build)(A, H, 2)
        getattr(scan_tree_cpu.blelloch_down_level, build)(A, H, 1)
        results.append((A, H))
    np.testing.assert_array_equal(results[0][0], results[1][0])
    np.testing.assert_array_equal(results[0][1], results[1][1])


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_large_problem_runs_the_parallel_build(algorithm):
    a, b, h0 = _problem(4, 4, 700, 32, np.float64)  # 89600 elements: the parallel launcher
    h, _ = tree_scan(a, b, h0, algorithm=algorithm)
    np.testing.assert_allclose(h, nk.kernels.linear_scan_forward(a, b, h0)[0], rtol=1e-12,
                               atol=1e-12)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_nan_reaches_every_later_step(algorithm):
    a, b, _ = _problem(5, 1, 19, 1, np.float64)
    b[0, 6, 0] = np.nan
    h, _ = tree_scan(a, b, algorithm=algorithm)
    assert not np.isnan(h[0, :6]).any() and np.isnan(h[0, 6:]).all()


def test_bad_input_messages():
    a = np.zeros((1, 4, 2))
    with pytest.raises(ValueError, match="algorithm must be one of"):
        tree_scan(a, a, algorithm="brent_kung")
    with pytest.raises(ValueError, match="same shape"):
        tree_scan(a, np.zeros((1, 5, 2)))
    with pytest.raises(TypeError, match="same dtype"):
        tree_scan(a, a.astype(np.float32))
    with pytest.raises(ValueError, match="h0 must have shape"):
        tree_scan(a, a, np.zeros((1, 3)))
    with pytest.raises(ValueError, match="T must be"):
        tree_scan_counts(-1)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
def test_linear_scan_algorithm_option(algorithm, reverse, dtype):
    """``linear_scan_forward(..., algorithm=)`` runs the tree scan (both directions, with h0)
    and equals the sequential kernel; the backward is the same reverse scan."""
    a, b, h0 = _problem(3, 2, 37, 3, dtype)
    want, _ = nk.kernels.linear_scan_forward(a, b, h0, reverse)
    got, cache = nk.kernels.linear_scan_forward(a, b, h0, reverse, algorithm=algorithm)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    assert cache.h is got


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_functional_linear_scan_tree_gradient(algorithm):
    """F.linear_scan(algorithm=) is differentiable and its gradients equal the sequential's."""
    a, b, h0 = _problem(4, 2, 9, 2, np.float64)
    grads = {}
    for alg in ("sequential", algorithm):
        ts = [nk.tensor(x, requires_grad=True) for x in (a, b, h0)]
        (nk.functional.linear_scan(*ts, algorithm=alg) ** 2).sum().backward()
        grads[alg] = [t.grad for t in ts]
    for got, want in zip(grads[algorithm], grads["sequential"], strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-12)


def test_linear_scan_algorithm_rejected():
    a, b, _ = _problem(0, 1, 4, 1, np.float32)
    with pytest.raises(ValueError, match="algorithm must be one of"):
        nk.kernels.linear_scan_forward(a, b, algorithm="tree")
