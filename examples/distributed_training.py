"""Data-parallel training and an experiment grid on a Dask cluster (``nk.distributed``).
=====================================================================================

    python examples/distributed_training.py            # 2 local workers
    python examples/distributed_training.py --small    # fewer epochs and loads (smoke test)
    python examples/distributed_training.py --scheduler tcp://host:8786   # any cluster

First an MLP 64-128-128-10 learns scikit-learn's digits by synchronous data-parallel Adam:
each worker holds half of the training rows and a replica, the gradients of each global
batch are summed, and one optimizer step follows. Then a Hopfield capacity sweep runs as
one task per (n, alpha) point and comes back as a table; the overlap of the retrieved
fixed point collapses past alpha ~ 0.138. Needs ``pip install "nnkit[distributed]"``.
"""

from __future__ import annotations

import argparse

import numpy as np
from distributed import Client, LocalCluster

import nnkit as nk
import nnkit.functional as F
from nnkit.datasets import load_digits
from nnkit.distributed import fit_data_parallel, map_experiments
from nnkit.training import accuracy


def capacity_point(n, alpha, seed):
    """Overlap of the fixed point with the stored pattern at load alpha (one grid point)."""
    from nnkit.classic.hopfield import retrieval_curve

    curve = retrieval_curve(n, [alpha], n_probes=20, random_state=seed)
    return {"overlap": float(curve.overlap[0]), "flip_rate": float(curve.flip_rate[0])}


def train(client, epochs):
    split = load_digits(random_state=0)
    nk.manual_seed(0)
    model = nk.nn.Sequential(nk.nn.Linear(64, 128), nk.nn.ReLU(), nk.nn.Linear(128, 128),
                             nk.nn.ReLU(), nk.nn.Linear(128, 10))
    opt = nk.optim.Adam(model.parameters(), lr=2e-3)
    fit_data_parallel(model, F.cross_entropy, opt, split.X_train, split.y_train,
                      batch_size=128, epochs=epochs, client=client, random_state=0)
    acc = accuracy(model, split.X_test, split.y_test)
    print(f"data-parallel MLP on digits, {epochs} epochs: test accuracy {acc:.3f}")
    return acc


def sweep(client, small):
    alphas = np.linspace(0.04, 0.24, 6 if small else 11)
    grid = {"n": [200, 400] if small else [250, 500, 1000],
            "alpha": [round(float(a), 3) for a in alphas],
            "seed": [0]}
    table = map_experiments(capacity_point, grid, client)
    print(table.to_markdown())
    return table


def plot(table, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot")
        return
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for n in dict.fromkeys(table.column("n")):
        rows = [r for r in table.rows if r["n"] == n]
        ax.plot([r["alpha"] for r in rows], [r["overlap"] for r in rows], "o-", label=f"n={n}")
    ax.axvline(0.138, color="gray", linestyle=":", label="alpha = 0.138")
    ax.set_xlabel("load alpha = s / n")
    ax.set_ylabel("overlap of the fixed point")
    ax.legend()
    ax.set_title("Hopfield capacity, one Dask task per point")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--small", action="store_true", help="small sizes, for a smoke test")
    parser.add_argument("--scheduler", default=None, help="a scheduler address to use")
    parser.add_argument("--out", default="distributed_capacity.png")
    args = parser.parse_args(argv)
    if args.scheduler:
        client, cluster = Client(args.scheduler, timeout=10), None
    else:
        cluster = LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None)
        client = Client(cluster)
    try:
        acc = train(client, epochs=5 if args.small else 20)
        table = sweep(client, args.small)
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
    plot(table, args.out)
    return {"test_accuracy": acc, "points": len(table)}


if __name__ == "__main__":
    main()
