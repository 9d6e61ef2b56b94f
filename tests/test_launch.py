"""The one launch path of nnkit's CUDA kernels (``nnkit._ext._launch``).

- Every CUDA module launches through ``launch`` (a static check of the source).
- ``pack_args`` gives the kernel parameters numba's own argument preparation gives
  (``_Kernel._prepare_args``, run here on host arrays posing as device arrays), and
  ``param_sizes`` the parameters of numba's PTX (a kernel numba-cuda 0.30.4 compiled).
- The raw path's plumbing, without a GPU: a fake CuPy array type and a fake loader that
  unpacks the packed parameters (Numba's ABI) back into arrays and runs the kernel's Python
  twin; the signature cache, the fallbacks, the strict mode and the counters.
- Launch budgets (marked ``cuda``: a real GPU, or the CuPy stand-in under the simulator in
  tests/test_gpu_stand_in.py): how many launches each op makes, pinned by kernel.
"""

from __future__ import annotations

import ctypes
import math
import re
import types
from pathlib import Path

import numba
import numpy as np
import pytest
from numba import config
from op_facts import OP_FACTS

from nnkit._ext import _launch

ROOT = Path(__file__).resolve().parent.parent
LAUNCH_SITE = re.compile(r"\b\w+\[[^\]\n]+\]\(")  # kernel[grid, block](...)


# ---- one launch path -------------------------------------------------------------------------

def test_every_cuda_kernel_is_launched_through_launch():
    cuda_modules = []
    for path in sorted((ROOT / "nnkit").rglob("*.py")):
        source = path.read_text()
        kernels = re.findall(r"cuda\.jit(?!\(device=True\))", source)  # device functions aside
        if path.name == "_launch.py" or not kernels:
            continue
        cuda_modules.append(path.name)
        sites = [line for line in source.splitlines() if LAUNCH_SITE.search(line)]
        assert sites == [], f"{path.relative_to(ROOT)} launches outside _launch: {sites}"
        assert "from ._launch import" in source, path.name
    assert {"attention_cuda.py", "conv_cuda.py", "hopfield_cuda.py", "layer_norm_cuda.py",
            "recurrent_cuda.py", "scan_cuda.py", "softmax_cuda.py"} <= set(cuda_modules)
    assert not any("launch_views" in p.read_text() for p in (ROOT / "nnkit").rglob("*.py"))


def test_the_launch_site_pattern_finds_launches():
    assert LAUNCH_SITE.search("    _fill_zero[_grid(n, t)](status)")
    assert LAUNCH_SITE.search("kernel[grid, (TX, TY), stream](*args)")
    assert not LAUNCH_SITE.search("    launch(kernel, grid, block, x[0], y[1:])")


# ---- Numba's kernel ABI ------------------------------------------------------------------------

def _host_params(params):
    """(bytes, value) of each packed parameter as CuPy passes it (an array: its pointer)."""
    sizes = _launch.packed_sizes(params)
    values = [p.__array_interface__["data"][0] if isinstance(p, np.ndarray) else
              p.item() if isinstance(p, np.generic) else p for p in params]
    return list(zip(sizes, values, strict=True))


class _HostDeviceArray:
    """A host array posing as a Numba device array for ``_prepare_args`` (both numba's own
    CUDA target and numba-cuda's read these attributes)."""

    __cuda_memory__ = True

    def __init__(self, a):
        self.size, self.dtype, self.shape, self.strides, self.ndim = (
            a.size, a.dtype, a.shape, a.strides, a.ndim)
        self.ptr = a.__array_interface__["data"][0]
        self.device_ctypes_pointer = ctypes.c_void_p(self.ptr)
        self._layout = types.SimpleNamespace(
            strides_in_bytes=a.strides, is_contiguous_c=a.flags.c_contiguous,
            is_contiguous_f=a.flags.f_contiguous)

    def to_device(self, retr, stream=0):
        return self


