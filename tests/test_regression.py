"""Least squares (== np.linalg.lstsq) and logistic regression by SGD with the gradient of
notes §2.1."""

import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from scipy.special import log_expit
from sklearn.utils.estimator_checks import parametrize_with_checks

from nnkit.classic.regression import LinearRegression, LogisticRegression


@parametrize_with_checks([LinearRegression(), LinearRegression(fit_intercept=False),
                          LogisticRegression(), LogisticRegression(batch_size=1, max_epochs=5)])
def test_sklearn_compatible_estimator(estimator, check):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        check(estimator)


# ---------------------------------------------------------------- least squares
@given(data=st.data(), fit_intercept=st.booleans(), outputs=st.sampled_from([0, 1, 3]))
def test_linear_regression_is_lstsq(data, fit_intercept, outputs):
    S, D = data.draw(st.integers(1, 8)), data.draw(st.integers(1, 4))
    X = data.draw(hnp.arrays(np.float64, (S, D), elements=st.floats(-5, 5)))
    y = data.draw(hnp.arrays(np.float64, (S, outputs) if outputs else (S,),
                             elements=st.floats(-5, 5)))
    A = np.hstack([X, np.ones((S, 1))]) if fit_intercept else X           # (S, D')
    sol = np.linalg.lstsq(A, y, rcond=None)[0]                            # (D',) or (D', T)
    reg = LinearRegression(fit_intercept=fit_intercept).fit(X, y)
    np.testing.assert_array_equal(reg.coef_, (sol[:D] if fit_intercept else sol).T)
    np.testing.assert_array_equal(reg.intercept_, sol[D] if fit_intercept else
                                  np.zeros(np.shape(sol[0])))  # sol may hold inf
    if np.isfinite(sol).all():  # a subnormal column gives inf weights: inf * 0 has no value
        np.testing.assert_allclose(reg.predict(X), A @ sol, atol=1e-9)


def test_linear_regression_solves_the_normal_equations_and_matches_sklearn(rng):
    from sklearn.linear_model import LinearRegression as SkLinearRegression

    X = rng.standard_normal((50, 4))
    y = X @ [1.0, -2.0, 0.5, 3.0] + 0.7 + 0.1 * rng.standard_normal(50)
    reg = LinearRegression().fit(X, y)
    A = np.hstack([X, np.ones((50, 1))])
    w = np.append(reg.coef_, reg.intercept_)
    np.testing.assert_allclose(A.T @ A @ w, A.T @ y, atol=1e-10)          # gradient = 0
    sk = SkLinearRegression().fit(X, y)
    np.testing.assert_allclose(reg.coef_, sk.coef_, atol=1e-12)
    assert reg.intercept_ == pytest.approx(sk.intercept_, abs=1e-12)
    assert reg.rank_ == 5 and reg.score(X, y) > 0.99


@pytest.mark.parametrize("X, y, match", [
    ([[0.0], [np.nan]], [1.0, 2.0], "NaN"),
    ([[0.0], [1.0]], [1.0, np.inf], "infinity"),
    ([[0.0], [1.0]], [1.0], "inconsistent numbers of samples"),
])
def test_linear_regression_rejects_bad_data(X, y, match):
    with pytest.raises(ValueError, match=match):
        LinearRegression().fit(X, y)


