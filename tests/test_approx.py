"""nk.approx: the bin and ReLU constructions against their error predictions, the fast
evaluation path against a plain loop, region counts against Zaslavsky and Montufar et al.,
and the identities of notes §2.3-2.5."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import nnkit as nk
import nnkit.functional as F
from nnkit import approx, nn, theory

SIN = (np.sin, (0.0, 10.0))


def _loglog_slope(ms, errors):
    return np.polyfit(np.log(ms), np.log(errors), 1)[0]


# ---------------------------------------------------------------- building blocks
def test_step_is_a_jump_of_height_a_at_s():
    net = approx.step(2.5, 0.3)
    y = net(np.array([[0.0], [0.29], [0.31], [1.0]])).numpy().ravel()
    np.testing.assert_allclose(y, [0.0, 0.0, 2.5, 2.5], atol=1e-12)
    assert net[0].weight.dtype == np.float64


def test_bin_is_a_inside_and_zero_outside():
    net = approx.bin_function(-0.7, 0.5, 0.2)
    y = net(np.array([[0.35], [0.45], [0.5], [0.55], [0.65]])).numpy().ravel()
    np.testing.assert_allclose(y, [0.0, -0.7, -0.7, -0.7, 0.0], atol=1e-12)


def test_appendix_e_b_2_as_printed_has_its_signs_swapped():
    """Appendix eq. E.B.2 is printed as a sigma(w(x - s - Delta/2)) - a sigma(w(x - s + Delta/2)),
    which is -a on the bin; its text (up at s - Delta/2, down at s + Delta/2) is the negation,
    bin_function's form."""
    a, s, delta, w = 0.8, 0.5, 0.2, 1e4
    x = np.array([0.35, 0.45, 0.5, 0.55, 0.65])
    sig = lambda z: 0.5 * (1 + np.tanh(0.5 * z))  # noqa: E731
    printed = a * sig(w * (x - s - delta / 2)) - a * sig(w * (x - s + delta / 2))
    np.testing.assert_allclose(printed, [0.0, -a, -a, -a, 0.0], atol=1e-12)
    ours = approx.bin_function(a, s, delta, w)(x[:, None]).numpy().ravel()
    np.testing.assert_allclose(ours, -printed, atol=1e-12)


def test_bins_network_sums_disjoint_bins():
    net = approx.bins_network([1.0, -2.0], [0.25, 0.75], 0.5)
    assert net[0].out_features == 4
    y = net(np.array([[0.1], [0.4], [0.6], [0.9]])).numpy().ravel()
    np.testing.assert_allclose(y, [1.0, 1.0, -2.0, -2.0], atol=1e-12)


def test_bin_means_are_exact_for_polynomials():
    # mean of x^3 over [a, b] is (b^4 - a^4) / (4 (b - a)); Gauss-Legendre with 8 nodes is exact
    means = approx.bin_means(lambda x: x ** 3, 4, (0.0, 2.0))
    edges = np.linspace(0, 2, 5)
    expected = (edges[1:] ** 4 - edges[:-1] ** 4) / (4 * np.diff(edges))
    np.testing.assert_allclose(means, expected, rtol=1e-13)


def test_sigmoid_bins_is_a_real_trainable_module():
    net = approx.sigmoid_bins(np.sin, 7, (0, 10))
    assert isinstance(net, nn.Sequential)
    assert [type(mod) for mod in net] == [nn.Linear, nn.Sigmoid, nn.Linear]
    assert net[0].weight.shape == (14, 1) and net[2].weight.shape == (1, 14)
    assert set(net.state_dict()) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    centres = (np.arange(7) + 0.5) * 10 / 7
    np.testing.assert_allclose(net(centres[:, None]).numpy().ravel(),
                               approx.bin_means(np.sin, 7, (0, 10)), atol=1e-12)


def test_constructed_net_trains_further_with_adam():
    net = approx.sigmoid_bins(np.sin, 5, SIN[1], w=5.0)  # blurred steps: room to improve
    before = approx.mean_squared_error(net, *SIN)
    approx.fit(net, *SIN, steps=100, lr=1e-2, n_points=500)
    assert approx.mean_squared_error(net, *SIN) < before / 2


