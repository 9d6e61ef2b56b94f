"""Hopfield recall on the GPU: ``Hopfield.run`` on CuPy states vs the same call on NumPy states.

    python benchmarks/bench_hopfield_gpu.py [--quick] [--json PATH]

A batch of B probes, each a stored pattern (Hebbian, s = 0.05 n) with 10% of its bits
flipped, recalled to convergence asynchronously (random order, one block per probe on the
GPU; the CPU threads the probes over its cores) and synchronously (the GPU sums every field
per step; the CPU updates them incrementally): seconds per call (median, the device
synchronised around each call, so launches and the host's checks count; the states are
uploaded before timing), the CPU's seconds and ratio = CPU / GPU, and whether the two runs
agree bit for bit (states, sweeps, converged; they must).

Shapes: (n, B) = (1000, 1024) and (4000, 256); ``--quick`` the first at B = 256. Under
Numba's CUDA simulator (the CuPy stand-in of tests/stand_in) tiny shapes and small blocks
only check that the script runs:

    NNKIT_CUPY_STAND_IN=1 NUMBA_ENABLE_CUDASIM=1 PYTHONPATH=tests/stand_in \\
        python benchmarks/bench_hopfield_gpu.py --quick

``run(quick)`` returns the rows (``benchmarks/bench_gpu.py`` calls it with its size).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nnkit.classic import Hopfield  # noqa: E402

SHAPES = {"full": [(1000, 1024), (4000, 256)], "quick": [(1000, 256)], "smoke": [(12, 2)]}


def _simulated() -> bool:
    from numba import config

    return bool(config.ENABLE_CUDASIM)


def _seconds(fn, sync, repeats):
    """Median seconds of ``fn()`` over ``repeats`` calls after one warm-up call."""
    fn()
    sync()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        samples.append(time.perf_counter() - start)
    return float(np.median(samples))


def _agree(gpu, cpu) -> bool:
    return all(np.array_equal(np.asarray(getattr(gpu, k).get()), getattr(cpu, k))
               for k in ("states", "sweeps", "converged"))


def _probes(n, B, rng):
    xi = rng.choice(np.array([-1, 1], np.int8), size=(max(1, round(0.05 * n)), n))
    picks = xi[rng.integers(0, xi.shape[0], B)]
    return xi, (picks * np.where(rng.random(picks.shape) < 0.1, -1, 1)).astype(np.int8)


def run(quick=False) -> list[dict]:
    """Rows {name, shape, seconds, cpu_seconds, ratio, agree}. ``quick``: False or "full",
    True or "quick", or "smoke" (tiny shapes, one call: the check that the script runs);
    under the CUDA simulator always "smoke"."""
    import cupy

    size = {False: "full", True: "quick"}.get(quick, quick)
    if _simulated():
        from nnkit._ext import hopfield_cuda  # few threads per simulated block

        size, hopfield_cuda.async_threads, hopfield_cuda.block = "smoke", 4, (2, 4)
    repeats = 1 if size == "smoke" else 5
    rng = np.random.default_rng(0)
    rows = []
    for n, B in SHAPES[size]:
        xi, x = _probes(n, B, rng)
        net = Hopfield(n).store(xi)
        x_gpu = cupy.asarray(x)
        for mode in ("async", "sync"):
            def gpu_call(mode=mode, net=net, x=x_gpu):
                return net.run(x, mode=mode, random_state=1)

            def cpu_call(mode=mode, net=net, x=x):
                return net.run(x, mode=mode, random_state=1)

            seconds = _seconds(gpu_call, cupy.cuda.Device().synchronize, repeats)
            cpu_seconds = _seconds(cpu_call, lambda: None, repeats)
            rows.append({"name": f"hopfield_{mode}_recall", "shape": [n, B],
                         "seconds": seconds, "cpu_seconds": cpu_seconds,
                         "ratio": cpu_seconds / seconds,
                         "agree": _agree(gpu_call(), cpu_call())})
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one shape, B = 256")
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args(argv)
    rows = run(args.quick)
    print("| recall | n x B | GPU s | CPU s | CPU / GPU | agree |\n|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['name']} | {r['shape'][0]} x {r['shape'][1]} | {r['seconds']:.4g} | "
              f"{r['cpu_seconds']:.4g} | {r['ratio']:.3g} | {r['agree']} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0 if all(r["agree"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
