"""Strong scaling of ``DistributedDataParallel``: the same global batch on 1, 2, 4, 8, 16 MPI
ranks of one thread each (as many as the machine has cores, or ``--ranks``), for the MLP
784-256-256-10 (float32, Adam, global batch 2048) and a small transformer classifier (2
encoder layers, d_model 128, 4 heads, 64 tokens, float32, Adam, global batch 64).

Prints samples/s, the speed-up over one rank and the parallel efficiency per rank count,
and writes the plot ``scaling_mpi.png`` (speed-up against ranks, the ideal line for
reference; ``--out`` names another file). Each rank count runs in its own ``mpiexec``; a
rank's time is its median step, the job's the slowest rank's.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/scaling_mpi.py
        [--ranks 1 2 4 8 16] [--steps 60] [--out scaling_mpi.png]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))
from harness import environment, nnkit_mlp, same_allocator  # noqa: E402

WORKLOADS = {"MLP 784-256-256-10, B=2048": 2048, "transformer 2x128, T=64, B=64": 64}


def _problem(name):
    """(model, inputs, targets) of a workload, the same on every rank."""
    import nnkit as nk

    rng = np.random.default_rng(0)
    batch = WORKLOADS[name]
    if name.startswith("MLP"):
        return (nnkit_mlp((784, 256, 256, 10)),
                rng.standard_normal((4 * batch, 784)).astype(np.float32),
                rng.integers(0, 10, 4 * batch))
    nk.manual_seed(0)

    class Classifier(nk.nn.Module):
        def __init__(self):
            super().__init__()
            layer = nk.nn.TransformerEncoderLayer(128, 4, 256, dropout=0.0, batch_first=True)
            self.encoder = nk.nn.TransformerEncoder(layer, 2)
            self.head = nk.nn.Linear(128, 10)

        def forward(self, x):
            return self.head(self.encoder(x).mean(axis=1))

    return (Classifier(), rng.standard_normal((4 * batch, 64, 128)).astype(np.float32),
            rng.integers(0, 10, 4 * batch))


def _worker(name, steps):
    """Run under mpiexec: every rank trains on its share; rank 0 prints the slowest rank's
    median step seconds."""
    from mpi4py import MPI

    import nnkit as nk
    import nnkit.functional as F

    same_allocator()
    model, X, y = _problem(name)
    ddp = nk.distributed.DistributedDataParallel(model)
    opt = nk.optim.Adam(model.parameters(), lr=1e-3)
    batch, times = WORKLOADS[name], []
    for s in range(steps):
        idx = np.arange((s % 4) * batch, (s % 4 + 1) * batch)
        start = time.perf_counter()
        local = ddp.local_share(idx)
        opt.zero_grad()
        F.cross_entropy(ddp(X[local]), y[local]).backward()
        ddp.allreduce_gradients(len(local))
        opt.step()
        times.append(time.perf_counter() - start)
    step = MPI.COMM_WORLD.allreduce(float(np.median(times[steps // 5:])), op=MPI.MAX)
    if ddp.rank == 0:
        print(json.dumps(step))


def _run(name, ranks, steps):
    env = dict(os.environ, NUMBA_NUM_THREADS="1", OMP_NUM_THREADS="1",
               OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    mpiexec = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or "mpiexec"
    cmd = [mpiexec, "-n", str(ranks), sys.executable, str(HERE), "--worker", name, str(steps)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _plot(results, path) -> bool:
    """Draw the speed-ups to ``path``; False (no plot) without matplotlib."""
    try:
        import matplotlib
    except ImportError:
        return False

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 4))
    for name, steps in results.items():
        ranks = sorted(steps)
        ax.plot(ranks, [steps[1] / steps[r] for r in ranks], "o-", label=name)
    top = max(r for steps in results.values() for r in steps)
    ax.plot([1, top], [1, top], "k:", label="ideal")
    ax.set(xlabel="MPI ranks (one thread each)", ylabel="speed-up over one rank",
           title="Strong scaling, DistributedDataParallel")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--worker":
        _worker(argv[1], int(argv[2]))
        return
    parser = argparse.ArgumentParser(description=__doc__)
    cores = os.cpu_count() or 1
    parser.add_argument("--ranks", type=int, nargs="+",
                        default=[r for r in (1, 2, 4, 8, 16) if r <= cores])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--out", default="scaling_mpi.png")
    args = parser.parse_args(argv)
    if 1 not in args.ranks:
        parser.error("--ranks must include 1 (the speed-up's reference)")
    print(environment())
    results = {}
    print("| workload | ranks | samples/s | speed-up | efficiency |")
    print("|---|---|---|---|---|")
    for name, batch in WORKLOADS.items():
        results[name] = {r: _run(name, r, args.steps) for r in sorted(args.ranks)}
        for r, step in results[name].items():
            speedup = results[name][1] / step
            print(f"| {name} | {r} | {batch / step:.0f} | {speedup:.2f} | {speedup / r:.0%} |")
    if _plot(results, args.out):
        print(f"plot: {args.out}")
    else:
        print('no plot: matplotlib is not installed (pip install "nnkit[plot]")')


if __name__ == "__main__":
    main()
