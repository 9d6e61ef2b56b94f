"""Hopfield networks, dense associative memories and modern Hopfield networks.

Kernels (Cython async, Numba sync / pattern-storage / dense, CUDA sync step under the
simulator) against the naive twins in ``nnkit.classic.hopfield`` (plain loops, every field
recomputed), without and with biases; properties of the theory (energy never increases along
async updates, biases included; stored patterns at low load are fixed points; flip rate
against (1 - erf(sqrt(1/(2 alpha))))/2; the capacity transition near alpha = 0.138); the
boundary (only ValueError/TypeError, naming the argument).
"""

import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import run_simulator_cases, simulator_outcomes
from hypothesis import example, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from nnkit.classic import hopfield as hf
from nnkit.classic.hopfield import (
    DenseAssociativeMemory,
    Hopfield,
    ModernHopfield,
    random_orders,
    reference_async,
    reference_dense_async,
    reference_sync,
    retrieval_curve,
)

ROOT = Path(__file__).resolve().parent.parent


def _orders(n, order, seed, max_sweeps):
    """The orders run(order=..., random_state=seed) uses, (K, n), for the twins."""
    if order == "sequential":
        return np.arange(n)[None]
    return random_orders(n, max_sweeps, seed)


@st.composite
def networks(draw, max_n=12, max_s=6, max_b=4):
    """(patterns (s, n) int, states (B, n) int) of random spins."""
    n = draw(st.integers(1, max_n))
    s = draw(st.integers(1, max_s))
    spins = st.sampled_from([-1, 1])
    xi = draw(hnp.arrays(np.int64, (s, n), elements=spins))
    x = draw(hnp.arrays(np.int64, (draw(st.integers(1, max_b)), n), elements=spins))
    return xi, x


@st.composite
def biased_networks(draw, max_n=10, max_s=5, max_b=3):
    """(patterns, states, bias (n,) float64): biases on the grid k/n (fields at ties with
    the integer couplings) or anywhere in [-2, 2]."""
    xi, x = draw(networks(max_n, max_s, max_b))
    n = xi.shape[1]
    grid = st.integers(-2 * max_s, 2 * max_s).map(lambda k: k / n)
    bias = draw(hnp.arrays(np.float64, (n,), elements=st.one_of(
        grid, st.floats(-2, 2, allow_subnormal=False))))
    return xi, x, bias


def _thresholds(bias):
    """The twins' thresholds for biases b: +1 iff (C x)_i >= -n b_i."""
    return -(bias.shape[0] * bias)


def _spins(rng, shape):
    return rng.choice(np.array([-1, 1], np.int8), size=shape)


# ---- storage --------------------------------------------------------------------------------

def test_hebbian_weights_symmetric_zero_diagonal(rng):
    xi = _spins(rng, (7, 40))
    net = Hopfield(40).store(xi)
    expected = sum(np.outer(x, x) for x in xi.astype(np.float64)) / 40
    np.fill_diagonal(expected, 0)
    np.testing.assert_array_equal(net.weights_, expected)
    np.testing.assert_array_equal(net.weights_, net.weights_.T)
    assert net.couplings_.dtype == np.float32
    np.testing.assert_array_equal(Hopfield(40, storage="patterns").store(xi).weights_, expected)


def test_energy_and_field_match_formula(rng):
    xi, x = _spins(rng, (5, 30)), _spins(rng, (4, 30))
    net = Hopfield(30).store(xi)
    W = net.weights_
    np.testing.assert_allclose(net.field(x), x @ W.T, atol=1e-12)
    np.testing.assert_allclose(net.energy(x), [-0.5 * v @ W @ v for v in x], atol=1e-12)
    assert net.energy(x[0]) == pytest.approx(-0.5 * x[0] @ W @ x[0])
    assert net.field(x[1]).shape == (30,)


def test_crosstalk_is_field_minus_pattern_and_decides_fixed_points(rng):
    xi = _spins(rng, (30, 200))
    net = Hopfield(200).store(xi)
    c = net.crosstalk()
    np.testing.assert_allclose(c, net.field(xi) - xi)
    stable = (np.where(xi + c >= 0, 1, -1) == xi).all(axis=1)
    res = net.run(xi, mode="sync", max_sweeps=1)
    np.testing.assert_array_equal(stable, (res.states == xi).all(axis=1))
    assert abs(c.std() - np.sqrt(30 / 200)) < 0.03  # C ~ N(0, s/n)


