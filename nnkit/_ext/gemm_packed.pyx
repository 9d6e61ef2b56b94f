# cython: language_level=3
"""Addresses of the packed-panel GEMM kernels of gemm_packed.h, for Numba to call.

The C functions are chosen for this CPU (AVX-512, AVX2+FMA or baseline; the lower set that
``NNKIT_ISA`` names, if set) when this module is imported; ``nnkit._ext.gemm_cpu`` registers their addresses with LLVM under the names below,
so Numba kernels call them as external functions (no Python, no GIL, callable from
``prange`` threads), and cached Numba code finds them by name in a new process.
"""

from . import check_isa_request

cdef extern from "gemm_packed.h":
    int nnkit_cpu_level() noexcept nogil
    ctypedef void (*nnkit_gemm_f32_fn)(const float *, const float *, float *, Py_ssize_t,
                                       Py_ssize_t, Py_ssize_t) noexcept nogil
    ctypedef void (*nnkit_gemm_f64_fn)(const double *, const double *, double *, Py_ssize_t,
                                       Py_ssize_t, Py_ssize_t) noexcept nogil
    nnkit_gemm_f32_fn gemm_select_f32() noexcept nogil
    nnkit_gemm_f64_fn gemm_select_f64() noexcept nogil
    const char *gemm_isa() noexcept nogil
    void *gemm_variant(int which, int f64) noexcept nogil
    void *gemm_select_ld(int f64) noexcept nogil
    void stream_rows_f32(const float *, Py_ssize_t, float *, Py_ssize_t, Py_ssize_t,
                         Py_ssize_t) noexcept nogil
    void stream_rows_f64(const double *, Py_ssize_t, double *, Py_ssize_t, Py_ssize_t,
                         Py_ssize_t) noexcept nogil
    void stream_fence() noexcept nogil
    int NNKIT_GEMM_NR_F32
    int NNKIT_GEMM_NR_F64

check_isa_request(nnkit_cpu_level())

#: columns per packed panel, by dtype name
PANEL_WIDTH = {"float32": NNKIT_GEMM_NR_F32, "float64": NNKIT_GEMM_NR_F64}


def addresses():
    """{symbol name: address} of the kernels chosen for this CPU."""
    return {"nnkit_gemm_packed_f32": <size_t>gemm_select_f32(),
            "nnkit_gemm_packed_f64": <size_t>gemm_select_f64(),
            "nnkit_gemm_packed_ld_f32": <size_t>gemm_select_ld(0),
            "nnkit_gemm_packed_ld_f64": <size_t>gemm_select_ld(1),
            "nnkit_stream_rows_f32": <size_t>&stream_rows_f32,
            "nnkit_stream_rows_f64": <size_t>&stream_rows_f64,
            "nnkit_stream_fence": <size_t>&stream_fence}


def variant_addresses():
    """{(isa, dtype name): address} of every build this CPU can run (for the tests)."""
    found = {}
    for which, name in enumerate(("baseline", "avx2", "avx512")):
        for f64, dtype in ((0, "float32"), (1, "float64")):
            address = <size_t>gemm_variant(which, f64)
            if address:
                found[name, dtype] = address
    return found


def isa():
    """The instruction set the kernels were chosen for: 'avx512', 'avx2', 'baseline' or
    'plain' (a compiler without vector extensions)."""
    return gemm_isa().decode()
