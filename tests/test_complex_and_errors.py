"""Complex inputs and the messages of wrong inputs.

``F.linear`` with complex operands follows the conjugate convention (gradcheck, torch);
ops whose math needs real numbers (orderings, probabilities, real losses) refuse complex
input with a TypeError naming the op, the argument and its dtype; the linear recurrent
layers refuse complex and empty sequences; a float64 input to a float32 module names the
user's argument and the two ways out.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import import_torch
from op_facts import OP_FACTS

import nnkit as nk
import nnkit.functional as F
from nnkit.models.vit import ViT
from nnkit.nn.linear_recurrent import LRU, MinGRU, MinLSTM


def _complex(rng, shape):
    return rng.normal(size=shape) + 1j * rng.normal(size=shape)


# ----- F.linear with complex operands ----------------------------------------------------------
def test_linear_complex_gradient_matches_matmul_example():
    x0, w0 = np.array([[1 + 2j, 0.5 - 1j]]), np.array([[0.3 + 0.1j, -1 + 0.5j]])
    x, w = nk.tensor(x0, requires_grad=True), nk.tensor(w0, requires_grad=True)
    F.linear(x, w).backward(np.ones((1, 1), complex))
    x2, w2 = nk.tensor(x0, requires_grad=True), nk.tensor(w0, requires_grad=True)
    (x2 @ w2.T).backward(np.ones((1, 1), complex))
    np.testing.assert_allclose(x.grad, [[0.3 - 0.1j, -1 - 0.5j]])
    np.testing.assert_allclose(x.grad, x2.grad)
    np.testing.assert_allclose(w.grad, w2.grad)


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("lead", [(4,), (2, 3)])
def test_linear_complex_gradcheck(rng, with_bias, lead):
    x, w, b = _complex(rng, (*lead, 3)), _complex(rng, (2, 3)), _complex(rng, (2,))
    if with_bias:
        assert nk.gradcheck(lambda x, w, b: F.linear(x, w, b), (x, w, b))
    else:
        assert nk.gradcheck(lambda x, w: F.linear(x, w), (x, w))


def test_linear_real_gradcheck_still_passes(rng):
    args = (rng.normal(size=(4, 3)), rng.normal(size=(2, 3)), rng.normal(size=2))
    assert nk.gradcheck(lambda x, w, b: F.linear(x, w, b), args)


def test_linear_complex_matches_torch(rng):
    torch = import_torch()
    x0, w0, b0 = _complex(rng, (4, 3)), _complex(rng, (2, 3)), _complex(rng, (2,))
    g0 = _complex(rng, (4, 2))
    tensors = [nk.tensor(a, requires_grad=True) for a in (x0, w0, b0)]
    F.linear(*tensors).backward(g0)
    refs = [torch.tensor(a, requires_grad=True) for a in (x0, w0, b0)]
    torch.nn.functional.linear(*refs).backward(torch.tensor(g0))
    for ours, ref in zip(tensors, refs, strict=True):
        np.testing.assert_allclose(ours.grad, ref.grad.numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("case", ["complex_x", "complex_weight", "complex_bias", "real_bias"])
def test_linear_refuses_mixed_real_and_complex(rng, case):
    x, w = rng.normal(size=(2, 3)), rng.normal(size=(4, 3))
    b = rng.normal(size=4)
    name = {"complex_x": "x", "complex_weight": "x", "complex_bias": "bias",
            "real_bias": "bias"}[case]
    if case == "complex_x":
        x = x + 0j
    elif case == "complex_weight":
        w = w + 0j
    elif case == "complex_bias":
        b = b + 1j
    else:
        x, w = x + 0j, w + 0j
    with pytest.raises(TypeError, match=rf"linear: {name} has dtype .* weight has dtype"):
        F.linear(x, w, b)


@pytest.mark.parametrize("x_dtype, w_dtype, b_dtype, name", [
    (np.float32, np.float64, None, "x"),
    (np.float64, np.float32, np.float32, "x"),
    (np.float32, np.float32, np.float64, "bias"),
    (np.complex64, np.complex128, np.complex128, "x"),
    (np.complex128, np.complex128, np.complex64, "bias"),
], ids=["f32-x-f64-w", "f64-x-f32-w", "f64-bias", "c64-x-c128-w", "c64-bias"])
def test_linear_refuses_mixed_precision(rng, x_dtype, w_dtype, b_dtype, name):
    """As torch ("mat1 and mat2 must have the same dtype"): no silent promotion, whose
    float64 result would be followed by float64 gradients for a float32 model."""
    x = rng.normal(size=(2, 3)).astype(x_dtype)
    w = rng.normal(size=(4, 3)).astype(w_dtype)
    b = None if b_dtype is None else rng.normal(size=4).astype(b_dtype)
    got = np.dtype(x_dtype if name == "x" else b_dtype).name
    with pytest.raises(TypeError, match=rf"linear: {name} has dtype {got} but weight has "
                                        rf"dtype {np.dtype(w_dtype).name}; they must have "
                                        "the same dtype"):
        F.linear(x, w, b)


def test_linear_module_refuses_input_of_another_precision():
    layer = nk.nn.Linear(3, 2)  # float32
    with pytest.raises(TypeError, match="linear: x has dtype float64 but weight has dtype "
                                        "float32"):
        layer(np.ones((1, 3)))
    assert layer(np.ones((1, 3), np.float32)).dtype == np.float32
    assert layer.double()(np.ones((1, 3))).dtype == np.float64


def test_linear_module_refuses_complex_input():
    with pytest.raises(TypeError, match="linear: x has dtype complex128 but weight has dtype "
                                        "float32"):
        nk.nn.Linear(3, 2)(np.ones((1, 3), complex))


# ----- ops undefined for complex numbers -------------------------------------------------------
Z = np.array([[1 + 2j, -1 + 0.5j]])
R = np.array([[1.0, 2.0]])

# The public ops that OP_FACTS lists without complex dtypes refuse a complex first array
# argument with this message, except those below, whose messages name the argument and its
# dtype in the words of their own checks (OP_FACTS' error inputs pin them).
_OWN_MESSAGE = {"conv1d", "conv2d", "max_pool2d", "avg_pool2d", "log_linear_scan",
                "scaled_dot_product_attention"}


def _complex_call(name):
    """OP_FACTS[name]'s valid call with its first floating-point array made complex128, and
    the message's prefix."""
    kwargs = OP_FACTS[name].valid()
    arg = next(k for k, v in kwargs.items() if isinstance(v, np.ndarray) and v.dtype.kind == "f")
    kwargs[arg] = kwargs[arg].astype(np.complex128)
    return (lambda: OP_FACTS[name].op(**kwargs)), f"{name}: {arg}"


