"""Fewer device kernels per training step: the kernels that replaced
chains of CuPy kernels, and the budgets of whole steps.

- Under Numba's CUDA simulator (a child process): the GELU and dropout kernels
  (``nnkit._ext.activation_cuda``) against the CPU kernels (``activation_cpu``) and the naive
  twins, float32 and float64, with the boundaries |x| = 10, infinities and NaN, tiny blocks
  striding over the elements (dropout: bit for bit the CPU's mask and output, the same
  SplitMix64 stream); the mean cross-entropy's device mean and its backward
  (``softmax_cuda.cross_entropy_mean``, ``cross_entropy_mean_backward_rows``) against the
  CPU's ``cross_entropy_forward``/``backward``, ignored rows, all rows ignored (NaN loss, zero
  gradient) and an out-of-range target (NaN), one launch each.
- On the CPU: MultiheadAttention's packed self-attention op (``packed_self_attention``) gives
  the unpacked fused path's output and gradients, batch first or not, with dropout, masks
  and causality.
- On the CuPy stand-in (``cuda``; tests/test_gpu_stand_in.py) or a GPU: F.gelu, F.dropout
  and F.cross_entropy on CuPy arrays against the CPU, in one launch each way; and on the
  stand-in the Numba launches and all device kernels (CuPy's included, counted by
  ``tests/stand_in/cupy/_counting.py``) of every op and training step of
  ``benchmarks/gpu_kernel_counts.py``, pinned (the kernels counted, not simulated): the
  digits ViT's step at most half its 922 kernels before this work.
"""

import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_matches_reference, run_simulator_cases, simulator_outcomes
from op_facts import OP_FACTS

import nnkit as nk

ROOT = Path(__file__).resolve().parent.parent
DTYPES = (np.float32, np.float64)


# ---- cases, run in the simulator's child ---------------------------------------------------

def _gelu_inputs(rng, dtype):
    x = np.concatenate([np.linspace(-12, 12, 61), [-10.0, 10.0, -10.5, 9.99, 0.0, -0.0,
                                                  np.inf, -np.inf, np.nan, 1e30, -1e30],
                        rng.standard_normal(40) * 4])
    return x.astype(dtype)


def _gelu_on(module, form, x, g):
    """(y, dx) from ``module``'s GELU kernels of ``form``."""
    y, dx = np.full_like(x, 7), np.full_like(x, 7)
    stem = "gelu" if form == "none" else "gelu_tanh"
    getattr(module, f"{stem}_forward")(x, y)
    getattr(module, f"{stem}_backward")(g, x, dx)
    return y, dx


def _gelu_case():
    """Both forms: one launch each way, equal to the CPU's kernels and to the twin."""
    from nnkit._ext import activation_cpu, activation_cuda
    from nnkit._ext._launch import count_launches
    from nnkit.kernels import reference

    rng = np.random.default_rng(0)
    saved = activation_cuda.threads, activation_cuda.max_blocks
    activation_cuda.threads, activation_cuda.max_blocks = 4, 3  # several strides
    try:
        for dtype, form in [(d, f) for d in DTYPES for f in ("none", "tanh")]:
            x = _gelu_inputs(rng, dtype)
            g = rng.standard_normal(x.shape).astype(dtype)
            with count_launches() as launches:
                y, dx = _gelu_on(activation_cuda, form, x, g)
            stem = "activation_cuda._gelu" + ("" if form == "none" else "_tanh")
            assert launches == {f"{stem}_forward_kernel": 1, f"{stem}_backward_kernel": 1}
            cy, cdx = _gelu_on(activation_cpu, form, x, g)
            # float64 exact form: the CPU's formula; float32: the CPU computes in float32
            # (its Phi a fit within 4e-7 relative of erf's); the twin's tanh form takes
            # tanh where the kernels take 1 / (1 + exp(-2u))
            factor = 8 if dtype == np.float64 and form == "none" else 64
            name = f"{np.dtype(dtype).name} {form}"
            for what, a, c in [("y", y, cy), ("dx", dx, cdx)]:
                assert_matches_reference(a, c, dtype, factor=factor, err_msg=f"{what} {name}")
            finite = np.isfinite(x) & (np.abs(x) < 1e3)
            y_twin, cache = reference.gelu_forward(x[finite].astype(np.float64), form)
            assert_matches_reference(y[finite], y_twin, dtype, factor=factor,
                                     err_msg=f"y vs twin {name}")
            assert_matches_reference(dx[finite], reference.gelu_backward(g[finite], cache),
                                     dtype, factor=factor, err_msg=f"dx vs twin {name}")
    finally:
        activation_cuda.threads, activation_cuda.max_blocks = saved


