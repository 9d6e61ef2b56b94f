"""nnkit's Numba CUDA kernels on a real NVIDIA GPU, against torch CUDA and the memory roof.

Run on a machine with an NVIDIA GPU, numba-cuda, CuPy and (for the ratios) torch::

    python benchmarks/bench_gpu.py [--quick | --smoke] [--json PATH]

Every section times nnkit on CuPy arrays and torch on CUDA tensors in the same process, the
device synchronised around each timed block (so launch overhead counts, as it does for a
user). The roofs are measured first in the same run: device-to-device copy bandwidth (bytes
read + written) and the float32 matrix-product rate (CuPy/cuBLAS). Sections:

- softmax / layer_norm (4096 x 4096 float32): time vs the bandwidth bound, vs torch;
- conv2d 3x3 padding 1 on the convolution issue's shapes: forward and forward+backward vs
  torch (cuDNN), achieved GFLOP/s;
- linear_scan (16, 4096, 256) and one sequence (1, 2^23, 1), float32 and complex64: forward
  and backward vs the bandwidth bound (a, b, h once each; backward dh, a, h, h0 read, da, db
  written), vs torch's cumsum-of-log form;
- LSTM / GRU / RNN over the recurrent issue's shapes, forward and forward+backward, vs
  torch.nn.LSTM/GRU/RNN (cuDNN);
- attention: the fused attention kernels, forward and forward+backward, causal and not, vs
  torch's F.scaled_dot_product_attention;
- launch: host time per launch of an empty kernel by each launch path (nnkit's ``launch()``,
  Numba's dispatcher, its compiled kernel, Numba's PTX through CuPy, CuPy's own);
- steps: one training step of an MLP, a CNN, an encoder layer and the digits ViT (batch
  128): time, Numba launches and GPU kernels per step; the ViT against its torch twin;
- hopfield: recall of stored patterns on CuPy states (synchronous and asynchronous) vs the
  CPU.
- selective_scan: Mamba's S6 scan (4, 1536, 16, 2048) float32, forward and forward+backward
  vs the copy bandwidth (u, delta, B, C, z read, y written; the backward's reads and
  writes too) and vs torch's reference (bench_selective_scan.py's torch_selective_scan_ref);
- delta_rule: the delta rule (4, 8, 4096, 64) float32, chunked and recurrent, forward and
  forward+backward, vs the same chunked algorithm in torch (bench_linear_attention.py's
  torch_delta_rule_chunk).

A section that fails prints its error and the rest go on. ``--smoke`` runs every section
once at tiny shapes: a check that the script works (tests/test_gpu_stand_in.py runs it
without a GPU, on the CuPy stand-in under Numba's simulator), not a measurement.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
import traceback

import numpy as np
from numba import cuda  # a module global: the simulator swaps it inside kernels


def _sync():
    import cupy

    cupy.cuda.Device().synchronize()
    torch = _torch()
    if torch is not None:  # a CPU-only torch has no CUDA to wait for
        torch.cuda.synchronize()


_SMOKE = False  # set by run(size="smoke"): one timed call, no warm-up


def gpu_time(fn, repeats=20, inner=5, warmup=3):
    """Median seconds per call of fn(), the device synchronised around each block."""
    if _SMOKE:
        repeats, inner, warmup = 1, 1, 0
    for _ in range(warmup):
        fn()
    _sync()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        _sync()
        samples.append((time.perf_counter() - start) / inner)
    return float(np.median(samples))


def _torch():
    try:
        import torch

        return torch if torch.cuda.is_available() else None
    except ImportError:
        return None


# ---- roofs ----------------------------------------------------------------------------------

def roofs(size):
    import cupy

    n = {"full": 1 << 28, "quick": 1 << 26, "smoke": 1 << 12}[size]  # bytes per buffer
    src = cupy.random.random(n // 4, dtype=cupy.float32)
    dst = cupy.empty_like(src)
    t_copy = gpu_time(lambda: cupy.copyto(dst, src), repeats=10)
    m = {"full": 8192, "quick": 4096, "smoke": 32}[size]
    a = cupy.random.random((m, m), dtype=cupy.float32)
    b = cupy.random.random((m, m), dtype=cupy.float32)
    t_mm = gpu_time(lambda: a @ b, repeats=5, inner=2)
    return {"copy_GBps": 2 * n / t_copy / 1e9, "sgemm_TFLOPs": 2 * m ** 3 / t_mm / 1e12}


# ---- sections -------------------------------------------------------------------------------

def softmax_rows(roof, size):
    import cupy

    from nnkit.kernels import layer_norm_forward, softmax_backward, softmax_forward

    torch = _torch()
    shape = {"full": (4096, 4096), "quick": (2048, 2048), "smoke": (4, 33)}[size]
    x = cupy.random.standard_normal(shape, dtype=cupy.float32)
    dy = cupy.random.standard_normal(shape, dtype=cupy.float32)
    w = cupy.ones(shape[1], cupy.float32)
    bias = cupy.zeros(shape[1], cupy.float32)
    _, cache = softmax_forward(x)
    nbytes = x.nbytes
    cases = {
        "softmax fwd": (lambda: softmax_forward(x), 2 * nbytes,
                        (lambda tx: (lambda: torch.softmax(tx, -1))) if torch else None),
        "softmax bwd": (lambda: softmax_backward(dy, cache), 3 * nbytes, None),
        "layer_norm fwd": (lambda: layer_norm_forward(x, w, bias, (shape[1],)), 2 * nbytes,
                           (lambda tx: (lambda: torch.nn.functional.layer_norm(
                               tx, (shape[1],)))) if torch else None),
    }
    rows = []
    tx = torch.as_tensor(x, device="cuda") if torch else None
    for name, (fn, moved, torch_fn) in cases.items():
        t = gpu_time(fn)
        row = {"section": "rows", "case": f"{name} {shape} f32", "nnkit_ms": t * 1e3,
               "pct_of_bandwidth": 100 * moved / t / 1e9 / roof["copy_GBps"]}
        if torch_fn is not None:
            row["torch_ms"] = gpu_time(torch_fn(tx)) * 1e3
            row["torch/nnkit"] = row["torch_ms"] / row["nnkit_ms"]
        rows.append(row)
    return rows


def conv(roof, size):
    import cupy

    from nnkit.kernels import conv as K

    torch = _torch()
    shapes = {"full": [(32, 3, 32, 32, 16), (32, 16, 32, 32, 32), (8, 64, 56, 56, 64)],
              "smoke": [(2, 3, 6, 5, 4)]}
    shapes["quick"] = shapes["full"][:2]
    rows = []
    for N, C, H, W, Kc in shapes[size]:
        x = cupy.random.standard_normal((N, C, H, W), dtype=cupy.float32)
        w = cupy.random.standard_normal((Kc, C, 3, 3), dtype=cupy.float32) * 0.1
        b = cupy.random.standard_normal(Kc, dtype=cupy.float32)
        y, cache = K.conv2d_forward(x, w, b, padding=1)
        dy = cupy.random.standard_normal(y.shape, dtype=cupy.float32)

        def fwd(x=x, w=w, b=b):
            return K.conv2d_forward(x, w, b, padding=1)

        def fwd_bwd(x=x, w=w, b=b, dy=dy):
            _, c = K.conv2d_forward(x, w, b, padding=1)
            return K.conv2d_backward(dy, c)

        flops = 2 * N * Kc * H * W * C * 9
        t_f, t_fb = gpu_time(fwd), gpu_time(fwd_bwd)
        row = {"section": "conv2d", "case": f"(N,C,H,W,K)={(N, C, H, W, Kc)}",
               "fwd_ms": t_f * 1e3, "fwd_bwd_ms": t_fb * 1e3,
               "fwd_TFLOPs": flops / t_f / 1e12, "fwd_bwd_TFLOPs": 3 * flops / t_fb / 1e12,
               "pct_of_sgemm": 100 * flops / t_f / 1e12 / roof["sgemm_TFLOPs"]}
        if torch:
            tx = torch.as_tensor(x, device="cuda").requires_grad_()
            tw = torch.as_tensor(w, device="cuda").requires_grad_()
            tb = torch.as_tensor(b, device="cuda").requires_grad_()
            tdy = torch.as_tensor(dy, device="cuda")

            def torch_f(tx=tx, tw=tw, tb=tb):
                with torch.no_grad():
                    return torch.nn.functional.conv2d(tx, tw, tb, padding=1)

            def torch_fb(tx=tx, tw=tw, tb=tb, tdy=tdy):
                y = torch.nn.functional.conv2d(tx, tw, tb, padding=1)
                torch.autograd.grad(y, (tx, tw, tb), tdy)

            row["torch_fwd_ms"] = gpu_time(torch_f) * 1e3

            row["torch_fwd_bwd_ms"] = gpu_time(torch_fb) * 1e3
            row["torch/nnkit fwd"] = row["torch_fwd_ms"] / row["fwd_ms"]
            row["torch/nnkit fwd+bwd"] = row["torch_fwd_bwd_ms"] / row["fwd_bwd_ms"]
        rows.append(row)
    return rows


def scan(roof, size):
    import cupy

    from nnkit.kernels import scan as K

    torch = _torch()
    shapes = {"full": [(16, 4096, 256), (1, 1 << 23, 1)],
              "quick": [(4, 4096, 256), (1, 1 << 20, 1)],
              "smoke": [(2, 9, 3), (1, 40, 1)]}[size]
    rows = []
    for shape, dtype in itertools.product(shapes, (cupy.float32, cupy.complex64)):
        mag = cupy.random.uniform(0.5, 0.99, shape)
        a = (mag * (cupy.exp(1j * cupy.random.uniform(0, 6.28, shape))
                    if dtype == cupy.complex64 else mag)).astype(dtype)
        b = cupy.random.standard_normal(shape).astype(dtype)
        h0 = cupy.zeros((shape[0], shape[2]), dtype)
        dh = cupy.random.standard_normal(shape).astype(dtype)
        _, cache = K.linear_scan_forward(a, b, h0)
        out = cupy.empty_like(a)
        grads = (cupy.empty_like(a), cupy.empty_like(a), cupy.empty_like(h0))
        t_f = gpu_time(lambda a=a, b=b, h0=h0, out=out: K.linear_scan_forward(a, b, h0,
                                                                              out=out))
        t_b = gpu_time(lambda dh=dh, cache=cache, g=grads: K.linear_scan_backward(
            dh, cache, out=g))
        size = a.nbytes
        bound_f = 3 * size / (roof["copy_GBps"] * 1e9)  # a, b read; h written
        bound_b = 5 * size / (roof["copy_GBps"] * 1e9)  # dh, a, h read; da, db written
        row = {"section": "linear_scan", "case": f"{shape} {np.dtype(dtype).name}",
               "fwd_ms": t_f * 1e3, "bwd_ms": t_b * 1e3,
               "fwd_pct_of_bound": 100 * bound_f / t_f, "bwd_pct_of_bound": 100 * bound_b / t_b}
        if torch and dtype == cupy.float32:
            ta, tb = torch.as_tensor(a, device="cuda"), torch.as_tensor(b, device="cuda")

            def cumsum_log(ta=ta, tb=tb):  # h_t = A_t sum_s b_s / A_s with A_t = prod a
                log_a = torch.cumsum(torch.log(ta), dim=1)
                return torch.exp(log_a) * torch.cumsum(tb * torch.exp(-log_a), dim=1)

            row["torch_cumsum_log_ms"] = gpu_time(cumsum_log) * 1e3
            row["torch/nnkit fwd"] = row["torch_cumsum_log_ms"] / row["fwd_ms"]
        rows.append(row)
    rows.append(_scan_call_cost(K))
    return rows


def _scan_call_cost(K):
    """Forward and backward of a (1, 16, 1) scan: almost no GPU work, so the time per call
    is the host's (validation, argument conversion, buffers, the launch)."""
    import cupy

    a = cupy.full((1, 16, 1), 0.5, cupy.float32)
    _, cache = K.linear_scan_forward(a, a)
    return {"section": "linear_scan", "case": "(1, 16, 1) float32: the cost of a call",
            "fwd_ms": gpu_time(lambda: K.linear_scan_forward(a, a)) * 1e3,
            "bwd_ms": gpu_time(lambda: K.linear_scan_backward(a, cache)) * 1e3}


