"""Least squares and logistic regression (notes §2.1), as scikit-learn estimators.

``LinearRegression`` solves min_w 1/2 ||X w - y||^2 with ``np.linalg.lstsq`` (the OLSE
w* = (X^T X)^{-1} X^T y when X has full column rank, the minimum-norm solution otherwise).
``LogisticRegression`` fits f(x) = sigma(w^T x) by SGD with the per-sample gradient of notes §2.1
(sigma(w^T x) - y) x, averaged over a minibatch.
"""

from __future__ import annotations

import numbers

import numpy as np
from scipy.special import expit, log_expit
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from .._random import get_rng
from .._validation import check_bool, check_scalar

__all__ = ["LinearRegression", "LogisticRegression"]


def _design(X, fit_intercept: bool) -> np.ndarray:
    """[X, 1] (S, D + 1) when fitting an intercept, else X (S, D)."""
    if not fit_intercept:
        return X
    return np.hstack([X, np.ones((X.shape[0], 1), dtype=X.dtype)])


class LinearRegression(RegressorMixin, BaseEstimator):
    """Ordinary least squares: w* = argmin_w 1/2 ||X w - y||^2, solved by ``np.linalg.lstsq``.

    Parameters
    ----------
    fit_intercept : bool, default True
        Append a column of ones to X, so that f(x) = w^T x + b.

    Attributes
    ----------
    coef_ : ndarray float64 (D,) for y (S,), or (T, D) for y (S, T)
    intercept_ : float, or ndarray (T,) for y (S, T); 0.0 when ``fit_intercept=False``
    rank_ : int
        Rank of the design matrix.
    singular_ : ndarray (min(S, D'),)
        Its singular values.
    n_features_in_ : int

    Notes
    -----
    The solution is exactly ``np.linalg.lstsq(A, y, rcond=None)[0]`` with A = [X, 1] (or X):
    the minimum-norm least-squares solution, so a rank-deficient X has a defined answer.
    Integer X is converted to float64, as scikit-learn does.

    Examples
    --------
    >>> X = np.array([[0.0], [1.0], [2.0]])
    >>> reg = LinearRegression().fit(X, [1.0, 3.0, 5.0])
    >>> np.round(reg.coef_, 6).tolist(), round(reg.intercept_, 6)
    ([2.0], 1.0)
    """

    def __init__(self, fit_intercept=True):
        self.fit_intercept = fit_intercept

    def fit(self, X, y):
        """Least-squares fit of ``y`` (S,) or (S, T) on ``X`` (S, D); returns self."""
        check_bool(self.fit_intercept, name="fit_intercept")
        X, y = validate_data(self, X, y, dtype=np.float64, multi_output=True, y_numeric=True)
        y = y.astype(np.float64, copy=False)
        sol, _, self.rank_, self.singular_ = np.linalg.lstsq(_design(X, self.fit_intercept),
                                                             y, rcond=None)   # (D', ) or (D', T)
        w = sol[:-1] if self.fit_intercept else sol
        self.coef_ = w.T                                                     # (D,) or (T, D)
        if self.fit_intercept:
            self.intercept_ = sol[-1] if y.ndim == 2 else float(sol[-1])
        else:
            self.intercept_ = np.zeros(y.shape[1]) if y.ndim == 2 else 0.0
        return self

    def predict(self, X) -> np.ndarray:
        """X w + b: (S,) or (S, T)."""
        check_is_fitted(self)
        X = validate_data(self, X, dtype=np.float64, reset=False)
        return X @ self.coef_.T + self.intercept_

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True
        return tags


