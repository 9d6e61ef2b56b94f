"""End to end on the GPU: models moved with ``Module.to('cuda')`` train on CuPy arrays with
nnkit's Numba CUDA kernels and give the CPU's numbers, without host round trips in a step.

The GPU tests carry the ``cuda`` marker (tests/conftest.py skips them without a real GPU and
CuPy); they also run without a GPU on the NumPy-backed CuPy stand-in under Numba's simulator
(tests/test_gpu_stand_in.py), where the guards below hook the simulator's device arrays and
kernels. The tests of ``to('cpu')``, of the error without CuPy and of the reference
generator run everywhere.

What "no host round trip" is checked against (``host_traffic``, recorded while a step runs):

- device-to-host copies and host waits made through CuPy: every ``ndarray.get`` (and so
  ``cupy.asnumpy``, ``float``/``int``/``bool``/``.item()`` of a device array, the size of a
  ``nonzero``), ``Device.synchronize``: all of them call ``cupy._core.syncdetect.
  _declare_synchronize``, which the fixture wraps (the hook behind the deprecated
  ``cupyx.allow_synchronize``);
- Numba's ``DeviceNDArray.copy_to_host``;
- host waits in Numba: ``Stream.synchronize`` and ``Context.synchronize`` (Numba
  synchronises the producer's stream whenever it imports a CuPy array through
  ``__cuda_array_interface__`` without ``sync=False``);
- host-to-device uploads: ``cupy.asarray``/``cupy.array`` of host data and
  ``numba.cuda.to_device``.

Not seen: copies made inside C code that does not go through those functions (CuPy's C-level
``ndarray.set``, driver calls from other libraries). ``test_the_guard_sees_copies_and_waits``
checks that the hooks fire on the installed CuPy and Numba.
"""

from __future__ import annotations

import gc
import sys
import traceback
from contextlib import nullcontext

import numpy as np
import pytest

import nnkit as nk
from nnkit import functional as F
from nnkit import optim
from nnkit.models import ViT

cuda = pytest.mark.cuda
STEPS = 3


# ----- host-traffic and kernel-launch recorders --------------------------------------------
class HostTraffic:
    """What crossed between host and GPU, or made the host wait, while active (``with``)."""

    def __init__(self):
        self.active = False
        self.d2h, self.h2d, self.waits = [], [], []

    def note(self, kind: str, what: str) -> None:
        if self.active:
            where = "".join(traceback.format_stack(limit=12)[:-2])
            getattr(self, kind).append(f"{what}\n{where}")

    def __enter__(self):
        self.active = True
        return self

    def __exit__(self, *exc):
        self.active = False
        return False


def _recording(traffic, kind, what, fn):
    def wrapper(*args, **kwargs):
        traffic.note(kind, what)
        return fn(*args, **kwargs)

    return wrapper


def _is_host_data(value) -> bool:
    return not hasattr(value, "__cuda_array_interface__")


@pytest.fixture
def host_traffic(monkeypatch):
    """A ``HostTraffic`` wired into CuPy and Numba (see the module docstring)."""
    cupy = pytest.importorskip("cupy")
    from cupy._core import syncdetect
    from numba import cuda as numba_cuda

    traffic = HostTraffic()
    monkeypatch.setattr(syncdetect, "_declare_synchronize", _recording(
        traffic, "d2h", "CuPy device-to-host copy or device synchronisation",
        syncdetect._declare_synchronize))
    device_array, waiters = _numba_device_array_and_waiters()
    monkeypatch.setattr(device_array, "copy_to_host", _recording(
        traffic, "d2h", "Numba copy_to_host", device_array.copy_to_host))
    for cls in waiters:
        monkeypatch.setattr(cls, "synchronize", _recording(
            traffic, "waits", f"Numba {cls.__name__}.synchronize (the host waits for the GPU)",
            cls.synchronize))
    monkeypatch.setattr(numba_cuda, "to_device", _recording(
        traffic, "h2d", "numba.cuda.to_device", numba_cuda.to_device))
    for name in ("asarray", "array"):
        original = getattr(cupy, name)

        def upload(obj, *args, _original=original, _name=name, **kwargs):
            if _is_host_data(obj):
                traffic.note("h2d", f"cupy.{_name} of host data ({type(obj).__name__})")
            return _original(obj, *args, **kwargs)

        monkeypatch.setattr(cupy, name, upload)
    return traffic