def selective_scan(roof, size):
    """Mamba's S6 scan (``nnkit.kernels.selective_scan``: the CUDA twin, one thread per
    (batch, dim) row) on bench_selective_scan.py's problem (B and C varying (batch, N, L), z,
    D, delta_bias, softplus), forward and forward+backward: the time, the share of the copy
    bandwidth (forward: u, delta, B, C, z read, y written; forward+backward: that, then dy,
    u, delta, B, C, z read and du, ddelta, dB, dC, dz written by the backward), and torch's
    reference (``torch_selective_scan_ref``, the full (batch, dim, L, N) tensors and a loop
    over L) on the same inputs."""
    import cupy
    from bench_selective_scan import QUICK_SHAPE, SHAPE, problem, torch_selective_scan_ref

    from nnkit.kernels import selective_scan as K

    torch = _torch()
    shape = {"full": SHAPE, "quick": QUICK_SHAPE, "smoke": (1, 2, 3, 9)}[size]
    args = {k: cupy.asarray(v) for k, v in problem(shape).items()}
    dy = cupy.ones_like(args["u"])

    def forward():
        return K.selective_scan_forward(**args, delta_softplus=True)

    def forward_backward():
        return K.selective_scan_backward(dy, forward()[1])

    big, small = args["u"].nbytes, args["B"].nbytes  # (batch, dim, L) and (batch, N, L)
    moved = {"fwd": 4 * big + 2 * small, "fwd+bwd": 11 * big + 6 * small}
    theirs = _torch_scan_ref(torch, args, torch_selective_scan_ref) if torch else {}
    rows = []
    for what, fn in (("fwd", forward), ("fwd+bwd", forward_backward)):
        t = gpu_time(fn, repeats=10, inner=2)
        row = {"section": "selective_scan", "case": f"(batch,dim,N,L)={shape} f32 {what}",
               "nnkit_ms": t * 1e3,
               "pct_of_bandwidth": 100 * moved[what] / t / 1e9 / roof["copy_GBps"]}
        if what in theirs:
            row["torch_ref_ms"] = gpu_time(theirs[what], repeats=3, inner=1, warmup=1) * 1e3
            row["torch/nnkit"] = row["torch_ref_ms"] / row["nnkit_ms"]
        rows.append(row)
    return rows