REFUSING = {name: _complex_call(name) for name, facts in OP_FACTS.items()
            if np.complex128 not in facts.dtypes["cpu"] and name not in _OWN_MESSAGE
            and any(isinstance(v, np.ndarray) for v in facts.valid().values())} | {
    "gelu_tanh": (lambda: F.gelu(Z, approximate="tanh"), "gelu: x"),
    "layer_norm_weight": (lambda: F.layer_norm(R, 2, Z[0]), "layer_norm: weight"),
    "mse_target": (lambda: F.mse_loss(R, Z), "mse_loss: target"),
    "cross_entropy_none": (lambda: F.cross_entropy(Z, np.array([0]), reduction="none"),
                           "cross_entropy: logits"),
    "bce_target": (lambda: F.binary_cross_entropy_with_logits(R, Z),
                   "binary_cross_entropy_with_logits: target"),
    "bce_pos_weight": (lambda: F.binary_cross_entropy_with_logits(R, R, pos_weight=Z),
                       "binary_cross_entropy_with_logits: pos_weight"),
    "tensor_relu": (lambda: nk.tensor(Z).relu(), "relu: input"),
    "tensor_max": (lambda: nk.tensor(np.array([1, 9j])).max(), "max: input"),
    "tensor_min_axis": (lambda: nk.tensor(Z).min(axis=1), "min: input"),
    "tensor_clip": (lambda: nk.tensor(Z).clip(0, 1), "clip: input"),
    "maximum": (lambda: nk.maximum(nk.tensor(Z), 0.0), "maximum: x"),
    "maximum_y": (lambda: nk.maximum(nk.tensor(R), nk.tensor(Z)), "maximum: y"),
    "module_relu": (lambda: nk.nn.ReLU()(Z), "relu: x"),
    "mse_module": (lambda: nk.nn.MSELoss()(Z, R), "mse_loss: pred"),
}