class KernelCounter:
    """Numba CUDA launches (``CUDADispatcher.call``) and compiled overloads."""

    def __init__(self, dispatcher_type):
        self.dispatcher_type = dispatcher_type
        self.launches = 0

    def overloads(self) -> int:
        """Compiled (kernel, signature) pairs held by every live Numba CUDA dispatcher."""
        return sum(len(getattr(o, "overloads", ())) for o in gc.get_objects()  # type(): no
                   if issubclass(type(o), self.dispatcher_type))  # proxy is touched


def _numba_device_array_and_waiters():
    """Numba's device-array class and the classes whose ``synchronize`` makes the host wait
    (the simulator's stand-ins under NUMBA_ENABLE_CUDASIM=1, where the CuPy stand-in runs)."""
    from numba import config
    from numba import cuda as numba_cuda

    if config.ENABLE_CUDASIM:
        from numba.cuda.simulator import api
        from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

        return FakeCUDAArray, (api.stream, numba_cuda)  # numba.cuda.synchronize()
    from numba.cuda.cudadrv import devicearray, driver

    return devicearray.DeviceNDArrayBase, (driver.Stream, driver.Context)


@pytest.fixture
def kernels(monkeypatch):
    """Counts Numba CUDA launches (under the simulator: its kernels' calls; no compiles)."""
    from numba import config

    if config.ENABLE_CUDASIM:
        from numba.cuda.simulator.kernel import FakeCUDAKernel as dispatcher
        launch = "__call__"
    else:
        from numba.cuda.dispatcher import CUDADispatcher as dispatcher
        launch = "call"
    counter = KernelCounter(dispatcher)
    call = getattr(dispatcher, launch)

    def counting_call(self, *args, **kwargs):
        counter.launches += 1
        return call(self, *args, **kwargs)

    monkeypatch.setattr(dispatcher, launch, counting_call)
    return counter


def _report(records) -> str:
    return f"{len(records)} event(s); the first:\n{records[0] if records else ''}"


# ----- the models ----------------------------------------------------------------------------
class LastStep(nk.nn.Module):
    """A recurrent layer, its last step's output, a linear head: (B, T, F) -> (B, classes)."""

    def __init__(self, layer, width, classes):
        super().__init__()
        self.layer = layer
        self.head = nk.nn.Linear(width, classes)

    def forward(self, x):
        out = self.layer(x)
        out = out[0] if isinstance(out, tuple) else out  # RNN, LSTM, GRU: (output, state)
        return self.head(out[:, -1])


class Encoder(nk.nn.Module):
    """Linear embedding, one GELU TransformerEncoderLayer, mean over T, linear head."""

    def __init__(self, dropout):
        super().__init__()
        self.embed = nk.nn.Linear(6, 16)
        self.layer = nk.nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=dropout,
                                                   activation="gelu", batch_first=True)
        self.head = nk.nn.Linear(16, 3)

    def forward(self, x):
        return self.head(self.layer(self.embed(x)).mean(axis=1))


def _mlp():
    return nk.nn.Sequential(nk.nn.Linear(10, 32), nk.nn.ReLU(), nk.nn.Linear(32, 4))


def _cnn():
    return nk.nn.Sequential(nk.nn.Conv2d(1, 4, 3, padding=1), nk.nn.ReLU(), nk.nn.MaxPool2d(2),
                            nk.nn.Flatten(), nk.nn.Linear(4 * 4 * 4, 3))


