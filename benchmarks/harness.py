"""Timing helpers shared by the benchmark scripts (not a test: benchmarks are never timed tests).

These machines are noisy, so each comparison interleaves its contenders (A, B, A, B, ...),
pauses briefly before each timed block (OpenBLAS workers spin ~0.1 s after a call and steal
a core) and reports medians and ratios measured in the same run.

Every benchmark process, nnkit's and torch's alike, calls ``same_allocator()`` first: both
contenders then run with glibc malloc tuned (nnkit/_malloc.py's thresholds, what
``nnkit tour`` users get). With glibc's defaults a freed block of a few MiB is mmapped and
page-faulted afresh on every call, and a comparison between a tuned and an untuned process
measures the allocator, not the library.
``NNKIT_MALLOC_TUNING=0`` in the environment leaves both at glibc's defaults instead.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path

import numpy as np


def _malloc_module():
    """nnkit/_malloc.py as ``nnkit._malloc``, without importing the nnkit package (which would
    load numba, whose OpenMP runtime next to torch's slows torch: see bench_recurrent.py).
    Registered under its own name, so that a later ``import nnkit`` finds this one module and
    its ``STATUS`` tells the truth."""
    if "nnkit._malloc" in sys.modules:
        return sys.modules["nnkit._malloc"]
    where = importlib.util.find_spec("nnkit").submodule_search_locations[0]
    spec = importlib.util.spec_from_file_location("nnkit._malloc", Path(where) / "_malloc.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules["nnkit._malloc"] = module
    return module


def same_allocator() -> str:
    """Tune glibc malloc in this process as ``nk.tune_malloc()`` does (idempotent) and return
    the setting. Called first in every benchmark process, each contender's worker alike."""
    return _malloc_module().tune()


def median_times(contenders: dict, repeats: int, warmup: int = 2, pause: float = 0.15,
                 block: int = 1) -> dict:
    """Median seconds per call of each zero-argument callable.

    Contenders alternate block by block (``block`` calls each, timed together), with a
    ``pause`` before each block so that one library's spinning worker threads (OpenBLAS,
    OpenMP) have gone to sleep before the next is timed.
    """
    for fn in contenders.values():
        for _ in range(warmup):
            fn()
    samples = {name: [] for name in contenders}
    for _ in range(repeats):
        for name, fn in contenders.items():
            time.sleep(pause)
            start = time.perf_counter()
            for _ in range(block):
                fn()
            samples[name].append((time.perf_counter() - start) / block)
    return {name: float(np.median(s)) for name, s in samples.items()}


def block_times(step, blocks: int, block: int, warmup: int = 2,
                pause: float = 0.0) -> list[float]:
    """Seconds per call of ``step()`` in each of ``blocks`` timed blocks of ``block`` calls,
    after ``warmup`` untimed calls; ``pause`` before each block lets spinning worker
    threads (BLAS, OpenMP, another process's) settle. The body of every worker process."""
    for _ in range(warmup):
        step()
    times = []
    for _ in range(blocks):
        time.sleep(pause)
        start = time.perf_counter()
        for _ in range(block):
            step()
        times.append((time.perf_counter() - start) / block)
    return times


def nnkit_mlp(sizes):
    """``nn.Sequential`` of Linear layers of ``sizes`` with ReLU between, seeded (0)."""
    import nnkit as nk

    nk.manual_seed(0)
    layers = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        layers.append(nk.nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers.append(nk.nn.ReLU())
    return nk.nn.Sequential(*layers)


def torch_available() -> bool:
    """Whether torch is installed (without importing it into this process)."""
    import importlib.util

    return importlib.util.find_spec("torch") is not None


def environment() -> dict:
    """Thread counts, the BLAS kernel in use (a forced OPENBLAS_CORETYPE slows SGEMM) and
    the malloc setting of this process, which every contender's worker applies alike
    (``same_allocator()``)."""
    import numba

    env = {"numba_threads": numba.get_num_threads(),
           "OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE", "unset"),
           "malloc (every contender)": _malloc_module().STATUS}
    try:
        from threadpoolctl import threadpool_info

        env["blas"] = "; ".join(f"{p.get('internal_api')} {p.get('architecture')} "
                                f"x{p.get('num_threads')}" for p in threadpool_info())
    except ImportError:
        env["blas"] = "threadpoolctl not installed"
    return env


def try_import_torch():
    """torch with the same thread count as numba, or None when it is not installed."""
    try:
        import numba
        import torch
    except ImportError:
        return None
    torch.set_num_threads(numba.get_num_threads())
    return torch


def report(run, argv) -> list[dict]:
    """The body of every benchmark's ``main()``: print the environment, run
    ``run(quick=...)`` and print its rows as a table."""
    from nnkit.tour import format_table

    print(environment())
    rows = run(quick="--quick" in argv)
    print(format_table(rows, list(dict.fromkeys(k for r in rows for k in r))))
    return rows
