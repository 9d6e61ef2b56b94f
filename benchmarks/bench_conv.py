"""Convolution and pooling, float32: forward, and forward+backward (dx, dweight, dbias), nnkit
vs torch CPU (oneDNN) with the same thread count, plus the machine's SGEMM rate (numpy
2048^3) measured in the same run for the GFLOP/s comparison.

Rows: conv2d 3x3 padding 1 at three shapes (target torch/nnkit >= 1.0), then other shapes
(target >= 0.8): 1x1, 3x3 stride 2, 7x7 stride 2 padding 3 (a ResNet's first layer),
depthwise 3x3 (groups = C), max and average pooling 2x2 and 3x3 stride 2, conv1d; and one
training step of the digits CNN (``nnkit.training.lenet_digits``, Adam, batch 32, target
>= 1.0) against the same network in torch.

Each contender runs in its own worker process and the workers alternate (nnkit, torch,
nnkit, ...): in one process torch's OpenMP pool and numba's/OpenBLAS's spinning threads slow
each other down by up to 10x (see bench_mlp.py). Every worker runs with glibc malloc tuned
alike (harness.same_allocator(); the environment line says so).

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python benchmarks/bench_conv.py \
        [--quick] [--threads N] [--only SUBSTRING-OF-A-CASE-NAME]

``--algorithms`` instead times every CPU path that applies at each of ``ALGORITHM_SHAPES``
(the shapes the table of ``nnkit.kernels.conv.algorithms`` was decided on), forced in turn,
on one thread: ms of CPU time, forward / forward+backward.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))
from harness import block_times, environment, same_allocator, torch_available  # noqa: E402

SHAPES = [(32, 3, 32, 32, 16), (32, 16, 32, 32, 32), (8, 64, 56, 56, 64)]  # (N, C, H, W, K)
MODES = ("fwd", "fwd+bwd")

# name: (op, x shape, weight shape or pooling window, keyword arguments)
CASES = {f"conv2d 3x3 p1 (N,C,H,W,K)={s}": ("conv2d", s[:4], (s[4], s[1], 3, 3),
                                             dict(padding=1)) for s in SHAPES}
CASES.update({
    "conv2d 1x1 (8,64,56,56)->256": ("conv2d", (8, 64, 56, 56), (256, 64, 1, 1), {}),
    "conv2d 1x1 (8,256,56,56)->64": ("conv2d", (8, 256, 56, 56), (64, 256, 1, 1), {}),
    "conv2d 3x3 s2 p1 (8,64,56,56)->128": ("conv2d", (8, 64, 56, 56), (128, 64, 3, 3),
                                           dict(stride=2, padding=1)),
    "conv2d 7x7 s2 p3 (8,3,224,224)->64": ("conv2d", (8, 3, 224, 224), (64, 3, 7, 7),
                                           dict(stride=2, padding=3)),
    "depthwise 3x3 p1 (8,64,56,56)": ("conv2d", (8, 64, 56, 56), (64, 1, 3, 3),
                                      dict(padding=1, groups=64)),
    "max_pool 2x2 (8,64,56,56)": ("max_pool2d", (8, 64, 56, 56), 2, {}),
    "max_pool 3x3 s2 p1 (8,64,112,112)": ("max_pool2d", (8, 64, 112, 112), 3,
                                          dict(stride=2, padding=1)),
    "avg_pool 2x2 (8,64,56,56)": ("avg_pool2d", (8, 64, 56, 56), 2, {}),
    "avg_pool 3x3 s2 p1 (8,64,112,112)": ("avg_pool2d", (8, 64, 112, 112), 3,
                                          dict(stride=2, padding=1)),
    "conv1d k5 p2 (32,64,512)->64": ("conv1d", (32, 64, 512), (64, 64, 5), dict(padding=2)),
    "CNN digits train step (batch 32)": ("cnn", (32, 1, 8, 8), None, {}),
})
TARGETS = {name: 1.0 if name.startswith(("conv2d 3x3 p1", "CNN")) else 0.8 for name in CASES}


def flops(name, mode):
    """2 N K Ho Wo (C / groups) kh kw per convolution pass; fwd+bwd is three passes (forward,
    dx, dweight). None for pooling and the training step."""
    op, xs, ws, kw = CASES[name]
    if op not in ("conv2d", "conv1d"):
        return None
    stride, pad = kw.get("stride", 1), kw.get("padding", 0)
    spatial = xs[2:]
    kernel = ws[2:]
    out = 1
    for n, k in zip(spatial, kernel, strict=True):
        out *= (n + 2 * pad - k) // stride + 1
    per = 2.0 * xs[0] * ws[0] * out * ws[1] * int(np.prod(kernel))
    return per * (1 if mode == "fwd" else 3)


def _inputs(name):
    """x, weight (or None), dy for a case, seeded alike for both libraries."""
    op, xs, ws, kw = CASES[name]
    rng = np.random.default_rng(0)
    x = rng.standard_normal(xs).astype(np.float32)
    w = None if op not in ("conv2d", "conv1d") else (
        rng.standard_normal(ws) / np.sqrt(np.prod(ws[1:]))).astype(np.float32)
    return op, x, w, kw


def _nnkit_calls(name):
    import nnkit as nk
    from nnkit.functional import conv as FC

    op, xa, wa, kw = _inputs(name)
    if op == "cnn":
        return _nnkit_cnn(xa)
    x = nk.tensor(xa, requires_grad=True)
    w = nk.tensor(wa, requires_grad=True) if wa is not None else None
    b = nk.tensor(np.zeros(wa.shape[0], np.float32), requires_grad=True) if wa is not None \
        else None
    fn = {"conv2d": lambda: FC.conv2d(x, w, b, **kw), "conv1d": lambda: FC.conv1d(x, w, b, **kw),
          "max_pool2d": lambda: FC.max_pool2d(x, CASES[name][2], **kw),
          "avg_pool2d": lambda: FC.avg_pool2d(x, CASES[name][2], **kw)}[op]
    with nk.no_grad():
        dy = np.random.default_rng(1).standard_normal(fn().shape).astype(np.float32)

    def fwd():
        with nk.no_grad():
            fn()

    def fwd_bwd():
        x.grad = None
        if w is not None:
            w.grad = b.grad = None
        fn().backward(dy)

    return {"fwd": fwd, "fwd+bwd": fwd_bwd}


def _nnkit_cnn(images):
    import nnkit as nk
    from nnkit import optim
    from nnkit.training import lenet_digits

    nk.manual_seed(0)
    model = lenet_digits()
    opt = optim.Adam(model.parameters(), lr=1e-3)
    x = nk.tensor(images)
    labels = np.random.default_rng(0).integers(0, 10, images.shape[0])

    def step():
        opt.zero_grad()
        nk.functional.cross_entropy(model(x), labels).backward()
        opt.step()

    return {"fwd+bwd": step}


def _torch_calls(name):
    import torch

    op, xa, wa, kw = _inputs(name)
    F = torch.nn.functional
    if op == "cnn":
        return _torch_cnn(torch, xa)
    x = torch.tensor(xa, requires_grad=True)
    w = torch.tensor(wa, requires_grad=True) if wa is not None else None
    b = torch.zeros(wa.shape[0], requires_grad=True) if wa is not None else None
    fn = {"conv2d": lambda: F.conv2d(x, w, b, **kw), "conv1d": lambda: F.conv1d(x, w, b, **kw),
          "max_pool2d": lambda: F.max_pool2d(x, CASES[name][2], **kw),
          "avg_pool2d": lambda: F.avg_pool2d(x, CASES[name][2], **kw)}[op]
    with torch.no_grad():
        dy = torch.tensor(np.random.default_rng(1).standard_normal(tuple(fn().shape))
                          .astype(np.float32))

    def fwd():
        with torch.no_grad():
            fn()

    def fwd_bwd():
        x.grad = None
        if w is not None:
            w.grad = b.grad = None
        fn().backward(dy)

    return {"fwd": fwd, "fwd+bwd": fwd_bwd}


def _torch_cnn(torch, images):
    nn = torch.nn
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
        nn.Flatten(), nn.Linear(512, 64), nn.ReLU(), nn.Linear(64, 10))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.tensor(images)
    labels = torch.tensor(np.random.default_rng(0).integers(0, 10, images.shape[0]))

    def step():
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), labels).backward()
        opt.step()

    return {"fwd+bwd": step}


def _matmul_calls(_shape):
    a = np.random.default_rng(0).standard_normal((2048, 2048)).astype(np.float32)
    out = np.empty_like(a)
    return {"sgemm": lambda: np.matmul(a, a, out=out)}


def _selected(only: str) -> list[str]:
    """The case names containing ``only`` (all for '')."""
    return [name for name in CASES if only in name]


def _worker(impl: str, threads: int, blocks: int, only: str = "") -> None:
    """Per (shape, mode): ``blocks`` timed blocks; print {key: [seconds per call]} as JSON."""
    import numba

    numba.set_num_threads(threads)
    if impl == "torch":
        import torch

        torch.set_num_threads(threads)
    make = {"nnkit": _nnkit_calls, "torch": _torch_calls, "matmul": _matmul_calls}[impl]
    names = _selected(only) if impl != "matmul" else [None]
    result = {}
    for name in names:
        for mode, fn in make(name).items():
            for _ in range(3):
                fn()
            per_block = max(1, int(0.05 / max(_once(fn), 1e-6)))
            result[f"{name}|{mode}"] = block_times(fn, blocks, per_block, warmup=0,
                                                   pause=0.05)
    print(json.dumps(result))


def _once(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def run(quick: bool = False, threads: int | None = None, only: str = "") -> list[dict]:
    """Rows of the table; ``threads`` (default numba's count) for numba, OpenBLAS and torch;
    ``only``: the cases whose name contains it."""
    import os

    import numba

    threads = threads or numba.get_num_threads()
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(threads), NUMBA_NUM_THREADS=str(threads))
    impls = ["matmul", "nnkit"] + (["torch"] if torch_available() else [])
    rounds, blocks = (1, 3) if quick else (3, 7)
    samples: dict = {}
    for _ in range(rounds):
        for impl in impls:
            out = subprocess.run([sys.executable, str(HERE), "--worker", impl, str(threads),
                                  str(blocks), only], capture_output=True, text=True,
                                 check=True, env=env)
            for key, times in json.loads(out.stdout.strip().splitlines()[-1]).items():
                samples.setdefault((impl, key), []).extend(times)
            time.sleep(0.3)
    med = {k: float(np.median(v)) for k, v in samples.items()}
    sgemm = 2.0 * 2048**3 / med[("matmul", "None|sgemm")] / 1e9
    rows = []
    for name in CASES:
        for mode in MODES:
            key = f"{name}|{mode}"
            if ("nnkit", key) not in med:
                continue
            t_nk = med[("nnkit", key)]
            t_th = med.get(("torch", key))
            work = flops(name, mode)
            rows.append({
                "work": f"{name} {mode}",
                "nnkit_ms": f"{t_nk * 1e3:.2f}",
                "torch_ms": f"{t_th * 1e3:.2f}" if t_th else "n/a",
                "torch/nnkit": f"{t_th / t_nk:.2f}" if t_th else "n/a",
                "target": f">= {TARGETS[name]}",
                "nnkit_GFLOPs": f"{work / t_nk / 1e9:.0f}" if work else "-",
                "torch_GFLOPs": f"{work / t_th / 1e9:.0f}" if work and t_th else "-",
                "sgemm_GFLOPs": f"{sgemm:.0f}",
                "threads": threads,
            })
    return rows


# (x shape, weight shape, keyword arguments): the shapes the CPU dispatcher was decided on
ALGORITHM_SHAPES = [
    ((32, 3, 32, 32), (16, 3, 3, 3), dict(padding=1)),
    ((32, 16, 32, 32), (32, 16, 3, 3), dict(padding=1)),
    ((32, 32, 32, 32), (32, 32, 3, 3), dict(padding=1)),
    ((8, 64, 56, 56), (64, 64, 3, 3), dict(padding=1)),
    ((8, 128, 28, 28), (128, 128, 3, 3), dict(padding=1)),
    ((8, 256, 14, 14), (256, 256, 3, 3), dict(padding=1)),
    ((32, 32, 16, 16), (32, 32, 3, 3), dict(padding=1)),
    ((32, 64, 8, 8), (64, 64, 3, 3), dict(padding=1)),
    ((32, 16, 4, 4), (32, 16, 3, 3), dict(padding=1)),
    ((32, 1, 8, 8), (16, 1, 3, 3), dict(padding=1)),
    ((8, 3, 224, 224), (64, 3, 7, 7), dict(stride=2, padding=3)),
    ((8, 64, 56, 56), (128, 64, 3, 3), dict(stride=2, padding=1)),
    ((8, 64, 56, 56), (256, 64, 1, 1), {}),
    ((8, 64, 56, 56), (64, 1, 3, 3), dict(padding=1, groups=64)),
    ((8, 256, 56, 56), (64, 256, 1, 1), {}),
    ((32, 64, 1, 512), (64, 64, 1, 5), dict(padding=(0, 2))),
    ((32, 16, 4, 4), (32, 16, 3, 3), dict(padding=1)),
]


def algorithms(repeats: int = 7) -> list[dict]:
    """Every CPU path that applies to each of ``ALGORITHM_SHAPES``, forced in turn
    (``nnkit.kernels.conv.algorithms.ALGORITHM``), interleaved, float32: the minimum CPU time
    (``time.process_time``, which a busy machine's other processes do not inflate) of
    forward and forward+backward. Run on one thread (numba and OpenBLAS), so CPU time is
    the work each path does."""
    from nnkit.kernels import conv as K
    from nnkit.kernels.conv import algorithms as A

    rng = np.random.default_rng(0)
    rows = []
    for xs, ws, kw in ALGORITHM_SHAPES:
        x = rng.standard_normal(xs).astype(np.float32)
        w = (rng.standard_normal(ws) / np.sqrt(np.prod(ws[1:]))).astype(np.float32)
        b = np.zeros(ws[0], np.float32)
        paths = []
        for name in ("im2col", "image", "packed", "window", "pointwise", "winograd", "direct"):
            A.ALGORITHM = name
            y, cache = K.conv2d_forward(x, w, b, **kw)
            if cache.algorithm == name:
                paths.append(name)
        A.ALGORITHM = None
        chosen = K.conv2d_forward(x, w, b, **kw)[1].algorithm
        dy = rng.standard_normal(y.shape).astype(np.float32)
        best = {p: [np.inf, np.inf] for p in paths}
        for _ in range(repeats):
            for p in paths:
                A.ALGORITHM = p
                for m in (0, 1):
                    start = time.process_time()
                    y, cache = K.conv2d_forward(x, w, b, **kw)
                    if m:
                        K.conv2d_backward(dy, cache)
                    best[p][m] = min(best[p][m], time.process_time() - start)
        A.ALGORITHM = None
        rows.append({"x, weight, kw": f"{xs} {ws} {kw}", "chosen": chosen,
                     **{p: f"{best[p][0] * 1e3:.2f} / {best[p][1] * 1e3:.2f}" for p in paths}})
    return rows


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    same_allocator()  # glibc malloc tuned alike in every process, each contender's worker
    if argv and argv[0] == "--worker":
        _worker(argv[1], int(argv[2]), int(argv[3]), argv[4] if len(argv) > 4 else "")
        return
    if argv and argv[0] == "--algorithms":
        import os

        if os.environ.get("NUMBA_NUM_THREADS") != "1":  # one thread: CPU time = the work
            env = dict(os.environ, NUMBA_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
            raise SystemExit(subprocess.run([sys.executable, str(HERE), *argv], env=env,
                                            check=False).returncode)
        from nnkit.tour import format_table

        print(environment())
        rows = algorithms()
        print(format_table(rows, list(dict.fromkeys(k for r in rows for k in r))))
        return

    from nnkit.tour import format_table

    print(environment())
    threads = int(argv[argv.index("--threads") + 1]) if "--threads" in argv else None
    only = argv[argv.index("--only") + 1] if "--only" in argv else ""
    rows = run(quick="--quick" in argv, threads=threads, only=only)
    print(format_table(rows, list(rows[0])))


if __name__ == "__main__":
    main()
