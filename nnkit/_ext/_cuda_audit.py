"""nnkit's CUDA kernels compiled for real without a GPU: NVVM to PTX, ptxas to machine code.

``audit(launch_types)`` compiles each kernel for each signature of the launch-type list
(``_launch_types``; the tests record it under Numba's simulator) and each compute capability,
and reports per compilation the registers, spills, stack (local memory), shared memory, and
the PTX's float64 and float32 instructions. It needs numba-cuda with its CUDA 12 wheels
(``pip install "numba-cuda[cu12]"``: NVVM and ptxas), not a GPU or a driver: Numba asks the
current device for its compute capability only when a kernel calls a device function, and
here a stand-in device answers with the capability being compiled for.

A kernel made by a factory (``_launch.kernel_factory``) is named ``module.factory(args)``
and made again from its literal arguments; where the tests launch a variant a GPU would not
(the attention kernels' small tiles), the GPU's variant is compiled instead.

Each kernel and signature is typed and lowered by Numba once (at the lowest compute
capability); NVVM then makes the PTX of each capability and ptxas assembles it.

Compiling is a pure function of its inputs, so its rows can be reused: ``compile_key``
hashes everything a compilation reads (the source of the kernel's module and of every nnkit
module it imports, transitively; the kernel's name and argument types; the compute
capabilities; the versions of Numba, numba-cuda, llvmlite, NVVM and ptxas), and
``audit(..., cache=rows_by_key)`` compiles only the launches whose key the cache lacks. A
change to any of those inputs changes the key, and that launch is compiled afresh.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import hashlib
import importlib
import os
import pkgutil
import re
import subprocess
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor

__all__ = ["CCS", "catalogue", "resolve", "gpu_variant", "work_items", "compile_kernel", "audit",
           "compile_key", "occupancy"]

CCS = ((8, 0), (8, 9), (9, 0))  # A100, L40/RTX 40xx, H100/H200


# ---- the kernels -------------------------------------------------------------------------

def _cuda_modules():
    import nnkit._ext as ext

    return [importlib.import_module(f"nnkit._ext.{m.name}")
            for m in pkgutil.iter_modules(ext.__path__) if m.name.endswith("_cuda")]


def _is_kernel(value) -> bool:
    options = getattr(value, "targetoptions", None)
    return hasattr(value, "py_func") and isinstance(options, dict) and not options.get("device")


def catalogue() -> dict:
    """{launch name: kernel} of the module-level kernels of ``nnkit._ext.*_cuda`` (those made
    by factories are named by ``resolve``)."""
    from . import _launch

    kernels = {}
    for module in _cuda_modules():
        for value in vars(module).values():
            if _is_kernel(value) and value not in _launch._variants:
                kernels[_launch._name(value)] = value
    return kernels


def _factory_call(name: str):
    """(factory, literal arguments) of a name ``module.factory(literal, ...)``, else None
    (``ast.literal_eval``: literals only)."""
    from . import _launch

    m = re.fullmatch(r"([A-Za-z_][\w.]*)\((.*)\)", name)
    factory = _launch.factories.get(m.group(1)) if m else None
    if factory is None:
        return None
    args = ast.literal_eval(f"({m.group(2)},)") if m.group(2) else ()
    if not all(isinstance(a, (str, int, bool)) for a in args):
        raise ValueError(f"{name!r}: a factory takes literal str, int and bool arguments")
    return factory, args


def resolve(name: str, kernels: dict):
    """The kernel called ``name`` in the launch-type list: a catalogue name, or a factory's
    kernel made again from its arguments."""
    if name in kernels:
        return kernels[name]
    call = _factory_call(name)
    if call is None:
        raise KeyError(f"no CUDA kernel is called {name!r}")
    factory, args = call
    return factory(*args)


def gpu_variant(name: str) -> str:
    """The variant a GPU launches where the tests launched ``name`` (the tests shrink the
    attention tiles under the simulator): ``name`` itself for every other kernel."""
    call = _factory_call(name)
    if call is None or call[0].on_gpu is None:
        return name
    factory, args = call
    qualified = name.split("(", 1)[0]
    return f"{qualified}({', '.join(map(repr, factory.on_gpu(args)))})"


def work_items(launch_types: dict) -> list[tuple]:
    """(kernel name, signature) for every listed launch, as a GPU would launch it."""
    _cuda_modules()  # registers the factories
    return sorted({(gpu_variant(name), tuple(sig)) for name, sigs in launch_types.items()
                   for sig in sigs})


# ---- compiling -----------------------------------------------------------------------------

class _Device:
    """What Numba reads of the current device while compiling: its compute capability."""

    compute_capability = (9, 0)


@contextlib.contextmanager
def _compiling_for(cc):
    from numba.cuda import dispatcher

    _Device.compute_capability = cc
    real = dispatcher.get_current_device
    dispatcher.get_current_device = lambda: _Device
    try:
        yield
    finally:
        dispatcher.get_current_device = real


def _ptxas() -> str:
    from cuda.pathfinder import find_nvidia_binary_utility

    path = find_nvidia_binary_utility("ptxas")
    if not path:
        raise FileNotFoundError("ptxas not found: pip install 'numba-cuda[cu12]'")
    return path


_PTXAS_FIELDS = {
    "registers": r"Used (\d+) registers",
    "stack": r"(\d+) bytes stack frame",
    "spill_stores": r"(\d+) bytes spill stores",
    "spill_loads": r"(\d+) bytes spill loads",
    "shared": r"(\d+) bytes smem",
}
_OPCODE = re.compile(r"^\s*(?:@!?%\w+\s+)?([a-z][\w.]*)", re.MULTILINE)


def ptx_float_counts(ptx: str) -> tuple[int, int]:
    """(float64, float32) instructions of ``ptx``: opcodes with a .f64 / .f32 part."""
    opcodes = [op for op in _OPCODE.findall(ptx) if "." in op]
    return (sum(".f64" in op for op in opcodes), sum(".f32" in op for op in opcodes))


def _lower(kernel, argtypes, cc):
    """Numba's typing and lowering of ``kernel`` for ``argtypes``: its code library (LLVM IR),
    from which NVVM makes the PTX of any compute capability."""
    from numba.cuda import compiler

    with _compiling_for(cc):
        library, _ = compiler._compile_pyfunc_with_fixup(
            kernel.py_func, argtypes, device=False, abi="numba", cc=cc)
    return library


def _assemble(ptx: str, cc) -> dict:
    """ptxas's resource report of ``ptx`` for ``cc``."""
    with tempfile.TemporaryDirectory(prefix="nnkit-ptxas-") as folder:
        path = os.path.join(folder, "kernel.ptx")
        with open(path, "w") as fh:
            fh.write(ptx)
        proc = subprocess.run([_ptxas(), f"-arch=sm_{cc[0]}{cc[1]}", "-v", path, "-o",
                               os.path.join(folder, "kernel.cubin")],
                              capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"ptxas failed: {proc.stderr[-2000:]}")
    report = {}
    for field, pattern in _PTXAS_FIELDS.items():
        found = re.findall(pattern, proc.stderr)
        report[field] = max(map(int, found)) if found else 0
    return report


