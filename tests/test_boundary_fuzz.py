"""Fuzz the public entry points with garbage: only ``ValueError`` or ``TypeError`` may come out.

Every argument of ``nk.tensor``, the ``F.*`` functions, the ``nn`` constructors and the
layers' forwards is in turn replaced with something wrong (None, strings, bools, objects,
int/bool/complex/object/string arrays, wrong ranks and shapes, NaN/inf/negative/zero
hyper-parameters). The call must either work or raise ``ValueError``/``TypeError`` with a
message; an ``IndexError``, ``AttributeError``, ``OverflowError``, a Numba typing error or a
crash is a bug. Valid but odd inputs (an empty batch) must work, backward included.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from op_facts import OP_FACTS

import nnkit as nk
import nnkit.functional as F
from nnkit import nn

ALLOWED = (ValueError, TypeError)

_DTYPES = [np.int64, np.int8, np.uint8, np.bool_, np.complex128, np.float16, np.float32,
           np.float64, np.object_, np.dtype("<U2")]


@st.composite
def _garbage_array(draw):
    dtype = draw(st.sampled_from(_DTYPES))
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=3))
    if np.dtype(dtype) == np.object_:
        return np.array(draw(st.lists(st.none() | st.integers(), min_size=1, max_size=3)) +
                        [None], dtype=object)
    if np.dtype(dtype).kind == "U":
        # no NUL: numpy's fixed-width strings drop trailing NULs, which hypothesis rejects
        letters = st.characters(codec="utf-8", exclude_characters="\x00")
        return draw(hnp.arrays(dtype, shape, elements=st.text(letters, max_size=2)))
    return draw(hnp.arrays(dtype, shape))  # floats include NaN and infinity


_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-10, 10),
    st.sampled_from([2**63, -(2**70)]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -1.0, float("nan"), float("inf"), -float("inf"), 1e300]),
    st.complex_numbers(max_magnitude=10),
    st.text(max_size=4),
    st.binary(max_size=3),
    st.just(object()),
    st.tuples(),
    st.lists(st.integers(-3, 3), max_size=3),
    st.lists(st.floats(-2, 2), max_size=3).map(tuple),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
)
GARBAGE = st.one_of(_SCALARS, _garbage_array(), _garbage_array().map(
    lambda a: nk.tensor(a) if a.dtype.kind in "biufc" else a))


def _call(func, /, *args, **kwargs):
    """Run ``func``; accept its result or a ValueError/TypeError with a message; backpropagate
    through a result that requires grad.

    NumPy's RuntimeWarnings (overflow to inf, NaN from garbage values) are not what this file
    checks and are ignored here; the ones that are bugs are pinned in the tests below.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        try:
            out = func(*args, **kwargs)
        except ALLOWED as exc:
            assert str(exc), f"{type(exc).__name__} without a message"
            return None
        if isinstance(out, nk.Tensor) and out.requires_grad and out.numel() > 0:
            try:
                out.backward(np.ones(out.shape, dtype=out.dtype))
            except ALLOWED:
                pass
    return out


@st.composite
def _spoiled(draw, make_valid):
    """The valid keyword arguments from ``make_valid()`` with one or two replaced by garbage."""
    args = make_valid()
    keys = draw(st.lists(st.sampled_from(sorted(args)), min_size=1, max_size=2, unique=True))
    for k in keys:
        args[k] = draw(GARBAGE)
    return args


def _x(*shape, dtype=np.float32, grad=True):
    data = np.random.default_rng(0).normal(size=shape).astype(dtype)
    return nk.tensor(data, requires_grad=grad)


# ----- nk.tensor ------------------------------------------------------------------------------
@example(data=2**63, requires_grad=False, dtype=np.int32)  # once an OverflowError
@given(data=GARBAGE, requires_grad=st.booleans() | GARBAGE,
       dtype=st.none() | st.sampled_from([np.float32, "float64", np.int32, "foo", object]))
