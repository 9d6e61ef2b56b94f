"""The step GEMM (packed panels, the recurrent layers' time-loop product) on one thread, at
the recurrent layers' shapes: nnkit under every instruction set this CPU runs, against
torch.mm and NumPy's matmul (OpenBLAS), float32 and float64.

Each contender runs in its own process, on one thread (``NNKIT_ISA`` picks nnkit's build;
torch with ``torch.set_num_threads(1)``, NumPy with ``OPENBLAS_NUM_THREADS=1``), glibc malloc
tuned alike (harness.same_allocator()); each reports the best of 7 blocks of calls into a
preallocated output. To hold torch to the same instruction set as a lower nnkit build, run
the whole script under its caps, e.g. for AVX2 on an AVX-512 machine::

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE ATEN_CPU_CAPABILITY=avx2 \\
        ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 python benchmarks/bench_gemm.py

``--quick``: two shapes. Target: nnkit >= 0.9x torch under AVX2.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))
from harness import report, same_allocator, torch_available  # noqa: E402

SHAPES = [(8, 384, 1024), (32, 128, 512), (32, 256, 1024), (64, 512, 512)]
DTYPES = ("float32", "float64")


def _best_seconds(call, flops: float) -> float:
    call()
    reps = max(3, int(2e8 / flops))
    best = float("inf")
    for _ in range(7):
        start = time.perf_counter()
        for _ in range(reps):
            call()
        best = min(best, (time.perf_counter() - start) / reps)
    return best


def _contender(impl: str, a, b, out):
    """The call that writes a @ b into ``out`` for ``impl``."""
    if impl == "torch":
        import torch

        ta, tb, tout = (torch.from_numpy(v) for v in (a, b, out))
        return lambda: torch.mm(ta, tb, out=tout)
    if impl == "numpy":
        return lambda: np.matmul(a, b, out=out)
    from nnkit._ext import gemm_cpu

    bp = gemm_cpu.pack_panels(b)
    return lambda: gemm_cpu.step_gemm(a, bp, out)


def _worker(impl: str, shapes) -> None:
    """Print {"M,K,N,dtype": seconds} for ``impl`` (nnkit, torch or numpy)."""
    rng = np.random.default_rng(0)
    if impl == "torch":
        import torch

        torch.set_num_threads(1)
    times = {}
    for M, K, N in shapes:
        for dtype in DTYPES:
            a = rng.standard_normal((M, K)).astype(dtype)
            b = rng.standard_normal((K, N)).astype(dtype)
            out = np.empty((M, N), dtype)
            call = _contender(impl, a, b, out)
            times[f"{M},{K},{N},{dtype}"] = _best_seconds(call, 2 * M * K * N)
    print(json.dumps(times))


def _run_worker(impl: str, quick: bool, env: dict) -> dict:
    out = subprocess.run([sys.executable, str(HERE), "--worker", impl, str(int(quick))],
                         capture_output=True, text=True, check=True,
                         env={**os.environ, "OPENBLAS_NUM_THREADS": "1",
                              "NUMBA_NUM_THREADS": "1", **env})
    return json.loads(out.stdout.strip().splitlines()[-1])


def run(quick: bool = False) -> list[dict]:
    from nnkit._ext import ISA_NAMES, conv_window

    builds = ISA_NAMES[:conv_window.CPU_LEVEL + 1]
    results = {f"nnkit {isa}": _run_worker("nnkit", quick, {"NNKIT_ISA": isa})
               for isa in builds}
    results["numpy (OpenBLAS)"] = _run_worker("numpy", quick, {})
    if torch_available():
        results["torch.mm"] = _run_worker("torch", quick, {})
    rows = []
    for key in next(iter(results.values())):
        M, K, N, dtype = key.split(",")
        flops = 2 * int(M) * int(K) * int(N)
        row = {"work": f"({M}, {K}) @ ({K}, {N}) {dtype}"}
        for name, times in results.items():
            row[f"{name} GFLOP/s"] = round(flops / times[key] / 1e9, 1)
        if "torch.mm" in results:
            for isa in builds:
                row[f"torch/nnkit {isa}"] = round(
                    results["torch.mm"][key] / results[f"nnkit {isa}"][key], 2)
        rows.append(row)
    return rows


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    same_allocator()  # glibc malloc tuned alike in every process, each contender's worker
    if argv and argv[0] == "--worker":
        _worker(argv[1], SHAPES[:2] if argv[2] == "1" else SHAPES)
        return
    report(run, argv)


if __name__ == "__main__":
    main()