def test_training_from_random_init_lowers_the_loss():
    losses = approx.fit(approx.random_network(10, random_state=0), *SIN, steps=800, lr=2e-2)
    assert losses[-1] < losses[0] / 10


# ---------------------------------------------------------------- fast evaluation
def _eval_loop(net, x):
    """Naive twin of eval_sigmoid_net: f(x) = c + sum_j a_j sigma(w_j x + b_j), plain loops."""
    w = net[0].weight.data[:, 0]
    b, a, c = net[0].bias.data, net[2].weight.data[0], net[2].bias.data[0]
    out = np.empty(len(x))
    for n, xn in enumerate(x):
        acc = c
        for j in range(len(w)):
            acc += a[j] * 0.5 * (1.0 + math.tanh(0.5 * (w[j] * xn + b[j])))
        out[n] = acc
    return out


@given(params=hnp.arrays(np.float64, st.tuples(st.integers(1, 6), st.just(3)),
                         elements=st.floats(-50, 50)),
       x=hnp.arrays(np.float64, st.integers(0, 20), elements=st.floats(-5, 5)))
def test_eval_sigmoid_net_matches_the_loop(params, x):
    net = approx.random_network(len(params), random_state=0)
    net[0].weight.data[:, 0] = params[:, 0]  # any sign, zero included
    net[0].bias.data[:] = params[:, 1]
    net[2].weight.data[0] = params[:, 2]
    scale = 1 + np.abs(params[:, 2]).sum()
    np.testing.assert_allclose(approx.eval_sigmoid_net(net, x), _eval_loop(net, x),
                               rtol=0, atol=1e-13 * scale)


def test_eval_sigmoid_net_matches_the_forward_and_parallel_matches_serial():
    net = approx.sigmoid_bins(np.sin, 300, SIN[1])
    x = np.random.default_rng(0).uniform(-1, 11, 70_000)  # above the parallel threshold
    fast = approx.eval_sigmoid_net(net, x)
    with nk.no_grad():
        slow = net(x[:, None]).numpy().ravel()
    np.testing.assert_allclose(fast, slow, atol=1e-12)
    from nnkit._ext.approx_cpu import window_sum

    w, b = net[0].weight.data[:, 0].copy(), net[0].bias.data.copy()
    a = net[2].weight.data[0].copy()
    order = np.argsort(-b / w)
    w, b, a = w[order], b[order], a[order]
    prefix = np.concatenate([[0.0], np.cumsum(a)])
    outs = [np.empty_like(x), np.empty_like(x)]
    window_sum.serial(x, -b / w, w, b, a, prefix, 40 / w.min(), outs[0])
    window_sum.parallel(x, -b / w, w, b, a, prefix, 40 / w.min(), outs[1])
    np.testing.assert_array_equal(outs[0], outs[1])  # same sums per point, same order


# ---------------------------------------------------------------- errors vs predictions
def test_bin_mse_matches_the_prediction_and_falls_as_one_over_m_squared():
    ms = np.array([15, 30, 60, 120, 240, 400])
    measured = np.array([approx.mean_squared_error(approx.sigmoid_bins(np.sin, m, SIN[1]), *SIN,
                                                   n_points=400_000) for m in ms])
    predicted = np.array([approx.predicted_bin_mse(np.sin, m, SIN[1]) for m in ms])
    np.testing.assert_allclose(measured / predicted, 1.0, atol=0.2)
    assert abs(_loglog_slope(ms, measured) + 2) <= 0.2


def test_bin_blur_dominates_for_fixed_w_and_scaling_w_removes_it():
    m = 3000  # Delta = 1/300, w Delta = 33 for w = 1e4
    pred = approx.predicted_bin_mse(np.sin, m, SIN[1])
    fixed = approx.mean_squared_error(approx.sigmoid_bins(np.sin, m, SIN[1]), *SIN, 10 ** 6)
    scaled = approx.sigmoid_bins(np.sin, m, SIN[1], w=None)
    assert scaled[0].weight.data[0, 0] == pytest.approx(3e5)
    assert fixed / pred > 1.5
    assert approx.mean_squared_error(scaled, *SIN, 4 * 10 ** 6) / pred == pytest.approx(1, abs=0.2)