def _dropout_case():
    from nnkit._ext import activation_cpu, activation_cuda
    from nnkit._ext._launch import count_launches
    from nnkit.kernels import reference

    rng = np.random.default_rng(1)
    saved = activation_cuda.threads, activation_cuda.max_blocks
    activation_cuda.threads, activation_cuda.max_blocks = 4, 3
    try:
        for dtype in DTYPES:
            for p, seed, n in ((0.1, 12345, 50), (0.5, 2**63 - 2, 37), (0.9, 0, 1)):
                x = rng.standard_normal(n).astype(dtype)
                y, mask = np.full_like(x, 7), np.full_like(x, 7)
                with count_launches() as launches:
                    activation_cuda.dropout_forward(x, seed, p, 1.0 / (1.0 - p), y, mask)
                assert launches == {"activation_cuda._dropout_kernel": 1}
                cy, cmask = np.empty_like(x), np.empty_like(x)
                activation_cpu.dropout_forward(x, np.uint64(seed), p, 1.0 / (1.0 - p), cy,
                                               cmask)
                msg = f"{np.dtype(dtype).name} p={p} seed={seed}"
                np.testing.assert_array_equal(mask, cmask, err_msg=msg)
                np.testing.assert_array_equal(y, cy, err_msg=msg)
                np.testing.assert_array_equal(mask, reference.dropout_mask(x.shape, p, seed,
                                                                           dtype), err_msg=msg)
    finally:
        activation_cuda.threads, activation_cuda.max_blocks = saved


def _cross_entropy_mean_case():
    from nnkit._ext import softmax_cuda
    from nnkit._ext._launch import count_launches
    from nnkit.kernels import cross_entropy_backward, cross_entropy_forward

    rng = np.random.default_rng(2)
    saved = softmax_cuda.block_min, softmax_cuda.block_max
    softmax_cuda.block_min, softmax_cuda.block_max = 2, 4  # rows reduced by strided loops
    try:
        for dtype in DTYPES:
            for N, C, ignored in ((1, 3, ()), (7, 5, (2, 6)), (3, 4, (0, 1, 2)), (9, 1, (4,))):
                x = (rng.standard_normal((N, C)) * 3).astype(dtype)
                target = rng.integers(0, C, N)
                target[list(ignored)] = -100
                lse = np.full(N, np.nan)
                loss_rows = np.full(N, np.nan)
                loss, n_valid = np.full(1, 7, dtype), np.full(1, 7.0)
                dloss = np.array([0.7], dtype)
                out = np.full((N, C), np.nan, dtype)
                with count_launches() as launches:
                    softmax_cuda.cross_entropy_rows(x, target, -100, lse, loss_rows)
                    softmax_cuda.cross_entropy_mean(loss_rows, target, -100, loss, n_valid)
                    softmax_cuda.cross_entropy_mean_backward_rows(x, target, lse, dloss,
                                                                  n_valid, -100, out)
                assert launches == {"softmax_cuda._cross_entropy_kernel": 1,
                                    "softmax_cuda._mean_valid_kernel": 1,
                                    "softmax_cuda._cross_entropy_mean_backward_kernel": 1}
                msg = f"{np.dtype(dtype).name} N={N} C={C} ignored={ignored}"
                assert n_valid[0] == N - len(ignored), msg
                want, cache = cross_entropy_forward(x, target)  # the CPU pair
                grad = cross_entropy_backward(dloss[0], cache)
                if len(ignored) == N:
                    assert np.isnan(loss[0]) and np.isnan(want), msg
                    assert np.all(out == 0), msg
                    continue
                assert_matches_reference(loss, np.asarray(want).reshape(1), dtype, factor=8,
                                         err_msg=msg)
                assert_matches_reference(out, grad, dtype, factor=8, err_msg=msg)
        # a target out of range: NaN, no read out of bounds
        x = np.zeros((2, 3), np.float32)
        target = np.array([1, 5])
        lse, rows = np.empty(2), np.empty(2)
        loss, n_valid = np.empty(1, np.float32), np.empty(1)
        softmax_cuda.cross_entropy_rows(x, target, -100, lse, rows)
        softmax_cuda.cross_entropy_mean(rows, target, -100, loss, n_valid)
        assert np.isnan(loss[0]) and n_valid[0] == 2
    finally:
        softmax_cuda.block_min, softmax_cuda.block_max = saved