def compile_kernel(name: str, sig: tuple, ccs=CCS, kernels: dict | None = None) -> list[dict]:
    """Compile kernel ``name`` for the argument types ``sig`` (type texts): typed and lowered
    once, then NVVM and ptxas for each of ``ccs``. One row per cc (``error`` set when a step
    failed)."""
    from ._launch_types import parse_type

    rows, library = [], None
    start = time.perf_counter()
    for cc in ccs:
        row = {"kernel": name, "signature": list(sig), "cc": f"sm_{cc[0]}{cc[1]}"}
        try:
            if library is None:
                kernel = resolve(name, catalogue() if kernels is None else kernels)
                library = _lower(kernel, tuple(parse_type(t) for t in sig), min(ccs))
            with _compiling_for(cc):
                (ptx,) = library.get_asm_strs(cc=cc)
            row["f64"], row["f32"] = ptx_float_counts(ptx)
            row["local_in_ptx"] = bool(re.search(r"^\s*\.local\b", ptx, re.MULTILINE))
            row.update(_assemble(ptx, cc))
        except Exception as exc:  # reported per row: one broken kernel hides no other
            row["error"] = f"{type(exc).__name__}: {exc}"[:4000]
        row["seconds"] = round(time.perf_counter() - start, 3)
        start = time.perf_counter()
        rows.append(row)
    return rows


# ---- the cache key -----------------------------------------------------------------------

def _module_path(module: str) -> str:
    import nnkit

    root = os.path.dirname(os.path.dirname(os.path.abspath(nnkit.__file__)))
    return os.path.join(root, *module.split(".")) + ".py"


