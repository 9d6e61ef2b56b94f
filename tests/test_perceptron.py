"""McCulloch-Pitts neuron and the perceptron: the compiled epoch loop against its plain twin,
scikit-learn's conventions, Novikoff's bound on random separable data and his two lemmas at
every update (notes §1.2), and bad input."""

import warnings

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils.estimator_checks import parametrize_with_checks

from nnkit._ext import perceptron as perceptron_ext
from nnkit.classic.perceptron import (
    McCullochPitts,
    Perceptron,
    _activation_reference,
    _perceptron_epochs_reference,
    make_separable,
)
from nnkit.theory import novikoff_bound, novikoff_lemmas

perceptron_epochs = perceptron_ext.perceptron_epochs

XOR_X = np.array([[0.0, 0.0], [1.0, 1.0], [0.0, 1.0], [1.0, 0.0]])
XOR_Y = np.array([1, 1, -1, -1])


# ---------------------------------------------------------------- McCulloch-Pitts
@pytest.mark.parametrize("sigma, theta, table", [
    ([1, 1], 2, [0, 0, 0, 1]),      # AND
    ([1, 1], 1, [0, 1, 1, 1]),      # OR
    ([-1, -1], 0, [1, 0, 0, 0]),    # NOR
])
def test_mcculloch_pitts_realises_logic_gates(sigma, theta, table):
    X = np.array([[0, 0], [0, 1], [1, 0], [1, 1]])
    assert McCullochPitts(sigma, theta).predict(X).tolist() == table


@given(sigma=hnp.arrays(np.int64, st.integers(1, 6), elements=st.sampled_from([-1, 1])),
       theta=st.floats(-7, 7), data=st.data())
def test_mcculloch_pitts_is_the_threshold_formula(sigma, theta, data):
    X = data.draw(hnp.arrays(np.int8, (data.draw(st.integers(0, 5)), sigma.size),
                             elements=st.sampled_from([0, 1])))
    expected = [int(sum(int(s) * int(x) for s, x in zip(sigma, row, strict=True)) >= theta)
                for row in X]
    out = McCullochPitts(sigma, theta).predict(X)
    assert out.tolist() == expected and out.dtype == np.int64
    if len(X):
        assert int(McCullochPitts(sigma, theta).predict(X[0])) == expected[0]


