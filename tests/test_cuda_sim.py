"""The CUDA kernels (layer_norm, the softmax family) against the naive twins.

Numba's CUDA simulator must be switched on before ``numba.cuda`` is first imported, and the
rest of the suite runs in one process without it. So this module runs itself as a script in
a child process with ``NUMBA_ENABLE_CUDASIM=1`` (once per session, the ``simulator`` fixture),
where every ``_case_*`` function runs and its outcome ("ok" or the traceback) is written to a
JSON file; ``test_under_simulator[<case>]`` then fails with the child's traceback. A child
that crashes fails every case. Shapes are tiny (rows 0..5, columns 1..33); the launchers'
block sizes are lowered to 2-4 threads so the strided loops and the tree reductions run over
columns that are not multiples of the block, and one case per family keeps the defaults.

The tests marked ``cuda`` run the public functions on CuPy arrays against the CPU path; they
are skipped unless a real GPU and CuPy are present (tests/conftest.py).
"""

import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import run_simulator_cases, simulator_outcomes
from numba import cuda, float64

ROOT = Path(__file__).resolve().parent.parent
DTYPES = (np.float32, np.float64)
# (rows, cols): 0 rows, single column, cols on both sides of a power of two
SHAPES = [(0, 3), (1, 1), (1, 33), (2, 7), (3, 16), (4, 17), (5, 2), (5, 33)]
SMALL_BLOCKS = {"block_min": 2, "block_max": 4, "col_threads": 4}
DEFAULT_SHAPES = [(2, 33), (1, 5)]


# ---- cases, run in the child ---------------------------------------------------------------

def _configure(small):
    from nnkit._ext import layer_norm_cuda, softmax_cuda

    softmax_cuda.block_min = SMALL_BLOCKS["block_min"] if small else 32
    softmax_cuda.block_max = SMALL_BLOCKS["block_max"] if small else softmax_cuda.MAX_THREADS
    layer_norm_cuda.col_threads = SMALL_BLOCKS["col_threads"] if small else 128
    return SHAPES if small else DEFAULT_SHAPES


def _logits(rng, shape, dtype):
    """Random logits; row 0 holds +1e4, row 1 -1e4 and +1e4 (max-shift must hold)."""
    x = rng.standard_normal(shape) * 3
    if shape[0] >= 1:
        x[0, -1] = 1e4
    if shape[0] >= 2:
        x[1, 0] = -1e4
        x[1, -1] = 1e4 if shape[1] > 1 else -1e4
    return x.astype(dtype)


def _softmax_family(small):
    from helpers import assert_matches_reference

    from nnkit._ext import softmax_cuda
    from nnkit.kernels import reference

    rng = np.random.default_rng(0)
    for shape in _configure(small):
        for dtype in DTYPES:
            msg = f"shape {shape} {np.dtype(dtype).name}"
            x = _logits(rng, shape, dtype)
            dy = rng.standard_normal(shape).astype(dtype)
            out = np.full(shape, np.nan, dtype)
            softmax_cuda.softmax_rows(x, out)
            assert_matches_reference(out, reference.softmax(x), dtype, err_msg="softmax " + msg)
            softmax_cuda.log_softmax_rows(x, out)
            assert_matches_reference(out, reference.log_softmax(x), dtype,
                                     err_msg="log_softmax " + msg)
            y, cache = reference.softmax_forward(x)
            softmax_cuda.softmax_backward_rows(dy, y, out)
            assert_matches_reference(out, reference.softmax_backward(dy, cache), dtype,
                                     err_msg="softmax_backward " + msg)
            y, cache = reference.log_softmax_forward(x)
            softmax_cuda.log_softmax_backward_rows(dy, y, out)
            assert_matches_reference(out, reference.log_softmax_backward(dy, cache), dtype,
                                     err_msg="log_softmax_backward " + msg)