def _torch_scan_ref(torch, args, ref):
    """{"fwd", "fwd+bwd"}: torch's reference scan on CUDA views of ``args`` (the gradient of
    sum(y), as nnkit's backward of dy = ones)."""
    leaves = {k: torch.as_tensor(v, device="cuda") for k, v in args.items()}

    def forward():
        with torch.no_grad():
            return ref(**leaves, delta_softplus=True)

    def forward_backward():
        grads = {k: v.detach().requires_grad_() for k, v in leaves.items()}
        ref(**grads, delta_softplus=True).sum().backward()

    return {"fwd": forward, "fwd+bwd": forward_backward}


def delta_rule(roof, size):
    """The delta rule (``F.delta_rule``'s kernels, ``nnkit.kernels.linear_attention``) on
    bench_linear_attention.py's problem (k L2-normalised, beta in (0, 1), chunks of 64):
    the chunked form (CuPy array calls: GEMMs inside chunks) and the recurrent one (the CUDA
    kernel, one thread per (batch, head, value column)), forward and forward+backward (every
    gradient of sum(o * r)), against the same chunked algorithm in torch
    (``torch_delta_rule_chunk``, autograd for the backward) on the same inputs."""
    import cupy
    from bench_linear_attention import CHUNK, QUICK_SHAPE, SHAPE, problem
    from bench_linear_attention import torch_delta_rule_chunk as ref

    torch = _torch()
    shape = {"full": SHAPE, "quick": QUICK_SHAPE, "smoke": (1, 2, 9, 3)}[size]
    args = {k: cupy.asarray(v) for k, v in problem(shape).items()}
    theirs = _torch_delta_chunk(torch, args, ref, CHUNK) if torch else {}
    torch_ms = {what: gpu_time(fn, repeats=5, inner=1, warmup=1) * 1e3
                for what, fn in theirs.items()}
    rows = []
    for mode in ("chunk", "recurrent"):
        for what, fn in zip(("fwd", "fwd+bwd"), _nnkit_delta(args, mode, CHUNK), strict=True):
            row = {"section": "delta_rule", "case": f"(B,H,T,d)={shape} f32 {mode} {what}",
                   "nnkit_ms": gpu_time(fn, repeats=10, inner=2) * 1e3}
            if what in torch_ms:
                row["torch_chunk_ms"] = torch_ms[what]
                row["torch/nnkit"] = torch_ms[what] / row["nnkit_ms"]
            rows.append(row)
    return rows


