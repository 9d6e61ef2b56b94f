# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
# distutils: extra_compile_args = -ffp-contract=off
"""Cython epoch loop of Rosenblatt's mistake-driven perceptron (notes §1.2, Algorithm 1).

``perceptron_epochs(X, y, w, b, order, max_epochs, fit_intercept)`` runs up to ``max_epochs``
passes over the rows of ``X`` (S, D) in the order ``order`` (S,) and, on every mistake
``y_i (w . x_i + b) <= 0``, updates ``w <- w + y_i x_i`` and ``b <- b + y_i`` in place.
It stops after the first pass without a mistake. ``w`` (D,) and ``b`` (1,) are float64 and
hold the starting point on entry; ``X`` is float32 or float64, ``y`` (S,) float64 in {-1, +1}.
The dot product is summed in float64 in 8 interleaved partial sums (term j goes to sum
j mod 8, in increasing j), combined as ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7)),
then ``b`` is added: eight independent add chains instead of one, so the sum is not bound by
the add latency (benchmarks/RESULTS.md, "Figures moved from code comments"), and still one
fixed order. With ``-ffp-contract=off`` (no fused multiply-add) the plain Python twin
``nnkit.classic.perceptron._perceptron_epochs_reference`` gives the same numbers bit for bit.
One thread; validates nothing beyond the shapes.

``mistakes`` (optional, int64 of at least ``max_epochs`` * S entries) receives the row index
of every update in the order made, so that the caller can replay w_0 = 0, w_1, ..., w_T
(Novikoff's lemmas are statements about every w_t). None records nothing: one pointer test
per update, none per visit.
"""

from cython cimport floating


cdef inline double _activation(const floating* x, const double* w, double b,
                               Py_ssize_t D) noexcept nogil:
    """w . x + b in float64: 8 partial sums s_k = sum_{j = k mod 8} w_j x_j, combined pairwise."""
    cdef Py_ssize_t j, k
    cdef Py_ssize_t D8 = D - D % 8
    cdef double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0
    cdef double s4 = 0.0, s5 = 0.0, s6 = 0.0, s7 = 0.0
    cdef double tail[8]
    for j in range(0, D8, 8):
        s0 = s0 + w[j] * x[j]
        s1 = s1 + w[j + 1] * x[j + 1]
        s2 = s2 + w[j + 2] * x[j + 2]
        s3 = s3 + w[j + 3] * x[j + 3]
        s4 = s4 + w[j + 4] * x[j + 4]
        s5 = s5 + w[j + 5] * x[j + 5]
        s6 = s6 + w[j + 6] * x[j + 6]
        s7 = s7 + w[j + 7] * x[j + 7]
    tail[0] = s0; tail[1] = s1; tail[2] = s2; tail[3] = s3
    tail[4] = s4; tail[5] = s5; tail[6] = s6; tail[7] = s7
    for j in range(D8, D):
        k = j - D8
        tail[k] = tail[k] + w[j] * x[j]
    return (((tail[0] + tail[1]) + (tail[2] + tail[3]))
            + ((tail[4] + tail[5]) + (tail[6] + tail[7]))) + b


cdef Py_ssize_t _epoch(const floating* X, const double* y, double* w, double* b,
                       const Py_ssize_t* order, Py_ssize_t S, Py_ssize_t D,
                       bint fit_intercept, long long* rec) noexcept nogil:
    """One pass over the rows in ``order``; returns the number of updates made, whose row
    indices go to ``rec`` unless it is NULL."""
    cdef Py_ssize_t k, i, j
    cdef Py_ssize_t updates = 0
    cdef const floating* x
    cdef double yi
    for k in range(S):
        i = order[k]
        x = X + i * D
        yi = y[i]
        if yi * _activation(x, w, b[0], D) <= 0.0:
            for j in range(D):
                w[j] = w[j] + yi * x[j]
            if fit_intercept:
                b[0] = b[0] + yi
            if rec != NULL:
                rec[updates] = i
            updates += 1
    return updates


def perceptron_epochs(const floating[:, ::1] X, const double[::1] y, double[::1] w,
                      double[::1] b, const Py_ssize_t[::1] order, Py_ssize_t max_epochs,
                      bint fit_intercept, long long[::1] mistakes=None):
    """Run the perceptron on rows ``X[order]`` for at most ``max_epochs`` passes, in place;
    with ``mistakes``, write the row index of each update there, in order.

    Returns
    -------
    n_updates : int
        Updates made (mistakes met) over all passes.
    n_epochs : int
        Passes run, the last one included.
    converged : bool
        True when the last pass made no mistake.
    """
    cdef Py_ssize_t S = X.shape[0]
    cdef Py_ssize_t D = X.shape[1]
    cdef Py_ssize_t epoch = 0
    cdef Py_ssize_t total = 0
    cdef Py_ssize_t made = 1
    cdef long long* rec = NULL
    if y.shape[0] != S or order.shape[0] != S or w.shape[0] != D or b.shape[0] != 1:
        raise ValueError(f"shapes disagree: X {(S, D)}, y {y.shape[0]}, order "
                         f"{order.shape[0]}, w {w.shape[0]}, b {b.shape[0]}")
    if S == 0:                      # one pass over nothing makes no mistake
        return (0, 1, True) if max_epochs >= 1 else (0, 0, False)
    if mistakes is not None:
        if mistakes.shape[0] < max_epochs * S:
            raise ValueError(f"mistakes has {mistakes.shape[0]} entries; max_epochs * S = "
                             f"{max_epochs * S} updates may be made")
        rec = &mistakes[0]
    with nogil:
        while epoch < max_epochs and made > 0:
            made = _epoch(&X[0, 0], &y[0], &w[0], &b[0], &order[0], S, D, fit_intercept,
                          NULL if rec == NULL else rec + total)
            total += made
            epoch += 1
    return total, epoch, made == 0


def perceptron_activations(const floating[:, ::1] X, const double[::1] w, double b,
                           double[::1] out):
    """out[i] = w . X[i] + b for every row, summed exactly as in the epoch loop; X (S, D)."""
    cdef Py_ssize_t S = X.shape[0]
    cdef Py_ssize_t D = X.shape[1]
    cdef Py_ssize_t i
    if out.shape[0] != S or w.shape[0] != D:
        raise ValueError(f"shapes disagree: X {(S, D)}, w {w.shape[0]}, out {out.shape[0]}")
    if S == 0:
        return
    with nogil:
        for i in range(S):
            out[i] = _activation(&X[i, 0], &w[0], b, D)
