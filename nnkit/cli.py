"""The ``nnkit`` command: ``nnkit tour`` (the main job), ``nnkit bench``, ``nnkit info``."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import sys
import time
from pathlib import Path

__all__ = ["main"]


def _version(module: str) -> str:
    try:
        mod = __import__(module)
        return getattr(mod, "__version__", "installed")
    except ImportError:
        return "not installed"


def info() -> dict:
    """Versions, threading and backends, as a dict (printed by ``nnkit info``)."""
    import numba

    import nnkit

    from . import _malloc
    from ._backend import cuda_available

    numba.njit(lambda: 0)()  # start numba so its threading layer is known
    rows = {
        "nnkit": nnkit.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "numpy": _version("numpy"),
        "numba": numba.__version__,
        "scipy": _version("scipy"),
        "scikit-learn": _version("sklearn"),
        "numba threads": str(numba.get_num_threads()),
        "numba threading layer": _threading_layer(),
        "cython kernels": _cython_status(),
        "C kernels build (step GEMM, scan rows, window conv)": _c_kernels_isa(),
        "CPU caches (the heuristics' view)": _caches(),
        "malloc tuning": _malloc.STATUS,
        "CUDA available": "yes" if cuda_available() else "no",
        "cupy": _version("cupy"),
        "torch (optional, tests)": _version("torch"),
        "matplotlib (plots)": _version("matplotlib"),
    }
    try:
        from threadpoolctl import threadpool_info

        for pool in threadpool_info():
            rows[f"BLAS {pool.get('internal_api')}"] = (
                f"{pool.get('version')} {pool.get('architecture')} x{pool.get('num_threads')}"
            )
    except ImportError:
        pass
    return rows


def _threading_layer() -> str:
    import numba
    from numba import prange

    @numba.njit(parallel=True)
    def _touch(n):
        s = 0
        for i in prange(n):
            s += i
        return s

    try:
        _touch(8)
        return numba.threading_layer()
    except Exception as exc:  # no usable layer: say so rather than fail
        return f"unavailable ({exc})"


def _cython_status() -> str:
    return "built" if importlib.util.find_spec("nnkit._ext.perceptron") else "NOT BUILT"


def _caches() -> str:
    from ._machine import caches

    c = caches()
    return (f"L1d {c.l1d >> 10} KiB, L2 {c.l2 >> 10} KiB, last level {c.llc >> 20} MiB shared "
            f"by {c.llc_shared_by} CPUs ({c.source})")


def _c_kernels_isa() -> str:
    """The instruction set the C kernels (gemm_packed.h, scan_rows.h, conv_window.h) run
    with here."""
    try:
        from ._ext import conv_window, gemm_packed, scan_rows
    except ImportError:
        return "NOT BUILT"
    except ValueError as error:  # NNKIT_ISA refused
        return f"refused: {error}"
    window = conv_window.isa_names()[conv_window.ISA_LEVEL] if conv_window.AVAILABLE else "none"
    asked = os.environ.get("NNKIT_ISA") or "unset"
    return (f"{gemm_packed.isa()}, {scan_rows.isa()}, {window} (NNKIT_ISA {asked}; this CPU "
            f"runs {', '.join(conv_window.isa_names())})")


def _find_benchmarks() -> Path | None:
    here = Path(__file__).resolve().parent.parent / "benchmarks"
    for candidate in (Path.cwd() / "benchmarks", here):
        if candidate.is_dir() and any(candidate.glob("bench_*.py")):
            return candidate
    return None


def bench(quick: bool, only: str | None, output: str | None = None) -> int:
    """Run every ``benchmarks/bench_*.py`` (its ``run(quick)``), print ratio tables and write
    every row, with the machine's description, to ``benchmarks/results.json``. Tunes malloc
    (``nk.tune_malloc()``), as every benchmark does for each contender."""
    from . import _malloc
    from .tour import format_table

    folder = _find_benchmarks()
    if folder is None:
        print("nnkit bench runs the scripts in benchmarks/ of a source checkout; run it from the "
              "repository root", file=sys.stderr)
        return 2
    # the contenders timed in this process run under the allocator setting every benchmark
    # worker applies (benchmarks/harness.py, same_allocator); info() below records it
    _malloc.tune()
    results = {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "quick": quick,
               "machine": info(), "benchmarks": {}}
    for path in sorted(folder.glob("bench_*.py")):
        if only and only not in path.stem:
            continue
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        print(f"\n== {path.stem} ==")
        start = time.perf_counter()
        try:
            rows = module.run(quick=quick)
        except SystemExit as exc:  # a benchmark that cannot run here (no GPU) says why
            print(f"skipped: {exc}")
            results["benchmarks"][path.stem] = {"skipped": str(exc)}
            continue
        columns = list(dict.fromkeys(k for r in rows for k in r))
        print(format_table(rows, columns))
        results["benchmarks"][path.stem] = {"seconds": round(time.perf_counter() - start, 1),
                                            "rows": rows}
    target = Path(output) if output else folder / "results.json"
    target.write_text(json.dumps(results, indent=1, default=_json_value) + "\n")
    print(f"\nwrote {target}")
    return 0


def _json_value(value):
    """NumPy scalars and arrays in benchmark rows, as JSON numbers and lists."""
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="nnkit", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p_tour = sub.add_parser("tour", help="train the tour's models and print a results table")
    p_tour.add_argument("--quick", action="store_true", help="fewer epochs (a smoke run)")
    p_tour.add_argument("--out", default="nnkit-tour", help="folder for the plots")
    p_tour.add_argument("--seed", type=int, default=0)
    p_bench = sub.add_parser("bench", help="run benchmarks/ and print ratio tables")
    p_bench.add_argument("--quick", action="store_true", help="small sizes, few repetitions")
    p_bench.add_argument("--only", help="run only the benchmarks whose name contains this")
    p_bench.add_argument("--output", help="where to write the JSON results "
                         "(default: benchmarks/results.json)")
    sub.add_parser("info", help="versions, threads, CUDA")
    args = parser.parse_args(argv)
    if args.command == "info":
        for key, value in info().items():
            print(f"{key:26s} {value}")
        return 0
    if args.command == "bench":
        return bench(args.quick, args.only, args.output)
    from .tour import missed_targets, run_tour

    rows = run_tour(args.out, quick=args.quick, seed=args.seed)
    return 1 if missed_targets(rows) else 0


if __name__ == "__main__":
    sys.exit(main())
