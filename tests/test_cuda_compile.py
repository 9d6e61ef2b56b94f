"""Every Numba CUDA kernel of nnkit compiled for real, no GPU needed: NVVM to PTX and ptxas to
machine code for sm_80, sm_89 and sm_90, on exactly the argument types the simulator and
CuPy stand-in tests launch it with.

tests/cuda_launch_types.json lists them (kernel -> signatures). tests/conftest.py points
NNKIT_CUDA_LAUNCH_TYPES at it, so a simulator launch whose types it lacks fails the test
that made it (``nnkit._ext._launch_types``). After a change that launches new types, record
them into the list:

    rm tests/cuda_launch_types.json
    NNKIT_CUDA_LAUNCH_TYPES_RECORD=1 python -m pytest -m "slow or not slow"

Here ``benchmarks/gpu_resources.py`` compiles the list (numba-cuda[cu12], in the test extra)
and the tests hold its rows. Launches whose compile key (their kernel's sources, argument
types and the compilers' versions) tests/cuda_audit_cache.json holds take its rows, so only
what changed since ``python benchmarks/gpu_resources.py --update-cache`` last wrote it is
compiled (``test_the_cache_holds_what_the_compilers_give`` compiles one cached launch afresh
and compares). The checks: no compile error, no local memory (stack) or spills, every
kernel within its register budget, and every kernel of nnkit launched by some test.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LIST = ROOT / "tests" / "cuda_launch_types.json"
CACHE = ROOT / "tests" / "cuda_audit_cache.json"


def _compilers_missing() -> str | None:
    """Why the real compilers cannot run here, or None."""
    try:
        from cuda.pathfinder import find_nvidia_binary_utility
    except ImportError:
        return "numba-cuda[cu12] is not installed (it is in the test extra)"
    return None if find_nvidia_binary_utility("ptxas") else "ptxas is not installed"


# Registers per thread, at most. Elementwise and row kernels: 48 and 64 keep 1280 and 1024
# threads of 256-thread blocks resident per SM (of sm_80/sm_90's 2048), enough to hide memory
# latency; the pooling kernels' 4-D index arithmetic, the persistent recurrent and scan
# kernels (one block per batch tile or chunk) and the attention tiles (a tile of accumulators
# per thread) hold more by design. Measured maxima are in benchmarks/RESULTS.md.
REGISTER_BUDGETS = {
    "activation_cuda.": 48,
    "optim_cuda.": 48,
    "hopfield_cuda._async_kernel": 96,  # a block walks one state's sweeps: the shuffle's 64-bit
    # splitmix64 products and the sweep loop's int64 indices and array strides (measured 94)
    "hopfield_cuda.": 48,
    "attention_cuda._row_dot": 48,
    "attention_cuda._dropout": 48,
    "layer_norm_cuda.": 64,
    "softmax_cuda.": 64,
    "conv_cuda._im2col": 64,
    "conv_cuda._col2im": 64,
    "conv_cuda.": 128,
    "scan_cuda._rows": 64,
    "scan_cuda.": 96,
    "selective_scan_cuda.": 128,  # a thread walks a (b, d) row: the backward's n loop keeps
    # some twenty arrays' pointers and the row's B/C/checkpoint indices live (measured 126)
    "recurrent_cuda.": 96,
    "linear_attention_cuda.": 112,  # one thread per state column (measured up to 104)
    "attention_cuda.": 250,  # measured up to 244; 255 is the cap, past it ptxas spills
}


def _budget(kernel: str) -> int:
    return next(b for prefix, b in REGISTER_BUDGETS.items() if kernel.startswith(prefix))


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    missing = _compilers_missing()
    if missing:
        pytest.skip(missing)
    out = tmp_path_factory.mktemp("audit") / "rows.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_resources.py"),
                           "--json", str(out), "--jobs", "2", "--cache", str(CACHE)],
                          env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=1200)
    if not out.exists():
        pytest.fail(f"gpu_resources.py wrote no rows (exit {proc.returncode}):\n"
                    f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return json.loads(out.read_text())


def test_every_listed_launch_compiles_for_every_architecture(rows):
    """(The attention kernels' test-sized tiles are compiled as the GPU's tiles.)"""
    from nnkit._ext._cuda_audit import work_items
    from nnkit._ext._launch_types import read_list

    errors = [f"{r['kernel']} ({', '.join(r['signature'])}) {r['cc']}: {r['error']}"
              for r in rows if "error" in r]
    assert not errors, "\n".join(errors)
    compiled = {(r["kernel"], tuple(r["signature"])) for r in rows}
    assert set(work_items(read_list(LIST))) == compiled
    assert {r["cc"] for r in rows} == {"sm_80", "sm_89", "sm_90"}


_FIELDS = ("registers", "stack", "spill_stores", "spill_loads", "shared", "f64", "f32",
           "local_in_ptx")


def test_the_cache_holds_what_the_compilers_give(rows):
    """One launch the cache answered, compiled afresh: the same rows, field for field."""
    from nnkit._ext._cuda_audit import compile_kernel

    cached = [r for r in rows if r.get("cached") and r["kernel"].startswith("softmax_cuda.")]
    if not cached:
        pytest.skip("no softmax launch came from the cache in this run")
    name, sig = cached[0]["kernel"], tuple(cached[0]["signature"])
    fresh = {r["cc"]: r for r in compile_kernel(name, sig)}
    for row in (r for r in cached if (r["kernel"], tuple(r["signature"])) == (name, sig)):
        assert {f: row[f] for f in _FIELDS} == {f: fresh[row["cc"]][f] for f in _FIELDS}


def test_the_compile_key_changes_with_the_sources(tmp_path, monkeypatch):
    """Editing a module a kernel's module imports (here simd_math, which the attention
    kernels call) gives the kernel another key; another signature does too."""
    from nnkit._ext import _cuda_audit as A

    name, sig = "attention_cuda._row_dot", ("float32[:, :, ::1]",)
    before = A.compile_key(name, sig)
    assert A.compile_key(name, ("float64[:, :, ::1]",)) != before
    real = A._module_path
    edited = tmp_path / "simd_math.py"
    edited.write_text(Path(real("nnkit._ext.simd_math")).read_text() + "\n# edited\n")
    monkeypatch.setattr(A, "_module_path", lambda m: str(edited) if m == "nnkit._ext.simd_math"
                        else real(m))
    A._source_digest.cache_clear()
    try:
        assert A.compile_key(name, sig) != before
    finally:
        A._source_digest.cache_clear()


def test_no_kernel_uses_local_memory_or_spills(rows):
    bad = [f"{r['kernel']} ({', '.join(r['signature'])}) {r['cc']}: stack {r['stack']} B, "
           f"spills {r['spill_stores']}/{r['spill_loads']} B, .local in PTX {r['local_in_ptx']}"
           for r in rows if r["stack"] or r["spill_stores"] or r["spill_loads"]
           or r["local_in_ptx"]]
    assert not bad, "\n".join(bad)


def test_kernels_stay_within_their_register_budgets(rows):
    over = [f"{r['kernel']} ({', '.join(r['signature'])}) {r['cc']}: {r['registers']} "
            f"registers > {_budget(r['kernel'])}" for r in rows
            if r["registers"] > _budget(r["kernel"])]
    assert not over, "\n".join(over)


# PTX float64 instructions in each float32 kernel (the most over its float32 and complex64
# signatures, sm_90), each place named in one line with why its error bound needs it. A kernel
# not listed here computes in float32 only: it must have none.
F64_IN_FLOAT32_KERNELS = {
    # -- softmax, log-softmax, cross-entropy, layer norm, GELU, dropout, optimizers --
    # lse and loss_rows are float64 (the cache's lse keeps exp(logits - lse) exact at 1e4):
    # the row's max and log-sum written widened, once per row
    "softmax_cuda._cross_entropy_kernel": 9,
    # the float64 lse split once per row into hi + lo of the logits' dtype
    "softmax_cuda._cross_entropy_backward_kernel": 5,
    # that split, and n_valid (float64) and a float64 dloss: scalar arguments converted once
    "softmax_cuda._cross_entropy_mean_backward_kernel": 9,
    # the batch mean sums the float64 loss_rows in float64 (one block; only its output is
    # float32)
    "softmax_cuda._mean_valid_kernel": 41,
    # -- attention, scan, recurrent cells, conv and pooling --
    # none: each computes in its storage dtype (cuDNN's and FlashAttention's float32
    # accumulation is the bar); scalars arrive converted from the host, attention's dropout
    # test is integer (drop_below), the scan's carries and the cells' states are float32
    # -- Hopfield --
    # none: integer fields in the couplings' dtype, biases compared as ceil(t) in it
}


def _is_float32(signature) -> bool:
    return any("float32" in t or "complex64" in t for t in signature)


def test_float32_kernels_compute_in_float32(rows):
    found = {}
    for r in rows:
        if r["cc"] == "sm_90" and _is_float32(r["signature"]):
            kernel = r["kernel"].split("(")[0]
            found[kernel] = max(found.get(kernel, 0), r["f64"])
    assert found == {kernel: F64_IN_FLOAT32_KERNELS.get(kernel, 0) for kernel in found}
    assert set(F64_IN_FLOAT32_KERNELS) <= set(found)


def test_every_kernel_of_nnkit_is_launched_by_some_test():
    """A kernel that no simulator test launches would never be compiled here."""
    missing = _compilers_missing()
    if missing:
        pytest.skip(missing)
    code = """
