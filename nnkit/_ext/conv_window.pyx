# cython: language_level=3
"""Convolution kernels of conv_window.h (the "window" GEMM), for
nnkit.kernels.conv: each call runs the whole batch with the GIL released, split into one
run of images per thread (C threads, part_threads.h).

Each call checks what the C kernel relies on (types, dtypes, C-contiguity, sizes, a geometry
whose sizes and workspaces fit in 64-bit indices) and raises ValueError otherwise: the
arrays are sized from the geometry here, and the kernel reads and writes them with no
bounds checks.
"""

cimport numpy as cnp

import numpy as np

from . import check_isa_request

cnp.import_array()

cdef extern from "conv_window.h":
    ctypedef struct cw_geom:
        Py_ssize_t C, H, W, K, kh, kw, pt, pl, dh, dw, Ho, Wo, sh, sw
    int cw_forward_run(int which, int f64, const void *x, const void *wp, const void *bias,
                       void *y, const cw_geom *g, Py_ssize_t N, Py_ssize_t parts) noexcept nogil
    int cw_backward_run(int which, int f64, const void *x, const void *dy, const void *wfp,
                        void *dx, void *acc, Py_ssize_t acc_bytes, double *db,
                        const cw_geom *g, Py_ssize_t N, Py_ssize_t parts) noexcept nogil
    int nnkit_cpu_level() noexcept nogil
    int nnkit_isa_level() noexcept nogil
    const char *nnkit_isa_name(int level) noexcept nogil
    const int cw_available
    const int PART_THREADS_MAX
    long part_threads_set_spin(long ns) noexcept nogil

#: whether this build has the kernels (GCC/Clang vector extensions)
AVAILABLE = bool(cw_available)
#: the best instruction-set level this CPU runs, and the one the kernels run with by default
#: (lower when ``NNKIT_ISA`` names a lower set)
CPU_LEVEL = nnkit_cpu_level()
check_isa_request(CPU_LEVEL)
ISA_LEVEL = nnkit_isa_level()
NR = {np.dtype(np.float32): 32, np.dtype(np.float64): 16}  # panel width (accumulator)


def set_spin(ns):
    """How long, in nanoseconds, the C threads wait without sleeping (for a worker its next
    part, for the caller the workers' ends) before they sleep; returns the previous value.
    (For benchmarks/bench_conv_threads.py; the default is 100 us.)"""
    if not isinstance(ns, (int, np.integer)) or not 0 <= ns <= 10 ** 10:
        raise ValueError(f"ns: expected an integer in 0 .. 10**10, got {ns!r}")
    return part_threads_set_spin(ns)


def isa_names():
    """The instruction sets this CPU runs, by level (0 baseline, 1 AVX2+FMA, 2 AVX-512)."""
    return [nnkit_isa_name(level).decode() for level in range(CPU_LEVEL + 1)]


# Largest geometry entry, and largest array or workspace (elements): far below 2^63, so the
# C kernel's index products cannot overflow.
MAX_EXTENT = 2 ** 31 - 1
MAX_ELEMENTS = 2 ** 50