def _nnkit_imports(module: str, tree) -> set[str]:
    """The nnkit modules that ``module``'s source (parsed as ``tree``) imports."""
    package = module.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            candidates = [base] + [f"{base}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            candidates = [a.name for a in node.names]
        else:
            continue
        found.update(c for c in candidates if c.startswith("nnkit") and (
            os.path.exists(_module_path(c)) or os.path.exists(_module_path(c + ".__init__"))))
    return found


@functools.cache
def _source_digest(module: str) -> str:
    """sha256 over the sources of ``module`` and of the nnkit modules it imports, transitively
    (a package's ``__init__`` counts as the package)."""
    seen, todo, digest = set(), [module], hashlib.sha256()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        path = _module_path(name)
        if not os.path.exists(path):
            path = _module_path(name + ".__init__")
        text = open(path, encoding="utf-8").read()
        todo += sorted(_nnkit_imports(name if not path.endswith("__init__.py")
                                      else name + ".__init__", ast.parse(text)))
    for name in sorted(seen):
        path = _module_path(name)
        path = path if os.path.exists(path) else _module_path(name + ".__init__")
        digest.update(name.encode() + b"\0" + open(path, "rb").read() + b"\0")
    return digest.hexdigest()


@functools.cache
def _compiler_versions() -> str:
    """Numba's, numba-cuda's, llvmlite's, NumPy's, NVVM's and ptxas's versions, as one
    string."""
    import llvmlite
    import numba
    import numpy
    from numba.cuda.cudadrv import nvvm

    try:
        from numba_cuda import __version__ as numba_cuda
    except ImportError:
        numba_cuda = "none"
    ptxas = subprocess.run([_ptxas(), "--version"], capture_output=True, text=True).stdout
    return "|".join([numba.__version__, numba_cuda, llvmlite.__version__, numpy.__version__,
                     str(nvvm.NVVM().get_version()), ptxas.strip().splitlines()[-1]])


def compile_key(name: str, sig: tuple, ccs=CCS) -> str:
    """What compiling kernel ``name`` for the argument types ``sig`` on ``ccs`` reads, hashed:
    equal keys give equal rows."""
    module = "nnkit._ext." + name.split(".", 1)[0]
    text = "|".join([name, *sig, repr(tuple(ccs)), _source_digest(module),
                     _compiler_versions()])
    return hashlib.sha256(text.encode()).hexdigest()


_worker_kernels: dict | None = None


def _compile_in_worker(item):
    global _worker_kernels
    if _worker_kernels is None:
        _worker_kernels = catalogue()
    return compile_kernel(*item, kernels=_worker_kernels)


def audit(launch_types: dict, ccs=CCS, jobs: int = 1, progress=None,
          cache: dict | None = None) -> list[dict]:
    """Compile every listed launch for every ``ccs``: one row per (kernel, signature, cc).
    ``jobs`` > 1 compiles in that many processes; ``progress(done, total)`` is called per
    kernel and signature. ``cache`` ({``compile_key``: rows}): launches whose key it holds
    take its rows (marked ``"cached": true``) instead of being compiled."""
    items, rows = [], []
    for name, sig in work_items(launch_types):
        hit = None if cache is None else cache.get(compile_key(name, sig, ccs))
        if hit is None:
            items.append((name, sig, tuple(ccs)))
        else:
            rows += [{**row, "cached": True} for row in hit]
    if jobs <= 1:
        kernels = catalogue()
        results = (compile_kernel(*item, kernels=kernels) for item in items)
    else:
        import multiprocessing

        pool = ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"))
        results = pool.map(_compile_in_worker, items, chunksize=2)
    for done, item_rows in enumerate(results, 1):
        rows += item_rows
        if progress:
            progress(done, len(items))
    if jobs > 1:
        pool.shutdown()
    return rows


# ---- occupancy -------------------------------------------------------------------------------

# Per compute capability: max threads, blocks and warps per SM, registers per SM, register
# allocation unit (per warp), shared memory per SM usable by blocks, its allocation unit,
# and the shared memory the driver reserves per block (CUDA Occupancy Calculator's tables).
_SM = {
    (8, 0): dict(threads=2048, blocks=32, regs=65536, reg_unit=256, smem=167936,
                 smem_unit=128, reserved=1024),
    (8, 9): dict(threads=1536, blocks=24, regs=65536, reg_unit=256, smem=102400,
                 smem_unit=128, reserved=1024),
    (9, 0): dict(threads=2048, blocks=32, regs=65536, reg_unit=256, smem=233472,
                 smem_unit=128, reserved=1024),
}


def occupancy(cc, threads_per_block: int, registers: int, shared_bytes: int) -> float:
    """Active warps per SM over the SM's maximum, for blocks of ``threads_per_block`` threads
    using ``registers`` per thread and ``shared_bytes`` of shared memory (the CUDA occupancy
    formula: the least of the thread, block, register and shared-memory limits)."""
    sm = _SM[tuple(cc)]
    warps = -(-threads_per_block // 32)
    by_threads = sm["threads"] // (warps * 32)
    regs_per_warp = -(-max(registers, 1) * 32 // sm["reg_unit"]) * sm["reg_unit"]
    by_regs = (sm["regs"] // regs_per_warp) // warps
    smem = -(-(shared_bytes + sm["reserved"]) // sm["smem_unit"]) * sm["smem_unit"]
    by_smem = sm["smem"] // smem
    blocks = min(sm["blocks"], by_threads, by_regs, by_smem)
    return blocks * warps * 32 / sm["threads"]