import json, sys
from nnkit._ext import _cuda_audit, _launch
from nnkit._ext._launch_types import read_list
listed = read_list(sys.argv[1])
names = set(_cuda_audit.catalogue())
plain = {n for n in listed if "(" not in n}
made = {n.split("(")[0] for n in listed if "(" in n}
print(json.dumps({"unlaunched": sorted(names - plain),
                  "factories": sorted(set(_launch.factories) - made),
                  "unknown": sorted(plain - names)}))
"""
    proc = subprocess.run([sys.executable, "-c", code, str(LIST)], capture_output=True,
                          text=True, timeout=300, cwd=ROOT, env=dict(os.environ,
                                                                     PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found == {"unlaunched": [], "factories": [], "unknown": []}


# ---- the list and its check (no compiler needed) ---------------------------------------------

def test_type_texts_round_trip_and_refuse_anything_else():
    import numpy as np

    from nnkit._ext._launch_types import parse_type, type_text

    values = [np.zeros((2, 3), np.float32), np.zeros((2, 3)).T, np.zeros((4, 4))[:, ::2], 3,
              2.5, True, np.float32(1), np.uint64(7), np.complex64(1j),
              (np.zeros(3, np.float32),) * 3, (np.zeros(3), 4)]
    texts = [type_text(v) for v in values]
    assert texts[:3] == ["array(float32, 2d, C)", "array(float64, 2d, F)",
                         "array(float64, 2d, A)"]
    assert texts[3:6] == ["int64", "float64", "bool"]
    assert texts[9] == "UniTuple(array(float32, 1d, C) x 3)"
    assert [str(parse_type(t)) for t in texts] == texts
    for bad in ["array(float32, 2d, Q)", "__import__('os')", "pyobject", "array(float32, 2d",
                "int64 int64", "UniTuple(int64, 3)"]:
        with pytest.raises((ValueError, KeyError)):
            parse_type(bad)


def test_a_launch_of_an_unlisted_type_fails_and_record_mode_adds_it(tmp_path, monkeypatch):
    import numpy as np

    from nnkit._ext import _launch_types as lt

    path = tmp_path / "types.json"
    lt.write_list(path, {"softmax_cuda._softmax_kernel": {("array(float32, 2d, C)",) * 2}})
    monkeypatch.setenv(lt.ENV_LIST, str(path))
    monkeypatch.delenv(lt.ENV_RECORD, raising=False)
    for name, value in (("_known", None), ("_checked", set()), ("_new", {})):
        monkeypatch.setattr(lt, name, value)
    x32, x64 = np.zeros((2, 3), np.float32), np.zeros((2, 3))
    lt.seen("softmax_cuda._softmax_kernel", (x32, x32))
    with pytest.raises(lt.UncompiledLaunch, match=r"array\(float64, 2d, C\)"):
        lt.seen("softmax_cuda._softmax_kernel", (x64, x64))
    monkeypatch.setenv(lt.ENV_RECORD, "1")
    monkeypatch.setattr(lt, "_checked", set())
    monkeypatch.setattr(lt.atexit, "register", lambda *a: None)
    lt.seen("softmax_cuda._softmax_kernel", (x64, x64))
    lt._add_new(path)
    assert lt.read_list(path) == {"softmax_cuda._softmax_kernel": {
        ("array(float32, 2d, C)",) * 2, ("array(float64, 2d, C)",) * 2}}


@pytest.mark.parametrize("cc, threads, registers, shared, expected", [
    ((8, 0), 256, 32, 0, 1.0),  # 64 warps resident: the thread limit
    ((8, 0), 256, 64, 0, 0.5),  # 2048 registers a warp: 32 warps
    ((8, 0), 256, 38, 0, 0.75),  # 38 rounds to 40 a thread (1280 a warp): 6 blocks of 8 warps
    ((9, 0), 256, 61, 2048, 0.5),  # 64 a thread: 4 blocks
    ((8, 9), 256, 32, 0, 1.0),  # sm_89: 48 warps at most
    ((8, 0), 256, 255, 0, 0.125),  # one block
    ((9, 0), 128, 32, 100_000, 2 * 4 / 64),  # shared memory: 2 blocks of 4 warps
    ((8, 0), 32, 16, 0, 0.5),  # the block limit: 32 blocks of one warp
])
def test_occupancy_is_the_cuda_formula(cc, threads, registers, shared, expected):
    from nnkit._ext._cuda_audit import occupancy

    assert occupancy(cc, threads, registers, shared) == pytest.approx(expected)