def test_relu_interpolant_interpolates_and_error_falls_as_one_over_m_squared():
    net = approx.relu_interpolant(np.sin, 12, SIN[1])
    knots = np.linspace(0, 10, 13)
    assert net[0].out_features == 12 and isinstance(net[1], nn.ReLU)
    np.testing.assert_allclose(net(knots[:, None]).numpy().ravel(), np.sin(knots), atol=1e-12)
    ms = np.array([10, 20, 40, 80, 160])
    x = np.linspace(0, 10, 100_001)
    sup = []
    for m in ms:
        net = approx.relu_interpolant(np.sin, m, SIN[1])
        with nk.no_grad():
            sup.append(np.abs(net(x[:, None]).numpy().ravel() - np.sin(x)).max())
        ratio = (approx.mean_squared_error(net, *SIN, 100_000)
                 / approx.predicted_relu_mse(np.sin, m, SIN[1]))
        assert ratio == pytest.approx(1, abs=0.2)
    assert abs(_loglog_slope(ms, sup) + 2) <= 0.2


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize("fn", [approx.sigmoid_bins, approx.relu_interpolant])
@pytest.mark.parametrize("kwargs,match", [
    ({"m": 0}, "m must be >= 1"), ({"m": -3}, "m must be >= 1"),
    ({"interval": (1.0, 1.0)}, "empty"), ({"interval": (2.0, 1.0)}, "empty"),
    ({"g": 3.0}, "callable"), ({"g": lambda x: x[:-1]}, "shape"),
    ({"g": lambda x: 1.0}, "shape"), ({"g": lambda x: x[:, None]}, "shape"),
    ({"g": math.sin}, "vectorised"), ({"g": lambda x: x / 0.0}, "NaN"),
])
def test_bad_input_is_a_value_error(fn, kwargs, match):
    args = {"g": np.sin, "m": 5, "interval": (0.0, 1.0)} | kwargs
    with np.errstate(all="ignore"), pytest.raises(ValueError, match=match):
        fn(**args)


_anything = st.one_of(st.none(), st.text(max_size=3), st.booleans(), st.floats(),
                      st.integers(-5, 5), st.lists(st.floats(), max_size=3),
                      st.tuples(st.floats(), st.floats()))


@given(m=_anything, interval=_anything, w=_anything)
def test_fuzz_only_value_or_type_errors(m, interval, w):
    for call in (lambda: approx.sigmoid_bins(np.sin, m, interval, w),
                 lambda: approx.relu_interpolant(np.cos, m, interval),
                 lambda: approx.count_linear_regions(approx.montufar_network(2, 1, 1), interval)):
        try:
            call()
        except (ValueError, TypeError):
            pass


# ---------------------------------------------------------------- activation patterns
def _relu_net(sizes, seed, dtype=np.float64):
    nk.manual_seed(seed)
    mods = []
    for a, b in zip(sizes[:-1], sizes[1:], strict=True):
        mods += [nn.Linear(a, b, dtype=dtype), nn.ReLU()]
    return nn.Sequential(*mods, nn.Linear(sizes[-1], 1, dtype=dtype))


def test_activation_patterns_match_a_loop():
    net = _relu_net((2, 5, 4), seed=1)
    X = np.random.default_rng(1).uniform(-2, 2, (50, 2))
    W1, b1 = net[0].weight.data, net[0].bias.data
    W2, b2 = net[2].weight.data, net[2].bias.data
    expected = np.zeros((50, 9), bool)
    for n, x in enumerate(X):
        h = [sum(W1[i, d] * x[d] for d in range(2)) + b1[i] for i in range(5)]
        expected[n, :5] = [v > 0 for v in h]
        h = [max(v, 0.0) for v in h]
        expected[n, 5:] = [sum(W2[i, j] * h[j] for j in range(5)) + b2[i] > 0 for i in range(4)]
    np.testing.assert_array_equal(approx.activation_patterns(net, X), expected)


