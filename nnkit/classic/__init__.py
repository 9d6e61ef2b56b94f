"""Classic models (``nk.classic``): NumPy in, NumPy out, scikit-learn estimator conventions.

McCulloch-Pitts units, Rosenblatt's perceptron, Hopfield networks and their dense and
modern successors, least-squares and logistic regression (notes §1 and §2.1).
"""

from .hopfield import (
    DenseAssociativeMemory,
    Hopfield,
    HopfieldResult,
    ModernHopfield,
    RetrievalCurve,
    retrieval_curve,
)
from .perceptron import McCullochPitts, Perceptron, make_separable
from .regression import LinearRegression, LogisticRegression

__all__ = [
    "Hopfield",
    "HopfieldResult",
    "DenseAssociativeMemory",
    "ModernHopfield",
    "RetrievalCurve",
    "retrieval_curve",
    "McCullochPitts",
    "Perceptron",
    "make_separable",
    "LinearRegression",
    "LogisticRegression",
]
