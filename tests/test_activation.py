"""The fused GELU and dropout kernels against their naive twins, central differences,
serial == parallel, and the public boundary."""

import numpy as np
import pytest
from helpers import arrays, assert_matches_reference
from hypothesis import given
from hypothesis import strategies as st

import nnkit as nk
from nnkit import functional as F
from nnkit._ext import activation_cpu
from nnkit.kernels import (
    dropout_backward,
    dropout_forward,
    gelu_backward,
    gelu_forward,
    reference,
)

FORMS = ("none", "tanh")


@given(x=arrays(low=-12.0, high=12.0, max_side=9), seed=st.integers(0, 2**16),
       approximate=st.sampled_from(FORMS))
def test_kernels_match_the_naive_twin(x, seed, approximate):
    g = np.random.default_rng(seed).standard_normal(x.shape).astype(x.dtype)
    y, cache = gelu_forward(x, approximate)
    want, twin_cache = reference.gelu_forward(x, approximate)
    assert_matches_reference(y, want)
    assert_matches_reference(gelu_backward(g, cache), reference.gelu_backward(g, twin_cache))


@pytest.mark.parametrize("approximate", FORMS)
def test_far_tails_and_non_finite_inputs(approximate):
    x = np.array([-np.inf, -1e30, -10.5, 10.5, 1e30, np.inf, np.nan])
    y, cache = gelu_forward(x, approximate)
    np.testing.assert_array_equal(y, [0, 0, 0, 10.5, 1e30, np.inf, np.nan])
    dx = gelu_backward(np.ones_like(x), cache)
    np.testing.assert_array_equal(dx, [0, 0, 0, 1, 1, 1, np.nan])


@pytest.mark.parametrize("approximate", FORMS)
def test_gradient_matches_central_differences(approximate):
    x = nk.tensor(np.linspace(-4, 4, 17).reshape(1, 17), requires_grad=True)
    assert nk.gradcheck(lambda v: F.gelu(v, approximate=approximate), [x])


@pytest.mark.parametrize("form", ["gelu", "gelu_tanh"])
def test_parallel_build_equals_serial_build(form):
    x = np.random.default_rng(0).standard_normal(100_000).astype(np.float32) * 4
    g = np.ones_like(x)
    results = []
    for build in ("serial", "parallel"):
        y, dx = np.empty_like(x), np.empty_like(x)
        k = getattr(activation_cpu, "tanh_constants" if form == "gelu_tanh"
                    else "exact_constants")(x.dtype)  # the loops' constants, in x's dtype
        getattr(getattr(activation_cpu, f"{form}_forward_loop"), build)(x, k, y)
        getattr(getattr(activation_cpu, f"{form}_backward_loop"), build)(g, x, k, dx)
        results.append((y, dx))
    for serial, parallel in zip(*results, strict=True):
        np.testing.assert_array_equal(serial, parallel)


def test_float32_tanh_form_is_within_a_few_ulps_of_float64():
    """The float32 kernel's (1 + tanh u) / 2 (1 / (1 + exp(-2u)), nnkit's vectorised exp)
    against the float64 twin over [-10, 10]: y and dx within 4 float32 ulps of their scale."""
    x = np.linspace(-10, 10, 200_001).astype(np.float32)
    y, cache = gelu_forward(x, "tanh")
    want = reference.gelu_tanh(x.astype(np.float64))
    eps = np.finfo(np.float32).eps
    np.testing.assert_allclose(y, want, rtol=4 * eps, atol=4 * eps)
    dx = gelu_backward(np.ones_like(x), cache)
    dwant = reference.gelu_backward(np.ones(x.shape), (x.astype(np.float64), "tanh"))
    np.testing.assert_allclose(dx, dwant, rtol=4 * eps, atol=4 * eps)


def test_an_unknown_form_is_named():
    with pytest.raises(ValueError, match="approximate"):
        gelu_forward(np.ones(3), "erf")


