"""Fused attention on an NVIDIA GPU: nnkit's Numba CUDA kernels vs torch's CUDA
F.scaled_dot_product_attention, float32, forward and forward+backward, causal and not.

Shapes (B, H, T, d): the issue's (8, 4, 256, 64) and (2, 8, 1024, 64), and one long sequence
(1, 1, 16384, 64). Times are medians of many runs between CUDA events (CuPy events for
nnkit, torch.cuda events for torch) after warm-up; inputs are preallocated, so nnkit's times
include its Python launch overhead (Numba marshals every array argument on each launch) and
torch's its autograd. TFLOP/s counts the usual flash-attention work: 4 B H T^2 d for the
forward (halved when causal) and 2.5 times that for the backward, the same figure for both.

    python benchmarks/bench_attention_gpu.py [--quick]

Needs numba-cuda, CuPy and torch with CUDA on a machine with a GPU; exits with a message
otherwise.
"""

from __future__ import annotations

import sys

import numpy as np

SHAPES = [(8, 4, 256, 64), (2, 8, 1024, 64), (1, 1, 16384, 64)]


def _require_gpu():
    """cupy, torch; or exit with a clear message when the GPU stack is missing."""
    try:
        import cupy
        from numba import cuda
    except ImportError as err:
        sys.exit(f"bench_attention_gpu: needs numba-cuda and CuPy ({err}); nothing measured.")
    if not cuda.is_available() or cupy.cuda.runtime.getDeviceCount() == 0:
        sys.exit("bench_attention_gpu: no CUDA GPU found; nothing measured.")
    try:
        import torch
    except ImportError:
        sys.exit("bench_attention_gpu: needs torch with CUDA for the comparison.")
    if not torch.cuda.is_available():
        sys.exit("bench_attention_gpu: torch has no CUDA here; nothing measured.")
    return cupy, torch


def _median_ms(fn, record, repeats, warmup=3):
    """Median milliseconds of ``fn()`` between a pair of events made by ``record()``."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start, stop = record()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start_elapsed(start, stop))
    return float(np.median(times))


def start_elapsed(start, stop):
    """Elapsed milliseconds between two recorded events (CuPy or torch)."""
    if hasattr(start, "elapsed_time"):  # torch.cuda.Event
        return start.elapsed_time(stop)
    import cupy

    return cupy.cuda.get_elapsed_time(start, stop)


def _nnkit_fns(cupy, shape, causal):
    from nnkit._ext import attention_cuda as C

    B, H, T, d = shape
    rng = np.random.default_rng(0)
    q, k, v, dout = (cupy.asarray(rng.standard_normal(shape, dtype=np.float32))
                     for _ in range(4))
    out, lse = cupy.empty_like(q), cupy.empty((B, H, T), np.float32)
    grads = [cupy.empty_like(q) for _ in range(3)]
    mask = cupy.broadcast_to(cupy.zeros((), np.float32), (B, H, T, T))  # not read
    scale = 1 / np.sqrt(d)

    def forward():
        C.attention_forward(q, k, v, mask, False, causal, scale, 0.0, 0, out, lse)

    def forward_backward():
        forward()
        C.attention_backward(q, k, v, mask, False, causal, scale, 0.0, 0, out, lse, dout,
                             *grads)

    return forward, forward_backward


def _torch_fns(torch, shape, causal):
    import torch.nn.functional as F

    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, dout = (torch.randn(shape, device="cuda", generator=gen) for _ in range(4))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]

    def forward():
        with torch.no_grad():
            F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    def forward_backward():
        out = F.scaled_dot_product_attention(*leaves, is_causal=causal)
        out.backward(dout)

    return forward, forward_backward


def run(quick=False):
    cupy, torch = _require_gpu()

    def cupy_events():
        return cupy.cuda.Event(), cupy.cuda.Event()

    def torch_events():
        return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    rows = []
    for shape in SHAPES:
        B, H, T, d = shape
        repeats = 5 if quick else (15 if T > 4096 else 50)
        for causal in (False, True):
            ours = dict(zip(("fwd", "fwd+bwd"), _nnkit_fns(cupy, shape, causal), strict=True))
            theirs = dict(zip(("fwd", "fwd+bwd"), _torch_fns(torch, shape, causal),
                              strict=True))
            for what in ("fwd", "fwd+bwd"):
                flops = 4 * B * H * T * T * d * (0.5 if causal else 1.0)
                flops *= 3.5 if what == "fwd+bwd" else 1.0
                t_ours = _median_ms(ours[what], cupy_events, repeats)
                t_torch = _median_ms(theirs[what], torch_events, repeats)
                rows.append({"shape (B,H,T,d)": str(shape), "causal": causal, "pass": what,
                             "nnkit ms": round(t_ours, 3), "torch ms": round(t_torch, 3),
                             "torch/nnkit": round(t_torch / t_ours, 2),
                             "nnkit TFLOP/s": round(flops / t_ours / 1e9, 2),
                             "torch TFLOP/s": round(flops / t_torch / 1e9, 2)})
                print(rows[-1], flush=True)
    return rows


def main(argv):
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from harness import same_allocator

    print(f"malloc (nnkit and torch, one process): {same_allocator()}")
    cupy, torch = _require_gpu()
    print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"CuPy {cupy.__version__}")
    rows = run(quick="--quick" in argv)
    keys = list(rows[0])
    widths = [max(len(k), *(len(str(r[k])) for r in rows)) for k in keys]
    print("  ".join(k.ljust(w) for k, w in zip(keys, widths, strict=True)))
    for r in rows:
        print("  ".join(str(r[k]).ljust(w) for k, w in zip(keys, widths, strict=True)))


if __name__ == "__main__":
    main(sys.argv[1:])
