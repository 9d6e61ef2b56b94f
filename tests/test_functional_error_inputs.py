"""The bad inputs of every public function of ``nk.functional``, from one table.

``ERROR_INPUTS`` maps each name of ``F.__all__`` to the calls that must be refused, in the
spirit of PyTorch's OpInfo ``error_inputs`` (``torch.testing._internal.opinfo.core``'s
``ErrorInput``: a sample input, the error type, a regex its message must match). A function
added to ``F.__all__`` without at least three hostile cases fails
``test_every_functional_has_error_inputs``.

Each case is one valid call (``VALID``) with one or two arguments spoiled: the wrong type of
the main input (str, None, object, a list of str), wrong dtypes (int, bool, complex where it
has no meaning, float16 where the kernels take float32/float64 only, object arrays), wrong
ranks, shapes that do not match, out-of-range axes, invalid hyper-parameters, and arguments
whose dtypes do not match. The error must be exactly the ``ValueError`` or ``TypeError``
given (an ``IndexError``, ``numpy.exceptions.AxisError`` or a Numba typing error is a bug),
and its message must name the argument (the project's rule: "a ValueError/TypeError naming
the argument, the expected and the received shape or dtype"); dtype cases also check that
the received dtype is named.

Not in the table, because nk.functional has no such thing today: an ``out=`` argument (no
public function of F takes one), a ``dim=`` alias of ``axis`` (F.softmax and F.log_softmax
take ``axis`` only; ``dim=`` is Python's "unexpected keyword argument"), GPU/CPU mixes (the
``cuda``-marked tests cover them) and ``is_causal=True`` with an ``attn_mask`` (accepted on
purpose, see the docstring of ``scaled_dot_product_attention``).
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import pytest

import nnkit as nk
import nnkit.functional as F


class ErrorInput(NamedTuple):
    """One call that must be refused (torch's ``ErrorInput``, keyword arguments only)."""

    desc: str
    kwargs: Callable[[], dict]  # builds the call's keyword arguments
    error_type: type[Exception]
    error_regex: str  # re.search'ed in the message


def _f(*shape, dtype=np.float32):
    return np.random.default_rng(0).normal(size=shape).astype(dtype)


# One valid call per function: each error case spoils one or two of its arguments.
VALID: dict[str, Callable[[], dict]] = {
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
    """VALID[fn_name]'s call with ``overrides`` in place of its arguments."""
    return ErrorInput(desc, lambda: _spoil(VALID[fn_name](), overrides), error_type, regex)


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
ERROR_INPUTS: dict[str, list[ErrorInput]] = {
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

_CASES = [pytest.param(name, case, id=f"{name}-{case.desc}")
          for name, cases in ERROR_INPUTS.items() for case in cases]


# ----- tests ---------------------------------------------------------------------------------
def test_every_functional_has_error_inputs():
    assert set(ERROR_INPUTS) == set(F.__all__), "add the new function's hostile cases"
    assert set(VALID) == set(F.__all__)
    for name, cases in ERROR_INPUTS.items():
        assert len(cases) >= 3, f"{name} has only {len(cases)} error inputs"
        descs = [c.desc for c in cases]
        assert len(set(descs)) == len(descs), f"{name} has two cases of one description"


@pytest.mark.parametrize("name", sorted(VALID))
def test_valid_base_call_works(name):
    """Each case spoils a call that works: its error is the spoiled argument's."""
    out = getattr(F, name)(**VALID[name]())
    out = out[0] if isinstance(out, tuple) else out
    assert isinstance(out, nk.Tensor)


@pytest.mark.parametrize(("name", "case"), _CASES)
def test_error_input_keywords_are_parameters(name, case):
    """A renamed parameter must not leave a case testing a keyword the function lacks."""
    params = inspect.signature(getattr(F, name)).parameters
    unknown = set(case.kwargs()) - set(params)
    assert not unknown, f"{name} has no parameter {sorted(unknown)}"


@pytest.mark.parametrize(("name", "case"), _CASES)
def test_error_input_is_refused(name, case):
    fn = getattr(F, name)
    kwargs = case.kwargs()
    with pytest.raises(case.error_type, match=case.error_regex) as info:
        fn(**kwargs)
    # exactly the type: not a subclass such as numpy's AxisError (a ValueError and an
    # IndexError) or a library-specific error
    assert type(info.value) is case.error_type, (
        f"{name}({case.desc}): expected {case.error_type.__name__}, got "
        f"{type(info.value).__module__}.{type(info.value).__name__}: {info.value}")
