"""One training step (forward, backward, Adam) of an MLP 64-256-256-10 on batches of 64:
nnkit vs the same model in PyTorch eager on the CPU with the same thread count.

Target (foundation issue): nnkit at least as fast as PyTorch (ratio torch/nnkit >= 1).

Each contender runs in its own worker process, and the workers alternate (nnkit, torch,
nnkit, torch, ...) within this one run: in one process, torch's OpenMP pool, numba's and
OpenBLAS's spinning workers slow each other down by up to 10x, which would measure the
mix rather than either library. Every worker runs with glibc malloc tuned alike
(harness.same_allocator(); the environment line says so).

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_mlp.py
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
from harness import block_times, nnkit_mlp, report, same_allocator, torch_available  # noqa: E402

SIZES = (64, 256, 256, 10)
BATCH = 64


def _nnkit_step(threads: int):
    import numba

    import nnkit as nk
    import nnkit.functional as F

    numba.set_num_threads(threads)
    model = nnkit_mlp(SIZES)
    opt = nk.optim.Adam(model.parameters(), lr=1e-3)
    rng = np.random.default_rng(0)
    X = rng.standard_normal((BATCH, SIZES[0])).astype(np.float32)
    y = rng.integers(0, SIZES[-1], BATCH)

    def step():
        loss = F.cross_entropy(model(X), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    return step


def _torch_step(threads: int):
    import torch

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    layers = []
    for i, (a, b) in enumerate(zip(SIZES[:-1], SIZES[1:], strict=True)):
        layers.append(torch.nn.Linear(a, b))
        if i < len(SIZES) - 2:
            layers.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*layers)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    X = torch.randn(BATCH, SIZES[0])
    y = torch.randint(0, SIZES[-1], (BATCH,))

    def step():
        loss = torch.nn.functional.cross_entropy(model(X), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    return step


def _worker(impl: str, threads: int, blocks: int, block: int) -> None:
    """Time ``blocks`` blocks of ``block`` steps; print the per-step seconds as JSON."""
    step = (_nnkit_step if impl == "nnkit" else _torch_step)(threads)
    print(json.dumps(block_times(step, blocks, block, warmup=20)))


def run(quick: bool = False) -> list[dict]:
    import numba

    threads = numba.get_num_threads()
    impls = ["nnkit"] + (["torch"] if torch_available() else [])
    rounds, blocks, block = (1, 3, 20) if quick else (4, 10, 50)
    samples = {impl: [] for impl in impls}
    for _ in range(rounds):
        for impl in impls:
            out = subprocess.run(
                [sys.executable, str(HERE), "--worker", impl, str(threads), str(blocks),
                 str(block)], capture_output=True, text=True, check=True)
            samples[impl] += json.loads(out.stdout.strip().splitlines()[-1])
            time.sleep(0.3)
    med = {impl: float(np.median(s)) for impl, s in samples.items()}
    return [{"work": "MLP 64-256-256-10 step (B=64, Adam)", "impl": impl,
             "median_us": f"{t * 1e6:.1f}",
             "torch/impl": f"{med['torch'] / t:.2f}" if "torch" in med else "n/a",
             "threads": threads} for impl, t in med.items()]


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    same_allocator()  # glibc malloc tuned alike in every process, each contender's worker
    if argv and argv[0] == "--worker":
        _worker(argv[1], int(argv[2]), int(argv[3]), int(argv[4]))
        return

    report(run, argv)


if __name__ == "__main__":
    main()
