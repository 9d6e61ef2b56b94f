"""nk.theory: the exact counts against brute force (linear programs), the recursions of the
proofs, the Hopfield crosstalk formula against a sampled Hebbian network, and bad input."""

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from scipy.optimize import linprog

from nnkit import theory


# --------------------------------------------------------------- brute-force counts
def _general_position(X) -> bool:
    """Every subset of at most n of the s points (rows) is linearly independent."""
    s, n = X.shape
    return all(np.linalg.matrix_rank(X[list(c)]) == len(c)
               for k in range(1, min(s, n) + 1) for c in itertools.combinations(range(s), k))


def _homogeneously_separable(X, y) -> bool:
    """Is there w with y_i w^T x_i > 0 for all i?  By scaling, iff y_i w^T x_i >= 1 is feasible."""
    res = linprog(np.zeros(X.shape[1]), A_ub=-(y[:, None] * X), b_ub=-np.ones(len(y)),
                  bounds=[(None, None)] * X.shape[1], method="highs")
    assert res.status in (0, 2), res.message     # 0: feasible, 2: infeasible
    return res.status == 0


def _brute_force_cover(X) -> int:
    return sum(_homogeneously_separable(X, np.array(y, dtype=float))
               for y in itertools.product([-1.0, 1.0], repeat=len(X)))


@pytest.mark.parametrize("s, n", [(s, n) for n in (1, 2, 3) for s in range(1, 8)])
def test_cover_count_equals_linear_program_brute_force(s, n):
    X = np.random.default_rng(100 * s + n).standard_normal((s, n))
    assert _general_position(X)
    assert theory.cover_count(s, n) == _brute_force_cover(X)


@given(seed=st.integers(0, 2**32 - 1), s=st.integers(1, 6), n=st.integers(1, 4))
def test_cover_count_brute_force_on_random_points(seed, s, n):
    X = np.random.default_rng(seed).uniform(-1, 1, (s, n))
    if _general_position(X):                          # almost surely
        assert theory.cover_count(s, n) == _brute_force_cover(X)


def _region_exists(A, c, signs) -> bool:
    """Is the open cell {x : signs_i (a_i^T x + c_i) > 0 for all i} non-empty?  max t s.t.
    signs_i (a_i^T x + c_i) >= t, t <= 1; the cell exists iff the optimum t is positive."""
    m, n = A.shape
    A_ub = np.hstack([-(signs[:, None] * A), np.ones((m, 1))])       # (m, n + 1) over (x, t)
    res = linprog(np.append(np.zeros(n), -1.0), A_ub=A_ub, b_ub=signs * c,
                  bounds=[(None, None)] * n + [(None, 1.0)], method="highs")
    assert res.status == 0, res.message
    return -res.fun > 1e-9


@pytest.mark.parametrize("m, n", [(1, 1), (3, 1), (2, 2), (4, 2), (5, 2), (3, 3), (5, 3)])
def test_zaslavsky_regions_equal_cells_of_random_hyperplanes(m, n):
    rng = np.random.default_rng(7 * m + n)
    A, c = rng.standard_normal((m, n)), rng.standard_normal(m)   # hyperplanes a_i^T x + c_i = 0
    cells = sum(_region_exists(A, c, np.array(sg, dtype=float))
                for sg in itertools.product([-1.0, 1.0], repeat=m))
    assert theory.zaslavsky_regions(m, n) == cells


# ---------------------------------------------------------- closed forms, recursions
@given(s=st.integers(1, 60), n=st.integers(2, 30))
def test_cover_count_satisfies_the_proofs_recursion(s, n):
    # C(s + 1, n) = C(s, n) + C(s, n - 1), as in the proof of Theorem 1.4
    assert theory.cover_count(s + 1, n) == theory.cover_count(s, n) + theory.cover_count(s, n - 1)


@given(n=st.integers(1, 40))
def test_cover_count_closed_forms(n):
    assert theory.cover_count(n, n) == 2 ** n                 # every labelling when s <= n
    assert theory.cover_count(2 * n, n) == 2 ** (2 * n - 1)   # half of them at s = 2n
    assert theory.cover_count(1, n) == 2 and theory.cover_count(n + 3, 1) == 2
    assert theory.cover_count(0, n) == 1


