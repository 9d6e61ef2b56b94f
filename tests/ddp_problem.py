"""The training problem that tests/test_mpi.py runs in one process and under MPI: a body and
two heads, each row routed to head ``a`` or ``b`` by its first feature (so in some steps a
rank, or every rank, has no row for ``a``), and a layer that is never used."""

from __future__ import annotations

import numpy as np

import nnkit as nk
import nnkit.functional as F

CASES = [(dtype, opt) for dtype in ("float64", "float32") for opt in ("sgd", "adam", "adamw")]
GLOBAL_BATCH = 10  # not divisible by 3 (or 4): the shares differ in size
ROWS = 60


class Routed(nk.nn.Module):
    def __init__(self, dtype):
        super().__init__()
        self.body = nk.nn.Linear(6, 8, dtype=dtype)
        self.head_a = nk.nn.Linear(8, 3, dtype=dtype)
        self.head_b = nk.nn.Linear(8, 3, dtype=dtype)
        self.never = nk.nn.Linear(2, 2, dtype=dtype)

    def forward(self, x):
        return nk.functional.tanh(self.body(x))


def data():
    rng = np.random.default_rng(5)
    return rng.standard_normal((ROWS, 6)), rng.integers(0, 3, ROWS)


def batches(n):
    """The global batches, the same on every rank: two epochs of a fixed permutation."""
    order = np.random.default_rng(7).permutation(n)
    return [order[i:i + GLOBAL_BATCH] for _ in range(2) for i in range(0, n, GLOBAL_BATCH)]


def make_model(dtype, seed):
    nk.manual_seed(seed)
    return Routed(dtype)


def make_optimizer(name, model):
    if name == "sgd":
        return nk.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    if name == "adam":
        return nk.optim.Adam(model.parameters(), lr=0.01)
    return nk.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1)


def routed_loss(model, x, y):
    """The mean cross-entropy over the rows, each through the head its first feature picks
    (rows with x[:, 0] > 1 through ``head_a``)."""
    h = model(x)
    to_a = np.flatnonzero(x[:, 0] > 1.0)
    to_b = np.flatnonzero(x[:, 0] <= 1.0)
    total = None
    for head, rows in ((model.head_a, to_a), (model.head_b, to_b)):
        if len(rows):
            part = F.cross_entropy(head(h[rows]), y[rows], reduction="sum")
            total = part if total is None else total + part
    return total / len(x)


def train_one_process(case):
    """The reference: the same batches, the whole global batch in one process."""
    X, y = data()
    dtype, optimizer_name = case
    model = make_model(dtype, seed=11)
    optimizer = make_optimizer(optimizer_name, model)
    for idx in batches(len(X)):
        optimizer.zero_grad()
        routed_loss(model, X[idx].astype(dtype), y[idx]).backward()
        optimizer.step()
    return {f"{dtype}-{optimizer_name}-{name}": p.data for name, p in model.named_parameters()}


def mlp(seed=11):
    nk.manual_seed(seed)
    return nk.nn.Sequential(nk.nn.Linear(6, 8, dtype="float64"), nk.nn.Tanh(),
                            nk.nn.Linear(8, 3, dtype="float64"))


def fit_one_process(epochs=2, batch_size=GLOBAL_BATCH, random_state=3):
    """``fit_data_parallel``'s schedule in one process on ``mlp()``: (model, losses)."""
    from helpers import fit_one_process as fit

    X, y = data()
    model = mlp()
    optimizer = nk.optim.Adam(model.parameters(), lr=0.01)
    losses = fit(model, optimizer, X, y, batch_size, epochs, random_state=random_state)
    return model, losses