def test_linear_regression_wrong_number_of_features():
    reg = LinearRegression().fit(np.eye(3), [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="X has 2 features, but LinearRegression is expecting 3"):
        reg.predict(np.zeros((1, 2)))


# ---------------------------------------------------------- logistic regression
def _sgd_twin(X, y01, lr, epochs):
    """Plain SGD of notes §2.1: w <- w - lr (sigma(w^T x) - y) x, sample by sample, in order."""
    w = [0.0] * (X.shape[1] + 1)                                          # (w, b)
    for _ in range(epochs):
        for x, y in zip(X, y01, strict=True):
            z = sum(wj * xj for wj, xj in zip(w, list(x) + [1.0], strict=True))
            g = 1.0 / (1.0 + np.exp(-z)) - y
            w = [wj - lr * g * xj for wj, xj in zip(w, list(x) + [1.0], strict=True)]
    return np.array(w)


@given(X=hnp.arrays(np.float64, st.tuples(st.integers(2, 8), st.integers(1, 3)),
                    elements=st.floats(-3, 3)),
       lr=st.floats(0.01, 1.0), epochs=st.integers(1, 4), data=st.data())
def test_logistic_regression_batch_one_is_the_notes_sgd(X, lr, epochs, data):
    y = np.array(data.draw(st.lists(st.sampled_from([0, 1]), min_size=len(X), max_size=len(X))))
    y[:2] = [0, 1]                                                        # two classes
    clf = LogisticRegression(lr=lr, max_epochs=epochs, batch_size=1, shuffle=False).fit(X, y)
    w = _sgd_twin(X, y.astype(float), lr, epochs)
    np.testing.assert_allclose(np.append(clf.coef_[0], clf.intercept_), w, rtol=1e-12,
                               atol=1e-12)


def test_notes_gradient_is_the_gradient_of_the_cross_entropy(rng):
    X, y = rng.standard_normal((20, 3)), rng.integers(0, 2, 20).astype(float)
    w = rng.standard_normal(3)

    def loss(v):    # (1/s) sum_i -log sigma((2 y_i - 1) v^T x_i)
        return -np.mean(log_expit((2 * y - 1) * (X @ v)))

    grad = np.mean((1 / (1 + np.exp(-(X @ w))) - y)[:, None] * X, axis=0)   # notes §2.1, averaged
    eps = 1e-6
    numeric = [(loss(w + eps * e) - loss(w - eps * e)) / (2 * eps) for e in np.eye(3)]
    np.testing.assert_allclose(grad, numeric, rtol=1e-6, atol=1e-9)


def test_logistic_regression_learns_and_agrees_with_sklearn(rng):
    from sklearn.linear_model import LogisticRegression as SkLogisticRegression

    X = rng.standard_normal((400, 3))
    y = (X @ [2.0, -1.0, 0.5] + 0.3 + 0.5 * rng.logistic(size=400) > 0).astype(int)
    clf = LogisticRegression(lr=0.1, max_epochs=200, random_state=0).fit(X, y)
    assert clf.loss_curve_[-1] < clf.loss_curve_[0] < np.log(2)
    sk = SkLogisticRegression(C=1e6).fit(X, y)
    assert np.mean(clf.predict(X) == sk.predict(X)) >= 0.97
    np.testing.assert_allclose(clf.coef_, sk.coef_, rtol=0.15)
    proba = clf.predict_proba(X)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0)
    np.testing.assert_allclose(np.log(proba), clf.predict_log_proba(X), atol=1e-12)


def test_logistic_regression_is_seeded():
    X = np.random.default_rng(0).standard_normal((60, 2))
    y = (X[:, 0] > 0).astype(int)
    a = LogisticRegression(random_state=5, max_epochs=3).fit(X, y)
    b = LogisticRegression(random_state=5, max_epochs=3).fit(X, y)
    c = LogisticRegression(random_state=6, max_epochs=3).fit(X, y)
    assert np.array_equal(a.coef_, b.coef_) and not np.array_equal(a.coef_, c.coef_)


@pytest.mark.parametrize("X, y, params, exc, match", [
    (np.zeros((3, 2)), [0, 1, 2], {}, ValueError, "Only binary classification"),
    (np.zeros((3, 2)), [1, 1, 1], {}, ValueError, "1 class"),
    ([[0.0, np.nan], [1.0, 1.0]], [0, 1], {}, ValueError, "NaN"),
    (np.zeros((2, 2)), [0, 1], {"lr": 0.0}, ValueError, "lr must be > 0"),
    (np.zeros((2, 2)), [0, 1], {"batch_size": 0}, ValueError, "batch_size must be >= 1"),
    (np.zeros((2, 2)), [0, 1], {"max_epochs": 1.0}, TypeError, "max_epochs must be an integer"),
    (np.zeros((2, 2)), [0, 1], {"shuffle": 1}, TypeError, "shuffle must be a bool"),
])
def test_logistic_regression_rejects_bad_input(X, y, params, exc, match):
    with pytest.raises(exc, match=match):
        LogisticRegression(**params).fit(X, y)


@given(X=st.sampled_from([np.float64, np.int64, np.complex128]).flatmap(
           lambda dt: hnp.arrays(dt, hnp.array_shapes(min_dims=0, max_dims=3, max_side=4))),
       y=st.lists(st.sampled_from([0, 1, 2.5, "a", None, np.nan]), max_size=4))
def test_fit_fuzz_raises_only_value_or_type_errors(X, y):
    for est in (LinearRegression(), LogisticRegression(max_epochs=2)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                est.fit(X, y)
            except (ValueError, TypeError):
                pass


def test_logistic_regression_overflow_is_an_error_not_nan_coefficients():
    """On X scaled by 1e200 the SGD steps overflowed: NaN coefficients, and predict gave one
    class for every sample, silently. Now a ValueError that says to scale X, as
    scikit-learn's SGDClassifier (and nnkit's Perceptron) raise; the fit itself warns
    nothing."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((60, 3))
    y = (X @ np.array([1.0, -2.0, 0.5]) > 0).astype(int)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the silent NaN fit warned at most
        with pytest.raises(ValueError, match=r"overflowed .* epoch 1 .*e\+200\); scale X"):
            LogisticRegression(random_state=0).fit(X * 1e200, y)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match="overflowed"):
            LogisticRegression(random_state=0).fit(X * 1e200, y)
    assert LogisticRegression(random_state=0).fit(X, y).score(X, y) > 0.9
