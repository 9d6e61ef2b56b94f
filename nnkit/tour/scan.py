"""The ``nnkit tour`` section for linear recurrences (notes §5.2).

Rows: the fused scan against its sequential twin (real and complex, both directions), the
complex gradient check, the tree scans' depth and work at T = 1024 (the O(log T) is the
depth), MinGRU's scan against its step-by-step recurrence, the LRU's eigenvalues inside the
unit disc and its output bounded over a long sequence, the LRU built from a dense linear RNN
by the change of basis, and the scan's speed against a NumPy loop over T. ``ctx.quick`` keeps
every row to a fraction of a second.
"""

from __future__ import annotations

import time

import numpy as np

from .._backend import kernels_for
from ..autograd import tensor
from ..functional.scan import linear_scan
from ..gradcheck import gradcheck
from ..kernels import scan as K
from ..kernels import tree_scan, tree_scan_counts
from ..kernels.reference import scan as R
from ..nn.linear_recurrent import LRU, MinGRU
from .common import INFO, tour_row

__all__ = ["scan_section"]

SECTION = "linear recurrences"


def _row(result, value, target="", ok=INFO):
    return tour_row(SECTION, result, value, target, ok)


def _coefficients(rng, shape, dtype):
    a = rng.uniform(0.5, 0.99, shape) * np.exp(1j * rng.uniform(0, 2 * np.pi, shape))
    a = a if np.dtype(dtype).kind == "c" else a.real
    return a.astype(dtype), rng.standard_normal(shape).astype(dtype)


def _twin_row(rng):
    worst = 0.0
    for dtype in (np.float32, np.complex64):
        for reverse in (False, True):
            a, b = _coefficients(rng, (2, 37, 5), dtype)
            want = R.linear_scan(a.astype(np.complex128), b.astype(np.complex128), None, reverse)
            got, _ = K.linear_scan_forward(a, b, reverse=reverse)
            worst = max(worst, float(np.max(np.abs(got - want)) / np.max(np.abs(want))))
    return _row("linear_scan vs sequential twin (f32, c64, both directions), max rel. diff",
                f"{worst:.1e}", "<= 1e-5", worst <= 1e-5)


def _gradcheck_row(rng):
    a, b = _coefficients(rng, (2, 6, 3), np.complex128)
    h0 = rng.standard_normal((2, 3)) + 1j * rng.standard_normal((2, 3))
    ok = gradcheck(lambda a, b, h0: linear_scan(a, b, h0),
                   [tensor(x, requires_grad=True) for x in (a, b, h0)], raise_exception=False)
    return _row("complex linear_scan gradient = finite differences", str(ok), "True", ok)


def _mingru_row(rng):
    layer = MinGRU(3, 8, dtype=np.float64)
    x = rng.standard_normal((2, 50, 3))
    h, steps = None, []
    for t in range(50):
        y, h = layer.step(x[:, t], h)
        steps.append(y.numpy())
    diff = float(np.max(np.abs(layer(x).numpy() - np.stack(steps, axis=1))))
    return _row("MinGRU: parallel scan vs step() recurrence, max abs diff", f"{diff:.1e}",
                "<= 1e-12", diff <= 1e-12)


def _lru_row(rng, T):
    lru = LRU(2, 32, r_min=0.99, r_max=0.999, random_state=0)
    y = lru(rng.standard_normal((1, T, 2)).astype(np.float32)).numpy()
    peak = float(np.max(np.abs(y)))
    ok = np.isfinite(peak) and peak < 100 and np.all(np.abs(lru.eigenvalues()) < 1)
    return _row(f"LRU (|lambda| in [0.99, 0.999]) at T = {T}: max |y|", f"{peak:.2f}",
                "finite, < 100", ok)


