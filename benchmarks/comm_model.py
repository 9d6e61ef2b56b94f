"""A communication model of synchronous data parallelism on a cluster, from figures measured
on this machine: step time and efficiency at 8, 64 and 256 ranks on 10 and 100 Gb/s networks
for the MLP 784-256-256-10 (Adam, float32) and for a BERT-base fine-tuning step, on MPI (ring
all-reduce) and on the two Dask designs: the driver in the middle (parameters out and
gradients back through the driver, nnkit's first design) and the reduction tree (replicas
on the workers, gradients summed by a tree of tasks, the sum sent back down a tree).

Measured here: the per-message cost alpha of an MPI all-reduce (2 ranks, ``mpiexec -n 2``,
small messages) and one core's compute per sample of the MLP step (a + b x samples, fitted
over local batches of 16..512). BERT-base's compute per sample is an argument: the default,
1.2 s a sample on one core, is three times the measured inference time of BERT-base on this
machine (8 sequences of 128 tokens in 1.64 s on 2 threads; RESULTS.md, "AVX2 builds"), the
usual forward + backward estimate, not a measured training step.

The model, for P ranks, n gradient bytes, a link of B bytes/s, global batch G:

    MPI (ring):  t_comm = 2 (P - 1) alpha + 2 (P - 1) / P * n / B
    Dask, driver:  t_comm = t_fixed + 2 P n / B   (the driver's link carries every replica's
                   parameters out and gradients back; t_fixed the measured ~24 ms a step)
    Dask, tree:    t_comm = t_fixed + (2 L - 1) t_task + (2 L + 1) n / B,  L = ceil(log2 P)
                   (L levels of sums and L - 1 rounds of copies, each a dependent task of
                   t_task ~10 ms measured here, each moving n bytes; the sum to the driver
                   and the last fetch move n bytes more)
    step = compute(G / P) + t_comm,   efficiency = compute(G / P) / step

and the global batch at which efficiency reaches 80% (compute = 4 t_comm).

    python benchmarks/comm_model.py [--bert-seconds-per-sample 1.2]
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
from harness import environment, nnkit_mlp  # noqa: E402

MLP = (784, 256, 256, 10)
MLP_BYTES = 4 * sum(a * b + b for a, b in zip(MLP[:-1], MLP[1:], strict=True))
BERT_BASE_BYTES = 4 * 109_482_240  # bert-base-uncased's parameters, float32
DASK_FIXED_S = 0.024  # the Dask path's fixed cost a step (RESULTS.md, "Scale-out")
DASK_TASK_S = 0.010  # one dependent task's scheduling: the tree's 2-worker step over the driver's
RANKS = (8, 64, 256)
LINKS = {"10 Gb/s": 10e9 / 8, "100 Gb/s": 100e9 / 8}


def _alpha_worker():
    """Median seconds of an 8-byte all-reduce between the ranks (rank 0 prints)."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    a = np.ones(1)
    for _ in range(200):
        comm.Allreduce(MPI.IN_PLACE, a)
    times = []
    for _ in range(2000):
        t = time.perf_counter()
        comm.Allreduce(MPI.IN_PLACE, a)
        times.append(time.perf_counter() - t)
    if comm.Get_rank() == 0:
        print(json.dumps(float(np.median(times))))


def _measure_alpha() -> float:
    mpiexec = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or "mpiexec"
    env = {**os.environ, "NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    out = subprocess.run([mpiexec, "-n", "2", sys.executable, str(HERE), "--alpha-worker"],
                         env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _mlp_compute_fit() -> tuple[float, float]:
    """(a, b): one core's seconds for a step on ``s`` samples, a + b s (least squares)."""
    import numba

    import nnkit as nk
    import nnkit.functional as F

    numba.set_num_threads(1)
    model = nnkit_mlp(MLP)
    opt = nk.optim.Adam(model.parameters(), lr=1e-3)
    rng = np.random.default_rng(0)
    sizes, seconds = [16, 32, 64, 128, 256, 512], []
    for s in sizes:
        X = rng.standard_normal((s, MLP[0])).astype(np.float32)
        y = rng.integers(0, MLP[-1], s)
        times = []
        for _ in range(40):
            t = time.perf_counter()
            opt.zero_grad()
            F.cross_entropy(model(X), y).backward()
            opt.step()
            times.append(time.perf_counter() - t)
        seconds.append(float(np.median(times[10:])))
    b, a = np.polyfit(sizes, seconds, 1)
    return float(a), float(b)


def _comm_mpi(P, n, bandwidth, alpha):
    return 2 * (P - 1) * alpha + 2 * (P - 1) / P * n / bandwidth


def _comm_dask_driver(P, n, bandwidth, alpha):
    return DASK_FIXED_S + 2 * P * n / bandwidth


def _comm_dask_tree(P, n, bandwidth, alpha):
    levels = int(np.ceil(np.log2(P)))
    return DASK_FIXED_S + (2 * levels - 1) * DASK_TASK_S + (2 * levels + 1) * n / bandwidth


def _rows(name, n, a, b, G, alpha):
    rows = []
    for backend, comm_fn in (("MPI", _comm_mpi), ("Dask, driver", _comm_dask_driver),
                             ("Dask, tree", _comm_dask_tree)):
        for link, bandwidth in LINKS.items():
            for P in RANKS:
                comm = comm_fn(P, n, bandwidth, alpha)
                compute = a + b * G / P
                # 80%: a + b G / P = 4 comm
                g80 = max((4 * comm - a) * P / b, P)
                rows.append(f"| {name} | {backend} | {link} | {P} | {G} | {compute * 1e3:.2f} | "
                            f"{comm * 1e3:.2f} | {compute / (compute + comm):.0%} | "
                            f"{g80:,.0f} |")
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--alpha-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--bert-seconds-per-sample", type=float, default=1.2)
    args = parser.parse_args(argv)
    if args.alpha_worker:
        _alpha_worker()
        return
    print(environment())
    alpha = _measure_alpha()
    a, b = _mlp_compute_fit()
    print(f"alpha (8-byte all-reduce, 2 ranks): {alpha * 1e6:.1f} us; MLP step on one core: "
          f"{a * 1e3:.3f} ms + {b * 1e6:.2f} us a sample; gradients: MLP {MLP_BYTES / 1e6:.2f}"
          f" MB, BERT-base {BERT_BASE_BYTES / 1e6:.0f} MB")
    print("| model | backend | link | ranks | global batch | compute ms | communication ms |"
          " efficiency | global batch for 80% |")
    print("|---|---|---|---|---|---|---|---|---|")
    for line in _rows("MLP", MLP_BYTES, a, b, 2048, alpha):
        print(line)
    for line in _rows("BERT-base", BERT_BASE_BYTES, 0.0, args.bert_seconds_per_sample, 256,
                      alpha):
        print(line)


if __name__ == "__main__":
    main()
