"""CPU tree scans of h_t = a_t * h_{t-1} + b_t: Hillis-Steele and Blelloch, level by level.

The step h -> a h + b is the pair (a, b); (a, b) o (a', b') = (a a', a' b + b') applies the
first, then the second. A level's combines are independent, so each level is one parallel
loop (``prange`` over batch rows and tree positions, the features innermost); the levels run
one after another from Python, which counts them and the combines one sequence does
(``nnkit.kernels.scan_tree`` validates, pads and folds h0; the formulas are in
``nnkit.kernels.reference.scan_tree``).

These exist to show the parallel algorithm, not to replace ``scan_rows``: with B x D
independent sequences the sequential walk is already parallel and does T combines a
sequence, where Hillis-Steele does about T log2 T and Blelloch 2 n (n = 2^ceil(log2 T)),
each level a pass over memory. ``fastmath`` is off: NaN and inf propagate.

Arrays are C-contiguous (B, T, D), real or complex, one dtype; nothing is validated here.
"""

from __future__ import annotations

from numba import prange

from ._dispatch import serial_or_parallel

__all__ = ["hillis_steele_level", "blelloch_up_level", "blelloch_down_level",
           "hillis_steele", "blelloch"]


def _hillis_steele_level(a, h, a_out, h_out, stride):
    """One level: x_t <- x_{t-stride} o x_t for t >= stride, read from (a, h) and written to
    (a_out, h_out) (a level reads only the level before); x_t copied for t < stride."""
    B, T, D = a.shape
    for task in prange(B * T):
        i = task // T
        t = task - i * T
        if t >= stride:
            for d in range(D):
                a_then = a[i, t, d]
                a_out[i, t, d] = a[i, t - stride, d] * a_then
                h_out[i, t, d] = a_then * h[i, t - stride, d] + h[i, t, d]
        else:
            for d in range(D):
                a_out[i, t, d] = a[i, t, d]
                h_out[i, t, d] = h[i, t, d]


def _blelloch_up_level(a, h, stride):
    """Up-sweep level, in place: x_j <- x_{j-stride} o x_j at j = 2 stride k + 2 stride - 1."""
    B, n, D = a.shape
    nodes = n // (2 * stride)
    for task in prange(B * nodes):
        i = task // nodes
        j = (task - i * nodes + 1) * 2 * stride - 1
        for d in range(D):
            a_then = a[i, j, d]
            a[i, j, d] = a[i, j - stride, d] * a_then
            h[i, j, d] = a_then * h[i, j - stride, d] + h[i, j, d]


def _blelloch_down_level(a, h, stride):
    """Down-sweep level, in place: the left child takes the node's prefix x_j, the node
    becomes x_j o left (the prefix before its right child)."""
    B, n, D = a.shape
    nodes = n // (2 * stride)
    for task in prange(B * nodes):
        i = task // nodes
        j = (task - i * nodes + 1) * 2 * stride - 1
        for d in range(D):
            a_left, h_left = a[i, j - stride, d], h[i, j - stride, d]
            a_pre, h_pre = a[i, j, d], h[i, j, d]
            a[i, j - stride, d] = a_pre
            h[i, j - stride, d] = h_pre
            a[i, j, d] = a_pre * a_left
            h[i, j, d] = a_left * h_pre + h_left


hillis_steele_level = serial_or_parallel(_hillis_steele_level)
blelloch_up_level = serial_or_parallel(_blelloch_up_level)
blelloch_down_level = serial_or_parallel(_blelloch_down_level)


def hillis_steele(a, h, a_work, h_work):
    """Inclusive scan of the pairs (a, h) (B, T, D), ping-ponging with (a_work, h_work).

    Returns (h_scan, levels, combines): h_scan is ``h`` or ``h_work``, whichever holds the
    last level; the counts are per sequence.
    """
    T = a.shape[1]
    levels = combines = 0
    stride = 1
    while stride < T:
        hillis_steele_level(a, h, a_work, h_work, stride)
        a, h, a_work, h_work = a_work, h_work, a, h
        levels += 1
        combines += T - stride
        stride *= 2
    return h, levels, combines


def blelloch(a, h):
    """Exclusive scan in place on (a, h) (B, n, D), n a power of two, after saving the total.

    Returns (total_h (B, D), levels, combines): afterwards h[:, t] is the prefix of the steps
    before t, and ``total_h`` that of all n.
    """
    n = a.shape[1]
    levels = combines = 0
    stride = 1
    while stride < n:
        blelloch_up_level(a, h, stride)
        levels += 1
        combines += n // (2 * stride)
        stride *= 2
    total_h = h[:, n - 1].copy()
    a[:, n - 1] = 1  # the root's prefix: the identity (1, 0)
    h[:, n - 1] = 0
    stride = n // 2
    while stride >= 1:
        blelloch_down_level(a, h, stride)
        levels += 1
        combines += n // (2 * stride)
        stride //= 2
    return total_h, levels, combines