# ---- dynamics against the twins -----------------------------------------------------------------

@given(data=networks(), order=st.sampled_from(["random", "sequential"]),
       seed=st.integers(0, 2**16), storage=st.sampled_from(["dense", "patterns"]))
@example(data=(np.ones((1, 1), np.int64), -np.ones((1, 1), np.int64)), order="sequential",
         seed=0, storage="dense")  # one neuron: h = 0 -> sgn(0) = +1 flips -1 to +1
def test_async_equals_naive_loop(data, order, seed, storage):
    xi, x = data
    n = xi.shape[1]
    net = Hopfield(n, storage=storage).store(xi)
    res = net.run(x, order=order, random_state=seed, max_sweeps=20)
    orders = _orders(n, order, seed, 20)
    C = np.rint(net.weights_ * n)
    for b in range(len(x)):
        final, sweeps, converged = reference_async(C, x[b], orders, 20)
        np.testing.assert_array_equal(res.states[b], final)
        assert res.sweeps[b] == sweeps and res.converged[b] == converged


@given(data=networks(), seed=st.integers(0, 2**16))
def test_async_energy_never_increases(data, seed):
    """Checked after every single update (the twin's trace, which equals the kernel)."""
    xi, x = data
    n = xi.shape[1]
    net = Hopfield(n).store(xi)
    orders = _orders(n, "random", seed, 200)
    final, _, converged, trace = reference_async(net.couplings_, x[0], orders, 200,
                                                 energy_trace=True)
    assert converged  # a finite state space and a decreasing energy
    assert all(b <= a for a, b in zip(trace, trace[1:], strict=False))
    kernel = net.run(x[0], random_state=seed, max_sweeps=200)
    assert kernel.converged
    np.testing.assert_array_equal(kernel.states, final)
    assert net.energy(kernel.states) == pytest.approx(trace[-1] / n)
    assert net.energy(kernel.states) <= net.energy(x[0]) + 1e-12


@given(data=networks(), storage=st.sampled_from(["dense", "patterns"]),
       max_sweeps=st.integers(1, 6))
def test_sync_equals_naive_loop(data, storage, max_sweeps):
    xi, x = data
    net = Hopfield(xi.shape[1], storage=storage).store(xi)
    res = net.run(x, mode="sync", max_sweeps=max_sweeps)
    for b in range(len(x)):
        final, sweeps, converged = reference_sync(net.couplings_ if storage == "dense" else
                                                  np.rint(net.weights_ * xi.shape[1]),
                                                  x[b], max_sweeps)
        np.testing.assert_array_equal(res.states[b], final)
        assert res.sweeps[b] == sweeps and res.converged[b] == converged


def test_sync_two_cycle_is_not_converged():
    # two neurons coupled negatively: (+1, +1) <-> (-1, -1) under synchronous updates
    net = Hopfield(2).store(np.array([[1, -1]]))
    res = net.run([1, 1], mode="sync", max_sweeps=7)
    assert not res.converged and res.sweeps == 7
    assert net.run([1, 1], mode="async", order="sequential").converged


def test_float64_couplings_when_float32_is_not_exact(rng, monkeypatch):
    monkeypatch.setattr(hf, "_EXACT32", 8)
    xi, x = _spins(rng, (4, 9)), _spins(rng, (3, 9))
    net = Hopfield(9).store(xi)
    assert net.couplings_.dtype == np.float64
    res = net.run(x, order="sequential")
    for b in range(3):
        final, sweeps, _ = reference_async(net.couplings_, x[b], np.arange(9)[None], 100)
        np.testing.assert_array_equal(res.states[b], final)
        assert res.sweeps[b] == sweeps
    res = net.run(x, mode="sync")
    np.testing.assert_array_equal(res.states[0], reference_sync(net.couplings_, x[0], 100)[0])


def test_random_orders_are_permutations_and_reproducible():
    orders = random_orders(50, 6, 123)
    assert (np.sort(orders, axis=1) == np.arange(50)).all()
    assert len({tuple(o) for o in orders}) == 6
    np.testing.assert_array_equal(orders, random_orders(50, 6, 123))
    # the Numba and the Cython kernels draw the same stream
    from nnkit._ext import hopfield_cpu

    order, state = np.arange(50, dtype=np.int32), np.array([123], np.uint64)
    for expected in orders:
        hopfield_cpu.shuffle_order(order, state)
        np.testing.assert_array_equal(order, expected)


