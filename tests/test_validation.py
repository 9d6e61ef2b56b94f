"""One dispatch path and one error convention for every kernel family.

``nnkit._backend.kernels_for`` picks each call's kernels (NumPy -> CPU, GPU arrays -> CUDA)
and ``nnkit._validation.check_same_device`` / ``check_out`` hold the device and ``out=``
rules. The convention: a wrong device, type or dtype is a ``TypeError``; a wrong shape, a
layout that is not C-contiguous or a read-only ``out`` is a ``ValueError``; the message
names the argument, what was expected and what arrived.

A "GPU array" here is ``DeviceArray``, a NumPy buffer behind ``__cuda_array_interface__``
(what nnkit recognises a CuPy array by): every refusal tested happens in the validation,
before a kernel could touch it, so no GPU and no CUDA simulator is needed.
"""

import ast
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from op_facts import OP_FACTS

import nnkit.kernels as K
from nnkit._backend import backend, kernels_for
from nnkit._validation import check_out, check_same_device

ROOT = Path(__file__).resolve().parent.parent


class DeviceArray:
    """A stand-in GPU array over a NumPy buffer (shape, dtype, flags as CuPy's)."""

    def __init__(self, a):
        self.a = np.ascontiguousarray(a)

    def __getattr__(self, name):
        if name in ("dtype", "ndim", "flags", "size", "itemsize", "shape", "strides"):
            return getattr(self.a, name)
        raise AttributeError(name)

    @property
    def __cuda_array_interface__(self):
        return dict(self.a.__array_interface__, version=3)


def _f(*shape, dtype=np.float64):
    return np.random.default_rng(0).standard_normal(shape).astype(dtype)


def _rnn_cache():
    _, cache = K.rnn_forward(_f(3, 2, 4), None, _f(5, 4), _f(5, 5))
    return cache


def _conv_cache():
    return K.conv2d_forward(_f(1, 2, 4, 4), _f(3, 2, 2, 2))[1]


def _pool_cache():
    return K.max_pool2d_forward(_f(1, 1, 4, 4), 2)[1]


# (family, the call given one companion array ``c``, the companion's name, a good companion,
# the name of the array it must live beside); each call is refused with ``c`` on the other
# device whichever side the GPU array is on.
COMPANIONS = [
    ("cross_entropy", lambda c, x: K.cross_entropy_forward(x, c), "target",
     lambda: np.array([0, 2]), "logits"),
    ("layer_norm", lambda c, x: K.layer_norm_forward(x, c, None, 3), "weight", lambda: _f(3),
     "x"),
    ("scan", lambda c, a: K.linear_scan_forward(a, c), "b", lambda: _f(1, 4, 2), "a"),
    ("scan_h0", lambda c, a: K.linear_scan_forward(a, a, c), "h0", lambda: _f(1, 2), "a"),
    ("attention", lambda c, q: K.attention_forward(q, c, q), "key", lambda: _f(2, 3, 4),
     "query"),
    ("attention_mask", lambda c, q: K.attention_forward(q, q, q, attn_mask=c), "attn_mask",
     lambda: np.ones((3, 3), bool), "query"),
    ("conv", lambda c, x: K.conv2d_forward(x, c), "weight", lambda: _f(3, 2, 2, 2), "x"),
    ("conv_bias", lambda c, x: K.conv2d_forward(x, _f(3, 2, 2, 2), c), "bias", lambda: _f(3),
     "x"),
    ("recurrent", lambda c, x: K.rnn_forward(x, None, c, _f(5, 5)), "weight_ih",
     lambda: _f(5, 4), "x"),
    ("recurrent_h0", lambda c, x: K.rnn_forward(x, c, _f(5, 4), _f(5, 5)), "h0",
     lambda: _f(2, 5), "x"),
]
_LIKE = {"logits": lambda: _f(2, 3), "x": None, "a": lambda: _f(1, 4, 2),
         "query": lambda: _f(2, 3, 4)}
