"""Fused scaled-dot-product attention: nnkit vs torch's CPU SDPA, and the memory at T = 16384.

Run: ``env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_attention.py``
(``--quick`` for small sizes). float32, (B, H, T, d) = (8, 4, 256, 64) and (2, 8, 1024, 64),
causal and not; forward alone and forward + backward (the upstream gradient preallocated).
nnkit is timed through ``nnkit.kernels.attention`` (the validated boundary the autograd op
calls); torch runs ``torch.nn.functional.scaled_dot_product_attention`` in a worker process
of its own with numba's thread count (torch and numba in one process slow each other's
OpenMP pools). The torch process serves timing requests, so the two alternate call by call
(nnkit, pause, torch, pause, ...: other jobs on a shared machine load both alike) and the
medians of 15 calls each are compared. ``torch / nnkit`` > 1 means nnkit is faster.
Both processes run with glibc malloc tuned alike (harness.same_allocator()).

Memory: forward + backward at T = 16384, d = 64, B = H = 1, in a fresh worker process:
tracemalloc's peak (every NumPy allocation, including the outputs and gradients) and the
growth of the process's peak RSS over the run (VmHWM after resetting it through
/proc/self/clear_refs; it also sees Numba's and BLAS's own scratch allocations, which
tracemalloc does not). The (T, T) score matrix alone would be 1 GiB in float32.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import numba
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import report, same_allocator  # noqa: E402

SHAPES = [(8, 4, 256, 64), (2, 8, 1024, 64)]
QUICK_SHAPES = [(2, 2, 128, 32)]


def _problem(shape, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(np.float32) for _ in range(4)]  # q, k, v, dout


def _nnkit_calls(shape, causal):
    from nnkit.kernels.attention import attention_backward, attention_forward

    q, k, v, dout = _problem(shape)

    def forward():
        return attention_forward(q, k, v, is_causal=causal)

    def forward_backward():
        _, cache = attention_forward(q, k, v, is_causal=causal)
        attention_backward(dout, cache)

    return {"forward": forward, "forward+backward": forward_backward}


def _torch_calls(torch, shape, causal):
    F = torch.nn.functional
    q, k, v, dout = (torch.from_numpy(a) for a in _problem(shape))
    qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))

    def forward():
        with torch.no_grad():
            F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    def forward_backward():
        qg.grad = kg.grad = vg.grad = None
        F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal).backward(dout)

    return {"forward": forward, "forward+backward": forward_backward}


def _timed(fn, block):
    start = time.perf_counter()
    for _ in range(block):
        fn()
    return (time.perf_counter() - start) / block


def _torch_server(threads):
    """The torch side: answers one JSON command a line on stdin ("setup", "time")."""
    import torch

    torch.set_num_threads(threads)
    calls = {}
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "setup":
            calls = _torch_calls(torch, tuple(cmd["shape"]), cmd["causal"])
            reply = {"ok": True}
        else:
            reply = {"seconds": _timed(calls[cmd["what"]], cmd["block"])}
        print(json.dumps(reply), flush=True)


class _TorchWorker:
    """torch in a process of its own, timed on request, so that its runs interleave with
    nnkit's (A, B, A, B, ...) even though the two never share a process."""

    def __init__(self, threads):
        self.proc = subprocess.Popen([sys.executable, __file__, "--torch-server", str(threads)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def ask(self, **cmd):
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self):
        self.proc.stdin.close()
        self.proc.wait()


def _interleaved(shape, causal, reps, pause, worker):
    """Medians (seconds) of nnkit's and torch's calls, alternating block by block."""
    ours = _nnkit_calls(shape, causal)
    if worker is not None:
        worker.ask(op="setup", shape=list(shape), causal=causal)
    samples = {(lib, what): [] for lib in ("nnkit", "torch") for what in ours}
    for rep in range(reps + 2):  # two warm-up rounds, not kept
        for what, fn in ours.items():
            time.sleep(pause)
            t = _timed(fn, 1)
            if rep >= 2:
                samples["nnkit", what].append(t)
            if worker is not None:
                time.sleep(pause)
                t = worker.ask(op="time", what=what, block=1)["seconds"]
                if rep >= 2:
                    samples["torch", what].append(t)
    return {key: float(np.median(v)) for key, v in samples.items() if v}


def _rss_kib(field):
    """VmRSS or VmHWM (peak) of this process in KiB, from /proc (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def _memory_worker(T, d):
    """Forward + backward at (1, 1, T, d): tracemalloc peak and peak-RSS growth (bytes)."""
    import tracemalloc

    from nnkit.kernels.attention import attention_backward, attention_forward

    q, k, v, dout = _problem((1, 1, 1024, d))  # load the parallel builds first
    _, cache = attention_forward(q, k, v)
    attention_backward(dout, cache)
    q, k, v, dout = _problem((1, 1, T, d))
    del cache
    Path("/proc/self/clear_refs").write_text("5")  # reset the peak RSS (VmHWM) to VmRSS
    rss_before = _rss_kib("VmRSS")
    tracemalloc.start()
    start = time.perf_counter()
    out, cache = attention_forward(q, k, v, is_causal=False)
    attention_backward(dout, cache)
    seconds = time.perf_counter() - start
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    rss_growth = (_rss_kib("VmHWM") - rss_before) * 1024
    print(json.dumps({"tracemalloc_peak": peak, "rss_growth": rss_growth, "seconds": seconds}))


def _memory(T, d):
    args = [sys.executable, __file__, "--memory-worker", str(T), str(d)]
    out = subprocess.run(args, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run(quick: bool = False) -> list[dict]:
    """Time nnkit and torch on every shape; measure the long-sequence memory."""
    threads = numba.get_num_threads()
    reps, pause = (3, 0.02) if quick else (15, 0.1)
    worker = _TorchWorker(threads) if importlib.util.find_spec("torch") else None
    rows = []
    try:
        for shape in QUICK_SHAPES if quick else SHAPES:
            for causal in (False, True):
                med = _interleaved(shape, causal, reps, pause, worker)
                for what in ("forward", "forward+backward"):
                    t = med["nnkit", what]
                    row = {"case": f"{what} {'causal' if causal else 'full'}",
                           "B,H,T,d": ",".join(map(str, shape)), "nnkit_ms": t * 1e3}
                    if ("torch", what) in med:
                        row["torch_ms"] = med["torch", what] * 1e3
                        row["torch / nnkit"] = med["torch", what] / t
                    rows.append(row)
    finally:
        if worker is not None:
            worker.close()
    T, d = (2048, 64) if quick else (16384, 64)
    mem = _memory(T, d)
    O_Td = T * d * 4
    rows.append({"case": "memory fwd+bwd full", "B,H,T,d": f"1,1,{T},{d}",
                 "nnkit_ms": mem["seconds"] * 1e3,
                 "tracemalloc_peak_MiB": mem["tracemalloc_peak"] / 2**20,
                 "peak_in_T*d*4B": mem["tracemalloc_peak"] / O_Td,
                 "rss_growth_MiB": mem["rss_growth"] / 2**20,
                 "T^2*4B_MiB": T * T * 4 / 2**20})
    return rows


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    same_allocator()  # glibc malloc tuned alike in every process, each contender's worker
    if argv and argv[0] == "--torch-server":
        _torch_server(int(argv[1]))
        return None
    if argv and argv[0] == "--memory-worker":
        _memory_worker(int(argv[1]), int(argv[2]))
        return None
    return report(run, argv)


if __name__ == "__main__":
    main()
