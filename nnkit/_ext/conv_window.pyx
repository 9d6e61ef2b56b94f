# cython: language_level=3
"""Stride-1 convolution kernels of conv_window.h (the "window" GEMM), for
nnkit.kernels.conv: each call runs a range of images with the GIL released, so the
caller's threads (one run of images each) run in parallel.

Each call checks what the C kernel relies on (dtypes, C-contiguity, sizes) and raises
ValueError otherwise: the arrays are sized from the geometry here, and the kernel reads and
writes them with no bounds checks.
"""

cimport numpy as cnp

import numpy as np

cnp.import_array()

cdef extern from "conv_window.h":
    ctypedef struct cw_geom:
        Py_ssize_t C, H, W, K, kh, kw, pt, pl, dh, dw, Ho, Wo
    ctypedef int (*cw_forward_f32_fn)(const float *, const float *, const float *, float *,
                                      const cw_geom *, Py_ssize_t, Py_ssize_t) noexcept nogil
    ctypedef int (*cw_forward_f64_fn)(const double *, const double *, const double *,
                                      double *, const cw_geom *, Py_ssize_t,
                                      Py_ssize_t) noexcept nogil
    ctypedef int (*cw_backward_f32_fn)(const float *, const float *, const float *, float *,
                                       float *, const cw_geom *, Py_ssize_t,
                                       Py_ssize_t) noexcept nogil
    ctypedef int (*cw_backward_f64_fn)(const double *, const double *, const double *,
                                       double *, double *, const cw_geom *, Py_ssize_t,
                                       Py_ssize_t) noexcept nogil
    void *cw_kernel(int which, int k) noexcept nogil
    int nnkit_isa_level() noexcept nogil
    const char *nnkit_isa_name(int level) noexcept nogil
    const int cw_available

#: whether this build has the kernels (GCC/Clang vector extensions)
AVAILABLE = bool(cw_available)
ISA_LEVEL = nnkit_isa_level()
NR = {np.dtype(np.float32): 32, np.dtype(np.float64): 16}  # panel width (accumulator)


def isa_names():
    """The instruction sets this CPU runs, by level (0 baseline, 1 AVX2+FMA, 2 AVX-512)."""
    return [nnkit_isa_name(level).decode() for level in range(ISA_LEVEL + 1)]


cdef cw_geom _geometry(tuple g) except *:
    cdef cw_geom out
    if len(g) != 12:
        raise ValueError(f"geometry: expected 12 integers, got {len(g)}")
    out.C, out.H, out.W, out.K, out.kh, out.kw, out.pt, out.pl, out.dh, out.dw, out.Ho, \
        out.Wo = g
    if min(g) < 0 or min(out.C, out.H, out.W, out.K, out.kh, out.kw, out.dh, out.dw,
                         out.Ho, out.Wo) < 1:
        raise ValueError(f"geometry: expected positive sizes, got {g}")
    # padding below/right: Ho + (kh - 1) dh - H - pt, likewise; all four in 0 .. (k - 1) d
    if not (out.H + out.pt - (out.kh - 1) * out.dh <= out.Ho <= out.H + out.pt
            and out.W + out.pl - (out.kw - 1) * out.dw <= out.Wo <= out.W + out.pl
            and out.pt <= (out.kh - 1) * out.dh and out.pl <= (out.kw - 1) * out.dw):
        raise ValueError(f"geometry: padding outside 0 .. (k - 1) d, got {g}")
    return out


cdef void _check(name, a, dtype, Py_ssize_t size) except *:
    if not isinstance(a, np.ndarray) or a.dtype != dtype or not a.flags.c_contiguous:
        raise ValueError(f"{name}: expected a C-contiguous {dtype} ndarray, got "
                         f"{type(a).__name__} {getattr(a, 'dtype', '')}")
    if a.size != size:
        raise ValueError(f"{name}: expected {size} elements, got {a.size}")


cdef void _check_range(Py_ssize_t lo, Py_ssize_t hi, Py_ssize_t N) except *:
    if not 0 <= lo <= hi <= N:
        raise ValueError(f"images [lo, hi): expected 0 <= lo <= hi <= {N}, got [{lo}, {hi})")


cdef int _level(int isa) except -2:
    if not AVAILABLE:
        raise RuntimeError("conv_window: this build has no vector kernels")
    if isa < 0:
        return ISA_LEVEL
    if isa > ISA_LEVEL:
        raise ValueError(f"isa: this CPU runs levels 0 .. {ISA_LEVEL}, got {isa}")
    return isa