def _numba_params(monkeypatch, args):
    """(bytes, value) of each parameter numba's ``_Kernel._prepare_args`` makes of ``args``."""
    if config.ENABLE_CUDASIM:
        pytest.skip("numba.cuda is the simulator in this process")
    from numba.cuda import dispatcher

    monkeypatch.setattr(dispatcher, "wrap_arg", lambda value, default=None:
                        _HostDeviceArray(value))
    kernelargs = []
    fake_kernel = types.SimpleNamespace(extensions=[])
    fake_kernel._prepare_args = lambda *a: dispatcher._Kernel._prepare_args(fake_kernel, *a)
    for value in args:
        dispatcher._Kernel._prepare_args(fake_kernel, numba.typeof(value), value, 0, [],
                                         kernelargs)
    out = []
    for p in kernelargs:
        if isinstance(p, ctypes._SimpleCData):
            out.append((ctypes.sizeof(p), p.value or 0))
        elif isinstance(p, bool):
            out.append((1, p))
        elif isinstance(p, np.generic):  # numba-cuda passes a NumPy bool as it came
            out.append((p.itemsize, p.item()))
        else:  # numba-cuda passes Python ints (pointer-sized) to cuda.core
            out.append((8, p))
    return out


def _arrays():
    rng = np.random.default_rng(0)
    for dtype in (np.float32, np.float64, np.int64, np.uint8, np.bool_, np.complex64,
                  np.complex128):
        for shape in ((5,), (3, 4), (2, 3, 4)):
            a = (rng.standard_normal((2,) + shape) * 3).astype(dtype)
            yield pytest.param(a[0], id=f"{np.dtype(dtype).name}-{len(shape)}d-C")
            # strided: every other element of the last axis, and a transposed view
            yield pytest.param(a[1][..., ::2], id=f"{np.dtype(dtype).name}-{len(shape)}d-strided")
            if len(shape) > 1:
                yield pytest.param(a[1].T, id=f"{np.dtype(dtype).name}-{len(shape)}d-transposed")


@pytest.mark.parametrize("array", list(_arrays()))
def test_pack_args_matches_numbas_arguments_for_arrays(monkeypatch, array):
    args = (array, np.ones(2, np.float32))
    argtypes = [numba.typeof(a) for a in args]
    packed = _launch.pack_args(argtypes, args)
    assert _host_params(packed) == _numba_params(monkeypatch, args)
    assert _launch.packed_sizes(packed) == _launch.param_sizes(argtypes)
    # meminfo, parent, nitems, itemsize, data, shape, strides (bytes)
    assert packed[:4] == (0, 0, array.size, array.itemsize) and packed[4] is array
    assert packed[5:5 + 2 * array.ndim] == (*array.shape, *array.strides)


def test_pack_args_matches_numbas_arguments_for_tuples_of_arrays(monkeypatch):
    """A tuple of arrays (the multi-tensor optimizer kernels) is its arrays' parameters one
    after the other, as Numba passes it."""
    rng = np.random.default_rng(0)
    members = (rng.standard_normal(5).astype(np.float32), np.zeros(0, np.float32),
               rng.standard_normal(7).astype(np.float32))
    args = (members, np.float32(0.5), (np.ones(3), np.ones((2, 2))[:, ::2]), True)
    argtypes = [numba.typeof(a) for a in args]
    packed = _launch.pack_args(argtypes, args)
    assert _host_params(packed) == _numba_params(monkeypatch, args)
    assert _launch.packed_sizes(packed) == _launch.param_sizes(argtypes)
    assert _launch.param_sizes([argtypes[0]]) == [8] * 21  # 56 bytes per 1-D array


SCALARS = [3, -(2**40), 2.5, True, False, np.int32(-7), np.int64(2**62), np.uint64(2**63 + 5),
           np.uint8(200), np.int8(-3), np.int16(300), np.uint32(7), np.float32(1.25),
           np.float64(-0.5), np.bool_(True), 1.5 - 2j, np.complex64(0.5 + 0.25j),
           np.complex128(-1 + 3j)]


@pytest.mark.parametrize("value", SCALARS, ids=[f"{type(v).__name__}({v})" for v in SCALARS])
def test_pack_args_matches_numbas_arguments_for_scalars(monkeypatch, value):
    args = (np.zeros(3, np.float32), value, np.zeros((2, 2), np.int64))
    argtypes = [numba.typeof(a) for a in args]
    packed = _launch.pack_args(argtypes, args)
    assert _host_params(packed) == _numba_params(monkeypatch, args)
    assert _launch.packed_sizes(packed) == _launch.param_sizes(argtypes)


