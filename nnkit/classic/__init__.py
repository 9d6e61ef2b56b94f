"""Classic models (``nk.classic``): NumPy in, NumPy out, scikit-learn estimator conventions.

McCulloch-Pitts units, Rosenblatt's perceptron, least-squares and logistic regression
(sections 1 and 2.1 of the notes).
"""

from .perceptron import McCullochPitts, Perceptron, make_separable
from .regression import LinearRegression, LogisticRegression

__all__ = [
    "McCullochPitts",
    "Perceptron",
    "make_separable",
    "LinearRegression",
    "LogisticRegression",
]
