"""Shared pytest setup: hypothesis profiles, the ``cuda`` marker, torch availability.

Profiles: ``dev`` (default, 50 examples), ``ci`` (selected when the CI variable is set:
fewer examples, derandomized so a CI run is reproducible), ``thorough`` (1000 examples,
for a long fuzzing run: ``HYPOTHESIS_PROFILE=thorough pytest``). Every profile has
``deadline=None``: the first call of a Numba kernel compiles it.

The ``cuda``-marked tests run on a real GPU with CuPy, or under Numba's simulator with the
NumPy-backed CuPy stand-in of tests/stand_in (``NNKIT_CUPY_STAND_IN=1``; the child processes
of tests/test_gpu_stand_in.py); elsewhere they are skipped.

A run ends (above pytest's last line) with the skipped tests counted by what they need --
torch, an NVIDIA GPU with CuPy -- and the command that runs them (helpers.skip_summary).
"""

import os

import numpy as np
import pytest
from helpers import skip_summary
from hypothesis import HealthCheck, settings

settings.register_profile(
    "dev", max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "ci",
    max_examples=30,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.register_profile("thorough", max_examples=1000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


# Every kernel launched under the simulator, in this process's children too, must be in the
# list of launch types that tests/test_cuda_compile.py compiles (nnkit._ext._launch_types).
os.environ.setdefault("NNKIT_CUDA_LAUNCH_TYPES",
                      os.path.join(os.path.dirname(__file__), "cuda_launch_types.json"))


def _install_cupy_stand_in() -> bool:
    """With NNKIT_CUPY_STAND_IN=1 (and the simulator on): ``import cupy`` finds the NumPy-backed
    stand-in of tests/stand_in (which teaches the simulator to launch on its arrays), the
    attention kernels take small tiles (the tests' sequences are short) and the optimizer
    steps small grids (the simulator runs a Python thread per CUDA thread)."""
    if os.environ.get("NNKIT_CUPY_STAND_IN") != "1":
        return False
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "stand_in"))
    import cupy  # noqa: F401  (raises ImportError without NUMBA_ENABLE_CUDASIM=1)

    from nnkit._ext import activation_cuda, attention_cuda, optim_cuda

    attention_cuda.block_m, attention_cuda.block_n = 8, 8
    attention_cuda.threads_y, attention_cuda.threads_x = 2, 4
    # small grids striding over the elements: the simulator runs a Python thread per thread
    optim_cuda.threads, optim_cuda.max_blocks = 32, 2
    activation_cuda.threads, activation_cuda.max_blocks = 32, 4
    return True


_CUPY_STAND_IN = _install_cupy_stand_in()


def _cuda_tests_run() -> bool:
    """A real GPU with CuPy, or the stand-in under the simulator."""
    if _CUPY_STAND_IN:
        return True  # the cuda-marked tests run on the stand-in
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        return False
    try:
        import cupy  # noqa: F401
        from numba import cuda

        return bool(cuda.is_available())
    except Exception:
        return False


# The simulator runs kernels as NumPy scalar code, which warns where a GPU computes silently:
# a fully masked softmax row (-inf - -inf, NaN as torch gives), or lanes a kernel pads to and
# discards (its shared arrays are np.empty). Those warnings are not errors there.
_SIMULATED_KERNEL_WARNINGS = pytest.mark.filterwarnings(
    r"ignore::RuntimeWarning:nnkit\._ext\.\w+_cuda")


def pytest_collection_modifyitems(config, items):
    if _CUPY_STAND_IN:
        for item in items:
            item.add_marker(_SIMULATED_KERNEL_WARNINGS)
    if _cuda_tests_run():
        return
    skip = pytest.mark.skip(reason="needs a real NVIDIA GPU with CuPy (cuda marker)")
    for item in items:
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(skip)


def _skip_reason(report) -> str:
    """A skipped report's reason (its longrepr is (path, line, "Skipped: reason"))."""
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return reason.removeprefix("Skipped: ")


# Slow tests deselected, by process: this one's, or (with -n) each pytest-xdist worker's, sent
# back in its workeroutput (every worker collects, and deselects, the whole suite).
_SLOW_DESELECTED: dict[str, int] = {}


def pytest_deselected(items):
    slow = sum(item.get_closest_marker("slow") is not None for item in items)
    _SLOW_DESELECTED["here"] = _SLOW_DESELECTED.get("here", 0) + slow


def pytest_sessionfinish(session):
    if hasattr(session.config, "workeroutput"):  # an xdist worker
        session.config.workeroutput["slow_deselected"] = _SLOW_DESELECTED.get("here", 0)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """An xdist worker finished: its count of slow tests deselected."""
    output = getattr(node, "workeroutput", {})
    _SLOW_DESELECTED[output.get("workerid", str(id(node)))] = output.get("slow_deselected", 0)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Under pytest's own summary, just above its last line: the skipped tests by what they
    need (torch, a GPU) with the command that runs them, and the tests deselected as slow,
    so that a run without torch or a GPU is not mistaken for the whole suite."""
    result = yield
    skipped = [report for report in terminalreporter.stats.get("skipped", [])
               if getattr(report, "count_towards_summary", True)]  # as pytest's own count
    lines = skip_summary([_skip_reason(report) for report in skipped])
    slow = max(_SLOW_DESELECTED.values(), default=0)
    if slow and config.option.markexpr == "not slow":
        lines.append(f"{slow} slow tests deselected (python -m pytest -m slow runs them)")
    for line in lines:
        terminalreporter.write_line(line)
    return result


@pytest.fixture
def rng():
    """A seeded generator, fresh for every test."""
    return np.random.default_rng(12345)
