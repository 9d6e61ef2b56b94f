"""The fused GELU kernels against the naive twin, central differences, serial == parallel,
and the public boundary."""

import numpy as np
import pytest
from helpers import arrays, assert_matches_reference
from hypothesis import given
from hypothesis import strategies as st

import nnkit as nk
from nnkit import functional as F
from nnkit._ext import activation_cpu
from nnkit.kernels import gelu_backward, gelu_forward, reference


@given(x=arrays(low=-12.0, high=12.0, max_side=9), seed=st.integers(0, 2**16))
def test_kernels_match_the_naive_twin(x, seed):
    g = np.random.default_rng(seed).standard_normal(x.shape).astype(x.dtype)
    y, cdf = gelu_forward(x)
    assert_matches_reference(y, reference.gelu(x))
    assert_matches_reference(gelu_backward(g, x, cdf), reference.gelu_backward(g, x))


def test_far_tails_and_non_finite_inputs():
    x = np.array([-np.inf, -1e30, -10.5, 10.5, 1e30, np.inf, np.nan])
    y, cdf = gelu_forward(x)
    np.testing.assert_array_equal(y, [0, 0, 0, 10.5, 1e30, np.inf, np.nan])
    dx = gelu_backward(np.ones_like(x), x, cdf)
    np.testing.assert_array_equal(dx, [0, 0, 0, 1, 1, 1, np.nan])


def test_gradient_matches_central_differences():
    x = nk.tensor(np.linspace(-4, 4, 17).reshape(1, 17), requires_grad=True)
    assert nk.gradcheck(F.gelu, [x])


def test_parallel_build_equals_serial_build():
    x = np.random.default_rng(0).standard_normal(100_000).astype(np.float32) * 4
    g = np.ones_like(x)
    results = []
    for build in ("serial", "parallel"):
        y, cdf, dx = np.empty_like(x), np.empty_like(x), np.empty_like(x)
        getattr(activation_cpu.gelu_forward, build)(x, y, cdf)
        getattr(activation_cpu.gelu_backward, build)(g, x, cdf, dx)
        results.append((y, cdf, dx))
    for serial, parallel in zip(*results, strict=True):
        np.testing.assert_array_equal(serial, parallel)


def test_functional_gelu_uses_the_kernels_on_strided_input():
    x = np.random.default_rng(1).standard_normal((6, 8))[:, ::2]  # not contiguous
    t = nk.tensor(x, requires_grad=True)
    F.gelu(t).sum().backward()
    assert_matches_reference(F.gelu(x).numpy(), reference.gelu(x))
    assert_matches_reference(t.grad, reference.gelu_backward(np.ones_like(x), x))


def test_bad_input_is_named():
    with pytest.raises(TypeError, match="x"):
        gelu_forward(np.arange(3))
    y, cdf = gelu_forward(np.zeros(3))
    with pytest.raises(ValueError, match=r"g and x must have the same shape"):
        gelu_backward(np.zeros(4), np.zeros(3), cdf)
