"""Data-parallel training of an MLP 784-256-256-10 (float32, Adam) with
``nk.distributed.fit_data_parallel`` on W local Dask workers (one thread each; W = 2, or
``--workers W``) against the same training in one process (all cores), on the same global
batches.

Reported per global batch size B: samples/s of both and their ratio, the median step time on
the workers' side (the replica's update, forward, backward: the longest of the shards) and
the communication share of a step (1 - compute / step: submit, scheduling, the reduction
tree's transfers and sums, the sum to the driver and its update), the bytes one worker
sends and receives per step, the cluster start and the first task's warm-up.

    python benchmarks/bench_distributed.py [--quick] [--workers W]
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import nnkit_mlp, report  # noqa: E402

SIZES = (784, 256, 256, 10)


def _data(n):
    rng = np.random.default_rng(0)
    return rng.standard_normal((n, SIZES[0])).astype(np.float32), rng.integers(0, 10, n)


def _single_process_step_s(X, y, batch, steps):
    """Median seconds of one training step in this process, same batches as the workers."""
    import nnkit as nk
    import nnkit.functional as F
    from nnkit.training import minibatches

    model = nnkit_mlp(SIZES)
    opt = nk.optim.Adam(model.parameters(), lr=1e-3)
    rng = np.random.default_rng(0)
    times = []
    while len(times) < steps + 3:
        for idx in minibatches(len(X), batch, True, rng):
            start = time.perf_counter()
            opt.zero_grad()
            loss = F.cross_entropy(model(X[idx]), y[idx])
            loss.backward()
            opt.step()
            times.append(time.perf_counter() - start)
    return float(np.median(times[3:]))  # the first steps load kernels


def _parallel_steps(client, X, y, batch, steps):
    import nnkit as nk
    import nnkit.functional as F
    from nnkit.distributed import fit_data_parallel

    model = nnkit_mlp(SIZES)
    opt = nk.optim.Adam(model.parameters(), lr=1e-3)
    infos = []
    epochs = -(-(steps + 3) // (len(X) // batch))
    fit_data_parallel(model, F.cross_entropy, opt, X, y, batch, epochs, client,
                      random_state=0, worker_threads=1, progress=False,
                      callback=infos.append)
    return infos[3:]


def run(quick: bool = False, workers: int = 2) -> list[dict]:
    from distributed import Client, LocalCluster

    batches = (256, 1024) if quick else (128, 512, 2048)
    steps = 10 if quick else 40
    X, y = _data(8192)
    start = time.perf_counter()
    with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster, \
            Client(cluster) as client:
        client.wait_for_workers(workers)
        cluster_s = time.perf_counter() - start
        rows = []
        for batch in batches:
            time.sleep(0.3)
            single = _single_process_step_s(X, y, batch, steps)
            time.sleep(0.3)
            infos = _parallel_steps(client, X, y, batch, steps)
            step = float(np.median([i.seconds for i in infos]))
            compute = float(np.median([i.compute_seconds for i in infos]))
            rows.append({
                "work": f"MLP 784-256-256-10 f32 Adam, B={batch}",
                "1 process samples/s": f"{batch / single:.0f}",
                f"{workers} workers samples/s": f"{batch / step:.0f}",
                "ratio workers/1p": f"{single / step:.2f}",
                "step ms": f"{step * 1e3:.1f}",
                "worker compute ms": f"{compute * 1e3:.1f}",
                "comm share": f"{100 * (1 - compute / step):.0f}%",
                "bytes/worker/step": f"{infos[0].message_bytes / 1e6:.2f} MB",
                "warm-up s": f"{max(infos[0].warm_up_seconds):.2f}",
                "cluster start s": f"{cluster_s:.1f}",
                "cores": os.cpu_count(),
            })
    return rows


if __name__ == "__main__":
    argv = sys.argv[1:]
    W = int(argv[argv.index("--workers") + 1]) if "--workers" in argv else 2
    report(lambda quick: run(quick, W), argv)
