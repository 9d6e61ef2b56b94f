"""The multi-tensor optimizer steps on the GPU (``nnkit._ext.optim_cuda``): one launch for
many parameters.

- Under Numba's CUDA simulator (a child process): ``adam_step`` (Adam, AdamW, coupled
  decay, maximize, AMSGrad, beta1 > 0.5 and < 0.5) and ``sgd_step`` (plain, momentum,
  dampening, Nesterov, decay, maximize; the first momentum step and later ones) on lists of
  tensors of several sizes (0 and 1 included), float32 and float64, over three steps: bit
  for bit the array path of ``nnkit.optim`` (the CuPy path's in-place ufuncs, run on NumPy
  arrays), within a few ulps of the CPU's fused Adam, with tiny blocks (several blocks and
  grid strides per tensor) and few tensors per launch (several launches, each counted).
- On the CuPy stand-in (``cuda``; tests/test_gpu_stand_in.py) or a GPU: ``nk.optim.Adam``,
  ``AdamW`` (AMSGrad) and ``SGD`` (Nesterov) on CuPy parameters of two dtypes, a gradient
  missing at one step and a strided one (left to the array path), equal to the array path
  (``optim._USE_NUMBA = False``) and held to their launches: one per dtype and step count
  and per ``per_launch`` parameters.
"""

import math
import sys

import numpy as np
import pytest
from helpers import run_simulator_cases, simulator_outcomes

SIZES = (5, 12, 0, 1, 37, 3, 8)

ADAM_CONFIGS = [
    dict(lr=1e-2),
    dict(lr=3e-3, weight_decay=0.1, maximize=True),
    dict(lr=1e-2, weight_decay=0.05, decoupled=True),
    dict(lr=1e-2, weight_decay=0.05, decoupled=True, amsgrad=True),
    dict(lr=1e-2, betas=(0.3, 0.9), amsgrad=True, maximize=True),
]
SGD_CONFIGS = [
    dict(lr=0.1),
    dict(lr=0.1, momentum=0.9),
    dict(lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01),
    dict(lr=0.05, momentum=0.8, nesterov=True, maximize=True),
    dict(lr=0.05, weight_decay=0.1, maximize=True),
]


def _tensors(rng, dtype):
    return [rng.standard_normal(n).astype(dtype) for n in SIZES]


def _array_path(make_opt, params, grads_per_step):
    """The parameters and state (a list of dicts, one per parameter) after each step of
    ``nnkit.optim``'s array path."""
    import nnkit as nk
    from nnkit import optim

    ps = [nk.nn.Parameter(p.copy()) for p in params]
    opt = make_opt(ps)
    saved, optim._USE_NUMBA = optim._USE_NUMBA, False
    try:
        out = []
        for grads in grads_per_step:
            for p, g in zip(ps, grads, strict=True):
                p.grad = g.copy()
            opt.step()
            out.append(([p.data.copy() for p in ps],
                        [{k: v.copy() if hasattr(v, "copy") else v for k, v in opt.state[p].items()}
                         for p in ps]))
        return out
    finally:
        optim._USE_NUMBA = saved


def _small_launches(per_launch):
    """Tiny blocks and ``per_launch`` tensors per launch (for 4 arrays per tensor)."""
    from nnkit._ext import optim_cuda as oc

    saved = oc.threads, oc.max_blocks, oc.PARAM_BYTES
    oc.threads, oc.max_blocks, oc.PARAM_BYTES = 4, 2, per_launch * 4 * 56
    return saved


def _restore(saved):
    from nnkit._ext import optim_cuda as oc

    oc.threads, oc.max_blocks, oc.PARAM_BYTES = saved


