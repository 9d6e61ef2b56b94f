"""Each op's naive twin (``OP_FACTS[name].forward_twin`` / ``backward_twin``) computes what
the public op computes: on the op's sample inputs, in float64, the twin's forward equals the
op's output and the twin's backward equals the gradients autograd gives the op's inputs for
one random upstream gradient. The twins are what the fuzz tests hold the kernels to, so a
twin that drifted from its op would let both drift together.

``_TWIN_CALLS`` says how an op's keyword arguments become its twin's: which of them the
twin takes, in order, and the inputs its backward returns gradients for. The softmax twins
work on the last axis; the op's axis is moved there and back.
"""

from __future__ import annotations

import numpy as np
import pytest
from numpy.testing import assert_allclose
from op_facts import OP_FACTS

import nnkit as nk

_CONV = ("x", "weight", "bias", "stride", "padding", "dilation", "groups")
# name: (the twin forward's arguments from the op's keywords, in order; the inputs whose
# gradients the twin backward returns, in its order; keywords the comparison fixes)
_TWIN_CALLS: dict[str, tuple[tuple[str, ...], tuple[str, ...], dict]] = {
    "gelu": (("x", "approximate"), ("x",), {}),
    "softmax": (("x",), ("x",), {}),
    "log_softmax": (("x",), ("x",), {}),
    "cross_entropy": (("logits", "target", "ignore_index"), ("logits",), {}),
    "layer_norm": (("x", "weight", "bias", "eps"), ("x", "weight", "bias"), {}),
    "conv1d": (_CONV, ("x", "weight", "bias"), {}),
    "conv2d": (_CONV, ("x", "weight", "bias"), {}),
    "max_pool2d": (("x", "kernel_size", "stride", "padding", "dilation", "ceil_mode"),
                   ("x",), {}),
    "avg_pool2d": (("x", "kernel_size", "stride", "padding", "ceil_mode", "count_include_pad",
                    "divisor_override"), ("x",), {}),
    "linear_scan": (("a", "b", "h0", "reverse"), ("a", "b", "h0"), {}),
    "log_linear_scan": (("log_a", "log_b", "log_h0"), ("log_a", "log_b", "log_h0"), {}),
    "scaled_dot_product_attention": (
        ("query", "key", "value", "attn_mask", "is_causal", "scale", "dropout_p"),
        ("query", "key", "value"), {}),
    "selective_scan": (("u", "delta", "A", "B", "C", "D", "z", "delta_bias", "delta_softplus"),
                       ("u", "delta", "A", "B", "C", "D", "z", "delta_bias"), {}),
    "linear_attention": (("q", "k", "v", "scale", "initial_state"),
                         ("q", "k", "v", "initial_state"), {}),
    "gated_linear_attention": (("q", "k", "v", "g", "scale", "initial_state"),
                               ("q", "k", "v", "g", "initial_state"), {}),
    "delta_rule": (("q", "k", "v", "beta", "scale", "initial_state"),
                   ("q", "k", "v", "beta", "initial_state"), {}),
    "gated_delta_rule": (("q", "k", "v", "g", "beta", "scale", "initial_state"),
                         ("q", "k", "v", "g", "beta", "initial_state"), {}),
}
_LAST_AXIS_TWINS = ("softmax", "log_softmax")


def _in_float64(kw: dict) -> dict:
    """The sample's tensors as fresh float64 leaves (complex samples stay complex)."""
    out = {}
    for key, value in kw.items():
        if isinstance(value, nk.Tensor):
            data = np.asarray(value.data)
            dtype = np.complex128 if np.iscomplexobj(data) else np.float64
            value = nk.tensor(data.astype(dtype), requires_grad=True)
        out[key] = value
    return out


def _plain(value):
    return np.asarray(value.data) if isinstance(value, nk.Tensor) else value


def _twin_pass(name: str, kw: dict, dy: np.ndarray) -> tuple[np.ndarray, tuple]:
    """The twin's output and gradients for the op's keywords ``kw`` and upstream ``dy``."""
    facts = OP_FACTS[name]
    arg_names, _, _ = _TWIN_CALLS[name]
    args = [_plain(kw[key]) for key in arg_names]
    axis = kw.get("axis") if name in _LAST_AXIS_TWINS else None
    if axis is not None:
        args[0], dy = np.moveaxis(args[0], axis, -1), np.moveaxis(dy, axis, -1)
    y, cache = facts.forward_twin(*args)
    grads = facts.backward_twin(dy, cache)
    grads = grads if isinstance(grads, tuple) else (grads,)
    if axis is not None:
        y, grads = np.moveaxis(y, -1, axis), (np.moveaxis(grads[0], -1, axis),)
    return y, grads


@pytest.mark.parametrize("name", sorted(_TWIN_CALLS))
def test_twin_computes_what_its_op_computes(name):
    facts = OP_FACTS[name]
    _, grad_names, fixed = _TWIN_CALLS[name]
    for sample in facts.samples:
        kw = {**_in_float64(sample()), **fixed}
        y = facts.op(**kw)
        y = y[0] if isinstance(y, tuple) else y  # an op that also returns weights/indices
        dy = np.random.default_rng(0).standard_normal(np.shape(y.data))
        y.backward(dy)
        y_twin, grads_twin = _twin_pass(name, kw, dy)
        assert_allclose(y.data, y_twin, rtol=1e-10, atol=1e-12, err_msg=f"{name}: output")
        assert len(grads_twin) >= len(grad_names), name
        for key, grad_twin in zip(grad_names, grads_twin[:len(grad_names)], strict=True):
            if kw[key] is None:
                assert grad_twin is None, f"{name}: d{key} of an absent input"
                continue
            assert_allclose(kw[key].grad, grad_twin, rtol=1e-9, atol=1e-12,
                            err_msg=f"{name}: d{key}")


def test_every_twin_is_compared_with_its_op():
    assert set(_TWIN_CALLS) == {n for n, f in OP_FACTS.items() if f.forward_twin is not None}


def test_a_drifted_twin_is_caught(monkeypatch):
    """The comparison fails when a twin computes something else (here: a softmax twin that
    forgets to normalise)."""
    unnormalised = OP_FACTS["softmax"]._replace(forward_twin=lambda x: (np.exp(x), np.exp(x)))
    monkeypatch.setitem(OP_FACTS, "softmax", unnormalised)
    with pytest.raises(AssertionError, match="softmax: output"):
        test_twin_computes_what_its_op_computes("softmax")
