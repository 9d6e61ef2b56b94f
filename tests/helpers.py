"""Test helpers shared by every op family: hypothesis strategies for arrays, tolerances,
the kernel-vs-reference comparison, and the torch import that skips cleanly."""

from __future__ import annotations

import collections
import contextlib
import json
import re
import time
import tracemalloc

import numpy as np
import pytest
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

FLOAT_DTYPES = (np.float32, np.float64)


def tolerance(dtype, factor: float = 64.0) -> dict:
    """rtol/atol for comparing a kernel with its float64 twin: ``factor`` ulps of ``dtype``."""
    eps = float(np.finfo(dtype).eps)
    return {"rtol": factor * eps, "atol": factor * eps}


def assert_matches_reference(actual, expected, dtype=None, factor: float = 64.0, err_msg=""):
    """Assert a kernel's output equals its naive twin's within ``factor`` ulps of ``dtype``."""
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    assert actual.shape == expected.shape, f"shape {actual.shape} != {expected.shape}"
    dtype = dtype or actual.dtype
    assert actual.dtype == np.dtype(dtype), f"dtype {actual.dtype} != {np.dtype(dtype)}"
    np.testing.assert_allclose(
        actual.astype(np.float64), expected.astype(np.float64), err_msg=err_msg,
        **tolerance(dtype, factor),
    )


def float_dtypes():
    return st.sampled_from(FLOAT_DTYPES)


@st.composite
def arrays(draw, dtype=None, min_dims=1, max_dims=3, min_side=0, max_side=6,
           low=-5.0, high=5.0, allow_noncontiguous=True):
    """Bounded finite float arrays; sides include 0 and 1; sometimes a non-contiguous view.

    Non-contiguous views are drawn by slicing a larger array with a step of 2 on the last axis
    or by transposing, so kernels behind the public boundary see strided input.
    """
    dtype = draw(float_dtypes()) if dtype is None else dtype
    shape = draw(hnp.array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=min_side,
                                  max_side=max_side))
    elements = st.floats(low, high, allow_nan=False, allow_infinity=False,
                         allow_subnormal=False, width=np.dtype(dtype).itemsize * 8)
    layout = draw(st.sampled_from(["c", "strided", "transposed"])) if allow_noncontiguous else "c"
    if layout == "strided":
        big = draw(hnp.arrays(dtype, shape[:-1] + (2 * shape[-1],), elements=elements))
        return big[..., ::2]
    if layout == "transposed" and len(shape) >= 2:
        base = draw(hnp.arrays(dtype, shape[::-1], elements=elements))
        return base.T
    return draw(hnp.arrays(dtype, shape, elements=elements))


def import_torch():
    """Import torch or skip the test cleanly: torch is an optional test dependency."""
    return pytest.importorskip("torch")


def import_transformers():
    """Import transformers (and torch) or skip the test cleanly: both are optional test
    dependencies (for the Hugging Face checkpoint comparisons), never nnkit's."""
    import_torch()
    return pytest.importorskip("transformers")


def edit_config(folder, **fields):
    """Set fields of ``folder/config.json`` (a checkpoint folder); a value of None removes
    the field."""
    path = folder / "config.json"
    config = {**json.loads(path.read_text()), **fields}
    path.write_text(json.dumps({k: v for k, v in config.items() if v is not None}))


def peak_and_seconds(fn, *args, **kwargs):
    """``(result or the exception raised, peak bytes allocated, seconds)`` of one call:
    Python's and NumPy's allocations as tracemalloc sees them. For the hostile-input tests:
    a refusal must come before the memory (or the time) is spent."""
    tracemalloc.start()
    start = time.perf_counter()
    try:
        result = fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - the caller asserts on it
        result = exc
    finally:
        seconds = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return result, peak, seconds


# ---- CUDA kernels under Numba's simulator, in a child process -------------------------------
# The simulator must be enabled before numba.cuda is first imported, so a test file runs
# itself as a script with NUMBA_ENABLE_CUDASIM=1: its ``__main__`` calls
# ``run_simulator_cases`` and its parent-side fixture calls ``simulator_outcomes``.
# On a machine with an NVIDIA GPU, NNKIT_CUDA_CASES=device runs the same cases on the real
# device instead (NumPy arrays go to the kernels through Numba's automatic transfers).

def _cases_on_device() -> bool:
    import os

    return os.environ.get("NNKIT_CUDA_CASES") == "device"