_X = {"cross_entropy": lambda: _f(2, 3), "layer_norm": lambda: _f(2, 3),
      "conv": lambda: _f(1, 2, 4, 4),
      "conv_bias": lambda: _f(1, 2, 4, 4), "recurrent": lambda: _f(3, 2, 4),
      "recurrent_h0": lambda: _f(3, 2, 4)}


def _like(family, like_name):
    return _X[family]() if family in _X else _LIKE[like_name]()


@pytest.mark.parametrize("gpu_side", ["companion", "main"])
@pytest.mark.parametrize("family, call, name, good, like_name", COMPANIONS,
                         ids=[c[0] for c in COMPANIONS])
def test_every_family_refuses_a_companion_on_the_other_device(family, call, name, good,
                                                              like_name, gpu_side):
    like, companion = _like(family, like_name), good()
    if gpu_side == "companion":
        companion = DeviceArray(companion)
        expected = f"{name} must be a NumPy array like {like_name}, got a GPU array"
    else:  # the first NumPy array met is refused (another companion, perhaps)
        like = DeviceArray(like)
        expected = f" must be a GPU array like {like_name}, got a NumPy array"
    with pytest.raises(TypeError, match=re.escape(expected)):
        call(companion, like)


# (family, backward given dy, the name of dy, dy's right shape): each backward checks its dy,
# and only its dy, against the cache of its forward.
BACKWARDS = [
    ("conv_backward", lambda dy: K.conv2d_backward(dy, _conv_cache()), "dy", (1, 3, 3, 3)),
    ("pool_backward", lambda dy: K.max_pool2d_backward(dy, _pool_cache()), "dy", (1, 1, 2, 2)),
    ("softmax", lambda dy: K.softmax_backward(dy, K.softmax_forward(_f(2, 3))[1]), "dy",
     (2, 3)),
    ("log_softmax", lambda dy: K.log_softmax_backward(dy, K.log_softmax_forward(_f(2, 3))[1]),
     "dy", (2, 3)),
    ("layer_norm", lambda dy: K.layer_norm_backward(
        dy, K.layer_norm_forward(_f(2, 3), _f(3), _f(3), 3)[1]), "dy", (2, 3)),
    ("gelu", lambda dy: K.gelu_backward(dy, K.gelu_forward(_f(2, 3))[1]), "dy", (2, 3)),
    ("dropout", lambda dy: K.dropout_backward(dy, K.dropout_forward(_f(2, 3), 0.5, 1)[1]), "dy",
     (2, 3)),
    ("scan", lambda dh: K.linear_scan_backward(dh, K.linear_scan_forward(_f(1, 4, 2),
                                                                         _f(1, 4, 2))[1]),
     "dh", (1, 4, 2)),
    ("log_scan", lambda dh: K.log_linear_scan_backward(
        dh, K.log_linear_scan_forward(_f(1, 4, 2), _f(1, 4, 2))[1]), "dlog_h", (1, 4, 2)),
]


@pytest.mark.parametrize("call, name, shape",
                         [b[1:] for b in BACKWARDS] + [
                             (lambda dy: K.rnn_backward((dy, None), _rnn_cache()), "dy",
                              (3, 2, 5))],
                         ids=[b[0] for b in BACKWARDS] + ["recurrent_backward"])
def test_backward_gradients_on_the_other_device_are_type_errors(call, name, shape):
    with pytest.raises(TypeError, match=rf"{name} must be a NumPy array.*got a GPU array"):
        call(DeviceArray(_f(*shape)))


@pytest.mark.parametrize("call, name, shape", [b[1:] for b in BACKWARDS],
                         ids=[b[0] for b in BACKWARDS])
def test_backward_gradients_of_the_wrong_shape_or_dtype(call, name, shape):
    """Shape: ValueError; dtype: TypeError (they were one ValueError in conv and pooling)."""
    wrong = shape[:-1] + (shape[-1] + 1,)
    with pytest.raises(ValueError, match=rf"{name} must have shape .* got shape "
                                         rf"{re.escape(str(wrong))}"):
        call(_f(*wrong))
    with pytest.raises(TypeError, match=f"{name} must have dtype float64 .* got float32"):
        call(_f(*shape, dtype=np.float32))