def forward(x, wp, bias, y, tuple geometry, Py_ssize_t lo, Py_ssize_t hi, int isa=-1):
    """y[n] (K, Ho Wo) = the stride-1 convolution of x[n] (C, H, W) for n in [lo, hi).

    x (N, C, H, W), y (N, K, Ho, Wo), wp (ceil(K / 8), C kh kw, 8) the packed weight, bias
    (K,) or None; geometry (C, H, W, K, kh, kw, pt, pl, dh, dw, Ho, Wo)."""
    cdef cw_geom g = _geometry(geometry)
    cdef int level = _level(isa)
    dtype = x.dtype
    if dtype not in NR:
        raise ValueError(f"x: expected float32 or float64, got {dtype}")
    N = x.shape[0]
    _check("x", x, dtype, N * g.C * g.H * g.W)
    _check("wp", wp, dtype, (g.K + 7) // 8 * 8 * g.C * g.kh * g.kw)
    _check("y", y, dtype, N * g.K * g.Ho * g.Wo)
    if bias is not None:
        _check("bias", bias, dtype, g.K)
    _check_range(lo, hi, N)
    cdef void *px = cnp.PyArray_DATA(x)
    cdef void *pw = cnp.PyArray_DATA(wp)
    cdef void *pb = NULL if bias is None else cnp.PyArray_DATA(bias)
    cdef void *py = cnp.PyArray_DATA(y)
    cdef int status
    if dtype == np.float32:
        with nogil:
            status = (<cw_forward_f32_fn>cw_kernel(level, 0))(
                <const float *>px, <const float *>pw, <const float *>pb, <float *>py, &g,
                lo, hi)
    else:
        with nogil:
            status = (<cw_forward_f64_fn>cw_kernel(level, 1))(
                <const double *>px, <const double *>pw, <const double *>pb, <double *>py,
                &g, lo, hi)
    if status:
        raise MemoryError("conv_window.forward: workspace allocation failed")


def backward(x, dy, wfp, dx, acc, tuple geometry, Py_ssize_t lo, Py_ssize_t hi,
             int isa=-1):
    """For n in [lo, hi): acc += cols(x[n]) @ dy[n]^T (the transposed weight gradient, when
    acc is not None) and dx[n] = the input gradient (when dx is not None).

    dy (N, K, Ho, Wo); wfp (ceil(C / 8), K kh kw, 8) the packed flipped, transposed weight;
    acc (ceil(C kh kw / 8) 8, ceil(K / NR) NR), NR = 32 (float32) or 16 (float64)."""
    cdef cw_geom g = _geometry(geometry)
    cdef int level = _level(isa)
    dtype = x.dtype
    if dtype not in NR:
        raise ValueError(f"x: expected float32 or float64, got {dtype}")
    N = x.shape[0]
    nr = NR[dtype]
    _check("x", x, dtype, N * g.C * g.H * g.W)
    _check("dy", dy, dtype, N * g.K * g.Ho * g.Wo)
    if dx is not None:
        _check("dx", dx, dtype, N * g.C * g.H * g.W)
        _check("wfp", wfp, dtype, (g.C + 7) // 8 * 8 * g.K * g.kh * g.kw)
    if acc is not None:
        _check("acc", acc, dtype, (g.C * g.kh * g.kw + 7) // 8 * 8 * ((g.K + nr - 1) // nr * nr))
    _check_range(lo, hi, N)
    cdef void *px = cnp.PyArray_DATA(x)
    cdef void *pdy = cnp.PyArray_DATA(dy)
    cdef void *pw = NULL if dx is None else cnp.PyArray_DATA(wfp)
    cdef void *pdx = NULL if dx is None else cnp.PyArray_DATA(dx)
    cdef void *pacc = NULL if acc is None else cnp.PyArray_DATA(acc)
    cdef int status
    if dtype == np.float32:
        with nogil:
            status = (<cw_backward_f32_fn>cw_kernel(level, 2))(
                <const float *>px, <const float *>pdy, <const float *>pw, <float *>pdx,
                <float *>pacc, &g, lo, hi)
    else:
        with nogil:
            status = (<cw_backward_f64_fn>cw_kernel(level, 3))(
                <const double *>px, <const double *>pdy, <const double *>pw, <double *>pdx,
                <double *>pacc, &g, lo, hi)
    if status:
        raise MemoryError("conv_window.backward: workspace allocation failed")
