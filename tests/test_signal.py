"""nk.signal: NumPy equality and the properties of notes §4.1 (commutativity,
linearity, shift-equivariance, correlation == convolution with the flipped kernel, the
convolution theorem via the FFT, the Toeplitz matrix), Theorem 4.6 (a linear map that commutes
with shifts is a convolution: ``convolution_kernel``), plus the boundary."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from nnkit import signal as S

MODES = ("full", "same", "valid")


def _signals(max_side=12):
    return hnp.arrays(np.float64, st.integers(1, max_side),
                      elements=st.floats(-3, 3, allow_subnormal=False))


@given(f=_signals(), h=_signals(), mode=st.sampled_from(MODES))
def test_equals_numpy(f, h, mode):
    np.testing.assert_allclose(S.convolve(f, h, mode), np.convolve(f, h, mode), atol=1e-12)
    np.testing.assert_allclose(S.correlate(f, h, mode), np.correlate(f, h, mode), atol=1e-12)


@given(f=_signals(), h=_signals())
def test_commutative(f, h):
    np.testing.assert_allclose(S.convolve(f, h), S.convolve(h, f), atol=1e-12)


@given(f=_signals(8), g=_signals(8), h=_signals(), a=st.floats(-2, 2), b=st.floats(-2, 2))
def test_linear(f, g, h, a, b):
    g = np.resize(g, f.shape)
    np.testing.assert_allclose(S.convolve(a * f + b * g, h),
                               a * S.convolve(f, h) + b * S.convolve(g, h), atol=1e-10)


@given(f=_signals(), h=_signals(), delta=st.integers(0, 5))
def test_shift_equivariant(f, h, delta):
    """Shifting f by delta (prepending zeros) shifts f * h by delta: f_delta * h = (f * h)_delta."""
    shifted = np.concatenate([np.zeros(delta), f])
    expected = np.concatenate([np.zeros(delta), S.convolve(f, h)])
    np.testing.assert_allclose(S.convolve(shifted, h), expected, atol=1e-12)


@given(f=_signals(), h=_signals(), mode=st.sampled_from(MODES))
def test_correlate_is_convolve_with_flipped_kernel(f, h, mode):
    if mode == "same" and h.size > f.size:
        f, h = np.resize(f, h.size), h[: f.size]  # NumPy's 'same' centring flips otherwise
    np.testing.assert_allclose(S.correlate(f, h, mode), S.convolve(f, h[::-1], mode),
                               atol=1e-12)


@given(f=_signals(40), h=_signals(40), mode=st.sampled_from(MODES))
def test_fft_equals_direct(f, h, mode):
    np.testing.assert_allclose(S.fft_convolve(f, h, mode), S.convolve(f, h, mode),
                               atol=1e-9 * (1 + np.abs(f).sum() * np.abs(h).max()))


def test_fft_complex(rng):
    f = rng.standard_normal(9) + 1j * rng.standard_normal(9)
    h = rng.standard_normal(4) - 2j * rng.standard_normal(4)
    np.testing.assert_allclose(S.fft_convolve(f, h), np.convolve(f, h), atol=1e-12)
    np.testing.assert_allclose(S.correlate(f, h), np.correlate(f, h, "full"), atol=1e-12)


@given(f=_signals(), h=_signals())
def test_toeplitz_matrix_applies_the_convolution(f, h):
    H = S.toeplitz(h, f.size)
    assert H.shape == (f.size + h.size - 1, f.size)
    np.testing.assert_allclose(H @ f, S.convolve(f, h), atol=1e-12)
    for i in range(h.size):  # h_i on the i-th subdiagonal
        np.testing.assert_array_equal(np.diagonal(H, -i), h[i])


def test_bad_input_raises():
    with pytest.raises(ValueError, match="mode must be one of"):
        S.convolve([1.0], [1.0], mode="circular")
    with pytest.raises(ValueError, match="f must be 1-dimensional"):
        S.convolve(np.ones((2, 2)), [1.0])
    with pytest.raises(ValueError, match="h must not be empty"):
        S.correlate([1.0], [])
    with pytest.raises(ValueError, match="n must be >= 1"):
        S.toeplitz([1.0], 0)
    with pytest.raises(TypeError, match="n must be an integer"):
        S.toeplitz([1.0], 2.5)
    with pytest.raises(TypeError, match="f must have dtype"):
        S.fft_convolve(np.array(["a"]), [1.0])


# ---- Theorem 4.6: a linear shift-equivariant map is a convolution ----------------------------

@given(h=_signals(), n=st.integers(1, 10), f=_signals(10))
def test_theorem_4_6_toeplitz_and_convolve_give_back_their_kernel(h, n, f):
    """The kernel of toeplitz(h, n) and of convolve(., h) is h, and the map is convolve(., h)."""
    np.testing.assert_array_equal(S.convolution_kernel(S.toeplitz(h, n)), h)
    found = S.convolution_kernel(lambda x: S.convolve(x, h), n)
    np.testing.assert_allclose(found, h, atol=1e-12)
    f = np.resize(f, n)
    np.testing.assert_allclose(S.convolve(f, found), S.convolve(f, h), atol=1e-10)
    assert S.is_shift_equivariant(S.toeplitz(h, n))


def test_theorem_4_6_other_forms_of_a_convolution(rng):
    h = rng.standard_normal(5) + 1j * rng.standard_normal(5)
    found = S.convolution_kernel(lambda f: S.fft_convolve(f, h), 7)  # through the FFT
    np.testing.assert_allclose(found, h, atol=1e-12)
    g = rng.standard_normal(4)  # full cross-correlation: convolution with the flipped kernel
    np.testing.assert_allclose(S.convolution_kernel(lambda f: S.correlate(f, g), 6), g[::-1],
                               atol=1e-12)
    np.testing.assert_array_equal(S.convolution_kernel(3.0 * np.eye(4)), [3.0])  # m = 1
    np.testing.assert_array_equal(S.convolution_kernel(np.arange(5)[:, None], 1),
                                  np.arange(5))  # n = 1: every map is a convolution
    M = S.toeplitz(np.array([1.0, 2.0, 1.0]), 6).astype(np.float32)
    assert S.convolution_kernel(M).dtype == np.float32


def test_theorem_4_6_counterexamples_are_refused(rng):
    """Maps that are linear but do not commute with shifts, each with its reason."""
    h = np.array([1.0, 2.0, 3.0])
    cases = {
        "'same' crops the ends": (lambda f: S.convolve(f, h, "same"), 6),
        "'valid' crops the ends": (lambda f: S.convolve(f, h, "valid"), 6),
        "circulant (circular shift)": (np.stack([np.roll([1.0, 2.0, 0, 0, 0], j)
                                                 for j in range(5)], axis=1), None),
        "position-dependent weights": (np.diag([1.0, 2.0, 3.0]), None),
        "random matrix": (rng.standard_normal((7, 4)), None),
        "a Toeplitz matrix with its last entry changed": (S.toeplitz(h, 4), None),
    }
    last = cases["a Toeplitz matrix with its last entry changed"][0]
    last[-1, -1] += 1e-6
    for name, (op, n) in cases.items():
        assert not S.is_shift_equivariant(op, n), name
        with pytest.raises(ValueError, match="commute with shifts|length .* < "):
            S.convolution_kernel(op, n)
    with pytest.raises(ValueError, match="impulse at 3 is not h delayed by 3, h = the first p - n"):
        S.convolution_kernel(last)
    with pytest.raises(ValueError, match=r"length 4 < 6.*'same' and 'valid' crop"):
        S.convolution_kernel(lambda f: S.convolve(f, h, "valid"), 6)
    # within a looser atol the perturbed matrix counts as the convolution it nearly is
    np.testing.assert_allclose(S.convolution_kernel(last, atol=1e-5), h)


def test_theorem_4_6_is_about_linear_maps():
    for op in (lambda f: f ** 2, lambda f: f + 1.0, lambda f: np.maximum(f, 0.0)):
        with pytest.raises(ValueError, match="op is not linear"):
            S.convolution_kernel(op, 5)


def test_convolution_kernel_bad_input():
    with pytest.raises(TypeError, match="n .*required"):
        S.convolution_kernel(lambda f: f)
    with pytest.raises(ValueError, match="n must equal the matrix's number of columns 3"):
        S.convolution_kernel(np.eye(3), 4)
    with pytest.raises(ValueError, match="op must be 2-dimensional"):
        S.convolution_kernel(np.ones(3))
    with pytest.raises(ValueError, match="1-D numeric array"):
        S.convolution_kernel(lambda f: np.outer(f, f), 3)
    with pytest.raises(ValueError, match="n must be >= 1"):
        S.convolution_kernel(lambda f: f, 0)
    with pytest.raises(ValueError, match="atol must be >= 0"):
        S.convolution_kernel(np.eye(2), atol=-1.0)
