"""1-D discrete convolution and cross-correlation (notes §4.1).

- ``convolve(f, h)``: (f * h)[u] = sum_t h[t] f[u - t] (Definition 4.7), equal to
  ``np.convolve``;
- ``correlate(f, h)``: (h star f)[u] = sum_t h[t] f[u + t] (Definition 4.8), equal to
  ``np.correlate(f, h)``, i.e. ``convolve(f, h[::-1])`` (the Remark after it);
- ``toeplitz(h, n)``: the (n + m - 1) x n matrix H with h_i on the i-th subdiagonal, so that
  ``toeplitz(h, n) @ f == convolve(f, h)`` (the proof that convolution is linear);
- ``fft_convolve(f, h)``: F(f * h) = F f . F h, via scipy.fft with zero padding to n + m - 1;
- ``convolution_kernel(op, n)``: Theorem 4.6 made executable: the kernel h of a linear map
  that commutes with shifts (so that ``op(f) == convolve(f, h)``), or a ``ValueError`` saying
  why there is none; ``is_shift_equivariant(op, n)`` the test alone.

Modes, as NumPy: 'full' (length n + m - 1), 'same' (length max(n, m), centred as
np.convolve), 'valid' (length max(n, m) - min(n, m) + 1).
"""

from __future__ import annotations

import numbers

import numpy as np

from ._validation import check_array, check_choice, check_scalar

__all__ = ["convolve", "correlate", "toeplitz", "fft_convolve", "convolution_kernel",
           "is_shift_equivariant"]

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
    """The (n + m - 1, n) Toeplitz matrix H of notes §4.1: H[i, j] = h[i - j] (0 elsewhere).

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


# ---- Theorem 4.6: a linear map that commutes with shifts is a convolution ---------------------

_PROBES = 3  # random signals on which a callable's linearity is checked


def _impulse_responses(op, n):
    """The columns c_j = op(e_j), (p, n), of a matrix or a callable on length-n signals, and
    the callable's values at random probes (None for a matrix)."""
    if callable(op):
        if n is None:
            raise TypeError("n (the input length) is required when op is a callable")
        n = int(check_scalar(n, name="n", kind=numbers.Integral, low=1))

        def apply(x, what):
            y = np.asarray(op(x))
            if y.ndim != 1 or y.dtype.kind not in "biufc":
                raise ValueError(f"op must map a length-{n} signal to a 1-D numeric array, got "
                                 f"{y.dtype} of shape {y.shape} for {what}")
            return y

        columns = [apply(e, f"the impulse at {j}") for j, e in enumerate(np.eye(n))]
        if len({c.shape for c in columns}) != 1:
            raise ValueError("op must give outputs of one length, got lengths "
                             f"{sorted({c.size for c in columns})}")
        probes = np.random.default_rng(0).standard_normal((_PROBES, n))
        values = [apply(x, "a random signal") for x in probes]
        return np.stack(columns, axis=1), (probes, values)
    M = check_array(op, name="op", ndim=2, dtype=_NUMBERS, allow_device=False)
    if n is not None and int(check_scalar(n, name="n", kind=numbers.Integral, low=1)) \
            != M.shape[1]:
        raise ValueError(f"n must equal the matrix's number of columns {M.shape[1]}, got {n}")
    if M.shape[1] == 0:
        raise ValueError(f"op must have at least one column, got shape {M.shape}")
    return M, None


