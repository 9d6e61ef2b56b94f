"""Row softmax benchmark: nnkit vs the memory-bandwidth bound, NumPy, torch and the twin.

Run: ``env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_softmax.py``
(``--quick`` for small sizes). Every candidate writes into a preallocated ``out``; the
repetitions are interleaved (A, B, C, A, B, C, ...) with a short pause before each timing
(OpenBLAS worker threads spin after a call), and medians are reported. The bound is the
faster of a Numba prange copy and ``np.copyto`` of the same array (read x + write y),
measured in the same run and process as nnkit.

torch runs in a worker process of its own (same thread count, same array, its own copy
bound ``out.copy_(x)``): imported next to numba, torch's OpenMP pool and numba's slow each
other down (softmax 5 ms alone, 7-8 ms with torch loaded, on this machine). Both processes
run with glibc malloc tuned alike (harness.same_allocator()).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numba
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import environment, median_times, same_allocator  # noqa: E402

from nnkit._ext import softmax_cpu
from nnkit.kernels import reference
from nnkit.kernels.softmax import softmax_forward


def _copy_rows(x, out):
    R, C = x.shape
    for i in numba.prange(R):
        xr = x[i]
        yr = out[i]
        for j in range(C):
            yr[j] = xr[j]


copy_rows = numba.njit(parallel=True)(_copy_rows)


def numpy_softmax(x, out):
    """x - max, exp, sum, divide, into ``out`` (NumPy's SIMD exp)."""
    np.subtract(x, x.max(axis=1, keepdims=True), out=out)
    np.exp(out, out=out)
    out /= out.sum(axis=1, keepdims=True)


def run(quick: bool = False) -> list[dict]:
    """Time the candidates; return one dict per row of the table."""
    threads = numba.get_num_threads()
    R, C = (512, 1024) if quick else (4096, 4096)
    reps = 5 if quick else 21
    pause = 0.01 if quick else 0.05
    rng = np.random.default_rng(0)
    x = rng.standard_normal((R, C)).astype(np.float32)
    out = {k: np.empty_like(x) for k in ("nnkit", "numba", "numpy", "torch", "copy")}
    cands = {
        "nnkit softmax_forward": lambda: softmax_forward(x, out=out["nnkit"]),
        "numba softmax_rows": lambda: softmax_cpu.softmax_rows(x, out["numba"]),
        "numba prange copy": lambda: copy_rows(x, out["copy"]),
        "np.copyto": lambda: np.copyto(out["copy"], x),
        "numpy (max, exp, sum, divide)": lambda: numpy_softmax(x, out["numpy"]),
    }
    med = median_times(cands, repeats=reps, warmup=1, pause=pause)
    bound = min(med["numba prange copy"], med["np.copyto"])
    nbytes = 2 * x.nbytes
    rows = [
        {"name": k, "shape": (R, C), "median_ms": v * 1e3, "GB_s": nbytes / v / 1e9,
         "pct_of_bound": 100.0 * bound / v, "vs_nnkit": v / med["nnkit softmax_forward"]}
        for k, v in med.items()
    ]
    torch_times = _torch_in_worker(R, C, reps, pause, threads)
    if torch_times is not None:
        for name, v in torch_times.items():
            rows.append({"name": name, "shape": (R, C), "median_ms": v * 1e3,
                         "GB_s": nbytes / v / 1e9,
                         "pct_of_bound": 100.0 * torch_times["torch copy_ (its bound)"] / v,
                         "vs_nnkit": v / med["nnkit softmax_forward"]})
    # The naive twin on a small shape, ratio to nnkit on the same shape.
    xs = rng.standard_normal((64, 64) if quick else (256, 256)).astype(np.float32)
    small = median_times({"nnkit": lambda: softmax_forward(xs),
                          "twin": lambda: reference.softmax(xs)}, repeats=5, warmup=1, pause=0.05)
    rows.append({"name": "reference.softmax (naive twin)", "shape": xs.shape,
                 "median_ms": small["twin"] * 1e3, "GB_s": 2 * xs.nbytes / small["twin"] / 1e9,
                 "pct_of_bound": float("nan"), "vs_nnkit": small["twin"] / small["nnkit"]})
    return rows


def _torch_in_worker(R, C, reps, pause, threads):
    """torch.softmax and torch's copy, timed in a fresh process; None without torch."""
    if importlib.util.find_spec("torch") is None:
        return None
    out = subprocess.run([sys.executable, __file__, "--torch-worker", str(R), str(C), str(reps),
                          str(pause), str(threads)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _torch_worker(R, C, reps, pause, threads):
    import torch

    torch.set_num_threads(threads)
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((R, C)).astype(np.float32))
    out = torch.empty_like(x)
    times = median_times({"torch.softmax(out=)": lambda: torch.softmax(x, -1, out=out),
                          "torch copy_ (its bound)": lambda: out.copy_(x)},
                         repeats=reps, warmup=1, pause=pause)
    print(json.dumps(times))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    same_allocator()  # glibc malloc tuned alike in every process, each contender's worker
    if argv and argv[0] == "--torch-worker":
        R, C, reps = (int(v) for v in argv[1:4])
        _torch_worker(R, C, reps, float(argv[4]), int(argv[5]))
        return None
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, few repetitions")
    args = parser.parse_args(argv)
    print(environment())
    rows = run(args.quick)
    print(f"{'candidate':34s} {'shape':>12s} {'median ms':>10s} {'GB/s':>7s} "
          f"{'% bound':>8s} {'x nnkit':>8s}")
    for r in rows:
        shape = "x".join(str(s) for s in r["shape"])
        print(f"{r['name']:34s} {shape:>12s} {r['median_ms']:10.2f} {r['GB_s']:7.1f} "
              f"{r['pct_of_bound']:8.1f} {r['vs_nnkit']:8.2f}")
    return rows


if __name__ == "__main__":
    main()
