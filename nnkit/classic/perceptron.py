"""The McCulloch-Pitts neuron and Rosenblatt's perceptron (notes §1.1-1.2).

``McCullochPitts(sigma, theta)`` is the fixed threshold unit f(x) = 1{sigma . x >= theta}.
``Perceptron`` learns (w, b) with the mistake-driven rule w <- w + y x, b <- b + y; its epoch
loop is compiled (``nnkit.kernels.perceptron``) and ``_perceptron_epochs_reference`` below is the
plain-Python twin the tests hold it to, update for update. ``make_separable`` draws data with
a known margin for Novikoff's bound. ``Perceptron(record_path=True)`` keeps every iterate
w_0 = 0, w_1, ..., w_T, the objects of Novikoff's two lemmas (``nnkit.theory.novikoff_lemmas``).
"""

from __future__ import annotations

import numbers
import warnings

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from .._random import get_rng
from .._validation import check_array, check_bool, check_scalar
from ..kernels.perceptron import perceptron_epochs

__all__ = ["McCullochPitts", "Perceptron", "make_separable"]


class McCullochPitts:
    """A McCulloch-Pitts neuron: f[sigma, theta](x) = 1{sigma^T x >= theta}.

    Parameters
    ----------
    sigma : array_like of shape (n,)
        Synapse signs, every entry -1 (inhibitory) or +1 (excitatory).
    theta : float
        The threshold.

    Examples
    --------
    >>> and_gate = McCullochPitts([1, 1], theta=2)
    >>> and_gate.predict([[0, 0], [0, 1], [1, 0], [1, 1]]).tolist()
    [0, 0, 0, 1]
    """

    def __init__(self, sigma, theta):
        sigma = check_array(sigma, name="sigma", ndim=1)
        if sigma.dtype.kind not in "iuf" or sigma.size == 0 or not np.isin(sigma, (-1, 1)).all():
            raise ValueError(f"sigma must be a non-empty vector with entries in {{-1, +1}}, "
                             f"got {np.asarray(sigma).tolist()!r}")
        self.sigma = sigma.astype(np.int64)
        self.theta = float(check_scalar(theta, name="theta"))

    @property
    def n_inputs(self) -> int:
        """n, the number of binary inputs."""
        return self.sigma.shape[0]

    def predict(self, X) -> np.ndarray:
        """1{sigma^T x >= theta} for each row x of ``X``.

        Parameters
        ----------
        X : array_like of shape (n,) or (B, n), entries in {0, 1} (bool, integer or float)

        Returns
        -------
        ndarray of int64, shape () or (B,), entries in {0, 1}
        """
        X = check_array(X, name="X", ndim=(1, 2))
        if X.dtype.kind not in "biuf":
            raise TypeError(f"X must hold numbers (bool, integer or float), got {X.dtype}")
        if X.shape[-1] != self.n_inputs:
            raise ValueError(f"X has {X.shape[-1]} inputs but the neuron has n={self.n_inputs}; "
                             f"expected shape (B, {self.n_inputs}) or ({self.n_inputs},)")
        if not np.isin(X, (0, 1)).all():
            raise ValueError("X must be binary: every entry 0 or 1 (NaN is neither)")
        return (X.astype(np.int64) @ self.sigma >= self.theta).astype(np.int64)

    def __repr__(self) -> str:
        return f"McCullochPitts(sigma={self.sigma.tolist()}, theta={self.theta})"


def _activation_reference(x, w, b) -> float:
    """w^T x + b summed as the compiled loop does: term j into partial sum j mod 8 (in
    increasing j), then ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7)), then + b."""
    s = [0.0] * 8
    for j in range(len(w)):
        s[j % 8] = s[j % 8] + float(w[j]) * float(x[j])
    return (((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]))) + float(b)