def test_cover_count_matches_the_notes_statement():
    for s, n in itertools.product(range(0, 12), range(1, 6)):
        assert theory.cover_count(s + 1, n) == 2 * sum(math.comb(s, i) for i in range(n))
    assert isinstance(theory.cover_count(200, 50), int)       # exact, beyond float range
    assert theory.cover_count(2000, 1000) == 2 ** 1999
    assert theory.cover_count(100_000, 50_000) == 2 ** 99_999    # the largest allowed, fast


@given(m=st.integers(1, 40), n=st.integers(1, 40))
def test_zaslavsky_recursion_and_saturation(m, n):
    # deletion-restriction: R(m, n) = R(m - 1, n) + R(m - 1, n - 1)
    assert theory.zaslavsky_regions(m, n) == (theory.zaslavsky_regions(m - 1, n)
                                              + theory.zaslavsky_regions(m - 1, n - 1))
    if m <= n:
        assert theory.zaslavsky_regions(m, n) == 2 ** m


def test_montufar_lower_bound_values():
    assert theory.montufar_lower_bound(4, 2, 3) == 11 * 2 ** 4
    assert theory.montufar_lower_bound(6, 2, 1) == theory.zaslavsky_regions(6, 2)
    assert theory.montufar_lower_bound(3, 1, 5) == 4 * 3 ** 4
    assert theory.montufar_lower_bound(5, 5, 4) == 2 ** 5
    big = theory.montufar_lower_bound(100, 3, 10)
    assert big == theory.zaslavsky_regions(100, 3) * 33 ** 27 and isinstance(big, int)


@given(m=st.integers(1, 30), n=st.integers(1, 5), L=st.integers(1, 6))
def test_montufar_grows_with_depth_and_exceeds_one_layer(m, n, L):
    if m < n:
        return
    assert theory.montufar_lower_bound(m, n, L + 1) >= theory.montufar_lower_bound(m, n, L)
    assert theory.montufar_lower_bound(m, n, L) >= theory.zaslavsky_regions(m, n)


def test_novikoff_bound_is_the_exact_floor():
    assert theory.novikoff_bound(1.0, 0.25) == 16
    assert theory.novikoff_bound(3, 1) == 9 and theory.novikoff_bound(1.0, 1.0) == 1
    # 0.1 as a double is slightly above 1/10, so the exact floor is 99, not 100
    assert theory.novikoff_bound(1.0, 0.1) == math.floor(1 / Fraction(0.1) ** 2) == 99
    assert theory.novikoff_bound(1.0, 1e-6) == math.floor(1 / Fraction(1e-6) ** 2)


@given(R=st.floats(1e-3, 1e3), ratio=st.floats(1e-3, 1.0))
def test_novikoff_bound_brackets_the_float_ratio(R, ratio):
    gamma = R * ratio
    bound = theory.novikoff_bound(R, gamma)
    assert bound <= (R / gamma) ** 2 * (1 + 1e-12) and bound + 1 > (R / gamma) ** 2 * (1 - 1e-12)


# -------------------------------------------------------------------------- Hopfield
def test_flip_probability_formula_and_limits():
    for alpha in (0.01, 0.05, 0.138, 0.5, 2.0):
        p = theory.hopfield_flip_probability(alpha)
        printed = (1 - math.erf(math.sqrt(1 / (2 * alpha)))) / 2   # cancels: ~1e-16 absolute
        assert p == pytest.approx(printed, rel=0, abs=1e-15)
        assert p == pytest.approx(math.erfc(math.sqrt(1 / (2 * alpha))) / 2, rel=1e-13)
    assert theory.hopfield_flip_probability(0) == 0.0
    assert theory.hopfield_flip_probability(1e-3) > 0            # erfc keeps the tail
    p = theory.hopfield_flip_probability(np.array([[0.0, 0.05], [0.138, 10.0]]))
    assert p.shape == (2, 2) and np.all(np.diff(p.ravel()) > 0) and p.max() < 0.5


def test_flip_probability_predicts_a_sampled_hebbian_network():
    """The share of stored bits that one update flips, W = (1/n) sum x x^T with w_ii = 0."""
    rng = np.random.default_rng(0)
    n, s = 1000, 250                                              # alpha = 0.25
    P = rng.choice([-1.0, 1.0], size=(s, n))                      # (s, n) patterns
    W = P.T @ P / n                                               # (n, n)
    np.fill_diagonal(W, 0.0)                                      # as notes §1.4 constrains
    H = P @ W                                                     # (s, n) fields H_{t,i}
    flipped = np.where(H >= 0, 1.0, -1.0) != P                    # sgn(0) = +1
    assert flipped.mean() == pytest.approx(theory.hopfield_flip_probability(s / n), rel=0.1)


