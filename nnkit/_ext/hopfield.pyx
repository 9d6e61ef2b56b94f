# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Asynchronous Hopfield dynamics with cached local fields (Cython, one thread per call).

``async_run(couplings, states, fields, order_work, rows, max_sweeps, shuffle, seed, sweeps,
converged, thresholds=None)`` runs x_i <- sgn(h_i), sgn(0) = +1, one neuron at a time, on
``states[rows[k]]``. ``init_fields`` computes the fields from the stored patterns when s < n / 2.

Biases. With ``thresholds`` t (n,) float64, neuron i takes +1 iff h_i >= t_i: the caller
passes t = -n b for the biases b of the local field W x + b (h = C x = n W x stays the cached
integer field, and the comparison of a float32 or float64 integer with a double is exact, so
the twins decide the same way at every tie). ``None`` (no biases) is the comparison with 0.

The local fields h = C x are kept in ``fields`` (the caller computes them once, e.g. with a
BLAS product) and updated only when a neuron flips: x_i -> -x_i changes every field by
h_j += 2 x_i(new) C[j, i] = 2 x_i(new) C[i, j] (C symmetric, zero diagonal), so a flip costs
O(n) and a visit that changes nothing O(1). ``couplings`` C = n W holds integers (the
Hebbian sum of outer products); the caller picks a float dtype in which every field is an
exactly representable integer (|h| < 2^24 for float32, 2^53 for float64), so the cached
fields equal a recomputation exactly and the signs are exact, ties included.