# ---- biases (notes §1.4: H = -1/2 x^T W x - b^T x, h = W x + b) ------------------------------

def test_energy_and_field_with_bias_match_formula_section_1_4(rng):
    xi, x = _spins(rng, (5, 30)), _spins(rng, (4, 30))
    b = rng.standard_normal(30)
    for storage in ("dense", "patterns"):
        net = Hopfield(30, storage=storage, bias=b).store(xi)
        W = net.weights_
        np.testing.assert_allclose(net.field(x), x @ W.T + b, atol=1e-12)
        np.testing.assert_allclose(net.energy(x), [-0.5 * v @ W @ v - b @ v for v in x],
                                   atol=1e-12)
        assert net.energy(x[0]) == pytest.approx(-0.5 * x[0] @ W @ x[0] - b @ x[0])


@given(data=biased_networks(), order=st.sampled_from(["random", "sequential"]),
       seed=st.integers(0, 2**16), storage=st.sampled_from(["dense", "patterns"]))
@example(data=(np.ones((1, 2), np.int64), np.array([[1, -1]]), np.array([0.0, -0.5])),
         order="sequential", seed=0, storage="dense")  # C x = (0, 1) vs t = (-0, 1): ties
def test_async_with_bias_equals_naive_loop(data, order, seed, storage):
    """Cython (dense) and Numba (pattern storage) against the twin, same seed and order."""
    xi, x, bias = data
    n = xi.shape[1]
    net = Hopfield(n, storage=storage, bias=bias).store(xi)
    res = net.run(x, order=order, random_state=seed, max_sweeps=20)
    orders = _orders(n, order, seed, 20)
    C = np.rint(net.weights_ * n)
    for b in range(len(x)):
        final, sweeps, converged = reference_async(C, x[b], orders, 20,
                                                   thresholds=_thresholds(bias))
        np.testing.assert_array_equal(res.states[b], final)
        assert res.sweeps[b] == sweeps and res.converged[b] == converged


@given(data=biased_networks(), seed=st.integers(0, 2**16))
def test_async_energy_never_increases_with_bias_section_1_4(data, seed):
    """Every single update lowers H = -1/2 x^T W x - b^T x or keeps it (the twin's exact
    trace, which equals the kernel's run); the run reaches a fixed point."""
    xi, x, bias = data
    n = xi.shape[1]
    net = Hopfield(n, bias=bias).store(xi)
    orders = _orders(n, "random", seed, 200)
    final, _, converged, trace = reference_async(net.couplings_, x[0], orders, 200,
                                                 energy_trace=True,
                                                 thresholds=_thresholds(bias))
    assert converged
    assert all(b <= a for a, b in zip(trace, trace[1:], strict=False))
    kernel = net.run(x[0], random_state=seed, max_sweeps=200)
    assert kernel.converged
    np.testing.assert_array_equal(kernel.states, final)
    scale = 1 + np.abs(bias).sum()
    assert net.energy(kernel.states) == pytest.approx(trace[-1] / n, abs=1e-12 * scale)
    assert net.energy(kernel.states) <= net.energy(x[0]) + 1e-12 * scale
    h = net.field(kernel.states)  # a fixed point: every neuron agrees with its field
    assert (kernel.states[np.abs(h) > 1e-9 * scale] ==
            np.sign(h[np.abs(h) > 1e-9 * scale])).all()


@given(data=biased_networks(), storage=st.sampled_from(["dense", "patterns"]),
       max_sweeps=st.integers(1, 6))
def test_sync_with_bias_equals_naive_loop(data, storage, max_sweeps):
    """Numba (dense) and NumPy (pattern storage) synchronous runs against the twin."""
    xi, x, bias = data
    n = xi.shape[1]
    net = Hopfield(n, storage=storage, bias=bias).store(xi)
    res = net.run(x, mode="sync", max_sweeps=max_sweeps)
    C = np.rint(net.weights_ * n)
    for b in range(len(x)):
        final, sweeps, converged = reference_sync(C, x[b], max_sweeps,
                                                  thresholds=_thresholds(bias))
        np.testing.assert_array_equal(res.states[b], final)
        assert res.sweeps[b] == sweeps and res.converged[b] == converged


