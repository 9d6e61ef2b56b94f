"""The float32 CUDA kernels against their float64 twins: max error per output.

Each kernel family runs once on float32 inputs and once on the same numbers in float64 (the
same kernel source compiled for float64: every sum and product in float64), and prints per
output the max error, by default ``max |got32 - got64| / max |got64|`` (the normwise measure
of the tests' ``assert_matches_reference``), else the measure the output names: max relative
(elementwise), max abs, or max abs / max(|y|, 1); and that error in float32 eps (2^-23).

- ``recurrent``: RNN, LSTM, GRU forward and backward.
- ``scan``: the linear scan and its backward, look-back and thread-per-sequence.
- ``attention``: attention forward (out, lse) and backward; causal, dropout.
- ``pooling``: average pooling (3x3, global) and conv2d's im2col/col2im.
- ``softmax``: softmax (max relative), log-softmax (max abs / max(|y|, 1)), their backwards,
  cross-entropy (lse max abs, mean loss relative, dx).
- ``layer_norm``: layer norm at a mean offset of 100 (y max abs, rstd max relative) and its
  backward (dx, dweight, dbias).
- ``activation``: GELU and its tanh form, forward (max relative, max abs) and backward (max
  relative) on [-10, 10]; dropout (same mask, y max relative).
- ``optimizers``: one AdamW step and one Nesterov SGD step (parameters max relative and
  normwise).

Where torch is installed, softmax, log-softmax, the cross-entropy mean, layer norm's y and
GELU's y also print torch's CPU float32 against its float64 on the same inputs, for scale.

On a GPU (CuPy):                  python benchmarks/float32_error.py
Without one, Numba's simulator:   NUMBA_ENABLE_CUDASIM=1 python benchmarks/float32_error.py --small
The simulator runs the float32 sums and products in float32 (NumPy float32 scalars) but
computes exp, log, tanh and erfc in float64 and rounds the result, and fuses no multiply-add,
so its figures leave out the GPU intrinsics' last-ulp errors (CUDA's expf, logf, tanhf: 1-2
ulp; erfcf: 2-4) and the FMAs' effect; a GPU run measures them. ``--only softmax,layer_norm``
picks families (comma-separated names above); ``--small`` shrinks the shapes (a quick run; the
simulator runs a thread block as Python threads). Attention runs at L = S = 128 with one head
under the simulator, L = S = 256 with 2 x 4 heads on a GPU. Without ``--small``, softmax runs
64 rows of 1000, 4096 and 50257 columns, layer norm 256 rows, GELU 4M points, the optimizers
2^20 parameters (``--small``: 2 rows, 4002 points, 4096 parameters).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SIM = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
EPS32 = float(np.finfo(np.float32).eps)


def _device(a):
    if SIM:
        return np.ascontiguousarray(a)
    import cupy

    return cupy.ascontiguousarray(cupy.asarray(a))


def _host(a):
    if SIM or a is None:
        return a if a is None else np.asarray(a)
    import cupy

    return cupy.asnumpy(a)


def _error(got, want):
    got, want = np.asarray(_host(got), np.float64), np.asarray(_host(want), np.float64)
    finite = np.isfinite(want)
    scale = max(1e-300, float(np.abs(want[finite]).max(initial=0.0)))
    return float(np.abs(got[finite] - want[finite]).max(initial=0.0)) / scale


def _run_both(run, inputs):
    """run(*device inputs) -> list of outputs, for float32 and float64 copies of inputs
    rounded to float32 first (both runs see the same numbers: the arithmetic's error only)."""
    inputs = [np.asarray(a, np.float32) for a in inputs]
    return [run(*[_device(np.asarray(a, dtype)) for a in inputs])
            for dtype in (np.float32, np.float64)]


def _report(family, names, got32, got64, measure=_error):
    """A table row per output: measure(float32's, float64's), also in float32 eps."""
    for name, g, w in zip(names, got32, got64, strict=True):
        if g is not None:
            err = measure(g, w)
            print(f"| {family} | {name} | {err:.2e} | {err / EPS32:.1f} |", flush=True)


def _pointwise(got, want, floor=0.0, ceil=np.inf):
    """Max over the entries of ``|got - want| / clip(|want|, floor, ceil)``.

    The max relative error by default (entries where want is 0 skipped), relative to
    max(|want|, 1) with ``floor=1``, the absolute error with ``floor=ceil=1``.
    """
    got, want = np.asarray(_host(got), np.float64), np.asarray(_host(want), np.float64)
    scale = np.clip(np.abs(want), floor, ceil)
    ok = np.isfinite(want) & (scale > 0)
    return float((np.abs(got[ok] - want[ok]) / scale[ok]).max(initial=0.0))


def _pointwise1(got, want):
    """max |got - want| / max(|want|, 1)."""
    return _pointwise(got, want, floor=1.0)


def _absolute(got, want):
    """max |got - want|."""
    return _pointwise(got, want, floor=1.0, ceil=1.0)


def _torch_both(fn, inputs):
    """fn(*CPU tensors) -> tensor in torch's float32 and float64 on inputs rounded to float32
    (None without torch): torch's own float32 error, for scale."""
    try:
        import torch
    except ImportError:
        return None
    inputs = [np.asarray(a, np.float32) for a in inputs]
    return [[fn(*[torch.from_numpy(a.astype(dtype)) for a in inputs])] for dtype in
            (np.float32, np.float64)]


def _report_torch(family, name, pair, measure=_error):
    """_report's row for torch's float32 (pair from _torch_both), if torch is installed."""
    if pair is not None:
        _report(family, [f"{name}, torch CPU float32"], *pair, measure=measure)


def _empty(shape, dtype):
    """A device array of NaN (an output left unwritten shows)."""
    return _device(np.full(shape, np.nan, dtype))


def recurrent(small):
    from nnkit._backend import numpy_on_gpu_route
    from nnkit.kernels import recurrent as K

    T, B, D, H = (10, 2, 8, 16) if small else (100, 2, 32, 64)
    rng = np.random.default_rng(0)
    for cell, G in (("rnn", 1), ("lstm", 4), ("gru", 3)):
        k = 1 / np.sqrt(H)
        inputs = [rng.standard_normal((T, B, D)), rng.standard_normal((B, H)),
                  rng.standard_normal((B, H)), rng.uniform(-k, k, (G * H, D)),
                  rng.uniform(-k, k, (G * H, H)), rng.uniform(-k, k, G * H),
                  rng.uniform(-k, k, G * H), rng.standard_normal((T, B, H))]

        def run(x, h0, c0, w_ih, w_hh, b_ih, b_hh, dy, cell=cell):
            states = (h0, c0) if cell == "lstm" else (h0,)
            with numpy_on_gpu_route():
                outs, cache = getattr(K, f"{cell}_forward")(x, *states, w_ih, w_hh, b_ih, b_hh)
                douts = (dy,) + (None,) * len(states)
                grads = getattr(K, f"{cell}_backward")(douts, cache)
            return [outs[0], *grads]

        names = ["y", "dx", "dh0", *(["dc0"] if cell == "lstm" else []), "dW_ih", "dW_hh",
                 "db_ih", "db_hh"]
        got32, got64 = _run_both(run, inputs)
        _report(f"{cell} T={T} B={B} D={D} H={H}", names, got32, got64)


def scan(small):
    from nnkit._ext import scan_cuda as C

    rng = np.random.default_rng(1)
    B, T, D = (1, 512, 2) if small else (1, 4096, 4)
    for what, a in (("abs(a) < 1", rng.uniform(-0.999, 0.999, (B, T, D))),
                    ("a in [0.999, 1), long memory", 1 - rng.uniform(0, 1e-3, (B, T, D)))):
        inputs = [a, rng.standard_normal((B, T, D)), rng.standard_normal((B, D)),
                  rng.standard_normal((B, T, D))]
        for label, rows_min in (("look-back", 10**9), ("thread per sequence", 0)):
            saved, C.rows_min = C.rows_min, rows_min
            try:
                got32, got64 = _run_both(_scan_pass, inputs)
            finally:
                C.rows_min = saved
            _report(f"scan {label} B={B} T={T} D={D}, {what}", ["h", "da", "db", "dh0"],
                    got32, got64)


def _scan_pass(a, b, h0, dh):
    from nnkit._ext import scan_cuda as C

    xp = np if SIM else __import__("cupy")
    out = xp.empty_like(a)
    C.linear_scan(a, b, h0, out, False)
    da, db, dh0 = xp.empty_like(a), xp.empty_like(a), xp.empty_like(h0)
    C.linear_scan_backward(dh, a, out, h0, da, db, dh0, False)
    return [out, da, db, dh0]


def attention(small):
    from nnkit._ext import attention_cuda as C

    B, H, L, E = (1, 1, 32, 16) if small else (1, 1, 128, 64) if SIM else (2, 4, 256, 64)
    rng = np.random.default_rng(2)
    inputs = [rng.standard_normal((B, H, L, E)) for _ in range(4)]
    for causal, p in ((False, 0.0), (True, 0.0), (False, 0.2)):
        def run(q, k, v, dout, causal=causal, p=p):
            if SIM:
                from numba import cuda

                xp = np
                mask = cuda.In(np.broadcast_to(np.zeros((), q.dtype), (B, H, L, L)))
            else:
                import cupy as xp

                mask = xp.broadcast_to(xp.zeros((), q.dtype), (B, H, L, L))
            out, lse = xp.empty_like(q), xp.empty((B, H, L), q.dtype)
            scale = 1 / np.sqrt(E)
            C.attention_forward(q, k, v, mask, False, causal, scale, p, 7, out, lse)
            dq, dk, dv = xp.empty_like(q), xp.empty_like(k), xp.empty_like(v)
            C.attention_backward(q, k, v, mask, False, causal, scale, p, 7, out, lse, dout,
                                 dq, dk, dv)
            return [out, lse, dq, dk, dv]

        got32, got64 = _run_both(run, inputs)
        _report(f"attention B={B} H={H} L=S={L} E={E} causal={causal} p={p}",
                ["out", "lse", "dq", "dk", "dv"], got32, got64)


def pooling(small):
    from nnkit._ext import conv_cuda as C

    N, Ch, S = (1, 2, 8) if small else (2, 8, 32)
    rng = np.random.default_rng(3)
    inputs = [rng.standard_normal((N, Ch, S, S))]
    for kernel, stride in (((3, 3), (2, 2)), ((S, S), (1, 1))):  # 3x3 and a global pool
        Ho = (S - kernel[0]) // stride[0] + 1

        def run(x, kernel=kernel, stride=stride, Ho=Ho):
            xp = np if SIM else __import__("cupy")
            y = xp.empty((N, Ch, Ho, Ho), x.dtype)
            C.avg_pool(x, kernel, stride, (0, 0), True, 0, y)
            dx = xp.empty_like(x)
            C.avg_pool_backward(xp.ones_like(y) + y, kernel, stride, (0, 0), True, 0, dx)
            return [y, dx]

        got32, got64 = _run_both(run, inputs)
        _report(f"avg_pool N={N} C={Ch} {S}x{S} kernel {kernel} stride {stride}",
                ["y", "dx"], got32, got64)
    # col2im: conv2d's dx (the GEMMs before it are the host's, in the arrays' dtype)
    from nnkit.kernels import conv

    w = rng.standard_normal((4, Ch, 3, 3)) / 3

    def run_conv(x, w, dy):
        from nnkit._backend import numpy_on_gpu_route

        with numpy_on_gpu_route():
            y, cache = conv.conv2d_forward(x, w, None, padding=1)
            return [y, *conv.conv2d_backward(dy, cache)[:2]]

    got32, got64 = _run_both(run_conv, [inputs[0], w, rng.standard_normal((N, 4, S, S))])
    _report(f"conv2d N={N} C={Ch} {S}x{S} 3x3 pad 1 (im2col, col2im)", ["y", "dx", "dW"],
            got32, got64)


def softmax(small):
    from nnkit._ext import softmax_cuda as C

    n = 2 if small else 64
    rng = np.random.default_rng(4)
    for cols in (1000, 4096) if small else (1000, 4096, 50257):
        x, dy = rng.standard_normal((n, cols)) * 10, rng.standard_normal((n, cols))
        target = rng.integers(0, cols, n)
        what = f"{n} x {cols}, x N(0, 10)"

        def forward(x):
            y, logy = _empty(x.shape, x.dtype), _empty(x.shape, x.dtype)
            C.softmax_rows(x, y)
            C.log_softmax_rows(x, logy)
            return [y, logy]

        (y32, logy32), (y64, logy64) = _run_both(forward, [x])
        _report(f"softmax {what}", ["y (max relative)"], [y32], [y64], measure=_pointwise)
        _report_torch(f"softmax {what}", "y (max relative)",
                      _torch_both(lambda t: t.softmax(-1), [x]), measure=_pointwise)
        log_name = f"y (max abs / max(abs(y), 1); y down to {_host(logy64).min():.0f})"
        _report(f"log-softmax {what}", [log_name], [logy32], [logy64], measure=_pointwise1)
        _report_torch(f"log-softmax {what}", log_name,
                      _torch_both(lambda t: t.log_softmax(-1), [x]), measure=_pointwise1)

        def backward(dy, y, logy):  # y, logy: the float64 forward's, rounded to float32
            dx, dlogx = _empty(y.shape, y.dtype), _empty(y.shape, y.dtype)
            C.softmax_backward_rows(dy, y, dx)
            C.log_softmax_backward_rows(dy, logy, dlogx)
            return [dx, dlogx]

        got32, got64 = _run_both(backward, [dy, _host(y64), _host(logy64)])
        _report(f"softmax, log-softmax backward {what}, dy N(0, 1)", ["dx", "dx of log-softmax"],
                got32, got64)

        def cross_entropy(x, target=target):
            t = _device(target)
            lse, loss_rows = _empty(n, np.float64), _empty(n, np.float64)
            loss, n_valid = _empty(1, x.dtype), _empty(1, np.float64)
            C.cross_entropy_rows(x, t, -100, lse, loss_rows)
            C.cross_entropy_mean(loss_rows, t, -100, loss, n_valid)
            dx = _empty(x.shape, x.dtype)
            C.cross_entropy_mean_backward_rows(x, t, lse, _device(np.ones(1, x.dtype)), n_valid,
                                               -100, dx)
            return [lse, loss, dx]

        (lse32, loss32, dx32), (lse64, loss64, dx64) = _run_both(cross_entropy, [x])
        family = f"cross-entropy {what}"
        _report(family, ["lse (max abs)"], [lse32], [lse64], measure=_absolute)
        _report(family, ["mean loss (relative)"], [loss32], [loss64], measure=_pointwise)
        _report_torch(family, "mean loss (relative)", _torch_both(
            lambda t, target=target: __import__("torch").nn.functional.cross_entropy(
                t, __import__("torch").from_numpy(target)), [x]), measure=_pointwise)
        _report(family, ["dx"], [dx32], [dx64])


def layer_norm(small):
    from nnkit._ext import layer_norm_cuda as C

    n = 2 if small else 256
    rng = np.random.default_rng(5)
    for D in (768, 4096):
        inputs = [100 + rng.standard_normal((n, D)), 1 + 0.1 * rng.standard_normal(D),
                  0.1 * rng.standard_normal(D), rng.standard_normal((n, D))]
        family = f"layer norm {n} x {D}, x 100 + N(0, 1)"

        def run(x, w, b, dy, D=D):
            y, mean, rstd = _empty(x.shape, x.dtype), _empty(n, x.dtype), _empty(n, x.dtype)
            C.layer_norm_rows(x, w, b, 1e-5, y, mean, rstd)
            dx, dw, db = _empty(x.shape, x.dtype), _empty(D, x.dtype), _empty(D, x.dtype)
            C.layer_norm_backward_rows(dy, x, mean, rstd, w, dx, dw, db)
            return [y, rstd, dx, dw, db]

        (y32, rstd32, *grads32), (y64, rstd64, *grads64) = _run_both(run, inputs)
        _report(family, ["y (max abs; abs(y) ~ 1)"], [y32], [y64], measure=_absolute)
        _report_torch(family, "y (max abs; abs(y) ~ 1)", _torch_both(
            lambda x, w, b, D=D: __import__("torch").nn.functional.layer_norm(x, (D,), w, b, 1e-5),
            inputs[:3]), measure=_absolute)
        _report(family, ["rstd (max relative)"], [rstd32], [rstd64], measure=_pointwise)
        _report(family, ["dx", "dweight", "dbias"], grads32, grads64)


def activation(small):
    from nnkit._ext import activation_cuda as C

    n = 2001 if small else 2_000_001
    rng = np.random.default_rng(6)
    x = np.concatenate([np.linspace(-10, 10, n), rng.uniform(-10, 10, n)])
    g = rng.standard_normal(x.size)
    for stem, approximate in (("gelu", "none"), ("gelu_tanh", "tanh")):
        def run(x, g, stem=stem):
            y, dx = _empty(x.shape, x.dtype), _empty(x.shape, x.dtype)
            getattr(C, f"{stem}_forward")(x, y)
            getattr(C, f"{stem}_backward")(g, x, dx)
            return [y, dx]

        family = f"{stem} {x.size} points in [-10, 10]"
        (y32, dx32), (y64, dx64) = _run_both(run, [x, g])
        pair = _torch_both(lambda t, a=approximate: __import__("torch").nn.functional.gelu(
            t, approximate=a), [x])
        _report(family, ["y (max relative)"], [y32], [y64], measure=_pointwise)
        _report_torch(family, "y (max relative)", pair, measure=_pointwise)
        _report(family, ["y (max abs)"], [y32], [y64], measure=_absolute)
        _report_torch(family, "y (max abs)", pair, measure=_absolute)
        _report(family, ["dx (max relative)"], [dx32], [dx64], measure=_pointwise)

    def dropout(x):
        y, mask = _empty(x.shape, x.dtype), _empty(x.shape, x.dtype)
        C.dropout_forward(x, 7, 0.1, 1 / 0.9, y, mask)
        return [y, mask]

    (y32, mask32), (y64, mask64) = _run_both(dropout, [rng.standard_normal(4 * n)])
    assert np.array_equal(_host(mask32) != 0, _host(mask64) != 0), "dropout masks differ"
    _report(f"dropout {4 * n} N(0, 1), p = 0.1", ["y (max relative; same mask)"], [y32], [y64],
            measure=_pointwise)


def optimizers(small):
    from nnkit._ext import optim_cuda as C

    n = 4096 if small else 1 << 20
    rng = np.random.default_rng(7)
    p, g = rng.standard_normal(n), rng.standard_normal(n)
    m, v = 0.1 * rng.standard_normal(n), 0.01 * rng.random(n)

    def adam(p, g, m, v):
        p, m, v = p.copy(), m.copy(), v.copy()  # updated in place
        C.adam_step([p], [g], [m], [v], None, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8,
                    weight_decay=0.01, step=10, maximize=False, decoupled=True)
        return [p]

    def sgd(p, g, m):
        p, m = p.copy(), m.copy()
        C.sgd_step([p], [g], [m], lr=1e-2, momentum=0.9, dampening=0.0, weight_decay=1e-4,
                   nesterov=True, maximize=False, first=False)
        return [p]

    for family, run, inputs in ((f"AdamW step 10, {n} N(0, 1) parameters", adam, [p, g, m, v]),
                                (f"SGD Nesterov step, {n} N(0, 1) parameters", sgd, [p, g, m])):
        got32, got64 = _run_both(run, inputs)
        _report(family, ["parameters (max relative)"], got32, got64, measure=_pointwise)
        _report(family, ["parameters"], got32, got64)


FAMILIES = {"recurrent": recurrent, "scan": scan, "attention": attention, "pooling": pooling,
            "softmax": softmax, "layer_norm": layer_norm, "activation": activation,
            "optimizers": optimizers}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(FAMILIES))
    parser.add_argument("--small", action="store_true")
    args = parser.parse_args()
    print(f"float32 vs float64 ({'simulator' if SIM else 'GPU'})\n")
    print("| kernel, shape | output (measure, if not normwise) | max error | in float32 eps |\n"
          "|---|---|---|---|")
    for name in args.only.split(","):
        FAMILIES[name](args.small)


if __name__ == "__main__":
    main()