class LogisticRegression(ClassifierMixin, BaseEstimator):
    """Logistic regression f(x) = sigma(w^T x + b) trained by minibatch SGD, as in notes §2.1.

    The loss is the mean cross-entropy l(w) = (1/s) sum_i -log sigma((2 y_i - 1) w^T x_i) with
    y_i in {0, 1}; each step moves along the per-sample gradient of notes §2.1 averaged over a
    batch,

        w <- w - lr * (1/B) sum_{i in batch} (sigma(w^T x_i + b) - y_i) x_i,
        b <- b - lr * (1/B) sum_{i in batch} (sigma(w^T x_i + b) - y_i),

    from w = 0, b = 0, for ``max_epochs`` passes (``batch_size=1`` is plain SGD). A pass
    whose weights or activations overflow to inf/NaN (unscaled X, |x| ~ 1e200) raises
    ``ValueError``, as scikit-learn's ``SGDClassifier`` does: scale X first.

    Parameters
    ----------
    lr : float > 0, default 0.1
    max_epochs : int >= 1, default 100
    batch_size : int >= 1, default 32
    fit_intercept : bool, default True
    shuffle : bool, default True
        A fresh random sample order every pass (seeded by ``random_state``).
    random_state : None, int or numpy Generator
        None uses nnkit's global generator (``nk.manual_seed``).

    Attributes
    ----------
    classes_ : ndarray (2,)
        ``classes_[1]`` is y = 1, ``classes_[0]`` is y = 0.
    coef_ : ndarray float64 (1, D)
    intercept_ : ndarray float64 (1,)
    loss_curve_ : list of float
        The cross-entropy on the training data after each pass.
    n_iter_ : int
        Passes run.
    n_features_in_ : int

    Examples
    --------
    >>> X = np.array([[-2.0], [-1.0], [1.0], [2.0]])
    >>> clf = LogisticRegression(random_state=0).fit(X, ["no", "no", "yes", "yes"])
    >>> clf.predict([[-3.0], [3.0]]).tolist()
    ['no', 'yes']
    """

    def __init__(self, lr=0.1, max_epochs=100, batch_size=32, fit_intercept=True,
                 shuffle=True, random_state=None):
        self.lr = lr
        self.max_epochs = max_epochs
        self.batch_size = batch_size
        self.fit_intercept = fit_intercept
        self.shuffle = shuffle
        self.random_state = random_state

    def _check_params(self) -> None:
        check_scalar(self.lr, name="lr", low=0, low_inclusive=False)
        check_scalar(self.max_epochs, name="max_epochs", kind=numbers.Integral, low=1)
        check_scalar(self.batch_size, name="batch_size", kind=numbers.Integral, low=1)
        check_bool(self.fit_intercept, name="fit_intercept")
        check_bool(self.shuffle, name="shuffle")

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.classifier_tags.multi_class = False   # one sigmoid output: two classes
        return tags

    def fit(self, X, y):
        """SGD on ``X`` (S, D) with labels ``y`` (S,) of two classes; returns self."""
        self._check_params()
        X, y = validate_data(self, X, y, dtype=np.float64)
        y01 = self._targets(y)
        A = _design(X, self.fit_intercept)                                   # (S, D')
        w = np.zeros(A.shape[1])
        rng = get_rng(self.random_state)
        self.loss_curve_ = []
        for epoch in range(self.max_epochs):
            order = rng.permutation(A.shape[0]) if self.shuffle else np.arange(A.shape[0])
            # huge X (|x| ~ 1e200) makes w.x overflow: checked below, once per pass
            with np.errstate(over="ignore", invalid="ignore"):
                for start in range(0, A.shape[0], self.batch_size):
                    idx = order[start:start + self.batch_size]
                    residual = expit(A[idx] @ w) - y01[idx]                  # sigma(w.x) - y
                    w -= self.lr * (residual @ A[idx]) / idx.size
                loss = float(-np.mean(log_expit((2 * y01 - 1) * (A @ w))))
            if not (np.isfinite(w).all() and np.isfinite(loss)):
                raise ValueError(
                    f"LogisticRegression's weights or activations overflowed to inf/NaN at "
                    f"epoch {epoch + 1} (largest |X| entry {float(np.abs(X).max()):.3g}); "
                    f"scale X, e.g. with sklearn.preprocessing.StandardScaler, or lower lr "
                    f"(lr={self.lr})")
            self.loss_curve_.append(loss)
        self.n_iter_ = self.max_epochs
        self.coef_ = w[:X.shape[1]].reshape(1, -1)                            # (1, D)
        self.intercept_ = w[X.shape[1]:] if self.fit_intercept else np.zeros(1)
        return self

    def _targets(self, y) -> np.ndarray:
        check_classification_targets(y)
        self.classes_ = np.unique(y)
        if self.classes_.size != 2:
            prefix = "Only binary classification is supported. " if self.classes_.size > 2 else ""
            raise ValueError(f"{prefix}y has {self.classes_.size} class(es) "
                             f"{self.classes_[:5].tolist()}; logistic regression needs exactly "
                             f"two")
        return (y == self.classes_[1]).astype(np.float64)

    def decision_function(self, X) -> np.ndarray:
        """w^T x + b, the log-odds of ``classes_[1]``; float64 (S,)."""
        check_is_fitted(self)
        X = validate_data(self, X, dtype=np.float64, reset=False)
        return X @ self.coef_[0] + self.intercept_[0]

    def predict_proba(self, X) -> np.ndarray:
        """[1 - sigma(w^T x + b), sigma(w^T x + b)] per row: (S, 2), columns as ``classes_``."""
        p = expit(self.decision_function(X))
        return np.stack([1.0 - p, p], axis=1)

    def predict_log_proba(self, X) -> np.ndarray:
        """log of ``predict_proba``, computed stably; (S, 2)."""
        z = self.decision_function(X)
        return np.stack([log_expit(-z), log_expit(z)], axis=1)

    def predict(self, X) -> np.ndarray:
        """``classes_[1]`` where sigma(w^T x + b) > 1/2, else ``classes_[0]``; (S,)."""
        check_is_fitted(self)
        positive = self.decision_function(X) > 0
        return self.classes_[positive.astype(np.intp)]