# ---------------------------------------------------------------- region counts
def _bounds_holding_every_intersection(net):
    W, b = net[0].weight.data.astype(float), net[0].bias.data.astype(float)
    i, j = np.triu_indices(len(W), 1)
    points = [np.linalg.solve(W[[p, q]], -b[[p, q]]) for p, q in zip(i, j, strict=True)]
    r = 2 * np.abs(points).max(initial=1.0) + 1
    return [(-r, r), (-r, r)]


@pytest.mark.parametrize("m", [1, 2, 5, 16, 40, 64])
def test_one_layer_in_general_position_has_zaslavsky_regions(m):
    zaslavsky = theory.zaslavsky_regions
    net = _relu_net((2, m), seed=m)
    count = approx.count_linear_regions(net, _bounds_holding_every_intersection(net))
    assert count == zaslavsky(m, 2) and count.exact and count.method == "arrangement"


@pytest.mark.parametrize("seed", range(4))
def test_arrangement_count_equals_the_sampled_count(seed):
    net = _relu_net((2, 6), seed=seed)
    exact = approx.count_linear_regions(net, [(-1, 1), (-1, 1)])
    sampled = approx.regions._count_sampled(net, [(-1, 1), (-1, 1)], 1500)
    assert sampled == exact


def test_deeper_2d_nets_are_estimated_by_sampling():
    count = approx.count_linear_regions(_relu_net((2, 6, 6), seed=0), [(-1, 1), (-1, 1)],
                                        resolution=300)
    assert not count.exact and count.method == "sampling" and count >= 1


def _one_layer_2d(lines):
    net = nn.Sequential(nn.Linear(2, len(lines), dtype=np.float64), nn.ReLU())
    net[0].weight.data[...] = np.array(lines, float)[:, :2]
    net[0].bias.data[...] = np.array(lines, float)[:, 2]
    return net


@pytest.mark.parametrize("lines,expected", [
    ([(1, 0, 0), (0, 1, 0), (1, -1, 0)], 6),  # three concurrent lines
    ([(1, 0, -0.1), (1, 0, -0.2), (0, 1, 0)], 6),  # two parallel lines and a transversal
    ([(1, 1, 0), (-2, -2, 0), (1, 1, 0)], 2),  # one line three times, both orientations
    ([(1, 1, -2)], 1),  # touches the corner (1, 1) only
    ([(1, 0, 0), (1, 1, -1)], 3),  # meet at (0, 1), on the boundary
    ([(0, 0, 1), (0, 0, -1)], 1),  # zero weights: no line
])
def test_degenerate_arrangements(lines, expected):
    net = _one_layer_2d(lines)
    assert approx.count_linear_regions(net, [(-1, 1), (-1, 1)]) == expected
    X = approx.regions._grid([(-1, 1), (-1, 1)], 301)  # odd: a grid line on x = 0, y = 0
    pre = X @ net[0].weight.data.T + net[0].bias.data
    off_lines = (np.abs(pre) > 1e-9).all(axis=1)
    patterns = np.unique(approx.activation_patterns(net, X[off_lines]), axis=0)
    assert len(patterns) == expected


@given(st.integers(0, 2 ** 31), st.integers(1, 4), st.integers(1, 3))
def test_1d_breakpoints_never_below_the_sampled_count(seed, width, depth):
    net = _relu_net((1,) + (width,) * depth, seed=seed)
    exact = approx.count_linear_regions(net, [(-3, 3)])
    X = np.linspace(-3, 3, 20_001)[:, None]
    pats = approx.activation_patterns(net, X)
    runs = 1 + int(np.any(pats[1:] != pats[:-1], axis=1).sum())
    assert exact.exact and runs <= exact <= 1 + width * sum(width ** k for k in range(depth))


