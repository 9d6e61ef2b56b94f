"""Thread scaling of the CPU kernels, float32: nnkit vs torch at the same thread counts.

One shape per op: conv2d 3x3 padding 1 forward+backward, LSTM forward+backward (nn.LSTM,
loss = output.sum(), as bench_recurrent.py), scaled dot product attention forward+backward,
linear_scan forward (torch: the cumsum-of-log form of bench_scan.py) and row softmax
forward. Each (library, thread count) runs in a worker process of its own, the two
libraries alternating, with NUMBA/OMP/OPENBLAS/MKL_NUM_THREADS and numba's or torch's own
setting all at that count, and glibc malloc tuned alike (harness.same_allocator(): nnkit's
thresholds, loaded into the torch worker without numba). Prints per op a markdown table:
each one's median ms per call and its speedup over its own time at the fewest threads.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python benchmarks/bench_threads.py \
        [--threads 1 2 4 8 16] [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))
from harness import block_times, same_allocator, torch_available  # noqa: E402

OPS = {  # name: (label, full shape, --quick shape)
    "conv2d": ("conv2d 3x3 p1 fwd+bwd (N,C,H,W,K)", (32, 16, 32, 32, 32), (8, 16, 16, 16, 32)),
    "lstm": ("LSTM fwd+bwd (T,B,in,H)", (128, 32, 64, 128), (32, 16, 64, 128)),
    "attention": ("SDPA fwd+bwd (B,H,L,d)", (8, 8, 512, 64), (2, 4, 256, 64)),
    "linear_scan": ("linear_scan fwd (B,T,D)", (16, 4096, 256), (4, 1024, 256)),
    "softmax": ("row softmax fwd (R,C)", (4096, 4096), (1024, 1024)),
}
NOTES = {
    "lstm": "nnkit.nn.LSTM and torch.nn.LSTM, one layer, loss = output.sum().",
    "linear_scan": "torch has no linear scan: its time is bench_scan.py's cumsum-of-log form "
                   "h = exp(A*) cumsum(b exp(-A*)), A* = cumsum log a (timing only: exp(-A*) "
                   "overflows float32 at this T).",
}
THREAD_VARS = ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
               "MKL_NUM_THREADS")
# (rounds of the two workers per thread count, timed blocks per op, seconds per block):
# full size, threads 1..16: 4 minutes on a 16-core H100 host.
FULL_PLAN, QUICK_PLAN = (2, 4, 0.1), (1, 3, 0.02)


def _f32(rng, shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def _nnkit_conv2d(shape):
    from nnkit.kernels.conv import conv2d_backward, conv2d_forward

    N, C, H, W, K = shape
    rng = np.random.default_rng(0)
    x, w, b = _f32(rng, (N, C, H, W)), _f32(rng, (K, C, 3, 3), 0.1), np.zeros(K, np.float32)
    dy = _f32(rng, (N, K, H, W))

    def step():
        _, cache = conv2d_forward(x, w, b, padding=1)
        conv2d_backward(dy, cache)

    return step


def _nnkit_lstm(shape):
    import nnkit as nk
    from nnkit.nn.recurrent import LSTM

    T, B, D, H = shape
    nk.manual_seed(0)
    model = LSTM(D, H)
    x = nk.tensor(_f32(np.random.default_rng(0), (T, B, D)), requires_grad=True)

    def step():
        model(x)[0].sum().backward()

    return step


def _nnkit_attention(shape):
    from nnkit.kernels.attention import attention_backward, attention_forward

    rng = np.random.default_rng(0)
    q, k, v, dout = (_f32(rng, shape) for _ in range(4))

    def step():
        _, cache = attention_forward(q, k, v)
        attention_backward(dout, cache)

    return step


def _scan_problem(shape):
    rng = np.random.default_rng(0)
    return rng.uniform(0.5, 0.99, shape).astype(np.float32), _f32(rng, shape)


def _nnkit_linear_scan(shape):
    from nnkit.kernels.scan import linear_scan_forward

    a, b = _scan_problem(shape)
    h0, out = np.zeros((shape[0], shape[2]), np.float32), np.empty_like(a)
    return lambda: linear_scan_forward(a, b, h0, out=out)


def _nnkit_softmax(shape):
    from nnkit.kernels.softmax import softmax_forward

    x = _f32(np.random.default_rng(0), shape)
    out = np.empty_like(x)
    return lambda: softmax_forward(x, out=out)


def _torch_conv2d(torch, shape):
    N, C, H, W, K = shape
    rng = np.random.default_rng(0)
    x, w = torch.from_numpy(_f32(rng, (N, C, H, W))), torch.from_numpy(_f32(rng, (K, C, 3, 3), .1))
    x, w, b = x.requires_grad_(), w.requires_grad_(), torch.zeros(K, requires_grad=True)
    dy = torch.from_numpy(_f32(rng, (N, K, H, W)))

    def step():
        y = torch.nn.functional.conv2d(x, w, b, padding=1)
        torch.autograd.grad(y, (x, w, b), dy)

    return step


def _torch_lstm(torch, shape):
    T, B, D, H = shape
    torch.manual_seed(0)
    model = torch.nn.LSTM(D, H)
    x = torch.from_numpy(_f32(np.random.default_rng(0), (T, B, D))).requires_grad_()

    def step():
        model(x)[0].sum().backward()

    return step


def _torch_attention(torch, shape):
    rng = np.random.default_rng(0)
    q, k, v, dout = (torch.from_numpy(_f32(rng, shape)) for _ in range(4))
    q, k, v = q.requires_grad_(), k.requires_grad_(), v.requires_grad_()

    def step():
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        torch.autograd.grad(y, (q, k, v), dout)

    return step


def _torch_linear_scan(torch, shape):
    """h = exp(A*) cumsum(b exp(-A*)), A* = cumsum log a (h0 = 0), as bench_scan.py: timing
    only (exp(-A*) overflows float32 at this T)."""
    a, b = (torch.from_numpy(t) for t in _scan_problem(shape))

    def step():
        a_star = torch.cumsum(torch.log(a), dim=1)
        return torch.exp(a_star) * torch.cumsum(b * torch.exp(-a_star), dim=1)

    return step


def _torch_softmax(torch, shape):
    x = torch.from_numpy(_f32(np.random.default_rng(0), shape))
    out = torch.empty_like(x)
    return lambda: torch.softmax(x, -1, out=out)


NNKIT = {"conv2d": _nnkit_conv2d, "lstm": _nnkit_lstm, "attention": _nnkit_attention,
         "linear_scan": _nnkit_linear_scan, "softmax": _nnkit_softmax}
TORCH = {"conv2d": _torch_conv2d, "lstm": _torch_lstm, "attention": _torch_attention,
         "linear_scan": _torch_linear_scan, "softmax": _torch_softmax}


def _steps(impl, threads, quick):
    """{op: step} of one library at ``threads``, and the library's version and malloc status."""
    index = 2 if quick else 1
    status = same_allocator()  # both libraries alike, torch's worker without numba
    if impl == "torch":
        import torch

        torch.set_num_threads(threads)
        make = {op: partial(TORCH[op], torch) for op in OPS}
        version = torch.__version__
    else:
        import numba

        import nnkit

        numba.set_num_threads(threads)
        make = NNKIT
        version = nnkit.__version__
    return {op: make[op](spec[index]) for op, spec in OPS.items()}, version, status