def test_functional_gelu_uses_the_kernels_on_strided_input():
    x = np.random.default_rng(1).standard_normal((6, 8))[:, ::2]  # not contiguous
    t = nk.tensor(x, requires_grad=True)
    F.gelu(t).sum().backward()
    assert_matches_reference(F.gelu(x).numpy(), reference.gelu(x))
    assert_matches_reference(t.grad, reference.gelu_backward(np.ones_like(x), (x, "none")))


def test_bad_input_is_named():
    with pytest.raises(TypeError, match="x"):
        gelu_forward(np.arange(3))
    _, cache = gelu_forward(np.zeros(3))
    with pytest.raises(ValueError, match=r"dy must have shape \(3,\) like the forward's output, "
                                         r"got shape \(4,\)"):
        gelu_backward(np.zeros(4), cache)
    with pytest.raises(TypeError, match="dy must have dtype float64 like the forward's output, "
                                        "got float32"):
        gelu_backward(np.zeros(3, np.float32), cache)
    with pytest.raises(TypeError, match="cache must be the GeluCache returned by gelu_forward"):
        gelu_backward(np.zeros(3), (np.zeros(3), np.zeros(3)))
    _, dropped = dropout_forward(np.zeros(3), 0.5, 1)
    with pytest.raises(ValueError, match=r"dy must have shape \(3,\)"):
        dropout_backward(np.zeros(2), dropped)
    with pytest.raises(TypeError, match="cache must be the DropoutCache returned by "
                                        "dropout_forward"):
        dropout_backward(np.zeros(3), cache)


# ---- dropout ---------------------------------------------------------------------------------

@given(x=arrays(max_side=9), p=st.sampled_from([0.0, 0.1, 0.5, 0.9]),
       seed=st.integers(0, 2**64 - 1))
def test_dropout_matches_the_naive_twin(x, p, seed):
    y, cache = dropout_forward(x, p, seed)
    want = reference.dropout_mask(x.shape, p, seed, x.dtype)
    np.testing.assert_array_equal(cache.mask, want)
    np.testing.assert_array_equal(y, (x.astype(np.float64) * want).astype(x.dtype))
    np.testing.assert_array_equal(dropout_backward(x, cache), x * want)


def test_dropout_rate_parallel_build_and_the_gpu_stream():
    x = np.ones(200_003, np.float32)  # above the parallel threshold, odd length
    y, cache = dropout_forward(x, 0.3, 12345)
    mask = cache.mask
    kept = mask > 0
    assert abs(kept.mean() - 0.7) < 0.005 and np.allclose(mask[kept], 1 / 0.7)
    args = (np.uint64(12345), 0.3, 1 / 0.7)
    outs = [(np.empty_like(x), np.empty_like(x)) for _ in range(2)]
    activation_cpu.dropout_forward.serial(x, *args, *outs[0])
    activation_cpu.dropout_forward.parallel(x, *args, *outs[1])
    np.testing.assert_array_equal(outs[0][1], outs[1][1])
    np.testing.assert_array_equal(outs[0][1], mask)
    # the GPU draws u_i from the same hash (elementwise_cuda._SPLITMIX_BODY): check its text
    from nnkit._ext import elementwise_cuda

    for constant in ("0x9E3779B97F4A7C15", "0xBF58476D1CE4E5B9", "0x94D049BB133111EB",
                     ">> 30", ">> 27", ">> 31", ">> 11"):
        assert constant in elementwise_cuda._SPLITMIX_BODY
    # and the CPU twin of that kernel is the dropout stream: u_i >= p where the mask keeps
    from nnkit._random import get_rng, uniform

    nk.manual_seed(5)
    u = uniform(x.shape, x)
    nk.manual_seed(5)
    seed = int(get_rng().integers(0, 2**63 - 1))
    _, again = dropout_forward(x, 0.3, seed)
    np.testing.assert_array_equal(again.mask > 0, u >= 0.3)


def test_functional_dropout_gradient_is_the_mask():
    nk.manual_seed(3)
    x = nk.tensor(np.random.default_rng(0).standard_normal((4, 33)), requires_grad=True)
    y = F.dropout(x, 0.25)
    y.backward(np.ones((4, 33)))
    mask = y.numpy() / x.numpy()
    np.testing.assert_allclose(x.grad, mask)
    assert set(np.round(np.unique(mask), 12)) <= {0.0, round(1 / 0.75, 12)}