def test_complex_sigmoid_as_torch_with_conjugated_gradient():
    """torch defines sigmoid on complex numbers: 1 / (1 + exp(-z)); gradcheck holds."""
    z = nk.tensor(Z, requires_grad=True)
    np.testing.assert_allclose(F.sigmoid(z).data, 1 / (1 + np.exp(-Z)), rtol=1e-14)
    assert nk.gradcheck(lambda t: F.sigmoid(t), (z,))
    torch = import_torch()
    np.testing.assert_allclose(F.sigmoid(Z).data, torch.sigmoid(torch.from_numpy(Z)).numpy(),
                               rtol=1e-14)


def test_dropout_is_the_identity_on_complex_when_off():
    """As torch: off (eval, or p = 0) dropout returns its input, complex too; on, it refuses
    complex input (torch's Bernoulli mask has no complex version)."""
    np.testing.assert_array_equal(F.dropout(Z, 0.5, training=False).data, Z)
    np.testing.assert_array_equal(F.dropout(Z, 0.0).data, Z)
    np.testing.assert_array_equal(nk.nn.Dropout(0.5).eval()(Z).data, Z)


@pytest.mark.parametrize("case", sorted(REFUSING))
def test_ops_undefined_for_complex_raise_a_clear_type_error(case):
    fn, prefix = REFUSING[case]
    with pytest.raises(TypeError, match=rf"^{prefix} must be real \(float32/float64\), got "
                                        r"complex128"):
        fn()


@pytest.mark.parametrize("op", ["<", "<=", ">", ">="])
@pytest.mark.parametrize("side", ["self", "other"])
def test_comparisons_refuse_complex(op, side):
    a, b = (nk.tensor(Z), 0.0) if side == "self" else (nk.tensor(R), Z)
    with pytest.raises(TypeError, match=rf"comparison \({op}\): operands must be real"):
        {"<": a.__lt__, "<=": a.__le__, ">": a.__gt__, ">=": a.__ge__}[op](b)
    if side == "other":
        with pytest.raises(TypeError, match="complex numbers have no order"):
            nk.tensor(R) < 1j  # noqa: B015


def test_real_inputs_of_those_ops_still_work():
    assert F.mse_loss(np.array([1.0, 2.0]), np.zeros(2)).item() == pytest.approx(2.5)
    assert nk.tensor(np.array([1.0, 9.0])).max().item() == 9.0
    assert (nk.tensor(R) < 1.5).tolist() == [[True, False]]
    np.testing.assert_allclose(F.relu(np.array([-1.0, 2.0])).numpy(), [0.0, 2.0])


def test_complex_ops_with_a_meaning_still_work(rng):
    z = _complex(rng, (2, 3)) * 0.3
    assert F.tanh(z).dtype == np.complex128
    assert F.embedding(np.array([1, 0]), z).dtype == np.complex128
    assert nk.gradcheck(lambda x: x.abs(), [z + 0.1])


# ----- linear recurrent layers -----------------------------------------------------------------
@pytest.mark.parametrize("cls", [MinGRU, MinLSTM, LRU])
def test_linear_recurrent_layers_refuse_complex_x(cls):
    layer = cls(3, 4)
    with pytest.raises(TypeError, match=rf"{cls.__name__}: x must be real .* got complex64"):
        layer(np.zeros((2, 5, 3), np.complex64))
    with pytest.raises(TypeError, match=rf"{cls.__name__}.step: x_t must be real"):
        layer.step(np.zeros((2, 3), np.complex64), None)


