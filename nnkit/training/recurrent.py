"""Training recurrent layers: the adding problem (Hochreiter and Schmidhuber), the recipe of the
tour's recurrent section and ``examples/adding_problem.py``; and the claim of notes §5.2
that a linear recurrence loses no power when a position-wise MLP reads it
(``examples/lru_universality.py``)."""

from __future__ import annotations

import numpy as np

from .. import functional as F
from .. import nn, optim
from .._random import manual_seed
from ..autograd import no_grad
from ..datasets.sequences import adding_problem

__all__ = ["train_adding_problem", "delayed_product", "lru_readout_model", "train_lru_readout"]


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
    return _fit_fresh_batches(_Regressor(cell, hidden), adding_problem, T, steps, batch, lr,
                              seed, every)


def _fit_fresh_batches(model, task, T, steps, batch, lr, seed, every):
    """Adam with gradient clipping (norm 1) on fresh batches ``task(batch, T, random_state)``;
    the MSE on 512 held-out sequences every ``every`` steps, first and last included."""
    opt = optim.Adam(model.parameters(), lr=lr)
    X_test, y_test = task(512, T, random_state=seed + 1)
    rng = np.random.default_rng(seed)
    curve = []
    for step in range(steps + 1):
        if step % every == 0 or step == steps:
            with no_grad():
                curve.append(float(F.mse_loss(model(X_test), y_test).item()))
        if step == steps:
            break
        X, y = task(batch, T, random_state=rng)
        loss = F.mse_loss(model(X), y)
        opt.zero_grad()
        loss.backward()
        optim.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    return curve


def delayed_product(n: int, T: int, delays=(2, 5), random_state=None):
    """A nonlinear sequence-to-sequence target: y_t = x_{t - d1} x_{t - d2} (0 before t = d2).

    x is uniform on [-sqrt 3, sqrt 3] (unit variance), so y has unit variance after the first
    d2 steps and is uncorrelated with every x_s: the best map that is linear in the input
    sequence predicts 0 and scores MSE = mean of y^2.

    Returns
    -------
    x : ndarray (n, T, 1) float32
    y : ndarray (n, T, 1) float32
    """
    d1, d2 = sorted(int(d) for d in delays)
    rng = np.random.default_rng(random_state)
    x = rng.uniform(-np.sqrt(3.0), np.sqrt(3.0), (n, T, 1)).astype(np.float32)
    y = np.zeros_like(x)
    y[:, d2:] = x[:, d2 - d1:T - d1] * x[:, :T - d2]  # x_{t - d1} x_{t - d2} for t >= d2
    return x, y


def lru_readout_model(nonlinear: bool, features: int = 8, state_size: int = 32,
                      hidden: int = 32, seed: int = 0) -> nn.Sequential:
    """Linear(1, F) -> LRU(F, P) -> Linear(F, H) -> [Tanh] -> Linear(H, 1), position-wise.

    ``nonlinear=False`` drops the Tanh: the same parameters, the same count, and a model
    linear in its input sequence. The LRU's ring is |lambda| in [0.4, 0.95] (memories of a
    few to ~20 steps)."""
    manual_seed(seed)
    layers = [nn.Linear(1, features), nn.LRU(features, state_size, r_min=0.4, r_max=0.95,
                                                 random_state=seed),
              nn.Linear(features, hidden)]
    if nonlinear:
        layers.append(nn.Tanh())
    return nn.Sequential(*layers, nn.Linear(hidden, 1))


def train_lru_readout(nonlinear: bool, T: int = 32, steps: int = 600, batch: int = 32,
                      lr: float = 3e-3, seed: int = 0, every: int = 25, **sizes):
    """Adam on fresh batches of :func:`delayed_product`; the held-out MSE (512 sequences)
    every ``every`` steps, first and last included. ``sizes`` go to :func:`lru_readout_model`.
    """
    model = lru_readout_model(nonlinear, seed=seed, **sizes)
    return _fit_fresh_batches(model, delayed_product, T, steps, batch, lr, seed, every)