def _adam_case():
    from nnkit import optim
    from nnkit._ext import optim_cuda as oc
    from nnkit._ext._launch import count_launches
    from nnkit._ext.optim_cpu import adam_update_cpu

    rng = np.random.default_rng(0)
    saved = _small_launches(3)
    try:
        for dtype in (np.float32, np.float64):
            for cfg in ADAM_CONFIGS:
                cfg = dict(cfg)
                decoupled = cfg.pop("decoupled", False)
                amsgrad = cfg.get("amsgrad", False)
                opts = {**dict(betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, maximize=False,
                               amsgrad=False), **cfg}
                params = _tensors(rng, dtype)
                steps = [_tensors(rng, dtype) for _ in range(3)]
                want = _array_path(lambda ps, opts=opts, decoupled=decoupled: optim.Adam(
                    ps, decoupled_weight_decay=decoupled, **opts), params, steps)
                p = [a.copy() for a in params]
                m, v, vm = ([np.zeros_like(a) for a in params] for _ in range(3))
                cpu = [[a.copy() for a in params]] + [[np.zeros_like(a) for a in params]
                                                      for _ in range(3)]
                for step, grads in enumerate(steps, 1):
                    with count_launches() as launches:
                        oc.adam_step(p, grads, m, v, vm if amsgrad else None, lr=opts["lr"],
                                     beta1=opts["betas"][0], beta2=opts["betas"][1],
                                     eps=opts["eps"], weight_decay=opts["weight_decay"],
                                     step=step, maximize=opts["maximize"], decoupled=decoupled)
                    name = "optim_cuda." + ("adam_amsgrad" if amsgrad else "adam")
                    per = oc.per_launch(5 if amsgrad else 4)
                    assert launches == {name: math.ceil(len(SIZES) / per)}, (launches, per)
                    msg = f"{np.dtype(dtype).name} {cfg} decoupled={decoupled} step {step}"
                    got_p, state = want[step - 1]
                    for i, a in enumerate(p):
                        np.testing.assert_array_equal(a, got_p[i], err_msg=msg)
                    for i in range(len(SIZES)):
                        assert state[i]["step"] == step
                        np.testing.assert_array_equal(m[i], state[i]["exp_avg"], err_msg=msg)
                        np.testing.assert_array_equal(v[i], state[i]["exp_avg_sq"], err_msg=msg)
                        if amsgrad:
                            np.testing.assert_array_equal(vm[i], state[i]["max_exp_avg_sq"],
                                                          err_msg=msg)
                    # the CPU's fused pass (a different order of the last products)
                    lr, wd = opts["lr"], opts["weight_decay"]
                    b1, b2 = opts["betas"]
                    w1 = 1 - b1
                    for i, g in enumerate(grads):
                        coef = np.array([wd, 1 - lr * wd, w1, 1 - w1, b2, 1 - b2,
                                         (1 - b2**step) ** 0.5, opts["eps"],
                                         -lr / (1 - b1**step)], dtype=dtype)
                        adam_update_cpu(cpu[0][i], g, cpu[1][i], cpu[2][i],
                                        cpu[3][i] if amsgrad else cpu[2][i], coef, w1 < 0.5,
                                        amsgrad, opts["maximize"], wd != 0 and not decoupled,
                                        wd != 0 and decoupled)
                        eps = np.finfo(dtype).eps
                        np.testing.assert_allclose(p[i], cpu[0][i], rtol=64 * eps,
                                                   atol=64 * eps, err_msg=msg)
    finally:
        _restore(saved)


def _sgd_case():
    from nnkit import optim
    from nnkit._ext import optim_cuda as oc
    from nnkit._ext._launch import count_launches

    rng = np.random.default_rng(1)
    saved = _small_launches(3)
    try:
        for dtype in (np.float32, np.float64):
            for cfg in SGD_CONFIGS:
                opts = {**dict(momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False,
                               maximize=False), **cfg}
                params = _tensors(rng, dtype)
                steps = [_tensors(rng, dtype) for _ in range(3)]
                want = _array_path(lambda ps, opts=opts: optim.SGD(ps, **opts), params, steps)
                p = [a.copy() for a in params]
                bufs = [np.full_like(a, np.nan) for a in params]  # written at the first step
                for step, grads in enumerate(steps, 1):
                    with count_launches() as launches:
                        oc.sgd_step(p, grads, bufs if opts["momentum"] else None,
                                    first=step == 1, **opts)
                    per = oc.per_launch(3)
                    assert launches == {"optim_cuda._sgd_kernel": math.ceil(len(SIZES) / per)}
                    msg = f"{np.dtype(dtype).name} {cfg} step {step}"
                    got_p, state = want[step - 1]
                    for i, a in enumerate(p):
                        np.testing.assert_array_equal(a, got_p[i], err_msg=msg)
                        if opts["momentum"]:
                            np.testing.assert_array_equal(
                                bufs[i], state[i]["momentum_buffer"], err_msg=msg)
    finally:
        _restore(saved)