@pytest.mark.parametrize("cls", [MinGRU, MinLSTM, LRU, nk.nn.LSTM])
def test_empty_sequences_give_the_lstm_message(cls):
    layer = cls(3, 4, batch_first=True) if cls is not LRU else cls(3, 4)
    with pytest.raises(ValueError, match=r"an empty sequence \(T = 0\).*T >= 1"):
        layer(np.zeros((2, 0, 3), np.float32))


def test_min_gru_time_major_empty_sequence():
    with pytest.raises(ValueError, match=r"x has shape \(0, 2, 3\): an empty sequence"):
        MinGRU(3, 4, batch_first=False)(np.zeros((0, 2, 3), np.float32))


def test_lru_real_input_still_runs():
    assert LRU(2, 8, random_state=0)(np.zeros((3, 10, 2), np.float32)).dtype == np.float32


# ----- dtype mismatches name the user's argument -----------------------------------------------
def _vit():
    return ViT(image_size=8, patch_size=4, in_channels=1, num_classes=2, dim=8, depth=1,
               heads=2, mlp_dim=8)


MODULE_CASES = {
    "LayerNorm": (lambda: nk.nn.LayerNorm(4), lambda m, x: m(x), "x", (2, 4)),
    "TransformerEncoderLayer": (lambda: nk.nn.TransformerEncoderLayer(4, 2, 8),
                                lambda m, x: m(x), "src", (3, 1, 4)),
    "TransformerDecoderLayer": (lambda: nk.nn.TransformerDecoderLayer(4, 2, 8),
                                lambda m, x: m(x, x), "tgt", (3, 1, 4)),
    "ViT": (_vit, lambda m, x: m(x), "images", (1, 1, 8, 8)),
    "LSTM": (lambda: nk.nn.LSTM(4, 3), lambda m, x: m(x), "x", (3, 1, 4)),
}


@pytest.mark.parametrize("case", sorted(MODULE_CASES))
def test_float64_input_to_a_float32_module_names_the_argument(case):
    make, call, name, shape = MODULE_CASES[case]
    module, x = make(), np.ones(shape)
    with pytest.raises(TypeError) as info:
        call(module, x)
    msg = str(info.value)
    assert msg.startswith(f"{name} has dtype float64 but {case}'s parameters are float32")
    assert f"{name}.astype(np.float32)" in msg and ".double()" in msg
    assert "weight" not in msg
    call(module, x.astype(np.float32))  # both suggested fixes work
    call(module.double(), x)


def test_decoder_memory_dtype_is_named():
    layer = nk.nn.TransformerDecoderLayer(4, 2, 8)
    with pytest.raises(TypeError, match="^memory has dtype float64 but "
                                        "TransformerDecoderLayer's parameters are float32"):
        layer(np.ones((3, 1, 4), np.float32), np.ones((3, 1, 4)))


def test_integer_input_message_suggests_only_the_input_cast():
    with pytest.raises(TypeError, match=r"x has dtype int64 .*x.astype\(np.float32\)$"):
        nk.nn.LSTM(2, 3)(np.ones((1, 1, 2), np.int64))


def test_functional_layer_norm_keeps_its_parameter_message():
    with pytest.raises(TypeError, match="weight has dtype float32 but x has dtype float64"):
        F.layer_norm(np.ones((2, 4)), 4, np.ones(4, np.float32))