def test_1d_one_layer_is_one_plus_the_roots_inside():
    net = _relu_net((1, 30), seed=3)
    w, b = net[0].weight.data[:, 0].astype(float), net[0].bias.data.astype(float)
    roots = -b / w
    assert approx.count_linear_regions(net, [(-0.5, 0.5)]) == 1 + np.sum(np.abs(roots) < 0.5)


@pytest.mark.parametrize("n,m,L", [(1, 3, 1), (1, 3, 3), (1, 5, 2), (1, 4, 4),
                                   (2, 4, 1), (2, 4, 2), (2, 5, 2)])
def test_montufar_construction_reaches_the_lower_bound(n, m, L):
    montufar = theory.montufar_lower_bound
    net = approx.montufar_network(m, n, L)
    count = approx.count_linear_regions(net, [(0, 1)] * n, resolution=1200)
    assert count == montufar(m, n, L)  # sampling (2-D, L > 1) only undercounts
    assert count.exact == (n == 1 or L == 1)


def test_region_counting_bad_input():
    net = _relu_net((2, 3), seed=0)
    with pytest.raises(ValueError, match="bounds"):
        approx.count_linear_regions(net, [(0, 1)])
    with pytest.raises(ValueError, match="lo < hi"):
        approx.count_linear_regions(net, [(0, 1), (1, 1)])
    with pytest.raises(TypeError, match="Sigmoid"):
        approx.count_linear_regions(nn.Sequential(nn.Linear(2, 2), nn.Sigmoid()), [(0, 1)] * 2)
    with pytest.raises(ValueError, match="features"):
        approx.activation_patterns(net, np.zeros((3, 5)))
    with pytest.raises(ValueError, match="m must be"):
        approx.montufar_network(1, 2, 2)


# ---------------------------------------------------------------- identities of notes §2.3-2.5
@given(hnp.arrays(np.float64, st.integers(0, 30), elements=st.floats(-30, 30)))
def test_tanh_is_a_shifted_scaled_sigmoid(z):
    np.testing.assert_allclose(F.tanh(z).numpy(), (2 * F.sigmoid(2 * z) - 1).numpy(),
                               rtol=0, atol=4 * np.finfo(np.float64).eps)


@pytest.mark.parametrize("act", [nn.Sigmoid, nn.Tanh, nn.ReLU])
def test_residual_with_zero_weights_is_the_identity(act):
    block = nn.Residual(nn.Sequential(nn.Linear(4, 4, dtype=np.float64), act()))
    x = np.random.default_rng(0).standard_normal((5, 4))
    assert not np.allclose(block(x).numpy(), x)  # random weights: not the identity
    for p in block.parameters():
        p.data[...] = 0
    np.testing.assert_array_equal(block(x).numpy(), x)  # F[0, 0] = Id


@pytest.mark.parametrize("make", [lambda: approx.sigmoid_bins(np.sin, 6, (0, 10)),
                                  lambda: _relu_net((1, 8), seed=5),
                                  lambda: approx.random_network(8, "tanh", random_state=2)])
def test_permuting_hidden_units_leaves_the_function_unchanged(make):
    net, perm = make(), np.random.default_rng(0).permutation(make()[0].out_features)
    x = np.linspace(-1, 11, 97)[:, None]
    before = net(x).numpy()
    net[0].weight.data[...] = net[0].weight.data[perm]
    net[0].bias.data[...] = net[0].bias.data[perm]
    net[2].weight.data[...] = net[2].weight.data[:, perm]
    np.testing.assert_allclose(net(x).numpy(), before, rtol=1e-12, atol=1e-12)
    if isinstance(net[1], nn.ReLU):
        regions = approx.count_linear_regions(net, [(-1, 11)])
        assert regions == approx.count_linear_regions(make(), [(-1, 11)]) >= 2


def test_tour_section_rows_and_plot(tmp_path):
    pytest.importorskip("matplotlib")
    from nnkit.tour import TourContext
    from nnkit.tour.approx import approx_section

    rows = approx_section(TourContext(out_dir=tmp_path, quick=True, plots=True))
    assert all(r["ok"] is True for r in rows) and len(rows) == 6, rows
    assert rows[-1]["result"] == "Barron: slope of MSE in m, d=8"
    assert (tmp_path / "approx_bins.png").stat().st_size > 1000
    assert (tmp_path / "approx_barron.png").stat().st_size > 1000