def test_float64_couplings_with_bias_equal_the_twins(rng, monkeypatch):
    """The Cython double instantiation and the float64 Numba sync with thresholds."""
    monkeypatch.setattr(hf, "_EXACT32", 8)
    xi, x, b = _spins(rng, (4, 9)), _spins(rng, (3, 9)), rng.integers(-4, 5, 9) / 9
    net = Hopfield(9, bias=b).store(xi)
    assert net.couplings_.dtype == np.float64
    res, sync = net.run(x, order="sequential"), net.run(x, mode="sync")
    for k in range(3):
        final, sweeps, _ = reference_async(net.couplings_, x[k], np.arange(9)[None], 100,
                                           thresholds=_thresholds(b))
        np.testing.assert_array_equal(res.states[k], final)
        assert res.sweeps[k] == sweeps
        np.testing.assert_array_equal(
            sync.states[k], reference_sync(net.couplings_, x[k], 100, _thresholds(b))[0])


@pytest.mark.parametrize("storage", ["dense", "patterns"])
def test_zero_bias_runs_exactly_as_no_bias(rng, storage):
    xi, x = _spins(rng, (25, 200)), _spins(rng, (6, 200))
    plain = Hopfield(200, storage=storage).store(xi)
    zero = Hopfield(200, storage=storage, bias=np.zeros(200)).store(xi)
    for kw in ({"mode": "async", "random_state": 4}, {"mode": "sync", "max_sweeps": 9},
               {"mode": "async", "order": "sequential"}):
        a, b = plain.run(x, **kw), zero.run(x, **kw)
        np.testing.assert_array_equal(a.states, b.states)
        np.testing.assert_array_equal(a.sweeps, b.sweeps)
    np.testing.assert_array_equal(plain.energy(x), zero.energy(x))


@pytest.mark.parametrize("storage", ["dense", "patterns"])
@pytest.mark.parametrize("mode", ["async", "sync"])
def test_large_bias_pins_a_unit_section_1_4(rng, storage, mode):
    """|b_i| > sum_j |W_ij| makes sgn(h_i) = sgn(b_i) in every state: neuron i ends there
    whatever the patterns and the start (and stays, from a start already there)."""
    n = 60
    xi, x = _spins(rng, (8, n)), _spins(rng, (10, n))
    W = Hopfield(n).store(xi).weights_
    b = np.zeros(n)
    b[3], b[17] = np.abs(W[3]).sum() + 0.01, -(np.abs(W[17]).sum() + 0.01)
    x[:5, 3], x[:5, 17] = -1, 1  # half the starts against the bias
    res = Hopfield(n, storage=storage, bias=b).store(xi).run(x, mode=mode, random_state=2,
                                                              max_sweeps=50)
    assert (res.states[:, 3] == 1).all() and (res.states[:, 17] == -1).all()
    # the pinned pattern bit wins even over a stored pattern that disagrees with it
    stored = xi.copy()
    stored[:, 3] = -1
    net = Hopfield(n, storage=storage, bias=b).store(stored)
    assert (net.run(stored, mode=mode, random_state=0).states[:, 3] == 1).all()


def test_bias_is_saved_and_loaded(tmp_path, rng):
    import nnkit as nk

    xi, x = _spins(rng, (4, 40)), _spins(rng, (5, 40))
    net = Hopfield(40, bias=rng.standard_normal(40) * 0.3).store(xi)
    nk.save(net, tmp_path / "net.safetensors")
    loaded = nk.load(tmp_path / "net.safetensors")
    np.testing.assert_array_equal(loaded.bias, net.bias)
    np.testing.assert_array_equal(loaded.run(x, random_state=1).states,
                                  net.run(x, random_state=1).states)
    assert Hopfield(40).bias is None


def test_bias_is_a_read_only_float64_copy():
    b = np.array([1, -2, 3])
    net = Hopfield(3, bias=b)
    assert net.bias.dtype == np.float64 and not net.bias.flags.writeable
    b[0] = 99
    assert net.bias[0] == 1.0


# ---- properties at scale ---------------------------------------------------------------------

