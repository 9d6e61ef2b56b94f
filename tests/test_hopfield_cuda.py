"""Hopfield dynamics on the GPU (``nnkit._ext.hopfield_cuda``) against the CPU kernels.

- Under Numba's CUDA simulator (a child process), kernel by kernel with tiny blocks (several
  neurons per thread): ``async_run`` (one block per state) equals the Cython kernel bit for
  bit (final states, fields, sweeps, converged) in order 0..n-1 and in the splitmix64
  shuffles, with and without thresholds (integer ties and fractions), float32 and float64
  couplings, a subset of rows, runs cut short by ``max_sweeps``; the energy of the run never
  increases from sweep to sweep; ``init_fields`` equals the Cython fields; ``sync_run`` equals
  the Numba kernel.
- On the CuPy stand-in (``cuda``; tests/test_gpu_stand_in.py) or a GPU, through the public
  API: ``Hopfield.run`` on CuPy states gives CuPy arrays equal to the NumPy run with the same
  seed, async and sync, shuffled and sequential, with biases, float32 and float64 couplings,
  fields from the couplings and from the patterns; the couplings go to the device once; the
  boundary refuses what the CPU refuses, with the same errors.
"""

import sys

import numpy as np
import pytest
from helpers import run_simulator_cases, simulator_outcomes

SPINS = np.array([-1, 1], np.int8)


def _network(rng, n, s, B, dtype):
    """(couplings (n, n) of ``dtype``, states (B, n) int8, patterns (s, n) int8)."""
    xi = rng.choice(SPINS, size=(s, n))
    C = xi.T.astype(dtype) @ xi.astype(dtype)
    np.fill_diagonal(C, 0)
    x = rng.choice(SPINS, size=(B, n))
    x[0] = xi[0] * np.where(rng.random(n) < 0.2, -1, 1)  # a noisy pattern among the states
    return np.ascontiguousarray(C), x, xi


def _thresholds(rng, n, s):
    """t = -n b for biases on the grid k/n (ties with the integer fields) and off it."""
    return (rng.integers(-s, s + 1, n) + rng.choice([0.0, 0.5, 0.25], n)).astype(np.float64)


def _small_blocks():
    from nnkit._ext import hopfield_cuda

    saved = hopfield_cuda.async_threads, hopfield_cuda.block
    hopfield_cuda.async_threads, hopfield_cuda.block = 4, (2, 4)
    return saved


def _restore(saved):
    from nnkit._ext import hopfield_cuda

    hopfield_cuda.async_threads, hopfield_cuda.block = saved


# ---- kernels under the simulator (child process) --------------------------------------------

ASYNC_CASES = [  # n, s, B, dtype, shuffle, biased, max_sweeps
    (5, 2, 1, np.float32, False, False, 20),
    (17, 3, 3, np.float32, True, False, 20),
    (17, 3, 3, np.float64, True, True, 20),
    (23, 6, 2, np.float64, False, True, 20),
    (40, 4, 4, np.float32, True, True, 20),
    (40, 12, 2, np.float32, True, True, 1),  # cut short: converged 0
    (1, 1, 2, np.float32, True, True, 5),
]


def _async_case():
    from nnkit._ext import hopfield, hopfield_cuda

    rng = np.random.default_rng(0)
    saved = _small_blocks()
    try:
        for n, s, B, dtype, shuffle, biased, max_sweeps in ASYNC_CASES:
            C, x, _ = _network(rng, n, s, B, dtype)
            t = _thresholds(rng, n, s) if biased else None
            rows = np.arange(B, dtype=np.int64)[::-1].copy() if B < 3 else \
                np.array([2, 0], np.int64)  # B = 3: state 1 is left alone
            seed = int(rng.integers(0, 2**63))
            out = {}
            for name, module in (("cpu", hopfield), ("gpu", hopfield_cuda)):
                states, h = x.copy(), np.ascontiguousarray(x.astype(dtype) @ C)
                sweeps, conv = np.full(B, -1, np.int64), np.full(B, 7, np.uint8)
                module.async_run(C, states, h, np.empty((B, n), np.int32), rows, max_sweeps,
                                 shuffle, seed, sweeps, conv, t)
                out[name] = (states, h, sweeps, conv)
            msg = f"n={n} s={s} B={B} {np.dtype(dtype).name} shuffle={shuffle} t={t is not None}"
            for got, want in zip(out["gpu"], out["cpu"], strict=True):
                np.testing.assert_array_equal(got, want, err_msg=msg)
            if max_sweeps == 1 and n > 1:
                assert not out["gpu"][3][rows].all(), msg  # some state still running
    finally:
        _restore(saved)