def test_python_bools_and_floats_keep_their_width():
    """CuPy passes a Python bool as one byte and an int as eight: a bool typed as a Numba
    boolean must not travel as an int (CuPy would pass 8 bytes)."""
    argtypes = [numba.typeof(v) for v in (True, 3, 2.0, np.float32(2))]
    packed = _launch.pack_args(argtypes, (True, 3, 2.0, np.float32(2)))
    assert _launch.packed_sizes(packed) == [1, 8, 8, 4]
    assert type(packed[0]) is np.bool_ and type(packed[3]) is np.float32


# The kernel parameters of k(a: float32[::1], b: float64[:, :], flag: boolean, n: int64,
# x: float32, z: complex128, m: int32, c: uint8[:, :, :]) in the PTX numba-cuda 0.30.4 made
# (cuda.compile_ptx, cc 9.0), names shortened.
NUMBA_PTX = """
.visible .entry k(
""" + "".join(f"\t.param .u64 k_param_{i},\n" for i in range(16)) + """\
\t.param .u8 k_param_16,
\t.param .u64 k_param_17,
\t.param .f32 k_param_18,
\t.param .f64 k_param_19,
\t.param .f64 k_param_20,
\t.param .u32 k_param_21,
""" + ",\n".join(f"\t.param .u64 k_param_{i}" for i in range(22, 33)) + """
)
{
\tret;
}
"""


def test_param_sizes_are_the_parameters_of_numbas_ptx():
    t = numba.types
    sig = (t.float32[::1], t.float64[:, :], t.boolean, t.int64, t.float32, t.complex128,
           t.int32, t.Array(t.uint8, 3, "A"))
    entry, sizes = _launch.ptx_params(NUMBA_PTX)
    assert entry == "k" and len(sizes) == 33
    assert sizes == _launch.param_sizes(sig)


def test_ptx_params_reads_aligned_byte_arrays_and_refuses_no_entry():
    ptx = ".visible .entry f(\n .param .align 8 .b8 f_param_0[16],\n .param .s32 f_param_1\n)"
    assert _launch.ptx_params(ptx) == ("f", [16, 4])
    with pytest.raises(ValueError, match="no .entry"):
        _launch.ptx_params(".func g()")


def test_param_sizes_refuses_what_it_cannot_pack():
    with pytest.raises(TypeError, match="no raw launch"):
        _launch.param_sizes([numba.typeof((1, 2))])


# ---- the raw path's plumbing, without a GPU ----------------------------------------------------

class FakeDeviceArray:
    """What ``launch`` sees of a CuPy array, over a NumPy buffer."""

    def __init__(self, a):
        self.a = a

    def __getattr__(self, name):
        if name in ("dtype", "ndim", "flags", "size", "itemsize", "shape", "strides"):
            return getattr(self.a, name)
        raise AttributeError(name)

    @property
    def __cuda_array_interface__(self):
        return dict(self.a.__array_interface__, version=3)


def _axpy(x, y, scale, flag, out):
    """The kernels' Python twin: out = scale * x + y where flag, else y."""
    out[...] = scale * x + y if flag else y


def _unpack(argtypes, params):
    """The arguments back from their kernel parameters (Numba's ABI), arrays as views of
    the buffer behind the data pointer's array, by the packed shape and strides."""
    it, args = iter(params), []

    def array(ty):
        meminfo, parent, nitems, itemsize, data = (next(it) for _ in range(5))
        shape = tuple(next(it) for _ in range(ty.ndim))
        strides = tuple(next(it) for _ in range(ty.ndim))
        assert (meminfo, parent) == (0, 0) and nitems == math.prod(shape)
        assert itemsize == data.a.itemsize
        return np.lib.stride_tricks.as_strided(data.a, shape, strides)

    for ty in argtypes:
        if isinstance(ty, numba.types.Array):
            args.append(array(ty))
        elif isinstance(ty, numba.types.BaseTuple):
            args.append(tuple(array(t) for t in ty))
        elif isinstance(ty, numba.types.Complex):
            args.append(complex(next(it), next(it)))
        else:
            args.append(next(it))
    assert next(it, None) is None
    return args