@pytest.mark.parametrize("storage", ["dense", "patterns"])
@pytest.mark.parametrize("mode", ["async", "sync"])
def test_stored_patterns_at_low_load_are_fixed_points(rng, storage, mode):
    xi = _spins(rng, (10, 400))  # alpha = 0.025
    res = Hopfield(400, storage=storage).store(xi).run(xi, mode=mode, random_state=0)
    np.testing.assert_array_equal(res.states, xi)
    assert (res.sweeps == 1).all() and res.converged.all()


def test_recall_from_noise_and_batch_equals_single_runs(rng):
    n = 600
    xi = _spins(rng, (30, n))
    noisy = xi * np.where(rng.random(xi.shape) < 0.1, -1, 1).astype(np.int8)
    net = Hopfield(n).store(xi)
    batch = net.run(noisy, random_state=5)
    assert (batch.states == xi).all(axis=1).mean() >= 0.9
    serial = net.run(noisy, random_state=5, n_jobs=1)
    np.testing.assert_array_equal(serial.states, batch.states)
    for b in (0, 7, 29):
        one = net.run(noisy[b], random_state=5)
        np.testing.assert_array_equal(one.states, batch.states[b])
        assert one.sweeps == batch.sweeps[b]


def test_sync_parallel_build_equals_serial(rng):
    from nnkit._ext import hopfield_cpu

    net = Hopfield(300).store(_spins(rng, (40, 300)))
    x = _spins(rng, (50, 300))
    outs = []
    t = rng.integers(-40, 41, 300).astype(np.float64)  # thresholds, ties included
    for build in (hopfield_cpu.sync_run.serial, hopfield_cpu.sync_run.parallel):
        s, h = x.copy(), net._int_fields(x)
        sw, cv = np.zeros(50, np.int64), np.zeros(50, np.uint8)
        build(h, net.couplings_, s, np.empty(s.shape, np.int64), 30, sw, cv, t)
        outs.append((s, sw, cv))
    for a, b in zip(*outs, strict=True):
        np.testing.assert_array_equal(a, b)


def test_flip_rate_follows_theory():
    from scipy.special import erf

    alphas = np.array([0.1, 0.2, 0.3])
    curve = retrieval_curve(1000, alphas, n_probes=4, noise=0.1, random_state=1)
    theory = (1 - erf(np.sqrt(1 / (2 * alphas)))) / 2  # nk.theory.hopfield_flip_probability
    np.testing.assert_allclose(curve.flip_rate, theory, rtol=0.35)
    assert curve.overlap[0] > 0.99 and curve.overlap[2] < 0.6  # the phase transition
    assert list(curve.n_patterns) == [100, 200, 300]


def test_capacity_transition_near_0138_at_n2000_section_1_4():
    """Notes §1.4: "at s/n ~ 0.138 a phase transition occurs". Probes start at stored
    patterns of an n = 2000 network; across alpha = 0.10-0.18 the retrieved share falls
    from all to almost none and crosses 1/2 between 0.13 and 0.16 (about 0.157 here)."""
    alphas = np.round(np.arange(0.10, 0.181, 0.01), 2)
    curve = retrieval_curve(2000, alphas, n_probes=60, random_state=0)
    assert curve.retrieved[0] == 1.0 and curve.overlap[0] > 0.99
    assert curve.retrieved[-1] <= 0.1 and curve.overlap[-1] < 0.5
    assert 0.13 <= curve.transition() <= 0.16
    low, high = curve.alphas <= 0.12, curve.alphas >= 0.17
    assert curve.overlap[low].min() > 0.95 > 0.6 > curve.overlap[high].max()


def test_capacity_transition_moves_down_toward_0138_as_n_grows_section_1_4():
    """The finite-size shift shrinks with n: the located transition at n = 4000 lies below
    the one at n = 1000 (about 0.149 against 0.163) and above 0.138 minus noise."""
    alphas = np.round(np.arange(0.13, 0.181, 0.01), 2)
    small, large = (retrieval_curve(n, alphas, n_probes=60, random_state=1).transition()
                    for n in (1000, 4000))
    assert 0.13 <= large < small - 0.005


def test_transition_interpolates_the_first_drop_below_the_share():
    c = hf.RetrievalCurve(10, np.array([0.3, 0.1, 0.2]), np.array([3, 1, 2]),
                          np.zeros(3), np.zeros(3), np.array([0.0, 1.0, 0.6]), np.zeros(3))
    assert c.transition() == pytest.approx(0.2 + 0.1 * 0.1 / 0.6)
    assert c.transition(0.8) == pytest.approx(0.1 + 0.1 * 0.2 / 0.4)
    c.retrieved = np.ones(3)
    assert np.isnan(c.transition())
    with pytest.raises(ValueError, match="share must be < 1"):
        c.transition(1.0)


