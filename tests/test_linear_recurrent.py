"""The LRU against notes §5.2: the change of basis of a dense linear RNN into
the complex diagonal recurrence (``LRU.from_dense``), and |lambda| < 1 for every nu."""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import nnkit as nk
from nnkit.autograd import real
from nnkit.nn.linear_recurrent import LRU


def _stable_dense(seed, P, F, radius=0.95):
    """A random real (P, P) matrix scaled to spectral radius ``radius`` (complex-conjugate
    eigenvalue pairs and distinct eigenvalues, so diagonalisable), B, C, D."""
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((P, P))
    A *= radius / np.abs(np.linalg.eigvals(A)).max()
    return (A, rng.standard_normal((P, F)), rng.standard_normal((F, P)),
            rng.standard_normal(F), rng)


def _dense_rnn(A, B, C, D, x, h0=None):
    """h_t = A h_{t-1} + B x_t, y_t = C h_t + D x_t, as a loop over t; x (N, T, F)."""
    h = np.zeros((x.shape[0], A.shape[0])) if h0 is None else h0
    ys = []
    for t in range(x.shape[1]):
        h = h @ A.T + x[:, t] @ B.T
        ys.append(h @ C.T + x[:, t] * D)
    return np.stack(ys, axis=1)


@given(P=st.integers(1, 8), F=st.integers(1, 4), seed=st.integers(0, 2 ** 16),
       radius=st.sampled_from([0.3, 0.9, 0.999]))
def test_section_5_2_change_of_basis_reproduces_the_dense_rnn(P, F, seed, radius):
    """A = P Lambda P^-1, B' = P^-1 B, C' = C P: the diagonal recurrence gives the dense
    network's outputs (float64, to rounding amplified by cond(P))."""
    A, B, C, D, rng = _stable_dense(seed, P, F, radius)
    if np.linalg.cond(np.linalg.eig(A)[1]) > 1e6:
        return  # a nearly defective draw: covered by the refusal test
    lru = LRU.from_dense(A, B, C, D)
    assert lru.state_size == P and lru.input_size == F and lru.nu.dtype == np.float64
    x = rng.standard_normal((2, 30, F))
    want = _dense_rnn(A, B, C, D, x)
    got = lru(x).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9 * np.abs(want).max())
    np.testing.assert_allclose(np.sort_complex(lru.eigenvalues()),
                               np.sort_complex(np.linalg.eigvals(A)), rtol=1e-12, atol=1e-14)


def test_section_5_2_change_of_basis_with_a_rotation_and_an_initial_state():
    """A rotation-scaling block (eigenvalues r e^{+-i phi}) and a real eigenvalue; a dense h0
    enters the LRU as P^-1 h0, with P the eigenvectors of numpy.linalg.eig(A)."""
    r, phi = 0.9, 0.7
    block = r * np.array([[math.cos(phi), -math.sin(phi)], [math.sin(phi), math.cos(phi)]])
    A0 = np.zeros((3, 3))
    A0[:2, :2], A0[2, 2] = block, -0.5
    Q = np.array([[1.0, 0.3, -0.2], [0.1, 1.0, 0.4], [0.0, -0.3, 1.0]])
    A = Q @ A0 @ np.linalg.inv(Q)
    rng = np.random.default_rng(3)
    B, C, D = rng.standard_normal((3, 2)), rng.standard_normal((2, 3)), np.diag([0.5, -1.0])
    lru = LRU.from_dense(A, B, C, D)
    lam = np.sort_complex(lru.eigenvalues())
    np.testing.assert_allclose(lam, [-0.5, r * np.exp(-1j * phi), r * np.exp(1j * phi)],
                               atol=1e-12)
    x, h0 = rng.standard_normal((4, 25, 2)), rng.standard_normal((4, 3))
    vectors = np.linalg.eig(A)[1]
    zeta0 = np.linalg.solve(vectors, h0.T).T  # (4, 3) complex: P^-1 h0 for each row
    np.testing.assert_allclose(lru(x, zeta0).numpy(), _dense_rnn(A, B, C, np.diag(D), x, h0),
                               rtol=1e-10, atol=1e-10)


def test_from_dense_zero_eigenvalue_and_no_skip():
    A = np.diag([0.0, 0.5])  # h_t's first component forgets at once
    B, C = np.array([[1.0], [2.0]]), np.array([[1.0, 1.0]])
    lru = LRU.from_dense(A, B, C)
    x = np.random.default_rng(4).standard_normal((1, 12, 1))
    np.testing.assert_allclose(lru(x).numpy(), _dense_rnn(A, B, C, np.zeros(1), x),
                               rtol=1e-12, atol=1e-12)
    assert np.isfinite(lru.nu.data).all()


