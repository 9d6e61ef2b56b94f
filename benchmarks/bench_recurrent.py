"""Recurrent layers, float32, forward and forward+backward: nnkit vs torch.nn.LSTM/GRU/RNN.

Shapes (T, B, input, hidden) = (128, 32, 64, 128) and (512, 16, 128, 256), one layer, one
direction, loss = output.sum(). Targets: LSTM >= 1.0x torch, GRU >= 2x, RNN >= 1.5x
(ratio = torch time / nnkit time). Also reported: the GEMM throughput the layers reach
(the FLOPs of every matrix product over the measured time) next to numpy's matmul roof on
one GEMM of the same total size.

Each sample is the mean of BLOCK calls back to back (see ``BLOCK``). Each contender runs in
its own worker process; the workers alternate (nnkit, torch, ...) within one run: in one
process torch's OpenMP pool and OpenBLAS's spinning workers slow each other down (see
bench_mlp.py). Every worker runs with glibc malloc tuned alike (harness.same_allocator()).

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_recurrent.py

``--quick``: the first shape, fewer samples; ``--only LSTM`` (or ``LSTM,GRU``): those layers.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))
from harness import block_times, report, same_allocator, torch_available  # noqa: E402

SHAPES = [(128, 32, 64, 128), (512, 16, 128, 256)]
# Calls timed back to back in blocks of BLOCK, as the steps of a training loop run. A call
# timed alone after an idle pause pays for waking the second core: here a trivial two-thread
# Numba launch took 3.8 ms after a 50 ms sleep (0.002 ms back to back), which doubled the
# small LSTM forward (12.8 vs 5.9 ms) in the first version of this script.
BLOCK = 5
MODES = ("LSTM", "GRU", "RNN")
GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


def gemm_flops(mode, T, B, D, H, backward):
    """FLOPs of the layer's matrix products: x W_ih^T and h W_hh^T per step (x3 with bwd)."""
    G = GATES[mode]
    fwd = 2 * T * B * G * H * (D + H)
    return fwd * (3 if backward else 1)


def _nnkit_fns(mode, T, B, D, H):
    import nnkit as nk
    from nnkit.nn import recurrent

    nk.manual_seed(0)
    model = getattr(recurrent, mode)(D, H)
    x = nk.tensor(np.random.default_rng(0).standard_normal((T, B, D)).astype(np.float32),
                  requires_grad=True)

    def fwd():
        with nk.no_grad():
            model(x)

    def fwd_bwd():
        model(x)[0].sum().backward()

    return fwd, fwd_bwd


def _torch_fns(mode, T, B, D, H):
    import torch

    torch.manual_seed(0)
    model = getattr(torch.nn, mode)(D, H)
    x = torch.randn(T, B, D, requires_grad=True)

    def fwd():
        with torch.no_grad():
            model(x)

    def fwd_bwd():
        model(x)[0].sum().backward()

    return fwd, fwd_bwd


def _numpy_roof(mode, T, B, D, H):
    """numpy's matmul on one GEMM of the layer's forward size: (T*B, D+H) x (D+H, G*H)."""
    a = np.random.default_rng(0).standard_normal((T * B, D + H)).astype(np.float32)
    b = np.random.default_rng(1).standard_normal((D + H, GATES[mode] * H)).astype(np.float32)

    def fn():
        a @ b

    return fn, fn


def _worker(impl, threads, mode, shape, repeats):
    # The torch worker must not import numba: two OpenMP runtimes in one process (numba's
    # libgomp and torch's) made torch's GRU 10-30x slower in a first version of this script.
    if impl == "torch":
        import torch

        torch.set_num_threads(threads)
    else:
        import numba

        numba.set_num_threads(threads)
    make = {"nnkit": _nnkit_fns, "torch": _torch_fns, "numpy": _numpy_roof}[impl]
    fwd, fwd_bwd = make(mode, *shape)
    out = {}
    for name, fn in (("fwd", fwd), ("fwd+bwd", fwd_bwd)):
        out[name] = block_times(fn, repeats, BLOCK, warmup=2, pause=0.05)
    print(json.dumps(out))


def _sample(impl, threads, mode, shape, repeats):
    cmd = [sys.executable, str(HERE), "--worker", impl, str(threads), mode,
           ",".join(map(str, shape)), str(repeats)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run(quick: bool = False, modes=MODES) -> list[dict]:
    import numba

    threads = numba.get_num_threads()
    impls = ["nnkit"] + (["torch"] if torch_available() else [])
    rounds, repeats = (1, 3) if quick else (2, 5)
    shapes = SHAPES[:1] if quick else SHAPES
    rows = []
    for shape in shapes:
        roof = _sample("numpy", threads, "LSTM", shape, repeats)["fwd"]
        roof_flops = gemm_flops("LSTM", *shape, backward=False) / float(np.median(roof))
        for mode in modes:
            samples = {impl: {"fwd": [], "fwd+bwd": []} for impl in impls}
            for _ in range(rounds):  # interleave the workers
                for impl in impls:
                    for k, v in _sample(impl, threads, mode, shape, repeats).items():
                        samples[impl][k] += v
            for kind in ("fwd", "fwd+bwd"):
                med = {impl: float(np.median(s[kind])) for impl, s in samples.items()}
                flops = gemm_flops(mode, *shape, backward=kind == "fwd+bwd")
                rows.append({
                    "work": f"{mode} {kind} T,B,in,H={shape}",
                    "nnkit_ms": f"{med['nnkit'] * 1e3:.2f}",
                    "torch_ms": f"{med['torch'] * 1e3:.2f}" if "torch" in med else "n/a",
                    "torch/nnkit": f"{med['torch'] / med['nnkit']:.2f}" if "torch" in med
                    else "n/a",
                    "nnkit_GEMM_GFLOP/s": f"{flops / med['nnkit'] / 1e9:.0f}",
                    "numpy_roof_GFLOP/s": f"{roof_flops / 1e9:.0f}",
                    "threads": threads,
                })
    return rows


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    same_allocator()  # glibc malloc tuned alike in every process, each contender's worker
    if argv and argv[0] == "--worker":
        shape = tuple(int(s) for s in argv[4].split(","))
        _worker(argv[1], int(argv[2]), argv[3], shape, int(argv[5]))
        return

    modes = MODES
    if "--only" in argv:
        i = argv.index("--only") + 1
        modes = tuple(argv[i].split(",")) if i < len(argv) else ()
        if not modes or not set(modes) <= set(MODES):
            raise SystemExit(f"--only takes layers from {','.join(MODES)}, got {modes}")
    report(lambda quick: run(quick, modes), argv)


if __name__ == "__main__":
    main()