def test_tour_section_locates_the_transition_and_meets_its_targets(tmp_path):
    pytest.importorskip("matplotlib")
    from nnkit.tour import TourContext
    from nnkit.tour.hopfield import hopfield_section

    rows = hopfield_section(TourContext(tmp_path, quick=True))
    checks = [r for r in rows if r["ok"] != "info"]
    assert checks and all(r["ok"] is True for r in checks), rows
    where, = [r for r in rows if r["result"].startswith("transition")]
    assert 0.13 <= float(where["value"].split("=")[1]) <= 0.16
    assert (tmp_path / "hopfield.png").stat().st_size > 1000


# ---- dense associative memory --------------------------------------------------------------------

@given(data=networks(max_n=9, max_s=5, max_b=3), interaction=st.sampled_from(["poly", "exp"]),
       degree=st.integers(2, 5), order=st.sampled_from(["random", "sequential"]),
       seed=st.integers(0, 2**16))
def test_dense_async_equals_naive_loop(data, interaction, degree, order, seed):
    xi, x = data
    n = xi.shape[1]
    dam = DenseAssociativeMemory(interaction, degree).store(xi)
    res = dam.run(x, order=order, random_state=seed, max_sweeps=20)
    orders = _orders(n, order, seed, 20)
    for b in range(len(x)):
        final, sweeps, converged = reference_dense_async(xi, x[b], orders, 20, interaction,
                                                         degree)
        np.testing.assert_array_equal(res.states[b], final)
        assert res.sweeps[b] == sweeps and res.converged[b] == converged
        assert dam.energy(res.states[b]) <= dam.energy(x[b]) + 1e-9 * abs(dam.energy(x[b]))


def test_dense_degree_two_is_the_hopfield_network(rng):
    xi, x = _spins(rng, (6, 25)), _spins(rng, (5, 25))
    a = DenseAssociativeMemory("poly", 2).store(xi).run(x, random_state=3)
    b = Hopfield(25).store(xi).run(x, random_state=3)
    np.testing.assert_array_equal(a.states, b.states)


@pytest.mark.parametrize("interaction, degree", [("poly", 4), ("exp", 3)])
def test_dense_memory_retrieves_far_beyond_hopfield_capacity(rng, interaction, degree):
    n, s = 100, 60  # alpha = 0.6, over four times 0.138 n
    xi = _spins(rng, (s, n))
    noisy = xi * np.where(rng.random(xi.shape) < 0.1, -1, 1).astype(np.int8)
    dam = DenseAssociativeMemory(interaction, degree).store(xi)
    assert (dam.run(noisy, random_state=0).states == xi).all(axis=1).mean() >= 0.95
    hop = Hopfield(n).store(xi).run(noisy, random_state=0).states
    assert (hop == xi).all(axis=1).mean() < 0.2


# ---- modern Hopfield ----------------------------------------------------------------------------

@given(s=st.integers(1, 6), n=st.integers(1, 8), lead=st.sampled_from([(), (3,), (2, 2)]),
       beta=st.floats(0.01, 4), seed=st.integers(0, 2**16),
       dtype=st.sampled_from([np.float32, np.float64]))
def test_modern_hopfield_is_one_attention_step(s, n, lead, beta, seed, dtype):
    import nnkit as nk
    import nnkit.functional as F

    g = np.random.default_rng(seed)
    X = g.standard_normal((s, n)).astype(dtype)
    q = g.standard_normal(lead + (n,)).astype(dtype)
    got = ModernHopfield(beta).store(X).retrieve(q)
    attn = (F.softmax(nk.tensor(q) @ nk.tensor(X.T) * beta, axis=-1) @ nk.tensor(X)).numpy()
    assert got.shape == lead + (n,) and got.dtype == dtype
    np.testing.assert_allclose(got, attn, rtol=1e-4 if dtype == np.float32 else 1e-12,
                               atol=1e-5 if dtype == np.float32 else 1e-12)