def test_fuzz_tensor(data, requires_grad, dtype):
    t = _call(nk.tensor, data, requires_grad=requires_grad, dtype=dtype)
    if t is not None:
        assert t.dtype.kind in "biufc", f"nk.tensor accepted non-numeric dtype {t.dtype}"


@pytest.mark.parametrize("data", ["abc", [1, "a"], b"xy", np.array(["a", "b"])])
def test_tensor_rejects_strings(data):
    with pytest.raises(TypeError):
        nk.tensor(data)


# ----- functional -----------------------------------------------------------------------------
# the sample inputs of tests/op_facts.py, each in turn spoiled
SAMPLES = [pytest.param(name, i, id=f"{name}-{i}")
           for name, facts in OP_FACTS.items() for i in range(len(facts.samples))]


def test_functional_table_covers_every_public_function():
    assert set(OP_FACTS) == set(F.__all__)
    assert all(facts.samples for facts in OP_FACTS.values())


@pytest.mark.parametrize(("name", "sample"), SAMPLES)
@given(data=st.data())
def test_fuzz_functional(name, sample, data):
    facts = OP_FACTS[name]
    _call(facts.op, **data.draw(_spoiled(facts.samples[sample]), label="kwargs"))


@pytest.mark.parametrize(("name", "sample"), SAMPLES)
def test_functional_valid_arguments_work(name, sample):
    facts = OP_FACTS[name]
    out = facts.op(**facts.samples[sample]())
    out = out[0] if isinstance(out, tuple) else out  # (o, final state) of the recurrences
    assert isinstance(out, nk.Tensor) and np.all(np.isfinite(out.numpy()))


# pinned: each is a crash the fuzzer found
@pytest.mark.parametrize("call", [
    pytest.param(lambda: F.embedding(np.array([0]), np.float32(1.0)), id="embedding-0d-weight"),
    pytest.param(lambda: F.embedding(np.array([0]), np.ones(3, np.float32)),
                 id="embedding-1d-weight"),
    pytest.param(lambda: nn.LayerNorm((float("inf"),)), id="layernorm-inf-shape"),
    pytest.param(lambda: nn.LayerNorm((2.5,)), id="layernorm-float-shape"),
    pytest.param(lambda: F.cross_entropy(np.ones((2, 3)), np.array([0, 1]), ignore_index=-2**70),
                 id="cross-entropy-huge-ignore-index"),
    pytest.param(lambda: nn.CrossEntropyLoss(ignore_index=2**63)(np.ones((2, 3)),
                                                                np.array([0, 1])),
                 id="cross-entropy-loss-huge-ignore-index"),
    pytest.param(lambda: F.cross_entropy(np.ones((2, 3)), np.array([0, 1]), ignore_index=0.5),
                 id="cross-entropy-float-ignore-index"),
    pytest.param(lambda: nk.tensor(2**63, dtype=np.int32), id="tensor-int-overflow"),
    pytest.param(lambda: F.softmax(np.ones((2, 3)), axis=1.5), id="softmax-float-axis"),
    pytest.param(lambda: F.softmax(np.ones((2, 3)), axis=5), id="softmax-axis-out-of-range"),
    pytest.param(lambda: F.avg_pool2d(np.ones((1, 1, 2, 2), np.float32), 2,
                                      divisor_override=-(2**70)),
                 id="avg-pool-huge-divisor-override"),  # a Numba TypingError
])
def test_pinned_boundary_crashes(call):
    with pytest.raises(ALLOWED):
        call()