# ---------------------------------------------------------------- Barron's rate (Theorem 2.7)
def test_theorem_2_7_barron_rate_trained_widths_fall_like_one_over_m():
    """Theorem 2.7: the best m-unit network's MSE is O(1/m) whatever d. A small run in d = 8
    (m = 2..16, 800 Adam steps on fresh batches): the held-out MSE falls with m at a log-log
    slope of at most -0.5 (-0.82 to -0.96 over seeds 0-2), from about a third of Var f at
    m = 2 to a few percent of it at m = 16."""
    res = approx.barron_experiment(dims=(8,), widths=(2, 4, 8, 16), steps=800, batch_size=512,
                                   random_state=0)
    mse = res.mse[8]
    assert res.slopes[8] <= -0.5, mse
    assert (np.diff(mse) < 0).all(), mse
    assert mse[-1] < 0.1 * res.variance[8] < mse[0], (mse, res.variance[8])
    np.testing.assert_allclose(res.slopes[8], _loglog_slope(res.widths, mse))


@pytest.mark.parametrize("d", [1, 2, 8, 32])
def test_barron_target_is_its_formula_with_a_norm_free_of_d(d):
    """f(x) = sum_k a_k cos(omega w_k . x + b_k) with unit w_k and a_k = (1/k) / ||(1/k)||; its
    Barron norm omega sum_k a_k does not depend on d, nor does the variance 1/3 of a ridge's
    projection w_k . x under the uniform measure on [-1, 1]^d."""
    f = approx.barron_target(d, n_ridges=5, frequency=2.0, random_state=1)
    np.testing.assert_allclose(np.linalg.norm(f.directions, axis=1), 1.0, rtol=1e-12)
    a = 1.0 / np.arange(1, 6)
    np.testing.assert_allclose(f.weights, a / math.sqrt((a * a).sum()), rtol=1e-12)
    assert f.barron_norm == pytest.approx(2.0 * a.sum() / math.sqrt((a * a).sum()))
    x = np.random.default_rng(0).uniform(-1, 1, (4, d))
    by_hand = [sum(f.weights[k] * math.cos(2.0 * float(f.directions[k] @ x[i]) + f.phases[k])
                   for k in range(5)) for i in range(4)]
    np.testing.assert_allclose(f(x), by_hand, rtol=1e-12, atol=1e-14)
    projections = np.random.default_rng(1).uniform(-1, 1, (200_000, d)) @ f.directions.T
    np.testing.assert_allclose(projections.var(axis=0), 1 / 3, rtol=0.02)


def test_barron_experiment_bad_arguments():
    with pytest.raises(ValueError, match="at least two different widths"):
        approx.barron_experiment(dims=(2,), widths=(4, 4))
    with pytest.raises(ValueError, match="d must be >= 1"):
        approx.barron_target(0)
    with pytest.raises(ValueError, match=r"x must have shape \(N, 3\)"):
        approx.barron_target(3, random_state=0)(np.zeros((2, 4)))
    with pytest.raises(TypeError, match="m must be an integer"):
        approx.train_width(approx.barron_target(2, random_state=0), 2.5)


@pytest.mark.parametrize("layer, name", [(0, "weight"), (0, "bias"), (2, "weight")])
def test_eval_sigmoid_net_propagates_nan_like_the_forward(layer, name):
    """A NaN parameter gives NaN, as the net's own forward does (the windowed sum dropped
    the unit, or returned finite values)."""
    from nnkit.approx.constructions import forward_numpy

    net = approx.sigmoid_bins(np.sin, 4)
    getattr(net[layer], name).data.reshape(-1)[1] = np.nan
    x = np.linspace(0, 1, 5)
    np.testing.assert_array_equal(approx.eval_sigmoid_net(net, x), forward_numpy(net, x))
    assert np.isnan(approx.eval_sigmoid_net(net, x)).all()