def _sizes(tuple g):
    """The geometry checked, as Python ints: (C, H, W, K, kh, kw, pt, pl, dh, dw, Ho, Wo,
    sh, sw)."""
    if len(g) != 14:
        raise ValueError(f"geometry: expected 14 integers, got {len(g)}")
    if not all(isinstance(v, (int, np.integer)) and 0 <= v <= MAX_EXTENT for v in g):
        raise ValueError(f"geometry: expected integers in 0 .. {MAX_EXTENT}, got {g}")
    C, H, W, K, kh, kw, pt, pl, dh, dw, Ho, Wo, sh, sw = (int(v) for v in g)
    if min(C, H, W, K, kh, kw, dh, dw, Ho, Wo, sh, sw) < 1:
        raise ValueError(f"geometry: expected positive sizes, got {g}")
    # Ho = (H + pt + pb - (kh - 1) dh - 1) // sh + 1 for a padding below pb, likewise Wo:
    # every padding in 0 .. (k - 1) d
    for size, out, k, d, s, before in ((H, Ho, kh, dh, sh, pt), (W, Wo, kw, dw, sw, pl)):
        if not (before <= (k - 1) * d
                and max(1, (size + before - (k - 1) * d - 1) // s + 1) <= out
                <= (size + before - 1) // s + 1):
            raise ValueError(f"geometry: padding outside 0 .. (k - 1) d, got {g}")
    Hq, Wq = Ho + (kh - 1) * dh // sh, Wo + (kw - 1) * dw // sw
    padded = max(sh * sw * C * Hq * Wq, K * (H + (kh - 1) * dh) * (W + (kw - 1) * dw)) + 64 + Wq
    if max(padded, (K + 31) * Ho * Wq, (C + K + 8) * kh * kw * (K + C + 32)) > MAX_ELEMENTS:
        raise ValueError(f"geometry: workspaces beyond {MAX_ELEMENTS} elements, got {g}")
    return C, H, W, K, kh, kw, pt, pl, dh, dw, Ho, Wo, sh, sw


cdef cw_geom _geometry(tuple sizes):
    """The C struct of ``_sizes``' checked tuple."""
    cdef cw_geom out
    out.C, out.H, out.W, out.K, out.kh, out.kw, out.pt, out.pl, out.dh, out.dw, out.Ho, \
        out.Wo, out.sh, out.sw = sizes
    return out


def _common(x, geometry, isa):
    """What both calls check first: (the geometry's sizes, the ISA level, x's dtype, N)."""
    sizes = _sizes(geometry)
    level = _level(isa)
    dtype = _dtype_of(x)
    C, H, W = sizes[:3]
    _check("x", x, dtype, x.shape[0] * C * H * W)
    return sizes, level, dtype, x.shape[0]


def _dtype_of(x):
    """x's dtype, x a 4-d float32 or float64 ndarray."""
    if not isinstance(x, np.ndarray) or x.ndim != 4:
        raise ValueError(f"x: expected a 4-d ndarray, got {type(x).__name__} "
                         f"{getattr(x, 'shape', '')}")
    if x.dtype not in NR:
        raise ValueError(f"x: expected float32 or float64, got {x.dtype}")
    return x.dtype


def _check(name, a, dtype, size):
    if not isinstance(a, np.ndarray) or a.dtype != dtype or not a.flags.c_contiguous:
        raise ValueError(f"{name}: expected a C-contiguous {dtype} ndarray, got "
                         f"{type(a).__name__} {getattr(a, 'dtype', '')}")
    if a.size != size:
        raise ValueError(f"{name}: expected {size} elements, got {a.size}")


def _level(isa):
    if not AVAILABLE:
        raise RuntimeError("conv_window: this build has no vector kernels")
    if not isinstance(isa, (int, np.integer)) or isa > CPU_LEVEL:
        raise ValueError(f"isa: expected an integer <= {CPU_LEVEL} (< 0: ISA_LEVEL, the "
                         f"default build), got {isa!r}")
    return ISA_LEVEL if isa < 0 else int(isa)


def _threads(threads):
    if not isinstance(threads, (int, np.integer)) or not 1 <= threads <= PART_THREADS_MAX:
        raise ValueError(f"threads: expected an integer in 1 .. {PART_THREADS_MAX}, got "
                         f"{threads!r}")
    return int(threads)


cdef void _raise_for(int status, str what) except *:
    if status == -1:
        raise MemoryError(f"conv_window.{what}: workspace allocation failed")
    if status:
        raise RuntimeError(f"conv_window.{what}: no worker thread could be started")


def forward(x, wp, bias, y, tuple geometry, threads=1, isa=-1):
    """y[n] (K, Ho Wo) = the convolution of x[n] (C, H, W), the batch split into
    ``threads`` runs of images (the calling thread runs the first).

    x (N, C, H, W), y (N, K, Ho, Wo), wp (ceil(K / 8), C kh kw, 8) the packed weight, bias
    (K,) or None; geometry (C, H, W, K, kh, kw, pt, pl, dh, dw, Ho, Wo, sh, sw)."""
    cdef int level
    cdef Py_ssize_t N
    sizes, level, dtype, N = _common(x, geometry, isa)
    C, H, W, K, kh, kw, _, _, _, _, Ho, Wo, sh, sw = sizes
    cdef cw_geom g = _geometry(sizes)
    _check("wp", wp, dtype, (K + 7) // 8 * 8 * C * kh * kw)
    _check("y", y, dtype, N * K * Ho * Wo)
    if bias is not None:
        _check("bias", bias, dtype, K)
    cdef Py_ssize_t parts = max(1, min(_threads(threads), N))
    cdef int f64 = dtype == np.float64
    cdef void *px = cnp.PyArray_DATA(x)
    cdef void *pw = cnp.PyArray_DATA(wp)
    cdef void *pb = NULL if bias is None else cnp.PyArray_DATA(bias)
    cdef void *py = cnp.PyArray_DATA(y)
    cdef int status
    with nogil:
        status = cw_forward_run(level, f64, px, pw, pb, py, &g, N, parts)
    _raise_for(status, "forward")


def accumulator_shape(tuple geometry, dtype, threads=1):
    """The shape of ``backward``'s acc: (threads, ceil(C kh kw / 8) 8, ceil(K / NR) NR), NR
    = 32 for float32, 16 for float64; acc[p, :C kh kw, :K] is part p's dW^T."""
    C, K, kh, kw = geometry[0], geometry[3], geometry[4], geometry[5]
    nr = NR[np.dtype(dtype)]
    return (threads, -(-C * kh * kw // 8) * 8, -(-K // nr) * nr)


def backward(x, dy, wfp, dx, acc, db, tuple geometry, threads=1, isa=-1):
    """The batch in ``threads`` runs of images, run p adding cols(x[n]) @ dy[n]^T into
    acc[p] (the transposed weight gradient, when acc is not None) and the sums of dy[n]'s
    planes into db[p] (float64, when db is not None), and writing the input gradient dx[n]
    (when dx is not None; stride 1 only).

    dy (N, K, Ho, Wo); wfp (ceil(C / 8), K kh kw, 8) the packed flipped, transposed weight;
    acc ``accumulator_shape(geometry, dtype, threads)``, db (threads, K): both zeros, or
    what to add to."""
    cdef int level
    cdef Py_ssize_t N
    sizes, level, dtype, N = _common(x, geometry, isa)
    C, H, W, K, kh, kw, _, _, _, _, Ho, Wo, sh, sw = sizes
    cdef cw_geom g = _geometry(sizes)
    _check("dy", dy, dtype, N * K * Ho * Wo)
    if dx is not None:
        if (sh, sw) != (1, 1):
            raise ValueError(f"dx: the input gradient needs stride 1, got {(sh, sw)}")
        _check("dx", dx, dtype, N * C * H * W)
        _check("wfp", wfp, dtype, (C + 7) // 8 * 8 * K * kh * kw)
    threads = _threads(threads)
    cdef Py_ssize_t acc_size = 0
    if acc is not None:
        shape = accumulator_shape(geometry, dtype, threads)
        _check("acc", acc, dtype, shape[0] * shape[1] * shape[2])
        acc_size = shape[1] * shape[2]
    if db is not None:
        _check("db", db, np.dtype(np.float64), threads * K)
    # the runs: ``threads`` of them with accumulators, fewer when there are fewer images
    cdef Py_ssize_t parts = max(1, min(threads, N))
    cdef int f64 = dtype == np.float64
    cdef void *px = cnp.PyArray_DATA(x)
    cdef void *pdy = cnp.PyArray_DATA(dy)
    cdef void *pw = NULL if dx is None else cnp.PyArray_DATA(wfp)
    cdef void *pdx = NULL if dx is None else cnp.PyArray_DATA(dx)
    cdef void *pacc = NULL if acc is None else cnp.PyArray_DATA(acc)
    cdef double *pdb = NULL if db is None else <double *>cnp.PyArray_DATA(db)
    cdef Py_ssize_t acc_bytes = acc_size * dtype.itemsize
    cdef int status
    with nogil:
        status = cw_backward_run(level, f64, px, pdy, pw, pdx, pacc, acc_bytes, pdb, &g, N,
                                 parts)
    _raise_for(status, "backward")
