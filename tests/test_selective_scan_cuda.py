"""The selective scan's CUDA kernels (``nnkit._ext.selective_scan_cuda``) against the CPU's.

- Under Numba's simulator (a child process), launcher by launcher with blocks of 4 threads
  (several blocks): ``selective_scan_forward`` (y, the last state, the checkpoints) and
  ``selective_scan_backward`` (every gradient) against the CPU launchers on the same
  kernel-layout arrays, and the backward against the naive twin, for every layout of B and C
  (time-invariant, varying, grouped), with and without z, D, the bias and softplus, float32
  and float64, L across a chunk (70 > CHUNK = 64), and empty batch, L and N.
- On the CuPy stand-in (``cuda``; tests/test_gpu_stand_in.py) or a GPU, through the public
  API: ``F.selective_scan`` on CuPy tensors, forward and backward, against the CPU.
"""

import importlib
import sys

import numpy as np
import pytest
from helpers import run_simulator_cases, simulator_outcomes
from test_selective_scan import NAMES, assert_close, make_problem

# (batch, dim, L, N, B_rank, C_rank, G, with_D, with_z, with_bias, softplus, dtype)
CASES = [
    (2, 4, 70, 3, 3, 3, 1, True, True, True, True, np.float32),
    (2, 4, 70, 3, 4, 2, 2, True, True, True, True, np.float64),
    (1, 4, 70, 2, 2, 4, 4, False, False, False, False, np.float32),
    (2, 2, 9, 3, 4, 4, 2, True, False, True, True, np.float64),
    (2, 3, 5, 1, 2, 2, 1, False, True, False, True, np.float64),
    (1, 3, 65, 2, 3, 4, 3, True, True, False, False, np.float64),
    (0, 2, 5, 2, 3, 3, 1, True, True, True, True, np.float32),  # no rows
    (2, 2, 0, 2, 4, 2, 2, True, True, True, True, np.float32),  # L = 0
    (1, 2, 5, 0, 2, 3, 1, True, True, True, True, np.float64),  # N = 0
]


def _case(batch, dim, L, N, B_rank, C_rank, G, with_D, with_z, with_bias, softplus, dtype):
    """Both launchers against the CPU's on the validated boundary's kernel-layout arrays."""
    from nnkit._ext import selective_scan_cpu as cpu
    from nnkit._ext import selective_scan_cuda as gpu
    K = importlib.import_module("nnkit.kernels.selective_scan")
    R = importlib.import_module("nnkit.kernels.reference.selective_scan")

    args, softplus = make_problem(batch * 1000 + dim * 100 + L + N, batch, dim, L, N, B_rank,
                                  C_rank, G, with_D, with_z, with_bias, softplus, dtype)
    (y, last), c = K.selective_scan_forward(**args, delta_softplus=softplus,
                                            return_last_state=True)  # the CPU's
    inputs = (c.u, c.delta, c.A, c.Bm, c.Cm, c.D, c.z, c.bias, softplus, with_z, B_rank > 2,
              C_rank > 2)
    gy, glast, gck = np.empty_like(y), np.empty_like(last), np.empty_like(c.checkpoints)
    gpu.selective_scan_forward(*inputs, gy, glast, gck)
    factor = 64 + 4 * L
    assert_close(gy, y, dtype, factor, "y")
    assert_close(glast, last, dtype, factor, "last")
    assert_close(gck, c.checkpoints, dtype, factor, "checkpoints")

    rng = np.random.default_rng(L + 1)
    dy = rng.standard_normal(y.shape).astype(dtype)
    dlast = rng.standard_normal(last.shape).astype(dtype)

    def outputs():
        return [np.full_like(a, np.nan) for a in (c.u, c.u, c.z, c.A, c.Bm, c.Cm, c.D, c.bias)]

    want, got = outputs(), outputs()
    cpu.selective_scan_backward(dy, dlast, *inputs, c.checkpoints, *want)
    gpu.selective_scan_backward(dy, dlast, *inputs, gck, *got)
    names = ("du", "ddelta", "dz", "dA", "dB", "dC", "dD", "dbias")
    for name, g, w in zip(names, got, want, strict=True):
        assert_close(g, w, dtype, 4 * factor, name)
    # the public pair on the GPU launchers, against the naive twin
    twin = R.selective_scan_backward(dy, R.selective_scan_forward(
        **args, delta_softplus=softplus)[1], dlast)
    saved = K._kernels
    K._kernels = lambda u: gpu
    try:
        (_, _), gc = K.selective_scan_forward(**args, delta_softplus=softplus,
                                              return_last_state=True)
        grads = K.selective_scan_backward((dy, dlast), gc)
    finally:
        K._kernels = saved
    for name, g, r in zip(NAMES, grads, twin, strict=True):
        if args[name] is not None:
            assert_close(g, r, dtype, 4 * factor, f"twin d{name}")