class FakeKernel:
    """A kernel: ``py_func`` its body; indexing and calling it is Numba's path."""

    def __init__(self, py_func):
        self.py_func = py_func
        self.numba_launches = []

    def __getitem__(self, config):
        def host(a):
            if isinstance(a, tuple):
                return tuple(map(host, a))
            return a.a if isinstance(a, FakeDeviceArray) else a

        def run(*args):
            self.numba_launches.append(config)
            self.py_func(*map(host, args))
        return run


@pytest.fixture
def raw(monkeypatch):
    """``_launch`` as on a GPU with CuPy: FakeDeviceArray for CuPy's arrays, PTX and loading
    faked; returns the record of what was compiled and launched."""
    record = types.SimpleNamespace(compiled=[], launched=[])
    signatures = {}

    def fake_ptx(kernel, argtypes):
        record.compiled.append((kernel.py_func.__name__, argtypes))
        sizes = _launch.param_sizes(argtypes)
        ptx = (f".visible .entry fake{len(record.compiled)}(\n" +
               ",\n".join(f".param .u{8 * s} p{i}" for i, s in enumerate(sizes)) + "\n)")
        signatures[ptx] = (kernel, argtypes)
        return ptx

    def fake_function(ptx, entry):
        kernel, argtypes = signatures[ptx]

        def function(grid, block, params, shared):
            assert type(grid) is tuple and type(block) is tuple and type(params) is tuple
            assert _launch.packed_sizes(params) == _launch.ptx_params(ptx)[1]
            record.launched.append((entry, grid, block, shared))
            kernel.py_func(*_unpack(argtypes, params))
        return function

    monkeypatch.setattr(_launch, "_SIMULATOR", False)
    monkeypatch.setattr(_launch, "_ndarray", FakeDeviceArray)
    monkeypatch.setattr(_launch, "_typeof", lambda kernel, v: numba.typeof(
        v.a if isinstance(v, FakeDeviceArray) else v))
    monkeypatch.setattr(_launch, "_ptx", fake_ptx)
    monkeypatch.setattr(_launch, "_cupy_function", fake_function)
    monkeypatch.setattr(_launch, "_launch_numba", lambda kernel, grid, block, args, stream,
                        shared: kernel[grid, block, stream or 0, shared](*args))
    monkeypatch.setattr(_launch, "_entries", {})
    monkeypatch.setattr(_launch, "fallbacks", {})
    monkeypatch.setattr(_launch, "_path", "auto")
    return record


def _inputs(dtype=np.float32, strided=False):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 10) if strided else (4, 5)).astype(dtype)
    x = x[:, ::2] if strided else x
    y = rng.standard_normal((4, 5)).astype(dtype)
    return x, y, np.zeros((4, 5), dtype)


def test_raw_path_packs_unpacks_and_runs_the_kernel(raw):
    kernel = FakeKernel(_axpy)
    for scale, flag in ((2.0, True), (0.5, True), (3.0, False)):
        x, y, out = _inputs()
        with _launch.count_launches() as counts:
            _launch.launch(kernel, (2, 1), 32, FakeDeviceArray(x), FakeDeviceArray(y), scale,
                           flag, FakeDeviceArray(out))
        np.testing.assert_array_equal(out, scale * x + y if flag else y)
        assert counts == {"test_launch._axpy": 1}
    assert [name for name, _ in raw.compiled] == ["_axpy"]  # one signature, compiled once
    assert [launch[1:] for launch in raw.launched] == [((2, 1), (32,), 0)] * 3
    assert kernel.numba_launches == []


def test_raw_path_takes_strided_arrays_and_specialises_per_signature(raw):
    kernel = FakeKernel(_axpy)
    for dtype, strided in ((np.float32, True), (np.float64, False), (np.float32, True)):
        x, y, out = _inputs(dtype, strided)
        _launch.launch(kernel, 1, 8, FakeDeviceArray(x), FakeDeviceArray(y), np.float32(2),
                       np.bool_(True), FakeDeviceArray(out))
        np.testing.assert_allclose(out, 2 * x + y)
    layouts = [(sig[0].dtype.name, sig[0].layout) for _, sig in raw.compiled]
    assert layouts == [("float32", "A"), ("float64", "C")]