def _nnkit_delta(args, mode, chunk):
    """(forward, forward_backward) of the delta rule by ``mode`` on CuPy ``args``."""
    from nnkit.kernels import linear_attention_backward, linear_attention_forward

    q, k, v, beta, r = (args[n] for n in ("q", "k", "v", "beta", "r"))
    scale = float(q.shape[-1]) ** -0.5

    def forward():
        return linear_attention_forward(q, k, v, beta, scale=scale, delta=True, mode=mode,
                                        chunk_size=chunk)

    def forward_backward():
        return linear_attention_backward((r, None), forward()[1])

    return forward, forward_backward


def _torch_delta_chunk(torch, args, ref, chunk):
    """{"fwd", "fwd+bwd"}: torch's chunked delta rule on CUDA views of ``args``."""
    leaves = {k: torch.as_tensor(v, device="cuda") for k, v in args.items()}
    r = leaves.pop("r")

    def forward():
        with torch.no_grad():
            return ref(**leaves, chunk_size=chunk)

    def forward_backward():
        grads = {k: v.detach().requires_grad_() for k, v in leaves.items()}
        o, _ = ref(**grads, chunk_size=chunk)
        (o * r).sum().backward()

    return {"fwd": forward, "fwd+bwd": forward_backward}


def recurrent(roof, size):
    import cupy

    from nnkit.kernels import recurrent as K

    torch = _torch()
    shapes = {"full": [(128, 32, 64, 128), (512, 16, 128, 256)], "quick": [(128, 32, 64, 128)],
              "smoke": [(3, 2, 4, 5)]}[size]
    fns = {"lstm": (K.lstm_forward, K.lstm_backward, 4), "gru": (K.gru_forward,
                                                                 K.gru_backward, 3),
           "rnn": (K.rnn_forward, K.rnn_backward, 1)}
    rows = []
    for T, B, D, H in shapes:
        for cell, (fwd, bwd, G) in fns.items():
            s = 1 / np.sqrt(H)
            x = cupy.random.standard_normal((T, B, D), dtype=cupy.float32)
            w_ih = cupy.random.uniform(-s, s, (G * H, D)).astype(cupy.float32)
            w_hh = cupy.random.uniform(-s, s, (G * H, H)).astype(cupy.float32)
            b_ih = cupy.random.uniform(-s, s, G * H).astype(cupy.float32)
            b_hh = cupy.random.uniform(-s, s, G * H).astype(cupy.float32)
            dy = cupy.random.standard_normal((T, B, H), dtype=cupy.float32)
            states = (None, None) if cell == "lstm" else (None,)

            def run_fwd(x=x, w=(w_ih, w_hh, b_ih, b_hh), fwd=fwd, states=states):
                return fwd(x, *states, *w)

            def run_fwd_bwd(run_fwd=run_fwd, bwd=bwd, dy=dy, cell=cell):
                _, cache = run_fwd()
                extra = (None, None) if cell == "lstm" else (None,)
                return bwd((dy, *extra), cache)

            flops = 2 * T * B * G * H * (D + H)
            t_f, t_fb = gpu_time(run_fwd, repeats=10, inner=2), gpu_time(run_fwd_bwd,
                                                                            repeats=10, inner=2)
            row = {"section": "recurrent", "case": f"{cell} (T,B,D,H)={(T, B, D, H)}",
                   "fwd_ms": t_f * 1e3, "fwd_bwd_ms": t_fb * 1e3,
                   "fwd_GFLOPs": flops / t_f / 1e9}
            if torch:
                mod = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU, "rnn": torch.nn.RNN}[cell]
                net = mod(D, H).cuda()
                tx = torch.as_tensor(x, device="cuda")
                tdy = torch.as_tensor(dy, device="cuda")
                with torch.no_grad():
                    row["torch_fwd_ms"] = gpu_time(lambda net=net, tx=tx: net(tx),
                                                   repeats=10, inner=2) * 1e3

                def torch_fb(net=net, tx=tx, tdy=tdy):
                    net(tx)[0].backward(tdy)

                row["torch_fwd_bwd_ms"] = gpu_time(torch_fb, repeats=10, inner=2) * 1e3
                row["torch/nnkit fwd"] = row["torch_fwd_ms"] / row["fwd_ms"]
                row["torch/nnkit fwd+bwd"] = row["torch_fwd_bwd_ms"] / row["fwd_bwd_ms"]
            rows.append(row)
    return rows