def _cross_entropy(small):
    from helpers import assert_matches_reference

    from nnkit._ext import softmax_cuda
    from nnkit.kernels import reference

    rng = np.random.default_rng(1)
    for shape in _configure(small):
        N, C = shape
        for dtype in DTYPES:
            for ignore_index, tdtype in ((-100, np.int64), (min(1, C - 1), np.int32)):
                msg = f"shape {shape} {np.dtype(dtype).name} ignore_index={ignore_index}"
                x = _logits(rng, shape, dtype)
                target = rng.integers(0, C, N).astype(tdtype)
                if N >= 2:  # one ignored row, and the +-1e4 rows keep their targets
                    target[-1] = ignore_index
                    target[1] = 0
                lse = np.full(N, np.nan, dtype)
                loss_rows = np.full(N, np.nan, dtype)
                softmax_cuda.cross_entropy_rows(x, target, ignore_index, lse, loss_rows)
                lp = reference.log_softmax(x.astype(np.float64))  # (N, C) float64
                valid = target != ignore_index
                rows = np.arange(N)
                assert_matches_reference(lse, x[:, 0] - lp[:, 0], dtype, err_msg="lse " + msg)
                expected = np.where(valid, -lp[rows, np.where(valid, target, 0)], 0.0)
                assert_matches_reference(loss_rows, expected, dtype, err_msg="loss_rows " + msg)
                if valid.any():
                    mean = loss_rows.astype(np.float64).sum() / valid.sum()
                    assert_matches_reference(np.asarray(mean, dtype),
                                             reference.cross_entropy(x, target, ignore_index),
                                             dtype, err_msg="mean loss " + msg)
                # backward from a float64 lse (exact) and from the dtype's lse (as the public
                # function passes it): exp(x - lse) then carries ulp(|lse|) of error
                dloss = 0.7
                scale = dloss / valid.sum() if valid.any() else 0.0
                expected = reference.cross_entropy_backward(dloss, (x, target, ignore_index))
                out = np.full(shape, np.nan, dtype)
                lse64 = (x[:, 0] - lp[:, 0]).astype(np.float64)
                softmax_cuda.cross_entropy_backward_rows(x, target, lse64, scale, ignore_index,
                                                         out)
                assert_matches_reference(out, expected, dtype, err_msg="backward " + msg)
                softmax_cuda.cross_entropy_backward_rows(x, target, lse, scale, ignore_index,
                                                         out)
                eps = float(np.finfo(dtype).eps)
                lse_err = np.abs(lse.astype(np.float64) - lse64)[:, None]  # (N, 1)
                bound = (lse_err + 64 * eps) * scale + 64 * eps * np.abs(expected)
                excess = np.abs(out.astype(np.float64) - expected) - bound
                assert not (excess > 0).any(), f"backward (dtype lse) {msg}: {excess.max()}"
                assert np.all(out[~valid] == 0), msg


def _layer_norm(small):
    from helpers import assert_matches_reference

    from nnkit._ext import layer_norm_cpu, layer_norm_cuda
    from nnkit.kernels import reference

    rng = np.random.default_rng(2)
    for M, D in _configure(small):
        for dtype in DTYPES:
            msg = f"shape {(M, D)} {np.dtype(dtype).name}"
            x = (rng.standard_normal((M, D)) * 2 + 1).astype(dtype)
            w = rng.standard_normal(D).astype(dtype)
            b = rng.standard_normal(D).astype(dtype)
            dy = rng.standard_normal((M, D)).astype(dtype)
            y = np.full((M, D), np.nan, dtype)
            mean = np.full(M, np.nan, dtype)
            rstd = np.full(M, np.nan, dtype)
            layer_norm_cuda.layer_norm_rows(x, w, b, 1e-5, y, mean, rstd)
            assert_matches_reference(y, reference.layer_norm(x, w, b), dtype, err_msg="y " + msg)
            x64 = x.astype(np.float64)
            assert_matches_reference(mean, x64.mean(axis=1), dtype, err_msg="mean " + msg)
            rstd_exp = 1 / np.sqrt(x64.var(axis=1) + 1e-5)
            assert_matches_reference(rstd, rstd_exp, dtype, err_msg="rstd " + msg)
            dx = np.full((M, D), np.nan, dtype)
            dw = np.full(D, np.nan, dtype)
            db = np.full(D, np.nan, dtype)
            layer_norm_cuda.layer_norm_backward_rows(dy, x, mean, rstd, w, dx, dw, db)
            rdx, rdw, rdb = reference.layer_norm_backward(dy, reference.layer_norm_forward(
                x, w, b)[1])
            assert_matches_reference(dx, rdx, dtype, err_msg="dx " + msg)
            assert_matches_reference(dw, rdw, dtype, factor=256, err_msg="dweight " + msg)
            assert_matches_reference(db, rdb, dtype, factor=256, err_msg="dbias " + msg)
            # the CPU kernels: same algorithm, so within a few ulps
            cdx, cdw, cdb = np.empty_like(dx), np.empty_like(dw), np.empty_like(db)
            layer_norm_cpu.layer_norm_backward_rows(dy, x, mean, rstd, w, cdx, cdw, cdb)
            for name, a, c in (("dx", dx, cdx), ("dweight", dw, cdw), ("dbias", db, cdb)):
                assert_matches_reference(a, c, dtype, factor=8, err_msg=f"{name} vs cpu {msg}")
            # dx only, dbias only
            dx2 = np.full((M, D), np.nan, dtype)
            layer_norm_cuda.layer_norm_backward_rows(dy, x, mean, rstd, w, dx2)
            np.testing.assert_array_equal(dx2, dx, err_msg="dx only " + msg)
            db2 = np.full(D, np.nan, dtype)
            layer_norm_cuda.layer_norm_backward_rows(dy, x, mean, rstd, w, dx2, None, db2)
            np.testing.assert_array_equal(db2, db, err_msg="dbias only " + msg)
            dw2 = np.full(D, np.nan, dtype)  # and dweight only (dweight and dbias: one launch)
            layer_norm_cuda.layer_norm_backward_rows(dy, x, mean, rstd, w, dx2, dw2, None)
            np.testing.assert_array_equal(dw2, dw, err_msg="dweight only " + msg)
        # float32 rows at 1e4 with std 0.1: the cached float32 mean is off by up to 5e-4,
        # i.e. 5e-3 in xhat, unless the backward corrects it
        x = (1e4 + 0.1 * rng.standard_normal((3, 17))).astype(np.float32)
        dy, w = rng.standard_normal((3, 17)).astype(np.float32), np.ones(17, np.float32)
        y, mean, rstd = np.empty_like(x), np.empty(3, np.float32), np.empty(3, np.float32)
        layer_norm_cuda.layer_norm_rows(x, w, w, 1e-5, y, mean, rstd)
        dx, dw, db = np.empty_like(x), np.empty(17, np.float32), np.empty(17, np.float32)
        layer_norm_cuda.layer_norm_backward_rows(dy, x, mean, rstd, w, dx, dw, db)
        rdx, rdw, _ = reference.layer_norm_backward(dy, reference.layer_norm_forward(x, w, w)[1])
        assert_matches_reference(dx, rdx, factor=256, err_msg="dx at offset 1e4")
        assert_matches_reference(dw, rdw, factor=256, err_msg="dweight at offset 1e4")