def test_numpy_arrays_a_given_stream_and_the_numba_setting_take_numbas_path(raw):
    kernel = FakeKernel(_axpy)
    x, y, out = _inputs()
    _launch.launch(kernel, 1, 8, x, y, 2.0, True, out)  # NumPy arrays on a GPU
    gx, gy, gout = (FakeDeviceArray(a) for a in _inputs())
    _launch.launch(kernel, 1, 8, gx, gy, 2.0, True, gout, stream="s")
    _launch.set_path("numba")
    _launch.launch(kernel, 1, 8, gx, gy, 2.0, True, gout)
    assert kernel.numba_launches == [(1, 8, 0, 0), (1, 8, "s", 0), (1, 8, 0, 0)]
    assert raw.compiled == [] and _launch.fallbacks == {}
    np.testing.assert_allclose(out, 2 * x + y)


def test_an_argument_the_raw_path_cannot_pack_falls_back_or_raises_when_strict(raw):
    def with_tuple(x, pair, out):
        out[...] = x * pair[0] + pair[1]

    kernel = FakeKernel(with_tuple)
    x, _, out = _inputs()
    before = _launch.path_counts["numba"]
    _launch.launch(kernel, 1, 8, FakeDeviceArray(x), (2.0, 1.0), FakeDeviceArray(out))
    np.testing.assert_allclose(out, 2 * x + 1)
    assert _launch.path_counts["numba"] == before + 1 and len(kernel.numba_launches) == 1
    [(name, _key)] = _launch.fallbacks
    assert name.startswith("test_launch.") and name.endswith(".with_tuple")
    assert "no raw launch" in _launch.fallbacks[(name, _key)]
    _launch.set_path("raw")
    with pytest.raises(RuntimeError, match="raw launch path cannot take"):
        _launch.launch(kernel, 1, 8, FakeDeviceArray(x), (2.0, 1.0), FakeDeviceArray(out))


def _scale_all(xs, outs, scale):
    """The kernels' Python twin over tuples: outs[t] = scale * xs[t]."""
    for x, out in zip(xs, outs, strict=True):
        out[...] = scale * x


def test_raw_path_takes_tuples_of_arrays(raw):
    """A tuple of CuPy arrays takes the raw path: its members packed one after the other,
    one compilation per member signature; a member of another layout is another one."""
    kernel = FakeKernel(_scale_all)
    rng = np.random.default_rng(2)
    for strided in (False, False, True):
        xs = [rng.standard_normal((3, 8) if strided else n).astype(np.float32)
              for n in (4, 0, 9)]
        if strided:
            xs = [x[:, ::2] for x in xs]
        outs = [np.zeros_like(x) for x in xs]
        _launch.launch(kernel, (2, 3), 32, tuple(map(FakeDeviceArray, xs)),
                       tuple(map(FakeDeviceArray, outs)), 2.0)
        for x, out in zip(xs, outs, strict=True):
            np.testing.assert_array_equal(out, 2 * x)
    assert len(raw.compiled) == 2 and len(raw.launched) == 3 and kernel.numba_launches == []
    assert _launch.fallbacks == {}
    _launch.set_path("numba")  # Numba's path gets the tuples too
    outs = [np.zeros(4, np.float32)]
    _launch.launch(kernel, 1, 8, (FakeDeviceArray(np.ones(4, np.float32)),),
                   (FakeDeviceArray(outs[0]),), 3.0)
    np.testing.assert_array_equal(outs[0], 3.0)
    assert len(kernel.numba_launches) == 1


def test_a_ptx_whose_parameters_differ_is_not_launched(raw, monkeypatch):
    monkeypatch.setattr(_launch, "_ptx", lambda kernel, argtypes: (
        ".visible .entry extra(\n .param .u64 p0,\n" +
        ",\n".join(f" .param .u{8 * s} p{i + 1}"
                   for i, s in enumerate(_launch.param_sizes(argtypes))) + "\n)"))
    kernel = FakeKernel(_axpy)
    x, y, out = _inputs()
    _launch.launch(kernel, 1, 8, FakeDeviceArray(x), FakeDeviceArray(y), 2.0, True,
                   FakeDeviceArray(out))
    assert len(kernel.numba_launches) == 1
    assert "the PTX of extra takes" in next(iter(_launch.fallbacks.values()))