def attention(roof, size):
    """Fused attention (float32, forward and forward+backward, causal and not) against
    torch's F.scaled_dot_product_attention on the same inputs (bench_attention_gpu.py's
    functions and shapes; TFLOP/s counts the flash-attention work, 4 B H T^2 d forward,
    halved when causal, 3.5 times that forward+backward)."""
    import cupy
    from bench_attention_gpu import SHAPES, _nnkit_fns, _torch_fns

    torch = _torch()
    if size == "smoke" and _simulated():
        from nnkit._ext import attention_cuda  # the simulator: the tests' small tiles

        attention_cuda.block_m, attention_cuda.block_n = 8, 8
        attention_cuda.threads_y, attention_cuda.threads_x = 2, 4
    shapes = {"full": SHAPES, "quick": SHAPES[:2], "smoke": [(1, 2, 12, 8)]}[size]
    rows = []
    for shape, causal in itertools.product(shapes, (False, True)):
        B, H, T, d = shape
        ours = _nnkit_fns(cupy, shape, causal)
        theirs = _torch_fns(torch, shape, causal) if torch else (None, None)
        for what, fn, torch_fn, work in zip(("fwd", "fwd+bwd"), ours, theirs, (1.0, 3.5),
                                            strict=True):
            flops = 4 * B * H * T * T * d * (0.5 if causal else 1.0) * work
            row = {"section": "attention", "case": f"{shape} causal={causal} {what}",
                   "nnkit_ms": gpu_time(fn) * 1e3}
            row["nnkit_TFLOPs"] = flops / row["nnkit_ms"] / 1e9
            if torch_fn is not None:
                row["torch_ms"] = gpu_time(torch_fn) * 1e3
                row["torch/nnkit"] = row["torch_ms"] / row["nnkit_ms"]
            rows.append(row)
    return rows


