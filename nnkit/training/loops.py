"""Minibatch indices, class predictions and accuracy: the loop helpers every recipe uses."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from .._backend import to_host
from .._random import get_rng
from ..autograd import no_grad

__all__ = ["minibatches", "train_epoch", "accuracy", "predict_classes"]


def minibatches(n: int, batch_size: int, shuffle: bool = True, rng=None) -> Iterator[np.ndarray]:
    """Index arrays covering ``range(n)`` in batches of ``batch_size`` (the last may be short)."""
    order = get_rng(rng).permutation(n) if shuffle else np.arange(n)
    for start in range(0, n, batch_size):
        yield order[start : start + batch_size]


def train_epoch(model, opt, X, y, batch_size: int, rng=None) -> float:
    """One pass of cross-entropy minibatch steps over (X, y) in shuffled batches; returns
    the mean batch loss."""
    from .. import functional as F

    losses = []
    for idx in minibatches(len(X), batch_size, rng=rng):
        loss = F.cross_entropy(model(X[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return float(np.mean(losses))


def predict_classes(model, X, batch_size: int = 1024) -> np.ndarray:
    """argmax of ``model``'s logits over rows of ``X``, in eval mode, without a graph."""
    was_training = model.training
    model.eval()
    with no_grad():
        parts = [model(X[i : i + batch_size]).numpy().argmax(axis=-1)
                 for i in range(0, len(X), batch_size)]
    model.train(was_training)
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def accuracy(model, X, y) -> float:
    """Fraction of rows whose predicted class equals ``y``."""
    return float((predict_classes(model, X) == to_host(y)).mean())