def _perceptron_epochs_reference(X, y, w, b, order, max_epochs, fit_intercept,
                                 mistakes=None):
    """Plain-Python twin of ``nnkit.kernels.perceptron.perceptron_epochs``: Algorithm 1 of
    notes §1.2.

    Same arguments, same in-place updates of ``w`` (D,) and ``b`` (1,), same return value
    ``(n_updates, n_epochs, converged)``, the same float64 arithmetic in the same order;
    ``mistakes`` a list that receives the row index of each update.
    """
    n_updates, n_epochs, made = 0, 0, 1
    while n_epochs < max_epochs and made > 0:
        made = 0
        for i in order:
            if float(y[i]) * _activation_reference(X[i], w, b[0]) <= 0.0:   # gamma <= 0
                for j in range(X.shape[1]):
                    w[j] = float(w[j]) + float(y[i]) * float(X[i, j])   # w <- w + y x
                if fit_intercept:
                    b[0] = float(b[0]) + float(y[i])                    # b <- b + y
                if mistakes is not None:
                    mistakes.append(int(i))
                made += 1
        n_updates += made
        n_epochs += 1
    return n_updates, n_epochs, made == 0


class Perceptron(ClassifierMixin, BaseEstimator):
    """Rosenblatt's perceptron, trained by the mistake-driven algorithm of notes §1.2.

    f[w, b](x) = sgn(w^T x + b). Starting from w = 0, b = 0, each pass visits every sample;
    on a mistake, y (w^T x + b) <= 0 with y in {-1, +1}, it updates

        w <- w + y x,    b <- b + y,

    and it stops after the first pass without a mistake (``converged_ = True``) or after
    ``max_epochs`` passes (``converged_ = False`` and a ``ConvergenceWarning``). On
    gamma-separable data without a bias, Novikoff's theorem bounds the updates by R^2/gamma^2
    (``nnkit.theory.novikoff_bound``).

    Parameters
    ----------
    max_epochs : int, default 1000
        Most passes over the data.
    shuffle : bool, default False
        Visit the samples in a fresh random order each pass (else in the given order).
    random_state : None, int or numpy Generator
        Seeds the shuffling; None uses nnkit's global generator (``nk.manual_seed``).
    fit_intercept : bool, default True
        Learn the bias b; False keeps b = 0, the setting of Novikoff's proof.
    record_path : bool, default False
        Keep every iterate: ``coef_path_``, ``intercept_path_`` and ``update_indices_``
        ((T + 1) D floats for T updates). The compiled loop then also writes the index of
        each update; without it the loop runs as it would without the option.

    Attributes
    ----------
    classes_ : ndarray (2,)
        The two labels; ``classes_[1]`` plays y = +1 and ``classes_[0]`` plays y = -1.
    coef_ : ndarray of float64, shape (1, D)
        w (scikit-learn's shape for a binary linear classifier).
    intercept_ : ndarray of float64, shape (1,)
        b.
    n_updates_ : int
        Updates made, i.e. mistakes met during training.
    n_iter_ : int
        Passes run.
    converged_ : bool
        Whether the last pass made no mistake.
    n_features_in_ : int
    coef_path_ : ndarray of float64, shape (T + 1, D), only with ``record_path``
        w_0 = 0, w_1, ..., w_T = coef_[0]: w after each update, bit for bit as the loop
        computed it (w_t = w_{t-1} + y x summed in the same order).
    intercept_path_ : ndarray of float64, shape (T + 1,), only with ``record_path``
        b after each update.
    update_indices_ : ndarray of int64, shape (T,), only with ``record_path``
        The sample (row of X) that triggered each update.

    Notes
    -----
    X is converted as scikit-learn estimators do (integers to float64; float32 is kept), then
    the compiled loop (Cython, one thread) runs; sums are taken in float64. A sample with
    w^T x + b = 0 exactly is a mistake in training (sgn(0) = 0 of notes §1.2 is no class) and is
    predicted as ``classes_[0]`` by ``predict``. Only binary problems: more than two classes
    raise ``ValueError``.

    Examples
    --------
    >>> X = np.array([[0.0, 0.0], [0.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
    >>> clf = Perceptron().fit(X, [0, 0, 0, 1])          # AND is linearly separable
    >>> clf.predict(X).tolist(), clf.converged_
    ([0, 0, 0, 1], True)
    """

    def __init__(self, max_epochs=1000, shuffle=False, random_state=None, fit_intercept=True,
                 record_path=False):
        self.max_epochs = max_epochs
        self.shuffle = shuffle
        self.random_state = random_state
        self.fit_intercept = fit_intercept
        self.record_path = record_path
        # Checked in fit, not here: scikit-learn's convention (set_params bypasses __init__,
        # and check_estimator asserts that __init__ and set_params never raise).

    def _check_params(self) -> None:
        check_scalar(self.max_epochs, name="max_epochs", kind=numbers.Integral, low=1)
        for name in ("shuffle", "fit_intercept", "record_path"):
            check_bool(getattr(self, name), name=name)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.classifier_tags.multi_class = False   # the perceptron separates two classes
        return tags

    def fit(self, X, y):
        """Run the perceptron algorithm on ``X`` (S, D) with labels ``y`` (S,) of two classes.

        Returns
        -------
        self
        """
        self._check_params()
        X, y = validate_data(self, X, y, dtype=[np.float64, np.float32], order="C")
        self.classes_, y_pm = _binary_targets(y)
        w = np.zeros(X.shape[1], dtype=np.float64)
        b = np.zeros(1, dtype=np.float64)
        recorded = [] if self.record_path else None
        if self.shuffle or self.record_path:  # one pass per call (equal to one call of k)
            rng = get_rng(self.random_state) if self.shuffle else None
            fixed = np.arange(X.shape[0], dtype=np.intp)
            buffer = np.empty(X.shape[0], np.int64) if self.record_path else None
            n_updates, n_epochs, converged = 0, 0, False
            while n_epochs < self.max_epochs and not converged:
                order = rng.permutation(X.shape[0]).astype(np.intp) if self.shuffle else fixed
                made, _, converged = perceptron_epochs(X, y_pm, w, b, order, 1,
                                                       self.fit_intercept, buffer)
                if recorded is not None:
                    recorded.append(buffer[:made].copy())
                n_updates += made
                n_epochs += 1
        else:
            order = np.arange(X.shape[0], dtype=np.intp)
            n_updates, n_epochs, converged = perceptron_epochs(
                X, y_pm, w, b, order, self.max_epochs, self.fit_intercept)
        with np.errstate(over="ignore", invalid="ignore"):
            finite = np.isfinite(X @ w + b[0]).all()
        if not finite:  # a NaN activation is never counted as a mistake: no convergence
            raise ValueError(f"the perceptron's activations overflowed to inf/NaN (largest |X| "
                             f"entry {float(np.abs(X).max()):.3g}); scale X, e.g. divide it by "
                             f"its largest absolute value")
        self.coef_ = w.reshape(1, -1)            # (1, D)
        self.intercept_ = b
        self.n_updates_, self.n_iter_, self.converged_ = int(n_updates), int(n_epochs), \
            bool(converged)
        for name in ("coef_path_", "intercept_path_", "update_indices_"):
            self.__dict__.pop(name, None)  # no stale path from an earlier fit
        if recorded is not None:
            self._set_path(X, y_pm, np.concatenate([np.zeros(0, np.int64), *recorded]))
        if not converged:
            warnings.warn(f"the perceptron made mistakes in each of its max_epochs="
                          f"{self.max_epochs} passes: the data may not be linearly separable "
                          f"(converged_ = False)", ConvergenceWarning, stacklevel=2)
        return self

    def _set_path(self, X, y_pm, indices):
        """coef_path_ and intercept_path_ replayed from the updates' rows: cumulative sums
        of y x add in the loop's order (y = +-1, so y x is exact), hence the same bits."""
        steps = y_pm[indices, None] * X[indices].astype(np.float64)     # (T, D)
        path = np.zeros((indices.size + 1, X.shape[1]))
        np.cumsum(steps, axis=0, out=path[1:])
        intercepts = np.zeros(indices.size + 1)
        if self.fit_intercept:
            np.cumsum(y_pm[indices], out=intercepts[1:])
        self.coef_path_, self.intercept_path_, self.update_indices_ = path, intercepts, indices

    def decision_function(self, X) -> np.ndarray:
        """w^T x + b for each row of ``X`` (S, D); returns float64 (S,)."""
        check_is_fitted(self)
        X = validate_data(self, X, dtype=[np.float64, np.float32], reset=False)
        return X @ self.coef_[0] + self.intercept_[0]

    def predict(self, X) -> np.ndarray:
        """``classes_[1]`` where w^T x + b > 0, else ``classes_[0]``; shape (S,)."""
        positive = self.decision_function(X) > 0
        return self.classes_[positive.astype(np.intp)]

    def margin(self, X, y) -> float:
        """The margin of notes §1.2, gamma[w, b](S) = min_i y_i (w^T x_i + b) / ||w||.

        Positive if and only if the fitted hyperplane separates (X, y). ``y`` holds labels
        from ``classes_``; a zero w gives -inf (it separates nothing).

        Parameters
        ----------
        X : array_like (S, D)
        y : array_like (S,)

        Returns
        -------
        float
        """
        check_is_fitted(self)
        X, y = validate_data(self, X, y, dtype=[np.float64, np.float32], reset=False)
        unknown = np.setdiff1d(np.unique(y), self.classes_)
        if unknown.size:
            raise ValueError(f"y holds labels {unknown.tolist()} that are not in classes_ "
                             f"{self.classes_.tolist()}")
        y_pm = np.where(y == self.classes_[1], 1.0, -1.0)
        norm = float(np.linalg.norm(self.coef_))
        if norm == 0.0:
            return float("-inf")
        return float(np.min(y_pm * self.decision_function(X)) / norm)