def _simulated() -> bool:
    from numba import config

    return bool(config.ENABLE_CUDASIM)


def hopfield(roof, size):
    """Hopfield recall on CuPy states, synchronous and asynchronous, against the CPU
    (bench_hopfield_gpu.py)."""
    from bench_hopfield_gpu import run as run_hopfield

    return [{"section": "hopfield", **row} for row in run_hopfield(size)]


def launch_overhead(roof, size):
    """Host time per launch of one empty 5-array kernel, by each way of launching it:

    - nnkit's ``launch()`` (``nnkit._ext._launch``: the raw path on a GPU with CuPy arrays);
    - the Numba dispatcher with CuPy arguments (it reads ``__cuda_array_interface__`` and
      types the arguments at every launch), with Numba device arrays, and with CuPy arrays
      converted to device arrays in the call (what the retired ``launch_views`` cost per call);
    - Numba's compiled kernel for the signature launched directly (no dispatch, no typing);
    - the same kernel's PTX (``cuda.compile_ptx``) loaded by CuPy's ``RawModule`` and launched
      with its arguments packed once (Numba's array ABI: meminfo, parent, nitems, itemsize,
      data, shape, strides per array);
    - a CuPy ``RawKernel`` of the same body in CUDA C, and a CuPy ufunc: CuPy's own floor.
    """
    import cupy
    from numba import config

    @cuda.jit
    def touch(a, b, c, d, e):
        i = cuda.grid(1)
        if i < a.shape[0]:
            a[i] = b[i] + c[i] + d[i] + e[i]

    n = 256
    arrays = [cupy.ones(n, cupy.float32) for _ in range(5)]
    device = [cuda.as_cuda_array(x, sync=False) for x in arrays]
    from nnkit._ext._launch import launch

    ways = {
        "nnkit launch() (its chosen path)": lambda: launch(touch, 2, 128, *arrays),
        "numba dispatcher, cupy args": lambda: touch[2, 128](*arrays),
        "numba dispatcher, numba device args": lambda: touch[2, 128](*device),
        "numba dispatcher, cupy converted in the call": lambda: touch[2, 128](
            *[cuda.as_cuda_array(x, sync=False) for x in arrays]),
    }
    if not config.ENABLE_CUDASIM:  # compiled kernels and PTX exist only on a real device
        ways.update(_compiled_launches(touch, arrays, device))
    rows = []
    for name, fn in ways.items():
        t = gpu_time(fn, repeats=20, inner=50)
        rows.append({"section": "launch", "case": name, "us_per_launch": t * 1e6})
    t = gpu_time(lambda: cupy.add(arrays[0], arrays[1], out=arrays[2]), repeats=20, inner=50)
    rows.append({"section": "launch", "case": "cupy ufunc add (out=)", "us_per_launch": t * 1e6})
    return rows


