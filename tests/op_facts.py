"""One table of facts about every public op of ``nk.functional``, in the spirit of PyTorch's
OpInfo (``torch.testing._internal.opinfo.core``).

``OP_FACTS[name]`` holds, for each name of ``F.__all__``: the public callable, its naive
reference twins (``nnkit.kernels.reference``), one valid call (``valid``), a few sample
inputs (``samples``: keyword-argument builders whose arrays are Tensors that require grad),
the calls it must refuse (``error_inputs``: torch's ``ErrorInput``, a call, the error type
and a regex its message must match), the dtypes it takes per device, and its pinned GPU
launch budget: ``(Numba launches, all device kernels)`` per row of
benchmarks/gpu_kernel_counts.py (``launch_budget``) and the kernels each pass of its
nk.kernels pair launches (``kernel_launches``). The tests draw from here:
test_functional_error_inputs.py (valid calls, error inputs, dtypes), test_boundary_fuzz.py
(samples), test_fewer_launches.py and test_launch.py (launch budgets). A new public op needs
one entry in each table below.

Each error case is one valid call with one or two arguments spoiled: the wrong type of the
main input (str, None, object, a list of str), wrong dtypes (int, bool, complex where it has
no meaning, float16 where the kernels take float32/float64 only, object arrays), wrong
ranks, shapes that do not match, out-of-range axes, invalid hyper-parameters, and arguments
whose dtypes do not match. The message must name the argument; dtype cases also name the
received dtype.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

import nnkit as nk
import nnkit.functional as F
from nnkit.kernels import reference as ref


class ErrorInput(NamedTuple):
    """One call that must be refused (torch's ``ErrorInput``, keyword arguments only)."""

    desc: str
    kwargs: Callable[[], dict]  # builds the call's keyword arguments
    error_type: type[Exception]
    error_regex: str  # re.search'ed in the message


def _f(*shape, dtype=np.float32):
    return np.random.default_rng(0).normal(size=shape).astype(dtype)


# One valid call per function: each error case spoils one or two of its arguments.
def _linear_attention_valid(name: str) -> dict:
    kw = {"q": _f(1, 2, 5, 3), "k": _f(1, 2, 5, 3), "v": _f(1, 2, 5, 4), "scale": None,
          "initial_state": _f(1, 2, 3, 4), "output_final_state": True, "mode": "chunk",
          "chunk_size": 2, "cu_seqlens": None}
    if name.startswith("gated"):
        kw["g"] = -np.abs(_f(1, 2, 5))
    if "delta" in name:
        kw["beta"] = np.abs(_f(1, 2, 5)) / 4
    if name == "linear_attention":
        kw.update(feature_map=None, normalize=False)
    return kw


_VALID: dict[str, Callable[[], dict]] = {
    "linear": lambda: {"x": _f(2, 4), "weight": _f(3, 4), "bias": _f(3)},
    "sigmoid": lambda: {"x": _f(2, 3)},
    "tanh": lambda: {"x": _f(2, 3)},
    "relu": lambda: {"x": _f(2, 3)},
    "gelu": lambda: {"x": _f(2, 3), "approximate": "none"},
    "softmax": lambda: {"x": _f(2, 3), "axis": -1},
    "log_softmax": lambda: {"x": _f(2, 3), "axis": -1},
    "cross_entropy": lambda: {"logits": _f(3, 4), "target": np.array([0, 3, 1]),
                              "ignore_index": -100, "reduction": "mean"},
    "mse_loss": lambda: {"pred": _f(2, 3), "target": _f(2, 3), "reduction": "mean"},
    "binary_cross_entropy_with_logits": lambda: {
        "logits": _f(2, 3), "target": np.ones((2, 3), np.float32),
        "weight": np.ones(3, np.float32), "pos_weight": np.ones(3, np.float32),
        "reduction": "mean"},
    "layer_norm": lambda: {"x": _f(2, 3), "normalized_shape": (3,), "weight": _f(3),
                           "bias": _f(3), "eps": 1e-5},
    "dropout": lambda: {"x": _f(2, 3), "p": 0.5, "training": True, "rng": 0},
    "embedding": lambda: {"ids": np.array([[0, 2], [1, 1]]), "weight": _f(4, 3)},
    "conv1d": lambda: {"x": _f(1, 2, 6), "weight": _f(3, 2, 3), "bias": _f(3), "stride": 1,
                       "padding": 0, "dilation": 1, "groups": 1},
    "conv2d": lambda: {"x": _f(1, 2, 5, 5), "weight": _f(3, 2, 3, 3), "bias": _f(3),
                       "stride": 1, "padding": 0, "dilation": 1, "groups": 1},
    "max_pool2d": lambda: {"x": _f(1, 2, 4, 4), "kernel_size": 2, "stride": None, "padding": 0,
                           "dilation": 1, "ceil_mode": False, "return_indices": False},
    "avg_pool2d": lambda: {"x": _f(1, 2, 4, 4), "kernel_size": 2, "stride": None, "padding": 0,
                           "ceil_mode": False, "count_include_pad": True,
                           "divisor_override": None},
    "linear_scan": lambda: {"a": _f(2, 5, 3), "b": _f(2, 5, 3), "h0": _f(2, 3),
                            "reverse": False},
    "log_linear_scan": lambda: {"log_a": -np.abs(_f(2, 5, 3)), "log_b": _f(2, 5, 3),
                                "log_h0": _f(2, 3)},
    "selective_scan": lambda: {
        "u": _f(2, 4, 5), "delta": _f(2, 4, 5), "A": -np.abs(_f(4, 3)), "B": _f(2, 2, 3, 5),
        "C": _f(2, 3, 5), "D": _f(4), "z": _f(2, 4, 5), "delta_bias": _f(4),
        "delta_softplus": True, "return_last_state": False, "cu_seqlens": None},
    **{name: (lambda name=name: _linear_attention_valid(name)) for name in (
        "linear_attention", "gated_linear_attention", "delta_rule", "gated_delta_rule")},
    "scaled_dot_product_attention": lambda: {
        "query": _f(1, 2, 4, 8), "key": _f(1, 2, 4, 8), "value": _f(1, 2, 4, 8),
        "attn_mask": None, "dropout_p": 0.0, "is_causal": False, "scale": None},
    "sinusoidal_positional_encoding": lambda: {"T": 4, "d": 6, "base": 10000.0,
                                               "dtype": np.float32},
}


# ----- building the cases --------------------------------------------------------------------
def _named(name: str) -> str:
    """A regex for a message that names the argument ``name``. A one-letter name other than
    x (a, b, d, p, T) must be the subject ("a must ...", "a and b ...", "p=...") so that the
    article 'a' or a shape letter does not count."""
    if len(name) == 1 and name != "x":
        return rf"\b{name}(?= must| has| and | or |=| of shape)"
    return rf"\b{re.escape(name)}\b"


def _all(*patterns: str) -> str:
    """A regex matching a message that holds every pattern, in any order."""
    return "(?s)" + "".join(f"(?=.*{p})" for p in patterns)


class _Cast(NamedTuple):
    """A spoiler: the valid value of the argument, cast to ``dtype``."""

    dtype: object


class _Reshape(NamedTuple):
    """A spoiler: the valid value of the argument, reshaped (or sliced) by ``fn``."""

    fn: Callable


def _spoil(base: dict, overrides: dict) -> dict:
    out = dict(base)
    for k, v in overrides.items():
        if isinstance(v, _Cast):
            v = np.asarray(base[k]).astype(v.dtype)
        elif isinstance(v, _Reshape):
            v = v.fn(np.asarray(base[k]))
        out[k] = v
    return out


def _case(fn_name: str, desc: str, error_type, regex: str, **overrides) -> ErrorInput:
    """_VALID[fn_name]'s call with ``overrides`` in place of its arguments."""
    return ErrorInput(desc, lambda: _spoil(_VALID[fn_name](), overrides), error_type, regex)


def _not_arrays(fn_name: str, arg: str) -> list[ErrorInput]:
    """``arg`` (an array argument) replaced by things that are not arrays of numbers."""
    return [
        _case(fn_name, f"{arg} str", TypeError, _named(arg), **{arg: "abc"}),
        _case(fn_name, f"{arg} None", TypeError, _named(arg), **{arg: None}),
        _case(fn_name, f"{arg} object", TypeError, _named(arg), **{arg: object()}),
        _case(fn_name, f"{arg} list of str", TypeError, _named(arg), **{arg: ["a", "b"]}),
        _case(fn_name, f"{arg} object array", TypeError, _all(_named(arg), "object"),
              **{arg: _Cast(object)}),
    ]


def _bad_dtypes(fn_name: str, arg: str, *, complex_ok=False, half_ok=True) -> list[ErrorInput]:
    """``arg`` (a floating-point array argument) cast to the dtypes it must refuse."""
    dtypes = [np.int64, np.bool_]
    if not complex_ok:
        dtypes.append(np.complex128)
    if not half_ok:
        dtypes.append(np.float16)
    return [_case(fn_name, f"{arg} {np.dtype(d).name}", TypeError,
                  _all(_named(arg), np.dtype(d).name), **{arg: _Cast(d)}) for d in dtypes]


def _hostile(fn_name: str, arg: str, **dtype_options) -> list[ErrorInput]:
    return _not_arrays(fn_name, arg) + _bad_dtypes(fn_name, arg, **dtype_options)


def _scalar_cases(fn_name: str, arg: str, *, type_errors=(), value_errors=()) -> list:
    """Hyper-parameter ``arg`` set to each value of ``type_errors`` (TypeError) and of
    ``value_errors`` (ValueError); the message names ``arg``."""
    return ([_case(fn_name, f"{arg}={v!r}", TypeError, _named(arg), **{arg: v})
             for v in type_errors]
            + [_case(fn_name, f"{arg}={v!r}", ValueError, _named(arg), **{arg: v})
               for v in value_errors])


NAN, INF = float("nan"), float("inf")


def _elementwise(name: str, *, complex_ok: bool) -> list[ErrorInput]:
    return _hostile(name, "x", complex_ok=complex_ok) + [
        _case(name, "x ragged list", TypeError, _named("x"), x=[[1.0], [1.0, 2.0]]),
    ]


def _softmax_like(name: str) -> list[ErrorInput]:
    return _hostile(name, "x", half_ok=False) + [
        _case(name, "x 0-d", ValueError, _all(_named("x"), "dim"), x=np.float32(1.0)),
        _case(name, "axis 2 of 2-d", ValueError, _all(_named("axis"), "2"), axis=2),
        _case(name, "axis -3 of 2-d", ValueError, _all(_named("axis"), "-3"), axis=-3),
        _case(name, "axis and dim both", TypeError, _all(_named("axis"), _named("dim")),
              axis=0, dim=1),
    ] + _scalar_cases(name, "axis", type_errors=[1.5, True, "1", (0, 1)]) \
      + _scalar_cases(name, "dim", type_errors=[1.5, True, "1"])


def _conv(name: str, nd: int) -> list[ErrorInput]:
    spatial = (6,) if nd == 1 else (5, 5)
    kernel = (3,) if nd == 1 else (3, 3)
    pair = (1,) * nd
    return _hostile(name, "x", half_ok=False) + _bad_dtypes(name, "weight", half_ok=False) + [
        _case(name, "x one rank short of unbatched", ValueError, _named("x"),
              x=_f(2, *spatial)[0]),
        _case(name, "x one rank too many", ValueError, _named("x"), x=_f(1, 1, 2, *spatial)),
        _case(name, "weight rank", ValueError, _named("weight"), weight=_f(3, 2)),
        _case(name, "channel mismatch", ValueError, _all(_named("x"), _named("weight")),
              weight=_f(3, 4, *kernel)),
        _case(name, "weight empty kernel", ValueError, _named("weight"),
              weight=_f(3, 2, *(0,) * nd)),
        _case(name, "kernel larger than x", ValueError, _named("x"), x=_f(1, 2, *(2,) * nd)),
        _case(name, "x empty spatial", ValueError, _named("x"), x=_f(1, 2, *(0,) * nd)),
        _case(name, "weight float64, x float32", TypeError,
              _all(_named("weight"), _named("x"), "float64"), weight=_Cast(np.float64)),
        _case(name, "bias float64, x float32", TypeError, _all(_named("bias"), "float64"),
              bias=_Cast(np.float64)),
        _case(name, "bias shape", ValueError, _all(_named("bias"), r"\(4,\)"), bias=_f(4)),
        _case(name, "bias 2-d", ValueError, _named("bias"), bias=_f(3, 1)),
        _case(name, "bias complex", TypeError, _all(_named("bias"), "complex"),
              bias=_Cast(np.complex64)),
        _case(name, "bias str", TypeError, _named("bias"), bias="abc"),
        _case(name, "stride tuple of the wrong length", TypeError, _named("stride"),
              stride=pair + (1,)),
        _case(name, "padding 'full'", ValueError, _named("padding"), padding="full"),
        _case(name, "padding 'same' with stride 2", ValueError,
              _all(_named("padding"), _named("stride")), padding="same", stride=2),
        _case(name, "groups not dividing C", ValueError, _named("groups"), groups=3),
    ] + _scalar_cases(name, "stride", type_errors=[1.5, True, None, "1"],
                      value_errors=[0, -1]) \
      + _scalar_cases(name, "padding", type_errors=[0.5, True, None], value_errors=[-1]) \
      + _scalar_cases(name, "dilation", type_errors=[1.0, False], value_errors=[0, -2]) \
      + _scalar_cases(name, "groups", type_errors=[1.0, True, None, "1"],
                      value_errors=[0, -1])


def _pool(name: str) -> list[ErrorInput]:
    cases = _hostile(name, "x", half_ok=False) + [
        _case(name, "x 2-d", ValueError, _named("x"), x=_f(4, 4)),
        _case(name, "x 5-d", ValueError, _named("x"), x=_f(1, 1, 2, 4, 4)),
        _case(name, "kernel larger than x", ValueError,
              _all(_named("x"), _named("kernel_size")), kernel_size=5),
        _case(name, "x H=0", ValueError, _named("x"), x=_f(1, 2, 0, 4)),
        _case(name, "x H=0, ceil_mode", ValueError, _named("x"), x=_f(1, 2, 0, 4),
              ceil_mode=True),
        _case(name, "kernel_size of 3 ints", TypeError, _named("kernel_size"),
              kernel_size=(2, 2, 2)),
        _case(name, "padding more than half the kernel", ValueError,
              _all(_named("padding"), _named("kernel_size")), padding=2),
    ]
    return (cases
            + _scalar_cases(name, "kernel_size", type_errors=[2.0, True, None, "2"],
                            value_errors=[0, -1])
            + _scalar_cases(name, "stride", type_errors=[1.5, True, "1"],
                            value_errors=[0, -1])
            + _scalar_cases(name, "padding", type_errors=[0.5, None], value_errors=[-1])
            + _scalar_cases(name, "ceil_mode", type_errors=["yes", 1, None]))


# ----- the table -----------------------------------------------------------------------------
def _linear_attention_errors(name: str) -> list[ErrorInput]:
    cases = _hostile(name, "q", half_ok=False) + [
        *_not_arrays(name, "k"),
        _case(name, "q 3-d", ValueError, _named("q"), q=_f(2, 5, 3)),
        _case(name, "k shape", ValueError, _all(_named("k"), r"\(1, 2, 5, 3\)"),
              k=_f(1, 2, 4, 3)),
        _case(name, "k float64", TypeError, _all(_named("k"), "float64"), k=_Cast(np.float64)),
        _case(name, "v heads", ValueError, _named("v"), v=_f(1, 1, 5, 4)),
        _case(name, "v int", TypeError, _all(_named("v"), "int64"), v=_Cast(np.int64)),
        _case(name, "initial_state shape", ValueError, _named("initial_state"),
              initial_state=_f(1, 2, 4, 3)),
        _case(name, "initial_state float64", TypeError,
              _all(_named("initial_state"), "float64"), initial_state=_Cast(np.float64)),
        _case(name, "mode", ValueError, _named("mode"), mode="parallel"),
        _case(name, "cu_seqlens float", TypeError, _all(_named("cu_seqlens"), "float64"),
              cu_seqlens=np.array([0.0, 5.0]), initial_state=None),
        _case(name, "cu_seqlens past T", ValueError, _named("cu_seqlens"),
              cu_seqlens=np.array([0, 2, 7]), initial_state=None),
        _case(name, "cu_seqlens str", TypeError, _named("cu_seqlens"), cu_seqlens="0,5",
              initial_state=None),
    ] + _scalar_cases(name, "chunk_size", type_errors=[1.5, True, "2"], value_errors=[0, -3]) \
      + _scalar_cases(name, "scale", type_errors=["1", True], value_errors=[NAN, INF]) \
      + _scalar_cases(name, "output_final_state", type_errors=["yes", 1])
    if name.startswith("gated"):
        cases += [_case(name, "g shape", ValueError, _named("g"), g=_f(1, 2, 4)),
                  _case(name, "g complex", TypeError, _all(_named("g"), "complex128"),
                        g=_Cast(np.complex128))]
    if "delta" in name:
        cases += [_case(name, "beta shape", ValueError, _named("beta"), beta=_f(1, 2, 5, 1)),
                  _case(name, "beta str", TypeError, _named("beta"), beta="abc")]
    if name == "gated_delta_rule":
        cases.append(_case(name, "g per key", ValueError, _named("g"), g=_f(1, 2, 5, 3)))
    if name == "linear_attention":
        cases += [_case(name, "feature_map", ValueError, _named("feature_map"),
                        feature_map="tanh"),
                  _case(name, "normalize with a state", ValueError, _named("initial_state"),
                        normalize=True)]
        cases += _scalar_cases(name, "normalize", type_errors=["yes", 1])
    return cases


_ERROR_INPUTS: dict[str, list[ErrorInput]] = {
    "linear": _hostile("linear", "x", complex_ok=True) + [
        _case("linear", "weight str", TypeError, _named("weight"), weight="abc"),
        _case("linear", "weight int64", TypeError, _all(_named("weight"), "int64"),
              weight=_Cast(np.int64)),
        _case("linear", "weight float64, x float32", TypeError,
              _all(_named("weight"), _named("x"), "float64"), weight=_Cast(np.float64)),
        _case("linear", "x complex, weight float32", TypeError,
              _all(_named("weight"), _named("x"), "complex"), x=_Cast(np.complex64)),
        _case("linear", "x big-endian float64, weight float32", TypeError,  # read as native
              _all(_named("x"), "float64", "float32"), x=_Cast(">f8")),
        _case("linear", "bias float64", TypeError, _all(_named("bias"), "float64"),
              bias=_Cast(np.float64)),
        _case("linear", "bias str", TypeError, _named("bias"), bias="abc"),
        _case("linear", "weight 1-d", ValueError, _named("weight"), weight=_f(4)),
        _case("linear", "weight 3-d", ValueError, _named("weight"), weight=_f(3, 4, 1)),
        _case("linear", "x 0-d", ValueError, _named("x"), x=np.float32(1.0)),
        _case("linear", "x features != in_features", ValueError,
              _all(_named("x"), "in_features"), x=_f(2, 5)),
        _case("linear", "bias shape", ValueError, _all(_named("bias"), r"\(4,\)"), bias=_f(4)),
        _case("linear", "bias 2-d", ValueError, _named("bias"), bias=_f(1, 3)),
    ],
    "sigmoid": _elementwise("sigmoid", complex_ok=True),
    "tanh": _elementwise("tanh", complex_ok=True),
    "relu": _elementwise("relu", complex_ok=False),
    "gelu": _elementwise("gelu", complex_ok=False) + [
        _case("gelu", "complex x, tanh", TypeError, _named("x"), x=_Cast(np.complex128),
              approximate="tanh"),
        _case("gelu", "approximate 'erf'", ValueError, _named("approximate"),
              approximate="erf"),
        _case("gelu", "approximate 'Tanh'", ValueError, _named("approximate"),
              approximate="Tanh"),
        _case("gelu", "approximate None", TypeError, _named("approximate"), approximate=None),
    ],
    "softmax": _softmax_like("softmax"),
    "log_softmax": _softmax_like("log_softmax"),
    "cross_entropy": _hostile("cross_entropy", "logits", half_ok=False) + [
        _case("cross_entropy", "logits 1-d", ValueError, _named("logits"), logits=_f(4)),
        _case("cross_entropy", "logits 3-d", ValueError, _named("logits"), logits=_f(3, 4, 1)),
        _case("cross_entropy", "target float", TypeError, _all(_named("target"), "float"),
              target=_Cast(np.float32)),
        _case("cross_entropy", "target bool", TypeError, _all(_named("target"), "bool"),
              target=np.array([True, False, True])),
        _case("cross_entropy", "target str", TypeError, _named("target"), target="abc"),
        _case("cross_entropy", "target None", TypeError, _named("target"), target=None),
        _case("cross_entropy", "target 2-d", ValueError, _named("target"),
              target=np.array([[0], [3], [1]])),
        _case("cross_entropy", "target length", ValueError, _named("target"),
              target=np.array([0, 1])),
        _case("cross_entropy", "target class C", ValueError, _named("target"),
              target=np.array([0, 4, 1])),
        _case("cross_entropy", "target class -1", ValueError, _named("target"),
              target=np.array([0, -1, 1])),
        _case("cross_entropy", "target class C, reduction none", ValueError, _named("target"),
              target=np.array([0, 4, 1]), reduction="none"),
        _case("cross_entropy", "logits with C=0", ValueError, _named("target"),
              logits=_f(3, 0)),
        _case("cross_entropy", "reduction 'avg'", ValueError, _named("reduction"),
              reduction="avg"),
        _case("cross_entropy", "reduction 'MEAN'", ValueError, _named("reduction"),
              reduction="MEAN"),
    ] + _scalar_cases("cross_entropy", "ignore_index", type_errors=[0.5, True, "0", None],
                      value_errors=[2**70]),
    "mse_loss": _hostile("mse_loss", "pred") + [
        _case("mse_loss", "target str", TypeError, _named("target"), target="abc"),
        _case("mse_loss", "target None", TypeError, _named("target"), target=None),
        _case("mse_loss", "target complex", TypeError, _all(_named("target"), "complex"),
              target=_Cast(np.complex128)),
        _case("mse_loss", "target object array", TypeError, _named("target"),
              target=_Cast(object)),
        _case("mse_loss", "shapes do not broadcast", ValueError,
              _all(_named("pred"), _named("target"), r"\(4,\)"), target=_f(4)),
        _case("mse_loss", "reduction 'avg'", ValueError, _named("reduction"), reduction="avg"),
        _case("mse_loss", "reduction None", TypeError, _named("reduction"), reduction=None),
    ],
    "binary_cross_entropy_with_logits":
        _hostile("binary_cross_entropy_with_logits", "logits") + [
        _case("binary_cross_entropy_with_logits", "target shape", ValueError,
              _all(_named("target"), r"\(3, 2\)"), target=np.ones((3, 2), np.float32)),
        _case("binary_cross_entropy_with_logits", "target str", TypeError, _named("target"),
              target="abc"),
        _case("binary_cross_entropy_with_logits", "target None", TypeError,
              _named("target"), target=None),
        _case("binary_cross_entropy_with_logits", "target complex", TypeError,
              _named("target"), target=_Cast(np.complex128)),
        _case("binary_cross_entropy_with_logits", "target object array", TypeError,
              _named("target"), target=_Cast(object)),
        _case("binary_cross_entropy_with_logits", "weight does not broadcast", ValueError,
              _all(_named("weight"), r"\(4,\)"), weight=np.ones(4, np.float32)),
        _case("binary_cross_entropy_with_logits", "weight str", TypeError, _named("weight"),
              weight="abc"),
        _case("binary_cross_entropy_with_logits", "weight complex", TypeError,
              _named("weight"), weight=_Cast(np.complex128)),
        _case("binary_cross_entropy_with_logits", "pos_weight does not broadcast",
              ValueError, _all(_named("pos_weight"), r"\(4,\)"),
              pos_weight=np.ones(4, np.float32)),
        _case("binary_cross_entropy_with_logits", "pos_weight str", TypeError,
              _named("pos_weight"), pos_weight="abc"),
        _case("binary_cross_entropy_with_logits", "reduction 'avg'", ValueError,
              _named("reduction"), reduction="avg"),
    ],
    "layer_norm": _hostile("layer_norm", "x", half_ok=False) + [
        _case("layer_norm", "normalized_shape is not x's trailing shape", ValueError,
              _all(_named("normalized_shape"), _named("x")), normalized_shape=(4,),
              weight=None, bias=None),
        _case("layer_norm", "normalized_shape longer than x's rank", ValueError,
              _named("normalized_shape"), normalized_shape=(1, 2, 3), weight=None, bias=None),
        _case("layer_norm", "normalized_shape ()", ValueError, _named("normalized_shape"),
              normalized_shape=()),
        _case("layer_norm", "normalized_shape -3", ValueError, _named("normalized_shape"),
              normalized_shape=-3),
        _case("layer_norm", "normalized_shape 3.0", TypeError, _named("normalized_shape"),
              normalized_shape=3.0),
        _case("layer_norm", "normalized_shape (3.0,)", TypeError, _named("normalized_shape"),
              normalized_shape=(3.0,)),
        _case("layer_norm", "normalized_shape '3'", TypeError, _named("normalized_shape"),
              normalized_shape="3"),
        _case("layer_norm", "normalized_shape True", TypeError, _named("normalized_shape"),
              normalized_shape=True),
        _case("layer_norm", "weight shape", ValueError, _all(_named("weight"), r"\(4,\)"),
              weight=_f(4)),
        _case("layer_norm", "weight float64, x float32", TypeError,
              _all(_named("weight"), "float64"), weight=_Cast(np.float64)),
        _case("layer_norm", "weight complex", TypeError, _all(_named("weight"), "complex"),
              weight=_Cast(np.complex128)),
        _case("layer_norm", "weight str", TypeError, _named("weight"), weight="abc"),
        _case("layer_norm", "bias shape", ValueError, _all(_named("bias"), r"\(4,\)"),
              bias=_f(4)),
        _case("layer_norm", "bias int64", TypeError, _all(_named("bias"), "int64"),
              bias=_Cast(np.int64)),
    ] + _scalar_cases("layer_norm", "eps", type_errors=[True, "1e-5", None],
                      value_errors=[0.0, -1e-5, NAN, INF]),
    "dropout": _hostile("dropout", "x") + [
        _case("dropout", "rng str", TypeError, _named("rng"), rng="seed"),
        _case("dropout", "rng -1", ValueError, _named("rng"), rng=-1),
    ] + _scalar_cases("dropout", "p", type_errors=[True, "0.5", None],
                      value_errors=[-0.1, 1.5, NAN, INF])
      + _scalar_cases("dropout", "training", type_errors=["yes", 1, None]),
    "embedding": _not_arrays("embedding", "ids") + _not_arrays("embedding", "weight") + [
        _case("embedding", "ids float", TypeError, _all(_named("ids"), "float"),
              ids=_Cast(np.float64)),
        _case("embedding", "ids bool", TypeError, _all(_named("ids"), "bool"),
              ids=_Cast(np.bool_)),
        _case("embedding", "ids complex", TypeError, _all(_named("ids"), "complex"),
              ids=_Cast(np.complex128)),
        _case("embedding", "ids = num_embeddings", ValueError, _named("ids"),
              ids=np.array([0, 4])),
        _case("embedding", "ids -1", ValueError, _named("ids"), ids=np.array([0, -1])),
        _case("embedding", "weight int64", TypeError, _all(_named("weight"), "int64"),
              weight=_Cast(np.int64)),
        _case("embedding", "weight bool", TypeError, _all(_named("weight"), "bool"),
              weight=_Cast(np.bool_)),
        _case("embedding", "weight 1-d", ValueError, _named("weight"), weight=_f(4)),
        _case("embedding", "weight 3-d", ValueError, _named("weight"), weight=_f(4, 3, 1)),
        _case("embedding", "weight with no rows", ValueError, _named("ids"), weight=_f(0, 3)),
        _case("embedding", "weight 0-d", ValueError, _named("weight"), weight=np.float32(1)),
    ],
    "conv1d": _conv("conv1d", 1),
    "conv2d": _conv("conv2d", 2) + [
        _case("conv2d", "stride (1, 0)", ValueError, _named("stride"), stride=(1, 0)),
        _case("conv2d", "padding (1, -1)", ValueError, _named("padding"), padding=(1, -1)),
        _case("conv2d", "dilation 2**40", ValueError, _named("dilation"), dilation=2**40),
    ],
    "max_pool2d": _pool("max_pool2d") + [
        _case("max_pool2d", "dilation 0", ValueError, _named("dilation"),
              dilation=0),
        _case("max_pool2d", "dilation 1.0", TypeError, _named("dilation"), dilation=1.0),
        _case("max_pool2d", "return_indices 1", TypeError, _named("return_indices"),
              return_indices=1),
        _case("max_pool2d", "return_indices 'yes'", TypeError, _named("return_indices"),
              return_indices="yes"),
    ],
    "avg_pool2d": _pool("avg_pool2d")
        + _scalar_cases("avg_pool2d", "count_include_pad", type_errors=["no", 0, None])
        + _scalar_cases("avg_pool2d", "divisor_override", type_errors=[1.5, True, "2"],
                        value_errors=[0, 2**63, -(2**70)]),
    "linear_scan": _hostile("linear_scan", "a", complex_ok=True, half_ok=False) + [
        _case("linear_scan", "b str", TypeError, _named("b"), b="abc"),
        _case("linear_scan", "b bool", TypeError, _all(_named("b"), "bool"), b=_Cast(np.bool_)),
        _case("linear_scan", "a 2-d", ValueError, _named("a"), a=_f(5, 3), b=_f(5, 3),
              h0=None),
        _case("linear_scan", "a 4-d", ValueError, _named("a"), a=_f(1, 2, 5, 3),
              b=_f(1, 2, 5, 3), h0=None),
        _case("linear_scan", "a and b shapes", ValueError,
              _all(_named("a"), _named("b"), r"\(2, 4, 3\)"), b=_f(2, 4, 3)),
        _case("linear_scan", "b float64, a float32", TypeError,
              _all(_named("a"), _named("b"), "float64"), b=_Cast(np.float64)),
        _case("linear_scan", "b complex64, a float32", TypeError,
              _all(_named("a"), _named("b"), "complex64"), b=_Cast(np.complex64)),
        _case("linear_scan", "h0 shape", ValueError, _all(_named("h0"), r"\(2, 4\)"),
              h0=_f(2, 4)),
        _case("linear_scan", "h0 3-d", ValueError, _named("h0"), h0=_f(2, 1, 3)),
        _case("linear_scan", "h0 float64", TypeError, _all(_named("h0"), "float64"),
              h0=_Cast(np.float64)),
        _case("linear_scan", "h0 complex64, a float32", TypeError,
              _all(_named("h0"), "complex64"), h0=_Cast(np.complex64)),
        _case("linear_scan", "h0 str", TypeError, _named("h0"), h0="abc"),
    ] + _scalar_cases("linear_scan", "reverse", type_errors=["yes", 1, None]),
    **{name: _linear_attention_errors(name) for name in (
        "linear_attention", "gated_linear_attention", "delta_rule", "gated_delta_rule")},
    "selective_scan": _hostile("selective_scan", "u", half_ok=False) + [
        *_not_arrays("selective_scan", "A"),
        _case("selective_scan", "delta str", TypeError, _named("delta"), delta="abc"),
        _case("selective_scan", "u 2-d", ValueError, _named("u"), u=_f(4, 5)),
        _case("selective_scan", "delta shape", ValueError, _all(_named("delta"), r"\(2, 4, 5\)"),
              delta=_f(2, 4, 6)),
        _case("selective_scan", "delta float64, u float32", TypeError,
              _all(_named("delta"), "float64"), delta=_Cast(np.float64)),
        _case("selective_scan", "A complex", TypeError, _all(_named("A"), "complex"),
              A=_Cast(np.complex64)),
        _case("selective_scan", "A rows", ValueError, _named("A"), A=_f(3, 3)),
        _case("selective_scan", "B groups", ValueError, _all(_named("B"), "3 groups"),
              B=_f(2, 3, 3, 5)),
        _case("selective_scan", "B state size", ValueError, _named("B"), B=_f(2, 2, 4, 5)),
        _case("selective_scan", "C 5-d", ValueError, _named("C"), C=_f(2, 1, 3, 5, 1)),
        _case("selective_scan", "C time-invariant shape", ValueError, _named("C"), C=_f(4, 2)),
        _case("selective_scan", "C float64", TypeError, _all(_named("C"), "float64"),
              C=_Cast(np.float64)),
        _case("selective_scan", "D shape", ValueError, _named("D"), D=_f(3)),
        _case("selective_scan", "z shape", ValueError, _named("z"), z=_f(2, 4, 4)),
        _case("selective_scan", "z int", TypeError, _all(_named("z"), "int64"),
              z=_Cast(np.int64)),
        _case("selective_scan", "delta_bias 2-d", ValueError, _named("delta_bias"),
              delta_bias=_f(4, 1)),
    ] + _scalar_cases("selective_scan", "delta_softplus", type_errors=["yes", 1, None])
      + _scalar_cases("selective_scan", "return_last_state", type_errors=["no", 0]) + [
        _case("selective_scan", "cu_seqlens with batch 2", ValueError, _named("u"),
              cu_seqlens=np.array([0, 5])),
        _case("selective_scan", "cu_seqlens float", TypeError,
              _all(_named("cu_seqlens"), "float64"), cu_seqlens=np.array([0.0, 5.0]),
              u=_f(1, 4, 5), delta=_f(1, 4, 5), B=_f(1, 2, 3, 5), C=_f(1, 3, 5), z=_f(1, 4, 5))],
    "log_linear_scan": _hostile("log_linear_scan", "log_a", half_ok=False) + [
        _case("log_linear_scan", "log_b str", TypeError, _named("log_b"), log_b="abc"),
        _case("log_linear_scan", "log_b complex", TypeError,
              _all(_named("log_b"), "complex"), log_b=_Cast(np.complex64)),
        _case("log_linear_scan", "log_a 2-d", ValueError, _named("log_a"), log_a=_f(5, 3),
              log_b=_f(5, 3), log_h0=None),
        _case("log_linear_scan", "log_a and log_b shapes", ValueError,
              _all(_named("log_a"), _named("log_b"), r"\(2, 4, 3\)"), log_b=_f(2, 4, 3)),
        _case("log_linear_scan", "log_b float64, log_a float32", TypeError,
              _all(_named("log_a"), _named("log_b"), "float64"), log_b=_Cast(np.float64)),
        _case("log_linear_scan", "log_h0 shape", ValueError,
              _all(_named("log_h0"), r"\(2, 4\)"), log_h0=_f(2, 4)),
        _case("log_linear_scan", "log_h0 float64", TypeError,
              _all(_named("log_h0"), "float64"), log_h0=_Cast(np.float64)),
        _case("log_linear_scan", "log_h0 str", TypeError, _named("log_h0"), log_h0="abc"),
    ],
    "scaled_dot_product_attention":
        _hostile("scaled_dot_product_attention", "query", half_ok=False) + [
        _case("scaled_dot_product_attention", "key str", TypeError, _named("key"),
              key="abc"),
        _case("scaled_dot_product_attention", "value int64", TypeError,
              _all(_named("value"), "int64"), value=_Cast(np.int64)),
        _case("scaled_dot_product_attention", "query 1-d", ValueError, _named("query"),
              query=_f(8)),
        _case("scaled_dot_product_attention", "query and key E", ValueError,
              _all(_named("query"), _named("key")), key=_f(1, 2, 4, 6)),
        _case("scaled_dot_product_attention", "key and value S", ValueError,
              _all(_named("key"), _named("value")), value=_f(1, 2, 5, 8)),
        _case("scaled_dot_product_attention", "batch dims", ValueError,
              _all(_named("query"), _named("key")), key=_f(1, 3, 4, 8), value=_f(1, 3, 4, 8)),
        _case("scaled_dot_product_attention", "key float64, query float32", TypeError,
              _all(_named("key"), "float64"), key=_Cast(np.float64)),
        _case("scaled_dot_product_attention", "attn_mask shape", ValueError,
              _all(_named("attn_mask"), r"\(3, 3\)"), attn_mask=np.ones((3, 3), bool)),
        _case("scaled_dot_product_attention", "attn_mask int64", TypeError,
              _all(_named("attn_mask"), "int64"), attn_mask=np.ones((4, 4), np.int64)),
        _case("scaled_dot_product_attention", "attn_mask float64, query float32", TypeError,
              _all(_named("attn_mask"), "float64"), attn_mask=np.zeros((4, 4))),
        _case("scaled_dot_product_attention", "attn_mask str", TypeError,
              _named("attn_mask"), attn_mask="abc"),
    ] + _scalar_cases("scaled_dot_product_attention", "dropout_p",
                      type_errors=[True, "0.1", None],
                      value_errors=[-0.1, 1.0, 1.5, NAN])
      + _scalar_cases("scaled_dot_product_attention", "is_causal",
                      type_errors=["yes", 1, None])
      + _scalar_cases("scaled_dot_product_attention", "scale", type_errors=[True, "0.5"],
                      value_errors=[NAN, INF]),
    "sinusoidal_positional_encoding":
        _scalar_cases("sinusoidal_positional_encoding", "T", type_errors=[2.5, True, "4", None],
                      value_errors=[-1])
        + _scalar_cases("sinusoidal_positional_encoding", "d", type_errors=[2.0, False, None],
                        value_errors=[-2])
        + _scalar_cases("sinusoidal_positional_encoding", "base", type_errors=[True, "1e4"],
                        value_errors=[0.0, -10.0, NAN, INF])
        + _scalar_cases("sinusoidal_positional_encoding", "dtype",
                        type_errors=[np.int32, np.float16, np.complex128, bool, "foo"]),
}



# ----- sample inputs (Tensors that require grad, so that backward runs too) -------------------
def _t(*shape, dtype=np.float32):
    return nk.tensor(_f(*shape, dtype=dtype), requires_grad=True)


def _linear_attention_sample(name: str, T: int, initial: bool, chunk: int):
    def sample():
        kw = {"q": _t(1, 2, T, 3), "k": _t(1, 2, T, 3), "v": _t(1, 2, T, 2), "scale": None,
              "initial_state": _t(1, 2, 3, 2) if initial else None,
              "output_final_state": True, "mode": "chunk", "chunk_size": chunk}
        kw["k"].data[...] /= 4  # small keys: the delta rule stays stable
        if name.startswith("gated"):
            kw["g"] = _t(1, 2, T)
            kw["g"].data[...] = -np.abs(kw["g"].data)
        if "delta" in name:
            kw["beta"] = _t(1, 2, T)
            kw["beta"].data[...] = np.abs(kw["beta"].data) / 4
        return kw
    return sample


_SAMPLES: dict[str, tuple[Callable[[], dict], ...]] = {
    "linear": (lambda: {"x": _t(2, 4), "weight": _t(3, 4), "bias": _t(3)},),
    "sigmoid": (lambda: {"x": _t(2, 3)},),
    "tanh": (lambda: {"x": _t(2, 3)},),
    "relu": (lambda: {"x": _t(2, 3)},),
    "gelu": (lambda: {"x": _t(2, 3), "approximate": "tanh"},
             lambda: {"x": _t(2, 3), "approximate": "none"}),
    "softmax": (lambda: {"x": _t(2, 3), "axis": -1},),
    "log_softmax": (lambda: {"x": _t(2, 3), "axis": 0},),
    "cross_entropy": (lambda: {"logits": _t(3, 4), "target": np.array([0, 3, 1]),
                               "ignore_index": -100, "reduction": "mean"},),
    "mse_loss": (lambda: {"pred": _t(2, 3), "target": np.ones((2, 3)), "reduction": "mean"},),
    "binary_cross_entropy_with_logits": (
        lambda: {"logits": _t(2, 3), "target": np.ones((2, 3), np.float32),
                 "weight": np.ones(3, np.float32), "pos_weight": np.ones(3, np.float32),
                 "reduction": "sum"},),
    "layer_norm": (lambda: {"x": _t(2, 3), "normalized_shape": (3,), "weight": _t(3),
                            "bias": _t(3), "eps": 1e-5},),
    "dropout": (lambda: {"x": _t(2, 3), "p": 0.5, "training": True, "rng": 0},),
    "embedding": (lambda: {"ids": np.array([[0, 2], [1, 1]]), "weight": _t(4, 3)},),
    "conv1d": (lambda: {"x": _t(1, 2, 6), "weight": _t(3, 2, 3), "bias": _t(3), "stride": 1,
                        "padding": 1, "dilation": 1, "groups": 1},),
    "conv2d": (lambda: {"x": _t(1, 2, 5, 5), "weight": _t(3, 2, 3, 3), "bias": _t(3),
                        "stride": 1, "padding": 1, "dilation": 1, "groups": 1},),
    "max_pool2d": (lambda: {"x": _t(1, 2, 4, 4), "kernel_size": 2, "stride": 2, "padding": 0,
                            "dilation": 1, "ceil_mode": False, "return_indices": False},),
    "avg_pool2d": (lambda: {"x": _t(1, 2, 4, 4), "kernel_size": 2, "stride": None,
                            "padding": 0, "ceil_mode": False, "count_include_pad": True,
                            "divisor_override": None},),
    "linear_scan": (lambda: {"a": _t(2, 5, 3), "b": _t(2, 5, 3), "h0": _t(2, 3),
                             "reverse": False},),
    "log_linear_scan": (lambda: {"log_a": _t(2, 5, 3), "log_b": _t(2, 5, 3),
                                 "log_h0": _t(2, 3)},),
    "selective_scan": (
        lambda: {"u": _t(2, 4, 5), "delta": _t(2, 4, 5), "A": _t(4, 3), "B": _t(2, 2, 3, 5),
                 "C": _t(2, 3, 5), "D": _t(4), "z": _t(2, 4, 5), "delta_bias": _t(4),
                 "delta_softplus": True, "return_last_state": False},
        lambda: {"u": _t(1, 2, 70), "delta": _t(1, 2, 70), "A": _t(2, 2), "B": _t(2, 2),
                 "C": _t(1, 1, 2, 70), "D": None, "z": None, "delta_bias": None,
                 "delta_softplus": True, "return_last_state": False}),
    **{name: tuple(_linear_attention_sample(name, T, initial, chunk)
                   for T, initial, chunk in ((5, True, 2), (70, False, 64)))
       for name in ("linear_attention", "gated_linear_attention", "delta_rule",
                    "gated_delta_rule")},
    "scaled_dot_product_attention": (
        lambda: {"query": _t(1, 2, 4, 8), "key": _t(1, 2, 4, 8), "value": _t(1, 2, 4, 8),
                 "attn_mask": np.tril(np.ones((4, 4), bool)), "dropout_p": 0.0,
                 "is_causal": False, "scale": None},),
    "sinusoidal_positional_encoding": (
        lambda: {"T": 4, "d": 6, "base": 10000.0, "dtype": np.float32},),
}


# ----- reference twins ----------------------------------------------------------------------
# (forward twin, backward twin). None where the op has no naive twin: linear, sigmoid, tanh,
# relu, mse_loss and binary_cross_entropy_with_logits are NumPy one-liners checked against
# torch; dropout's twin is its mask (reference.dropout_mask), embedding a row gather, and
# sinusoidal_positional_encoding has no gradient and is checked against its formula.
_TWINS: dict[str, tuple[Callable | None, Callable | None]] = {
    "gelu": (ref.gelu_forward, ref.gelu_backward),
    "softmax": (ref.softmax_forward, ref.softmax_backward),
    "log_softmax": (ref.log_softmax_forward, ref.log_softmax_backward),
    "cross_entropy": (ref.cross_entropy_forward, ref.cross_entropy_backward),
    "layer_norm": (ref.layer_norm_forward, ref.layer_norm_backward),
    "conv1d": (ref.conv1d_forward, ref.conv1d_backward),
    "conv2d": (ref.conv2d_forward, ref.conv2d_backward),
    "max_pool2d": (ref.max_pool2d_forward, ref.max_pool2d_backward),
    "avg_pool2d": (ref.avg_pool2d_forward, ref.avg_pool2d_backward),
    "linear_scan": (ref.linear_scan_forward, ref.linear_scan_backward),
    "log_linear_scan": (ref.log_linear_scan_forward, ref.log_linear_scan_backward),
    "scaled_dot_product_attention": (ref.attention_forward, ref.attention_backward),
    "selective_scan": (ref.selective_scan_forward, ref.selective_scan_backward),
    "linear_attention": (ref.linear_attention_forward, ref.linear_attention_backward),
    "gated_linear_attention": (ref.gated_linear_attention_forward,
                               ref.gated_linear_attention_backward),
    "delta_rule": (ref.delta_rule_forward, ref.delta_rule_backward),
    "gated_delta_rule": (ref.gated_delta_rule_forward, ref.gated_delta_rule_backward),
}


# ----- dtypes per device --------------------------------------------------------------------
# The dtypes an op computes in and returns (test_functional_error_inputs.py checks both ways):
# complex where it has a meaning (linear, sigmoid, tanh, linear_scan, embedding's weight);
# float16 is refused by the compiled kernels and, where the op is plain NumPy, accepted but
# not kept, so it is listed nowhere. The GPU kernels take float32/float64, except that
# log_linear_scan has no CUDA kernel (it refuses GPU arrays, test_validation.py) and
# sinusoidal_positional_encoding takes no array (it makes a NumPy one of its ``dtype``).
_REAL = (np.float32, np.float64)
_COMPLEX = (np.complex64, np.complex128)
_CPU_DTYPES: dict[str, tuple] = {
    "linear": _REAL + _COMPLEX, "sigmoid": _REAL + _COMPLEX, "tanh": _REAL + _COMPLEX,
    "relu": _REAL, "gelu": _REAL, "softmax": _REAL, "log_softmax": _REAL,
    "cross_entropy": _REAL, "mse_loss": _REAL, "binary_cross_entropy_with_logits": _REAL,
    "layer_norm": _REAL, "dropout": _REAL, "embedding": _REAL + _COMPLEX,
    "conv1d": _REAL, "conv2d": _REAL, "max_pool2d": _REAL, "avg_pool2d": _REAL,
    "linear_scan": _REAL + _COMPLEX, "log_linear_scan": _REAL,
    "scaled_dot_product_attention": _REAL, "sinusoidal_positional_encoding": _REAL,
    "selective_scan": _REAL, "linear_attention": _REAL, "gated_linear_attention": _REAL,
    "delta_rule": _REAL, "gated_delta_rule": _REAL,
}
_CUDA_DTYPES: dict[str, tuple] = {"log_linear_scan": (), "sinusoidal_positional_encoding": ()}


# ----- launch budgets -----------------------------------------------------------------------
# Two views of one budget: per public call (``launch_budget``) and per kernel of the op's
# nk.kernels pair (``kernel_launches``).
# (Numba launches, all device kernels) of the op's rows of benchmarks/gpu_kernel_counts.py,
# pinned by test_fewer_launches.py; None where the op has no row.
_LAUNCH_BUDGETS: dict[str, dict[str, tuple[int, int]]] = {
    "linear": {"linear 64->128 fwd": (0, 2), "linear 64->128 bwd": (0, 3)},
    "relu": {"relu fwd": (0, 1), "relu bwd": (0, 2)},
    "gelu": {"gelu fwd": (1, 1), "gelu bwd": (1, 1)},
    "dropout": {"dropout 0.1 fwd": (1, 1), "dropout 0.1 bwd": (0, 1)},
    "softmax": {"softmax fwd": (1, 1), "softmax bwd": (1, 1)},
    "log_softmax": {"log_softmax fwd": (1, 1), "log_softmax bwd": (1, 1)},
    "cross_entropy": {"cross_entropy fwd": (2, 2), "cross_entropy bwd": (1, 1)},
    "layer_norm": {"layer_norm 64 fwd": (1, 1), "layer_norm 64 bwd": (3, 3)},
    "scaled_dot_product_attention": {"sdpa (b,8,17,8) fwd": (1, 1),
                                     "sdpa (b,8,17,8) bwd": (3, 3)},
    "conv2d": {"conv2d 1->8 3x3 fwd": (1, 3), "conv2d 1->8 3x3 bwd": (1, 6)},
    "max_pool2d": {"max_pool2d 2 fwd": (1, 1), "max_pool2d 2 bwd": (1, 1)},
}

# The CUDA kernels each pass of the op's nk.kernels pair launches (kernel: launches), pinned
# by test_launch.py, which holds the calls; None where the op has no pinned case.
_SM, _LN, _AT = "softmax_cuda.", "layer_norm_cuda.", "attention_cuda."
_KERNEL_LAUNCHES: dict[str, dict[str, dict[str, int]]] = {
    "softmax": {"softmax forward": {_SM + "_softmax_kernel": 1},
                "softmax backward": {_SM + "_softmax_backward_kernel": 1}},
    "layer_norm": {
        "layer_norm forward": {_LN + "_layer_norm_kernel": 1},
        "layer_norm backward": {_LN + "_layer_norm_dx_kernel": 1,
                                _LN + "_layer_norm_param_chunks_kernel": 1,
                                _LN + "_sum_chunks2_kernel": 1},
        "layer_norm backward, no affine": {_LN + "_layer_norm_dx_kernel": 1}},
    "linear_scan": {
        "linear_scan forward": {"scan_cuda._forward_kernel.<locals>.kernel": 1},
        "linear_scan backward": {"scan_cuda._backward_kernel.<locals>.kernel": 1},
        "linear_scan forward, a thread per sequence": {"scan_cuda._rows_forward": 1}},
    "scaled_dot_product_attention": {
        "attention forward": {_AT + "_forward_kernel.<locals>.forward": 1},
        "attention backward": {_AT + "_row_dot": 1, _AT + "_dkv_kernel.<locals>.dkv": 1,
                               _AT + "_dq_kernel.<locals>.dq_kernel": 1}},
    "conv2d": {"conv2d forward": {"conv_cuda._im2col_kernel": 1},
               "conv2d backward": {"conv_cuda._col2im_kernel": 1}},
    "max_pool2d": {"max_pool2d forward": {"conv_cuda._max_pool_kernel": 1},
                   "max_pool2d backward": {"conv_cuda._max_pool_bwd_kernel": 1}},
    "gelu": {"gelu forward": {"activation_cuda._gelu_forward_kernel": 1},
             "gelu backward": {"activation_cuda._gelu_backward_kernel": 1}},
    "dropout": {"dropout forward": {"activation_cuda._dropout_kernel": 1},
                "dropout backward": {}},  # one CuPy op
    "cross_entropy": {"mean cross_entropy forward and backward": {
        _SM + "_cross_entropy_kernel": 1, _SM + "_mean_valid_kernel": 1,
        _SM + "_cross_entropy_mean_backward_kernel": 1}},
}


# ----- the table ----------------------------------------------------------------------------
class OpFacts(NamedTuple):
    """What the tests know about one public op (see the module docstring)."""

    op: Callable
    forward_twin: Callable | None
    backward_twin: Callable | None
    valid: Callable[[], dict]
    samples: tuple[Callable[[], dict], ...]
    error_inputs: tuple[ErrorInput, ...]
    dtypes: dict[str, tuple]
    launch_budget: dict[str, tuple[int, int]] | None
    kernel_launches: dict[str, dict[str, int]] | None


def _facts(name: str) -> OpFacts:
    forward_twin, backward_twin = _TWINS.get(name, (None, None))
    return OpFacts(
        op=getattr(F, name), forward_twin=forward_twin, backward_twin=backward_twin,
        valid=_VALID[name], samples=_SAMPLES[name], error_inputs=tuple(_ERROR_INPUTS[name]),
        dtypes={"cpu": _CPU_DTYPES[name], "cuda": _CUDA_DTYPES.get(name, _REAL)},
        launch_budget=_LAUNCH_BUDGETS.get(name), kernel_launches=_KERNEL_LAUNCHES.get(name))


OP_FACTS: dict[str, OpFacts] = {name: _facts(name) for name in _VALID}
