"""Small matrix products for the time loops of the recurrent kernels, callable from Numba.

A recurrent layer multiplies a few rows of the hidden state by the same W_hh at every time
step: (B, H) x (H, G H) with B of 4-32 rows. BLAS packs its right-hand operand again at each
call and the product is too small to hide it: at these shapes the kernel below runs near the
core's FMA peak where OpenBLAS reaches a quarter to two thirds of it (benchmarks/RESULTS.md,
"Recurrent networks"). So W is packed once per sequence (``pack_panels``) and every step
calls ``step_gemm``: a C kernel (gemm_packed.h, built by setup.py for AVX-512 / AVX2+FMA /
baseline, chosen for this CPU at import, or by ``NNKIT_ISA``) whose tiles (8 rows x 32
float32 columns with AVX-512, 6 x 16 with AVX2) keep their accumulators in registers. It is
an external function for Numba: no Python and no GIL between steps, safe in ``prange``
threads, and cached Numba code finds it by name (registered with LLVM when this module is
imported).

Kernels validate nothing: ``a`` (M, K) and ``out`` (M, N) C-contiguous of one float dtype,
``bp`` from ``pack_panels`` of a (K, N) matrix of that dtype (any strides: the packing
reads a transposed view W.T down its columns, so no transposed copy is needed).
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import binding
from numba import prange, types
from numba.extending import overload

from . import gemm_packed as _c
from ._dispatch import serial_step_blas

__all__ = ["pack_panels", "pack_stacked_panels", "step_gemm", "step_gemm_ld", "stream_rows",
           "stream_fence", "matmul_packed", "matmul_rows_parallel", "matmul_inner_parallel",
           "isa", "PANEL_WIDTH"]

PANEL_WIDTH = dict(_c.PANEL_WIDTH)  # {"float32": 32, "float64": 16}
for _name, _address in _c.addresses().items():
    binding.add_symbol(_name, _address)

_SIGNATURE = types.void(types.voidptr, types.voidptr, types.voidptr, types.intp, types.intp,
                        types.intp)
_gemm_f32 = types.ExternalFunction("nnkit_gemm_packed_f32", _SIGNATURE)
_gemm_f64 = types.ExternalFunction("nnkit_gemm_packed_f64", _SIGNATURE)
_SIGNATURE_LD = types.void(types.voidptr, types.voidptr, types.voidptr, types.intp, types.intp,
                           types.intp, types.intp, types.intp)
_gemm_ld_f32 = types.ExternalFunction("nnkit_gemm_packed_ld_f32", _SIGNATURE_LD)
_gemm_ld_f64 = types.ExternalFunction("nnkit_gemm_packed_ld_f64", _SIGNATURE_LD)
_SIGNATURE_STREAM = types.void(types.voidptr, types.intp, types.voidptr, types.intp,
                               types.intp, types.intp)
_stream_f32 = types.ExternalFunction("nnkit_stream_rows_f32", _SIGNATURE_STREAM)
_stream_f64 = types.ExternalFunction("nnkit_stream_rows_f64", _SIGNATURE_STREAM)
_stream_fence = types.ExternalFunction("nnkit_stream_fence", types.void())
_NR_F32, _NR_F64 = PANEL_WIDTH["float32"], PANEL_WIDTH["float64"]


def isa() -> str:
    """The instruction set the C kernels run with on this CPU ('avx512', 'avx2', ...)."""
    return _c.isa()


@numba.njit(cache=True, inline="always")
def _fill_panels(panels, b, k0):
    """Rows [k0, k0 + K) of ``panels`` (see ``pack_panels``) from b (K, N), any strides: a
    column-major b (the transposed view of a row-major weight, W.T) is read down its
    contiguous columns."""
    K, N = b.shape
    nr = panels.shape[2]
    column_major = b.strides[0] < b.strides[1]
    for p in range(panels.shape[0]):
        n0 = p * nr
        width = min(nr, N - n0)
        if column_major:
            for q in range(width):
                col = b[:, n0 + q]
                for k in range(K):
                    panels[p, k0 + k, q] = col[k]
        else:
            for k in range(K):
                row = b[k]
                for q in range(width):
                    panels[p, k0 + k, q] = row[n0 + q]


@numba.njit(cache=True)
def pack_panels(b):
    """b (K, N) -> (ceil(N / NR), K, NR): panel p holds columns [p NR, p NR + NR), zeros
    beyond N; NR = 32 for float32, 16 for float64. b may be a transposed view (W.T)."""
    K, N = b.shape
    nr = _NR_F32 if b.itemsize == 4 else _NR_F64
    panels = np.zeros(((N + nr - 1) // nr, K, nr), dtype=b.dtype)
    _fill_panels(panels, b, 0)
    return panels


@numba.njit(cache=True)
def pack_stacked_panels(top, bottom):
    """``pack_panels`` of the row-stacked [top; bottom], top (K1, N) and bottom (K2, N),
    without building the stack (e.g. [W_ih^T; W_hh^T] from the views W_ih.T, W_hh.T)."""
    K1, N = top.shape
    nr = _NR_F32 if top.itemsize == 4 else _NR_F64
    panels = np.zeros(((N + nr - 1) // nr, K1 + bottom.shape[0], nr), dtype=top.dtype)
    _fill_panels(panels, top, 0)
    _fill_panels(panels, bottom, K1)
    return panels


def step_gemm(a, bp, out):
    """out (M, N) = a (M, K) @ b (K, N), b given as ``pack_panels(b)``; inlined into Numba
    kernels (the overload below), and callable from Python too."""
    _matmul_packed(a, bp, out)


@overload(step_gemm, inline="always")
def _step_gemm(a, bp, out):
    kernel = _gemm_f32 if a.dtype == types.float32 else _gemm_f64

    def impl(a, bp, out):
        kernel(a.ctypes, bp.ctypes, out.ctypes, a.shape[0], a.shape[1], out.shape[1])

    return impl


def step_gemm_ld(a, bp, out, accumulate):
    """out (M, N) = a (M, K) @ b (K, N), or out += a @ b when ``accumulate``; a may be a block
    of columns of a wider C-contiguous matrix (rows a.strides[0] apart, elements adjacent),
    e.g. at[:, k0:k1]; b as ``pack_panels(b)``, or a block of rows of one panel (gp[p:p + 1,
    k0:k1]: the panels of a block of rows are not K rows apart).
    Inlined into Numba kernels (the overload below), and callable from Python too."""
    _matmul_packed_ld(a, bp, out, accumulate)


@overload(step_gemm_ld, inline="always")
def _step_gemm_ld(a, bp, out, accumulate):
    kernel = _gemm_ld_f32 if a.dtype == types.float32 else _gemm_ld_f64

    def impl(a, bp, out, accumulate):
        kernel(a.ctypes, bp.ctypes, out.ctypes, a.shape[0], a.shape[1], out.shape[1],
               a.strides[0] // a.itemsize, 1 if accumulate else 0)

    return impl


def stream_rows(src, dst):
    """dst[:, :] = src (2-D, rows any distance apart, elements adjacent) with non-temporal
    stores (gemm_packed.h): for output no later step reads, kept out of the cache. A thread
    calls ``stream_fence()`` after its last such copy. For Numba kernels (the overload)."""
    dst[:, :] = src


@overload(stream_rows, inline="always")
def _stream_rows(src, dst):
    kernel = _stream_f32 if src.dtype == types.float32 else _stream_f64

    def impl(src, dst):
        kernel(src.ctypes, src.strides[0] // src.itemsize, dst.ctypes,
               dst.strides[0] // dst.itemsize, dst.shape[0], dst.shape[1])

    return impl


def stream_fence():
    """Orders this thread's ``stream_rows`` stores before its later stores (SFENCE)."""