def test_hopfield_capacity_is_mceliece_ln_not_log2():
    assert theory.hopfield_capacity(1000) == pytest.approx(1000 / (2 * math.log(1000)))
    assert theory.hopfield_capacity(1000) == pytest.approx(
        1000 / (2 * math.log2(1000)) / math.log(2))              # notes §1.4's value / ln 2
    assert theory.hopfield_capacity(2) == pytest.approx(1 / math.log(2))


# ------------------------------------------------------------------------ bad input
@pytest.mark.parametrize("fn, args, exc, match", [
    (theory.cover_count, (-1, 2), ValueError, "s must be >= 0"),
    (theory.cover_count, (3, 0), ValueError, "n must be >= 1"),
    (theory.cover_count, (3.0, 2), TypeError, "s must be an integer"),
    (theory.zaslavsky_regions, (2, -1), ValueError, "n must be >= 0"),
    (theory.montufar_lower_bound, (2, 3, 1), ValueError, "m must be >= 3"),
    (theory.montufar_lower_bound, (4, 2, 0), ValueError, "L must be >= 1"),
    (theory.novikoff_bound, (1.0, 0.0), ValueError, "gamma must be > 0"),
    (theory.novikoff_bound, (1.0, 2.0), ValueError, "gamma must be <= R"),
    (theory.novikoff_bound, (float("nan"), 0.5), ValueError, "R must be finite"),
    (theory.hopfield_flip_probability, (-0.1,), ValueError, "alpha must be >= 0"),
    (theory.hopfield_flip_probability, ([0.1, np.nan],), ValueError, "alpha must be finite"),
    (theory.hopfield_flip_probability, ("0.1",), TypeError, "alpha"),
    (theory.hopfield_capacity, (1,), ValueError, "n must be >= 2"),
    (theory.hopfield_capacity, (10**400,), ValueError, "n must be <="),
    (theory.cover_count, (10**6, 2), ValueError, "s must be <= 100000"),
    (theory.montufar_lower_bound, (10**5, 10, 10**5), ValueError, "digits"),
    (theory.hopfield_capacity, (True,), TypeError, "n must be an integer"),
    (theory.novikoff_lemmas, (np.zeros((2, 3)), np.eye(2), [1, -1], [1.0, 0]), ValueError,
     "shapes disagree"),
    (theory.novikoff_lemmas, (np.zeros((2, 2)), np.eye(2), [1, 0], [1.0, 0]), ValueError,
     "y must hold only -1 and \\+1"),
    (theory.novikoff_lemmas, (np.zeros((2, 2)), np.eye(2), [1, -1], [0.0, 0]), ValueError,
     "w_star must be nonzero"),
    (theory.novikoff_lemmas, (np.zeros((2, 2)), np.eye(2), [1, -1], [1.0, 1.0]), ValueError,
     "does not separate"),
    (theory.novikoff_lemmas, (np.zeros((2, 2)), np.eye(2), [1, -1], ["a", "b"]), TypeError,
     "w_star must hold real numbers"),
    (theory.novikoff_lemmas, (np.zeros(2), np.eye(2), [1, -1], [1.0, 0]), ValueError,
     "coef_path must be 2-dimensional"),
])
def test_bad_arguments_are_named(fn, args, exc, match):
    with pytest.raises(exc, match=match):
        fn(*args)


junk = st.one_of(st.integers(-5, 10**20), st.floats(allow_nan=True, allow_infinity=True),
                 st.booleans(), st.none(), st.text(max_size=3), st.lists(st.floats(), max_size=3),
                 st.complex_numbers(max_magnitude=3))


@given(a=junk, b=junk, c=junk)
@example(a=2.2250738585e-313, b=None, c=None)   # subnormal alpha overflowed 0.5 / alpha
def test_theory_fuzz_raises_only_value_or_type_errors(a, b, c):
    calls = [(theory.cover_count, (a, b)), (theory.zaslavsky_regions, (a, b)),
             (theory.montufar_lower_bound, (a, b, c)), (theory.novikoff_bound, (a, b)),
             (theory.hopfield_flip_probability, (a,)), (theory.hopfield_capacity, (a,)),
             (theory.novikoff_lemmas, (a, b, c, a))]
    for fn, args in calls:
        try:
            fn(*args)
        except (ValueError, TypeError):
            pass