def _energy(C, x, t):
    """n E = -1/2 x^T C x + t^T x, exact in float64 at these sizes."""
    xf = x.astype(np.float64)
    return -0.5 * xf @ C.astype(np.float64) @ xf + (0.0 if t is None else t @ xf)


def _energy_case():
    """The state after k sweeps (a run with max_sweeps=k) has no higher energy than after
    k - 1: the energy never increases along the GPU's run."""
    from nnkit._ext import hopfield_cuda

    rng = np.random.default_rng(1)
    saved = _small_blocks()
    try:
        for dtype, biased in ((np.float32, False), (np.float64, True)):
            n, s = 24, 5
            C, x, _ = _network(rng, n, s, 2, dtype)
            t = _thresholds(rng, n, s) if biased else None
            energies = [[_energy(C, v, t) for v in x]]
            for k in range(1, 5):
                states, h = x.copy(), np.ascontiguousarray(x.astype(dtype) @ C)
                sweeps, conv = np.zeros(2, np.int64), np.zeros(2, np.uint8)
                hopfield_cuda.async_run(C, states, h, np.empty((2, n), np.int32),
                                        np.arange(2, dtype=np.int64), k, True, 11, sweeps,
                                        conv, t)
                energies.append([_energy(C, v, t) for v in states])
            e = np.array(energies)  # (sweeps + 1, states)
            assert (np.diff(e, axis=0) <= 0).all(), e
    finally:
        _restore(saved)


def _init_fields_case():
    from nnkit._ext import hopfield, hopfield_cuda

    rng = np.random.default_rng(2)
    saved = _small_blocks()
    try:
        for n, s, B, dtype in ((9, 2, 3, np.float32), (30, 7, 2, np.float64), (1, 1, 1,
                                                                                np.float32)):
            _, x, xi = _network(rng, n, s, B, dtype)
            rows = np.array([B - 1], np.int64)
            fields = {}
            for name, module in (("cpu", hopfield), ("gpu", hopfield_cuda)):
                h = np.full((B, n), 99, dtype)
                module.init_fields(xi, xi.astype(dtype), x, h, rows)
                fields[name] = h
            np.testing.assert_array_equal(fields["gpu"], fields["cpu"])
            C = xi.T.astype(np.float64) @ xi.astype(np.float64)
            np.fill_diagonal(C, 0)
            np.testing.assert_array_equal(fields["gpu"][B - 1], x[B - 1] @ C)
    finally:
        _restore(saved)


def _sync_case():
    from nnkit._ext import hopfield_cpu, hopfield_cuda

    rng = np.random.default_rng(3)
    saved = _small_blocks()
    try:
        for n, s, B, dtype, biased, max_sweeps in ((7, 3, 3, np.float32, False, 10),
                                                   (16, 8, 4, np.float64, True, 10),
                                                   (16, 8, 4, np.float32, True, 1)):
            C, x, _ = _network(rng, n, s, B, dtype)
            t = _thresholds(rng, n, s) if biased else np.zeros(n)
            out = {}
            for name, module in (("cpu", hopfield_cpu), ("gpu", hopfield_cuda)):
                states, h = x.copy(), np.ascontiguousarray(x.astype(dtype) @ C)
                sweeps, conv = np.full(B, -1, np.int64), np.full(B, 7, np.uint8)
                module.sync_run(h, C, states, np.empty((B, n), np.int64), max_sweeps, sweeps,
                                conv, t)
                out[name] = (states, sweeps, conv)
            for got, want in zip(out["gpu"], out["cpu"], strict=True):
                np.testing.assert_array_equal(got, want, err_msg=f"n={n} biased={biased}")
    finally:
        _restore(saved)


SIM_CASES = {"async_matches_the_cpu": _async_case, "energy_never_increases": _energy_case,
             "init_fields_matches_the_cpu": _init_fields_case,
             "sync_matches_the_cpu": _sync_case}


@pytest.fixture(scope="module")
def simulator(tmp_path_factory):
    return simulator_outcomes(__file__, tmp_path_factory.mktemp("cudasim_hopfield"))


@pytest.mark.parametrize("case", list(SIM_CASES))
def test_hopfield_kernels_under_simulator(simulator, case):
    if simulator[case] != "ok":
        pytest.fail(f"{case} failed under the CUDA simulator:\n{simulator[case]}",
                    pytrace=False)


