"""Training an MLP on scikit-learn's digits with Adam: the tour's first section."""

from __future__ import annotations

from tqdm.auto import tqdm

from .. import nn, optim
from .._random import manual_seed
from ..datasets import load_digits
from .loops import accuracy, train_epoch

__all__ = ["train_mlp_digits"]


def train_mlp_digits(epochs: int = 30, hidden: int = 128, batch_size: int = 64,
                     lr: float = 1e-3, seed: int = 0, progress: bool = True):
    """Train an MLP 64-hidden-hidden-10 with Adam on scikit-learn's digits.

    Returns
    -------
    model : nn.Sequential
    history : dict of lists ('loss' per epoch, 'test_accuracy' per epoch)
    split : nnkit.datasets.Split
    """
    manual_seed(seed)
    split = load_digits(random_state=seed)
    model = nn.Sequential(
        nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
        nn.Linear(hidden, 10),
    )
    opt = optim.Adam(model.parameters(), lr=lr)
    history = {"loss": [], "test_accuracy": []}
    bar = tqdm(range(epochs), desc="MLP on digits", unit="epoch", disable=not progress)
    for _ in bar:
        history["loss"].append(train_epoch(model, opt, split.X_train, split.y_train,
                                           batch_size))
        history["test_accuracy"].append(accuracy(model, split.X_test, split.y_test))
        bar.set_postfix(loss=f"{history['loss'][-1]:.3f}",
                        test_acc=f"{history['test_accuracy'][-1]:.3f}")
    return model, history, split
