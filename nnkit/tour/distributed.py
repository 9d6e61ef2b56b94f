"""The ``nnkit tour`` section for ``nk.distributed`` (Dask).

Rows: an MLP on digits trained data-parallel on a LocalCluster of 2 worker processes against
the same training in one process (same global batches: the same parameters up to float
rounding, so the same test accuracy), and a small Hopfield capacity grid through
``map_experiments``. Without dask, one row says the section was skipped.
"""

from __future__ import annotations

import importlib.util
import time

import numpy as np

from .. import functional as F
from .. import nn, optim
from .._random import manual_seed
from ..datasets import load_digits
from ..training import accuracy, minibatches
from .common import INFO, tour_row

__all__ = ["distributed_section"]

SECTION = "distributed (Dask)"


def _row(result, value, target="", ok=INFO):
    return tour_row(SECTION, result, value, target, ok)


def _mlp(seed):
    manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))


def _single_process(split, epochs, seed):
    model = _mlp(seed)
    opt = optim.Adam(model.parameters(), lr=3e-3)
    rng = np.random.default_rng(seed)
    for _ in range(epochs):
        for idx in minibatches(len(split.X_train), 128, True, rng):
            opt.zero_grad()
            F.cross_entropy(model(split.X_train[idx]), split.y_train[idx]).backward()
            opt.step()
    return model


def _capacity_point(n, alpha):
    from ..classic.hopfield import retrieval_curve

    return {"overlap": float(retrieval_curve(n, [alpha], n_probes=10,
                                             random_state=0).overlap[0])}


def _rows(client, ctx):
    from ..distributed import fit_data_parallel, map_experiments

    split = load_digits(random_state=ctx.seed)
    epochs = 8 if ctx.quick else 15
    model = _mlp(ctx.seed)
    start = time.perf_counter()
    fit_data_parallel(model, F.cross_entropy, optim.Adam(model.parameters(), lr=3e-3),
                      split.X_train, split.y_train, 128, epochs, client,
                      random_state=ctx.seed, progress=False)
    seconds = time.perf_counter() - start
    ref = _single_process(split, epochs, ctx.seed)
    acc, ref_acc = (accuracy(m, split.X_test, split.y_test) for m in (model, ref))
    diff = float(np.max([np.abs(p.data - q.data).max()  # np.max keeps a NaN, max() may not
                         for p, q in zip(model.parameters(), ref.parameters(), strict=True)]))
    table = map_experiments(_capacity_point, {"n": [300], "alpha": [0.08, 0.2]}, client,
                            progress=False)
    low, high = table.column("overlap")
    return [
        _row(f"MLP on digits, 2 workers vs 1 process ({epochs} epochs): test accuracy",
             f"{acc:.3f} vs {ref_acc:.3f}", "equal (+-1 digit), >= 0.9",
             abs(acc - ref_acc) <= 1.5 / len(split.y_test) and acc >= 0.9),
        _row("data-parallel vs single-process parameters, max abs diff", f"{diff:.1e}",
             "<= 1e-4", diff <= 1e-4),
        _row("data-parallel training time (2 local workers)", f"{seconds:.1f} s"),
        _row("map_experiments: Hopfield overlap at alpha 0.08 / 0.2 (n=300)",
             f"{low:.3f} / {high:.3f}", "> 0.97 / < 0.8", low > 0.97 and high < 0.8),
    ]


def distributed_section(ctx) -> list[dict]:
    """Rows of the distributed section (see the module docstring)."""
    if importlib.util.find_spec("distributed") is None:
        return [_row("nk.distributed", 'skipped: dask not installed '
                     '(pip install "nnkit[distributed]")')]
    from distributed import Client, LocalCluster

    start = time.perf_counter()
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        rows = _rows(client, ctx)
    # A time is information, not a check: a busy machine is not a broken one.
    rows.append(_row("section time incl. cluster start", f"{time.perf_counter() - start:.1f} s"))
    return rows