SEQ, IMG = (8, 5, 6), (8, 1, 8, 8)
# name: (builder, input shape, classes, optimizer for the float64 comparison)
CASES = {
    "mlp": (_mlp, (16, 10), 4, lambda ps: optim.Adam(ps, lr=1e-2)),
    "cnn": (_cnn, IMG, 3, lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9)),
    "lstm": (lambda: LastStep(nk.nn.LSTM(6, 8, batch_first=True), 8, 3), SEQ, 3,
             lambda ps: optim.Adam(ps, lr=1e-2)),
    "gru": (lambda: LastStep(nk.nn.GRU(6, 8, batch_first=True, bidirectional=True), 16, 3),
            SEQ, 3, lambda ps: optim.Adam(ps, lr=1e-2)),
    "mingru": (lambda: LastStep(nk.nn.MinGRU(6, 8), 8, 3), SEQ, 3,
               lambda ps: optim.Adam(ps, lr=1e-2)),
    "lru": (lambda: LastStep(nk.nn.LRU(6, 8, r_min=0.5, r_max=0.9), 6, 3), SEQ, 3,
            lambda ps: optim.Adam(ps, lr=1e-2)),
    "transformer": (lambda: Encoder(0.0), SEQ, 3, lambda ps: optim.AdamW(ps, lr=1e-2)),
    "vit": (lambda: ViT(8, 4, 1, 3, dim=16, depth=1, heads=2, mlp_dim=32), IMG, 3,
            lambda ps: optim.Adam(ps, lr=1e-2)),
}


def _build(case, dtype, seed=0):
    """The case's model, built on the CPU from ``seed``, cast to ``dtype``."""
    nk.manual_seed(seed)
    return CASES[case][0]().to(dtype)


def _data(case, dtype, seed=1):
    _, shape, classes, _ = CASES[case]
    rng = np.random.default_rng(seed)
    return rng.standard_normal(shape).astype(dtype), rng.integers(0, classes, shape[0])


def _train(model, opt, X, y, steps=STEPS, traffic=None, kernels=None):
    """``steps`` steps of forward, cross-entropy, backward, optimizer step; the losses.

    Steps after the first run inside ``traffic`` (the first compiles the kernels);
    ``kernels`` gets ``compiles`` (new overloads after step 1) and ``per_step`` launches.
    """
    losses, per_step, compiled_after_first = [], [], None
    for i in range(steps):
        launches = kernels.launches if kernels else 0
        with traffic if (traffic is not None and i > 0) else nullcontext():
            opt.zero_grad()
            loss = F.cross_entropy(model(X), y)
            loss.backward()
            opt.step()
        losses.append(loss.data)
        if kernels:
            per_step.append(kernels.launches - launches)
            if i == 0:
                compiled_after_first = kernels.overloads()
    if kernels:
        kernels.per_step = per_step
        kernels.compiles = kernels.overloads() - compiled_after_first
    return [float(np.asarray(_host(v))) for v in losses]


def _host(a):
    return a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else a


def _state_arrays(opt):
    return [v for state in opt.state.values() for v in state.values() if hasattr(v, "shape")]


# ----- on the GPU ---------------------------------------------------------------------------
@cuda
@pytest.mark.parametrize("case", list(CASES))
def test_training_on_the_gpu_matches_the_cpu(case, host_traffic, kernels):
    """float64: the same model (same seed) trained 3 steps on both; losses and parameters
    agree to 1e-10, everything lives in CuPy arrays, no step copies a value to the host or
    compiles a kernel after the first, and every step launches the same Numba kernels."""
    cupy = pytest.importorskip("cupy")
    X, y = _data(case, np.float64)
    cpu, gpu = _build(case, np.float64), _build(case, np.float64).to("cuda")
    make_opt = CASES[case][3]
    cpu_opt, gpu_opt = make_opt(cpu.parameters()), make_opt(gpu.parameters())
    cpu_losses = _train(cpu, cpu_opt, X, y)
    gpu_losses = _train(gpu, gpu_opt, cupy.asarray(X), cupy.asarray(y), traffic=host_traffic,
                        kernels=kernels)

    assert host_traffic.d2h == [], "a step copied to the host: " + _report(host_traffic.d2h)
    for name, p in gpu.named_parameters():
        assert isinstance(p.data, cupy.ndarray) and isinstance(p.grad, cupy.ndarray), name
    assert _state_arrays(gpu_opt), "every case's optimizer keeps state"
    for v in _state_arrays(gpu_opt):
        assert isinstance(v, cupy.ndarray), type(v)
    assert kernels.compiles == 0, f"{kernels.compiles} Numba kernel(s) compiled after step 1"
    assert kernels.per_step[1] == kernels.per_step[2] > 0, kernels.per_step
    np.testing.assert_allclose(gpu_losses, cpu_losses, rtol=1e-10)
    for (name, pc), pg in zip(cpu.named_parameters(), gpu.parameters(), strict=True):
        # atol: entries whose gradient is zero but for rounding (the key bias of attention)
        # take Adam steps of that noise, which another summation order changes
        np.testing.assert_allclose(pg.data.get(), pc.data, rtol=1e-10, atol=1e-10,
                                   err_msg=name)