def _layer_norm_huge_rows():
    """float64 rows beyond |x| ~ 1e154 (whose squares overflow) normalised as the CPU kernels
    do, not zeroed; a constant row gives y = b, a row holding inf gives NaN."""
    from helpers import assert_matches_reference

    from nnkit._ext import layer_norm_cpu, layer_norm_cuda

    _configure(small=True)
    rng = np.random.default_rng(4)
    x0 = rng.uniform(-1.0, 1.0, (4, 9))
    x0[1], x0[2, 0] = 0.75, 1.0
    w, b, dy = rng.standard_normal(9), rng.standard_normal(9), rng.standard_normal((4, 9))
    for scale in (1e200, 2.0**1023):
        x = x0 * scale
        y, mean, rstd = np.empty_like(x), np.empty(4), np.empty(4)
        layer_norm_cuda.layer_norm_rows(x, w, b, 1e-5, y, mean, rstd)
        cy, cmean, crstd = np.empty_like(x), np.empty(4), np.empty(4)
        layer_norm_cpu.layer_norm_rows(x, w, b, 1e-5, cy, cmean, crstd)
        assert_matches_reference(y, cy, factor=8, err_msg=f"y at {scale:g}")
        assert_matches_reference(rstd * scale, crstd * scale, factor=8, err_msg="rstd")
        np.testing.assert_array_equal(y[1], b)
        if scale == 1e200:
            dx, dw, db = np.empty_like(x), np.empty(9), np.empty(9)
            layer_norm_cuda.layer_norm_backward_rows(dy, x, mean, rstd, w, dx, dw, db)
            cdx, cdw, cdb = np.empty_like(x), np.empty(9), np.empty(9)
            layer_norm_cpu.layer_norm_backward_rows(dy, x, mean, rstd, w, cdx, cdw, cdb)
            assert_matches_reference(dx * scale, cdx * scale, factor=64, err_msg="dx")
            assert_matches_reference(dw, cdw, factor=64, err_msg="dweight")
    x = np.array([[1e200, np.inf, 0.0], [1e200, -1e200, 1.0]])
    y, mean, rstd = np.empty_like(x), np.empty(2), np.empty(2)
    layer_norm_cuda.layer_norm_rows(x, np.ones(3), np.zeros(3), 1e-5, y, mean, rstd)
    assert np.isnan(y[0]).all() and np.isfinite(y[1]).all()