def test_modern_hopfield_matches_torch_sdpa(rng):
    torch = pytest.importorskip("torch")
    X, q = rng.standard_normal((7, 16)), rng.standard_normal((5, 16))
    expected = torch.nn.functional.scaled_dot_product_attention(
        torch.tensor(q)[None], torch.tensor(X)[None], torch.tensor(X)[None], scale=0.7)[0]
    np.testing.assert_allclose(ModernHopfield(0.7).store(X).retrieve(q), expected.numpy(),
                               rtol=1e-10, atol=1e-12)


def test_modern_hopfield_one_step_retrieval_at_large_beta(rng):
    X = rng.standard_normal((50, 64))
    mh = ModernHopfield(beta=8.0).store(X)
    np.testing.assert_allclose(mh.retrieve(X), X, atol=1e-6)
    noisy = X + 0.3 * rng.standard_normal(X.shape)
    assert np.argmin(((mh.retrieve(noisy)[:, None] - X) ** 2).sum(-1), axis=1).tolist() \
        == list(range(50))


# ---- the boundary ----------------------------------------------------------------------------

@pytest.mark.parametrize("patterns, match", [
    ([[1, 0, 1]], "only -1 and \\+1"),
    ([[1.0, np.nan, 1.0]], "patterns must be finite"),
    ([[1, -1]], "n_neurons=3"),
    (np.ones((0, 3)), "patterns is empty"),
    ([1, -1, 1], "patterns must be 2-dimensional"),
    ([[2, -1, 1]], "only -1 and \\+1"),
])
def test_bad_patterns(patterns, match):
    with pytest.raises(ValueError, match=match):
        Hopfield(3).store(patterns)


def test_bad_arguments_name_themselves(rng):
    net = Hopfield(4).store(_spins(rng, (2, 4)))
    cases = [
        (lambda: net.run([1, -1, 1]), "states has 3 neurons"),
        (lambda: net.run([1, -1, 1, 0.5]), "states must hold only"),
        (lambda: net.run([1, -1, 1, 1], mode="both"), "mode must be one of"),
        (lambda: net.run([1, -1, 1, 1], order="reverse"), "order must be one of"),
        (lambda: net.run([1, -1, 1, 1], max_sweeps=0), "max_sweeps must be >= 1"),
        (lambda: Hopfield(0), "n_neurons must be >= 1"),
        (lambda: Hopfield(3, storage="disk"), "storage must be one of"),
        (lambda: Hopfield(3).run([1, 1, 1]), "call store"),
        (lambda: Hopfield(3).store([[1, 1, 1]], rule="storkey"), "rule must be one of"),
        (lambda: net.energy(np.ones((2, 2, 4))), "states must be 1 or 2-dimensional"),
        (lambda: DenseAssociativeMemory("cubic"), "interaction must be one of"),
        (lambda: DenseAssociativeMemory(degree=1), "degree must be >= 2"),
        (lambda: DenseAssociativeMemory(degree=30).store(_spins(rng, (2, 500))), "degree=30"),
        (lambda: DenseAssociativeMemory().store(np.ones((0, 4))), "patterns is empty"),
        (lambda: ModernHopfield(0), "beta must be > 0"),
        (lambda: ModernHopfield().store(np.ones((2, 3))).retrieve(np.ones(4)),
         "queries have 4 features"),
        (lambda: net.run([1, 1, 1, 1], random_state=-1), "random_state must be >= 0"),
        (lambda: ModernHopfield().store([[np.inf, 1.0]]), "X must be finite"),
        (lambda: retrieval_curve(100, [0.1, -1]), "alphas"),
        (lambda: Hopfield(4, bias=np.zeros(3)), "bias has 3 entries .* expected shape \\(4,\\)"),
        (lambda: Hopfield(4, bias=np.zeros((1, 4))), "bias must be 1-dimensional"),
        (lambda: Hopfield(4, bias=[0.0, np.nan, 0.0, 0.0]), "bias must be finite"),
        (lambda: Hopfield(4, bias=[0.0, np.inf, 0.0, 0.0]), "bias must be finite"),
        (lambda: Hopfield(4, bias=[0.0, 1e308, 0.0, 0.0]), "bias entries must be at most"),
        (lambda: retrieval_curve(100, [0.1], retrieved_at=0), "retrieved_at must be > 0"),
    ]
    for fn, match in cases:
        with pytest.raises(ValueError, match=match):
            fn()
    with pytest.raises(TypeError, match="states"):
        net.run("++--")
    with pytest.raises(TypeError, match="max_sweeps"):
        net.run([1, 1, 1, 1], max_sweeps=2.5)
    for bad in (np.array(["a"] * 4), np.ones(4, complex), "bias"):
        with pytest.raises(TypeError, match="bias"):
            Hopfield(4, bias=bad)


