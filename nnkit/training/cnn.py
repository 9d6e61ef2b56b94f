"""Training a LeNet-style CNN on scikit-learn's 8x8 digits: the tour's convolution section."""

from __future__ import annotations

import numpy as np

from .. import nn, optim
from .._random import manual_seed
from ..datasets import load_digits
from ..nn.conv import Conv2d, MaxPool2d
from .loops import accuracy, train_epoch

__all__ = ["lenet_digits", "train_cnn_digits"]


def lenet_digits():
    """conv(1->16, 3x3, pad 1) ReLU maxpool2 conv(16->32, 3x3, pad 1) ReLU -> 64 -> 10.

    Shapes: (N, 1, 8, 8) -> (N, 16, 4, 4) -> (N, 32, 4, 4) -> (N, 512) -> (N, 64) -> (N, 10).
    A second pooling (LeNet's) would leave 2x2 maps of an 8x8 digit; it tested ~1% worse.
    """
    return nn.Sequential(
        Conv2d(1, 16, 3, padding=1), nn.ReLU(), MaxPool2d(2),
        Conv2d(16, 32, 3, padding=1), nn.ReLU(),
        nn.Flatten(), nn.Linear(512, 64), nn.ReLU(), nn.Linear(64, 10),
    )


def train_cnn_digits(epochs: int = 15, batch_size: int = 32, lr: float = 2e-3, seed: int = 0):
    """Train ``lenet_digits`` with Adam (cosine learning-rate decay) on scikit-learn's digits
    (75/25 stratified split).

    Returns
    -------
    model : nn.Sequential
    history : dict with 'loss' and 'test_accuracy' per epoch
    split : nnkit.datasets.Split (images (n, 1, 8, 8))
    """
    manual_seed(seed)
    split = load_digits(flatten=False, random_state=seed)
    model = lenet_digits()
    opt = optim.Adam(model.parameters(), lr=lr)
    history = {"loss": [], "test_accuracy": []}
    for epoch in range(epochs):
        for group in opt.param_groups:  # cosine decay: steadier final accuracy
            group["lr"] = lr * 0.5 * (1 + np.cos(np.pi * epoch / epochs))
        history["loss"].append(train_epoch(model, opt, split.X_train, split.y_train,
                                           batch_size))
        history["test_accuracy"].append(accuracy(model, split.X_test, split.y_test))
    return model, history, split