@overload(stream_fence, inline="always")
def _stream_fence_impl():
    return lambda: _stream_fence()


@numba.njit(cache=True)
def _matmul_packed_ld(a, bp, out, accumulate):
    step_gemm_ld(a, bp, out, accumulate)


@numba.njit(cache=True)
def _matmul_packed(a, bp, out):
    step_gemm(a, bp, out)


def matmul_packed(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a (M, K) @ b (K, N) through ``pack_panels`` + ``step_gemm`` (for tests and
    benchmarks); float32 or float64, both of one dtype."""
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    if a.dtype != b.dtype or a.dtype not in (np.float32, np.float64):
        raise TypeError(f"a and b: expected one dtype, float32 or float64, got {a.dtype} "
                        f"and {b.dtype}")
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"a (M, K) and b (K, N): got shapes {a.shape} and {b.shape}")
    out = np.empty((a.shape[0], b.shape[1]), dtype=a.dtype)
    _matmul_packed(a, pack_panels(b), out)
    return out


@numba.njit(cache=True, parallel=True)
def _rows_parallel(a, b, out, parts):
    bp = pack_panels(b)
    M = a.shape[0]
    for k in prange(parts):
        r0 = (k * M // parts) // 4 * 4  # block edges on whole register tiles
        r1 = M if k == parts - 1 else ((k + 1) * M // parts) // 4 * 4
        step_gemm(a[r0:r1], bp, out[r0:r1])


def matmul_rows_parallel(a: np.ndarray, b: np.ndarray, parts: int) -> np.ndarray:
    """a (M, K) @ b (K, N) by ``parts`` blocks of a's rows on numba's threads (b packed
    once); a C-contiguous, b any layout, one float dtype (unchecked: the caller's job)."""
    out = np.empty((a.shape[0], b.shape[1]), dtype=a.dtype)
    _rows_parallel(a, b, out, parts)
    return out


@numba.njit(cache=True, parallel=True)
def _inner_parallel(at, b, out, parts):
    K = at.shape[0]
    partial = np.empty((parts,) + out.shape, dtype=out.dtype)
    for k in prange(parts):
        r0, r1 = k * K // parts, (k + 1) * K // parts
        np.dot(at[r0:r1].T, b[r0:r1], partial[k])
    out[:, :] = partial[0]
    for k in range(1, parts):
        out += partial[k]


def matmul_inner_parallel(a: np.ndarray, b: np.ndarray, parts: int) -> np.ndarray:
    """a (M, K) @ b (K, N) for a = at.T with ``at`` (K, M) C-contiguous (a weight gradient
    g^T x): ``parts`` blocks of the K rows on numba's threads, each a one-thread BLAS
    product, the partial sums added. b C-contiguous, one float dtype (unchecked)."""
    out = np.empty((a.shape[0], b.shape[1]), dtype=a.dtype)
    with serial_step_blas():
        _inner_parallel(a.T, b, out, parts)
    return out
