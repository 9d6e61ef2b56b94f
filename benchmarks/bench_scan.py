"""linear_scan forward and backward on (16, 4096, 256), float32 and complex64: time against the
memory-bandwidth bound measured in the same run, a NumPy loop over T, and torch with the
cumsum-of-log trick; and the single long sequence (1, 10^7, 1), float32 and complex64, by
both CPU strategies.

Targets: >= 85% of the bandwidth bound; >= 20x the NumPy loop.

The bound: the bytes of a, b, h read/written once (forward: 3 arrays; backward: dh, a, h read
and da, db written, 5 arrays) at the bandwidth of a Numba prange copy timed in the same run.
torch runs in its own worker process (its thread pool and Numba's slow each other down in one
process; see bench_mlp.py). Both processes run with glibc malloc tuned alike
(harness.same_allocator()).

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_scan.py [--quick]
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numba
import numpy as np

HERE = Path(__file__).resolve()
SHAPE = (16, 4096, 256)


def _problem(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.uniform(0.5, 0.99, shape)
    if np.dtype(dtype).kind == "c":
        a = a * np.exp(1j * rng.uniform(0, 2 * np.pi, shape))
    return a.astype(dtype), rng.standard_normal(shape).astype(dtype)


def _numpy_loop(a, b, out):
    h = np.zeros_like(a[:, 0])
    for t in range(a.shape[1]):
        h = a[:, t] * h + b[:, t]
        out[:, t] = h


def _median(fn, repeats):
    fn()
    times = []
    for _ in range(repeats):
        time.sleep(0.05)
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def _torch_worker(dtype_name: str, repeats: int) -> None:
    """Print the median seconds of torch's h = exp(A*) cumsum(b exp(-A*)), A* = cumsum log a."""
    import torch

    torch.set_num_threads(numba.get_num_threads())
    a, b = _problem(SHAPE, dtype_name)
    a, b = torch.from_numpy(a), torch.from_numpy(b)

    def fn():
        a_star = torch.cumsum(torch.log(a), dim=1)
        return torch.exp(a_star) * torch.cumsum(b * torch.exp(-a_star), dim=1)

    print(json.dumps(_median(fn, repeats)))


def _torch_time(dtype_name, repeats):
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return None
    out = subprocess.run([sys.executable, str(HERE), "--torch", dtype_name, str(repeats)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _rows_for(dtype, quick):
    from nnkit._ext import scan_cpu
    from nnkit.kernels import scan as K

    repeats = 5 if quick else 15
    a, b = _problem(SHAPE, dtype)
    h, dh = np.empty_like(a), np.ones_like(a)
    grads = (np.empty_like(a), np.empty_like(a), np.empty_like(a[:, 0]))
    nbytes = a.nbytes
    copy = _median(lambda: scan_cpu.copy(a, h), repeats)
    fwd = _median(lambda: K.linear_scan_forward(a, b, out=h), repeats)
    _, cache = K.linear_scan_forward(a, b, out=h)
    bwd = _median(lambda: K.linear_scan_backward(dh, cache, out=grads), repeats)
    loop = _median(lambda: _numpy_loop(a, b, np.empty_like(a)), 1 if quick else 3)
    torch_t = _torch_time(np.dtype(dtype).name, repeats)
    bandwidth = 2 * nbytes / copy
    name = np.dtype(dtype).name
    return [
        {"work": f"fwd {SHAPE} {name}", "ms": f"{fwd * 1e3:.2f}",
         "bound_ms": f"{3 * nbytes / bandwidth * 1e3:.2f}",
         "%bound": f"{100 * 3 * nbytes / bandwidth / fwd:.0f}",
         "numpy_loop/nnkit": f"{loop / fwd:.1f}",
         "torch_cumsum_log/nnkit": "n/a" if torch_t is None else f"{torch_t / fwd:.1f}",
         "GB/s_copy": f"{bandwidth / 1e9:.1f}"},
        {"work": f"bwd {SHAPE} {name}", "ms": f"{bwd * 1e3:.2f}",
         "bound_ms": f"{5 * nbytes / bandwidth * 1e3:.2f}",
         "%bound": f"{100 * 5 * nbytes / bandwidth / bwd:.0f}",
         "numpy_loop/nnkit": "", "torch_cumsum_log/nnkit": "", "GB/s_copy": ""},
    ]


def _one_sequence(dtype, T, n_chunks):
    from nnkit._ext import scan_cpu

    a, b = _problem((1, T, 1), dtype)
    h0, out = np.zeros((1, 1), dtype), np.empty_like(a)
    rows = _median(lambda: scan_cpu.scan_rows(a, b, h0, out, False, 1), 5)
    chunks = _median(lambda: scan_cpu.scan_chunked(a, b, h0, out, False, n_chunks), 5)
    return {"work": f"fwd (1, {T}, 1) {np.dtype(dtype).name}", "ms": f"rows {rows * 1e3:.1f}",
            "bound_ms": f"chunks {chunks * 1e3:.1f}", "%bound": "",
            "numpy_loop/nnkit": f"rows/chunks {rows / chunks:.2f}",
            "torch_cumsum_log/nnkit": "", "GB/s_copy": ""}


def _single_sequence(quick):
    """(1, T, 1): the row kernel on one thread (vectorised along T) vs the chunked scan on
    all threads."""
    from nnkit._ext import scan_cpu

    T = 10**6 if quick else 10**7
    n = scan_cpu.CHUNK_LANES * scan_cpu.num_threads()
    return [_one_sequence(dtype, T, n) for dtype in (np.float32, np.complex64)]


def _training_steps(quick):
    """One forward + backward of nnkit's MinGRU vs nnkit's nn.LSTM, T 128, B 32, in 64, H 128."""
    import nnkit as nk
    from nnkit.nn.linear_recurrent import MinGRU
    from nnkit.nn.recurrent import LSTM

    x = np.random.default_rng(0).standard_normal((32, 128, 64)).astype(np.float32)
    times = {}
    for name, layer in (("MinGRU", MinGRU(64, 128)), ("LSTM", LSTM(64, 128, batch_first=True))):
        def step(layer=layer):
            out = layer(nk.tensor(x))
            out = out[0] if isinstance(out, tuple) else out
            out.sum().backward()

        times[name] = _median(step, 5 if quick else 21)
    return [{"work": "fwd+bwd T128 B32 in64 H128", "ms": f"MinGRU {times['MinGRU'] * 1e3:.1f}",
             "bound_ms": f"LSTM {times['LSTM'] * 1e3:.1f}", "%bound": "",
             "numpy_loop/nnkit": f"LSTM/MinGRU {times['LSTM'] / times['MinGRU']:.1f}",
             "torch_cumsum_log/nnkit": "", "GB/s_copy": ""}]


def run(quick: bool = False) -> list[dict]:
    rows = []
    for dtype in (np.float32, np.complex64):
        rows += _rows_for(dtype, quick)
    return rows + _single_sequence(quick) + _training_steps(quick)


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    sys.path.insert(0, str(HERE.parent))
    from harness import report, same_allocator

    same_allocator()  # glibc malloc tuned alike in every process, each contender's worker
    if argv and argv[0] == "--torch":
        _torch_worker(argv[1], int(argv[2]))
        return
    report(run, argv)


if __name__ == "__main__":
    main()