def _count_simulator_swaps() -> None:
    """Make the simulator's swap of a module's ``cuda`` global safe for many threads.

    Numba's simulator runs each CUDA thread as a Python thread, and every call of a device
    function swaps the fake CUDA module into the globals of the function's module for the
    call (``swapped_cuda_module``). When that module is not the kernel's (layer norm's
    kernels call softmax_cuda's ``_block_sum``), the threads' swaps overlap: a thread entering
    while another's swap is active finds nothing to swap, the first one leaving puts the
    real ``numba.cuda`` back, and the second fails with "module 'numba.cuda' has no
    attribute 'syncthreads'" (seen in tests/test_cuda_sim.py's layer-norm case, now and
    then). Counted swaps: the first thread in swaps, the last one out restores.
    """
    import threading
    from contextlib import contextmanager

    from numba import cuda
    from numba.cuda.simulator import kernel

    lock, active = threading.Lock(), {}

    @contextmanager
    def counted_swap(fn, fake_cuda_module):
        glob = fn.__globals__
        with lock:
            entry = active.get(id(glob))
            if entry is None:
                real = {k: v for k, v in glob.items() if v is cuda}
                glob.update(dict.fromkeys(real, fake_cuda_module))
                entry = active[id(glob)] = [0, real]
            entry[0] += 1
        try:
            yield
        finally:
            with lock:
                entry[0] -= 1
                if entry[0] == 0:
                    glob.update(entry[1])
                    del active[id(glob)]

    kernel.swapped_cuda_module = counted_swap


def _lock_simulator_shared_arrays() -> None:
    """Make the simulator's ``cuda.shared.array`` give every thread of a block one array.

    The simulator finds a block's shared array by the calling line (``FakeCUDAShared.array``):
    it looks the line up and, when it is missing, allocates and stores a new array, with no
    lock. Two threads that both find the line missing each allocate their own array, and
    the block's threads no longer share it: a thread's writes are lost to the others and the
    kernel's result is wrong now and then: a wrong dQ of the attention kernels in one CI run,
    a wrong dK once in 7 rounds of four attention cases here, and no failure in 25 rounds
    with the lock. Locked here: the lookup and the allocation are one step.
    """
    import sys
    import threading

    from numba.cuda.simulator import kernelapi

    lock = threading.Lock()
    unlocked = kernelapi.FakeCUDAShared.array

    def locked_array(self, shape, dtype):
        if shape == 0:  # dynamic shared memory: one buffer already
            return unlocked(self, shape, dtype)
        caller = sys._getframe(1)
        line = (caller.f_code.co_filename, caller.f_lineno)
        with lock:
            array = self._allocations.get(line)
            if array is None:
                if isinstance(dtype, kernelapi.types.Type):
                    dtype = kernelapi.numpy_support.as_dtype(dtype)
                array = self._allocations[line] = kernelapi.np.empty(shape, dtype)
        return array

    kernelapi.FakeCUDAShared.array = locked_array


def run_simulator_cases(cases: dict, result_path) -> None:
    """Child side: run each zero-argument case; write {name: "ok" or traceback} as JSON."""
    import json
    import sys
    import traceback
    import warnings
    from pathlib import Path

    from numba import config, cuda

    if _cases_on_device():
        if config.ENABLE_CUDASIM or not cuda.is_available():
            raise SystemExit("NNKIT_CUDA_CASES=device but no real CUDA device in the child")
        warnings.filterwarnings("ignore", message=".*(Grid size|Host array).*")
    elif not config.ENABLE_CUDASIM:
        raise SystemExit("NUMBA_ENABLE_CUDASIM=1 is not in effect in the child")
    else:
        _count_simulator_swaps()
        _lock_simulator_shared_arrays()
    sys.setswitchinterval(1e-4)  # the simulator runs a Python thread per CUDA thread
    results = {}
    for name, case in cases.items():
        try:
            case()
            results[name] = "ok"
        except Exception:
            results[name] = traceback.format_exc()
    Path(result_path).write_text(json.dumps(results))