@cuda
@pytest.mark.parametrize("case", list(CASES))
def test_a_step_neither_waits_for_the_gpu_nor_uploads(case, host_traffic):
    """Steps 2 and 3 make the host wait for no stream (Numba imports CuPy arrays without
    synchronising) and upload no host array (constants are made on the device)."""
    cupy = pytest.importorskip("cupy")
    X, y = _data(case, np.float32)
    model = _build(case, np.float32).to("cuda")
    _train(model, CASES[case][3](model.parameters()), cupy.asarray(X), cupy.asarray(y),
           traffic=host_traffic)
    assert host_traffic.waits == [], "the host waited: " + _report(host_traffic.waits)
    assert host_traffic.h2d == [], "a step uploaded host data: " + _report(host_traffic.h2d)


@cuda
@pytest.mark.parametrize("case", list(CASES))
def test_a_float32_step_stays_in_float32(case, host_traffic):
    """float32 with SGD (momentum): losses and parameters agree with the CPU to 1e-4, and
    every tensor of the graph, every gradient and every optimizer buffer is float32."""
    cupy = pytest.importorskip("cupy")
    X, y = _data(case, np.float32)
    cpu, gpu = _build(case, np.float32), _build(case, np.float32).to("cuda")
    cpu_opt = optim.SGD(cpu.parameters(), lr=0.05, momentum=0.9)
    gpu_opt = optim.SGD(gpu.parameters(), lr=0.05, momentum=0.9)
    cpu_losses = _train(cpu, cpu_opt, X, y)
    Xg, yg = cupy.asarray(X), cupy.asarray(y)
    gpu_losses = _train(gpu, gpu_opt, Xg, yg, traffic=host_traffic)
    loss = F.cross_entropy(gpu(Xg), yg)
    dtypes = {t.dtype for t in _graph(loss) if t.dtype.kind in "fc"}
    assert dtypes <= {np.dtype(np.float32), np.dtype(np.complex64)}, dtypes
    loss.backward()
    for name, p in gpu.named_parameters():
        assert p.data.dtype == np.float32 and p.grad.dtype == np.float32, name
    assert all(v.dtype == np.float32 for v in _state_arrays(gpu_opt))
    assert host_traffic.d2h == [], _report(host_traffic.d2h)
    np.testing.assert_allclose(gpu_losses, cpu_losses, rtol=1e-4)
    for (name, pc), pg in zip(cpu.named_parameters(), gpu.parameters(), strict=True):
        np.testing.assert_allclose(pg.data.get(), pc.data, rtol=1e-4, atol=1e-5, err_msg=name)


def _graph(root):
    """Every tensor of the graph that made ``root`` (root included)."""
    seen, stack, out = set(), [root], []
    while stack:
        t = stack.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        out.append(t)
        if t._ctx is not None:
            stack.extend(t._ctx.parents)
    return out