def _compiled_launches(touch, arrays, device):
    """{name: launch} for the launch paths below Numba's dispatcher (see launch_overhead)."""
    import re
    import tempfile

    import cupy
    from numba import float32, types

    sig = types.void(*[float32[::1]] * 5)
    touch.compile(sig)
    kernel = touch.overloads[sig.args]
    stream = cuda.default_stream()

    ptx, _ = cuda.compile_ptx(touch.py_func, sig, cc=cuda.get_current_device().compute_capability)
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as fh:
        fh.write(ptx)
    entry = re.search(r"\.entry\s+([\w$.]+)\s*\(", ptx).group(1)
    raw_numba = cupy.RawModule(path=fh.name).get_function(entry)
    zero, n, item = np.uint64(0), np.int64(arrays[0].size), np.int64(4)
    packed = tuple(v for x in arrays for v in (zero, zero, n, item, x, n, item))
    raw_c = cupy.RawKernel(r"""
    extern "C" __global__ void touch(float* a, const float* b, const float* c,
                                     const float* d, const float* e, long long n) {
        long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
        if (i < n) a[i] = b[i] + c[i] + d[i] + e[i];
    }""", "touch")
    c_args = (*arrays, n)
    arrays[0].fill(0)
    raw_numba((2,), (128,), packed)
    if not bool((arrays[0] == 4).all()):  # the hand-packed ABI must compute the kernel
        raise RuntimeError("Numba PTX launched through RawModule computed a wrong result")
    return {
        "numba compiled kernel .launch, numba device args":
            lambda: kernel.launch(device, (2, 1, 1), (128, 1, 1), stream, 0),
        "numba PTX via cupy RawModule, args packed once": lambda: raw_numba((2,), (128,), packed),
        "cupy RawKernel (CUDA C)": lambda: raw_c((2,), (128,), c_args),
    }


def training_steps(roof, size):
    """One training step (forward, cross-entropy, backward, optimizer) of four models on CuPy:
    the time, the Numba launches, and every kernel the GPU ran (CUPTI through torch's
    profiler: CuPy's and cuBLAS's too); the ViT also against its torch twin (torch eager)."""
    import cupy

    import nnkit.functional as F

    batch, small = (2, True) if size == "smoke" else (128, False)
    rng = np.random.default_rng(0)
    images = rng.standard_normal((batch, 1, 8, 8)).astype(np.float32)
    labels = rng.integers(0, 10, batch)
    rows = []
    models = _step_models(images, rng, small)
    for name, (build, X, make_opt) in models.items():
        if small and name not in ("mlp", "cnn"):  # the simulator takes minutes over attention
            continue
        model = build().to("cuda")
        opt = make_opt(model.parameters())
        Xg, yg = cupy.asarray(X), cupy.asarray(labels)

        def step(model=model, opt=opt, Xg=Xg, yg=yg):
            opt.zero_grad()
            F.cross_entropy(model(Xg), yg).backward()
            opt.step()

        row = {"section": "steps", "case": f"{name} {tuple(X.shape)}",
               "step_ms": gpu_time(step, repeats=10, inner=3) * 1e3,
               "numba_launches": _numba_launches(step), "gpu_kernels": _gpu_kernels(step)}
        if name == "vit" and not small:
            row.update(_torch_vit_step(images, labels, step_ms=row["step_ms"]))
        rows.append(row)
    return rows


def _step_models(images, rng, small):
    """{name: (builder, input, optimizer)}: an MLP, a CNN, an encoder layer and the digits ViT
    (``small``: narrow versions, for the smoke run under the simulator)."""
    import nnkit as nk
    from nnkit.training import make_digits_vit

    nn, optim = nk.nn, nk.optim
    width, heads, depth = (8, 2, 1) if small else (64, 8, 3)
    tokens = rng.standard_normal((len(images), 17, width)).astype(np.float32)

    def cnn():
        return nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Flatten(), nn.Linear(16 * 2 * 2, 10))

    def encoder():
        return nn.Sequential(nn.TransformerEncoderLayer(width, heads, 2 * width, dropout=0.0,
                                                        batch_first=True),
                             nn.Flatten(), nn.Linear(17 * width, 10))

    def vit():
        return make_digits_vit(0, dim=width, heads=heads, depth=depth, mlp_dim=2 * width)

    return {
        "mlp": (lambda: nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)),
                images.reshape(len(images), 64), lambda ps: optim.Adam(ps, lr=1e-3)),
        "cnn": (cnn, images, lambda ps: optim.SGD(ps, lr=0.05, momentum=0.9)),
        "encoder layer": (encoder, tokens, lambda ps: optim.AdamW(ps, lr=1e-3)),
        "vit": (vit, images, lambda ps: optim.AdamW(ps, lr=1e-3)),
    }