# ----- nn constructors -------------------------------------------------------------------------
CONSTRUCTORS = {
    "Linear": (nn.Linear, lambda: {"in_features": 4, "out_features": 3, "bias": True,
                                   "dtype": np.float32}),
    "Embedding": (nn.Embedding, lambda: {"num_embeddings": 5, "embedding_dim": 3,
                                         "padding_idx": 0, "dtype": None}),
    "LayerNorm": (nn.LayerNorm, lambda: {"normalized_shape": (3,), "eps": 1e-5,
                                         "elementwise_affine": True, "bias": True}),
    "Dropout": (nn.Dropout, lambda: {"p": 0.5}),
    "GELU": (nn.GELU, lambda: {"approximate": "none"}),
    "Softmax": (nn.Softmax, lambda: {"dim": -1}),
    "Flatten": (nn.Flatten, lambda: {"start_dim": 1, "end_dim": -1}),
    "Residual": (nn.Residual, lambda: {"fn": nn.Linear(3, 3), "projection": None,
                                       "subtract_origin": True}),
    "MSELoss": (nn.MSELoss, lambda: {"reduction": "mean"}),
    "CrossEntropyLoss": (nn.CrossEntropyLoss, lambda: {"ignore_index": -100,
                                                       "reduction": "mean"}),
    "BCEWithLogitsLoss": (nn.BCEWithLogitsLoss, lambda: {"weight": None, "reduction": "mean",
                                                         "pos_weight": None}),
}

# valid inputs for each module's forward, used after a successful construction
_FORWARD_INPUT = {
    "Linear": lambda: (_x(2, 4),),
    "Embedding": lambda: (np.array([[0, 4], [1, 0]]),),
    "LayerNorm": lambda: (_x(2, 3),),
    "Dropout": lambda: (_x(2, 3),),
    "GELU": lambda: (_x(2, 3),),
    "Softmax": lambda: (_x(2, 3),),
    "Flatten": lambda: (_x(2, 3, 2),),
    "Residual": lambda: (_x(2, 3),),
    "MSELoss": lambda: (_x(2, 3), np.ones((2, 3), np.float32)),
    "CrossEntropyLoss": lambda: (_x(2, 3), np.array([0, 2])),
    "BCEWithLogitsLoss": lambda: (_x(2, 3), np.ones((2, 3), np.float32)),
}


@pytest.mark.parametrize("name", sorted(CONSTRUCTORS))
@given(data=st.data())
def test_fuzz_constructors_then_forward(name, data):
    cls, make_valid = CONSTRUCTORS[name]
    module = _call(cls, **data.draw(_spoiled(make_valid), label="kwargs"))
    if module is not None:  # accepted arguments must give a working module
        _call(module, *_FORWARD_INPUT[name]())


@given(modules=st.lists(GARBAGE | st.just(nn.ReLU()), min_size=1, max_size=3))
def test_fuzz_containers(modules):
    _call(nn.Sequential, *modules)
    _call(nn.ModuleList, modules)


# ----- nn forwards -----------------------------------------------------------------------------
FORWARDS = {
    "Linear": lambda: nn.Linear(4, 3),
    "Embedding": lambda: nn.Embedding(5, 3, padding_idx=1),
    "LayerNorm": lambda: nn.LayerNorm(3),
    "LayerNorm2d": lambda: nn.LayerNorm((2, 3)),
    "Dropout": lambda: nn.Dropout(0.3),
    "ReLU": nn.ReLU,
    "Sigmoid": nn.Sigmoid,
    "Tanh": nn.Tanh,
    "GELU": nn.GELU,
    "Softmax": nn.Softmax,
    "Flatten": nn.Flatten,
    "Identity": nn.Identity,
    "Residual": lambda: nn.Residual(nn.Sequential(nn.Linear(3, 3), nn.Tanh())),
    "ResidualProjected": lambda: nn.Residual(nn.Linear(3, 2),
                                             projection=nn.Linear(3, 2, bias=False)),
    "Sequential": lambda: nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.LayerNorm(4)),
}


@pytest.mark.parametrize("name", sorted(FORWARDS))
@given(x=GARBAGE)
def test_fuzz_forward(name, x):
    _call(FORWARDS[name](), x)


LOSSES = {
    "MSELoss": (nn.MSELoss, lambda: {"pred": _x(2, 3), "target": np.ones((2, 3))}),
    "CrossEntropyLoss": (nn.CrossEntropyLoss, lambda: {"logits": _x(2, 3),
                                                       "target": np.array([0, 2])}),
    "BCEWithLogitsLoss": (nn.BCEWithLogitsLoss, lambda: {"logits": _x(2, 3),
                                                         "target": np.ones((2, 3))}),
}


