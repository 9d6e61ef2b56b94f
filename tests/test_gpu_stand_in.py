"""nnkit's GPU code on a machine without a GPU: the GPU tests (marked ``cuda``) of tests/cuda
and those of the public functions small enough for the simulator run in child pytests with
Numba's CUDA simulator and the NumPy-backed CuPy stand-in (tests/stand_in/cupy;
tests/conftest.py installs it when NNKIT_CUPY_STAND_IN=1), and the GPU checklist
(``benchmarks/gpu_checklist.py --smoke``) runs end to end on the stand-in too.

So every model of tests/cuda/test_end_to_end.py trains three steps on "CuPy" arrays through
nnkit's Numba CUDA kernels and its CuPy compositions, against the CPU, with the checks that
no step copies to the host, waits for the device or uploads host data. What only a real GPU
checks: the kernels' compiled types, recompilation after the first step, timing, and CuPy's
own numerics (the stand-in computes with NumPy).

The stand-in keeps CuPy's refusals (implicit conversion to NumPy, NumPy arrays mixed into
device operations), so a NumPy call on a device array fails here as it would on the GPU.
``test_the_stand_in_refuses_what_cupy_refuses`` holds it to that.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
STAND_IN = ROOT / "tests" / "stand_in"


# The GPU tests at GPU-sized shapes (tests/test_*.py, ``cuda``) are left to a real GPU;
# those small enough for the simulator join here. Each group runs as two children sharing
# the machine's two cores (the simulator uses one). The first group (~3 minutes here) runs
# with the suite; the second (``slow``: ~15 minutes, the attention models train slowly in
# the simulator) with ``-m slow``.
_E2E = "tests/cuda/test_end_to_end.py"
_LIGHT = "not transformer and not vit"
GROUPS = {
    "core": [
        ([_E2E], f"(matches_the_cpu or waits) and {_LIGHT}"),
        ([_E2E, "tests/test_conv.py", "tests/test_optim.py", "tests/test_transformer.py",
          "tests/test_scan.py", "tests/test_launch.py", "tests/test_recurrent_persistent.py",
          "tests/test_optim_cuda.py", "tests/test_fewer_launches.py",
          "tests/test_hopfield_cuda.py", "tests/test_selective_scan_cuda.py",
          "tests/test_mamba.py", "tests/test_linear_attention_cuda.py"],
         f"(test_end_to_end and not (matches_the_cpu or waits or float32_step) and {_LIGHT}) "
         "or test_public_functions_on_gpu or test_cupy_parameters or test_mha_and_encoder or "
         "(test_public_scan_on_gpu and shape2) or test_launch_budgets_on_gpu or "
         "test_persistent_launches_do_not_grow_with_T or test_optimizers_on_gpu or "
         "test_gelu_dropout_and_cross_entropy_on_gpu or test_hopfield_on_gpu or "
         "test_public_selective_scan_on_gpu or test_mamba_lm_on_gpu or "
         "test_public_linear_attention_on_gpu"),
    ],
    "slow": [
        ([_E2E], "(matches_the_cpu or waits) and (transformer or vit)"),
        ([_E2E, "tests/test_recurrent.py", "tests/test_cuda_sim.py"],
         "(test_end_to_end and (float32_step or transformer_dropout)) or "
         "(test_public_kernels_on_gpu and shape1 and float32) or "
         "(layer_norm_on_gpu and (shape1 or shape2)) or (softmax_family_on_gpu and not shape0)"),
    ],
}


def _child_env() -> dict:
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", NNKIT_CUPY_STAND_IN="1")
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return env


def _child(files, select) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "cuda", "-k",
         select, *files], env=_child_env(), cwd=ROOT, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)


@pytest.mark.parametrize("group", [
    "core", pytest.param("slow", marks=pytest.mark.slow)])
def test_gpu_paths_under_the_simulator_with_the_cupy_stand_in(group):
    """Each child's pytest passes and runs tests (none skipped)."""
    children = [_child(files, select) for files, select in GROUPS[group]]
    failures = []
    for (_files, select), child in zip(GROUPS[group], children, strict=True):
        out, _ = child.communicate(timeout=1500)
        summary = out.strip().splitlines()[-1] if out.strip() else ""
        if child.returncode != 0 or "passed" not in summary or "skipped" in summary:
            failures.append(f"--- -k {select!r} (exit {child.returncode}):\n{out[-10000:]}")
    assert not failures, "\n".join(failures)