# ----- flags that must be bools, bounds of compiled loops -----------------------------------------
@pytest.mark.parametrize("call, name", [
    (lambda: F.dropout(R, 0.5, training="no"), "training"),
    (lambda: nk.nn.RNN(2, 3, batch_first="no"), "batch_first"),
    (lambda: nk.nn.LSTM(2, 3, bidirectional=1), "bidirectional"),
    (lambda: nk.nn.MultiheadAttention(4, 2, batch_first="yes"), "batch_first"),
    (lambda: nk.nn.MultiheadAttention(4, 2)(np.ones((3, 1, 4), np.float32),
                                            np.ones((3, 1, 4), np.float32),
                                            np.ones((3, 1, 4), np.float32), need_weights="no"),
     "need_weights"),
])
def test_truthy_non_bool_flags_are_refused(call, name):
    """A string flag is truthy: 'no' used to switch dropout, batch_first or the weights on."""
    with pytest.raises(TypeError, match=f"{name} must be a bool"):
        call()


def test_hopfield_sweeps_beyond_int64_are_refused():
    """2**63 sweeps wrapped to a negative count in the compiled loop (states unchanged)."""
    from nnkit.classic.hopfield import Hopfield

    net = Hopfield(6).store([[1, 1, 1, 1, -1, -1]])
    with pytest.raises(ValueError, match="max_sweeps"):
        net.run([1, 1, 1, -1, -1, -1], mode="sync", max_sweeps=2**63)


def test_log_space_scan_of_infinities_is_infinite():
    """logaddexp(inf, inf) = inf, as NumPy (inf - inf gave NaN); from a finite log h0."""
    from nnkit.kernels.scan import log_linear_scan_forward

    inf = np.full((1, 3, 1), np.inf)
    assert np.all(log_linear_scan_forward(inf, inf, np.zeros((1, 1)))[0] == np.inf)


# ----- byte order ---------------------------------------------------------------------------------
def test_big_endian_inputs_are_read_as_native(rng):
    """'>f8' arrays (read from a file, say) said "must have dtype float32 or float64, got
    >f8"; the checked inputs are now converted (a copy), as NumPy users expect."""
    from nnkit.functional import conv as FC
    from nnkit.kernels.softmax import softmax_forward

    x = rng.standard_normal((2, 3, 5))
    be = x.astype(">f8")
    for fn in (lambda a: softmax_forward(a)[0], lambda a: F.softmax(a, axis=-1).numpy(),
               lambda a: F.layer_norm(a, 5).numpy(),
               lambda a: FC.conv1d(a, np.ones((2, 3, 2))).numpy()):
        np.testing.assert_array_equal(fn(be), fn(x))
    assert softmax_forward(be)[0].dtype == np.float64  # native


def test_big_endian_out_is_refused_naming_the_byte_order(rng):
    """out= is written in place, so it cannot be converted: a message, not a silent copy."""
    from nnkit.kernels.scan import linear_scan_forward
    from nnkit.kernels.softmax import softmax_forward

    x = rng.standard_normal((2, 3, 4))
    out = np.empty((2, 3, 4), ">f8")
    match = r"out has dtype >f8 \(float64, big-endian\), not this machine's byte order"
    with pytest.raises(TypeError, match=match):
        softmax_forward(x, out=out)
    with pytest.raises(TypeError, match=match):
        linear_scan_forward(x, x, out=out)
    assert softmax_forward(x.astype(">f8"), out=np.empty_like(x))[0].dtype == np.float64


def test_wrong_dtype_message_names_a_foreign_byte_order():
    from nnkit._validation import check_array, describe_dtype

    assert describe_dtype(">f2") == ">f2 (float16, big-endian)"
    assert describe_dtype(np.float64) == "float64"
    # a non-native float16 is converted, then refused for its type alone
    with pytest.raises(TypeError, match="x must have dtype float32 or float64, got float16$"):
        check_array(np.zeros(2, ">f2"), name="x", dtype=(np.float32, np.float64))
    # Tensors are made in native byte order: modules take big-endian inputs as they are
    native = np.random.default_rng(0).normal(size=(1, 2, 3))
    be = native.astype(">f8")
    assert nk.tensor(be).dtype == np.float64
    for layer in (nk.nn.Linear(3, 2).double(), nk.nn.LayerNorm(3).double()):
        np.testing.assert_array_equal(layer(be).numpy(), layer(native).numpy())