# ---- the public API on CuPy states (a GPU or the stand-in) ------------------------------------

@pytest.fixture
def small_blocks():
    saved = _small_blocks()
    yield
    _restore(saved)


API_CASES = {  # name: n, s, B, float64 couplings, biased
    "from_couplings": (12, 7, 3, False, False),  # s >= n/2: fields from C
    "from_patterns_biased": (20, 3, 2, False, True),  # s < n/2: fields from the patterns
    "float64_biased": (14, 8, 2, True, True),
}


@pytest.mark.cuda
@pytest.mark.parametrize("case", list(API_CASES))
def test_hopfield_on_gpu_matches_the_cpu(case, small_blocks, monkeypatch):
    """Hopfield.run on CuPy states: CuPy results equal to the NumPy run's, every mode."""
    cupy = pytest.importorskip("cupy")
    from nnkit.classic import hopfield as hf

    n, s, B, wide, biased = API_CASES[case]
    if wide:  # float64 couplings at a small size
        monkeypatch.setattr(hf, "_EXACT32", 0)
    rng = np.random.default_rng(4)
    xi = rng.choice(SPINS, size=(s, n))
    bias = (rng.integers(-2, 3, n) / n + rng.choice([0.0, 0.03], n)) if biased else None
    net = hf.Hopfield(n, storage="dense", bias=bias).store(xi)
    assert net.couplings_.dtype == (np.float64 if wide else np.float32)
    x = rng.choice(SPINS, size=(B, n))
    for mode, order in (("async", "random"), ("async", "sequential"), ("sync", "random")):
        for states, max_sweeps in ((x, 30), (x, 1), (x[0], 30)):
            want = net.run(states, mode=mode, order=order, max_sweeps=max_sweeps,
                           random_state=7)
            got = net.run(cupy.asarray(states), mode=mode, order=order,
                          max_sweeps=max_sweeps, random_state=7)
            msg = f"{case} {mode} {order} max_sweeps={max_sweeps} shape={states.shape}"
            assert isinstance(got.states, cupy.ndarray), msg
            assert got.states.dtype == np.int8 and got.states.shape == states.shape, msg
            np.testing.assert_array_equal(got.states.get(), want.states, err_msg=msg)
            if states.ndim == 1:
                assert (got.sweeps, got.converged) == (want.sweeps, want.converged), msg
            else:
                assert isinstance(got.sweeps, cupy.ndarray), msg
                np.testing.assert_array_equal(got.sweeps.get(), want.sweeps, err_msg=msg)
                np.testing.assert_array_equal(got.converged.get(), want.converged,
                                              err_msg=msg)


@pytest.mark.cuda
def test_hopfield_on_gpu_keeps_the_couplings_and_refuses_what_the_cpu_refuses(small_blocks):
    cupy = pytest.importorskip("cupy")
    from nnkit.classic import Hopfield

    rng = np.random.default_rng(5)
    xi = rng.choice(SPINS, size=(2, 10))
    net = Hopfield(10).store(xi)
    x = cupy.asarray(xi)
    net.run(x, random_state=0)
    device_copy = net._like("couplings_", x)
    net.run(x, mode="sync")
    assert net._like("couplings_", x) is device_copy  # moved once, kept
    assert isinstance(device_copy, cupy.ndarray)
    net.store(xi[::-1])  # new patterns: a new device copy
    assert net._like("couplings_", x) is not device_copy
    bad = [(np.array([[1, 0] * 5], np.int8), ValueError), (np.ones((1, 9)), ValueError),
           (np.ones((1, 10), bool), TypeError), (np.full((1, 10), np.nan), ValueError),
           (np.ones((1, 1, 10)), ValueError)]
    for states, error in bad:
        with pytest.raises(error) as on_cpu:
            net.run(states)
        with pytest.raises(error) as on_gpu:
            net.run(cupy.asarray(states))
        assert str(on_gpu.value) == str(on_cpu.value)
    for kwargs, error in ((dict(mode="both"), ValueError), (dict(max_sweeps=0), ValueError),
                          (dict(random_state=-1), ValueError)):
        with pytest.raises(error):
            net.run(x, **kwargs)
    with pytest.raises(TypeError, match="storage='patterns'"):
        Hopfield(10, storage="patterns").store(xi).run(x)
    with pytest.raises(TypeError, match="NumPy"):
        net.energy(x)  # the measurements stay on the CPU


if __name__ == "__main__":
    run_simulator_cases(SIM_CASES, sys.argv[1])
