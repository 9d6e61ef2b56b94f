"""Reverse-mode autograd (``nnkit.autograd``) and ``nk.gradcheck``.

Every op is checked with central differences in float64 against a random upstream gradient
(``nk.gradcheck``), including broadcasting, ties, repeated indices and complex inputs; then
the graph semantics (accumulation, retain_graph, no_grad, deep graphs) and, when torch is
installed, a composite expression against torch's gradients.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import arrays, import_torch
from hypothesis import example, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import nnkit as nk
from nnkit.autograd import make_result


def _away_from(x, points=(0.0,), gap=0.1):
    """Move every element at least ``gap`` from each kink in ``points`` (finite differences
    are meaningless at a kink)."""
    x = np.array(x, dtype=np.float64)
    for p in points:
        d = x - p
        x = np.where(np.abs(d) < gap, p + np.where(d < 0, -gap, gap), x)
    return x


def _distinct(shape, rng):
    """Values with no ties (max/min are differentiable there), a random permutation."""
    n = int(np.prod(shape))
    return (rng.permutation(n).astype(np.float64) * 0.37 - n * 0.1).reshape(shape)


# ----- elementwise ops -------------------------------------------------------------------------
UNARY = {
    "neg": (lambda t: -t, None),
    "pos": (lambda t: +t, None),
    "exp": (lambda t: t.exp(), None),
    "log": (lambda t: t.log(), "positive"),
    "sqrt": (lambda t: t.sqrt(), "positive"),
    "abs": (lambda t: t.abs(), "kink0"),
    "tanh": (lambda t: t.tanh(), None),
    "sigmoid": (lambda t: t.sigmoid(), None),
    "relu": (lambda t: t.relu(), "kink0"),
    "clip": (lambda t: t.clip(-1.0, 1.5), "kinks_clip"),
    "clip_low_only": (lambda t: t.clip(min=-0.5), "kinks_clip"),
    "astype64": (lambda t: t.astype(np.float64), None),
    "pow_scalar": (lambda t: t**3, None),
    "pow_frac": (lambda t: t**2.5, "positive"),
    "pow_negative": (lambda t: t**-1.5, "positive"),
    "rpow": (lambda t: 2.0**t, None),
    "radd": (lambda t: 2.0 + t, None),
    "rsub": (lambda t: 2.0 - t, None),
    "rmul": (lambda t: 3.0 * t, None),
    "rdiv": (lambda t: 3.0 / t, "kink0"),
    "div_const": (lambda t: t / 4.0, None),
}


def _prepare(x, domain):
    if domain == "positive":
        return np.abs(x) + 0.2
    if domain == "kink0":
        return _away_from(x, (0.0,))
    if domain == "kinks_clip":
        return _away_from(x, (-1.0, 1.5, -0.5))
    return x


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_gradcheck(name, rng):
    fn, domain = UNARY[name]
    x = _prepare(rng.normal(size=(3, 4)) * 1.5, domain)
    assert nk.gradcheck(fn, [x])


@given(x=arrays(dtype=np.float64, max_dims=3, max_side=4, low=-3, high=3,
                allow_noncontiguous=False),
       name=st.sampled_from(sorted(UNARY)))
def test_unary_gradcheck_hypothesis_shapes(x, name):
    fn, domain = UNARY[name]
    assert nk.gradcheck(fn, [_prepare(x, domain)])


@given(x=arrays(dtype=np.float64, max_dims=3, max_side=4, low=-3, high=3))
@example(x=np.arange(6.0).reshape(2, 3).T)  # a transposed (F-ordered) input
def test_gradcheck_accepts_noncontiguous_inputs(x):
    # gradcheck perturbs the input through a flat view; for a non-contiguous array that
    # view must still alias the data, or the numerical gradient is silently zero
    assert nk.gradcheck(lambda t: t * t, [x])


BROADCAST_SHAPES = [
    ((3, 1), (1, 4)),
    ((4,), (2, 3, 4)),
    ((2, 3, 4), (4,)),
    ((), (2, 3)),
    ((2, 3), ()),
    ((2, 1, 3), (4, 1)),
    ((1,), (3,)),
    ((2, 3), (2, 3)),
]
BINARY = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b,
}


@pytest.mark.parametrize("shapes", BROADCAST_SHAPES, ids=str)
@pytest.mark.parametrize("op", sorted(BINARY))
def test_binary_broadcast_gradcheck(op, shapes, rng):
    a = rng.normal(size=shapes[0])
    b = rng.normal(size=shapes[1])
    if op == "div":
        b = _away_from(b, (0.0,), gap=0.5)
    assert nk.gradcheck(BINARY[op], [a, b])


@given(shapes=hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=3, max_side=3),
       op=st.sampled_from(sorted(BINARY)), seed=st.integers(0, 2**16))
def test_binary_broadcast_gradcheck_hypothesis(shapes, op, seed):
    rng = np.random.default_rng(seed)
    a, b = (rng.normal(size=s) for s in shapes.input_shapes)
    if op == "div":
        b = _away_from(b, (0.0,), gap=0.5)
    assert nk.gradcheck(BINARY[op], [a, b])


@pytest.mark.parametrize("op", sorted(BINARY))
def test_binary_with_constant_array_operand(op, rng):
    c = _away_from(rng.normal(size=(2, 1, 3)), (0.0,), gap=0.5)
    assert nk.gradcheck(lambda a: BINARY[op](a, c), [rng.normal(size=(4, 3))])
    assert nk.gradcheck(lambda a: BINARY[op](c, a), [_away_from(rng.normal(size=(4, 3)))])


@pytest.mark.parametrize("shapes", [((3,), (3,)), ((2, 3), ()), ((), (2, 3)), ((3, 1), (1, 4))],
                         ids=str)
def test_pow_with_tensor_exponent(shapes, rng):
    base = np.abs(rng.normal(size=shapes[0])) + 0.3
    exponent = rng.normal(size=shapes[1])
    assert nk.gradcheck(lambda a, b: a**b, [base, exponent])


def test_pow_with_broadcasting_array_exponent_reduces_gradient():
    # a constant array exponent that broadcasts the base: the gradient must be reduced to the
    # base's shape by the op, or a shape op upstream (reshape) cannot take it back
    t = nk.tensor(np.ones(3), requires_grad=True)
    (t.reshape(3) ** np.full((2, 3), 2.0)).sum().backward()
    np.testing.assert_allclose(t.grad, np.full(3, 4.0))


MATMUL_SHAPES = [
    ((3,), (3,)),
    ((2, 3), (3,)),
    ((3,), (3, 4)),
    ((2, 3), (3, 4)),
    ((5, 2, 3), (3, 4)),
    ((3,), (2, 3, 4)),
    ((2, 3), (5, 3, 2)),
    ((2, 1, 2, 3), (4, 3, 2)),
]


@pytest.mark.parametrize("shapes", MATMUL_SHAPES, ids=str)
def test_matmul_gradcheck(shapes, rng):
    a, b = rng.normal(size=shapes[0]), rng.normal(size=shapes[1])
    assert nk.gradcheck(lambda x, y: x @ y, [a, b])


def test_matmul_with_constant_operand_and_reflected(rng):
    w = rng.normal(size=(3, 2))
    assert nk.gradcheck(lambda x: x @ w, [rng.normal(size=(4, 3))])
    assert nk.gradcheck(lambda x: w.T @ x, [rng.normal(size=(3, 5))])


def test_matmul_of_a_scalar_raises_value_error():
    with pytest.raises(ValueError, match="at least 1 dimension"):
        nk.tensor(2.0) @ nk.tensor([1.0, 2.0])


@pytest.mark.parametrize("a, b", [((256, 512), (256, 64)), ((256, 4096), (4, 64)), ((3,), (4,)),
                                  ((5, 2, 3), (4, 2))])
def test_matmul_of_mismatched_inner_sizes_raises_value_error(a, b):
    """Large float32 products run on nnkit's packed kernel, which trusts its shapes: a
    mismatch gave wrong numbers or a crash before it was checked."""
    with pytest.raises(ValueError, match=r"matmul: a has shape .* must match b's rows"):
        nk.tensor(np.ones(a, np.float32)) @ nk.tensor(np.ones(b, np.float32))
    from nnkit._backend import matmul

    with pytest.raises(ValueError):  # the backend itself: NumPy's message
        matmul(np.ones(a, np.float32), np.ones(b, np.float32))


# ----- reductions ------------------------------------------------------------------------------
AXES_3D = [None, 0, 1, -1, (0, 2), (-1, 0), (0, 1, 2)]


@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("axis", AXES_3D, ids=str)
@pytest.mark.parametrize("op", ["sum", "mean", "max", "min"])
def test_reduction_gradcheck(op, axis, keepdims, rng):
    x = _distinct((2, 3, 4), rng)
    out = getattr(nk.tensor(x), op)(axis=axis, keepdims=keepdims)
    expected = getattr(np, op if op in ("sum", "mean") else "a" + op)(x, axis=axis,
                                                                        keepdims=keepdims)
    assert out.shape == expected.shape
    np.testing.assert_allclose(out.numpy(), expected)
    assert nk.gradcheck(lambda t: getattr(t, op)(axis=axis, keepdims=keepdims), [x])


@st.composite
def _array_and_axis(draw):
    x = draw(arrays(dtype=np.float64, min_dims=1, max_dims=3, min_side=1, max_side=4,
                    low=-3, high=3, allow_noncontiguous=False))
    axes = st.integers(-x.ndim, x.ndim - 1)
    axis = draw(st.none() | axes | st.lists(st.integers(0, x.ndim - 1), min_size=1,
                                            max_size=x.ndim, unique=True).map(tuple))
    return x, axis


@given(data=_array_and_axis(), keepdims=st.booleans(), op=st.sampled_from(["sum", "mean"]))
def test_sum_mean_gradcheck_hypothesis(data, keepdims, op):
    x, axis = data
    assert nk.gradcheck(lambda t: getattr(t, op)(axis=axis, keepdims=keepdims), [x])


@given(data=_array_and_axis(), keepdims=st.booleans(), op=st.sampled_from(["max", "min"]),
       seed=st.integers(0, 2**16))
def test_max_min_gradcheck_hypothesis(data, keepdims, op, seed):
    x, axis = data
    x = _distinct(x.shape, np.random.default_rng(seed))  # no ties: differentiable
    assert nk.gradcheck(lambda t: getattr(t, op)(axis=axis, keepdims=keepdims), [x])


def test_max_min_split_the_gradient_evenly_between_ties():
    x = nk.tensor([1.0, 3.0, 3.0, 2.0, 3.0], requires_grad=True)
    x.max().backward()
    np.testing.assert_allclose(x.grad, [0, 1 / 3, 1 / 3, 0, 1 / 3])
    y = nk.tensor([[2.0, 0.0, 0.0], [1.0, 1.0, 5.0]], requires_grad=True)
    y.min(axis=1).backward(np.array([6.0, 2.0], dtype=np.float32))
    np.testing.assert_allclose(y.grad, [[0, 3, 3], [1, 1, 0]])
    z = nk.tensor(np.ones((2, 2)), requires_grad=True)
    z.max(axis=(0, 1), keepdims=True).backward(np.ones((1, 1)))
    np.testing.assert_allclose(z.grad, np.full((2, 2), 0.25))


def test_max_with_nan_propagates_value_and_gradient_like_torch():
    # torch: max([1, nan]) = nan and the gradient goes to the NaN; no 0/0 warning
    x = nk.tensor([1.0, np.nan, 0.5], requires_grad=True)
    y = x.max()
    assert np.isnan(y.item())
    y.backward()
    np.testing.assert_array_equal(x.grad, [0.0, 1.0, 0.0])


def test_max_of_empty_tensor_raises_value_error():
    with pytest.raises(ValueError, match="empty"):
        nk.tensor(np.zeros((0, 3))).max()


# ----- shape ops -------------------------------------------------------------------------------
SHAPE_OPS = {
    "reshape": lambda t: t.reshape(4, 6),
    "reshape_tuple_minus1": lambda t: t.reshape((-1, 3)),
    "view": lambda t: t.view(6, 4),
    "flatten": lambda t: t.flatten(),
    "flatten_1": lambda t: t.flatten(1),
    "flatten_0_1": lambda t: t.flatten(0, 1),
    "transpose": lambda t: t.transpose(),
    "transpose_perm": lambda t: t.transpose(1, 2, 0),
    "transpose_negative": lambda t: t.transpose((-1, 0, 1)),
    "permute": lambda t: t.permute(2, 0, 1),
    "swapaxes": lambda t: t.swapaxes(0, -1),
    "T": lambda t: t.T,
    "unsqueeze": lambda t: t.unsqueeze(1),
    "unsqueeze_negative": lambda t: t.unsqueeze(-1),
    "squeeze": lambda t: t.unsqueeze(0).unsqueeze(2).squeeze(),
    "squeeze_axis": lambda t: t.unsqueeze(2).squeeze(2),
}


@pytest.mark.parametrize("name", sorted(SHAPE_OPS))
def test_shape_op_gradcheck(name, rng):
    x = rng.normal(size=(2, 3, 4))
    assert nk.gradcheck(SHAPE_OPS[name], [x])


def test_shape_ops_match_numpy():
    x = np.arange(24.0).reshape(2, 3, 4)
    t = nk.tensor(x)
    np.testing.assert_array_equal(t.transpose(1, 2, 0).numpy(), x.transpose(1, 2, 0))
    np.testing.assert_array_equal(t.swapaxes(0, 2).numpy(), x.swapaxes(0, 2))
    np.testing.assert_array_equal(t.flatten(1).numpy(), x.reshape(2, 12))
    assert t.unsqueeze(-1).shape == (2, 3, 4, 1)
    assert t.reshape(1, 24, 1).squeeze().shape == (24,)


@pytest.mark.parametrize("dims", [(3, -1), (0, 2), (-3, -1)])
def test_flatten_rejects_out_of_range_dims(dims):
    # a (2, 3) tensor has dims -2..1; wrapping 3 to 1 silently hides a caller's mistake
    with pytest.raises(ValueError, match="dim"):
        nk.tensor(np.ones((2, 3))).flatten(*dims)


def test_transpose_with_a_partial_permutation_raises_value_error():
    with pytest.raises(ValueError, match="permutation"):
        nk.tensor(np.ones((2, 3, 4))).transpose(0, 1)


# ----- indexing --------------------------------------------------------------------------------
INDICES = {
    "int": 1,
    "negative_int": -1,
    "slice": slice(1, 3),
    "negative_step": slice(None, None, -1),
    "negative_step_2": (slice(None, None, -2), slice(3, 0, -1)),
    "ellipsis": (Ellipsis, 1),
    "newaxis": (None, slice(None), 0),
    "int_array_repeats": np.array([0, 2, 0, 0]),
    "int_list_repeats": [3, 3, 1],
    "int_array_pairs": (np.array([0, 1, 1, 0]), np.array([2, 2, 3, 2])),
    "mixed_slice_array": (slice(1, None), np.array([0, 0, 3])),
    "int_array_2d": np.array([[0, 1], [1, 1]]),
    "bool_mask_rows": np.array([True, False, True, True]),
    "bool_mask_full": np.array([[True, False, True, False, True]] * 4),
    "tensor_index": nk.tensor(np.array([1, 1, 2])),
}


@pytest.mark.parametrize("name", sorted(INDICES))
def test_getitem_gradcheck(name, rng):
    x = rng.normal(size=(4, 5))
    index = INDICES[name]
    out = nk.tensor(x)[index]
    raw = index.numpy() if isinstance(index, nk.Tensor) else index
    np.testing.assert_array_equal(out.numpy(), x[raw])
    assert nk.gradcheck(lambda t: t[index], [x])


def test_getitem_repeated_integer_indices_accumulate():
    x = nk.tensor(np.zeros(4), requires_grad=True)
    x[np.array([0, 2, 0, 0, 3])].sum().backward()
    np.testing.assert_array_equal(x.grad, [3, 0, 1, 1])


def test_getitem_with_boolean_mask_of_data():
    x = nk.tensor([-1.0, 2.0, -3.0, 4.0], requires_grad=True)
    (x[x.numpy() > 0] * 2).sum().backward()
    np.testing.assert_array_equal(x.grad, [0, 2, 0, 2])


# ----- functions of several tensors ----------------------------------------------------------
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concat_gradcheck(axis, rng):
    shapes = {0: [(2, 3), (1, 3), (4, 3)], 1: [(2, 1), (2, 3), (2, 2)], -1: [(2, 2), (2, 1)]}
    inputs = [rng.normal(size=s) for s in shapes[axis]]
    assert nk.gradcheck(lambda *ts: nk.concat(ts, axis=axis), inputs)


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_stack_gradcheck(axis, rng):
    inputs = [rng.normal(size=(2, 3)) for _ in range(3)]
    out = nk.stack([nk.tensor(a) for a in inputs], axis=axis)
    np.testing.assert_array_equal(out.numpy(), np.stack(inputs, axis=axis))
    assert nk.gradcheck(lambda *ts: nk.stack(ts, axis=axis), inputs)


def test_concat_and_stack_mix_constants_and_tensors(rng):
    c = rng.normal(size=(2, 3))
    assert nk.gradcheck(lambda t: nk.concat([c, t], axis=0), [rng.normal(size=(1, 3))])
    assert nk.gradcheck(lambda t: nk.stack([t, c], axis=1), [rng.normal(size=(2, 3))])
    with pytest.raises(ValueError, match="at least one"):
        nk.concat([])
    with pytest.raises(ValueError, match="at least one"):
        nk.stack([])


def test_where_and_maximum_gradcheck(rng):
    cond = rng.random((3, 4)) > 0.5
    assert nk.gradcheck(lambda a, b: nk.where(cond, a, b),
                        [rng.normal(size=(3, 4)), rng.normal(size=(1, 4))])
    assert nk.gradcheck(lambda a: nk.where(nk.tensor(cond), a, 0.0), [rng.normal(size=(3, 4))])
    a = _distinct((3, 4), rng)
    b = _distinct((3, 4), rng) + 0.05  # no ties with a
    assert nk.gradcheck(lambda x, y: nk.maximum(x, y), [a, b])
    assert nk.gradcheck(lambda x: nk.maximum(x, 0.01), [a])


def test_maximum_gives_the_tie_to_the_first_argument():
    x = nk.tensor([1.0, 2.0], requires_grad=True)
    y = nk.tensor([1.0, 3.0], requires_grad=True)
    nk.maximum(x, y).sum().backward()
    np.testing.assert_array_equal(x.grad, [1, 0])
    np.testing.assert_array_equal(y.grad, [0, 1])


def test_astype_casts_the_gradient_back():
    x = nk.tensor(np.array([1.0, 2.0]), requires_grad=True)
    y = x.astype(np.float32)
    assert y.dtype == np.float32
    (y * y).sum().backward()
    assert x.grad.dtype == np.float64
    np.testing.assert_allclose(x.grad, [2.0, 4.0])
    assert x.float().dtype == np.float32 and x.float().double().dtype == np.float64


# ----- apply_op: the one way to write an op ------------------------------------------------
def _scaled_pair():
    """forward (x, w) -> x * w with its cache; backward records what it was asked for."""
    calls = []

    def forward(x, w, bias, factor):
        out = x * w * factor + (0 if bias is None else bias)
        return out, (x, w, factor)

    def backward(g, cache, needs):
        x, w, factor = cache
        calls.append(needs)
        return (g * w * factor if needs[0] else None, g * x * factor if needs[1] else None,
                g if needs[2] else None)

    return forward, backward, calls


def test_apply_op_records_only_when_a_parent_needs_grad_and_says_which():
    from nnkit.autograd import apply_op

    forward, backward, calls = _scaled_pair()
    x = nk.tensor(np.array([1.0, 2.0]), requires_grad=True)
    w = nk.tensor(np.array([3.0, 4.0]))
    y = apply_op("scaled", forward, backward, (x, w, None), 2.0)
    assert y.requires_grad and y._ctx.parents == (x, w)  # the absent bias is no parent
    y.sum().backward()
    assert calls == [(True, False, False)]  # only x's gradient was asked for
    np.testing.assert_array_equal(x.grad, [6.0, 8.0])
    assert w.grad is None

    released = []
    with nk.no_grad():
        z = apply_op("scaled", forward, backward, (x, w, None), 2.0, release=released.append)
    assert not z.requires_grad and z._ctx is None and len(released) == 1
    plain = apply_op("scaled", forward, backward, (w, w, None), 1.0, release=released.append)
    assert plain._ctx is None and len(released) == 2  # no parent needs grad: no node


def test_apply_op_gradients_pass_gradcheck_and_with_cache_returns_the_cache(rng):
    from nnkit.autograd import apply_op

    forward, backward, _ = _scaled_pair()
    assert nk.gradcheck(lambda x, w, b: apply_op("scaled", forward, backward, (x, w, b), 0.5),
                        [rng.normal(size=3), rng.normal(size=3), rng.normal(size=3)])
    out, cache = apply_op("scaled", forward, backward, (nk.tensor(np.ones(2)),
                          nk.tensor(np.ones(2)), None), 3.0, with_cache=True)
    assert cache[2] == 3.0 and out.numpy().tolist() == [3.0, 3.0]


# ----- complex -------------------------------------------------------------------------------
def _complex(rng, shape):
    return rng.normal(size=shape) + 1j * rng.normal(size=shape)


@pytest.mark.parametrize("op", ["mul", "exp", "div", "matmul", "add", "sub", "sum", "log",
                                "sqrt", "pow_scalar", "mul_real"])
def test_complex_gradcheck(op, rng):
    a, b = _complex(rng, (2, 3)), _complex(rng, (3, 2))
    cases = {
        "mul": (lambda x, y: x * y, [a, _complex(rng, (2, 3))]),
        "exp": (lambda x: x.exp(), [a]),
        "div": (lambda x, y: x / y, [a, _complex(rng, (1, 3)) + 3]),
        "matmul": (lambda x, y: x @ y, [a, b]),
        "add": (lambda x, y: x + y, [a, _complex(rng, (3,))]),
        "sub": (lambda x, y: x - y, [a, np.ascontiguousarray(b.T)]),
        "sum": (lambda x: x.sum(axis=0), [a]),
        "log": (lambda x: x.log(), [a + 4]),
        "sqrt": (lambda x: x.sqrt(), [a + 4]),
        "pow_scalar": (lambda x: x**3, [a]),
        "mul_real": (lambda x, y: x * y, [a, rng.normal(size=(2, 3))]),
    }
    fn, inputs = cases[op]
    assert nk.gradcheck(fn, inputs)


@pytest.mark.parametrize("op", ["tanh", "pow_tensor"])
def test_complex_gradcheck_of_holomorphic_ops_missing_conj(op, rng):
    # holomorphic ops must multiply by conj(f'(z)) like exp/log/sqrt do
    a = _complex(rng, (2, 3)) * 0.3
    if op == "tanh":
        assert nk.gradcheck(lambda x: x.tanh(), [a])
    else:
        assert nk.gradcheck(lambda x, y: x**y, [a + 2, _complex(rng, (2, 3)) * 0.3 + 1])


@pytest.mark.parametrize("case", ["complex", "complex_broadcast", "real", "imag", "abs2"])
def test_complex_real_imag_gradcheck(case, rng):
    """nk.complex, nk.real, nk.imag (and Tensor.real/.imag) compose with the other complex
    ops and their gradients agree with finite differences."""
    x, y, z = rng.normal(size=(2, 3)), rng.normal(size=(2, 3)), _complex(rng, (2, 3))
    cases = {
        "complex": (lambda a, b: (nk.complex(a, b) * nk.complex(b, a)).exp(), [x, y]),
        "complex_broadcast": (lambda a, b: nk.complex(a, b), [x, rng.normal(size=(3,))]),
        "real": (lambda w: (w * w).real * 2, [z]),
        "imag": (lambda w: nk.imag(w.exp()), [z]),
        "abs2": (lambda w: w.real * w.real + w.imag * w.imag, [z]),
    }
    fn, inputs = cases[case]
    assert nk.gradcheck(fn, inputs)


def test_complex_real_imag_dtypes_and_refusals():
    x32 = nk.tensor(np.ones(3, np.float32), requires_grad=True)
    z = nk.complex(x32, x32 * 2)
    assert z.dtype == np.complex64 and nk.real(z).dtype == np.float32
    assert nk.complex(np.ones(2), np.zeros(2)).dtype == np.complex128
    assert x32.real is x32  # a real tensor is its own real part, as torch
    with pytest.raises(TypeError, match="imag is defined for complex tensors only"):
        _ = x32.imag
    with pytest.raises(TypeError, match="one dtype, got float32 and float64"):
        nk.complex(x32, np.ones(3))
    with pytest.raises(TypeError, match="float32 or float64"):
        nk.complex(np.ones(3, np.int64), np.ones(3, np.int64))


def test_complex_real_imag_match_torch(rng):
    torch = import_torch()
    a, b = rng.normal(size=(2, 3)), rng.normal(size=(3,))
    ta, tb = (torch.tensor(v, requires_grad=True) for v in (a, b))
    na, nb = nk.tensor(a, requires_grad=True), nk.tensor(b, requires_grad=True)
    tz, nz = torch.complex(ta, tb).exp(), nk.complex(na, nb).exp()
    ((tz.real * 3 + tz.imag**2).sum()).backward()
    ((nz.real * 3 + nz.imag**2).sum()).backward()
    np.testing.assert_allclose(nz.numpy(), tz.detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(na.grad, ta.grad.numpy(), rtol=1e-12)
    np.testing.assert_allclose(nb.grad, tb.grad.numpy(), rtol=1e-12)


# ----- gradcheck itself ----------------------------------------------------------------------
def _wrong_square(t):
    # forward x^2 but backward claims dx = g * x (the factor 2 is missing)
    return make_result(t.data**2, (t,), lambda g: (g * t.data,), "wrong_square")


def test_gradcheck_catches_a_wrong_backward(rng):
    x = rng.normal(size=(3, 2))
    with pytest.raises(nk.GradcheckError, match="disagrees with finite differences"):
        nk.gradcheck(_wrong_square, [x])
    assert nk.gradcheck(_wrong_square, [x], raise_exception=False) is False
    assert issubclass(nk.GradcheckError, AssertionError)


def test_gradcheck_catches_a_wrong_backward_in_one_of_two_inputs(rng):
    def half_wrong_mul(a, b):
        return make_result(a.data * b.data, (a, b), lambda g: (g * b.data, g * b.data), "bad")

    with pytest.raises(nk.GradcheckError, match="input 1"):
        nk.gradcheck(half_wrong_mul, [rng.normal(size=3), rng.normal(size=3) + 5])


def test_gradcheck_catches_a_wrong_complex_backward(rng):
    def exp_without_conj(t):
        y = np.exp(t.data)
        return make_result(y, (t,), lambda g: (g * y,), "exp_no_conj")

    with pytest.raises(nk.GradcheckError):
        nk.gradcheck(exp_without_conj, [_complex(rng, (3,))])


def test_gradcheck_rejects_float32_and_inputs_without_grad():
    with pytest.raises(TypeError, match="float64"):
        nk.gradcheck(lambda t: t * 2, [nk.tensor([1.0, 2.0], requires_grad=True)])
    with pytest.raises(ValueError, match="requires_grad"):
        nk.gradcheck(lambda t: t * 2, [nk.tensor(np.ones(2))])


def test_gradcheck_multiple_outputs_and_constant_inputs(rng):
    c = nk.tensor(rng.normal(size=3))  # checked as a constant (no requires_grad)
    assert nk.gradcheck(lambda t, k: (t * k, t.exp(), None), [rng.normal(size=3), c])


# ----- graph semantics -----------------------------------------------------------------------
def test_tensor_used_twice_gets_the_sum():
    x = nk.tensor([1.0, -2.0, 3.0], requires_grad=True)
    (x * x).sum().backward()
    np.testing.assert_allclose(x.grad, [2.0, -4.0, 6.0])
    x.grad = None
    (x + x).sum().backward()
    np.testing.assert_allclose(x.grad, [2.0, 2.0, 2.0])
    x.grad = None
    y = x.exp()
    z = y + y
    z.sum().backward()
    np.testing.assert_allclose(x.grad, 2 * np.exp([1.0, -2.0, 3.0]), rtol=1e-6)
    x.grad = None
    w = x * 2.0
    (w * w.sum()).sum().__add__(w[0]).backward()  # w reaches the loss along three paths
    # L = S^2 + w_0 with S = sum(w), w = 2x: dL/dx = 2 (2 S + [j == 0]), S = 4
    np.testing.assert_allclose(x.grad, [18.0, 16.0, 16.0], rtol=1e-6)


def test_broadcast_gradient_is_reduced_to_the_operand_shape():
    a = nk.tensor(np.ones((3, 1)), requires_grad=True)
    b = nk.tensor(np.ones((4,)), requires_grad=True)
    s = nk.tensor(np.float64(2.0), requires_grad=True)
    ((a + b) * s).sum().backward()
    assert a.grad.shape == (3, 1) and b.grad.shape == (4,) and s.grad.shape == ()
    np.testing.assert_allclose(a.grad, np.full((3, 1), 8.0))
    np.testing.assert_allclose(b.grad, np.full(4, 6.0))
    np.testing.assert_allclose(s.grad, 24.0)


def test_gradient_of_float32_leaf_stays_float32():
    x = nk.tensor([1.0, 2.0], requires_grad=True)
    (x * np.array([1.0, 2.0])).sum().backward()  # a float64 constant upcasts the result
    assert x.grad.dtype == np.float32 and x.grad.shape == (2,)


def test_backward_twice_without_retain_graph_raises_with_clear_message():
    x = nk.tensor([1.0, 2.0], requires_grad=True)
    y = (x * x).sum()
    y.backward()
    with pytest.raises(RuntimeError, match="second time.*retain_graph=True"):
        y.backward()


def test_backward_with_retain_graph_runs_again_and_accumulates():
    x = nk.tensor([1.0, 2.0], requires_grad=True)
    y = (x * x).sum()
    y.backward(retain_graph=True)
    np.testing.assert_allclose(x.grad, [2.0, 4.0])
    y.backward(retain_graph=True)
    np.testing.assert_allclose(x.grad, [4.0, 8.0])
    y.backward()  # the last one may free the graph
    np.testing.assert_allclose(x.grad, [6.0, 8.0 + 4.0])


def test_backward_on_non_scalar_needs_a_gradient():
    x = nk.tensor([1.0, 2.0], requires_grad=True)
    y = x * 3
    with pytest.raises(RuntimeError, match="one-element"):
        y.backward()
    with pytest.raises(ValueError, match="shape"):
        y.backward(np.ones(3))
    y.backward(np.array([1.0, -1.0]))
    np.testing.assert_allclose(x.grad, [3.0, -3.0])


def test_backward_on_a_tensor_without_grad_raises():
    with pytest.raises(RuntimeError, match="does not require grad"):
        nk.tensor([1.0]).sum().backward()


def test_no_grad_records_nothing():
    x = nk.tensor([1.0, 2.0], requires_grad=True)
    with nk.no_grad():
        assert not nk.is_grad_enabled()
        y = (x * x).exp().sum()
    assert nk.is_grad_enabled()
    assert y.requires_grad is False and y.is_leaf
    with pytest.raises(RuntimeError):
        y.backward()


def test_no_grad_works_as_a_decorator_and_enable_grad_inside():
    @nk.no_grad()
    def f(t):
        return t * 2

    x = nk.tensor([1.0], requires_grad=True)
    assert f(x).requires_grad is False
    assert nk.is_grad_enabled()
    with nk.no_grad():
        with nk.enable_grad():
            z = x * 2
        w = x * 2
    assert z.requires_grad is True and w.requires_grad is False
    z.sum().backward()
    np.testing.assert_allclose(x.grad, [2.0])

    @nk.enable_grad()
    def g(t):
        return t * 3

    with nk.no_grad():
        assert g(x).requires_grad is True


def test_no_grad_restores_state_after_an_exception():
    with pytest.raises(KeyError), nk.no_grad():
        {}["missing"]  # noqa: B018
    assert nk.is_grad_enabled()


@pytest.mark.parametrize("data", [[1, 2], np.arange(3), True, np.array([True])])
def test_requires_grad_on_non_float_tensor_is_a_type_error(data):
    with pytest.raises(TypeError, match="floating-point"):
        nk.tensor(data, requires_grad=True)
    with pytest.raises(TypeError, match="floating-point"):
        nk.Tensor(data, requires_grad=True)
    with pytest.raises(TypeError, match="floating-point"):
        nk.tensor(data).requires_grad_()


def test_deep_chain_backpropagates_without_recursion_error():
    x = nk.tensor(np.float64(1.0), requires_grad=True)
    y = x
    for _ in range(20000):
        y = y * 1.0001 + 0.0
    y.backward()
    np.testing.assert_allclose(x.grad, 1.0001**20000, rtol=1e-9)


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "matmul", "pow"])
def test_ndarray_op_tensor_gives_a_tensor(op):
    a = np.array([[1.0, 2.0], [3.0, 4.0]])
    x = nk.tensor(np.array([[0.5, -1.0], [2.0, 1.5]]), requires_grad=True)
    ops = {"add": lambda: a + x, "sub": lambda: a - x, "mul": lambda: a * x,
           "div": lambda: a / x, "matmul": lambda: a @ x, "pow": lambda: a**x}
    ref = {"add": a + x.data, "sub": a - x.data, "mul": a * x.data, "div": a / x.data,
           "matmul": a @ x.data, "pow": a**x.data}
    y = ops[op]()
    assert isinstance(y, nk.Tensor) and y.requires_grad
    np.testing.assert_allclose(y.numpy(), ref[op])
    assert nk.gradcheck(lambda t: {"add": a + t, "sub": a - t, "mul": a * t, "div": a / t,
                                   "matmul": a @ t, "pow": a**t}[op], [x.numpy()])


def test_comparisons_give_arrays_and_tensor_basics():
    x = nk.tensor([1.0, 2.0, 3.0])
    assert isinstance(x > 1.5, np.ndarray)
    np.testing.assert_array_equal(x <= 2, [True, True, False])
    assert x.numel() == 3 and len(x) == 3 and x.ndim == 1 and x.dtype == np.float32
    assert nk.tensor(1.0).item() == 1.0
    assert np.asarray(x).dtype == np.float32
    assert "requires_grad=True" in repr(nk.tensor([1.0], requires_grad=True))


@pytest.mark.parametrize("op", ["add", "mul", "sub", "div", "pow", "neg", "exp", "sum"])
def test_ops_on_zero_dim_tensors_keep_arrays(op):
    # NumPy turns 0-d array (op) 0-d array into a NumPy scalar; .data must stay an ndarray so
    # that .numpy() and repr() work on a scalar loss
    x = nk.tensor(np.float64(1.5), requires_grad=True)
    y = {"add": lambda: x + x, "mul": lambda: x * 2.0, "sub": lambda: 1.0 - x,
         "div": lambda: x / x, "pow": lambda: x**2, "neg": lambda: -x, "exp": lambda: x.exp(),
         "sum": lambda: x.sum() + 1.0}[op]()
    assert isinstance(y.data, np.ndarray) and y.shape == ()
    assert isinstance(y.numpy(), np.ndarray)
    assert "tensor(" in repr(y)
    y.backward()
    assert isinstance(x.grad, np.ndarray) and x.grad.shape == ()


def test_tensor_copies_and_keeps_numpy_dtypes():
    a = np.array([1.0, 2.0])
    t = nk.tensor(a)
    a[0] = 5
    assert t.numpy()[0] == 1.0 and t.dtype == np.float64
    assert nk.tensor([1.0]).dtype == np.float32
    assert nk.tensor([1, 2]).dtype.kind == "i"
    assert nk.tensor([1, 2], dtype=np.float64).dtype == np.float64
    d = nk.tensor([1.0], requires_grad=True).detach()
    assert not d.requires_grad and d.is_leaf


# ----- torch equivalence ---------------------------------------------------------------------
def _composite(lib, a, b, c, idx):
    """One random-ish expression through most ops; ``lib`` supplies the free functions."""
    h = (a @ b).tanh() * c[None, :] + (a * a).sum(axis=1, keepdims=True) / 3.0
    h = h - h.max(axis=0, keepdims=True) * 0.5
    h = (h.exp() + 1.0).log() + h.sigmoid() ** 2 - h.relu() * 0.3
    h = lib["stack"]([h[idx], h[::-1][idx]], 0).swapaxes(0, 1).reshape(len(idx), -1)
    return (h.abs() + 1.0).sqrt().mean() + lib["concat"]([h, h], 1).min()


def test_composite_expression_matches_torch(rng):
    torch = import_torch()
    a, b, c = rng.normal(size=(4, 3)), rng.normal(size=(3, 5)), rng.normal(size=5)
    idx = np.array([0, 2, 2, 3])
    nk_in = [nk.tensor(v, requires_grad=True) for v in (a, b, c)]
    out = _composite({"stack": nk.stack, "concat": nk.concat}, *nk_in, idx)
    out.backward()

    def t_stack(ts, axis):
        return torch.stack(ts, axis)

    def t_concat(ts, axis):
        return torch.cat(ts, axis)

    t_in = [torch.tensor(v, requires_grad=True) for v in (a, b, c)]
    ta, tb, tc = t_in
    h = torch.tanh(ta @ tb) * tc[None, :] + (ta * ta).sum(dim=1, keepdim=True) / 3.0
    h = h - h.max(dim=0, keepdim=True).values * 0.5
    h = torch.log(torch.exp(h) + 1.0) + torch.sigmoid(h) ** 2 - torch.relu(h) * 0.3
    ti = torch.as_tensor(idx)
    h = t_stack([h[ti], torch.flip(h, [0])[ti]], 0).transpose(0, 1).reshape(len(idx), -1)
    t_out = torch.sqrt(h.abs() + 1.0).mean() + t_concat([h, h], 1).min()
    t_out.backward()
    np.testing.assert_allclose(out.item(), t_out.item(), rtol=1e-12)
    for n, t in zip(nk_in, t_in, strict=True):
        np.testing.assert_allclose(n.grad, t.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_leaf_gradients_never_share_memory():
    """One upstream array handed to several parents (x + y, views) is copied per leaf, so
    clipping one gradient in place cannot change another."""
    a = nk.tensor(np.ones((2, 3)), requires_grad=True)
    b = nk.tensor(np.ones((2, 3)), requires_grad=True)
    c = nk.tensor(np.ones(6), requires_grad=True)
    d = nk.tensor(np.ones(6), requires_grad=True)
    (a + b).sum().backward()
    (c.reshape(2, 3) + d.reshape(2, 3)).sum().backward()
    for u, v in [(a, b), (c, d)]:
        assert not np.shares_memory(u.grad, v.grad)
        u.grad *= 0
        np.testing.assert_array_equal(v.grad, 1.0)
    g = np.ones((2, 3))
    e = nk.tensor(np.ones((2, 3)), requires_grad=True)
    e.backward(g)  # the caller keeps g: the leaf must not alias it
    assert not np.shares_memory(e.grad, g)


def test_a_reused_id_is_not_taken_for_a_shared_gradient():
    """The backward remembers the gradients it handed out by id; a new array that reuses a
    freed one's id must not count as that one (its leaf would store a needless copy): the
    table keeps weak references and compares identity. What takes no weak reference (a
    NumPy scalar) counts as shared."""
    from nnkit.autograd import _among, _weak

    a = np.ones(3)
    assert _among({id(a): _weak(a)}, a)
    b = np.ones(3)
    assert not _among({id(b): _weak(np.zeros(3))}, b)  # a freed array's entry, b's id
    assert not _among({id(b): _weak(a)}, b)
    s = np.float64(1.0)
    assert _among({id(s): _weak(s)}, s)


def test_tensor_relu_of_infinities_and_nan_as_torch():
    """max(x, 0): -inf gives 0, not -inf * 0 = NaN; NaN stays NaN and passes the gradient."""
    x = nk.tensor([-np.inf, -1.0, 0.0, 2.0, np.inf, np.nan], requires_grad=True)
    y = x.relu()
    y.backward(np.full(6, 2.0))
    np.testing.assert_array_equal(y.numpy(), [0.0, 0.0, 0.0, 2.0, np.inf, np.nan])
    np.testing.assert_array_equal(x.grad, [0.0, 0.0, 0.0, 2.0, 2.0, 2.0])
    assert y.dtype == x.dtype


@pytest.mark.parametrize("method", ["sum", "mean", "max", "min"])
def test_reductions_take_torchs_dim_or_numpys_axis(method):
    x = nk.tensor(np.arange(6.0).reshape(2, 3))
    by_axis = getattr(x, method)(axis=1).numpy()
    np.testing.assert_array_equal(getattr(x, method)(dim=1).numpy(), by_axis)
    with pytest.raises(TypeError, match="axis .* or dim .*, not both"):
        getattr(x, method)(axis=1, dim=0)


def test_shape_functions_take_dim_or_axis():
    a, b = nk.tensor(np.ones((2, 3))), nk.tensor(np.zeros((2, 3)))
    assert nk.concat([a, b], dim=1).shape == nk.concat([a, b], axis=1).shape == (2, 6)
    assert nk.stack([a, b], dim=2).shape == (2, 3, 2)
    assert a.unsqueeze(dim=0).shape == a.unsqueeze(0).shape == (1, 2, 3)
    assert a.unsqueeze(0).squeeze(dim=0).shape == (2, 3)
    with pytest.raises(TypeError, match="not both"):
        nk.concat([a, b], axis=0, dim=1)


def test_flatten_start_after_end_is_named():
    with pytest.raises(ValueError, match="start_dim=2 comes after end_dim=1"):
        nk.tensor(np.ones((2, 3, 4))).flatten(2, 1)


def test_big_endian_data_becomes_native():
    t = nk.tensor(np.arange(3, dtype=">f8"))
    assert t.dtype == np.dtype(np.float64) and t.dtype.isnative
    np.testing.assert_array_equal(t.numpy(), [0.0, 1.0, 2.0])


@pytest.mark.parametrize("bad", ["abc", None, object(), [["a"]], [[1.0], [1.0, 2.0]]])
def test_as_tensor_names_the_argument(bad):
    from nnkit.autograd import as_tensor

    with pytest.raises(TypeError, match="^weight must be an array or Tensor of numbers"):
        as_tensor(bad, name="weight")


# ----- post-accumulate-grad hooks ----------------------------------------------------------------
def _mlp3():
    nk.manual_seed(0)
    return nk.nn.Sequential(nk.nn.Linear(4, 8), nk.nn.Tanh(), nk.nn.Linear(8, 8), nk.nn.Tanh(),
                            nk.nn.Linear(8, 2))


def test_a_leaf_hook_runs_once_its_gradient_is_complete_last_layer_first():
    model = _mlp3()
    names = {id(p): n for n, p in model.named_parameters()}
    seen = []
    for p in model.parameters():
        p.register_post_accumulate_grad_hook(lambda t: seen.append((names[id(t)],
                                                                    t.grad.copy())))
    x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    model(x).sum().backward()
    assert [n for n, _ in seen] == ["4.weight", "4.bias", "2.weight", "2.bias", "0.weight",
                                    "0.bias"]
    params = dict(model.named_parameters())
    for name, grad in seen:  # nothing was added after the hook ran
        np.testing.assert_array_equal(grad, params[name].grad)


def test_a_leaf_used_twice_is_reported_once_with_both_contributions():
    w = nk.tensor(np.array([2.0, 3.0]), requires_grad=True)
    calls = []
    w.register_post_accumulate_grad_hook(lambda t: calls.append(t.grad.copy()))
    ((w * w).sum() + (3 * w).sum()).backward()
    assert len(calls) == 1
    np.testing.assert_array_equal(calls[0], 2 * w.data + 3)
    (w * w).sum().backward()  # a second backward: the hook again, after accumulating
    assert len(calls) == 2
    np.testing.assert_array_equal(calls[1], 4 * w.data + 3)


def test_a_removed_hook_stops_and_copies_carry_none():
    import copy
    import pickle

    w = nk.tensor(np.ones(3), requires_grad=True)
    calls = []
    handle = w.register_post_accumulate_grad_hook(lambda t: calls.append(1))
    for clone in (copy.deepcopy(w), pickle.loads(pickle.dumps(w))):
        clone.sum().backward()
    assert calls == []
    w.sum().backward()
    handle.remove()
    w.sum().backward()
    assert calls == [1]


def test_hooks_only_on_leaves_and_only_callables():
    w = nk.tensor(np.ones(3), requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf"):
        (w * 2).register_post_accumulate_grad_hook(print)
    with pytest.raises(TypeError, match="hook must be callable"):
        w.register_post_accumulate_grad_hook(3)
