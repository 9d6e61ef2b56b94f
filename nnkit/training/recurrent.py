"""Training a recurrent layer on the adding problem (Hochreiter and Schmidhuber): the recipe
of the tour's recurrent section and ``examples/adding_problem.py``."""

from __future__ import annotations

import numpy as np

from .. import functional as F
from .. import nn, optim
from .._random import manual_seed
from ..autograd import no_grad
from ..datasets.sequences import adding_problem

__all__ = ["train_adding_problem"]


class _Regressor(nn.Module):
    """A recurrent layer read out at its last step by a linear head."""

    def __init__(self, cell, hidden):
        super().__init__()
        self.rnn = cell(2, hidden, batch_first=True)
        self.head = nn.Linear(hidden, 1)

    def forward(self, x):
        out, _ = self.rnn(x)  # (B, T, H)
        return self.head(out[:, -1]).reshape(-1)


def train_adding_problem(cell, T, steps, hidden=32, batch=64, lr=1e-2, seed=0, every=25):
    """Adam with gradient clipping (norm 1) on fresh batches of the adding problem.

    Returns the test MSE (512 held-out sequences) every ``every`` steps, first and last
    included.
    """
    manual_seed(seed)
    model = _Regressor(cell, hidden)
    opt = optim.Adam(model.parameters(), lr=lr)
    X_test, y_test = adding_problem(512, T, random_state=seed + 1)
    rng = np.random.default_rng(seed)
    curve = []
    for step in range(steps + 1):
        if step % every == 0 or step == steps:
            with no_grad():
                curve.append(float(F.mse_loss(model(X_test), y_test).item()))
        if step == steps:
            break
        X, y = adding_problem(batch, T, random_state=rng)
        loss = F.mse_loss(model(X), y)
        opt.zero_grad()
        loss.backward()
        optim.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    return curve