def simulator_outcomes(test_file, tmp_dir) -> dict:
    """Parent side: run ``test_file`` as a script under NUMBA_ENABLE_CUDASIM=1 (or on the
    real GPU with NNKIT_CUDA_CASES=device) and return its case outcomes; fails the test if
    the child itself fails."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    result_path = Path(tmp_dir) / "results.json"
    env = dict(os.environ)
    if _cases_on_device():
        env.pop("NUMBA_ENABLE_CUDASIM", None)
    else:
        env["NUMBA_ENABLE_CUDASIM"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(root), str(root / "tests"), os.environ.get("PYTHONPATH")) if p)
    proc = subprocess.run([sys.executable, str(Path(test_file).resolve()), str(result_path)],
                          env=env, cwd=root, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0 or not result_path.exists():
        pytest.fail(f"the CUDA-case child failed (exit {proc.returncode}):\n"
                    f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return json.loads(result_path.read_text())


# ---- all device work of a block, on the CuPy stand-in ---------------------------------------

class DeviceWork:
    """What a block ran on the (stand-in) device: ``numba`` (kernel name -> launches, from
    ``nnkit._ext._launch``) and ``cupy`` (kind -> count, the stand-in's
    ``count_operations``: ``kernel:*``, ``memset:*``, ``memcpy:*``)."""

    def __init__(self, numba, cupy):
        self.numba, self.cupy = numba, cupy

    @property
    def launches(self) -> int:
        """Numba launches."""
        return sum(self.numba.values())

    @property
    def cupy_kernels(self) -> int:
        return sum(n for k, n in self.cupy.items() if k.startswith("kernel:"))

    @property
    def kernels(self) -> int:
        """Every device kernel: Numba launches and CuPy's kernels (memsets and copies left
        out, as the GPU profiler's count in benchmarks/bench_gpu.py)."""
        return self.launches + self.cupy_kernels

    @property
    def memops(self) -> int:
        return sum(n for k, n in self.cupy.items() if not k.startswith("kernel:"))

    def summary(self) -> dict:
        return {"numba": self.launches, "kernels": self.kernels, "memops": self.memops}


@contextlib.contextmanager
def count_device_work():
    """Yield a ``DeviceWork`` of the Numba launches and CuPy operations made in the block
    (the CuPy stand-in only: real CuPy has no such counter, so AssertionError there)."""
    import cupy

    from nnkit._ext._launch import count_launches

    assert cupy.__version__.endswith("stand-in"), "count_device_work needs the CuPy stand-in"
    with count_launches() as numba, cupy.count_operations() as ops:
        yield DeviceWork(numba, ops)


# ---- the skipped tests, counted by what they need (tests/conftest.py prints the summary) -----
TORCH_COMMAND = "pip install torch==2.13.0, then python -m pytest"
GPU_COMMAND = ('on a machine with one: pip install -e ".[test,cuda]", then python -m pytest '
               '-m cuda; README, Development')
_NEEDS = {
    # pytest.importorskip("torch") (import_torch): "could not import 'torch': No module ..."
    "torch": re.compile(r"could not import 'torch[.']"),
    # the cuda marker (conftest), importorskip("cupy"), torch without CUDA
    "gpu": re.compile(r"cuda marker|could not import 'cupy[.']|torch has no CUDA|NVIDIA GPU"),
}


def skip_category(reason: str) -> str:
    """What a skipped test needs, from its skip reason: 'torch', 'gpu' or 'other'."""
    return next((need for need, pattern in _NEEDS.items() if pattern.search(reason)), "other")


def skip_summary(reasons: list[str]) -> list[str]:
    """The lines that end a test run: how many tests were skipped, for want of what, and the
    command that runs them (no lines when nothing was skipped)."""
    if not reasons:
        return []
    counts = collections.Counter(skip_category(reason) for reason in reasons)
    parts = []
    if counts["torch"]:
        parts.append(f"{counts['torch']} need torch ({TORCH_COMMAND})")
    if counts["gpu"]:
        parts.append(f"{counts['gpu']} need an NVIDIA GPU with CuPy ({GPU_COMMAND})")
    if counts["other"]:
        parts.append(f"{counts['other']} for other reasons:")
    other = collections.Counter(reason for reason in reasons if skip_category(reason) == "other")
    tests = "test" if len(reasons) == 1 else "tests"
    return [f"{len(reasons)} {tests} skipped: " + "; ".join(parts),
            *(f"  {n} x {reason}" for reason, n in other.most_common())]


def fit_one_process(model, optimizer, X, y, batch_size, epochs, shuffle=True, random_state=0):
    """The reference of the data-parallel tests: the usual loop, cross-entropy with Adam or
    SGD, on ``fit_data_parallel``'s documented global batch schedule. Returns the losses."""
    import nnkit.functional as F
    from nnkit.training import minibatches

    rng = np.random.default_rng(random_state)
    losses = []
    for _ in range(epochs):
        for idx in minibatches(len(X), batch_size, shuffle, rng):
            optimizer.zero_grad()
            loss = F.cross_entropy(model(X[idx]), y[idx])
            loss.backward()
            optimizer.step()
            losses.append(float(loss.item()))
    return losses
