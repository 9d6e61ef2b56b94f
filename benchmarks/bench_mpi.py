"""Data-parallel training of an MLP 784-256-256-10 (float32, Adam) with
``nk.distributed.DistributedDataParallel`` on 2 MPI ranks (one thread each, ``mpiexec -n 2``)
against the same training in one process on 2 threads, on the same global batches.

Reported per global batch size B: samples/s of both and their ratio (targets: >= 0.9 at
B = 512, >= 0.7 at B = 128), and the time a rank spends in ``allreduce_gradients`` and its
share of the step (waits for the slower rank included), with the all-reduces started in
the backward pass (``overlap=True``) and without. ``--bucket-kib K`` caps the buckets at K
KiB (default 25 MiB: the MLP's 1.08 MB of gradients is one bucket, which cannot start
before the backward ends; 256 sends the last two layers while the first one's backward
runs). Each contender runs in its own processes; every process has glibc malloc tuned
alike.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_mpi.py [--quick]
        [--bucket-kib K]
"""

from __future__ import annotations

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
from harness import nnkit_mlp, report, same_allocator  # noqa: E402

SIZES = (784, 256, 256, 10)
BATCHES = (128, 512, 2048)


def _data(n):
    rng = np.random.default_rng(0)
    return rng.standard_normal((n, SIZES[0])).astype(np.float32), rng.integers(0, 10, n)


def _train(batch, steps, ddp_on, overlap=True, bucket_bytes=25 * 2**20):
    """Seconds per step (median) and the median all-reduce seconds (0 in one process)."""
    import nnkit as nk
    import nnkit.functional as F

    X, y = _data(batch * 8)
    model = nnkit_mlp(SIZES)
    ddp = nk.distributed.DistributedDataParallel(model, overlap=overlap,
                                                 bucket_bytes=bucket_bytes) if ddp_on else None
    opt = nk.optim.Adam(model.parameters(), lr=1e-3)
    order = np.arange(len(X))
    step_s, reduce_s = [], []
    for s in range(steps):
        idx = order[(s % 8) * batch:(s % 8 + 1) * batch]
        local = ddp.local_share(idx) if ddp else idx
        t0 = time.perf_counter()
        opt.zero_grad()
        F.cross_entropy(model(X[local]), y[local]).backward()
        t1 = time.perf_counter()
        if ddp:
            ddp.allreduce_gradients(len(local))
        t2 = time.perf_counter()
        opt.step()
        step_s.append(time.perf_counter() - t0)
        reduce_s.append(t2 - t1)
    warm = steps // 5
    return float(np.median(step_s[warm:])), float(np.median(reduce_s[warm:]))


def _worker(batch, steps, ddp_on, overlap, bucket_bytes):
    same_allocator()
    step, reduce = _train(batch, steps, ddp_on, overlap, bucket_bytes)
    if ddp_on:
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        step = comm.allreduce(step, op=MPI.MAX)  # the job goes at its slower rank's pace
        reduce = comm.allreduce(reduce, op=MPI.MAX)
        if comm.Get_rank():
            return
    print(json.dumps([step, reduce]))


def _run_contender(batch, steps, ranks, overlap=True, bucket_bytes=25 * 2**20):
    env = dict(os.environ)
    threads = "1" if ranks > 1 else "2"
    env.update(NUMBA_NUM_THREADS=threads, OMP_NUM_THREADS=threads,
               OPENBLAS_NUM_THREADS=threads, MKL_NUM_THREADS=threads)
    cmd = [sys.executable, str(HERE), "--worker", str(batch), str(steps), str(int(ranks > 1)),
           str(int(overlap)), str(bucket_bytes)]
    if ranks > 1:
        mpiexec = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or "mpiexec"
        cmd = [mpiexec, "-n", str(ranks), *cmd]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run(quick: bool = False, bucket_bytes: int = 25 * 2**20) -> list[dict]:
    steps = 40 if quick else 150
    rows = []
    for batch in BATCHES:
        one_step, _ = _run_contender(batch, steps, 1)
        row = {"global batch": batch,
               "one process, 2 threads: samples/s": f"{batch / one_step:.0f}"}
        for overlap in (True, False):
            mpi_step, reduce = _run_contender(batch, steps, 2, overlap, bucket_bytes)
            how = "overlap" if overlap else "after backward"
            row.update({f"2 ranks, {how}: samples/s": f"{batch / mpi_step:.0f}",
                        f"ranks / one ({how})": f"{one_step / mpi_step:.2f}",
                        f"all-reduce ms ({how})": f"{reduce * 1e3:.2f}",
                        f"share ({how})": f"{reduce / mpi_step:.0%}"})
        rows.append(row)
    return rows


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--worker":
        _worker(int(argv[1]), int(argv[2]), argv[3] == "1", argv[4] == "1", int(argv[5]))
        return
    same_allocator()
    kib = int(argv[argv.index("--bucket-kib") + 1]) if "--bucket-kib" in argv else 25 * 1024
    report(lambda quick: run(quick, kib * 1024), argv)


if __name__ == "__main__":
    main()