SIM_CASES = {"adam_matches_the_array_path": _adam_case,
             "sgd_matches_the_array_path": _sgd_case}


@pytest.fixture(scope="module")
def simulator(tmp_path_factory):
    return simulator_outcomes(__file__, tmp_path_factory.mktemp("cudasim_optim"))


@pytest.mark.parametrize("case", list(SIM_CASES))
def test_multi_tensor_steps_under_simulator(simulator, case):
    if simulator[case] != "ok":
        pytest.fail(f"{case} failed under the CUDA simulator:\n{simulator[case]}",
                    pytrace=False)


# ---- nk.optim on CuPy parameters (a GPU or the stand-in) ---------------------------------------

def _gpu_params(cupy, rng):
    shapes = [(4, 3), (3,), (2, 2, 2), (1,), (6,)] * 4 + [(5,), (0, 3)]
    dtypes = [np.float32] * 20 + [np.float64] * 2
    return [(cupy.asarray(rng.standard_normal(s).astype(d))) for s, d in
            zip(shapes, dtypes, strict=True)]


OPTIMIZERS = {
    "adam": lambda optim, ps: optim.Adam(ps, lr=1e-2, weight_decay=0.01),
    "adamw amsgrad": lambda optim, ps: optim.AdamW(ps, lr=1e-2, amsgrad=True),
    "sgd nesterov": lambda optim, ps: optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True,
                                                weight_decay=0.01),
}


@pytest.mark.cuda
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_optimizers_on_gpu_match_the_array_path_in_few_launches(name):
    """Three steps of each optimizer over 22 CuPy parameters (20 float32, 2 float64): at
    step 2 one gradient is missing and one is strided (both left to the array path); the
    parameters and state equal the array path's, and the launches are one per dtype (and
    per ``per_launch`` parameters) and step."""
    cupy = pytest.importorskip("cupy")
    import nnkit as nk
    from nnkit import optim
    from nnkit._ext import optim_cuda as oc
    from nnkit._ext._launch import count_launches

    rng = np.random.default_rng(2)
    start = _gpu_params(cupy, rng)
    grads = [[cupy.asarray(rng.standard_normal(a.shape).astype(a.dtype)) for a in start]
             for _ in range(3)]
    grads[1][0] = None
    strided = cupy.asarray(rng.standard_normal((4, 6)).astype(np.float32))[:, ::2]
    grads[1][5] = strided  # shape (4, 3), not C-contiguous
    runs = {}
    for fused in (True, False):
        params = [nk.nn.Parameter(a.copy()) for a in start]
        opt = OPTIMIZERS[name](optim, params)
        saved, optim._USE_NUMBA = optim._USE_NUMBA, fused
        launches = []
        try:
            for step in grads:
                for p, g in zip(params, step, strict=True):
                    p.grad = g
                with count_launches() as counts:
                    opt.step()
                launches.append(sum(counts.values()))
        finally:
            optim._USE_NUMBA = saved
        runs[fused] = ([p.data.get() for p in params], opt.state_dict(), launches)
    got, want = runs[True], runs[False]
    for a, b in zip(got[0], want[0], strict=True):
        np.testing.assert_array_equal(a, b)
    for key, state in want[1]["state"].items():
        for k, value in state.items():
            np.testing.assert_array_equal(got[1]["state"][key][k], value, err_msg=f"{key} {k}")
    per = oc.per_launch(5 if "amsgrad" in name else 3 if "sgd" in name else 4)
    # float32: 20 parameters (18 at step 2, the missing and the strided gradients aside);
    # float64: 2, one of them empty (its launch has work in the other)
    expected = [math.ceil(20 / per) + 1, math.ceil(18 / per) + 1, math.ceil(20 / per) + 1]
    if "adam" in name:  # step 3: the parameter without a gradient at step 2 is one step
        # behind (its own bias corrections, its own launch), the strided one is not
        expected[2] += 1
    assert got[2] == expected, (got[2], expected)
    assert want[2] == [0, 0, 0]


if __name__ == "__main__":
    run_simulator_cases(SIM_CASES, sys.argv[1])
