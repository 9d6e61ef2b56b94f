"""Hopfield dynamics: nnkit's kernels vs naive loops, batches over the cores, pattern storage.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_hopfield.py [--quick]

1. Async, n = 1000 and 4000, s = 0.05 n, one probe with 10% of a pattern's bits flipped:
   - to convergence: ``Hopfield.run`` (validation, fields h = C x by BLAS, the Cython kernel
     that updates the fields only on a flip) vs the naive NumPy per-neuron loop
     (h_i = W[i] @ x for every visit, float64 W; target >= 50x at n = 1000) and vs a naive
     Numba loop recomputing every field (float32 C, fastmath on so that its reduction
     vectorises: the naive loop at its fastest; target >= 3x);
   - one sweep once the fields exist: the first sweep from the noisy probe (where all the
     flips happen, ~n/10 of them, each O(n) for nnkit), and a sweep at the fixed point
     (n visits, O(1) each for nnkit; the naive loops recompute n fields either way): the
     Cython kernel vs the same two naive loops (target >= 20x vs Numba).
   The same random order (one permutation per sweep) for every contender.
2. A batch of 256 noisy probes at n = 1000 and 4000: threads over the probes (the Cython
   kernel releases the GIL) vs one thread.
3. Sync, a batch of 1000 probes at n = 1000 (10% noise): ``run(mode='sync')`` (fields by one
   BLAS product, then the Numba kernel updating them incrementally, parallel over the batch)
   vs NumPy float32 matmul + sign repeated until no probe changes.
4. Pattern storage (no (n, n) matrix): n = 100,000, alpha = 0.05 (s = 5,000 int8 patterns,
   500 MB; a float32 W would need 40 GB), one probe from 10% noise; peak memory and time
   (in a child process, so that its peak RSS is its own). ``--quick`` uses n = 20,000.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import numba
import numpy as np

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))

from harness import environment, median_times  # noqa: E402

from nnkit.classic import hopfield as hf  # noqa: E402


def numpy_async(W, x, orders, max_sweeps):
    """The naive NumPy per-neuron loop: every visit recomputes h_i = W[i] @ x."""
    for sweep in range(max_sweeps):
        flips = 0
        for i in orders[sweep % len(orders)]:
            new = 1.0 if W[i] @ x >= 0 else -1.0
            if new != x[i]:
                x[i] = new
                flips += 1
        if flips == 0:
            return sweep + 1
    return max_sweeps


@numba.njit(cache=True, fastmath=True)
def numba_async(C, x, orders, max_sweeps):
    """The naive Numba loop: every visit recomputes h_i = sum_j C[i, j] x_j (float32)."""
    n = x.shape[0]
    for sweep in range(max_sweeps):
        order = orders[sweep % orders.shape[0]]
        flips = 0
        for k in range(n):
            i = order[k]
            acc = np.float32(0.0)
            for j in range(n):
                acc += C[i, j] * x[j]
            new = np.float32(1.0) if acc >= 0 else np.float32(-1.0)
            if new != x[i]:
                x[i] = new
                flips += 1
        if flips == 0:
            return sweep + 1
    return max_sweeps


def _problem(n, batch=1, seed=0):
    rng = np.random.default_rng(seed)
    xi = rng.choice(np.array([-1, 1], np.int8), size=(max(1, n // 20), n))
    net = hf.Hopfield(n).store(xi)
    targets = xi[rng.integers(0, len(xi), batch)]
    noisy = targets * np.where(rng.random(targets.shape) < 0.1, -1, 1).astype(np.int8)
    return net, noisy


def async_rows(n, repeats):
    net, noisy = _problem(n)
    x0 = noisy[0]
    orders = hf.random_orders(n, 100, 0)  # (100, n), the kernel's orders for seed 0
    W = net.weights_
    C = net.couplings_
    res = net.run(x0, random_state=0)
    assert numpy_async(W, x0.astype(np.float64), orders, 100) == res.sweeps
    xf = x0.astype(np.float32)
    h0 = net._int_fields(x0[None])
    block = 50 if n <= 1000 else 10  # calls per timed block: warm caches for every contender
    rows, sw, cv = np.zeros(1, np.int64), np.zeros(1, np.int64), np.zeros(1, np.uint8)
    work = np.empty((1, n), np.int32)

    def one_sweep_nnkit():  # the fields exist: the kernel alone
        x, h = x0[None].copy(), h0.copy()
        hf._cy.async_run(C, x, h, work, rows, 1, True, 0, sw, cv)

    full = median_times({
        "nnkit run()": lambda: net.run(x0, random_state=0),
        "numpy loop": lambda: numpy_async(W, x0.astype(np.float64), orders, 100),
        "numba loop": lambda: numba_async(C, xf.copy(), orders, 100),
    }, repeats=repeats, pause=0.05, block=block)
    sweep = median_times({
        "nnkit kernel": one_sweep_nnkit,
        "numpy loop": lambda: numpy_async(W, x0.astype(np.float64), orders, 1),
        "numba loop": lambda: numba_async(C, xf.copy(), orders, 1),
    }, repeats=repeats, pause=0.05, block=block)
    xs, hs = res.states[None].copy(), net._int_fields(res.states[None])  # a fixed point
    xs64, xs32 = res.states.astype(np.float64), res.states.astype(np.float32)
    fixed = median_times({
        "nnkit kernel": lambda: hf._cy.async_run(C, xs, hs, work, rows, 1, True, 0, sw, cv),
        "numpy loop": lambda: numpy_async(W, xs64, orders, 1),
        "numba loop": lambda: numba_async(C, xs32, orders, 1),
    }, repeats=repeats, pause=0.05, block=block)
    out = []
    for what, t, ref in ((f"to convergence ({res.sweeps} sweeps)", full, "nnkit run()"),
                         ("first sweep, 10% flips (fields exist)", sweep, "nnkit kernel"),
                         ("sweep at the fixed point (fields exist)", fixed, "nnkit kernel")):
        for name, sec in t.items():
            out.append({"work": f"async n={n} s={n // 20} {what}",
                        "impl": name, "median_ms": f"{sec * 1e3:.3f}",
                        "impl/nnkit": f"{sec / t[ref]:.1f}"})
    return out


def batch_rows(n, batch, repeats):
    net, noisy = _problem(n, batch, seed=1)
    threads = numba.get_num_threads()
    t = median_times({
        f"{threads} threads": lambda: net.run(noisy, random_state=0),
        "1 thread": lambda: net.run(noisy, random_state=0, n_jobs=1),
    }, repeats=repeats, pause=0.1)
    ok = (net.run(noisy, random_state=0).states == noisy).all()  # noqa: F841 (warm)
    return [{"work": f"async batch {batch} probes n={n}", "impl": name,
             "median_ms": f"{sec * 1e3:.2f}",
             "impl/nnkit": f"{sec / t[f'{threads} threads']:.2f}"} for name, sec in t.items()]


def numpy_sync(W32, noisy, max_sweeps=100):
    """NumPy matmul + sign until no probe changes (float32 W: exact integer fields x n)."""
    x = noisy.astype(np.float32)
    for _ in range(max_sweeps):
        new = np.where(x @ W32 >= 0, np.float32(1), np.float32(-1))  # W symmetric
        if (new == x).all():
            break
        x = new
    return x


def sync_rows(n, batch, repeats):
    net, noisy = _problem(n, batch, seed=2)
    C = net.couplings_
    np.testing.assert_array_equal(numpy_sync(C, noisy), net.run(noisy, mode="sync").states)
    t = median_times({
        "nnkit run(mode='sync')": lambda: net.run(noisy, mode="sync"),
        "numpy matmul + sign": lambda: numpy_sync(C, noisy),
    }, repeats=repeats, pause=0.15)
    return [{"work": f"sync batch {batch} probes n={n}", "impl": name,
             "median_ms": f"{sec * 1e3:.2f}",
             "impl/nnkit": f"{sec / t['nnkit run(mode=' + chr(39) + 'sync' + chr(39) + ')']:.2f}"}
            for name, sec in t.items()]


def _pattern_child(n):
    """Store s = 0.05 n patterns (pattern storage) and recall one probe; print JSON."""
    s = n // 20
    rng = np.random.default_rng(0)
    xi = rng.integers(0, 2, size=(s, n), dtype=np.int8)
    xi *= 2
    xi -= 1
    start = time.perf_counter()
    net = hf.Hopfield(n).store(xi)
    store_s = time.perf_counter() - start
    del xi
    probe = net.patterns_[0] * np.where(rng.random(n) < 0.1, -1, 1).astype(np.int8)
    net.run(probe[:], random_state=1, max_sweeps=1)  # compile
    start = time.perf_counter()
    res = net.run(probe, random_state=0)
    run_s = time.perf_counter() - start
    print(json.dumps({"storage": net.storage_, "store_s": store_s, "run_s": run_s,
                      "sweeps": int(res.sweeps), "recalled": bool((res.states ==
                                                                   net.patterns_[0]).all()),
                      "patterns_mb": net.patterns_t_.nbytes / 1e6,
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3}))


def pattern_rows(n):
    out = subprocess.run([sys.executable, str(HERE), "--patterns-child", str(n)],
                         capture_output=True, text=True, check=True)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    return [{"work": f"pattern storage n={n} s={n // 20}, 10% noise", "impl": r["storage"],
             "median_ms": f"{r['run_s'] * 1e3:.0f}",
             "impl/nnkit": f"{r['sweeps']} sweeps, recalled={r['recalled']}, "
                           f"patterns {r['patterns_mb']:.0f} MB, peak RSS "
                           f"{r['peak_rss_mb']:.0f} MB (incl. the caller's int8 copy), "
                           f"store {r['store_s']:.1f} s"}]


def run(quick: bool = False) -> list[dict]:
    repeats = 3 if quick else 9
    rows = []
    for n in (1000,) if quick else (1000, 4000):
        rows += async_rows(n, repeats)
    for n in (1000,) if quick else (1000, 4000):
        rows += batch_rows(n, 64 if quick else 256, repeats)
    rows += sync_rows(1000, 200 if quick else 1000, repeats)
    rows += pattern_rows(20_000 if quick else 100_000)
    return rows


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--patterns-child":
        _pattern_child(int(argv[1]))
        return
    from nnkit.tour import format_table

    print(environment())
    rows = run(quick="--quick" in argv)
    print(format_table(rows, list(rows[0])))


if __name__ == "__main__":
    main()