def test_an_empty_grid_launches_nothing_and_counts_nothing(raw):
    kernel = FakeKernel(_axpy)
    x, y, out = (FakeDeviceArray(a) for a in _inputs())
    total = _launch.launches()
    with _launch.count_launches() as counts:
        _launch.launch(kernel, 0, 8, x, y, 2.0, True, out)
        _launch.launch(kernel, (3, 0), 8, x, y, 2.0, True, out)
    assert counts == {} and _launch.launches() == total
    assert raw.launched == [] and kernel.numba_launches == []


def test_count_launches_nests(raw):
    kernel = FakeKernel(_axpy)
    x, y, out = (FakeDeviceArray(a) for a in _inputs())
    total = _launch.launches()
    with _launch.count_launches() as outer:
        _launch.launch(kernel, 1, 8, x, y, 2.0, True, out)
        with _launch.count_launches() as inner:
            _launch.launch(kernel, 1, 8, x, y, 2.0, True, out)
        _launch.launch(kernel, 1, 8, x, y, 2.0, True, out)
    _launch.launch(kernel, 1, 8, x, y, 2.0, True, out)
    assert outer == {"test_launch._axpy": 3} and inner == {"test_launch._axpy": 1}
    assert _launch.launches() == total + 4
    assert _launch._recorders == ()


def test_set_path_refuses_unknown_paths():
    with pytest.raises(ValueError, match="expected one of auto, raw, numba"):
        _launch.set_path("cupy")


# ---- launch budgets (a GPU, or the CuPy stand-in under the simulator) --------------------------
# the kernels each pass of a public op's nk.kernels pair launches, from tests/op_facts.py
KERNEL_LAUNCHES = {case: launches for facts in OP_FACTS.values()
                   for case, launches in (facts.kernel_launches or {}).items()}