SIM_CASES = {"gelu_matches_the_cpu": _gelu_case, "dropout_matches_the_cpu": _dropout_case,
             "cross_entropy_mean_matches_the_cpu": _cross_entropy_mean_case}


@pytest.fixture(scope="module")
def simulator(tmp_path_factory):
    return simulator_outcomes(__file__, tmp_path_factory.mktemp("cudasim_fewer"))


@pytest.mark.parametrize("case", list(SIM_CASES))
def test_kernels_under_simulator(simulator, case):
    if simulator[case] != "ok":
        pytest.fail(f"{case} failed under the CUDA simulator:\n{simulator[case]}",
                    pytrace=False)


# ---- the packed self-attention op (CPU) -------------------------------------------------------

@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("variant", ["plain", "dropout", "causal", "padding"])
def test_packed_self_attention_is_the_unpacked_fused_path(monkeypatch, batch_first, variant):
    """MultiheadAttention's self-attention through the packed op and through the separate
    heads (the op switched off): the same output and gradients (and the same dropout draws
    under one seed)."""
    from nnkit.nn import attention as attention_module

    rng = np.random.default_rng(3)
    N, L, E, H = 3, 5, 8, 2
    x = rng.standard_normal((N, L, E) if batch_first else (L, N, E))
    kwargs = {}
    if variant == "causal":
        kwargs = dict(attn_mask=nk.nn.Transformer.generate_square_subsequent_mask(L),
                      is_causal=True)
    elif variant == "padding":
        pad = np.zeros((N, L), bool)
        pad[0, -2:] = True
        kwargs = dict(key_padding_mask=pad)
    results = []
    for packed in (True, False):
        nk.manual_seed(0)
        mha = nk.nn.MultiheadAttention(E, H, dropout=0.3 if variant == "dropout" else 0.0,
                                       batch_first=batch_first).double()
        if not packed:
            monkeypatch.setattr(attention_module.MultiheadAttention, "_packed",
                                lambda self, *args: None)
        seen = []
        monkeypatch.setattr(attention_module, "packed_self_attention", _recording(
            attention_module.packed_self_attention, seen))
        xt = nk.tensor(x, requires_grad=True)
        nk.manual_seed(1)
        out, weights = mha(xt, xt, xt, need_weights=False, **kwargs)
        assert weights is None and len(seen) == int(packed)
        (out * out).sum().backward()
        results.append([out.numpy(), xt.grad] + [p.grad for p in mha.parameters()])
    for a, b in zip(*results, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-13)


def _recording(fn, seen):
    def call(*args, **kwargs):
        seen.append(1)
        return fn(*args, **kwargs)
    return call


# ---- on a GPU or the stand-in ------------------------------------------------------------------