@cuda
def test_transformer_dropout_on_the_gpu(host_traffic):
    """Dropout p=0.2 (the layer's Dropouts and the fused attention's): training is
    reproducible under ``nk.manual_seed``, draws its masks on the device, and eval mode
    gives the CPU's logits."""
    cupy = pytest.importorskip("cupy")
    X, y = _data("transformer", np.float64)
    Xg, yg = cupy.asarray(X), cupy.asarray(y)
    runs = []
    for _ in range(2):
        nk.manual_seed(0)
        model = Encoder(0.2).to(np.float64).to("cuda")
        opt = optim.Adam(model.parameters(), lr=1e-2)
        nk.manual_seed(5)
        runs.append(_train(model, opt, Xg, yg, traffic=host_traffic))
    assert runs[0] == runs[1] and np.all(np.isfinite(runs[0]))
    assert host_traffic.d2h == [], _report(host_traffic.d2h)
    nk.manual_seed(0)
    cpu = Encoder(0.2).to(np.float64).eval()
    nk.manual_seed(0)
    gpu = Encoder(0.2).to(np.float64).to("cuda").eval()
    np.testing.assert_allclose(gpu(Xg).data.get(), cpu(X).data, rtol=1e-10, atol=1e-12)
    gpu.train()
    with nk.no_grad():
        assert not np.allclose(gpu(Xg).data.get(), cpu(X).data)  # the masks do act


@cuda
def test_dropout_masks_are_drawn_on_the_device(host_traffic):
    cupy = pytest.importorskip("cupy")
    x = nk.tensor(cupy.ones((200, 100), dtype=cupy.float32), requires_grad=True)
    outs = []
    for _ in range(2):
        nk.manual_seed(3)
        with host_traffic:
            outs.append(F.dropout(x, 0.25))
    a = outs[0].data
    assert isinstance(a, cupy.ndarray) and a.dtype == np.float32
    cupy.testing.assert_array_equal(a, outs[1].data)
    values = np.unique(a.get())
    np.testing.assert_allclose(values, [0.0, 1 / 0.75], rtol=1e-6)
    assert abs(float((a == 0).mean()) - 0.25) < 0.02
    outs[0].sum().backward()
    cupy.testing.assert_array_equal(x.grad, a)
    assert host_traffic.d2h == host_traffic.h2d == [], _report(host_traffic.d2h +
                                                                host_traffic.h2d)


@cuda
def test_uniform_on_the_gpu_matches_its_numpy_twin():
    cupy = pytest.importorskip("cupy")
    from nnkit._random import uniform

    u = uniform((3, 5), like=cupy.empty(0), rng=np.random.default_rng(7))
    seed = int(np.random.default_rng(7).integers(0, 2**63 - 1))
    assert u.dtype == np.float64
    np.testing.assert_array_equal(u.get(), splitmix_uniform(seed, (3, 5)))