def _budget_cases(cupy):
    """(name, call, {kernel: launches}): the launches each op makes, pinned (the public ops'
    in tests/op_facts.py)."""
    from nnkit import kernels as K
    from nnkit._ext import scan_cuda

    rng = np.random.default_rng(0)

    def randn(*shape):
        return cupy.asarray(rng.standard_normal(shape).astype(np.float32))

    x, dy = randn(3, 6), randn(3, 6)
    _, sm_cache = K.softmax_forward(x)
    _, ln = K.layer_norm_forward(x, randn(6), randn(6), (6,))
    _, ln_plain = K.layer_norm_forward(x, None, None, (6,))
    T, B, D, H = 3, 2, 3, 4
    seq, dseq = randn(T, B, D), randn(T, B, H)
    rnn = [randn(H, D), randn(H, H), randn(H), randn(H)]
    lstm = [randn(4 * H, D), randn(4 * H, H), randn(4 * H), randn(4 * H)]
    gru = [randn(3 * H, D), randn(3 * H, H), randn(3 * H), randn(3 * H)]
    a = cupy.asarray(rng.uniform(0.5, 1, (2, 7, 3)).astype(np.float32))
    b, dh = randn(2, 7, 3), randn(2, 7, 3)
    _, scan_cache = K.linear_scan_forward(a, b)
    q = randn(1, 2, 5, 4)
    att, att_cache = K.attention_forward(q, q, q, is_causal=True)
    img = randn(2, 3, 4, 4)
    conv, conv_cache = K.conv2d_forward(img, randn(2, 3, 3, 3), padding=1)
    pool, pool_cache = K.max_pool2d_forward(img, 2)

    import nnkit as nk
    import nnkit.functional as F

    _, gelu_cache = K.gelu_forward(x)
    _, dropout_cache = K.dropout_forward(x, 0.1, 7)
    params = [nk.nn.Parameter(randn(3)) for _ in range(20)]
    for p in params:
        p.grad = randn(3)
    optimizers = {name: make(params) for name, make in (
        ("adam", lambda ps: nk.optim.Adam(ps)),
        ("amsgrad", lambda ps: nk.optim.AdamW(ps, amsgrad=True)),
        ("sgd", lambda ps: nk.optim.SGD(ps, lr=0.1, momentum=0.9)))}
    logits = nk.Tensor(x).requires_grad_()
    target = cupy.asarray(np.array([0, 5, -100]))

    def rows_scan():
        saved, scan_cuda.rows_min = scan_cuda.rows_min, 1
        try:
            K.linear_scan_forward(a, b)
        finally:
            scan_cuda.rows_min = saved

    rc = "recurrent_cuda."
    op_cases = [
        ("softmax forward", lambda: K.softmax_forward(x)),
        ("softmax backward", lambda: K.softmax_backward(dy, sm_cache)),
        ("layer_norm forward", lambda: K.layer_norm_forward(x, randn(6), randn(6), (6,))),
        ("layer_norm backward", lambda: K.layer_norm_backward(dy, ln)),
        ("layer_norm backward, no affine", lambda: K.layer_norm_backward(dy, ln_plain)),
        ("linear_scan forward", lambda: K.linear_scan_forward(a, b)),
        ("linear_scan backward", lambda: K.linear_scan_backward(dh, scan_cache)),
        ("linear_scan forward, a thread per sequence", rows_scan),
        ("attention forward", lambda: K.attention_forward(q, q, q, is_causal=True)),
        ("attention backward", lambda: K.attention_backward(att, att_cache)),
        ("conv2d forward", lambda: K.conv2d_forward(img, randn(2, 3, 3, 3), padding=1)),
        ("conv2d backward", lambda: K.conv2d_backward(conv, conv_cache)),
        ("max_pool2d forward", lambda: K.max_pool2d_forward(img, 2)),
        ("max_pool2d backward", lambda: K.max_pool2d_backward(pool, pool_cache)),
        ("gelu forward", lambda: K.gelu_forward(x)),
        ("gelu backward", lambda: K.gelu_backward(dy, gelu_cache)),
        ("dropout forward", lambda: K.dropout_forward(x, 0.1, 7)),
        ("dropout backward", lambda: K.dropout_backward(dy, dropout_cache)),
        ("mean cross_entropy forward and backward",
         lambda: F.cross_entropy(logits, target).backward()),
    ]
    assert {name for name, _ in op_cases} == set(KERNEL_LAUNCHES), "a pinned op case lacks a call"
    return [(name, call, KERNEL_LAUNCHES[name]) for name, call in op_cases] + [
        # one persistent launch per pass, whatever T (tests/test_recurrent_persistent.py)
        (f"rnn forward T={T}", lambda: K.rnn_forward(seq, None, *rnn),
         {rc + "_rnn_seq_fwd": 1}),
        (f"rnn forward+backward T={T}", lambda: K.rnn_backward(
            (dseq, None), K.rnn_forward(seq, None, *rnn)[1]),
         {rc + "_rnn_seq_fwd": 1, rc + "_rnn_seq_bwd": 1}),
        (f"lstm forward T={T}", lambda: K.lstm_forward(seq, None, None, *lstm),
         {rc + "_lstm_seq_fwd": 1}),
        (f"lstm forward+backward T={T}", lambda: K.lstm_backward(
            (dseq, None, None), K.lstm_forward(seq, None, None, *lstm)[1]),
         {rc + "_lstm_seq_fwd": 1, rc + "_lstm_seq_bwd": 1}),
        (f"gru forward+backward T={T}", lambda: K.gru_backward(
            (dseq, None), K.gru_forward(seq, None, *gru)[1]),
         {rc + "_gru_seq_fwd": 1, rc + "_gru_seq_bwd": 1}),
        # one launch per 17 (13, 22) parameters of a dtype and step count
        ("Adam step, 20 parameters", optimizers["adam"].step, {"optim_cuda.adam": 2}),
        ("AdamW AMSGrad step, 20 parameters", optimizers["amsgrad"].step,
         {"optim_cuda.adam_amsgrad": 2}),
        ("SGD momentum step, 20 parameters", optimizers["sgd"].step,
         {"optim_cuda._sgd_kernel": 1}),
    ]

@pytest.mark.cuda
def test_launch_budgets_on_gpu():
    """Each op makes the launches pinned here (a change to them is a change to this list)."""
    cupy = pytest.importorskip("cupy")
    problems = []
    for name, call, budget in _budget_cases(cupy):
        with _launch.count_launches() as counts:
            call()
        if dict(counts) != budget:
            problems.append(f"{name}: {dict(counts)} != {budget}")
    assert problems == []
