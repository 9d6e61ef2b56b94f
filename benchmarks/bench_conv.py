"""conv2d float32, 3x3, padding 1: forward, and forward+backward (dx, dweight, dbias), nnkit
(im2col + numpy SGEMM) vs torch CPU (oneDNN) with the same thread count, plus the machine's
SGEMM rate (numpy 2048^3) measured in the same run for the GFLOP/s comparison.

Target (issue 5): nnkit at least as fast as torch (torch/nnkit >= 1.0) on each shape.

Each contender runs in its own worker process and the workers alternate (nnkit, torch,
nnkit, ...): in one process torch's OpenMP pool and numba's/OpenBLAS's spinning threads slow
each other down by up to 10x (see bench_mlp.py). Every worker runs with glibc malloc tuned
alike (harness.same_allocator(); the environment line says so).

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python benchmarks/bench_conv.py \
        [--quick] [--threads N]
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))
from harness import block_times, environment, same_allocator, torch_available  # noqa: E402

SHAPES = [(32, 3, 32, 32, 16), (32, 16, 32, 32, 32), (8, 64, 56, 56, 64)]  # (N, C, H, W, K)
MODES = ("fwd", "fwd+bwd")


def flops(shape, mode):
    """2 N K H W C 9 per pass (stride 1, pad 1: Ho = H); fwd+bwd is three passes."""
    N, C, H, W, K = shape
    return 2.0 * N * K * H * W * C * 9 * (1 if mode == "fwd" else 3)


def _nnkit_calls(shape):
    import nnkit as nk
    from nnkit.functional import conv as FC

    N, C, H, W, K = shape
    rng = np.random.default_rng(0)
    x = nk.tensor(rng.standard_normal((N, C, H, W)).astype(np.float32), requires_grad=True)
    w = nk.tensor(rng.standard_normal((K, C, 3, 3)).astype(np.float32) * 0.1,
                  requires_grad=True)
    b = nk.tensor(np.zeros(K, np.float32), requires_grad=True)
    dy = rng.standard_normal((N, K, H, W)).astype(np.float32)

    def fwd():
        with nk.no_grad():
            FC.conv2d(x, w, b, padding=1)

    def fwd_bwd():
        x.grad = w.grad = b.grad = None
        FC.conv2d(x, w, b, padding=1).backward(dy)

    return {"fwd": fwd, "fwd+bwd": fwd_bwd}


def _torch_calls(shape):
    import torch

    N, C, H, W, K = shape
    x = torch.randn(N, C, H, W, requires_grad=True)
    w = (torch.randn(K, C, 3, 3) * 0.1).requires_grad_()
    b = torch.zeros(K, requires_grad=True)
    dy = torch.randn(N, K, H, W)

    def fwd():
        with torch.no_grad():
            torch.nn.functional.conv2d(x, w, b, padding=1)

    def fwd_bwd():
        x.grad = w.grad = b.grad = None
        torch.nn.functional.conv2d(x, w, b, padding=1).backward(dy)

    return {"fwd": fwd, "fwd+bwd": fwd_bwd}


def _matmul_calls(_shape):
    a = np.random.default_rng(0).standard_normal((2048, 2048)).astype(np.float32)
    out = np.empty_like(a)
    return {"sgemm": lambda: np.matmul(a, a, out=out)}


def _worker(impl: str, threads: int, blocks: int) -> None:
    """Per (shape, mode): ``blocks`` timed blocks; print {key: [seconds per call]} as JSON."""
    import numba

    numba.set_num_threads(threads)
    if impl == "torch":
        import torch

        torch.set_num_threads(threads)
    make = {"nnkit": _nnkit_calls, "torch": _torch_calls, "matmul": _matmul_calls}[impl]
    shapes = SHAPES if impl != "matmul" else [None]
    result = {}
    for shape in shapes:
        for mode, fn in make(shape).items():
            for _ in range(3):
                fn()
            per_block = max(1, int(0.05 / max(_once(fn), 1e-6)))
            result[f"{shape}|{mode}"] = block_times(fn, blocks, per_block, warmup=0,
                                                    pause=0.05)
    print(json.dumps(result))


def _once(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def run(quick: bool = False, threads: int | None = None) -> list[dict]:
    """Rows of the table; ``threads`` (default numba's count) for numba, OpenBLAS and torch."""
    import os

    import numba

    threads = threads or numba.get_num_threads()
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(threads), NUMBA_NUM_THREADS=str(threads))
    impls = ["matmul", "nnkit"] + (["torch"] if torch_available() else [])
    rounds, blocks = (1, 3) if quick else (3, 7)
    samples: dict = {}
    for _ in range(rounds):
        for impl in impls:
            out = subprocess.run([sys.executable, str(HERE), "--worker", impl, str(threads),
                                  str(blocks)], capture_output=True, text=True, check=True,
                                 env=env)
            for key, times in json.loads(out.stdout.strip().splitlines()[-1]).items():
                samples.setdefault((impl, key), []).extend(times)
            time.sleep(0.3)
    med = {k: float(np.median(v)) for k, v in samples.items()}
    sgemm = 2.0 * 2048**3 / med[("matmul", "None|sgemm")] / 1e9
    rows = []
    for shape in SHAPES:
        for mode in MODES:
            key = f"{shape}|{mode}"
            t_nk = med[("nnkit", key)]
            t_th = med.get(("torch", key))
            rows.append({
                "work": f"conv2d 3x3 p1 {mode} (N,C,H,W,K)={shape}",
                "nnkit_ms": f"{t_nk * 1e3:.2f}",
                "torch_ms": f"{t_th * 1e3:.2f}" if t_th else "n/a",
                "torch/nnkit": f"{t_th / t_nk:.2f}" if t_th else "n/a",
                "nnkit_GFLOPs": f"{flops(shape, mode) / t_nk / 1e9:.0f}",
                "torch_GFLOPs": f"{flops(shape, mode) / t_th / 1e9:.0f}" if t_th else "n/a",
                "sgemm_GFLOPs": f"{sgemm:.0f}",
                "threads": threads,
            })
    return rows


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    same_allocator()  # glibc malloc tuned alike in every process, each contender's worker
    if argv and argv[0] == "--worker":
        _worker(argv[1], int(argv[2]), int(argv[3]))
        return

    from nnkit.tour import format_table

    print(environment())
    threads = int(argv[argv.index("--threads") + 1]) if "--threads" in argv else None
    rows = run(quick="--quick" in argv, threads=threads)
    print(format_table(rows, list(rows[0])))


if __name__ == "__main__":
    main()
