"""Before/after: the Hopfield and perceptron kernels without biases / without recording.

    python benchmarks/ab_bias_default_path.py OLD_DIR

Hopfield biases (the ``thresholds`` of the kernels) and the perceptron's ``mistakes`` record
must leave the default path as fast as before. ``OLD_DIR`` holds the kernels of the commit
before them: ``hopfield.so`` and ``perceptron.so`` (the built Cython extensions, renamed) and
``hopfield_cpu.py`` (the Numba module), e.g. from a checkout of 820ca64:

    mkdir old && cp ../old/nnkit/_ext/hopfield.cpython-311-x86_64-linux-gnu.so old/hopfield.so
    cp ../old/nnkit/_ext/perceptron.cpython-311-x86_64-linux-gnu.so old/perceptron.so
    cp ../old/nnkit/_ext/hopfield_cpu.py old/

Each case runs the old and the new kernel on the same inputs (asserting the same result),
interleaved, timing the kernel call alone; medians of ``--repeats`` calls. Also times the new
Cython kernel with thresholds (zeros and small biases), the price of the biased path.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import sys
import time
from pathlib import Path

import numpy as np

from nnkit._ext import hopfield as new_cy
from nnkit._ext import hopfield_cpu as new_nb
from nnkit._ext import perceptron as new_pc


def _extension(path, name):
    loader = importlib.machinery.ExtensionFileLoader(f"old.{name}", str(path))
    spec = importlib.util.spec_from_file_location(f"old.{name}", str(path), loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def _numba_module(path):
    """The old hopfield_cpu.py inside nnkit._ext (for its relative imports), registered in
    sys.modules so that Numba's cache can find it again."""
    name = "nnkit._ext._old_hopfield_cpu"
    spec = importlib.util.spec_from_file_location(name, str(path))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _median_pair(old, new, repeats):
    """Median seconds of old() and new(), each returning (seconds, result), interleaved."""
    a, b = old(), new()
    for x, y in zip(a[1], b[1], strict=True):
        assert np.array_equal(x, y), "old and new kernels disagree"
    times = [], []
    for _ in range(repeats):
        times[0].append(old()[0])
        times[1].append(new()[0])
    return float(np.median(times[0])), float(np.median(times[1]))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("old_dir", type=Path)
    parser.add_argument("--repeats", type=int, default=41)
    args = parser.parse_args(argv)
    old_cy = _extension(args.old_dir / "hopfield.so", "hopfield")
    old_pc = _extension(args.old_dir / "perceptron.so", "perceptron")
    old_nb = _numba_module(args.old_dir / "hopfield_cpu.py")

    rng = np.random.default_rng(0)
    n, s, B = 2000, 100, 32
    xi = rng.choice(np.array([-1, 1], np.int8), size=(s, n))
    C = xi.T.astype(np.float32) @ xi.astype(np.float32)
    np.fill_diagonal(C, 0)
    noisy = (xi[:B] * np.where(rng.random((B, n)) < 0.1, -1, 1)).astype(np.int8)
    fixed = np.ascontiguousarray(xi[:B])
    rows = np.arange(B, dtype=np.int64)
    # the fields of each start, computed once: no BLAS call (and its spinning threads) next
    # to a timed kernel
    fields = {id(start): np.ascontiguousarray(start.astype(np.float32) @ C)
              for start in (noisy, fixed)}

    def cython(mod, start, *extra):
        x, h = start.copy(), fields[id(start)].copy()
        w, sw, cv = np.empty(x.shape, np.int32), np.zeros(B, np.int64), np.zeros(B, np.uint8)
        t = time.perf_counter()
        mod.async_run(C, x, h, w, rows, 100, True, 7, sw, cv, *extra)
        return time.perf_counter() - t, (x, sw)

    def numba_sync(mod, start, *extra):
        x, h = start.copy(), fields[id(start)].copy()
        sw, cv = np.zeros(B, np.int64), np.zeros(B, np.uint8)
        t = time.perf_counter()
        mod.sync_run.serial(h, C, x, np.empty(x.shape, np.int64), 100, sw, cv, *extra)
        return time.perf_counter() - t, (x, sw)

    # the perceptron on data it cannot separate: about S/2 updates every pass
    X = rng.standard_normal((2000, 100))
    y = rng.choice([-1.0, 1.0], 2000)
    order = np.arange(2000, dtype=np.intp)

    def epochs(mod, *extra):
        w, b = np.zeros(100), np.zeros(1)
        t = time.perf_counter()
        out = mod.perceptron_epochs(X, y, w, b, order, 50, False, *extra)
        return time.perf_counter() - t, (np.array(out[:2]), w)

    cases = {
        f"Cython async, n={n} s={s}, {B} probes from 10% noise":
            (lambda: cython(old_cy, noisy), lambda: cython(new_cy, noisy)),
        f"Cython async, {B} probes at a fixed point (one sweep)":
            (lambda: cython(old_cy, fixed), lambda: cython(new_cy, fixed)),
        f"Numba sync (serial), {B} probes from 10% noise":
            (lambda: numba_sync(old_nb, noisy), lambda: numba_sync(new_nb, noisy, np.zeros(n))),
        "perceptron, 50 passes over 2000 x 100, ~50% mistakes":
            (lambda: epochs(old_pc), lambda: epochs(new_pc)),
    }
    for name, (old, new) in cases.items():
        before, after = _median_pair(old, new, args.repeats)
        print(f"{name}: before {before * 1e3:.2f} ms, after {after * 1e3:.2f} ms "
              f"(after/before {after / before:.3f})")
    zeros, small = np.zeros(n), -(n * 0.05 * rng.standard_normal(n))
    variants = {"no thresholds": (), "thresholds of zeros": (zeros,),
                "biases ~ N(0, 0.05^2)": (small,)}
    times = {name: [] for name in variants}
    for _ in range(args.repeats):  # interleaved
        for name, extra in variants.items():
            times[name].append(cython(new_cy, noisy, *extra)[0])
    for name, t in times.items():
        print(f"new Cython async from 10% noise, {name}: {np.median(t) * 1e3:.2f} ms")
    buffer = np.empty(50 * 2000, np.int64)
    plain, recording = _median_pair(lambda: epochs(new_pc), lambda: epochs(new_pc, buffer),
                                    args.repeats)
    print(f"new perceptron: {plain * 1e3:.2f} ms, recording its updates {recording * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