def _once(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _worker(impl, threads, quick):
    """Print {"times": {op: [seconds per call of each block]}, "version", "malloc"} as JSON."""
    _, blocks, block_s = QUICK_PLAN if quick else FULL_PLAN
    steps, version, status = _steps(impl, threads, quick)
    times = {}
    for op, step in steps.items():
        step()  # numba loads its cache (or compiles), torch its kernels
        per_block = max(1, round(block_s / max(_once(step), 1e-6)))
        times[op] = block_times(step, blocks, per_block, warmup=1, pause=0.05)
    print(json.dumps({"times": times, "version": version, "malloc": status}))


def _run_worker(impl, threads, quick):
    env = dict(os.environ, **{var: str(threads) for var in THREAD_VARS})
    cmd = [sys.executable, str(HERE), "--worker", impl, str(threads)] + ["--quick"] * quick
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(thread_counts, quick):
    """{(impl, threads, op): median seconds} and {impl: (version, malloc status)}; the
    workers alternate (nnkit, torch, torch, nnkit, ...) at each thread count."""
    rounds = (QUICK_PLAN if quick else FULL_PLAN)[0]
    impls = ["nnkit"] + (["torch"] if torch_available() else [])
    samples, info = {}, {}
    total, done, start = len(thread_counts) * rounds * len(impls), 0, time.perf_counter()
    for threads in thread_counts:
        for r in range(rounds):
            for impl in impls if r % 2 == 0 else impls[::-1]:
                out = _run_worker(impl, threads, quick)
                info[impl] = (out["version"], out["malloc"])
                for op, times in out["times"].items():
                    samples.setdefault((impl, threads, op), []).extend(times)
                done += 1
                print(f"[{done}/{total}] {impl} {threads} threads, round {r + 1}/{rounds} "
                      f"({time.perf_counter() - start:.0f} s)", file=sys.stderr, flush=True)
                time.sleep(0.3)
    return {k: float(np.median(v)) for k, v in samples.items()}, info


def rows_of(med, thread_counts, quick):
    """One dict per (op, thread count); speedups against the fewest threads measured."""
    base = thread_counts[0]
    rows = []
    for op, (label, *shapes) in OPS.items():
        for threads in thread_counts:
            nk, th = med[("nnkit", threads, op)], med.get(("torch", threads, op))
            nk1, th1 = med[("nnkit", base, op)], med.get(("torch", base, op))
            rows.append({"op": op, "work": label, "shape": list(shapes[1 if quick else 0]),
                         "threads": threads, "nnkit_ms": nk * 1e3,
                         "torch_ms": None if th is None else th * 1e3,
                         "torch/nnkit": None if th is None else th / nk,
                         "nnkit_speedup": nk1 / nk,
                         "torch_speedup": None if th is None else th1 / th})
    return rows


def _cell(value, digits=2):
    return "n/a" if value is None else f"{value:.{digits}f}"


def markdown(rows, base):
    """A markdown table per op."""
    head = ["threads", "nnkit ms", "torch ms", "torch/nnkit", f"nnkit speedup vs {base}",
            f"torch speedup vs {base}"]
    keys = ["nnkit_ms", "torch_ms", "torch/nnkit", "nnkit_speedup", "torch_speedup"]
    parts = []
    for op in dict.fromkeys(r["op"] for r in rows):
        mine = [r for r in rows if r["op"] == op]
        lines = [f"### {mine[0]['work']} = {tuple(mine[0]['shape'])}", ""]
        lines += [NOTES[op], ""] if op in NOTES else []
        lines += ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
        lines += ["| " + " | ".join([str(r["threads"])] + [_cell(r[k]) for k in keys]) + " |"
                  for r in mine]
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def _thread_counts(asked):
    cpus = os.cpu_count() or 1
    counts = sorted({t for t in asked if 1 <= t <= cpus})
    if len(counts) < len(set(asked)):
        print(f"thread counts capped at os.cpu_count() = {cpus}", file=sys.stderr)
    return counts or [1]


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--worker":
        _worker(argv[1], int(argv[2]), "--quick" in argv)
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--quick", action="store_true", help="small shapes, few repeats")
    parser.add_argument("--json", metavar="PATH", help="write the rows as JSON")
    args = parser.parse_args(argv)
    counts = _thread_counts(args.threads)
    med, info = measure(counts, args.quick)
    env = {"cpus": os.cpu_count(), "threads": counts, "quick": args.quick,
           "OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE", "unset"),
           **{f"{impl} version, malloc": list(v) for impl, v in info.items()}}
    print(env)
    rows = rows_of(med, counts, args.quick)
    print(markdown(rows, counts[0]))
    if args.json:
        Path(args.json).write_text(json.dumps({"environment": env, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