def _tree_rows(rng, T=1024):
    """Both tree scans at T, equal to the sequential recurrence, their counted levels and
    combines against the closed forms, beside the sequential loop's T - 1 of each."""
    a, b = _coefficients(rng, (2, T, 3), np.float64)
    want = R.linear_scan(a, b)
    rows, counts = [], {}
    for algorithm in ("hillis_steele", "blelloch"):
        h, stats = tree_scan(a, b, algorithm=algorithm)
        diff = float(np.max(np.abs(h - want)) / np.max(np.abs(want)))
        counts[algorithm] = (stats.levels, stats.combines)
        ok = diff <= 1e-12 and counts[algorithm] == tree_scan_counts(T, algorithm)
        rows.append(_row(f"{algorithm} tree scan (T = {T}) vs sequential, max rel. diff",
                         f"{diff:.1e}", "<= 1e-12, counts = closed form", ok))
    (hs_depth, hs_work), (bl_depth, bl_work) = counts["hillis_steele"], counts["blelloch"]
    rows.append(_row(f"tree scan depth / work at T = {T}: Hillis-Steele, Blelloch, sequential",
                     f"{hs_depth}/{hs_work}, {bl_depth}/{bl_work}, {T - 1}/{T - 1}",
                     "depth log2 T, 2 log2 T; work ~T log2 T, < 4T",
                     hs_depth == 10 and bl_depth == 20 and bl_work < 4 * T < hs_work))
    return rows


def _from_dense_row(rng, P=8, F=3, T=200):
    """A random stable dense linear RNN (complex eigenvalue pairs) and its LRU."""
    A = rng.standard_normal((P, P))
    A *= 0.97 / np.max(np.abs(np.linalg.eigvals(A)))
    B, C, D = rng.standard_normal((P, F)), rng.standard_normal((F, P)), rng.standard_normal(F)
    x = rng.standard_normal((2, T, F))
    h, ys = np.zeros((2, P)), []
    for t in range(T):
        h = h @ A.T + x[:, t] @ B.T
        ys.append(h @ C.T + D * x[:, t])
    want = np.stack(ys, axis=1)
    diff = float(np.max(np.abs(LRU.from_dense(A, B, C, D)(x).numpy() - want))
                 / np.max(np.abs(want)))
    return _row(f"LRU.from_dense (A = P Lambda P^-1, P = {P}) vs the dense RNN, max rel. diff",
                f"{diff:.1e}", "<= 1e-9", diff <= 1e-9)


def _best(fn, n=5):
    fn()
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def _numpy_loop(a, b, out):
    h = np.zeros_like(a[:, 0])
    for t in range(a.shape[1]):
        h = a[:, t] * h + b[:, t]
        out[:, t] = h


def _speed_rows(rng, quick):
    """The scan against a NumPy loop over T where the loop's per-step overhead shows (long,
    narrow), and against the memory-bandwidth bound at the benchmark's shape (wide): there a
    NumPy loop is itself near the bound, so no kernel can meet the bench target of 20x there."""
    a, b = _coefficients(rng, (2, 20_000 if quick else 100_000, 16), np.float32)
    out = np.empty_like(a)
    ratio = _best(lambda: _numpy_loop(a, b, out), 3) / _best(
        lambda: K.linear_scan_forward(a, b, out=out))
    # Timings are information, not a pass/fail check: this machine may be busy.
    rows = [_row(f"linear_scan {a.shape} f32 vs NumPy loop over T, speed-up", f"{ratio:.0f}x",
                 "(bench target >= 20x)", INFO)]
    shape = (16, 2048, 256) if quick else (16, 4096, 256)  # 32 / 64 MiB an array: past L3
    a, b = _coefficients(rng, shape, np.float32)
    out = np.empty_like(a)
    copy_rows = kernels_for("scan_cpu", None, a).copy  # the scan's threads, 2 arrays moved
    copy = _best(lambda: copy_rows(a, out))
    share = 1.5 * copy / _best(lambda: K.linear_scan_forward(a, b, out=out))  # scan moves 3
    rows.append(_row(f"linear_scan {shape} f32, share of the copy-bandwidth bound",
                     f"{100 * share:.0f}%", "(bench target >= 85%)", INFO))
    return rows


def scan_section(ctx) -> list[dict]:
    """Rows of the linear-recurrence section (see the module docstring)."""
    rng = np.random.default_rng(ctx.seed)
    return [
        _twin_row(rng),
        _gradcheck_row(rng),
        *_tree_rows(rng),
        _mingru_row(rng),
        _lru_row(rng, 10_000 if ctx.quick else 100_000),
        _from_dense_row(rng),
        *_speed_rows(rng, ctx.quick),
    ]