@pytest.mark.parametrize("kwargs, error", [
    ({"x": np.ones(3, np.int64), "p": 0.5, "seed": 1}, TypeError),
    ({"x": np.ones(3), "p": 1.0, "seed": 1}, ValueError),
    ({"x": np.ones(3), "p": -0.1, "seed": 1}, ValueError),
    ({"x": np.ones(3), "p": 0.5, "seed": -1}, ValueError),
    ({"x": np.ones(3), "p": 0.5, "seed": 2**64}, ValueError),
])
def test_dropout_bad_input(kwargs, error):
    with pytest.raises(error):
        dropout_forward(**kwargs)


def test_float32_phi_is_within_a_few_ulps_of_the_exact_one():
    """float32 arrays take the float32 Phi (a polynomial fit times an exactly split
    Gaussian): y / x within 4e-7 relative of SciPy's ndtr over [-10, 10], the far left tail
    included (where 1 + erf(x / sqrt 2) cancels); the backward's Phi + x phi within 4
    float32 ulps of its scale of the float64 twin's."""
    from scipy.special import ndtr

    x = np.linspace(-10, 10, 200_001).astype(np.float32)
    x = x[x != 0]
    y, cache = gelu_forward(x)
    exact = ndtr(x.astype(np.float64))
    assert np.max(np.abs(y / x.astype(np.float64) - exact) / exact) < 4e-7  # measured 3.4e-7
    dx = gelu_backward(np.ones_like(x), cache)
    want = reference.gelu_backward(np.ones(x.shape), (x.astype(np.float64), "none"))
    eps = np.finfo(np.float32).eps
    np.testing.assert_allclose(dx, want, rtol=4 * eps, atol=4 * eps)


def test_the_float32_phi_fit_is_reproducible():
    """``_PHI_FIT`` is what its comment says: the degree-9 weighted least-squares Chebyshev
    fit of Phi(-a) exp(a^2 / 2) / t, t = 1 / (1 + a/2), a in [0, 10], in powers of t - 1/2,
    rounded to float32; its own relative error below 1e-7."""
    from scipy.special import erfcx

    a = np.linspace(0, 10, 400_001)
    q, t = 0.5 * erfcx(a / np.sqrt(2)), 1 / (1 + 0.5 * a)
    fit = np.polynomial.Chebyshev.fit(t - 0.5, q / t, 9, w=t / q)
    coef = fit.convert(kind=np.polynomial.Polynomial, domain=[-1, 1], window=[-1, 1]).coef
    np.testing.assert_array_equal(coef.astype(np.float32), activation_cpu._PHI_FIT)
    assert np.max(np.abs(fit(t - 0.5) * t / q - 1)) < 1e-7


def test_relu_of_infinities_and_nan_as_torch():
    """relu(-inf) = 0 (x * (x > 0) gave -inf * 0 = NaN), relu(inf) = inf, NaN propagates;
    the gradient is 0 at -inf, 0 and NaN, as torch's threshold_backward, even for an infinite
    upstream gradient. nn.ReLU is F.relu."""
    torch = pytest.importorskip("torch")
    x = np.array([-np.inf, -2.0, -0.0, 0.0, 3.0, np.inf, np.nan])
    g = np.array([5.0, 1.0, 2.0, 3.0, 4.0, 6.0, 7.0])
    xt = torch.tensor(x, requires_grad=True)
    torch.relu(xt).backward(torch.tensor(g))
    for relu in (F.relu, nk.nn.ReLU()):
        xn = nk.tensor(x, requires_grad=True)
        y = relu(xn)
        np.testing.assert_array_equal(y.numpy(), torch.relu(torch.tensor(x)).numpy())
        y.backward(g)
        np.testing.assert_array_equal(xn.grad, xt.grad.numpy())
    xn = nk.tensor(np.array([-np.inf, 1.0]), requires_grad=True)
    F.relu(xn).backward(np.array([np.inf, 2.0]))  # inf * 0 where the mask is off: 0, not NaN
    np.testing.assert_array_equal(xn.grad, [0.0, 2.0])
