"""Serial or parallel: compile a row kernel both ways and pick by problem size.

Waking Numba's thread pool costs tens of microseconds (far more when the cores are busy,
and a pool left spinning steals a core from OpenBLAS right after): for small inputs the
serial build is faster. Measured for the float32 row softmax, 2 threads (omp layer), median
of 200 calls on a quiet machine:

    elements      640   16384   65536   131072   1048576
    serial us     3.6    12.0    38.5     58.1     450.4
    parallel us   4.6     7.2    28.4     34.9     255.9

and with the second core busy (another process running) every parallel call cost ~8000 us:
the barrier waits for a scheduler time slice. ``PARALLEL_MIN_ELEMENTS`` = 65536 keeps the
small tensors of a typical training step serial, where the parallel gain is a few
microseconds and the risk a few milliseconds.
"""

from __future__ import annotations

import types

import numba

__all__ = ["PARALLEL_MIN_ELEMENTS", "serial_or_parallel"]

PARALLEL_MIN_ELEMENTS = 1 << 16


def serial_or_parallel(fn, **jit_options):
    """Compile ``fn`` (whose loops use ``prange``) serial and parallel; return a launcher.

    The launcher runs the parallel build when its first argument has at least
    ``PARALLEL_MIN_ELEMENTS`` elements. ``launcher.serial`` and ``launcher.parallel`` are
    the two builds (tests hold them equal).
    """
    # Numba's on-disk cache keys a function by its qualified name and bytecode, not by the
    # compile options: two builds of one function would overwrite each other's cache
    # entries (and load the wrong build). Each build therefore compiles a renamed clone.
    parallel = numba.njit(cache=True, parallel=True, **jit_options)(_clone(fn, "_parallel"))
    serial = numba.njit(cache=True, **jit_options)(_clone(fn, "_serial"))

    def launcher(first, *args):
        build = parallel if first.size >= PARALLEL_MIN_ELEMENTS else serial
        return build(first, *args)

    launcher.serial, launcher.parallel = serial, parallel
    launcher.__name__ = fn.__name__.lstrip("_")
    launcher.__qualname__ = launcher.__name__
    launcher.__doc__ = fn.__doc__
    return launcher


def _clone(fn, suffix: str):
    """A copy of ``fn`` under another name, so that it gets its own Numba cache files."""
    clone = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__ + suffix,
                               fn.__defaults__, fn.__closure__)
    clone.__qualname__ = fn.__qualname__ + suffix
    clone.__module__ = fn.__module__
    clone.__doc__ = fn.__doc__
    return clone