def _binary_targets(y):
    """classes_ (2,) and y mapped to float64 -1 / +1 (classes_[1] -> +1), or ValueError."""
    check_classification_targets(y)
    classes = np.unique(y)
    if classes.size > 2:
        raise ValueError(f"Only binary classification is supported. y has {classes.size} "
                         f"classes {classes[:5].tolist()}{' ...' if classes.size > 5 else ''}; "
                         f"the perceptron separates exactly two")
    if classes.size < 2:
        raise ValueError(f"y has 1 class {classes.tolist()}; the perceptron needs samples of "
                         f"two classes")
    return classes, np.where(y == classes[1], 1.0, -1.0)


def make_separable(n_samples, n_features, margin, random_state=None):
    """Points in the unit ball that the hyperplane w*^T x = 0 separates with margin >= ``margin``.

    Each x = a w* + r u, with |a| uniform on [margin, 1], u a random unit vector orthogonal to
    w*, r uniform on [0, sqrt(1 - a^2)]; y = sgn(a). Hence ||x|| <= 1 = R and
    y w*^T x >= margin = gamma: Novikoff's bound (no bias) is at most 1 / margin^2 updates.

    Parameters
    ----------
    n_samples, n_features : int (>= 1; n_features >= 2 to have an orthogonal part)
    margin : float in (0, 1)
    random_state : None, int or numpy Generator

    Returns
    -------
    X : ndarray float64 (n_samples, n_features)
    y : ndarray int64 (n_samples,) in {-1, +1}
    w_star : ndarray float64 (n_features,), unit norm
    """
    check_scalar(n_samples, name="n_samples", kind=numbers.Integral, low=1)
    check_scalar(n_features, name="n_features", kind=numbers.Integral, low=2)
    check_scalar(margin, name="margin", low=0, high=1, low_inclusive=False, high_inclusive=False)
    rng = get_rng(random_state)
    w_star = rng.standard_normal(n_features)
    w_star /= np.linalg.norm(w_star)
    y = rng.choice(np.array([-1, 1]), size=n_samples)
    a = y * rng.uniform(margin, 1.0, size=n_samples)                         # (S,)
    u = rng.standard_normal((n_samples, n_features))
    u -= np.outer(u @ w_star, w_star)                                        # orthogonal to w*
    u /= np.maximum(np.linalg.norm(u, axis=1, keepdims=True), 1e-300)
    r = rng.uniform(0.0, 1.0, size=n_samples) * np.sqrt(1.0 - a ** 2)
    X = a[:, None] * w_star + r[:, None] * u                                 # (S, D)
    return X, y.astype(np.int64), w_star