def _device_arrays():
    """The launchers also take numba device arrays (cuda.to_device)."""
    from helpers import assert_matches_reference
    from numba import cuda

    from nnkit._ext import layer_norm_cuda, softmax_cuda
    from nnkit.kernels import reference

    _configure(small=True)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 9))
    d_out = cuda.device_array_like(x)
    softmax_cuda.softmax_rows(cuda.to_device(x), d_out)
    assert_matches_reference(d_out.copy_to_host(), reference.softmax(x))
    d_y, d_mean, d_rstd = cuda.device_array_like(x), cuda.device_array(3), cuda.device_array(3)
    w, b = np.ones(9), np.zeros(9)
    layer_norm_cuda.layer_norm_rows(cuda.to_device(x), cuda.to_device(w), cuda.to_device(b),
                                    1e-5, d_y, d_mean, d_rstd)
    assert_matches_reference(d_y.copy_to_host(), reference.layer_norm(x))


def _rotate_through_shared(out):
    """Kernel body: thread t writes t to a shared array and reads its neighbour's entry
    (module-level, so the simulator swaps this module's ``cuda`` global for its fake)."""
    buf = cuda.shared.array(16, float64)
    t = cuda.threadIdx.x
    buf[t] = t
    cuda.syncthreads()
    out[t] = buf[(t + 1) % 16]


def _shared_arrays_are_shared():
    """Every thread of a block reads the others' writes to a shared array, even when the
    simulator is slow to allocate it (its unlocked lookup used to hand threads arrays of
    their own now and then; ``helpers`` locks it). A slow allocation makes the race certain
    without the lock."""
    import time

    from numba.cuda.simulator import kernelapi

    class SlowNumpy:
        def __getattr__(self, name):
            return getattr(np, name)

        @staticmethod
        def empty(shape, dtype):
            time.sleep(0.01)
            return np.full(shape, np.nan, dtype)

    out = np.full(16, -1.0)
    real, kernelapi.np = kernelapi.np, SlowNumpy()
    try:
        cuda.jit(_rotate_through_shared)[1, 16](out)
    finally:
        kernelapi.np = real
    np.testing.assert_array_equal(out, (np.arange(16) + 1) % 16)


CASES = {
    "shared_arrays_are_shared": _shared_arrays_are_shared,
    "softmax_family_small_blocks": lambda: _softmax_family(True),
    "softmax_family_default_blocks": lambda: _softmax_family(False),
    "cross_entropy_small_blocks": lambda: _cross_entropy(True),
    "cross_entropy_default_blocks": lambda: _cross_entropy(False),
    "layer_norm_small_blocks": lambda: _layer_norm(True),
    "layer_norm_default_blocks": lambda: _layer_norm(False),
    "layer_norm_huge_rows": _layer_norm_huge_rows,
    "device_arrays": _device_arrays,
}


# ---- the tests, run in the parent --------------------------------------------------------------

@pytest.fixture(scope="module")
def simulator(tmp_path_factory):
    """Run this file as a script under NUMBA_ENABLE_CUDASIM=1; return the case outcomes."""
    return simulator_outcomes(__file__, tmp_path_factory.mktemp("cudasim"))


@pytest.mark.parametrize("case", list(CASES))
def test_under_simulator(simulator, case):
    outcome = simulator[case]
    if outcome != "ok":
        pytest.fail(f"{case} failed under the CUDA simulator:\n{outcome}", pytrace=False)


# ---- real GPU (skipped without one) --------------------------------------------------------------

@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape, ns", [((64, 300), (300,)), ((3, 5, 7, 9), (7, 9)),
                                       ((0, 8), (8,)), ((1000, 1), (1,))])
