"""1-D discrete convolution and cross-correlation (section 4.1 of the notes).

- ``convolve(f, h)``: (f * h)[u] = sum_t h[t] f[u - t] (Definition 4.7), equal to
  ``np.convolve``;
- ``correlate(f, h)``: (h star f)[u] = sum_t h[t] f[u + t] (Definition 4.8), equal to
  ``np.correlate(f, h)``, i.e. ``convolve(f, h[::-1])`` (the Remark after it);
- ``toeplitz(h, n)``: the (n + m - 1) x n matrix H with h_i on the i-th subdiagonal, so that
  ``toeplitz(h, n) @ f == convolve(f, h)`` (the proof that convolution is linear);
- ``fft_convolve(f, h)``: F(f * h) = F f . F h, via scipy.fft with zero padding to n + m - 1.

Modes, as NumPy: 'full' (length n + m - 1), 'same' (length max(n, m), centred as
np.convolve), 'valid' (length max(n, m) - min(n, m) + 1).
"""

from __future__ import annotations

import numbers

import numpy as np

from ._validation import check_array, check_choice, check_scalar

__all__ = ["convolve", "correlate", "toeplitz", "fft_convolve"]

_MODES = ("full", "same", "valid")
_NUMBERS = (np.float32, np.float64, np.complex64, np.complex128, np.int8, np.int16, np.int32,
            np.int64)


def _check_1d(a, name):
    a = check_array(a, name=name, ndim=1, dtype=_NUMBERS, allow_device=False)
    if a.size == 0:
        raise ValueError(f"{name} must not be empty, got shape {a.shape}")
    return a


def _trim(full, n, m, mode):
    """Cut the 'full' result (length n + m - 1) to ``mode``, as np.convolve does."""
    if mode == "full":
        return full
    long, short = max(n, m), min(n, m)
    if mode == "same":
        start = (short - 1) // 2
        return full[start:start + long]
    return full[short - 1:long]


def convolve(f, h, mode: str = "full"):
    """Discrete convolution (f * h)[u] = sum_t h[t] f[u - t].

    Parameters
    ----------
    f : ndarray (n,) ; h : ndarray (m,)
        Real or complex; the result has their common dtype.
    mode : 'full', 'same' or 'valid'

    Returns
    -------
    ndarray (n + m - 1,) for 'full'

    Examples
    --------
    >>> from nnkit.signal import convolve
    >>> convolve([1.0, 2.0, 3.0], [0.0, 1.0, 0.5])
    array([0. , 1. , 2.5, 4. , 1.5])
    """
    check_choice(mode, name="mode", choices=_MODES)
    f, h = _check_1d(f, "f"), _check_1d(h, "h")
    n, m = f.size, h.size
    out = np.zeros(n + m - 1, dtype=np.result_type(f, h))
    for t in range(m):  # one shifted, scaled copy of f per kernel tap
        out[t:t + n] += h[t] * f
    return _trim(out, n, m, mode)


def correlate(f, h, mode: str = "full"):
    """Cross-correlation (h star f)[u] = sum_t h[t] f[u + t], as ``np.correlate(f, h, mode)``.

    Equals ``convolve(f, conj(h)[::-1], mode)``: convolution with the flipped kernel (for
    mode 'same' with a kernel longer than f, NumPy centres the window the other way round,
    and so does this function).

    Parameters
    ----------
    f : ndarray (n,) ; h : ndarray (m,) ; mode : 'full', 'same' or 'valid'
    """
    check_choice(mode, name="mode", choices=_MODES)
    f, h = _check_1d(f, "f"), _check_1d(h, "h")
    if h.size > f.size:  # as NumPy: correlate the other way round, conjugate and reverse
        return np.conj(convolve(h, np.conj(f)[::-1], mode))[::-1]
    return convolve(f, np.conj(h)[::-1], mode)


def toeplitz(h, n: int):
    """The (n + m - 1, n) Toeplitz matrix H of the notes: H[i, j] = h[i - j] (0 elsewhere).

    ``toeplitz(h, n) @ f == convolve(f, h)`` for every f of length n.

    Examples
    --------
    >>> from nnkit.signal import toeplitz
    >>> toeplitz([1.0, 2.0], 3)
    array([[1., 0., 0.],
           [2., 1., 0.],
           [0., 2., 1.],
           [0., 0., 2.]])
    """
    h = _check_1d(h, "h")
    n = int(check_scalar(n, name="n", kind=numbers.Integral, low=1))
    m = h.size
    H = np.zeros((n + m - 1, n), dtype=h.dtype)
    for j in range(n):  # column j holds h, shifted down by j
        H[j:j + m, j] = h
    return H


def fft_convolve(f, h, mode: str = "full"):
    """Convolution through the FFT: ifft(fft(f, L) fft(h, L)), L = n + m - 1.

    Real inputs give a real result (rfft); O((n + m) log(n + m)) instead of O(n m).
    """
    from scipy import fft as sfft

    check_choice(mode, name="mode", choices=_MODES)
    f, h = _check_1d(f, "f"), _check_1d(h, "h")
    n, m = f.size, h.size
    L = n + m - 1
    size = sfft.next_fast_len(L)
    if np.iscomplexobj(f) or np.iscomplexobj(h):
        out = sfft.ifft(sfft.fft(f, size) * sfft.fft(h, size))[:L]
    else:
        out = sfft.irfft(sfft.rfft(f, size) * sfft.rfft(h, size), size)[:L]
    dtype = np.result_type(f, h, np.float32 if f.dtype == np.float32 else np.float64)
    return _trim(out.astype(dtype, copy=False), n, m, mode)