@cuda
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_on_the_gpu_matches_the_cpu(approximate):
    cupy = pytest.importorskip("cupy")
    x = np.concatenate([np.linspace(-12, 12, 49), [-30.0, 30.0, 0.0]])
    cpu, gpu = nk.tensor(x, requires_grad=True), nk.tensor(cupy.asarray(x), requires_grad=True)
    yc, yg = F.gelu(cpu, approximate), F.gelu(gpu, approximate)
    (yc * yc).sum().backward()
    (yg * yg).sum().backward()
    assert isinstance(yg.data, cupy.ndarray)
    np.testing.assert_allclose(yg.data.get(), yc.data, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(gpu.grad.get(), cpu.grad, rtol=1e-12, atol=1e-15)


@cuda
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cross_entropy_on_the_gpu_matches_the_cpu(dtype, host_traffic):
    cupy = pytest.importorskip("cupy")
    rng = np.random.default_rng(2)
    logits = rng.standard_normal((9, 5)).astype(dtype)
    target = np.array([0, 4, -100, 2, 2, 1, -100, 3, 0])
    cpu = nk.tensor(logits, requires_grad=True)
    gpu = nk.tensor(cupy.asarray(logits), requires_grad=True)
    lc = F.cross_entropy(cpu, target)
    with host_traffic:
        lg = F.cross_entropy(gpu, cupy.asarray(target))
        (lg * 3.0).backward()
    (lc * 3.0).backward()
    assert host_traffic.d2h == [], _report(host_traffic.d2h)
    assert lg.dtype == dtype and gpu.grad.dtype == dtype
    tol = {"rtol": 1e-5, "atol": 1e-6} if dtype == np.float32 else {"rtol": 1e-12}
    np.testing.assert_allclose(float(lg.data), float(lc.data), **tol)
    np.testing.assert_allclose(gpu.grad.get(), cpu.grad, **tol)


@cuda
def test_cross_entropy_on_the_gpu_edge_cases():
    """Every row ignored: NaN loss and zero gradients (as the CPU); a class out of range:
    NaN (the GPU path does not stop to read the target back)."""
    cupy = pytest.importorskip("cupy")
    x = nk.tensor(cupy.zeros((3, 4), dtype=cupy.float32), requires_grad=True)
    loss = F.cross_entropy(x, cupy.full(3, -100))
    loss.backward()
    assert np.isnan(float(loss.data)) and float(abs(x.grad).max()) == 0.0
    assert np.isnan(float(F.cross_entropy(x, cupy.array([0, 4, 1])).data))
    with pytest.raises(TypeError, match="target must be a GPU array like logits, got a NumPy"):
        F.cross_entropy(x, np.array([0, 1, 2]))


@cuda
def test_an_optimizer_built_before_the_move_follows_its_parameters():
    """Adam stepped once on the CPU, the model moved to the GPU, one step there, moved back,
    one more step: the numbers of three CPU steps, the state where the parameters are."""
    cupy = pytest.importorskip("cupy")
    X, y = _data("mlp", np.float64)
    ref = _build("mlp", np.float64)
    ref_losses = _train(ref, optim.Adam(ref.parameters(), lr=1e-2), X, y)
    model = _build("mlp", np.float64)
    opt = optim.Adam(model.parameters(), lr=1e-2)
    losses = _train(model, opt, X, y, steps=1)
    losses += _train(model.to("cuda"), opt, cupy.asarray(X), cupy.asarray(y), steps=1)
    assert all(isinstance(v, cupy.ndarray) for v in _state_arrays(opt))
    losses += _train(model.cpu(), opt, X, y, steps=1)
    assert all(isinstance(v, np.ndarray) for v in _state_arrays(opt))
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-10)
    for pr, p in zip(ref.parameters(), model.parameters(), strict=True):
        assert isinstance(p.data, np.ndarray)
        np.testing.assert_allclose(p.data, pr.data, rtol=1e-10, atol=1e-12)


@cuda
def test_to_moves_buffers_and_devices(host_traffic):
    cupy = pytest.importorskip("cupy")
    model = nk.nn.Linear(3, 2)
    model.register_buffer("running", np.arange(3, dtype=np.float32))
    weight = model.weight
    assert model.to("cuda:0") is model and model.weight is weight
    assert isinstance(model.running, cupy.ndarray) and isinstance(weight.data, cupy.ndarray)
    assert model.weight.data.device.id == 0
    before = weight.data
    assert model.cuda(0).weight.data is before  # already there: no copy
    with pytest.raises(ValueError, match="GPU"):
        model.to(f"cuda:{cupy.cuda.runtime.getDeviceCount()}")
    model.cpu()
    np.testing.assert_array_equal(model.running, np.arange(3, dtype=np.float32))
    assert isinstance(weight.data, np.ndarray)


@cuda
def test_the_guard_sees_copies_and_waits(host_traffic):
    """The recorders of ``host_traffic`` fire on the installed CuPy and Numba."""
    cupy = pytest.importorskip("cupy")
    from numba import cuda as numba_cuda

    a = cupy.ones(4)
    view = numba_cuda.as_cuda_array(a, sync=False)
    with host_traffic:
        float(a.sum())
        view.copy_to_host()
        numba_cuda.synchronize()
        cupy.asarray(np.ones(3))
    assert any(r.startswith("CuPy") for r in host_traffic.d2h), host_traffic.d2h
    assert any(r.startswith("Numba copy_to_host") for r in host_traffic.d2h), host_traffic.d2h
    assert host_traffic.waits and host_traffic.h2d
    seen = len(host_traffic.d2h)
    float(a.sum())  # outside the block: not recorded
    assert len(host_traffic.d2h) == seen