def test_layer_norm_on_gpu_matches_cpu(rng, dtype, shape, ns):
    cupy = pytest.importorskip("cupy")
    from helpers import assert_matches_reference

    from nnkit.kernels import layer_norm_backward, layer_norm_forward

    x = (rng.standard_normal(shape) * 2 + 1).astype(dtype)
    w = rng.standard_normal(ns).astype(dtype)
    b = rng.standard_normal(ns).astype(dtype)
    dy = rng.standard_normal(shape).astype(dtype)
    y, cache = layer_norm_forward(x, w, b, ns)
    gy, gcache = layer_norm_forward(cupy.asarray(x), cupy.asarray(w), cupy.asarray(b), ns)
    cpu, gpu = (y, cache.mean, cache.rstd), (gy, gcache.mean, gcache.rstd)
    # The rounding of y = (x - mean) rstd w + b and of dx scales with |x| rstd |w| (and |dy|),
    # not with the result: with one feature x - mean is exactly 0 on the CPU and ~1e-16 |x|
    # on the GPU, times rstd ~ 316. Tolerances are relative to that scale.
    eps = np.finfo(dtype).eps
    rstd_max = float(np.abs(cpu[2]).max(initial=0))
    w_max = max(1.0, float(np.abs(w).max(initial=0)))
    y_scale = float(np.abs(x).max(initial=0)) * rstd_max * w_max
    for c, g, scale in zip(cpu, gpu, (y_scale, 0.0, 0.0), strict=True):
        assert isinstance(g, cupy.ndarray)
        np.testing.assert_allclose(cupy.asnumpy(g), c, rtol=8 * eps, atol=8 * eps * scale)
    cpu_grads = layer_norm_backward(dy, cache)
    gpu_grads = layer_norm_backward(cupy.asarray(dy), gcache)
    # dweight, dbias sum dy xhat and dy over the rows, in another order on the GPU: their
    # rounding scales with the sums of the terms' magnitudes (which may cancel).
    dx_scale = float(np.abs(dy).max(initial=0)) * rstd_max * w_max
    rows, feats = tuple(range(x.ndim - len(ns))), tuple(range(x.ndim - len(ns), x.ndim))
    x64 = x.astype(np.float64)
    xhat = (x64 - x64.mean(axis=feats, keepdims=True)) * np.asarray(cpu[2]).reshape(
        x.shape[:x.ndim - len(ns)] + (1,) * len(ns))
    dw_scale = float(np.abs(dy * xhat).sum(axis=rows).max(initial=0))
    db_scale = float(np.abs(dy).sum(axis=rows).max(initial=0))
    for c, g, scale in zip(cpu_grads, gpu_grads, (dx_scale, dw_scale, db_scale), strict=True):
        np.testing.assert_allclose(cupy.asnumpy(g), c, rtol=64 * eps, atol=64 * eps * scale)
    # non-contiguous GPU input, no affine parameters
    xt = cupy.asarray(x)[..., ::-1]
    y_nc, _ = layer_norm_forward(xt, None, None, ns)
    y_c, _ = layer_norm_forward(np.ascontiguousarray(x[..., ::-1]), None, None, ns)
    assert_matches_reference(cupy.asnumpy(y_nc), y_c, dtype, factor=8)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(64, 1000), (7, 33), (5, 1), (0, 4)])
def test_softmax_family_on_gpu_matches_cpu(rng, dtype, shape):
    cupy = pytest.importorskip("cupy")
    from helpers import assert_matches_reference

    from nnkit.kernels import (
        cross_entropy_backward,
        cross_entropy_forward,
        log_softmax_backward,
        log_softmax_forward,
        softmax_backward,
        softmax_forward,
    )

    x = _logits(rng, shape, dtype)
    dy = rng.standard_normal(shape).astype(dtype)
    gx, gdy = cupy.asarray(x), cupy.asarray(dy)
    for fwd, bwd in ((softmax_forward, softmax_backward),
                     (log_softmax_forward, log_softmax_backward)):
        y, cache = fwd(x)
        gy, gcache = fwd(gx)
        assert_matches_reference(cupy.asnumpy(gy), y, dtype, factor=8)
        assert_matches_reference(cupy.asnumpy(bwd(gdy, gcache)), bwd(dy, cache), dtype,
                                 factor=64)
    if shape[1] > 0:
        N, C = shape
        target = rng.integers(0, C, N)
        if N >= 3:
            target[2] = -100
        loss, cache = cross_entropy_forward(x, target)
        gloss, gcache = cross_entropy_forward(gx, cupy.asarray(target))
        # lse is float64 for both dtypes, computed from the logits' precision
        np.testing.assert_allclose(cupy.asnumpy(gcache.lse), cache.lse,
                                   rtol=8 * np.finfo(dtype).eps)
        np.testing.assert_allclose(float(gloss), float(loss), rtol=64 * np.finfo(dtype).eps)
        dl = cross_entropy_backward(1.0, cache)
        gdl = cross_entropy_backward(1.0, gcache)
        assert_matches_reference(cupy.asnumpy(gdl), dl, dtype, factor=64)


if __name__ == "__main__":
    run_simulator_cases(CASES, sys.argv[1])