@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_gelu_dropout_and_cross_entropy_on_gpu_in_one_launch_each(dtype):
    cupy = pytest.importorskip("cupy")
    import nnkit.functional as F
    from nnkit._ext._launch import count_launches

    rng = np.random.default_rng(4)
    x = rng.standard_normal((6, 9)).astype(dtype) * 4
    cpu = nk.tensor(x, requires_grad=True)
    gpu = nk.tensor(cupy.asarray(x), requires_grad=True)
    target = np.array([0, 8, -100, 3, 3, 1])
    launches, losses = [], []
    for t, tgt in ((cpu, target), (gpu, cupy.asarray(target))):
        nk.manual_seed(5)  # the same dropout mask on either device
        with count_launches() as fwd:
            loss = F.cross_entropy(F.dropout(F.gelu(t), 0.25), tgt)
        with count_launches() as bwd:
            loss.backward()
        launches.append((dict(fwd), dict(bwd)))
        losses.append(np.asarray(loss.item(), dtype))
    factor = 64 if dtype == np.float32 else 8  # the CPU's float32 Phi: a fit of erf
    assert_matches_reference(losses[1], losses[0], dtype, factor=factor)
    assert_matches_reference(gpu.grad.get(), cpu.grad, dtype, factor=factor)
    assert launches[1] == (
        {"activation_cuda._gelu_forward_kernel": 1, "activation_cuda._dropout_kernel": 1,
         "softmax_cuda._cross_entropy_kernel": 1, "softmax_cuda._mean_valid_kernel": 1},
        {"softmax_cuda._cross_entropy_mean_backward_kernel": 1,
         "activation_cuda._gelu_backward_kernel": 1})


def _stand_in_counts(monkeypatch):
    """The rows of benchmarks/gpu_kernel_counts.py on the stand-in, kernels counted and not
    simulated (their outputs unwritten: no count depends on them)."""
    cupy = pytest.importorskip("cupy")
    if not cupy.__version__.endswith("stand-in"):
        pytest.skip("all device kernels are counted on the CuPy stand-in only")
    from numba.cuda.simulator.kernel import FakeCUDAKernel

    monkeypatch.setattr(FakeCUDAKernel, "__call__", lambda self, *args: None)
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import gpu_kernel_counts

    with np.errstate(all="ignore"):
        return {row["case"]: (row["numba"], row["kernels"])
                for row in gpu_kernel_counts.count(4)}


# (Numba launches, all device kernels) of each row of benchmarks/gpu_kernel_counts.py: the
# public ops' rows are their launch budgets in tests/op_facts.py, the rest here. Before this
# work the steps made (2, 79), (9, 71), (16, 268) and (49, 922): benchmarks/RESULTS.md
STEP_BUDGETS = {
    "self-attention MHA 64/8 fwd": (1, 7), "self-attention MHA 64/8 bwd": (3, 11),
    "Adam step, 1 params": (1, 1), "AdamW step, 1 params": (1, 1),
    "SGD momentum step, 1 params": (1, 1), "Adam step, 8 params": (1, 1),
    "AdamW step, 8 params": (1, 1), "SGD momentum step, 8 params": (1, 1),
    "Adam step, 44 params": (3, 3), "AdamW step, 44 params": (3, 3),
    "SGD momentum step, 44 params": (2, 2),
    "mlp step (9610 weights)": (4, 17), "cnn step (1898 weights)": (11, 36),
    "encoder layer step (44362 weights)": (16, 51), "vit step (102666 weights)": (62, 174),
}
BUDGETS = {row: budget for facts in OP_FACTS.values() for row, budget in
           (facts.launch_budget or {}).items()} | STEP_BUDGETS


@pytest.mark.cuda
def test_launch_budgets_on_gpu_of_every_op_and_step_in_all_device_kernels(monkeypatch):
    """Each op and training step of benchmarks/gpu_kernel_counts.py makes the Numba launches
    and device kernels pinned here (a change to them is a change to this list); the ViT
    step at most half its kernels before (922)."""
    counts = _stand_in_counts(monkeypatch)
    problems = [f"{case}: {counts.get(case)} != {budget}" for case, budget in BUDGETS.items()
                if counts.get(case) != budget]
    assert problems == [] and set(counts) == set(BUDGETS), problems
    assert counts["vit step (102666 weights)"][1] <= 922 // 2


if __name__ == "__main__":
    run_simulator_cases(SIM_CASES, sys.argv[1])
