"""The tree scans (``nk.kernels.tree_scan``, Hillis-Steele and Blelloch) against the
sequential-in-T scan (``linear_scan_forward``), float32, best of 5 after a warm-up call.

The tree scans show the parallel-prefix algorithm and count its depth and work; this
measures what their level-by-level passes over memory cost against the work-efficient scan.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE PYTHONPATH=$PWD \\
        python benchmarks/bench_tree_scan.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import block_times  # noqa: E402

from nnkit.kernels import linear_scan_forward, tree_scan  # noqa: E402


def best(fn, n=5):
    return min(block_times(fn, blocks=n, block=1, warmup=1))


def main():
    rng = np.random.default_rng(0)
    print("| shape | linear_scan_forward ms | Hillis-Steele ms | Blelloch ms |")
    print("|---|---|---|---|")
    for shape in [(16, 4096, 64), (1, 1 << 20, 1)]:
        a = rng.uniform(0.5, 0.99, shape).astype(np.float32)
        b = rng.standard_normal(shape).astype(np.float32)
        times = [best(lambda a=a, b=b: linear_scan_forward(a, b))]
        for algorithm in ("hillis_steele", "blelloch"):
            times.append(best(lambda a=a, b=b, algorithm=algorithm:
                              tree_scan(a, b, algorithm=algorithm)))
        print(f"| {shape} f32 | " + " | ".join(f"{1e3 * t:.1f}" for t in times) + " |")


if __name__ == "__main__":
    main()