@pytest.mark.parametrize("name", sorted(LOSSES))
@given(data=st.data())
def test_fuzz_loss_forward(name, data):
    cls, make_valid = LOSSES[name]
    args = data.draw(_spoiled(make_valid), label="args")
    _call(cls(), *args.values())


@given(key=st.sampled_from(["0.weight", "0.bias", "2.weight"]), value=GARBAGE,
       strict=st.booleans())
def test_fuzz_load_state_dict(key, value, strict):
    model = nn.Sequential(nn.Linear(3, 2), nn.ReLU(), nn.LayerNorm(2))
    sd = model.state_dict()
    sd[key] = value
    _call(model.load_state_dict, sd, strict=strict)


# ----- valid but odd: an empty batch ---------------------------------------------------------
def _empty_cases(dtype):
    def w(*shape):
        return _x(*shape, dtype=dtype)

    zeros = np.zeros((0, 4), dtype=dtype)
    return {
        "linear": lambda x: F.linear(x, w(3, 4), w(3)),
        "linear_3d": lambda x: F.linear(x.reshape(0, 2, 4), w(3, 4)),
        "sigmoid": F.sigmoid,
        "tanh": F.tanh,
        "relu": F.relu,
        "gelu": F.gelu,
        "gelu_tanh": lambda x: F.gelu(x, "tanh"),
        "softmax": F.softmax,
        "log_softmax": F.log_softmax,
        "cross_entropy_sum": lambda x: F.cross_entropy(x, np.zeros(0, np.int64),
                                                       reduction="sum"),
        "cross_entropy_none": lambda x: F.cross_entropy(x, np.zeros(0, np.int64),
                                                        reduction="none"),
        "mse_loss_sum": lambda x: F.mse_loss(x, zeros, reduction="sum"),
        "bce_sum": lambda x: F.binary_cross_entropy_with_logits(x, zeros, reduction="sum"),
        "layer_norm": lambda x: F.layer_norm(x, 4, w(4), w(4)),
        "dropout": lambda x: F.dropout(x, 0.5),
        "embedding": lambda x: F.embedding(np.zeros((0, 3), np.int64), w(5, 4)) + x.sum(),
        "Linear": lambda x: nn.Linear(4, 2, dtype=dtype)(x),
        "LayerNorm": lambda x: nn.LayerNorm(4, dtype=dtype)(x),
        "Embedding": lambda x: nn.Embedding(5, 4, padding_idx=0, dtype=dtype)(
            np.zeros((0,), np.int64)) + x,
        "Sequential": lambda x: nn.Sequential(nn.Linear(4, 4), nn.GELU(),
                                              nn.LayerNorm(4)).astype(dtype)(x),
        "Residual": lambda x: nn.Residual(nn.Linear(4, 4, dtype=dtype))(x),
        "Flatten": lambda x: nn.Flatten()(x),
    }


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", sorted(_empty_cases(np.float32)))
def test_empty_batch_works_forward_and_backward(name, dtype):
    x = nk.tensor(np.zeros((0, 4), dtype=dtype), requires_grad=True)
    out = _empty_cases(dtype)[name](x)
    assert isinstance(out, nk.Tensor)
    assert out.dtype == dtype
    out.sum().backward()
    assert x.grad is None or (x.grad.shape == (0, 4) and x.grad.dtype == dtype)


def test_empty_batch_mean_losses_are_nan_like_torch():
    # torch returns NaN silently; a RuntimeWarning ('Mean of empty slice') is an error here
    x = np.zeros((0, 3), np.float32)
    assert np.isnan(F.cross_entropy(x, np.zeros(0, np.int64)).item())
    assert np.isnan(F.mse_loss(x, x).item())


@example(p=float("nan"))
@given(p=st.floats(allow_nan=True, allow_infinity=True) | st.integers(-3, 3) | st.none())
def test_fuzz_dropout_p(p):
    _call(F.dropout, _x(3), p)
    _call(nn.Dropout, p)
