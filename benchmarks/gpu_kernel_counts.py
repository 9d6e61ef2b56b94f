"""Every device kernel of nnkit's GPU ops and training steps, counted without a GPU.

Runs on the tests' NumPy-backed CuPy stand-in under Numba's CUDA simulator::

    NNKIT_CUPY_STAND_IN=1 NUMBA_ENABLE_CUDASIM=1 python benchmarks/gpu_kernel_counts.py \\
        [--batch 4] [--only ops|steps] [--json PATH] [--check-batch] [--fast]

For each op (forward and backward) and for one training step (zero_grad, forward,
cross-entropy, backward, optimizer step; the second step, so the optimizer's state exists)
of the MLP, the CNN, one TransformerEncoderLayer and the digits ViT of
``benchmarks/bench_gpu.py``'s ``steps`` section (same models and widths, a small batch), it
prints:

- ``numba``: Numba CUDA launches (``nnkit._ext._launch.count_launches``);
- ``kernels``: every device kernel: those launches and each CuPy kernel the stand-in ran
  (elementwise ufunc calls and operators, reductions, matrix products, casts, gathers,
  assignments, non-zero fills, scatter_add, ElementwiseKernels; ``tests/stand_in/cupy/
  _counting.py``), as a GPU profiler counts kernels;
- ``memops``: memsets (zeros) and device copies, which the profiler count leaves out.

``--fast`` counts the Numba launches without running them (the simulator runs a Python
thread per CUDA thread: the ViT step takes about 15 minutes on two cores, a few seconds
without them); their outputs keep whatever their fresh arrays held, which changes no count
as long as no step reads a device value on the host (tests/cuda/test_end_to_end.py holds the
steps to that). The counts do not depend on the batch (``--check-batch`` runs the steps at
two batches and fails if a count of kernels differs). On a real GPU the same step counts come from
``python benchmarks/bench_gpu.py --only steps`` (CUPTI through torch's profiler).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def _setup(fast=False):
    """The stand-in first on sys.path and the attention kernels' small tiles, as
    tests/conftest.py does for the stand-in's tests; ``fast``: simulated kernels return at
    once (``launch`` has counted them)."""
    if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1" or \
            os.environ.get("NNKIT_CUPY_STAND_IN") != "1":
        raise SystemExit("gpu_kernel_counts: run with NNKIT_CUPY_STAND_IN=1 "
                         "NUMBA_ENABLE_CUDASIM=1 (the CuPy stand-in under the simulator); on a "
                         "GPU, benchmarks/bench_gpu.py --only steps counts the steps")
    for path in (ROOT / "tests" / "stand_in", ROOT / "tests", ROOT / "benchmarks", ROOT):
        sys.path.insert(0, str(path))
    import cupy  # noqa: F401  (the stand-in)

    from nnkit._ext import activation_cuda, attention_cuda, optim_cuda

    attention_cuda.block_m, attention_cuda.block_n = 8, 8
    attention_cuda.threads_y, attention_cuda.threads_x = 2, 4
    optim_cuda.threads, optim_cuda.max_blocks = 32, 2
    activation_cuda.threads, activation_cuda.max_blocks = 32, 4
    if fast:
        import warnings

        from numba.cuda.simulator.kernel import FakeCUDAKernel

        FakeCUDAKernel.__call__ = lambda self, *args: None
        np.seterr(all="ignore")  # garbage in the unwritten outputs
        warnings.filterwarnings("ignore", category=RuntimeWarning)


def _measure(fn):
    from helpers import count_device_work

    with count_device_work() as work:
        fn()
    return work


def _ops(batch):
    """{name: (setup, run)}: ``setup()`` builds inputs, ``run(state)`` is counted."""
    import cupy

    import nnkit as nk
    import nnkit.functional as F

    rng = np.random.default_rng(0)

    def randn(*shape, grad=False):
        t = nk.Tensor(cupy.asarray(rng.standard_normal(shape).astype(np.float32)))
        return t.requires_grad_() if grad else t

    def pair(name, make, forward):
        """forward and backward cases of an op: forward(inputs) -> output Tensor."""
        def fwd():
            inputs = make()
            return lambda: forward(*inputs)

        def bwd():
            inputs = make()
            y = forward(*inputs)
            dy = cupy.asarray(rng.standard_normal(y.shape).astype(np.float32))
            return lambda: y.backward(dy)

        return {f"{name} fwd": fwd, f"{name} bwd": bwd}

    cases = {}
    cases.update(pair("linear 64->128", lambda: (randn(batch, 64, grad=True),
                                                 randn(128, 64, grad=True),
                                                 randn(128, grad=True)), F.linear))
    cases.update(pair("relu", lambda: (randn(batch, 128, grad=True),), F.relu))
    cases.update(pair("gelu", lambda: (randn(batch, 17, 128, grad=True),), F.gelu))
    cases.update(pair("dropout 0.1", lambda: (randn(batch, 17, 64, grad=True), 0.1),
                      F.dropout))
    cases.update(pair("softmax", lambda: (randn(batch, 10, grad=True),), F.softmax))
    cases.update(pair("log_softmax", lambda: (randn(batch, 10, grad=True),), F.log_softmax))
    target = cupy.asarray(rng.integers(0, 10, batch))
    cases.update(pair("cross_entropy", lambda: (randn(batch, 10, grad=True), target),
                      F.cross_entropy))
    cases.update(pair("layer_norm 64", lambda: (randn(batch, 17, 64, grad=True), (64,),
                                               randn(64, grad=True), randn(64, grad=True)),
                      F.layer_norm))
    cases.update(pair("sdpa (b,8,17,8)", lambda: tuple(randn(batch, 8, 17, 8, grad=True)
                                                       for _ in range(3)),
                      F.scaled_dot_product_attention))
    mha = nk.nn.MultiheadAttention(64, 8, batch_first=True).to("cuda")
    cases.update(pair("self-attention MHA 64/8", lambda: (randn(batch, 17, 64, grad=True),),
                      lambda x: mha(x, x, x, need_weights=False)[0]))
    cases.update(pair("conv2d 1->8 3x3", lambda: (randn(batch, 1, 8, 8, grad=True),
                                                  randn(8, 1, 3, 3, grad=True),
                                                  randn(8, grad=True), 1, 1),
                      F.conv2d))
    cases.update(pair("max_pool2d 2", lambda: (randn(batch, 8, 8, 8, grad=True), 2),
                      F.max_pool2d))

    def optimizer(make_opt, n):
        def setup():
            shapes = ([(64, 32), (64,), (32, 64), (32,), (10, 32), (10,), (32,), (32,)] * 6)[:n]
            params = [nk.nn.Parameter(cupy.asarray(rng.standard_normal(s).astype(np.float32)))
                      for s in shapes]
            opt = make_opt(params)
            for p in params:
                p.grad = cupy.asarray(rng.standard_normal(p.shape).astype(np.float32))
            opt.step()  # the state exists: the second step is counted
            return opt.step
        return setup

    for n in (1, 8, 44):  # 44: the digits ViT's parameters
        cases[f"Adam step, {n} params"] = optimizer(lambda ps: nk.optim.Adam(ps, lr=1e-3), n)
        cases[f"AdamW step, {n} params"] = optimizer(lambda ps: nk.optim.AdamW(ps, lr=1e-3), n)
        cases[f"SGD momentum step, {n} params"] = optimizer(
            lambda ps: nk.optim.SGD(ps, lr=0.05, momentum=0.9), n)
    return cases


def _steps(batch):
    """{name: setup}: ``setup()`` builds a model and its optimizer, runs one step, and
    returns the step to count (the second)."""
    import cupy
    from bench_gpu import _step_models

    import nnkit.functional as F

    rng = np.random.default_rng(0)
    images = rng.standard_normal((batch, 1, 8, 8)).astype(np.float32)
    labels = rng.integers(0, 10, batch)
    models = _step_models(images, rng, small=False)
    cases = {}
    for name, (build, X, make_opt) in models.items():
        def setup(build=build, X=X, make_opt=make_opt):
            model = build().to("cuda")
            opt = make_opt(model.parameters())
            Xg, yg = cupy.asarray(X), cupy.asarray(labels)

            def step():
                opt.zero_grad()
                F.cross_entropy(model(Xg), yg).backward()
                opt.step()

            step()
            return step
        cases[f"{name} step ({sum(p.data.size for p in build().parameters())} weights)"] = setup
    return cases


def count(batch, only=None):
    """Rows {section, case, numba, kernels, memops, cupy (kind -> count)}."""
    rows = []
    sections = {"ops": _ops, "steps": _steps}
    for section, cases in sections.items():
        if only and section not in only:
            continue
        for name, setup in cases(batch).items():
            run = setup()
            work = _measure(run)
            rows.append({"section": section, "case": name, **work.summary(),
                         "numba_by_kernel": dict(work.numba), "cupy": dict(work.cupy)})
            print(f"{section:5s} | {name:32s} | numba {work.launches:4d} | kernels "
                  f"{work.kernels:5d} | memops {work.memops:4d}", flush=True)
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--markdown", action="store_true",
                        help="print the rows as a Markdown table too")
    parser.add_argument("--fast", action="store_true",
                        help="count the Numba launches without running them")
    parser.add_argument("--only", nargs="*", default=None, choices=("ops", "steps"))
    parser.add_argument("--json", default=None, help="write the rows to this JSON file")
    parser.add_argument("--check-batch", action="store_true",
                        help="count the steps at --batch and at --batch + 3 too: equal counts")
    parser.add_argument("--detail", action="store_true",
                        help="print each case's counts by kernel and CuPy operation")
    args = parser.parse_args(argv)
    _setup(args.fast)
    rows = count(args.batch, args.only)
    if args.detail:
        for row in rows:
            print(f"\n{row['case']}:")
            for kind, n in sorted({**{f"numba:{k}": v for k, v in row["numba_by_kernel"].items()},
                                   **row["cupy"]}.items(), key=lambda kv: -kv[1]):
                print(f"  {n:5d}  {kind}")
    if args.check_batch:
        other = count(args.batch + 3, ["steps"])
        keys = ("numba", "kernels")  # memops: autograd's copies of gradients whose id()
        # matched a freed one's vary from run to run
        base = {r["case"]: [r[k] for k in keys] for r in rows if r["section"] == "steps"}
        diff = {r["case"]: (base.get(r["case"]), [r[k] for k in keys]) for r in other
                if base.get(r["case"]) != [r[k] for k in keys]}
        if diff:
            print(f"counts depend on the batch: {diff}")
            return 1
        print(f"batch {args.batch} and {args.batch + 3}: the same counts")
    if args.markdown:
        print("\n| | case | Numba launches | device kernels |\n|---|---|---:|---:|")
        for row in rows:
            print(f"| {row['section']} | {row['case']} | {row['numba']} | {row['kernels']} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
