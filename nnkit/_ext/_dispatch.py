"""Serial or parallel: compile a row kernel both ways and pick by problem size.

Waking Numba's thread pool costs tens of microseconds (far more when the cores are busy,
and a pool left spinning steals a core from OpenBLAS right after): for small inputs the
serial build is faster. With the second core busy (another process running) every parallel
call costs milliseconds: the barrier waits for a scheduler time slice.
``PARALLEL_MIN_ELEMENTS`` = 65536, the size from which the parallel build paid on 2
threads, keeps the small tensors of a typical training step serial, where the parallel gain
is a few microseconds and the risk a few milliseconds (the float32 row softmax's timings:
benchmarks/RESULTS.md, "Figures moved from docstrings"); ``nnkit._machine.parallel_pays`` carries
it to other thread counts.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import threading
import types

import numba

from .._machine import parallel_pays

__all__ = ["PARALLEL_MIN_ELEMENTS", "nogil_build", "one_blas_thread", "serial_numpy_blas",
           "serial_or_parallel", "serial_step_blas"]

PARALLEL_MIN_ELEMENTS = 1 << 16


def serial_or_parallel(fn, **jit_options):
    """Compile ``fn`` (whose loops use ``prange``) serial and parallel; return a launcher.

    The launcher runs the parallel build when its first argument's elements make it pay
    (``nnkit._machine.parallel_pays`` from ``PARALLEL_MIN_ELEMENTS``). ``launcher.serial`` and
    ``launcher.parallel`` are the two builds (tests hold them equal).
    """
    # Numba's on-disk cache keys a function by its qualified name and bytecode, not by the
    # compile options: two builds of one function would overwrite each other's cache
    # entries (and load the wrong build). Each build therefore compiles a renamed clone.
    parallel = numba.njit(cache=True, parallel=True, **jit_options)(_clone(fn, "_parallel"))
    serial = numba.njit(cache=True, **jit_options)(_clone(fn, "_serial"))

    def launcher(first, *args):
        build = parallel if parallel_pays(first.size, PARALLEL_MIN_ELEMENTS) else serial
        return build(first, *args)

    launcher.serial, launcher.parallel = serial, parallel
    launcher.__name__ = fn.__name__.lstrip("_")
    launcher.__qualname__ = launcher.__name__
    launcher.__doc__ = fn.__doc__
    return launcher


def nogil_build(fn, **jit_options):
    """A serial build of ``fn`` that releases the GIL (for kernels run from several Python
    threads at once), cached under its own name like ``serial_or_parallel``'s builds."""
    return numba.njit(cache=True, nogil=True, **jit_options)(_clone(fn, "_nogil"))


def _clone(fn, suffix: str):
    """A copy of ``fn`` under another name, so that it gets its own Numba cache files."""
    clone = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__ + suffix,
                               fn.__defaults__, fn.__closure__)
    clone.__qualname__ = fn.__qualname__ + suffix
    clone.__module__ = fn.__module__
    clone.__doc__ = fn.__doc__
    return clone


# ---- np.dot inside Numba kernels on one BLAS thread --------------------------------------
# Numba's np.dot calls SciPy's BLAS (scipy.linalg.cython_blas). Its worker threads spin for a
# while after each call; in a loop that alternates a small GEMM with fused elementwise work,
# the spinning worker takes the core the elementwise loop runs on: an LSTM forward that
# called np.dot per step ran several times slower with 2 BLAS threads than with one
# (benchmarks/RESULTS.md, "Figures moved from docstrings"). So kernels that call np.dot
# (the attention kernels) run with SciPy's BLAS limited to one thread (restored afterwards;
# a switch is cheap: benchmarks/RESULTS.md, "Figures moved from code comments").


@functools.cache
def _blas_of(package):
    """threadpoolctl's controller of the BLAS that ``package`` ('numpy' or 'scipy') ships
    (its ``<package>.libs`` beside it), or None (no threadpoolctl, or no such library)."""
    try:
        module = importlib.import_module(package)
        from threadpoolctl import ThreadpoolController
    except ImportError:  # scikit-learn depends on threadpoolctl; without it, no guard
        return None
    root = os.path.dirname(os.path.dirname(os.path.abspath(module.__file__)))
    for lib in ThreadpoolController().lib_controllers:
        if lib.user_api == "blas" and os.path.abspath(lib.filepath).startswith(
                os.path.join(root, package)):
            return lib
    return None


_one_thread_lock = threading.Lock()
_one_thread_users = {}  # id(lib) -> [threads inside, the thread count to restore]


@contextlib.contextmanager
def one_blas_thread(lib):
    """Run the block with the BLAS of threadpoolctl's controller ``lib`` on one thread.

    The setting is process-wide, so threads inside at once share it: the first one in sets
    one thread, the last one out restores the count the first one found (each thread
    restoring what it found could leave BLAS on one thread for good).
    """
    if lib is None:
        yield
        return
    with _one_thread_lock:
        entry = _one_thread_users.setdefault(id(lib), [0, None])
        if entry[0] == 0:
            entry[1] = lib.num_threads
            if entry[1] > 1:
                lib.set_num_threads(1)
        entry[0] += 1
    try:
        yield
    finally:
        with _one_thread_lock:
            entry[0] -= 1
            if entry[0] == 0 and entry[1] > 1:
                lib.set_num_threads(entry[1])


def serial_step_blas():
    """A context in which numba's (SciPy's) BLAS runs on one thread."""
    return one_blas_thread(_blas_of("scipy"))


def serial_numpy_blas():
    """A context in which numpy's BLAS runs on one thread (for GEMMs issued from several
    Python threads at once)."""
    return one_blas_thread(_blas_of("numpy"))