# ----- everywhere ----------------------------------------------------------------------------
def splitmix_uniform(seed, shape):
    """NumPy twin of ``nnkit._random.uniform``'s GPU kernel."""
    i = np.arange(1, int(np.prod(shape)) + 1, dtype=np.uint64)
    z = np.uint64(seed) + i * np.uint64(0x9E3779B97F4A7C15)  # uint64 arrays wrap silently
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z ^= z >> np.uint64(31)
    return ((z >> np.uint64(11)).astype(np.float64) * 2.0**-53).reshape(shape)


def test_splitmix_twin_gives_the_published_sequence():
    """splitmix64 seeded with 0 starts 0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4 (Vigna's
    reference implementation): the twin, and so the kernel it checks, uses its constants."""
    expected = np.array([0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4], dtype=np.uint64)
    np.testing.assert_array_equal(splitmix_uniform(0, (2,)),
                                  (expected >> np.uint64(11)).astype(np.float64) * 2.0**-53)


def _model_with_buffer():
    model = nk.nn.Sequential(nk.nn.Linear(3, 4), nk.nn.ReLU(), nk.nn.Linear(4, 2))
    model.register_buffer("steps", np.zeros(2, dtype=np.int64))
    model.register_buffer("scale", np.ones(2, dtype=np.float32))
    return model


def test_to_cpu_keeps_parameters_and_arrays_in_place():
    model = _model_with_buffer()
    params = list(model.parameters())
    arrays = [p.data for p in params]
    for p in params:
        p.grad = np.ones_like(p.data)
    assert model.to("cpu") is model and model.cpu() is model and model.to() is model
    assert list(model.parameters()) == params
    assert all(p.data is a for p, a in zip(params, arrays, strict=True))
    assert all(p.grad is None for p in params)
    assert model.to("CPU") is model


def test_to_casts_floating_parameters_and_buffers():
    model = _model_with_buffer()
    assert model.to(np.float64) is model
    assert {p.dtype for p in model.parameters()} == {np.dtype(np.float64)}
    assert model.scale.dtype == np.float64 and model.steps.dtype == np.int64
    model.to("cpu", dtype="float32")
    assert {p.dtype for p in model.parameters()} == {np.dtype(np.float32)}
    assert model.scale.dtype == np.float32 and model.steps.dtype == np.int64


@pytest.mark.parametrize("device", ["tpu", "cuda:", "cuda:x", "cuda:-1", "", "gpu:0"])
def test_to_rejects_unknown_devices(device):
    with pytest.raises(ValueError, match=r"'cpu', 'cuda' or 'cuda:N'.*got"):
        nk.nn.Linear(2, 2).to(device)


@pytest.mark.parametrize("call", [
    lambda m: m.to(3), lambda m: m.to(["cuda"]), lambda m: m.to("cpu", dtype=np.int32),
    lambda m: m.cuda("0"), lambda m: m.cuda(True),
])
def test_to_rejects_wrong_types(call):
    with pytest.raises(TypeError, match="got"):
        call(nk.nn.Linear(2, 2))


@pytest.mark.parametrize("call", [lambda m: m.to("cuda"), lambda m: m.to("cuda:0"),
                                  lambda m: m.cuda(), lambda m: m.cuda(0)])
def test_to_cuda_without_cupy_says_how_to_get_it(monkeypatch, call):
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy raises ImportError
    model = nk.nn.Linear(2, 2)
    weight = model.weight.data
    with pytest.raises(RuntimeError, match=r'CuPy.*pip install "nnkit\[cuda\]".*GPU'):
        call(model)
    assert model.weight.data is weight  # nothing moved


def test_optimizer_state_stays_in_place_when_nothing_moves():
    X, y = _data("mlp", np.float32)
    model = _build("mlp", np.float32)
    opt = optim.Adam(model.parameters(), lr=1e-2)
    _train(model, opt, X, y, steps=1)
    state = _state_arrays(opt)
    _train(model.to("cpu"), opt, X, y, steps=1)
    assert all(a is b for a, b in zip(state, _state_arrays(opt), strict=True))
