"""The last lines of a test run: the skipped tests by what they need, and the command that
runs them (tests/conftest.py prints them with helpers.skip_summary)."""

import os
import subprocess
import sys
from pathlib import Path

from helpers import GPU_COMMAND, TORCH_COMMAND, skip_category, skip_summary

ROOT = Path(__file__).resolve().parent.parent

# The reasons pytest gives, as they reach the hook (its "Skipped: " prefix removed).
NO_TORCH = "could not import 'torch': No module named 'torch'"
NO_TORCH_SUBMODULE = "could not import 'torch.nn': No module named 'torch'"
CUDA_MARKER = "needs a real NVIDIA GPU with CuPy (cuda marker)"
NO_CUPY = "could not import 'cupy': No module named 'cupy'"
TORCH_WITHOUT_CUDA = "torch has no CUDA here"
GLIBC = "glibc's mallopt and mallinfo2 (glibc >= 2.33)"


def test_each_reason_has_its_category():
    assert skip_category(NO_TORCH) == "torch"
    assert skip_category(NO_TORCH_SUBMODULE) == "torch"
    for reason in (CUDA_MARKER, NO_CUPY, TORCH_WITHOUT_CUDA):
        assert skip_category(reason) == "gpu", reason
    # a module whose name starts like torch's or cupy's is neither
    assert skip_category("could not import 'torchvision': No module named 'torchvision'") == \
        "other"
    assert skip_category("could not import 'cupyx_extra': nope") == "other"
    assert skip_category(GLIBC) == "other"


def test_summary_without_torch_or_gpu():
    reasons = [NO_TORCH] * 1400 + [CUDA_MARKER] * 180 + [NO_CUPY, TORCH_WITHOUT_CUDA]
    assert skip_summary(reasons) == [
        f"1582 tests skipped: 1400 need torch ({TORCH_COMMAND}); "
        f"182 need an NVIDIA GPU with CuPy ({GPU_COMMAND})"]


def test_summary_lists_the_other_reasons_most_frequent_first():
    reasons = [CUDA_MARKER] * 3 + [GLIBC, "no fork on this platform", GLIBC]
    assert skip_summary(reasons) == [
        f"6 tests skipped: 3 need an NVIDIA GPU with CuPy ({GPU_COMMAND}); "
        "3 for other reasons:",
        f"  2 x {GLIBC}",
        "  1 x no fork on this platform"]
    assert skip_summary([GLIBC]) == ["1 test skipped: 1 for other reasons:", f"  1 x {GLIBC}"]


def test_nothing_skipped_prints_nothing():
    assert skip_summary([]) == []


def test_a_run_without_torch_ends_with_the_summary(tmp_path):
    """pytest as a new user runs it, with a torch that cannot be imported: the line above
    pytest's last one counts the tests that need torch and gives the command."""
    fake = tmp_path / "torch"
    fake.mkdir()
    (fake / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'torch'\", name='torch')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "tests/test_activation.py::test_relu_of_infinities_and_nan_as_torch"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 0 and lines[-1].startswith("1 skipped"), proc.stdout[-3000:]
    assert lines[-2] == f"1 test skipped: 1 need torch ({TORCH_COMMAND})", lines[-3:]