def _cases():
    from nnkit._ext import selective_scan_cuda as gpu

    gpu.threads = 4  # several blocks, and threads past the last row
    for case in CASES:
        _case(*case)


def test_cuda_kernels_under_simulator(tmp_path):
    outcome = simulator_outcomes(__file__, tmp_path)["selective_scan"]
    assert outcome == "ok", outcome


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_public_selective_scan_on_gpu_matches_cpu(dtype):
    """F.selective_scan forward and backward (through nk.Tensor, the last state too) on CuPy
    arrays against the CPU: grouped B, time-invariant C, z, D, bias and softplus."""
    cupy = pytest.importorskip("cupy")
    import nnkit as nk
    import nnkit.functional as F

    batch, dim, L, N = 2, 4, 66, 3
    args, softplus = make_problem(7, batch, dim, L, N, B_rank=4, C_rank=2, G=2, dtype=dtype)
    rng = np.random.default_rng(8)
    dy = rng.standard_normal((batch, dim, L)).astype(dtype)
    dlast = rng.standard_normal((batch, dim, N)).astype(dtype)
    results = []
    for put in (np.asarray, cupy.asarray):
        tensors = {k: nk.tensor(put(v), requires_grad=True) for k, v in args.items()}
        y, last = F.selective_scan(**tensors, delta_softplus=softplus, return_last_state=True)
        ((y * nk.tensor(put(dy))).sum() + (last * nk.tensor(put(dlast))).sum()).backward()
        results.append([y.data, last.data, *(tensors[k].grad for k in NAMES)])
    factor = 4 * (64 + 4 * L)
    for name, g, w in zip(("y", "last", *NAMES), results[1], results[0], strict=True):
        assert isinstance(g, cupy.ndarray), name
        assert_close(cupy.asnumpy(g), w, dtype, factor, name)



@pytest.mark.cuda
def test_public_selective_scan_on_gpu_packed_matches_cpu():
    """cu_seqlens on CuPy arrays (sequences 0:30, 30:30, 30:67): y, the last states and the
    gradients against the CPU (float64)."""
    cupy = pytest.importorskip("cupy")
    import nnkit as nk
    import nnkit.functional as F

    args, softplus = make_problem(9, 1, 4, 67, 3, B_rank=4, C_rank=3, G=2)
    cu = np.array([0, 30, 30, 67])
    rng = np.random.default_rng(10)
    dy, dlast = rng.standard_normal((1, 4, 67)), rng.standard_normal((3, 4, 3))
    results = []
    for put in (np.asarray, cupy.asarray):
        tensors = {k: nk.tensor(put(v), requires_grad=True) for k, v in args.items()}
        y, last = F.selective_scan(**tensors, delta_softplus=softplus, return_last_state=True,
                                   cu_seqlens=cu)
        ((y * nk.tensor(put(dy))).sum() + (last * nk.tensor(put(dlast))).sum()).backward()
        results.append([y.data, last.data, *(tensors[k].grad for k in NAMES)])
    for name, g, w in zip(("y", "last", *NAMES), results[1], results[0], strict=True):
        assert isinstance(g, cupy.ndarray), name
        np.testing.assert_allclose(cupy.asnumpy(g), w, rtol=1e-9, atol=1e-11, err_msg=name)

if __name__ == "__main__":
    run_simulator_cases({"selective_scan": _cases}, sys.argv[1])