Neuron order: 0..n-1 every sweep, or (``shuffle``) a fresh random permutation per sweep:
``order`` starts as 0..n-1 and before every sweep gets a Fisher-Yates shuffle driven by
splitmix64 seeded with ``seed`` (the same stream for every state, so a batch equals its
states run one by one; j = ((z >> 32) (i + 1)) >> 32, a bias below n / 2^32). ``random_orders`` in
``nnkit.classic.hopfield`` reproduces the permutations in Python. A state is converged after a
sweep with no flip; ``sweeps[r]`` counts the sweeps run, that last one included, at most
``max_sweeps``. The call releases the GIL, so a thread pool runs disjoint ``rows`` in parallel.
"""

from cython cimport floating
from libc.stdint cimport uint64_t


# h += d * row over n entries: the O(n) work of a flip and of the field initialisation. GCC
# builds it for AVX-512, AVX2 and baseline x86-64 (target_clones; the loader picks the best
# the CPU has), since setup.py compiles without -march. No reduction, so no fastmath needed:
# every variant gives the same (exact, integer-valued) result.
cdef extern from *:
    """
    #if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
    #define HOP_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
    #else
    #define HOP_CLONES
    #endif
    HOP_CLONES static void hop_axpy_f(float* h, const float* row, float d, Py_ssize_t n) {
        for (Py_ssize_t j = 0; j < n; j++) h[j] += d * row[j];
    }
    HOP_CLONES static void hop_axpy_d(double* h, const double* row, double d, Py_ssize_t n) {
        for (Py_ssize_t j = 0; j < n; j++) h[j] += d * row[j];
    }
    HOP_CLONES static long long hop_dot_i8(const signed char* a, const signed char* b,
                                           Py_ssize_t n) {
        long long total = 0;
        for (Py_ssize_t start = 0; start < n; start += 1 << 20) {  /* int32 partial sums */
            Py_ssize_t stop = n - start < (1 << 20) ? n : start + (1 << 20);
            int acc = 0;
            for (Py_ssize_t j = start; j < stop; j++) acc += a[j] * b[j];
            total += acc;
        }
        return total;
    }
    """
    void hop_axpy_f(float* h, const float* row, float d, Py_ssize_t n) noexcept nogil
    void hop_axpy_d(double* h, const double* row, double d, Py_ssize_t n) noexcept nogil
    long long hop_dot_i8(const signed char* a, const signed char* b, Py_ssize_t n) noexcept nogil


cdef inline void _axpy(floating* h, const floating* row, floating d, Py_ssize_t n) noexcept nogil:
    if floating is float:
        hop_axpy_f(h, row, d, n)
    else:
        hop_axpy_d(h, row, d, n)


# The next splitmix64 output; advances ``state`` (the C form of nnkit's one SplitMix64).
cdef extern from "splitmix64.h":
    uint64_t nnkit_splitmix64_next(uint64_t* state) noexcept nogil


cdef inline void _shuffle(int* order, Py_ssize_t n, uint64_t* state) noexcept nogil:
    """Fisher-Yates, i = n-1 .. 1: swap order[i] with order[((z >> 32) (i + 1)) >> 32]
    (Lemire's multiply-shift instead of a 64-bit division; bias below n / 2^32)."""
    cdef Py_ssize_t i, j
    cdef int t
    for i in range(n - 1, 0, -1):
        j = <Py_ssize_t>(((nnkit_splitmix64_next(state) >> 32) * <uint64_t>(i + 1)) >> 32)
        t = order[i]
        order[i] = order[j]
        order[j] = t


cdef inline Py_ssize_t _sweep(const floating* C, signed char* x, floating* h,
                              const int* order, Py_ssize_t n) noexcept nogil:
    """One sweep in ``order`` without biases (+1 iff h_i >= 0); returns the flips."""
    cdef Py_ssize_t k, i, flips = 0
    cdef signed char new
    for k in range(n):
        i = order[k]
        new = 1 if h[i] >= 0 else -1
        if new != x[i]:
            x[i] = new
            flips += 1
            _axpy(h, C + i * n, <floating>(2 * new), n)
    return flips


cdef inline Py_ssize_t _sweep_thresholds(const floating* C, signed char* x, floating* h,
                                         const int* order, Py_ssize_t n,
                                         const double* t) noexcept nogil:
    """One sweep with thresholds (+1 iff h_i >= t_i); returns the flips."""
    cdef Py_ssize_t k, i, flips = 0
    cdef signed char new
    for k in range(n):
        i = order[k]
        new = 1 if h[i] >= t[i] else -1
        if new != x[i]:
            x[i] = new
            flips += 1
            _axpy(h, C + i * n, <floating>(2 * new), n)
    return flips


cdef Py_ssize_t _run_one(const floating* C, signed char* x, floating* h, int* order,
                         Py_ssize_t n, Py_ssize_t max_sweeps, bint shuffle, uint64_t seed,
                         unsigned char* converged, const double* t) noexcept nogil:
    """Async sweeps on one state x (n,) with its fields h = C x; returns the sweeps run.
    ``t`` the thresholds (n,) or NULL for none: two sweep loops, so that the loop without
    biases is the one of a network that never had them."""
    cdef Py_ssize_t sweep, k, flips
    cdef uint64_t state = seed
    for k in range(n):
        order[k] = <int>k
    for sweep in range(max_sweeps):
        if shuffle:
            _shuffle(order, n, &state)
        if t == NULL:
            flips = _sweep(C, x, h, order, n)
        else:
            flips = _sweep_thresholds(C, x, h, order, n, t)
        if flips == 0:
            converged[0] = 1
            return sweep + 1
    converged[0] = 0
    return max_sweeps


cdef void _init_fields(const signed char* Pi, const floating* P, const signed char* x,
                       floating* h, Py_ssize_t n, Py_ssize_t s) noexcept nogil:
    """h = C x = Xi^T (Xi x) - s x from the patterns, Pi (s, n) int8 and P (s, n) float:
    s integer dot products m_mu = xi_mu . x, then h = -s x + sum_mu m_mu xi_mu (axpys);
    2 s n operations instead of n^2, integers throughout, exact."""
    cdef Py_ssize_t i, mu
    for i in range(n):
        h[i] = -s * x[i]
    for mu in range(s):
        _axpy(h, P + mu * n, <floating>hop_dot_i8(Pi + mu * n, x, n), n)


def init_fields(const signed char[:, ::1] patterns_i8, const floating[:, ::1] patterns,
                const signed char[:, ::1] states, floating[:, ::1] fields,
                const long long[::1] rows):
    """fields[r] = C states[r] for r in rows, from the stored patterns (Hebbian C with zero
    diagonal): patterns_i8 (s, n) int8 and patterns (s, n) the same patterns as floats."""
    cdef Py_ssize_t n = patterns.shape[1], s = patterns.shape[0], k, r
    if n == 0 or s == 0:
        return
    with nogil:
        for k in range(rows.shape[0]):
            r = rows[k]
            _init_fields(&patterns_i8[0, 0], &patterns[0, 0], &states[r, 0], &fields[r, 0],
                         n, s)


def async_run(const floating[:, ::1] couplings, signed char[:, ::1] states,
              floating[:, ::1] fields, int[:, ::1] order_work, const long long[::1] rows,
              Py_ssize_t max_sweeps, bint shuffle, uint64_t seed, long long[::1] sweeps,
              unsigned char[::1] converged, const double[::1] thresholds=None):
    """Async dynamics on ``states[rows]`` in place; couplings (n, n), states, fields (B, n),
    order_work (B, n) int32 scratch, rows (R,), sweeps (B,), converged (B,) uint8,
    thresholds (n,) float64 or None."""
    cdef Py_ssize_t n = couplings.shape[0]
    cdef Py_ssize_t k, r
    cdef const double* t = NULL
    if thresholds is not None and n > 0:
        if thresholds.shape[0] != n:
            raise ValueError(f"thresholds has {thresholds.shape[0]} entries, expected {n}")
        t = &thresholds[0]
    if n == 0:
        for k in range(rows.shape[0]):
            sweeps[rows[k]] = 1
            converged[rows[k]] = 1
        return
    with nogil:
        for k in range(rows.shape[0]):
            r = rows[k]
            sweeps[r] = _run_one(&couplings[0, 0], &states[r, 0], &fields[r, 0],
                                 &order_work[r, 0], n, max_sweeps, shuffle, seed,
                                 &converged[r], t)