def test_from_dense_float32_and_gradients():
    A, B, C, D, rng = _stable_dense(5, 4, 2, 0.8)
    lru = LRU.from_dense(A.astype(np.float32), B, C, D)
    assert lru.nu.dtype == np.float32
    x = rng.standard_normal((2, 20, 2))
    want = _dense_rnn(A, B, C, D, x)
    got = lru(x.astype(np.float32)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    lru64 = LRU.from_dense(A, B, C, D)  # trains like any LRU: every parameter has a gradient
    params = [p for _, p in lru64.named_parameters()]
    assert nk.gradcheck(lambda x, *_: lru64(x), [x[:, :5], *params])


def test_from_dense_module_saves_and_loads(tmp_path):
    A, B, C, D, rng = _stable_dense(6, 3, 2, 0.9)
    lru = LRU.from_dense(A, B, C, D)
    nk.save(lru, tmp_path / "lru.safetensors")
    back = nk.load(tmp_path / "lru.safetensors")
    x = rng.standard_normal((1, 15, 2))
    np.testing.assert_array_equal(back(x).numpy(), lru(x).numpy())


def test_from_dense_refuses_a_defective_or_unstable_a():
    B, C = np.eye(2), np.eye(2)
    with pytest.raises(ValueError, match="A must be diagonalisable.*condition number"):
        LRU.from_dense(np.array([[0.5, 1.0], [0.0, 0.5]]), B, C)  # a Jordan block
    with pytest.raises(ValueError, match="A must be stable.*spectral radius"):
        LRU.from_dense(np.diag([0.5, 1.01]), B, C)
    with pytest.raises(ValueError, match="A must be stable"):
        LRU.from_dense(np.array([[0.0, -1.0], [1.0, 0.0]]), B, C)  # |lambda| = 1 exactly
    near = np.diag([0.5, 1 - 1e-7])  # fine in float64, beyond float32's |lambda| bound
    assert LRU.from_dense(near, B, C).nu.dtype == np.float64
    with pytest.raises(ValueError, match="A must be stable.*float32"):
        LRU.from_dense(near, B, C, dtype=np.float32)


def test_from_dense_bad_shapes_and_types():
    A, B, C = np.eye(2) * 0.5, np.ones((2, 3)), np.ones((3, 2))
    with pytest.raises(ValueError, match="A must be a square"):
        LRU.from_dense(np.ones((2, 3)), B, C)
    with pytest.raises(ValueError, match=r"B must have shape \(P, F\) = \(2, F\)"):
        LRU.from_dense(A, np.ones((3, 3)), C)
    with pytest.raises(ValueError, match=r"C must have shape \(F, P\) = \(3, 2\)"):
        LRU.from_dense(A, B, np.ones((2, 2)))
    with pytest.raises(ValueError, match="D must be diagonal"):
        LRU.from_dense(A, B, C, np.ones((3, 3)))
    with pytest.raises(ValueError, match="D must have shape"):
        LRU.from_dense(A, B, C, np.ones(2))
    with pytest.raises(TypeError, match="A"):
        LRU.from_dense(A.astype(np.complex128), B, C)
    with pytest.raises(ValueError, match="A"):
        LRU.from_dense(np.array([[np.nan, 0.0], [0.0, 0.5]]), B, C)


# ---- |lambda| < 1 for every nu (notes §5.2: lambda = exp(-exp(nu) + i theta)) --------------

def test_exp_minus_exp_nu_rounds_to_one():
    """What the bound is there for: r = exp(-exp(nu)) in (0, 1) of notes §5.2 is 1.0 in floats."""
    assert np.exp(-np.exp(np.float32(-20))) == 1 and np.exp(-np.exp(np.float64(-50))) == 1
    assert np.exp(-np.exp(np.float64(-20))) < 1


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("nu", [-20.0, -50.0, -1e4, -np.inf])
def test_section_5_2_modulus_below_one_at_extreme_nu(nu, dtype):
    """exp(-exp(nu)) rounds to 1.0 at nu = -20 in float32 (-50 in float64); the bound on
    exp(nu) keeps |lambda| < 1 as computed in the module's own dtype, at every theta."""
    lru = LRU(1, 4096, dtype=dtype, random_state=0)
    lru.nu.data[...] = nu
    lru.theta.data[...] = np.linspace(0, 2 * np.pi, 4096).astype(dtype)
    lam = lru._lambda().data
    assert lam.dtype == (np.complex64 if dtype == np.float32 else np.complex128)
    assert np.abs(lam).max() < 1 and np.abs(lru.eigenvalues()).max() < 1
    x = np.ones((1, 2000, 1), dtype)  # a constant input: the state grows, but stays finite
    assert np.isfinite(lru(x).numpy()).all()


def test_nu_bound_passes_the_gradient_in_the_normal_range_only():
    """d lambda / d nu = -exp(nu) lambda above the bound; no gradient to nu below it."""
    lru = LRU(1, 5, dtype=np.float64, random_state=0)
    lru.nu.data[...] = [-3.0, -1.0, 0.0, 1.0, -50.0]
    loss = real(lru._lambda()).sum()
    loss.backward()
    lam = lru.eigenvalues()
    want = np.real(-np.exp(lru.nu.data) * lam)
    want[-1] = 0.0
    np.testing.assert_allclose(lru.nu.grad, want, rtol=1e-12, atol=1e-300)
    assert lru.theta.grad[-1] != 0  # the phase still learns where nu is held


def test_nu_nan_is_not_hidden_by_the_bound():
    lru = LRU(1, 2, dtype=np.float32, random_state=0)
    lru.nu.data[0] = np.nan
    with np.errstate(invalid="ignore"):
        lam = lru._lambda().data
    assert np.isnan(lam[0]) and np.isfinite(lam[1])