# ---- out= ------------------------------------------------------------------------------------

def _scan_backward(out_da):
    a, b = _f(1, 4, 2), _f(1, 4, 2)
    _, cache = K.linear_scan_forward(a, b)
    return K.linear_scan_backward(b, cache, out=(out_da, np.empty((1, 4, 2)), np.empty((1, 2))))


def _hidden_grads(out):
    cache = _rnn_cache()
    return K.rnn_backward((_f(3, 2, 5), None), cache, hidden_grads=out)


# (family, call given ``out``, the name in the message, the correct out's shape)
OUTS = [
    ("softmax", lambda out: K.softmax_forward(_f(2, 3), out=out), "out", (2, 3)),
    ("log_softmax", lambda out: K.log_softmax_forward(_f(2, 3), out=out), "out", (2, 3)),
    ("scan", lambda out: K.linear_scan_forward(_f(1, 4, 2), _f(1, 4, 2), out=out), "out",
     (1, 4, 2)),
    ("scan_backward", _scan_backward, "out[0] (da)", (1, 4, 2)),
    ("recurrent_hidden_grads", _hidden_grads, "hidden_grads", (3, 2, 5)),
]


def _read_only(shape):
    a = np.empty(shape)
    a.setflags(write=False)
    return a


SPOILED = [  # (what, make(shape) -> a bad out, error, message after the name)
    ("GPU array", lambda s: DeviceArray(np.empty(s)), TypeError,
     "must be a NumPy array like .*, got a GPU array"),
    ("list", lambda s: np.empty(s).tolist(), TypeError, "must be a NumPy array like .*, got list"),
    ("dtype", lambda s: np.empty(s, np.float32), TypeError,
     r"must have dtype float64 \(.*\), got float32"),
    ("big-endian", lambda s: np.empty(s, ">f8"), TypeError, r"has dtype >f8 \(float64, big"),
    ("shape", lambda s: np.empty(s[:-1] + (s[-1] + 1,)), ValueError,
     r"must have shape \(.*\), got \("),
    ("strided", lambda s: np.empty(s[:-1] + (2 * s[-1],))[..., ::2], ValueError,
     "must be C-contiguous"),
    ("read-only", _read_only, ValueError, "is read-only"),
]


@pytest.mark.parametrize("what, make, error, message", SPOILED, ids=[s[0] for s in SPOILED])
@pytest.mark.parametrize("family, call, name, shape", OUTS, ids=[o[0] for o in OUTS])
def test_every_family_refuses_a_wrong_out_with_one_error_type(family, call, name, shape, what,
                                                              make, error, message):
    with pytest.raises(error, match=re.escape(name) + " " + message):
        call(make(shape))


@pytest.mark.parametrize("family, call, name, shape", OUTS, ids=[o[0] for o in OUTS])
def test_a_good_out_is_written_and_returned(family, call, name, shape):
    out = np.full(shape, np.nan)
    call(out)
    assert np.isfinite(out).all()


# ---- the helpers themselves, both directions ---------------------------------------------------

def test_check_same_device_and_check_out_both_ways():
    host, device = np.zeros((2, 3)), DeviceArray(np.zeros((2, 3)))
    assert check_same_device(host, host, name="w") is host
    assert check_same_device(device, device, name="w") is device
    assert check_same_device(device, "cuda", name="dy") is device
    with pytest.raises(TypeError, match="w must be a GPU array like x, got a NumPy array"):
        check_same_device(host, device, name="w")
    with pytest.raises(TypeError, match="w must be a NumPy array like x, got a GPU array"):
        check_same_device(device, host, name="w")
    with pytest.raises(TypeError, match="dy must be a GPU array like the forward's output"):
        check_same_device(host, "cuda", name="dy", like_name="the forward's output")
    assert check_out(device, device) is device
    with pytest.raises(TypeError, match="out must be a GPU array like x, got a NumPy array"):
        check_out(host, device)
    with pytest.raises(TypeError, match="out must be a GPU array like x, got NoneType"):
        check_out(None, device)


