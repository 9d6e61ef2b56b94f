"""Naive twins of the tree (parallel prefix) scans of the linear recurrence.

Each step h_t = a_t * h_{t-1} + b_t is the affine map e_t: h -> a_t h + b_t, and applying e
first, then e', is

    (a, b) o (a', b') = (a a', a' b + b'),

an associative (not commutative) operator with identity (1, 0). The inclusive scan
E_t = e_0 o e_1 o ... o e_t gives h_t = A_t h_{-1} + B_t; with h_{-1} folded into the first
step (b_0 <- a_0 h0 + b_0) it is h_t = B_t. A tree evaluates the scan in levels whose
combines are independent of each other: the depth (levels) is O(log T), the work (combines)
is not (notes §5.2 says "O(log n) runtime": that is the depth).

- Hillis-Steele: level k (stride s = 2^k, k = 0..ceil(log2 T) - 1) sets x_t <- x_{t-s} o x_t
  for every t >= s, reading the previous level: ceil(log2 T) levels, sum_k (T - 2^k)
  combines (about T log2 T).
- Blelloch: on n = 2^ceil(log2 T) elements (the missing ones the identity), an up-sweep
  (log2 n levels, n - 1 combines) leaves the total at the root; the root is cleared to the
  identity and a down-sweep (log2 n levels, n - 1 combines) hands every node the prefix
  before it: the exclusive scan, so h_t is the exclusive prefix at t + 1 (the saved total
  for t = n - 1). 2 log2 n levels, 2 (n - 1) < 4 T combines: O(T) work.

Plain loops, one sequence at a time, in float64 / complex128, cast back to the input's
dtype. Each returns (h, levels, combines), the counts per sequence (every sequence of the
batch does the same).
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from ..._types import Array

__all__ = ["tree_scan", "hillis_steele_scan", "blelloch_scan"]


def _wide(x):
    x = np.asarray(x)
    return x.astype(np.complex128 if x.dtype.kind == "c" else np.float64)


def _combine(first, then):
    """(a, b) o (a', b') = (a a', a' b + b'): ``first`` applied, then ``then``."""
    (a, b), (a2, b2) = first, then
    return a * a2, a2 * b + b2


def _hillis_steele_1d(steps):
    """Inclusive scan of a list of (a, b) pairs; returns (prefixes, levels, combines)."""
    x, T = list(steps), len(steps)
    levels = combines = 0
    stride = 1
    while stride < T:
        prev = list(x)  # every combine of a level reads the level before
        for t in range(stride, T):
            x[t] = _combine(prev[t - stride], prev[t])
            combines += 1
        levels += 1
        stride *= 2
    return x, levels, combines


def _blelloch_1d(steps):
    """Exclusive scan on the padded tree, read back as the inclusive one; returns
    (prefixes, levels, combines)."""
    T = len(steps)
    n = 1
    while n < T:
        n *= 2
    identity = (1.0, 0.0)
    x = list(steps) + [identity] * (n - T)
    levels = combines = 0
    stride = 1
    while stride < n:  # up-sweep: x[i] becomes the total of the block ending at i
        for i in range(2 * stride - 1, n, 2 * stride):
            x[i] = _combine(x[i - stride], x[i])
            combines += 1
        levels += 1
        stride *= 2
    total = x[n - 1] if T else identity
    x[n - 1] = identity
    stride = n // 2
    while stride >= 1:  # down-sweep: each node's prefix to its left child, prefix o left sum
        for i in range(2 * stride - 1, n, 2 * stride):
            left = x[i - stride]
            x[i - stride] = x[i]
            x[i] = _combine(x[i], left)
            combines += 1
        levels += 1
        stride //= 2
    inclusive = x[1:T] + [total]
    return inclusive[:T], levels, combines


_ALGORITHMS = {"hillis_steele": _hillis_steele_1d, "blelloch": _blelloch_1d}


def tree_scan(a: Array, b: Array, h0: Array | None = None,
              algorithm: Literal["hillis_steele", "blelloch"] = "hillis_steele",
              ) -> tuple[Array, int, int]:
    """h_t = a_t * h_{t-1} + b_t by a tree scan; a, b (B, T, D), h0 (B, D) or None (zeros).

    Returns (h (B, T, D), levels, combines).
    """
    dtype = np.asarray(a).dtype
    a, b = _wide(a), _wide(b)
    B, T, D = a.shape
    h0 = np.zeros((B, D), a.dtype) if h0 is None else _wide(h0)
    scan = _ALGORITHMS[algorithm]
    h = np.zeros_like(a)
    levels = combines = 0
    for i in range(B):
        for d in range(D):
            steps = [(a[i, t, d], b[i, t, d]) for t in range(T)]
            if T:
                steps[0] = (steps[0][0], steps[0][0] * h0[i, d] + steps[0][1])  # fold h0
            prefixes, levels, combines = scan(steps)
            for t in range(T):
                h[i, t, d] = prefixes[t][1]
    if B * D == 0:  # no sequence ran: the counts of one
        _, levels, combines = scan([(1.0, 0.0)] * T)
    return h.astype(dtype), levels, combines


def hillis_steele_scan(a: Array, b: Array, h0: Array | None = None) -> tuple[Array, int, int]:
    """``tree_scan(a, b, h0, 'hillis_steele')``."""
    return tree_scan(a, b, h0, "hillis_steele")


def blelloch_scan(a: Array, b: Array, h0: Array | None = None) -> tuple[Array, int, int]:
    """``tree_scan(a, b, h0, 'blelloch')``."""
    return tree_scan(a, b, h0, "blelloch")
