"""Private compiled kernels: Numba CPU (``*_cpu.py``), Numba CUDA (``*_cuda.py``) and
Cython (``*.pyx``, built by setup.py). No validation here: C-contiguous arrays and a
preallocated ``out`` in, nothing allocated inside the loops. Use ``nnkit.kernels``."""

import os
import sys


def _after_fork_in_child() -> None:
    """Let a forked child run the parallel kernels, on one thread.

    Numba's ``omp`` layer (GNU OpenMP on Linux) kills a child forked after the parent ran a
    parallel kernel when the child starts one ("fork() called from a process already using
    GNU OpenMP"): the child has none of the parent's OpenMP threads, and a parallel region
    that waits for them hangs. Its check compares the pid that ``launch_threads`` recorded
    with the child's parent pid; calling ``launch_threads(1)`` again in the child records
    the child's pid, and with one thread (this thread's setting, and the default of threads
    started later) a parallel region starts no OpenMP thread. Spawned children, and the
    ``tbb`` and ``workqueue`` layers, start their own threads and are left alone. Why this
    and not another layer: benchmarks/RESULTS.md, "Threading layer and fork safety".
    """
    numba = sys.modules.get("numba")
    if numba is None:
        return
    try:
        layer = numba.threading_layer()
    except ValueError:  # no parallel kernel has run: the child starts its threads afresh
        return
    if layer != "omp":
        return
    import ctypes

    from numba.np.ufunc import omppool

    if getattr(omppool, "openmp_vendor", "GNU") != "GNU":
        return  # numba stops forked children under GNU OpenMP only
    ctypes.CFUNCTYPE(None, ctypes.c_int)(omppool.launch_threads)(1)
    numba.set_num_threads(1)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _install_cache_locator() -> None:
    """Before any kernel module compiles: see ``_numba_cache`` for where the cache goes."""
    from ._numba_cache import install_locator

    install_locator()


_install_cache_locator()


#: the instruction sets of the C kernels, by level (isa_targets.h)
ISA_NAMES = ("baseline", "avx2", "avx512")


def check_isa_request(cpu_level: int) -> None:
    """Refuse an ``NNKIT_ISA`` (the instruction set the C kernels are to run with, read by
    isa_targets.h) that names no set, or one this CPU (``cpu_level``) cannot run; unset or
    empty, the kernels take the CPU's best."""
    asked = os.environ.get("NNKIT_ISA", "")
    if not asked:
        return
    if asked not in ISA_NAMES:
        raise ValueError(f"NNKIT_ISA: expected one of {', '.join(ISA_NAMES)}, got {asked!r}")
    if ISA_NAMES.index(asked) > cpu_level:
        raise ValueError(f"NNKIT_ISA: {asked!r} is not run by this CPU, which runs "
                         f"{', '.join(ISA_NAMES[:cpu_level + 1])}")
