"""Run by tests/test_mpi.py under ``mpiexec -n N``: trains the routed model of
``ddp_problem`` with DistributedDataParallel for each optimizer and dtype, and rank 0 writes
the final parameters (or, with ``diverge``, the error every rank raised) to ``argv[1]``."""

from __future__ import annotations

import sys

import numpy as np

from nnkit.distributed import DistributedDataParallel, ReplicaDivergenceError

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from ddp_problem import (  # noqa: E402
    CASES,
    GLOBAL_BATCH,
    batches,
    data,
    make_model,
    make_optimizer,
    mlp,
    routed_loss,
)


def train(case, X, y, overlap):
    """With ``overlap``, local_share announces the rows and the buckets (one or two
    parameters each) start in the backward pass, in order on every rank although a head
    used on one rank only completes there later; without, allreduce_gradients sends all."""
    dtype, optimizer_name = case
    model = make_model(dtype, seed=11)
    ddp = DistributedDataParallel(model, bucket_bytes=256, check_every=3, overlap=overlap)
    optimizer = make_optimizer(optimizer_name, model)
    started = 0  # buckets sent before allreduce_gradients, over the run
    for idx in batches(len(X)):
        if overlap:
            local = ddp.local_share(idx)
        else:
            local = np.array_split(idx, ddp.size)[ddp.rank]
        optimizer.zero_grad()
        if len(local):
            routed_loss(model, X[local].astype(dtype), y[local]).backward()
        started += ddp._step.started if ddp._step else 0
        ddp.allreduce_gradients(len(local))
        optimizer.step()
    ddp.check_replicas()
    assert (started > 0) == overlap, (started, overlap)
    return {f"{dtype}-{optimizer_name}-{name}": p.data for name, p in model.named_parameters()}


def diverge(out_path):
    model = make_model("float64", seed=11)
    ddp = DistributedDataParallel(model)
    if ddp.rank == 1:
        model.head_a.bias.data[0] += 1e-12
    try:
        ddp.check_replicas()
    except ReplicaDivergenceError as exc:
        message = str(exc)
    else:
        message = "no error"
    if ddp.rank == 0:
        with open(out_path, "w") as f:
            f.write(message)


def fit(out_path, checkpoint=None, stop_at=None):
    """fit_data_parallel(..., backend="mpi"): rank 0 writes the parameters and the losses
    its callback saw. With ``checkpoint``, one every 4 steps; ``stop_at``: rank 0's
    callback raises at that step (a job ended part way)."""
    import nnkit as nk
    import nnkit.functional as F
    from nnkit.distributed import fit_data_parallel

    X, y = data()
    model = mlp()
    optimizer = nk.optim.Adam(model.parameters(), lr=0.01)
    losses = []

    def callback(info):
        if info.step == stop_at:
            raise RuntimeError(f"stopped at step {stop_at}")
        losses.append(info.loss)

    fit_data_parallel(model, F.cross_entropy, optimizer, X, y, GLOBAL_BATCH, 2,
                      random_state=3, backend="mpi", progress=False, callback=callback,
                      checkpoint=checkpoint, checkpoint_every=4)
    from mpi4py import MPI

    if MPI.COMM_WORLD.Get_rank() == 0:
        np.savez(out_path, losses=np.array(losses),
                 **{name: p.data for name, p in model.named_parameters()})


def fail(how):
    """Rank 1 fails in the third step: an exception (``raise``) or killed (``exit``)."""
    import os

    X, y = data()
    model = make_model("float64", seed=11)
    ddp = DistributedDataParallel(model)
    optimizer = make_optimizer("sgd", model)
    for step, idx in enumerate(batches(len(X)) * 100):
        if step == 2 and ddp.rank == 1:
            if how == "raise":
                raise RuntimeError("a failure on rank 1")
            os._exit(3)
        local = ddp.local_share(idx)
        optimizer.zero_grad()
        if len(local):
            routed_loss(model, X[local], y[local]).backward()
        ddp.allreduce_gradients(len(local))
        optimizer.step()


