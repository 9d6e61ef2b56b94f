"""Where an LSTM layer's CPU time goes: its kernels timed one by one in one process.

Pieces (float32, one layer, one direction, loss = output.sum() for the module rows):
the forward keeping the cache, the BPTT kernel, the weight gradients (the transposed
inputs [x; 1; h_prev]^T, then the packed product), the module's forward without a graph
and its forward + backward, and the packed step GEMM alone at the time loops' shapes
(GFLOP/s on one thread). Rows alternate within each round; each sample is the mean of 3
calls.

    python benchmarks/lstm_parts.py [--shape T,B,D,H] [--threads N] [--rounds R] [--cpu-time]

``--cpu-time`` times with ``time.process_time`` (CPU time of the process, so the time a
thread spends descheduled is not counted): on a shared machine that is steadier than wall
time, with one thread; with more threads it adds up the threads' time, spinning included.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import same_allocator  # noqa: E402


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="128,32,64,128", help="T,B,D,H")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--cpu-time", action="store_true")
    args = parser.parse_args(argv)
    same_allocator()

    import numba

    import nnkit as nk
    from nnkit._ext import recurrent_cpu as kern
    from nnkit._ext.gemm_cpu import pack_panels, step_gemm
    from nnkit.kernels import recurrent as K
    from nnkit.nn import recurrent as R

    numba.set_num_threads(args.threads)
    clock = time.process_time if args.cpu_time else time.perf_counter
    T, B, D, H = (int(s) for s in args.shape.split(","))
    rng = np.random.default_rng(0)
    f32 = np.float32
    bound = 1 / np.sqrt(H)
    x = rng.standard_normal((T, B, D)).astype(f32)
    w_ih, w_hh = (rng.uniform(-bound, bound, (4 * H, n)).astype(f32) for n in (D, H))
    b_ih, b_hh = (rng.uniform(-bound, bound, 4 * H).astype(f32) for _ in range(2))
    dy = np.ones((T, B, H), f32)
    _, cache = K.lstm_forward(x, None, None, w_ih, w_hh, b_ih, b_hh)
    zeros = np.zeros((B, H), f32)

    def bptt():
        dx, (gp,), (work,) = kern._grad_buffers(cache, 1)
        kern.lstm_backward_cpu(dy, zeros, zeros, cache.c0, cache.saved["gates"],
                               cache.saved["c"], w_hh, w_ih, False, dx, gp, work,
                               np.empty_like(zeros), np.empty_like(zeros),
                               np.empty((0, 0, 0), f32))
        return dx, gp

    dx, gp = bptt()

    def transposed_inputs():
        at = np.empty((D + 1 + H, T * B), f32)
        kern.transposed_inputs_cpu(x.reshape(T * B, D), cache.saved["y"], cache.h0, False, at,
                                   D + 1)

    nk.manual_seed(0)
    model = R.LSTM(D, H)
    xt = nk.tensor(x, requires_grad=True)

    def module_forward():
        with nk.no_grad():
            model(xt)

    pieces = {
        "forward keeping the cache": lambda: K.lstm_forward(x, None, None, w_ih, w_hh, b_ih,
                                                            b_hh),
        "BPTT kernel": bptt,
        "weight gradients": lambda: kern._weight_grads(cache, gp, gp),
        "  of which transposed inputs": transposed_inputs,
        "backward (lstm_backward)": lambda: K.lstm_backward((dy, None, None), cache),
        "module forward, no graph": module_forward,
        "module forward + backward": lambda: model(xt)[0].sum().backward(),
    }
    for fn in pieces.values():
        fn()
        fn()
    times = {name: [] for name in pieces}
    for _ in range(args.rounds):
        for name, fn in pieces.items():
            t = clock()
            for _ in range(3):
                fn()
            times[name].append((clock() - t) / 3)
    how = "CPU time" if args.cpu_time else "wall time"
    print(f"LSTM (T, B, D, H) = {(T, B, D, H)}, {args.threads} threads, {how}, "
          f"{args.rounds} rounds of 3 calls (ms):")
    for name, v in times.items():
        print(f"  {name:30s} min {min(v) * 1e3:8.3f}  p25 {np.percentile(v, 25) * 1e3:8.3f}"
              f"  median {np.median(v) * 1e3:8.3f}")

    @numba.njit
    def repeat(a, bp, out, reps):
        for _ in range(reps):
            step_gemm(a, bp, out)

    rows = max(1, B // args.threads)
    print("packed step GEMM alone, one thread, min of 7 (GFLOP/s):")
    for M, Kd, N in ((rows, D + H, 4 * H), (rows, 4 * H, H), (rows, 4 * H, D)):
        a = rng.standard_normal((M, Kd)).astype(f32)
        bp = pack_panels(rng.standard_normal((Kd, N)).astype(f32))
        out = np.empty((M, N), f32)
        reps = max(10, int(2e8 / (2 * M * Kd * N)))
        repeat(a, bp, out, 1)
        best = min(_timed(repeat, a, bp, out, reps) for _ in range(7)) / reps
        print(f"  ({M}, {Kd}) x ({Kd}, {N}): {2 * M * Kd * N / best / 1e9:6.1f}")


def _timed(fn, *args) -> float:
    t = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t


if __name__ == "__main__":
    main()
