"""nk.signal: NumPy equality and the properties of section 4.1 of the notes (commutativity,
linearity, shift-equivariance, correlation == convolution with the flipped kernel, the
convolution theorem via the FFT, the Toeplitz matrix), plus the boundary."""

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