def unseeded(out_path):
    """fit_data_parallel(backend="mpi", random_state=None): rank 0 writes the rows every
    rank's replica saw, per step (the last feature of X holds the row number)."""
    import nnkit as nk
    import nnkit.functional as F
    from nnkit.distributed import fit_data_parallel

    class Recording(nk.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = mlp()
            self.seen = []

        def forward(self, x):
            self.seen.append(np.asarray(x)[:, -1].astype(int).tolist())
            return self.net(x)

    X, y = data()
    X[:, -1] = np.arange(len(X))
    model = Recording()
    optimizer = nk.optim.SGD(model.parameters(), lr=0.01)
    rows = []
    fit_data_parallel(model, F.cross_entropy, optimizer, X, y, GLOBAL_BATCH, 2,
                      random_state=None, backend="mpi", progress=False,
                      callback=lambda info: rows.append(None))
    from mpi4py import MPI

    seen = MPI.COMM_WORLD.gather(model.seen, root=0)
    if MPI.COMM_WORLD.Get_rank() == 0:
        import json

        with open(out_path, "w") as f:
            json.dump(seen, f)


def dropout(out_path):
    """A model with dropout, each rank's stream from the seed and its rank: rank 0 writes
    the final parameters and every rank's first draw after the seeding."""
    import nnkit as nk
    import nnkit.functional as F

    X, y = data()
    nk.manual_seed(11)
    model = nk.nn.Sequential(nk.nn.Linear(6, 16, dtype="float64"), nk.nn.Dropout(0.5),
                             nk.nn.Linear(16, 3, dtype="float64"))
    ddp = DistributedDataParallel(model, seed=5)
    first = nk.get_rng().bit_generator.state["state"]["state"]
    optimizer = make_optimizer("adam", model)
    for idx in batches(len(X)):
        local = ddp.local_share(idx)
        optimizer.zero_grad()
        F.cross_entropy(ddp(X[local]), y[local]).backward()
        ddp.allreduce_gradients(len(local))
        optimizer.step()
    ddp.check_replicas()
    firsts = ddp.comm.gather(str(first), root=0)
    if ddp.rank == 0:
        np.savez(out_path, firsts=np.array(firsts),
                 **{name: p.data for name, p in model.named_parameters()})


def grid(out_path):
    """map_experiments(backend="mpi") on a grid with one failing point: every rank gets the
    table; rank 0 writes its rows and failures, and each rank's equality with rank 0's."""
    import json

    from mpi4py import MPI

    from nnkit.distributed import map_experiments

    def point(a, b):
        if a == 2 and b == 20:
            raise ValueError("a bad point")
        return {"sum": a + b, "rank": MPI.COMM_WORLD.Get_rank()}

    table = map_experiments(point, {"a": [1, 2, 3], "b": [10, 20]}, backend="mpi",
                            progress=False)
    same = MPI.COMM_WORLD.allgather(table.rows)
    if MPI.COMM_WORLD.Get_rank() == 0:
        with open(out_path, "w") as f:
            json.dump({"rows": table.rows, "same": all(r == same[0] for r in same),
                       "failures": [[x.params, x.error] for x in table.failures]}, f)


MODES = {"diverge": diverge, "fit": fit, "unseeded": unseeded, "dropout": dropout,
         "grid": grid}


def main():
    out_path, args = sys.argv[1], sys.argv[2:]
    if not args:
        train_all(out_path)
    elif args[0] == "fail":
        fail(args[1])
    elif args[0] == "resume":  # resume CHECKPOINT [STOP_AT]
        fit(out_path, args[1], int(args[2]) if len(args) > 2 else None)
    else:
        MODES[args[0]](out_path)


def train_all(out_path):
    """Every (dtype, optimizer) case, every other one with the all-reduce overlapped with
    the backward; rank 0 writes the final parameters."""
    X, y = data()
    results = {}
    for i, case in enumerate(CASES):
        results.update(train(case, X, y, overlap=i % 2 == 0))
    from mpi4py import MPI

    if MPI.COMM_WORLD.Get_rank() == 0:
        np.savez(out_path, **results)


if __name__ == "__main__":
    main()
