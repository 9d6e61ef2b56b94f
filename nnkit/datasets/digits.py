"""``load_digits``: scikit-learn's bundled 8x8 handwritten digits (1797 images)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Split", "load_digits"]


@dataclass(frozen=True)
class Split:
    """A train/test split: inputs float32, labels int64."""

    X_train: np.ndarray
    y_train: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray


def load_digits(test_size: float = 0.25, flatten: bool = True, random_state: int = 0) -> Split:
    """scikit-learn's digits, pixels scaled to [0, 1], split stratified and seeded.

    Parameters
    ----------
    test_size : float
        Fraction held out for testing.
    flatten : bool
        Inputs (n, 64) when True, images (n, 1, 8, 8) (N, C, H, W) otherwise.
    random_state : int
        Seed of the split.
    """
    from sklearn.datasets import load_digits as sk_load_digits
    from sklearn.model_selection import train_test_split

    data = sk_load_digits()
    X = (data.data / 16.0).astype(np.float32)  # (1797, 64), pixels 0..16
    y = data.target.astype(np.int64)
    if not flatten:
        X = X.reshape(-1, 1, 8, 8)  # (n, C=1, H=8, W=8)
    X_train, X_test, y_train, y_test = train_test_split(
        X, y, test_size=test_size, random_state=random_state, stratify=y
    )
    return Split(X_train, y_train, X_test, y_test)