def test_the_backend_is_chosen_by_the_array_type():
    assert backend(np.zeros(2)) == "cpu" and backend([1.0]) == "cpu"
    assert backend(DeviceArray(np.zeros(2))) == "cuda"
    assert kernels_for("softmax_cpu", "softmax_cuda", np.zeros(2)).__name__ == \
        "nnkit._ext.softmax_cpu"
    with pytest.raises(TypeError, match=r"x must be a GPU array \(these kernels run on the GPU "
                                        r"only\), got a NumPy array"):
        kernels_for(None, "softmax_cuda", np.zeros(2))


# The entry points of the CPU-only kernels that optim, approx and classic call: a GPU array is
# refused by the dispatch, a TypeError naming the argument (not a Numba or Cython error).
_D = DeviceArray(np.zeros(3))
CPU_ONLY = [
    ("optim", lambda: K.adam_update(_D, _D, _D, _D, _D, _D, False, False, False, False, False),
     "param"),
    ("approx", lambda: K.window_sum(_D, _D, _D, _D, _D, _D, 1.0, _D), "x"),
    ("perceptron", lambda: K.perceptron_epochs(_D, _D, _D, _D, _D, 1, True), "X"),
    ("hopfield_patterns", lambda: K.hopfield_async_run_patterns(_D, _D, _D, _D, _D, 1, True, 0,
                                                                _D, _D), "states"),
    ("dense_memory", lambda: K.dense_memory_async_run(_D, _D, _D, _D, _D, 1, True, 0, "poly", 3,
                                                      _D, _D), "states"),
] + [(name, call, arg) for name, (call, arg) in {
    # the kernels of the public ops that tests/op_facts.py lists without CUDA dtypes
    "log_linear_scan": (lambda: K.scan.log_linear_scan_forward(DeviceArray(_f(1, 2, 1)),
                                                               DeviceArray(_f(1, 2, 1))),
                        "log_a"),
}.items()]


def test_the_cpu_only_public_ops_are_those_without_cuda_dtypes():
    """Each public op that takes arrays and has no CUDA dtype in OP_FACTS is pinned above."""
    cpu_only = {name for name, facts in OP_FACTS.items() if not facts.dtypes["cuda"]
                and any(isinstance(v, np.ndarray) for v in facts.valid().values())}
    assert cpu_only == {row[0] for row in CPU_ONLY} & set(OP_FACTS)


@pytest.mark.parametrize("call, name", [c[1:] for c in CPU_ONLY], ids=[c[0] for c in CPU_ONLY])
def test_cpu_only_kernels_refuse_gpu_arrays(call, name):
    with pytest.raises(TypeError, match=rf"{name} must be a NumPy array.*got a GPU array"):
        call()


# ---- the layers above reach the compiled kernels only through nnkit.kernels -----------------

@pytest.mark.parametrize("package", ["functional", "optim.py", "approx", "classic"])
def test_upper_layers_do_not_import_the_compiled_modules(package):
    root = ROOT / "nnkit" / package
    for path in [root] if root.is_file() else sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""] + [a.name for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            assert not any(n == "_ext" or "_ext." in n or n.endswith("._ext") for n in names), \
                f"{path.relative_to(ROOT)}:{node.lineno} imports nnkit._ext"


def test_cpu_work_imports_no_cuda_module():
    """Kernel modules load on first use: a CPU-only process never imports numba.cuda or CuPy."""
    code = ("import sys, numpy as np, nnkit as nk\n"
            "x = np.ones((2, 3)); nk.kernels.softmax_forward(x)\n"
            "nk.kernels.layer_norm_forward(x, None, None, 3)\n"
            "nk.kernels.conv2d_forward(np.ones((1, 1, 3, 3)), np.ones((1, 1, 2, 2)))\n"
            "print(sorted(m for m in sys.modules if m in ('numba.cuda', 'cupy')"
            " or m.endswith('_cuda')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "[]"