def test_the_gpu_checklist_runs_end_to_end(tmp_path):
    """``benchmarks/gpu_checklist.py --smoke`` on the stand-in: every step passes, the
    benchmark gives rows for every section and none an error, every launch-check case agrees
    on both launch paths, and the summary holds every target, so time on a GPU machine is
    not lost to a broken script."""
    out = tmp_path / "checklist"
    proc = subprocess.run([sys.executable, "benchmarks/gpu_checklist.py", "--smoke", "--out",
                           str(out), "--budget", "1500"], cwd=ROOT, capture_output=True,
                          text=True, timeout=1600)
    report = json.loads((out / "checklist.json").read_text())
    logs = {s["name"]: (out / f"{s['name']}.log").read_text()[-3000:] for s in report["steps"]}
    assert proc.returncode == 0, (proc.stdout[-3000:], logs)
    assert [s["name"] for s in report["steps"]] == ["audit", "pytest", "launch", "bench"]
    audit, pytest_step, launch, bench = report["steps"]
    assert audit["summary"]["rows"] >= 1 and audit["summary"]["errors"] == 0
    assert pytest_step["summary"]["passed"] >= 1 and "failed" not in pytest_step["summary"]
    rows = json.loads((out / "bench_gpu.json").read_text())
    assert [r for r in rows if "error" in r] == []
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from bench_gpu import SECTIONS
        from gpu_checklist import TARGETS
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    names = {"conv": "conv2d", "scan": "linear_scan"}
    assert {r["section"] for r in rows} == {"roofs"} | {names.get(k, k) for k in SECTIONS}
    checks = json.loads((out / "gpu_launch_check.json").read_text())
    cases = [r for r in checks if r["section"] == "paths"]
    assert len(cases) >= 15 and all(r["agree"] for r in cases)
    assert {r["section"] for r in checks} == {"paths", "launch", "ops"}
    assert [t["target"] for t in report["targets"]] == [t[0] for t in TARGETS]
    summary = (out / "checklist.md").read_text()
    assert all(t[0] in summary for t in TARGETS) and "| bench | passed |" in summary


def test_the_groups_cover_every_small_gpu_test_once():
    """Each GPU test the groups select is selected by exactly one child, and every test of
    tests/cuda is among them."""
    seen = []
    for children in GROUPS.values():
        for files, select in children:
            out = subprocess.run(
                [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                 "--collect-only", "-m", "cuda", "-k", select, *files],
                env=_child_env(), cwd=ROOT, capture_output=True, text=True, timeout=300).stdout
            seen += [line for line in out.splitlines() if "::" in line]
    assert len(seen) == len(set(seen)), sorted(t for t in set(seen) if seen.count(t) > 1)
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only",
         "-m", "cuda", _E2E], env=_child_env(), cwd=ROOT, capture_output=True, text=True,
        timeout=300).stdout
    assert {line for line in out.splitlines() if "::" in line} <= set(seen)


def test_the_stand_in_refuses_what_cupy_refuses():
    """Run in a child (it imports ``cupy``, which must not shadow a real CuPy here)."""
    code = r"""
import sys
sys.path.insert(0, sys.argv[1])
import numpy as np
import cupy

x = cupy.asarray(np.arange(6.0).reshape(2, 3))
refused = []
for name, attempt in [
    ("np.asarray", lambda: np.asarray(x)),
    ("x + numpy array", lambda: x + np.ones(3)),
    ("numpy array * x", lambda: np.ones(3) * x),
    ("cupy.where with a numpy array", lambda: cupy.where(x > 1, x, np.zeros(3))),
    ("np.concatenate with a numpy array", lambda: np.concatenate([x, np.ones((1, 3))])),
    ("cupy.ascontiguousarray of host data", lambda: cupy.ascontiguousarray(np.ones(3))),
]:
    try:
        attempt()
    except TypeError:
        refused.append(name)
    else:
        print("accepted:", name)
assert len(refused) == 6, refused
s = x.sum()
assert isinstance(s, cupy.ndarray) and s.shape == (), type(s)  # 0-d, as CuPy's reductions
assert isinstance(x[1, 2], cupy.ndarray)
assert float(s) == 15.0 and np.array_equal(x.get(), np.arange(6.0).reshape(2, 3))
y = np.exp(x)  # NumPy's ufuncs and functions dispatch to the device, as with CuPy
assert isinstance(y, cupy.ndarray) and isinstance(np.concatenate([x, x]), cupy.ndarray)
print("ok")
"""
    proc = subprocess.run([sys.executable, "-c", code, str(STAND_IN)], capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, NUMBA_ENABLE_CUDASIM="1"))
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), \
        proc.stdout + proc.stderr


@pytest.fixture(autouse=True)
def _no_real_cupy_shadowing():
    """The stand-in is never on this process's path (only the children's)."""
    yield
    assert str(STAND_IN) not in sys.path
