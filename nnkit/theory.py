"""Counting and capacity results of notes §1.2, §1.4 and §2.5, as exact numbers.

Counts are Python integers computed with ``math.comb`` (no floating point, no overflow);
``novikoff_bound`` is the exact floor of R^2/gamma^2 for the given floats;
``novikoff_lemmas`` evaluates both sides of Lemmas 1.1 and 1.2 along a perceptron run. The two
Hopfield formulas are floats.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
from scipy.special import erfc

from ._validation import check_array, check_scalar

__all__ = [
    "novikoff_bound",
    "novikoff_lemmas",
    "NovikoffLemmas",
    "cover_count",
    "zaslavsky_regions",
    "montufar_lower_bound",
    "hopfield_flip_probability",
    "hopfield_capacity",
]


# Counts are exact integers with about 0.3 * s digits: arguments are capped so that one call
# stays well under a second.
MAX_COUNT_ARGUMENT = 100_000
MAX_DIGITS = 1_000_000


def _integer(value, name: str, low: int, high: int = MAX_COUNT_ARGUMENT) -> int:
    return int(check_scalar(value, name=name, kind=numbers.Integral, low=low, high=high))


def _binomial_sum(a: int, k_max: int) -> int:
    """sum_{k=0}^{k_max} binom(a, k); binom(a, k+1) = binom(a, k) (a - k) / (k + 1), exactly."""
    term, total = 1, 1
    for k in range(min(k_max, a)):
        term = term * (a - k) // (k + 1)
        total += term
    return total


def novikoff_bound(R, gamma) -> int:
    """Most updates the perceptron makes on gamma-separable data of radius R (Novikoff, 1962).

    floor(R^2 / gamma^2), computed exactly (rational arithmetic on the given floats). The
    proof in notes §1.2 assumes no bias; with a bias apply it to the inputs (x, 1), i.e. R and gamma
    of the augmented data.

    Parameters
    ----------
    R : float > 0
        max ||x|| over the data.
    gamma : float, 0 < gamma <= R
        min_i y_i w^T x_i for some unit w (the larger, the tighter the bound).

    Returns
    -------
    int

    Examples
    --------
    >>> novikoff_bound(1.0, 0.25)
    16
    """
    R = check_scalar(R, name="R", low=0, low_inclusive=False)
    gamma = check_scalar(gamma, name="gamma", low=0, low_inclusive=False)
    if gamma > R:
        raise ValueError(f"gamma must be <= R (|w^T x| <= ||x|| <= R for a unit w), got "
                         f"gamma={gamma!r} > R={R!r}")
    return math.floor(Fraction(R) ** 2 / Fraction(gamma) ** 2)


@dataclass
class NovikoffLemmas:
    """Both sides of Novikoff's lemmas at every update t = 0..T of a perceptron run.

    Attributes
    ----------
    alignment : ndarray float64 (T + 1,)
        w*^T w_t (Lemma 1.1: >= t gamma).
    alignment_bound : ndarray float64 (T + 1,)
        t gamma.
    norm : ndarray float64 (T + 1,)
        ||w_t|| (Lemma 1.2: <= R sqrt(t)).
    norm_bound : ndarray float64 (T + 1,)
        R sqrt(t).
    gamma, R : float
        min_i y_i w*^T x_i for the unit w*, and max_i ||x_i||.
    """

    alignment: np.ndarray
    alignment_bound: np.ndarray
    norm: np.ndarray
    norm_bound: np.ndarray
    gamma: float
    R: float


def novikoff_lemmas(coef_path, X, y, w_star) -> NovikoffLemmas:
    """Lemmas 1.1 and 1.2 of notes §1.2 along the iterates of a perceptron run (no bias).

    For gamma-separable data (a unit w* with y_i w*^T x_i >= gamma > 0) and R = max ||x_i||,
    the perceptron's iterates from w_0 = 0 satisfy w*^T w_t >= t gamma (1.1) and
    ||w_t|| <= R sqrt(t) (1.2) after every update t; together they give Theorem 1.3,
    t <= R^2 / gamma^2. The path comes from ``Perceptron(fit_intercept=False,
    record_path=True).fit(X, y).coef_path_``.

    Parameters
    ----------
    coef_path : array_like (T + 1, D)
        w_0, ..., w_T.
    X : array_like (S, D)
    y : array_like (S,) in {-1, +1}
    w_star : array_like (D,), nonzero
        A separating direction; scaled to unit norm here.

    Returns
    -------
    NovikoffLemmas
    """
    path = check_array(coef_path, name="coef_path", ndim=2, finite=True)
    X = check_array(X, name="X", ndim=2, finite=True)
    y = check_array(y, name="y", ndim=1, finite=True)
    w = check_array(w_star, name="w_star", ndim=1, finite=True)
    for name, arr in (("coef_path", path), ("X", X), ("y", y), ("w_star", w)):
        if arr.dtype.kind not in "iuf":
            raise TypeError(f"{name} must hold real numbers, got dtype {arr.dtype}")
    D = X.shape[1]
    if path.shape[1] != D or w.shape[0] != D or y.shape[0] != X.shape[0] or not len(X):
        raise ValueError(f"shapes disagree: coef_path {path.shape}, X {X.shape} (S >= 1), "
                         f"y {y.shape}, w_star {w.shape}; expected (T+1, D), (S, D), (S,), "
                         f"(D,)")
    if not np.isin(y, (-1, 1)).all():
        raise ValueError("y must hold only -1 and +1")
    norm = float(np.linalg.norm(w))
    if norm == 0.0:
        raise ValueError("w_star must be nonzero (it is scaled to unit norm)")
    u = w.astype(np.float64) / norm
    Xf = X.astype(np.float64)
    gamma = float(np.min(y * (Xf @ u)))
    if gamma <= 0:
        raise ValueError(f"w_star does not separate (X, y): min_i y_i w*^T x_i = {gamma!r} "
                         f"<= 0; the lemmas need gamma > 0")
    R = float(np.max(np.linalg.norm(Xf, axis=1)))
    t = np.arange(path.shape[0], dtype=np.float64)
    pathf = path.astype(np.float64)
    return NovikoffLemmas(pathf @ u, t * gamma, np.linalg.norm(pathf, axis=1), R * np.sqrt(t),
                          gamma, R)


def cover_count(s, n) -> int:
    """Cover's count of linearly separable dichotomies (Cover, 1965; homogeneous case).

    The number of labellings y in {-1, +1}^s of s points in general position in R^n that a
    hyperplane through the origin realises (exists w: y_i w^T x_i > 0 for all i):

        C(s, n) = 2 sum_{k=0}^{n-1} binom(s - 1, k),

    which notes §1.2 (Theorem 1.4) writes C(s + 1, n) = 2 sum_{i=0}^{n-1} binom(s, i).
    C(s, n) = 2^s when s <= n; C(0, n) = 1 (the empty labelling).

    Parameters
    ----------
    s : int, 0 <= s <= 100000
        Number of points.
    n : int, 1 <= n <= 100000
        Dimension.

    Returns
    -------
    int

    Examples
    --------
    >>> cover_count(4, 2), cover_count(3, 3)
    (8, 8)
    """
    s = _integer(s, "s", 0)
    n = _integer(n, "n", 1)
    if s == 0:
        return 1
    return 2 * _binomial_sum(s - 1, n - 1)


def zaslavsky_regions(m, n) -> int:
    """R(m) = sum_{i=0}^{min(n, m)} binom(m, i): regions of m general hyperplanes in R^n.

    Zaslavsky (1975): the most connected regions that m hyperplanes cut R^n into, attained in
    general position; so the most activation patterns of a layer of m units on R^n.

    Parameters
    ----------
    m : int, 0 <= m <= 100000
        Number of hyperplanes (hidden units).
    n : int, 0 <= n <= 100000
        Input dimension.

    Returns
    -------
    int

    Examples
    --------
    >>> zaslavsky_regions(3, 2)
    7
    """
    m = _integer(m, "m", 0)
    n = _integer(n, "n", 0)
    return _binomial_sum(m, n)


def montufar_lower_bound(m, n, L) -> int:
    """Montufar et al. (2014): a ReLU network with L layers of width m >= n on R^n can have

        R(m) * floor(m / n)^(n (L - 1))

    linear regions, R(m) = ``zaslavsky_regions(m, n)``. Notes §2.5 (Theorem 2.9) states it
    for m > n; the paper's construction needs only m >= n (with m = n it is R(n) = 2^n).

    Parameters
    ----------
    m : int, n <= m <= 100000
        Width of each hidden layer.
    n : int >= 1
        Input dimension.
    L : int, 1 <= L <= 100000
        Number of hidden layers; ``ValueError`` when the result would exceed 10^6 digits.

    Returns
    -------
    int

    Examples
    --------
    >>> montufar_lower_bound(4, 2, 3)
    176
    """
    n = _integer(n, "n", 1)
    m = _integer(m, "m", n)
    L = _integer(L, "L", 1)
    if n * (L - 1) * math.log10(max(m // n, 1)) > MAX_DIGITS:
        raise ValueError(f"montufar_lower_bound({m}, {n}, {L}) has more than {MAX_DIGITS} "
                         f"digits; use fewer layers L")
    return zaslavsky_regions(m, n) * (m // n) ** (n * (L - 1))


def hopfield_flip_probability(alpha):
    """P[a stored bit flips] at load alpha = s/n: (1 - erf(sqrt(1 / (2 alpha)))) / 2.

    The crosstalk C ~ N(0, alpha) of notes §1.4 exceeds 1 against the bit with this
    probability. Computed as erfc(sqrt(1 / (2 alpha))) / 2, the same number without the
    cancellation at small alpha; alpha = 0 gives 0.

    Parameters
    ----------
    alpha : float or array_like of floats, >= 0

    Returns
    -------
    float, or ndarray float64 of alpha's shape

    Examples
    --------
    >>> round(hopfield_flip_probability(0.138), 4)
    0.0036
    """
    if isinstance(alpha, numbers.Real) and not isinstance(alpha, (bool, np.bool_)):
        alpha = check_scalar(alpha, name="alpha", low=0)
        return float(_flip(np.float64(alpha)))
    arr = check_array(alpha, name="alpha", finite=True)
    if arr.dtype.kind not in "iuf":
        raise TypeError(f"alpha must hold real numbers, got {arr.dtype}")
    if (arr < 0).any():
        raise ValueError(f"alpha must be >= 0, got min {arr.min()!r}")
    return _flip(arr.astype(np.float64))


def _flip(alpha):
    with np.errstate(divide="ignore", over="ignore"):   # alpha -> 0: sqrt(inf), erfc = 0
        return erfc(np.sqrt(0.5 / alpha)) / 2.0


def hopfield_capacity(n) -> float:
    """Patterns a Hebbian Hopfield net of n neurons retrieves with high probability: n / (2 ln n).

    We return McEliece, Posner, Rodemich and Venkatesh (1987)'s n / (2 ln n), the bound for
    every stored pattern being a fixed point with probability -> 1; notes §1.4 writes
    n / (2 log2 n), which is smaller by the factor ln 2 and is not the published result.

    Parameters
    ----------
    n : int, 2 <= n <= 2^53

    Returns
    -------
    float

    Examples
    --------
    >>> round(hopfield_capacity(1000), 2)
    72.38
    """
    n = _integer(n, "n", 2, high=2**53)
    return n / (2.0 * math.log(n))
