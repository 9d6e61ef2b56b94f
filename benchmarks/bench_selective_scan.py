"""The selective scan (Mamba's S6) at Mamba's shapes: nnkit's fused CPU kernels against
mamba_ssm's ``selective_scan_ref`` written in torch (the CPU "slow path": exp(dt A) and
dt B u materialised as (batch, dim, L, N) tensors, then a loop over L) and transformers'
own CPU path of its Mamba mixer (``mamba_selective_scan``, when installed), against the
memory-bound limit measured in the same run, and against the naive twin at a small shape.

Shape (batch 4, dim 1536, N 16, L 2048), float32, B and C varying (batch, N, L), with z, D,
delta_bias and softplus, as a Mamba-130M layer calls it. Targets: forward and
forward+backward >= 5x the torch reference, within 2x of the memory bound.

The bound: the bytes that must move at the bandwidth of a Numba prange copy timed in the
same run. Forward: u, delta, z read and y written (B and C are 1% of that). Forward +
backward: that, plus dy, u, delta, z read and du, ddelta, dz written by the backward.
torch runs in its own worker process with the same thread count and glibc malloc tuned
alike (harness.same_allocator()).

    python benchmarks/bench_selective_scan.py [--quick] [--no-torch]

``--no-torch`` times nnkit alone (the torch reference takes minutes per call at the full
shape: two (batch, dim, L, N) float32 tensors of 805 MB each, and autograd's copies).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve()
SHAPE = (4, 1536, 16, 2048)  # batch, dim, N, L
QUICK_SHAPE = (2, 256, 16, 512)
WITH_TORCH = True  # --no-torch: nnkit alone
TWIN_SHAPE = (1, 4, 16, 128)


def problem(shape, dtype=np.float32, seed=0):
    """Mamba's arguments: u, delta, z (batch, dim, L); A = -(1..N) per channel (S4D-real);
    B, C (batch, N, L); D ones; delta_bias of softplus^-1 of steps in [1e-3, 1e-1]."""
    batch, dim, N, L = shape
    rng = np.random.default_rng(seed)
    dt = np.exp(rng.uniform(np.log(1e-3), np.log(1e-1), dim))
    args = {"u": rng.standard_normal((batch, dim, L)),
            "delta": 0.1 * rng.standard_normal((batch, dim, L)),
            "A": -np.tile(np.arange(1, N + 1, dtype=np.float64), (dim, 1)),
            "B": rng.standard_normal((batch, N, L)), "C": rng.standard_normal((batch, N, L)),
            "D": np.ones(dim), "z": rng.standard_normal((batch, dim, L)),
            "delta_bias": dt + np.log(-np.expm1(-dt))}
    return {k: v.astype(dtype) for k, v in args.items()}


def torch_selective_scan_ref(u, delta, A, B, C, D=None, z=None, delta_bias=None,
                             delta_softplus=False):
    """mamba_ssm's reference semantics in torch (real A; einsum over the full tensors)."""
    import torch

    if delta_bias is not None:
        delta = delta + delta_bias[..., None]
    if delta_softplus:
        delta = torch.nn.functional.softplus(delta)
    dim = A.shape[0]
    x = A.new_zeros((u.shape[0], dim, A.shape[1]))
    deltaA = torch.exp(torch.einsum("bdl,dn->bdln", delta, A))
    if B.dim() == 2:
        deltaB_u = torch.einsum("bdl,dn,bdl->bdln", delta, B, u)
    else:
        B = B if B.dim() == 4 else B[:, None]
        B = B.repeat_interleave(dim // B.shape[1], dim=1)  # (batch, dim, N, L)
        deltaB_u = torch.einsum("bdl,bdnl,bdl->bdln", delta, B, u)
    if C.dim() > 2:
        C = C if C.dim() == 4 else C[:, None]
        C = C.repeat_interleave(dim // C.shape[1], dim=1)
    ys = []
    for i in range(u.shape[2]):
        x = deltaA[:, :, i] * x + deltaB_u[:, :, i]
        ys.append(torch.einsum("bdn,dn->bd", x, C) if C.dim() == 2
                  else torch.einsum("bdn,bdn->bd", x, C[..., i]))
    y = torch.stack(ys, dim=2)
    out = y if D is None else y + u * D[:, None]
    return out if z is None else out * torch.nn.functional.silu(z)


def _median(fn, repeats):
    """Median seconds of ``fn`` over ``repeats`` calls after one warm-up call (harness)."""
    from harness import median_times

    return median_times({"fn": fn}, repeats, warmup=1)["fn"]


def _transformers_scan():
    """transformers' CPU path of the Mamba mixer (``mamba_selective_scan``), or None."""
    try:
        from transformers.models.mamba.modeling_mamba import mamba_selective_scan
    except ImportError:
        return None

    def scan(u, delta, **kwargs):  # its names for u and delta
        return mamba_selective_scan(u, delta, **kwargs)

    return scan


def _torch_worker(shape, repeats):
    """Print the median seconds of the forward and the forward + backward of the torch
    reference and, when transformers is installed, of its Mamba CPU path."""
    import numba
    import torch

    torch.set_num_threads(numba.get_num_threads())
    args = {k: torch.from_numpy(v) for k, v in problem(shape).items()}
    times = {}
    for name, fn in (("ref", torch_selective_scan_ref), ("hf", _transformers_scan())):
        if fn is None:
            continue

        def forward(fn=fn):
            with torch.no_grad():
                fn(**args, delta_softplus=True)

        def both(fn=fn):
            leaves = {k: v.clone().requires_grad_() for k, v in args.items()}
            fn(**leaves, delta_softplus=True).sum().backward()

        times[name] = {"fwd": _median(forward, repeats), "fwd+bwd": _median(both, repeats)}
    print(json.dumps(times))


def _torch_times(shape, repeats):
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return None
    out = subprocess.run([sys.executable, str(HERE), "--torch", json.dumps(shape),
                          str(repeats)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _nnkit_times(shape, repeats):
    from nnkit._ext import scan_cpu
    from nnkit.kernels import selective_scan as K

    args = problem(shape)
    u = args["u"]
    copy = _median(lambda: scan_cpu.copy(u, np.empty_like(u)), repeats)
    forward = _median(lambda: K.selective_scan_forward(**args, delta_softplus=True), repeats)
    dy = np.ones_like(u)

    def both():
        _, cache = K.selective_scan_forward(**args, delta_softplus=True)
        K.selective_scan_backward(dy, cache)

    return {"copy": copy, "fwd": forward, "fwd+bwd": _median(both, repeats),
            "array_bytes": u.nbytes}


def _twin_ratio():
    """nnkit's forward against the naive twin's at TWIN_SHAPE (the twin is a Python loop)."""
    from nnkit.kernels import reference as R
    from nnkit.kernels import selective_scan as K

    args = problem(TWIN_SHAPE)
    ours = _median(lambda: K.selective_scan_forward(**args, delta_softplus=True), 5)
    twin = _median(lambda: R.selective_scan(**args, delta_softplus=True), 1)
    return {"work": f"fwd {TWIN_SHAPE} float32", "ms": f"{ours * 1e3:.3f}", "bound_ms": "",
            "x_bound": "", "torch_ref/nnkit": "", "transformers/nnkit": "",
            "twin/nnkit": f"{twin / ours:.0f}"}


def _ratio(theirs, key, work, ours):
    """A contender's time over nnkit's, or n/a when it did not run."""
    if theirs is None or key not in theirs:
        return "n/a"
    return f"{theirs[key][work] / ours:.1f}"


def run(quick: bool = False) -> list[dict]:
    shape = QUICK_SHAPE if quick else SHAPE
    repeats = 3 if quick else 7
    ours = _nnkit_times(shape, repeats)
    theirs = _torch_times(shape, 1 if quick else 3) if WITH_TORCH else None
    bandwidth = 2 * ours["array_bytes"] / ours["copy"]  # one array read, one written
    rows = []
    for work, arrays in (("fwd", 4), ("fwd+bwd", 11)):
        bound = arrays * ours["array_bytes"] / bandwidth
        rows.append({"work": f"{work} {shape} float32", "ms": f"{ours[work] * 1e3:.1f}",
                     "bound_ms": f"{bound * 1e3:.1f}", "x_bound": f"{ours[work] / bound:.2f}",
                     **{f"{label}/nnkit": _ratio(theirs, key, work, ours[work])
                        for key, label in (("ref", "torch_ref"), ("hf", "transformers"))},
                     "twin/nnkit": ""})
    return rows + [_twin_ratio()]


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    sys.path.insert(0, str(HERE.parent))
    from harness import report, same_allocator

    same_allocator()  # glibc malloc tuned alike in every process, each contender's worker
    global WITH_TORCH
    WITH_TORCH = "--no-torch" not in argv
    if argv and argv[0] == "--torch":
        _torch_worker(tuple(json.loads(argv[1])), int(argv[2]))
        return
    report(run, argv)


if __name__ == "__main__":
    main()