@pytest.mark.parametrize("kwargs, exc, match", [
    ({"sigma": [1, 0], "theta": 1}, ValueError, "sigma"),
    ({"sigma": [], "theta": 1}, ValueError, "sigma"),
    ({"sigma": [[1, -1]], "theta": 1}, ValueError, "sigma must be 1-dimensional"),
    ({"sigma": [1, -1], "theta": float("nan")}, ValueError, "theta must be finite"),
    ({"sigma": [1, -1], "theta": "1"}, TypeError, "theta"),
])
def test_mcculloch_pitts_rejects_bad_parameters(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        McCullochPitts(**kwargs)


@pytest.mark.parametrize("X, match", [
    ([[0, 1, 1]], "n=2"),
    ([[0, 2]], "binary"),
    ([[0.0, np.nan]], "binary"),
    ([[0.5, 1.0]], "binary"),
])
def test_mcculloch_pitts_rejects_bad_inputs(X, match):
    with pytest.raises(ValueError, match=match):
        McCullochPitts([1, -1], 0).predict(X)


# ------------------------------------------------------- compiled loop == plain twin
@st.composite
def perceptron_problems(draw):
    S, D = draw(st.integers(0, 8)), draw(st.integers(1, 19))   # D >= 8: all partial sums
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    X = draw(hnp.arrays(dtype, (S, D), elements=st.floats(-4, 4, width=32)))
    y = draw(hnp.arrays(np.float64, (S,), elements=st.sampled_from([-1.0, 1.0])))
    order = np.array(draw(st.permutations(range(S))), dtype=np.intp)
    w0 = draw(hnp.arrays(np.float64, (D,), elements=st.floats(-2, 2)))
    b0 = draw(hnp.arrays(np.float64, (1,), elements=st.floats(-2, 2)))
    return X, y, w0, b0, order, draw(st.integers(1, 6)), draw(st.booleans())


@given(problem=perceptron_problems())
def test_compiled_epochs_equal_the_plain_twin_bit_for_bit(problem):
    X, y, w0, b0, order, max_epochs, fit_intercept = problem
    w, b, w_ref, b_ref = w0.copy(), b0.copy(), w0.copy(), b0.copy()
    got = perceptron_epochs(X, y, w, b, order, max_epochs, fit_intercept)
    want = _perceptron_epochs_reference(X, y, w_ref, b_ref, order, max_epochs, fit_intercept)
    assert got == want
    assert w.tobytes() == w_ref.tobytes() and b.tobytes() == b_ref.tobytes()


@given(problem=perceptron_problems())
def test_compiled_epochs_record_the_twins_updates(problem):
    """With ``mistakes`` the loop writes the row of every update, as the twin lists them,
    and computes the same w and b as without it."""
    X, y, w0, b0, order, max_epochs, fit_intercept = problem
    w, b, w_ref, b_ref = w0.copy(), b0.copy(), w0.copy(), b0.copy()
    mistakes, listed = np.full(max_epochs * len(X), -1, np.int64), []
    got = perceptron_epochs(X, y, w, b, order, max_epochs, fit_intercept, mistakes)
    want = _perceptron_epochs_reference(X, y, w_ref, b_ref, order, max_epochs, fit_intercept,
                                        listed)
    assert got == want and mistakes[:got[0]].tolist() == listed
    assert (mistakes[got[0]:] == -1).all()
    assert w.tobytes() == w_ref.tobytes() and b.tobytes() == b_ref.tobytes()


def test_mistakes_buffer_too_short_is_refused():
    X, y = np.eye(2), np.array([1.0, -1.0])
    with pytest.raises(ValueError, match="mistakes has 3 entries"):
        perceptron_epochs(X, y, np.zeros(2), np.zeros(1), np.arange(2, dtype=np.intp), 2, True,
                          np.zeros(3, np.int64))


@given(problem=perceptron_problems())
def test_compiled_epochs_resume_one_pass_at_a_time(problem):
    """k calls of one pass each == one call of k passes (the shuffle path relies on it)."""
    X, y, w0, b0, order, max_epochs, fit_intercept = problem
    w, b, w1, b1 = w0.copy(), b0.copy(), w0.copy(), b0.copy()
    total, epochs, converged = perceptron_epochs(X, y, w, b, order, max_epochs, fit_intercept)
    made, runs, done = 0, 0, False
    while runs < max_epochs and not done:
        m, _, done = perceptron_epochs(X, y, w1, b1, order, 1, fit_intercept)
        made, runs = made + m, runs + 1
    assert (made, runs, done) == (total, epochs, converged)
    assert w.tobytes() == w1.tobytes() and b.tobytes() == b1.tobytes()


@given(X=hnp.arrays(np.float64, st.tuples(st.integers(1, 4), st.integers(1, 40)),
                    elements=st.floats(-1e6, 1e6)),
       data=st.data())
def test_compiled_activation_sums_in_the_twins_order(X, data):
    """Bit-equal w.x + b on wide-range values, where another summation order would differ."""
    w = data.draw(hnp.arrays(np.float64, (X.shape[1],), elements=st.floats(-1e6, 1e6)))
    b = data.draw(st.floats(-1e6, 1e6))
    out = np.empty(X.shape[0])
    perceptron_ext.perceptron_activations(X, w, b, out)
    assert out.tolist() == [_activation_reference(x, w, b) for x in X]


def test_no_samples_is_one_clean_pass_in_both():
    # hypothesis found the twin and the kernel disagreeing here (S = 0)
    X, y, order = np.zeros((0, 2)), np.zeros(0), np.zeros(0, dtype=np.intp)
    for fn in (perceptron_epochs, _perceptron_epochs_reference):
        assert fn(X, y, np.zeros(2), np.zeros(1), order, 3, True) == (0, 1, True)
        assert fn(X, y, np.zeros(2), np.zeros(1), order, 0, True) == (0, 0, False)


def test_one_update_is_w_plus_y_x():
    X, y = np.array([[2.0, -1.0]]), np.array([-1.0])
    w, b = np.zeros(2), np.zeros(1)
    assert perceptron_epochs(X, y, w, b, np.array([0], dtype=np.intp), 1, True) == (1, 1, False)
    assert w.tolist() == [-2.0, 1.0] and b.tolist() == [-1.0]


# ------------------------------------------------------------- estimator behaviour
@parametrize_with_checks([Perceptron(), Perceptron(shuffle=True, random_state=0)])
def test_sklearn_compatible_estimator(estimator, check):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        check(estimator)


def test_xor_stops_at_max_epochs_with_a_convergence_warning():
    with pytest.warns(ConvergenceWarning, match="max_epochs=25"):
        clf = Perceptron(max_epochs=25).fit(XOR_X, XOR_Y)
    assert clf.converged_ is False and clf.n_iter_ == 25 and clf.n_updates_ >= 25
    assert clf.score(XOR_X, XOR_Y) < 1.0 and clf.margin(XOR_X, XOR_Y) <= 0


def test_separable_data_converges_without_warning_and_separates():
    X, y, _ = make_separable(200, 5, 0.1, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        clf = Perceptron().fit(X, y)
    assert clf.converged_ and clf.score(X, y) == 1.0 and clf.margin(X, y) > 0
    w, b = clf.coef_[0], clf.intercept_[0]
    assert clf.margin(X, y) == pytest.approx(np.min(y * (X @ w + b)) / np.linalg.norm(w))
    assert clf.coef_.shape == (1, 5) and clf.intercept_.shape == (1,)


def test_matches_scikit_learn_perceptron_update_for_update():
    """sklearn's Perceptron (eta0=1, no penalty, no shuffle) is the same algorithm."""
    from sklearn.linear_model import Perceptron as SkPerceptron

    rng = np.random.default_rng(0)
    X = rng.integers(-3, 4, (60, 4)).astype(np.float64)    # integers: exact arithmetic
    y = np.where(X @ [1.0, 2.0, -1.0, 0.5] + 0.25 > 0, 1, -1)
    ours = Perceptron().fit(X, y)
    theirs = SkPerceptron(eta0=1.0, alpha=0.0, penalty=None, shuffle=False, tol=None,
                          max_iter=ours.n_iter_).fit(X, y)
    np.testing.assert_array_equal(ours.coef_, theirs.coef_)
    np.testing.assert_array_equal(ours.intercept_, theirs.intercept_)


def test_any_two_labels_map_to_minus_and_plus_one():
    X = np.array([[-1.0], [-2.0], [1.0], [2.0]])
    clf = Perceptron().fit(X, ["cat", "cat", "dog", "dog"])
    assert clf.classes_.tolist() == ["cat", "dog"] and clf.coef_[0, 0] > 0
    assert clf.predict([[5.0], [-5.0]]).tolist() == ["dog", "cat"]
    assert clf.margin(X, ["cat", "cat", "dog", "dog"]) > 0
    with pytest.raises(ValueError, match="not in classes_"):
        clf.margin(X, ["cat", "cat", "dog", "cow"])


def test_shuffle_is_seeded_and_still_converges():
    X, y, _ = make_separable(100, 3, 0.05, random_state=1)
    a = Perceptron(shuffle=True, random_state=3).fit(X, y)
    b = Perceptron(shuffle=True, random_state=3).fit(X, y)
    assert a.converged_ and np.array_equal(a.coef_, b.coef_) and a.n_updates_ == b.n_updates_


@pytest.mark.parametrize("X, y, exc, match", [
    (np.zeros((3, 2)), [0, 1, 2], ValueError, "Only binary classification"),
    (np.zeros((3, 2)), [1, 1, 1], ValueError, "1 class"),
    ([[0.0, np.nan], [1.0, 1.0]], [0, 1], ValueError, "NaN"),
    ([[0.0, np.inf], [1.0, 1.0]], [0, 1], ValueError, "infinity"),
    (np.zeros((3, 2)), [0.5, 1.5, 2.5], ValueError, "Unknown label type"),
    (np.zeros((3, 2)), [0, 1], ValueError, "inconsistent numbers of samples"),
])
def test_fit_rejects_bad_data(X, y, exc, match):
    with pytest.raises(exc, match=match):
        Perceptron().fit(X, y)


@pytest.mark.parametrize("params, exc, match", [
    ({"max_epochs": 0}, ValueError, "max_epochs must be >= 1"),
    ({"max_epochs": 2.5}, TypeError, "max_epochs must be an integer"),
    ({"shuffle": "yes"}, TypeError, "shuffle must be a bool"),
    ({"fit_intercept": None}, TypeError, "fit_intercept"),
    ({"record_path": 1}, TypeError, "record_path"),
])
def test_fit_rejects_bad_hyper_parameters(params, exc, match):
    with pytest.raises(exc, match=match):
        Perceptron(**params).fit(XOR_X, XOR_Y)


def test_wrong_number_of_features_after_fit():
    clf = Perceptron().fit(XOR_X[:2], [0, 1])
    with pytest.raises(ValueError, match="X has 3 features, but Perceptron is expecting 2"):
        clf.predict(np.zeros((1, 3)))


@given(X=st.sampled_from([np.float64, np.float32, np.int64, np.complex128]).flatmap(
           lambda dt: hnp.arrays(dt, hnp.array_shapes(min_dims=0, max_dims=3, max_side=4))),
       y=st.lists(st.sampled_from([0, 1, 2, "a", 0.5, None]), max_size=4))
def test_fit_fuzz_raises_only_value_or_type_errors(X, y):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            Perceptron(max_epochs=3).fit(X, y)
        except (ValueError, TypeError):
            pass


# --------------------------------------------------------------- Novikoff's bound
@st.composite
def separable(draw, bias: bool):
    """Data separated by a hyperplane (w*, b*) with a margin: each x pushed off the plane."""
    D = draw(st.integers(1, 5))
    S = draw(st.integers(2, 30))
    floats = st.floats(-3, 3, allow_subnormal=False)
    X = draw(hnp.arrays(np.float64, (S, D), elements=floats))
    w = draw(hnp.arrays(np.float64, (D,), elements=floats).filter(
        lambda v: np.linalg.norm(v) > 0.1))
    b = draw(floats) if bias else 0.0
    push = draw(st.floats(0.05, 1.0))
    u = np.append(w, b) / np.linalg.norm(np.append(w, b))   # unit normal of the augmented plane
    y = np.where(X @ u[:D] + u[D] >= 0, 1.0, -1.0)
    assume(np.unique(y).size == 2)                          # the estimator needs two classes
    X = X + push * y[:, None] * u[:D] / np.linalg.norm(u[:D]) ** 2   # y u.(x, 1) += push
    return X, y, u


def _bound(X, y, u, with_bias):
    Z = np.hstack([X, np.ones((len(X), 1))]) if with_bias else X   # (S, D') augmented inputs
    u = u if with_bias else u[:-1] / np.linalg.norm(u[:-1])
    R = float(np.max(np.linalg.norm(Z, axis=1)))
    gamma = float(np.min(y * (Z @ u)))
    return R, gamma


@given(data=separable(bias=False))
def test_novikoff_bound_holds_without_bias(data):
    X, y, u = data
    R, gamma = _bound(X, y, u, with_bias=False)
    assert gamma > 0
    clf = Perceptron(fit_intercept=False).fit(X, y)
    assert clf.converged_
    # 1e-9: R and gamma are computed in floating point; the bound is a floor
    assert clf.n_updates_ <= novikoff_bound(R * (1 + 1e-9), gamma)


@given(data=separable(bias=True))
def test_novikoff_bound_holds_with_bias_on_augmented_inputs(data):
    X, y, u = data
    R, gamma = _bound(X, y, u, with_bias=True)
    assert gamma > 0
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        clf = Perceptron().fit(X, y)
    assert clf.converged_ and clf.score(X, y) == 1.0
    assert clf.n_updates_ <= novikoff_bound(R * (1 + 1e-9), gamma)


def test_make_separable_has_the_promised_margin_and_radius():
    X, y, w = make_separable(500, 4, 0.2, random_state=0)
    assert np.linalg.norm(X, axis=1).max() <= 1 + 1e-12
    assert np.min(y * (X @ w)) >= 0.2 - 1e-12 and set(np.unique(y)) == {-1, 1}
    clf = Perceptron(fit_intercept=False).fit(X, y)
    assert clf.n_updates_ <= novikoff_bound(1.0, 0.2)


@given(seed=st.integers(0, 2**16), margin=st.floats(0.02, 0.6), D=st.integers(2, 12),
       S=st.integers(2, 300), shuffle=st.booleans(),
       dtype=st.sampled_from([np.float64, np.float32]))
def test_novikoff_lemmas_hold_at_every_update_section_1_2(seed, margin, D, S, shuffle, dtype):
    """Lemma 1.1 (w*^T w_t >= t gamma) and Lemma 1.2 (||w_t|| <= R sqrt(t)) of notes §1.2 at
    every update t of a run without bias, w* the unit normal of make_separable, gamma its
    margin, R the largest norm; each recorded step was a mistake and adds y x; Theorem 1.3."""
    X, y, w_star = make_separable(S, D, margin, random_state=seed)
    assume(np.unique(y).size == 2)
    X = X.astype(dtype)
    clf = Perceptron(fit_intercept=False, shuffle=shuffle, random_state=seed,
                     record_path=True).fit(X, y)
    path, rows = clf.coef_path_, clf.update_indices_
    T = clf.n_updates_
    assert path.shape == (T + 1, D) and rows.shape == (T,) and clf.converged_
    assert path[-1].tobytes() == clf.coef_[0].tobytes() and not path[0].any()
    assert (clf.intercept_path_ == 0).all()
    y_pm = np.where(y == clf.classes_[1], 1.0, -1.0)
    for t in range(1, T + 1):  # w_t = w_{t-1} + y x after a mistake y w_{t-1}^T x <= 0
        i = rows[t - 1]
        assert y_pm[i] * _activation_reference(X[i], path[t - 1], 0.0) <= 0.0
        np.testing.assert_array_equal(path[t], path[t - 1] + y_pm[i] * X[i].astype(float))
    lemmas = novikoff_lemmas(path, X, y_pm, w_star)
    t = np.arange(T + 1)
    # rounding of w_t: t additions of terms <= R, a dot product with a unit vector over D
    tol = 4 * np.finfo(float).eps * lemmas.R * t * (t + D)
    assert (lemmas.alignment >= lemmas.alignment_bound - tol).all()
    assert (lemmas.norm <= lemmas.norm_bound + tol).all()
    assert lemmas.gamma >= margin * (1 - 1e-6) and lemmas.R <= 1 + 1e-6
    assert T <= novikoff_bound(lemmas.R * (1 + 1e-9), lemmas.gamma)


def test_novikoff_lemma_sides_can_fail():
    """The checks are not vacuous: paths that are not the perceptron's break each lemma, and
    a direction that separates nothing is refused."""
    X, y, w_star = make_separable(400, 6, 0.05, random_state=3)
    path = Perceptron(fit_intercept=False, record_path=True).fit(X, y).coef_path_
    backwards = novikoff_lemmas(-path, X, y, w_star)            # moves away from w*
    assert (backwards.alignment[1:] < backwards.alignment_bound[1:]).all()
    t = np.arange(len(path))[:, None]
    straight = novikoff_lemmas(t * w_star, X, y, w_star)      # ||w_t|| = t > R sqrt(t)
    assert (straight.norm[2:] > straight.norm_bound[2:]).all()
    with pytest.raises(ValueError, match="does not separate"):
        novikoff_lemmas(path, X, y, -w_star)


def test_record_path_keeps_the_fit_and_with_a_bias_records_b():
    X, y, _ = make_separable(300, 5, 0.1, random_state=1)
    X = X + 0.3  # a bias is needed now
    plain = Perceptron().fit(X, y)
    rec = Perceptron(record_path=True).fit(X, y)
    assert plain.coef_.tobytes() == rec.coef_.tobytes()
    assert (plain.n_updates_, plain.n_iter_) == (rec.n_updates_, rec.n_iter_)
    assert rec.intercept_path_[-1] == rec.intercept_[0]
    np.testing.assert_array_equal(np.diff(rec.intercept_path_), y[rec.update_indices_])
    assert not hasattr(plain, "coef_path_")
    rec.set_params(record_path=False).fit(X, y)
    assert not hasattr(rec, "coef_path_") and not hasattr(rec, "update_indices_")


def test_tour_section_rows_are_all_ok(tmp_path):
    from nnkit.tour import TourContext
    from nnkit.tour.perceptron import perceptron_section

    rows = perceptron_section(TourContext(out_dir=tmp_path, quick=True, plots=True))
    assert len(rows) == 5 and all(r["ok"] is True for r in rows), rows
    assert {"section", "result", "value", "target", "ok"} <= set(rows[0])
    assert (tmp_path / "perceptron_novikoff.png").stat().st_size > 1000


def test_overflowing_activations_are_an_error_not_convergence():
    """With entries near 1e308 the activations overflow to NaN, which the mistake loop never
    counts as a mistake: the fit used to report converged_ = True with useless weights."""
    X = np.array([[1e308, 1e308], [-1e308, 1e308], [1e308, -1e308]])
    with pytest.raises(ValueError, match="activations overflowed .* scale X"):
        Perceptron().fit(X, [0, 1, 1])
    assert Perceptron().fit(X / 1e308, [0, 1, 1]).converged_
