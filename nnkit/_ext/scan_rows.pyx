# cython: language_level=3
"""Addresses of the linear-scan row kernels of scan_rows.h, for Numba to call.

The builds for this CPU (AVX-512, AVX2+FMA or baseline; the lower set that ``NNKIT_ISA``
names, if set) are chosen when this module is imported; ``nnkit._ext.scan_cpu`` registers their addresses with LLVM under the names of
``addresses()``, so Numba kernels call them as external functions from ``prange`` threads.
"""

from . import check_isa_request

cdef extern from "scan_rows.h":
    int nnkit_cpu_level() noexcept nogil
    int nnkit_isa_level() noexcept nogil
    const char *nnkit_isa_name(int level) noexcept nogil
    void *scan_kernel(int level, int k) noexcept nogil

check_isa_request(nnkit_cpu_level())

TYPES = ("f32", "f64", "c64", "c128")


def _table(int level):
    found = {}
    for t, name in enumerate(TYPES):
        for direction, way in enumerate(("fwd", "bwd")):
            address = <size_t>scan_kernel(level, 2 * t + direction)
            if address:
                found[f"nnkit_scan_{way}_{name}"] = address
    return found


def addresses():
    """{symbol name: address} of the kernels built for this CPU."""
    return _table(nnkit_isa_level())


def variant_addresses():
    """{isa name: {symbol name: address}} of every build this CPU can run (for the tests)."""
    return {nnkit_isa_name(level).decode(): _table(level)
            for level in range(nnkit_cpu_level() + 1)}


def isa():
    """The instruction set the kernels were chosen for: 'avx512', 'avx2' or 'baseline'."""
    return nnkit_isa_name(nnkit_isa_level()).decode()