def _biased_run(bias):
    net = Hopfield(4, bias=bias).store([[1, -1, 1, -1]])
    net.energy(net.run([1, 1, 1, 1]).states)


@given(value=st.one_of(
    hnp.arrays(st.sampled_from([np.int8, np.int64, np.float32, np.float64, np.bool_]),
               hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5)),
    st.lists(st.integers(-2, 2), max_size=6), st.none(), st.text(max_size=3)),
    what=st.sampled_from(["store", "run", "energy", "dense", "modern", "bias"]))
def test_boundary_fuzz_only_value_or_type_errors(value, what):
    net = Hopfield(4).store([[1, -1, 1, -1]])
    calls = {
        "store": lambda: Hopfield(4).store(value),
        "run": lambda: net.run(value, max_sweeps=3),
        "energy": lambda: net.energy(value),
        "dense": lambda: DenseAssociativeMemory().store(value),
        "modern": lambda: ModernHopfield().store(value),
        "bias": lambda: _biased_run(value),
    }
    try:
        calls[what]()
    except (ValueError, TypeError):
        pass


# ---- CUDA sync step under the simulator (child process) ------------------------------------------

def _cuda_sync_cases():
    from nnkit._ext import hopfield_cpu, hopfield_cuda

    hopfield_cuda.block = (2, 4)  # grids that do not divide the shapes
    rng = np.random.default_rng(0)
    for n, s, B, dtype, biased in ((1, 1, 1, np.float32, False), (7, 3, 5, np.float32, False),
                                   (9, 4, 3, np.float64, False), (13, 2, 2, np.float64, False),
                                   (7, 3, 5, np.float32, True), (9, 4, 3, np.float64, True),
                                   (13, 5, 4, np.float32, True)):
        xi = rng.choice(np.array([-1, 1], np.int8), size=(s, n))
        C = (xi.T.astype(dtype) @ xi.astype(dtype))
        np.fill_diagonal(C, 0)
        x = rng.choice(np.array([-1, 1], np.int8), size=(B, n))
        # thresholds t = -n b: integers (ties with the integer fields) and fractions
        t = (rng.integers(-s, s + 1, n) + rng.choice([0, 0.5], n)).astype(np.float64) \
            if biased else None
        out = np.zeros_like(x)
        hopfield_cuda.sync_step(C, x, out, t)
        expected = np.array([reference_sync(C, v, 1, t)[0] for v in x])  # one step
        np.testing.assert_array_equal(out, expected, err_msg=f"step n={n} biased={biased}")
        # whole runs vs the CPU kernel
        max_sweeps = 6
        g_states, conv, sweeps = x.copy(), np.zeros(B, np.uint8), np.zeros(B, np.int64)
        hopfield_cuda.sync_run(np.ascontiguousarray(x.astype(dtype) @ C), C, g_states, None,
                               max_sweeps, sweeps, conv, np.zeros(n) if t is None else t)
        c_states, h = x.copy(), np.ascontiguousarray(x.astype(dtype) @ C)
        c_sweeps, c_conv = np.zeros(B, np.int64), np.zeros(B, np.uint8)
        hopfield_cpu.sync_run(h, C, c_states, np.empty((B, n), np.int64), max_sweeps,
                              c_sweeps, c_conv, np.zeros(n) if t is None else t)
        np.testing.assert_array_equal(g_states, c_states, err_msg=f"run n={n} biased={biased}")
        np.testing.assert_array_equal(sweeps, c_sweeps)
        np.testing.assert_array_equal(conv, c_conv)


def test_cuda_sync_kernel_under_simulator(tmp_path):
    outcome = simulator_outcomes(__file__, tmp_path)["sync"]
    if outcome != "ok":
        pytest.fail(f"CUDA sync kernel under the simulator:\n{outcome}", pytrace=False)


if __name__ == "__main__":
    run_simulator_cases({"sync": _cuda_sync_cases}, sys.argv[1])
