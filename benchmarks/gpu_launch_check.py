"""nnkit's one launch path (``nnkit._ext._launch``) on a real GPU: does the raw path compute
what Numba's path computes, how many launches does each op make, and what does a launch cost
the host. One command, about a minute on an H100 (the first calls compile every kernel):

    python benchmarks/gpu_launch_check.py [--pytest SECONDS] [--out DIR]

1. ``paths``: every nnkit CUDA kernel, through the ``nnkit.kernels`` functions on small CuPy
   inputs, run once with the launch path forced to "raw" (strict: a signature that cannot
   take it is an error, not a fallback) and once to "numba"; the outputs must agree (the
   same PTX either way; the look-back scan may compose in another order: a few ulps).
2. ``budgets``: the launches of each case, and the path every launch took.
3. ``launch``: host microseconds per ``launch()`` of an empty 5-array kernel on each path,
   beside Numba's dispatcher called directly with CuPy arrays and the raw path's floor (the
   loaded function with its arguments packed once).
4. ``ops``: one small call of a few ops (softmax, layer norm, LSTM forward, linear scan) on
   each path, the device synchronised around each timed block.
5. ``--pytest SECONDS``: ``pytest -m cuda -x -q`` with NNKIT_LAUNCH_PATH=raw, stopped after
   SECONDS.

Results are printed and written as JSON to DIR/gpu_launch_check.json (DIR: ``--out``, else
$OUT when set). ``--smoke`` runs sections 1-4 at tiny sizes under Numba's simulator with the
tests' CuPy stand-in (every launch then takes the simulator path): a check that the script
works, not a measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

import numpy as np
from numba import cuda  # a module global: the simulator swaps it inside kernels

ROOT = Path(__file__).resolve().parent.parent


@cuda.jit
def _touch(a, b, c, d, e):
    i = cuda.grid(1)
    if i < a.shape[0]:
        a[i] = b[i] + c[i] + d[i] + e[i]


def _cases(cupy, smoke):
    """{name: case}: each case builds its inputs from a fixed seed and returns its outputs;
    together they launch every CUDA kernel of nnkit."""
    from nnkit import kernels as K
    from nnkit._ext import hopfield_cuda, scan_cuda

    f32, f64 = np.float32, np.float64

    def randn(rng, shape, dtype=f32):
        return cupy.asarray(rng.standard_normal(shape).astype(dtype))

    def softmax():
        rng = np.random.default_rng(0)
        x, dy = randn(rng, (5, 7) if smoke else (33, 70)), randn(rng, (5, 7) if smoke else (33, 70))
        (y, c), (ly, lc) = K.softmax_forward(x), K.log_softmax_forward(x)
        return [y, K.softmax_backward(dy, c), ly, K.log_softmax_backward(dy, lc)]

    def cross_entropy():
        rng = np.random.default_rng(1)
        logits = randn(rng, (6, 9) if smoke else (33, 70), f64)
        target = rng.integers(0, logits.shape[1], logits.shape[0])
        target[2] = -100
        target = cupy.asarray(target)
        loss, cache = K.cross_entropy_forward(logits, target)
        return [loss, cache.lse, K.cross_entropy_backward(1.0, cache)]

    def layer_norm():
        rng = np.random.default_rng(2)
        M, D = (3, 10) if smoke else (40, 300)
        x, w, b, dy = randn(rng, (M, D)), randn(rng, D), randn(rng, D), randn(rng, (M, D))
        y, cache = K.layer_norm_forward(x, w, b, (D,))
        return [y, cache.mean, cache.rstd, *K.layer_norm_backward(dy, cache)]

    def layer_norm_no_rows():
        x = cupy.zeros((0, 8), f32)
        w, b = cupy.ones(8, f32), cupy.zeros(8, f32)
        _, cache = K.layer_norm_forward(x, w, b, (8,))
        return list(K.layer_norm_backward(cupy.zeros((0, 8), f32), cache))

    def conv2d():
        rng = np.random.default_rng(3)
        x, w, b = randn(rng, (2, 3, 6, 6)), randn(rng, (4, 3, 3, 3)), randn(rng, 4)
        y, cache = K.conv2d_forward(x, w, b, padding=1)
        return [y, *K.conv2d_backward(randn(rng, y.shape), cache)]

    def pools():
        rng = np.random.default_rng(4)
        x = randn(rng, (2, 3, 8, 8))
        y1, c1 = K.max_pool2d_forward(x, 2)
        y2, c2 = K.avg_pool2d_forward(x, 3, stride=2, padding=1)
        return [y1, K.max_pool2d_backward(randn(rng, y1.shape), c1),
                y2, K.avg_pool2d_backward(randn(rng, y2.shape), c2)]

    def recurrent(cell):
        def run():
            rng = np.random.default_rng(5)
            T, B, D, H = (3, 2, 3, 4) if smoke else (6, 3, 5, 8)
            G = {"rnn": 1, "lstm": 4, "gru": 3}[cell]
            x = randn(rng, (T, B, D))
            w = [randn(rng, (G * H, D)), randn(rng, (G * H, H)), randn(rng, G * H),
                 randn(rng, G * H)]
            dy = randn(rng, (T, B, H))
            states = (None, None) if cell == "lstm" else (None,)
            outs, cache = getattr(K, f"{cell}_forward")(x, *states, *w)
            return [*outs, *getattr(K, f"{cell}_backward")((dy, *states), cache)]
        return run

    def scan(shape, dtype, rows=False):
        def run():
            if rows:  # one thread per sequence, whatever the number of sequences
                saved, scan_cuda.rows_min = scan_cuda.rows_min, 1
                try:
                    return scan(shape, dtype)()
                finally:
                    scan_cuda.rows_min = saved
            rng = np.random.default_rng(6)
            parts = [rng.uniform(0.5, 1.0, shape), rng.standard_normal(shape),
                     rng.standard_normal((shape[0], shape[2])), rng.standard_normal(shape)]
            if np.dtype(dtype).kind == "c":
                parts = [p + 0.1j * rng.standard_normal(p.shape) for p in parts]
            a, b, h0, dh = (cupy.asarray(p.astype(dtype)) for p in parts)
            h, cache = K.linear_scan_forward(a, b, h0)
            return [h, *K.linear_scan_backward(dh, cache)]
        return run

    def attention(masked):
        def run():
            rng = np.random.default_rng(7)
            B, H, L, E = (1, 1, 5, 4) if smoke else (2, 2, 20, 16)
            q, k, v, dout = (randn(rng, (B, H, L, E)) for _ in range(4))
            if masked:
                mask = cupy.asarray(rng.random((L, L)) > 0.3)
                out, cache = K.attention_forward(q, k, v, attn_mask=mask, dropout_p=0.1, seed=3)
            else:
                out, cache = K.attention_forward(q, k, v, is_causal=True)
            return [out, *K.attention_backward(dout, cache)[:3]]
        return run

    def hopfield():
        rng = np.random.default_rng(8)
        n, B, P = (6, 2, 2) if smoke else (40, 7, 3)
        patterns = np.where(rng.random((P, n)) < 0.5, -1, 1)
        couplings = (patterns.T @ patterns).astype(f32)
        np.fill_diagonal(couplings, 0)
        states = np.where(rng.random((B, n)) < 0.5, -1, 1).astype(np.int8)
        arrays = [cupy.asarray(couplings), cupy.asarray(states), cupy.zeros(B, np.int64),
                  cupy.zeros(B, np.uint8)]
        fields = cupy.asarray(states.astype(f32) @ couplings)
        hopfield_cuda.sync_run(fields, arrays[0], arrays[1], None, 20, arrays[2], arrays[3],
                               cupy.zeros(n))
        return arrays[1:]

    def activation():
        rng = np.random.default_rng(9)
        x, g = randn(rng, 37 if smoke else 5000, f64), randn(rng, 37 if smoke else 5000, f64)
        y, cache = K.gelu_forward(x)
        y2, dropped = K.dropout_forward(x, 0.3, 11)
        return [y, K.gelu_backward(g, cache), y2, dropped.mask,
                K.dropout_backward(g, dropped)]

    def cross_entropy_mean():
        from nnkit._ext import softmax_cuda

        rng = np.random.default_rng(10)
        logits = randn(rng, (6, 9) if smoke else (33, 70))
        target = rng.integers(0, logits.shape[1], logits.shape[0])
        target[2] = -100
        target = cupy.asarray(target)
        N = logits.shape[0]
        lse, rows = cupy.empty(N, f64), cupy.empty(N, f64)
        loss, n_valid, out = cupy.empty(1, f32), cupy.empty(1, f64), cupy.empty_like(logits)
        softmax_cuda.cross_entropy_rows(logits, target, -100, lse, rows)
        softmax_cuda.cross_entropy_mean(rows, target, -100, loss, n_valid)
        softmax_cuda.cross_entropy_mean_backward_rows(logits, target, lse,
                                                      cupy.full(1, 0.5, f32), n_valid, -100,
                                                      out)
        return [lse, rows, loss, n_valid, out]

    def optimizers():  # tuples of arrays: the multi-tensor steps
        from nnkit._ext import optim_cuda

        rng = np.random.default_rng(11)
        sizes = (5, 1, 40) if smoke else (300, 1, 4000, 17)
        outputs = []
        for amsgrad in (False, True):
            p, g, m, v, vm = ([randn(rng, n) for n in sizes] for _ in range(5))
            v = [a * a for a in v]
            vm = [a * a for a in vm]
            optim_cuda.adam_step(p, g, m, v, vm if amsgrad else None, lr=1e-2, beta1=0.9,
                                 beta2=0.999, eps=1e-8, weight_decay=0.01, step=3,
                                 maximize=False, decoupled=amsgrad)
            outputs += p + m + v + (vm if amsgrad else [])
        p, g, b = ([randn(rng, n) for n in sizes] for _ in range(3))
        optim_cuda.sgd_step(p, g, b, lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.01,
                            nesterov=False, maximize=True, first=False)
        return outputs + p + b

    cases = {"softmax": softmax, "cross_entropy": cross_entropy, "layer_norm": layer_norm,
             "layer_norm_no_rows": layer_norm_no_rows, "conv2d": conv2d, "pools": pools,
             "rnn": recurrent("rnn"), "lstm": recurrent("lstm"), "gru": recurrent("gru"),
             "scan_rows": scan((2, 7, 5) if smoke else (4, 50, 64), f32, rows=True),
             "scan_lookback": scan((2, 40, 3) if smoke else (2, 300, 3), f32),
             "scan_lookback_complex": scan((2, 40, 3) if smoke else (2, 300, 3), np.complex64),
             "attention_causal": attention(False), "attention_mask_dropout": attention(True),
             "hopfield": hopfield, "gelu_dropout": activation,
             "cross_entropy_mean": cross_entropy_mean, "optimizers": optimizers}
    return cases


def _host(cupy, outputs):
    return [cupy.asnumpy(o) if isinstance(o, cupy.ndarray) else np.asarray(o)
            for o in outputs if o is not None]


def check_paths(cupy, smoke):
    """Sections 1 and 2: each case on the raw and the Numba path, compared, with its
    launches."""
    from nnkit._ext import _launch

    if smoke:  # the simulator: small attention tiles, as tests/conftest.py sets them
        from nnkit._ext import attention_cuda

        attention_cuda.block_m, attention_cuda.block_n = 8, 8
        attention_cuda.threads_y, attention_cuda.threads_x = 2, 4
    # First the empty kernel of section 3: the raw path's simplest launch computes a = b+c+d+e.
    arrays = [cupy.ones(256, cupy.float32) for _ in range(5)]
    arrays[0].fill(0)
    _launch.set_path("raw")
    try:
        _launch.launch(_touch, 2, 128, *arrays)
        gate = {"section": "paths", "case": "empty kernel, raw path",
                "agree": bool((cupy.asnumpy(arrays[0]) == 4).all())}
    except Exception:
        gate = {"section": "paths", "case": "empty kernel, raw path",
                "error": traceback.format_exc()}
    finally:
        _launch.set_path("auto")
    print(f"{gate['case']:24s} agree={gate.get('agree')}" + ("\n" + gate["error"]
                                                            if "error" in gate else ""))
    rows = [gate]
    for name, case in _cases(cupy, smoke).items():
        row = {"section": "paths", "case": name}
        results = {}
        try:
            for path in ("raw", "numba"):
                _launch.set_path(path)
                paths_before = dict(_launch.path_counts)
                with _launch.count_launches() as counts:
                    results[path] = _host(cupy, case())
                cupy.cuda.Device().synchronize()
                row[f"{path}_launches"] = dict(counts)
                row[f"{path}_paths"] = {p: n - paths_before.get(p, 0)
                                        for p, n in _launch.path_counts.items()
                                        if n - paths_before.get(p, 0)}
            worst = 0.0
            for r, n in zip(results["raw"], results["numba"], strict=True):
                scale = max(1.0, float(np.abs(n).max(initial=0)))
                if r.dtype.kind in "fc":
                    diff = np.abs(r.astype(np.complex128) - n.astype(np.complex128))
                    # NaN where both are NaN (a fully masked row) is agreement
                    diff = np.where(np.isnan(r) & np.isnan(n), 0, diff)
                    worst = max(worst, float(np.nan_to_num(diff, nan=np.inf).max(initial=0))
                                / scale)
                elif not np.array_equal(r, n):
                    worst = float("inf")
            row["max_rel_diff"] = worst
            eps = 1e-5 if name.startswith("scan") else 1e-6
            row["agree"] = bool(worst <= eps)
            row["launches"] = sum(row["raw_launches"].values())
        except Exception:
            row["error"] = traceback.format_exc()
        finally:
            _launch.set_path("auto")
        rows.append(row)
        print(f"{name:24s} launches {row.get('launches')!s:>4}  paths raw={row.get('raw_paths')} "
              f"numba={row.get('numba_paths')}  agree={row.get('agree')} "
              f"max_rel_diff={row.get('max_rel_diff')}" + ("\n" + row["error"] if "error" in row
                                                           else ""), flush=True)
    return rows


def _gpu_time(cupy, fn, repeats, inner):
    """Median seconds per call, the device synchronised around each block of ``inner``."""
    for _ in range(3 if repeats > 1 else 0):  # warm-up (none in the smoke run)
        fn()
    cupy.cuda.Device().synchronize()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        cupy.cuda.Device().synchronize()
        samples.append((time.perf_counter() - start) / inner)
    return float(np.median(samples))


def launch_cost(cupy, smoke):
    """Section 3: host us per launch of an empty 5-array kernel."""
    from numba import config

    from nnkit._ext import _launch

    repeats, inner = (1, 1) if smoke else (20, 200)
    arrays = [cupy.ones(256, cupy.float32) for _ in range(5)]
    rows = []

    def row(case, fn):
        t = _gpu_time(cupy, fn, repeats, inner)
        rows.append({"section": "launch", "case": case, "us_per_launch": t * 1e6})
        print(f"launch  {case:58s} {t * 1e6:8.2f} us", flush=True)

    for path in ("raw", "numba"):
        _launch.set_path(path)
        row(f"launch(), path {path}", lambda: _launch.launch(_touch, 2, 128, *arrays))
    _launch.set_path("auto")
    _launch.launch(_touch, 2, 128, *arrays)
    if not config.ENABLE_CUDASIM:
        nd = _launch._cupy_ndarray()
        key = (_touch, *[(a.dtype, a.ndim, a.flags.c_contiguous, a.flags.f_contiguous)
                         if isinstance(a, nd) else a.__class__ for a in arrays])
        entry = _launch._entries[key]
        rows.append({"section": "launch", "case": "chosen path", "path": entry.path})
        if entry.function is not None:
            params = _launch.pack_args([_touch.typeof_pyval(a) for a in arrays], arrays)
            row("raw floor: loaded function, arguments packed once",
                lambda: entry.function((2,), (128,), params, 0))
    row("Numba dispatcher, CuPy arguments (before: what nnkit paid)",
        lambda: _touch[2, 128](*arrays))
    return rows


def op_costs(cupy, smoke):
    """Section 4: one small call of a few ops on each path."""
    from nnkit import kernels as K
    from nnkit._ext import _launch

    rng = np.random.default_rng(9)
    repeats, inner = (1, 1) if smoke else (15, 10)
    x = cupy.asarray(rng.standard_normal((2, 8) if smoke else (64, 256)).astype(np.float32))
    w, b = cupy.ones(x.shape[1], np.float32), cupy.zeros(x.shape[1], np.float32)
    T, B, D, H = (3, 2, 3, 4) if smoke else (64, 32, 64, 128)
    xs = cupy.asarray(rng.standard_normal((T, B, D)).astype(np.float32))
    lstm_w = [cupy.asarray(rng.standard_normal(s).astype(np.float32) * 0.1)
              for s in ((4 * H, D), (4 * H, H), (4 * H,), (4 * H,))]
    a = cupy.asarray(rng.uniform(0.5, 1, (1, 16, 1)).astype(np.float32))
    ops = {
        "softmax_forward": lambda: K.softmax_forward(x),
        "layer_norm_forward": lambda: K.layer_norm_forward(x, w, b, (x.shape[1],)),
        f"lstm_forward T={T} (1 launch)": lambda: K.lstm_forward(xs, None, None, *lstm_w,
                                                                   keep_cache=False),
        "linear_scan_forward (1, 16, 1)": lambda: K.linear_scan_forward(a, a),
    }
    rows = []
    for name, fn in ops.items():
        row = {"section": "ops", "case": name}
        for path in ("raw", "numba"):
            _launch.set_path(path)
            row[f"{path}_us"] = _gpu_time(cupy, fn, repeats, inner) * 1e6
        _launch.set_path("auto")
        row["numba/raw"] = row["numba_us"] / row["raw_us"]
        rows.append(row)
        print(f"op      {name:40s} raw {row['raw_us']:9.1f} us  numba {row['numba_us']:9.1f} us"
              f"  numba/raw {row['numba/raw']:.2f}", flush=True)
    return rows


def run_pytest(seconds):
    """Section 5: the cuda-marked tests with the raw path strict, for at most ``seconds``."""
    env = dict(os.environ, NNKIT_LAUNCH_PATH="raw")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, "-m", "pytest", "-m", "cuda", "-x", "-q", "-p", "no:cacheprovider"]
    try:
        import xdist  # noqa: F401

        cmd += ["-n", str(min(8, os.cpu_count() or 1))]
    except ImportError:
        pass
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True,
                              timeout=seconds)
        tail, rc = (proc.stdout + proc.stderr)[-3000:], proc.returncode
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout or ""
        tail = (out.decode() if isinstance(out, bytes) else out)[-3000:]
        rc = "timeout"
    row = {"section": "pytest", "command": "NNKIT_LAUNCH_PATH=raw " + " ".join(cmd[1:]),
           "rc": rc, "seconds": time.perf_counter() - start, "tail": tail}
    print(f"pytest  rc={rc} in {row['seconds']:.0f} s\n{tail[-1500:]}", flush=True)
    return [row]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pytest", type=float, default=0, metavar="SECONDS",
                        help="also run pytest -m cuda on the raw path, at most SECONDS")
    parser.add_argument("--out", default=os.environ.get("OUT"),
                        help="folder for gpu_launch_check.json (default: $OUT)")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny sizes, one timed call (the simulator and the CuPy stand-in)")
    args = parser.parse_args(argv)
    import cupy
    from numba import config

    print(f"numba {__import__('numba').__version__}, cupy {cupy.__version__}, simulator "
          f"{bool(config.ENABLE_CUDASIM)}", flush=True)
    if not config.ENABLE_CUDASIM:
        dev = cupy.cuda.Device()
        print(f"device {cupy.cuda.runtime.getDeviceProperties(dev.id)['name'].decode()}, "
              f"cc {dev.compute_capability}", flush=True)
    rows = []
    for section in (check_paths, launch_cost, op_costs):
        start = time.perf_counter()
        try:
            rows += section(cupy, args.smoke)
        except Exception:
            rows.append({"section": section.__name__, "error": traceback.format_exc()})
            print(rows[-1]["error"], flush=True)
        print(f"-- {section.__name__}: {time.perf_counter() - start:.1f} s", flush=True)
    if args.pytest:
        rows += run_pytest(args.pytest)
    failed = [r for r in rows if "error" in r or r.get("agree") is False]
    print(f"{len(failed)} problem(s): {[r.get('case', r['section']) for r in failed]}"
          if failed else "all paths agree", flush=True)
    if args.out:
        path = Path(args.out) / "gpu_launch_check.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(rows, indent=1, default=str))
        print(f"wrote {path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