def _kernel_or_reason(op, n, atol):
    """(h, None) when op commutes with shifts, else (None, why not); ValueError when op is
    not linear."""
    M, probes = _impulse_responses(op, n)
    p, n = M.shape
    scale = float(np.abs(M).max()) if M.size else 0.0
    eps = float(np.finfo(np.result_type(M.dtype, np.float32)).eps)
    tol = (64 * eps * max(scale, 1.0) if atol is None
           else float(check_scalar(atol, name="atol", low=0.0)))
    if probes is not None:  # a callable: is it linear? op(x) against sum_j x_j op(e_j)
        for x, y in zip(*probes, strict=True):
            if y.shape != (p,) or np.abs(y - M @ x).max() > 8 * n * tol * np.abs(x).max():
                raise ValueError("op is not linear: on a random signal x, op(x) differs from "
                                 "sum_j x[j] op(e_j) (Theorem 4.6 is about linear maps)")
    if p < n:
        return None, (f"op maps length-{n} signals to length {p} < {n}: a convolution gives "
                      f"n + m - 1 >= n values (the 'full' mode; 'same' and 'valid' crop it)")
    m = p - n + 1
    h = M[:m, 0]
    for j in range(n):  # impulse j must answer with h delayed by j, zeros elsewhere
        want = np.zeros(p, M.dtype)
        want[j:j + m] = h
        defect = float(np.abs(M[:, j] - want).max())
        if defect > tol:
            return None, (f"op does not commute with shifts: its response to the impulse at "
                          f"{j} is not h delayed by {j}, h = the first p - n + 1 = {m} values "
                          f"of the response at 0 (max difference {defect:.3g} > atol "
                          f"{tol:.3g})")
    return h.copy(), None


def convolution_kernel(op, n=None, atol=None):
    """The kernel h of a linear shift-equivariant map: op(f) == convolve(f, h) (Theorem 4.6).

    Signals are length-n arrays, read as signals on Z that are zero outside [0, n); op maps
    them to length-p arrays (zero outside [0, p)). op commutes with shifts when delaying the
    input by one step delays the output by one step, (S f)[u] = f[u - 1], op(S f) = S op(f),
    for every f with room to be delayed (f[n - 1] = 0).

    Proof (notes §4.1 leaves it as TODO), and the algorithm: f = sum_j f[j] e_j with e_j the
    impulse at j, and e_j = S^j e_0, so by linearity and shift-equivariance
    op(f) = sum_j f[j] S^j op(e_0) = sum_j f[j] h[u - j] = (f * h)[u] with h = op(e_0), the
    impulse response. Conversely ``convolve(., h)`` commutes with shifts (Lemma 4.5).
    So: compute the responses op(e_j) (the columns of the matrix), check that each is
    op(e_0) delayed by j, and return h = op(e_0)[:p - n + 1]. A map that commutes with
    shifts has p = n + m - 1 and is ``toeplitz(h, n)``; ``convolve(., h, 'same')`` and
    'valid', circulant matrices and position-dependent weights do not commute with shifts
    at the ends, and are refused.

    Parameters
    ----------
    op : array (p, n), or a callable mapping an array (n,) to an array (p,)
        The linear map. A callable is also checked for linearity on a few random signals
        (against the sum of its impulse responses).
    n : int, the input length; required for a callable, checked against a matrix
    atol : float, optional
        Largest entry difference accepted between a response and the delayed h; default
        64 eps of the responses' dtype times their largest magnitude (at least 1).

    Returns
    -------
    h : ndarray (p - n + 1,), the responses' dtype

    Raises
    ------
    ValueError
        op does not commute with shifts (the message names the first impulse that shows
        it), or a callable is not linear.

    Examples
    --------
    >>> import numpy as np
    >>> from nnkit.signal import convolution_kernel, convolve, toeplitz
    >>> convolution_kernel(toeplitz([1.0, -2.0, 0.5], 4))
    array([ 1. , -2. ,  0.5])
    >>> convolution_kernel(lambda f: convolve(f, [0.25, 0.5, 0.25]), n=6)
    array([0.25, 0.5 , 0.25])
    """
    h, reason = _kernel_or_reason(op, n, atol)
    if h is None:
        raise ValueError(reason)
    return h


def is_shift_equivariant(op, n=None, atol=None) -> bool:
    """Whether the linear map ``op`` (a (p, n) matrix or a callable) commutes with shifts, in
    the sense of ``convolution_kernel``: True exactly when it is a convolution. A ValueError
    when a callable is not linear."""
    return _kernel_or_reason(op, n, atol)[1] is None
