"""Synchronous data-parallel training on MPI ranks (``nk.distributed.DistributedDataParallel``).
=============================================================================================

    mpiexec -n 2 python examples/train_mpi.py          # 2 ranks on this machine
    srun python examples/train_mpi.py                  # the ranks of a Slurm allocation
    python examples/train_mpi.py --small               # one rank, fewer epochs (smoke test)

An MLP 64-128-128-10 learns scikit-learn's digits with Adam. Every rank builds the same
global batches from the same seed, takes its share of each, and the gradients are summed
across ranks in flat buckets, so every replica takes the step one process would take on the
whole batch. Rank 0 alone prints, writes the checkpoint (``nk.save``, atomic) and plots the
loss curve. Needs ``pip install "nnkit[mpi]"``. A Slurm batch script::

    #!/bin/bash
    #SBATCH --nodes=2 --ntasks-per-node=8 --cpus-per-task=1 --time=00:10:00
    export NUMBA_NUM_THREADS=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
    srun python examples/train_mpi.py --epochs 20

If a rank dies, MPI ends the whole job (its usual fail-fast); rerun from the checkpoint.
"""

from __future__ import annotations

import argparse

import numpy as np

import nnkit as nk
import nnkit.functional as F
from nnkit.datasets import load_digits
from nnkit.training import accuracy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--small", action="store_true")
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--batch", type=int, default=128, help="global batch size")
    parser.add_argument("--out", default="train_mpi.png")
    parser.add_argument("--checkpoint", default="train_mpi.nnk")
    args = parser.parse_args()
    epochs = 2 if args.small else args.epochs

    split = load_digits(random_state=0)
    X, y = split.X_train.astype(np.float32), split.y_train
    nk.manual_seed(0)
    model = nk.nn.Sequential(nk.nn.Linear(64, 128), nk.nn.ReLU(), nk.nn.Linear(128, 128),
                             nk.nn.ReLU(), nk.nn.Linear(128, 10))
    ddp = nk.distributed.DistributedDataParallel(model, check_every=50)
    optimizer = nk.optim.Adam(model.parameters(), lr=1e-3)
    order_rng = np.random.default_rng(1)  # the same permutation on every rank
    losses = []
    for epoch in range(epochs):
        order = order_rng.permutation(len(X))
        total = 0.0
        for start in range(0, len(X), args.batch):
            local = ddp.local_share(order[start:start + args.batch])
            optimizer.zero_grad()
            loss = F.cross_entropy(ddp(X[local]), y[local])
            loss.backward()
            ddp.allreduce_gradients(len(local))
            optimizer.step()
            total += float(loss.item()) * len(local)
        losses.append(ddp.comm.allreduce(total) / len(X))  # the epoch's mean loss, all rows
        if ddp.rank == 0:
            print(f"epoch {epoch + 1}: loss {losses[-1]:.4f}")
    ddp.check_replicas()
    if ddp.rank == 0:
        test_accuracy = accuracy(model, split.X_test.astype(np.float32), split.y_test)
        print(f"{ddp.size} rank(s): test accuracy {test_accuracy:.3f}")
        nk.save({"model": model, "optimizer": optimizer}, args.checkpoint)
        _plot(losses, ddp.size, args.out)


def _plot(losses, ranks, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot")
        return
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot(range(1, len(losses) + 1), losses, marker="o")
    ax.set(xlabel="epoch", ylabel="mean training loss", title=f"MLP on digits, {ranks} rank(s)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
