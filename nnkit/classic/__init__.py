"""Classic models (``nk.classic``): NumPy in, NumPy out, scikit-learn estimator conventions.

McCulloch-Pitts units, Rosenblatt's perceptron, Hopfield networks and their dense and
modern successors, least-squares and logistic regression (notes §1 and §2.1).
"""

from . import hopfield, perceptron, regression
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

__all__ = [*hopfield.MODELS, *perceptron.__all__, *regression.__all__]
