"""Rosenblatt's perceptron epoch loop, compiled (``nnkit._ext.perceptron``, Cython): the
kernel of ``nnkit.classic.Perceptron``, which validates the data first.
"""

from __future__ import annotations

from .._backend import kernels_for
from .._types import Array

__all__ = ["perceptron_epochs"]


def perceptron_epochs(X: Array, y: Array, w: Array, b: Array, order: Array, max_epochs: int,
                      fit_intercept: bool, mistakes: Array | None = None,
                      ) -> tuple[int, int, bool]:
    """Run the perceptron on rows ``X[order]`` for at most ``max_epochs`` passes, updating
    ``w`` and ``b`` in place (w <- w + y x, b <- b + y on each mistake).

    ``X`` (S, D) C-contiguous float32/float64, ``y`` (S,) float64 in {-1, +1}, ``w`` (D,)
    and ``b`` (1,) float64, ``order`` (S,) intp; ``mistakes`` None or int64 with at least
    ``max_epochs`` * S entries, which receives the row index of each update in order.
    Returns (n_updates, n_epochs, converged).
    """
    return kernels_for("perceptron", None, X, name="X").perceptron_epochs(
        X, y, w, b, order, max_epochs, fit_intercept, mistakes)