def _numba_launches(step) -> int:
    """Numba CUDA launches made by one call of ``step`` (nnkit's launch counter)."""
    from nnkit._ext._launch import count_launches

    with count_launches() as counts:
        step()
    return sum(counts.values())


def _gpu_kernels(step):
    """Kernels the GPU ran during one call of ``step`` (CUPTI, any library), or None."""
    torch = _torch()
    if torch is None:
        return None
    from torch.profiler import ProfilerActivity, profile

    _sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        _sync()
    return sum(e.count for e in prof.key_averages()
               if e.device_type.name == "CUDA" and not e.key.startswith(("Memcpy", "Memset")))


def _torch_vit_step(images, labels, step_ms):
    """The digits ViT's torch twin (bench_vit.py), same weights, one AdamW step on CUDA."""
    torch = _torch()
    if torch is None:
        return {}
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
    from bench_vit import _torch_vit

    from nnkit.training import DIGITS_VIT, make_digits_vit

    twin = _torch_vit(torch, DIGITS_VIT).cuda()
    twin.load_state_dict({k: torch.tensor(v) for k, v in make_digits_vit(0).state_dict().items()})
    opt = torch.optim.AdamW(twin.parameters(), lr=1e-3)
    X = torch.as_tensor(images, device="cuda")
    y = torch.as_tensor(labels, device="cuda")

    def step():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(twin(X), y).backward()
        opt.step()

    t = gpu_time(step, repeats=10, inner=3) * 1e3
    return {"torch_step_ms": t, "torch/nnkit": t / step_ms, "torch_gpu_kernels": _gpu_kernels(step)}


SECTIONS = {"launch": launch_overhead, "rows": softmax_rows, "conv": conv, "scan": scan,
            "recurrent": recurrent, "attention": attention, "steps": training_steps,
            "hopfield": hopfield, "selective_scan": selective_scan, "delta_rule": delta_rule}


def _fmt(v):
    return f"{v:.3g}" if isinstance(v, float) else str(v)


def _device_name():
    """The GPU's name; SystemExit with a clear message when there is none (nnkit bench
    reports that and goes on)."""
    try:
        import cupy

        if not cuda.is_available():
            raise RuntimeError("numba.cuda finds no GPU")
        return cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    except Exception as exc:  # no GPU, no CuPy: nothing to measure
        raise SystemExit(f"bench_gpu: needs an NVIDIA GPU with numba-cuda and CuPy ({exc})") \
            from None


def run(quick=False, only=None, size=None, done=None):
    """Every section's rows (the roofs first); a failing section leaves an error row.
    ``size``: "full", "quick" (what ``quick`` selects) or "smoke" (tiny shapes, one call);
    ``done(rows)`` is called with the rows so far after each section."""
    global _SMOKE
    size = size or ("quick" if quick else "full")
    _SMOKE = size == "smoke"
    name = _device_name()
    torch = _torch()
    print(f"device: {name}; torch {torch.__version__ if torch else '(none with CUDA)'}")
    roof = roofs(size)
    print(f"roofs: copy {roof['copy_GBps']:.0f} GB/s (read + write), "
          f"SGEMM {roof['sgemm_TFLOPs']:.1f} TFLOP/s")
    rows = [{"section": "roofs", **roof, "device": name}]
    for key, section in SECTIONS.items():
        if only and key not in only:
            continue
        try:
            got = section(roof, size)
        except Exception:
            print(f"section {key} failed:\n{traceback.format_exc()}")
            rows.append({"section": key, "error": traceback.format_exc()[-2000:]})
            continue
        for row in got:
            print(" | ".join(f"{k}={_fmt(v)}" for k, v in row.items()))
        rows.extend(got)
        sys.stdout.flush()
        if done:
            done(rows)
    return rows


def main(argv=None):
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
    from harness import same_allocator

    print(f"malloc (nnkit and torch, one process): {same_allocator()}")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--smoke", action="store_true",
                        help="every section once at tiny shapes: a check, not a measurement")
    parser.add_argument("--json", default=None, help="write every row to this JSON file")
    parser.add_argument("--only", nargs="*", default=None, help="sections to run")
    args = parser.parse_args(argv)
    def write(rows):  # after every section: a run stopped midway keeps what it measured
        if args.json:
            with open(args.json, "w") as fh:
                json.dump(rows, fh, indent=1)

    try:
        write(run(args.quick, args.only, "smoke" if args.smoke else None, done=write))
    except SystemExit as exc:
        print(exc)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
