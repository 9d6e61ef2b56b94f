"""GELU, both forms (exact and tanh), forward, backward and both: nnkit's fused kernels
(``F.gelu`` on a Tensor, the autograd graph included) against torch's
``torch.nn.functional.gelu`` at ViT-B/16's MLP activation, (8 x 197, 3072) float32.

Each contender runs in its own process with the same thread count (numba's for nnkit,
``torch.set_num_threads`` for torch) and glibc malloc tuned alike
(harness.same_allocator()); each reports the median of blocks of calls, the loss being
``(y * w).sum()`` with a fixed w so that both backward passes get the same upstream
gradient ("fwd+bwd": the mul, the sum and their backwards are each library's generic
ops); "bwd" alone is the backward kernel (``torch.ops.aten.gelu_backward`` against
``nnkit.kernels.activation.gelu_backward``), upstream gradient w. Target: each form >=
1.0x torch's same form, forward and backward.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_gelu.py

``--quick``: a smaller matrix, fewer samples.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))
from harness import report, same_allocator, torch_available  # noqa: E402

FORMS = ("none", "tanh")


def _median_ms(call, samples: int) -> float:
    call()
    times = []
    for _ in range(samples):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def _worker(impl: str, shape, samples: int, threads: int) -> None:
    """Print {"form pass": ms} for ``impl`` (nnkit or torch)."""
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(shape) * 2).astype(np.float32)
    w = rng.standard_normal(shape).astype(np.float32)
    times = {}
    if impl == "torch":
        import torch

        torch.set_num_threads(threads)
        xt, wt = torch.from_numpy(x).requires_grad_(), torch.from_numpy(w)
        for form in FORMS:
            def forward(form=form):
                with torch.no_grad():
                    torch.nn.functional.gelu(xt, approximate=form)

            def both(form=form):
                xt.grad = None
                (torch.nn.functional.gelu(xt, approximate=form) * wt).sum().backward()

            def backward(form=form):
                torch.ops.aten.gelu_backward(wt, xt.detach(), approximate=form)

            times[f"{form} fwd"] = _median_ms(forward, samples)
            times[f"{form} bwd"] = _median_ms(backward, samples)
            times[f"{form} fwd+bwd"] = _median_ms(both, samples)
    else:
        import numba

        import nnkit as nk
        import nnkit.functional as F
        from nnkit.kernels.activation import gelu_backward, gelu_forward

        numba.set_num_threads(threads)
        xn, wn = nk.tensor(x, requires_grad=True), nk.tensor(w)
        for form in FORMS:
            def forward(form=form):
                with nk.no_grad():
                    F.gelu(xn, approximate=form)

            def both(form=form):
                xn.grad = None
                (F.gelu(xn, approximate=form) * wn).sum().backward()

            cache = gelu_forward(x, form)[1]

            def backward(cache=cache):
                gelu_backward(w, cache)

            times[f"{form} fwd"] = _median_ms(forward, samples)
            times[f"{form} bwd"] = _median_ms(backward, samples)
            times[f"{form} fwd+bwd"] = _median_ms(both, samples)
    print(json.dumps(times))


def run(quick: bool = False) -> list[dict]:
    import numba

    threads = numba.get_num_threads()
    shape, samples = ((197, 3072), 11) if quick else ((8 * 197, 3072), 21)
    args = [",".join(map(str, shape)), str(samples), str(threads)]
    results = {}
    for impl in ("nnkit", "torch") if torch_available() else ("nnkit",):
        out = subprocess.run([sys.executable, str(HERE), "--worker", impl, *args],
                             capture_output=True, text=True, check=True, env=dict(os.environ))
        results[impl] = json.loads(out.stdout.strip().splitlines()[-1])
    rows = []
    for key, ms in results["nnkit"].items():
        row = {"work": f"gelu approximate={key} {shape} f32", "nnkit_ms": round(ms, 2)}
        if "torch" in results:
            row["torch_ms"] = round(results["torch"][key], 2)
            row["torch/nnkit"] = round(results["torch"][key] / ms, 2)
        row["threads"] = threads
        rows.append(row)
    return rows


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    same_allocator()  # glibc malloc tuned alike in every process, each contender's worker
    if argv and argv[0] == "--worker":
        shape = tuple(int(s) for s in argv[2].split(","))
        _worker(argv[1], shape, int(argv[3]), int(argv[4]))
        return
    report(run, argv)


if __name__ == "__main__":
    main()
