# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Cython row kernels of the softmax family (the second CPU implementation).

``softmax_rows(x, out)`` and ``log_softmax_rows(x, out)``: 2-D C-contiguous float32 or
float64 rows ``(R, C)`` in, preallocated ``out`` of the same shape and dtype; the same
launcher signatures as ``nnkit._ext.softmax_cpu``. One thread, libm ``exp``/``expf`` (gcc
without ``-march`` flags does not vectorise them), sums accumulated in double. The Numba
kernels are faster and are the CPU backend; see ``nnkit.kernels.softmax``.
"""

from cython cimport floating
from libc.math cimport exp, expf, log, INFINITY


cdef inline floating _exp(floating z) noexcept nogil:
    if floating is float:
        return expf(z)
    else:
        return exp(z)


cdef inline floating _row_max(const floating* xr, Py_ssize_t C) noexcept nogil:
    """max of a row (C >= 1); NaN anywhere gives NaN."""
    cdef Py_ssize_t j
    cdef floating m = xr[0]
    for j in range(C):
        if xr[j] > m or xr[j] != xr[j]:
            m = xr[j]
            if m != m:
                return m
    return m


cdef void _softmax_rows(const floating* x, floating* out, Py_ssize_t R, Py_ssize_t C,
                        bint log_output) noexcept nogil:
    """out[i] = softmax(x[i]) or log_softmax(x[i]) over rows of length C."""
    cdef Py_ssize_t i, j
    cdef const floating* xr
    cdef floating* yr
    cdef floating m, e
    cdef double s, inv, lse
    for i in range(R):
        xr = x + i * C
        yr = out + i * C
        m = _row_max(xr, C)
        s = 0.0
        for j in range(C):
            e = _exp(xr[j] - m)
            yr[j] = e
            s += e
        if log_output:
            lse = m + log(s)
            for j in range(C):
                yr[j] = <floating>(xr[j] - lse)
        else:
            inv = 1.0 / s
            for j in range(C):
                yr[j] = <floating>(yr[j] * inv)


def _check(x, out):
    if x.shape[0] != out.shape[0] or x.shape[1] != out.shape[1]:
        raise ValueError(f"out has shape {tuple(out.shape)[:2]}, expected {tuple(x.shape)[:2]}")


def softmax_rows(const floating[:, ::1] x, floating[:, ::1] out):
    """out[i] = exp(x[i] - max x[i]) / sum_j exp(x[i, j] - max x[i]); x, out (R, C)."""
    _check(x, out)
    if x.shape[0] == 0 or x.shape[1] == 0:
        return
    with nogil:
        _softmax_rows(&x[0, 0], &out[0, 0], x.shape[0], x.shape[1], False)


def log_softmax_rows(const floating[:, ::1] x, floating[:, ::1] out):
    """out[i] = x[i] - max x[i] - log sum_j exp(x[i, j] - max x[i]); x, out (R, C)."""
    _check(x, out)
    if x.shape[0] == 0 or x.shape[1] == 0:
        return
    with nogil:
        _softmax_rows(&x[0, 0], &out[0, 0], x.shape[0], x.shape[1], True)
