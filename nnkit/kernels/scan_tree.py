"""The linear recurrence by a tree (parallel prefix) scan, with its depth and work counted.

    h_t = a_t * h_{t-1} + b_t,   t = 0..T-1,   h_{-1} = h0        (elementwise, (B, T, D))

Each step is the affine map (a_t, b_t): h -> a_t h + b_t, and (a, b) o (a', b') =
(a a', a' b + b') (first, then second) is associative, so the prefixes can be combined as a
tree. ``tree_scan`` returns the same h as ``linear_scan_forward`` (to rounding: the tree
reassociates the products) and a ``TreeScanStats`` with the levels (depth: steps that must
follow one another) and combines (work, per sequence) the algorithm performed:

============== ===================== ================================== =============
algorithm      levels (depth)        combines (work)                    T = 1024
============== ===================== ================================== =============
sequential     T - 1                 T - 1                              1023 / 1023
hillis_steele  L = ceil(log2 T)      sum_{k<L} (T - 2^k) = T L - 2^L + 1 10 / 9217
blelloch       2 L                   2 (2^L - 1)                        20 / 2046
============== ===================== ================================== =============

The O(log T) of notes §5.2 is the depth; Hillis-Steele pays for its minimal
depth with T log T work, Blelloch's up- and down-sweep keeps the work O(T) at twice the depth.
The naive twins are ``nnkit.kernels.reference.scan_tree``; the levels run in
``nnkit._ext.scan_tree_cpu``, each as one parallel loop. CPU (NumPy arrays) only.

Examples
--------
>>> import numpy as np
>>> from nnkit.kernels import tree_scan
>>> a = np.full((1, 4, 1), 0.5); b = np.ones((1, 4, 1))
>>> h, stats = tree_scan(a, b, algorithm="blelloch")
>>> h[0, :, 0].tolist(), stats.levels, stats.combines
([1.0, 1.5, 1.75, 1.875], 4, 6)
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Literal

import numpy as np

from .._backend import kernels_for
from .._types import Array
from .._validation import check_choice, check_scalar
from .scan import ScanAlgorithm, _check_h0, _check_pair

__all__ = ["tree_scan", "tree_scan_counts", "TreeScanStats", "TREE_SCAN_ALGORITHMS"]

TREE_SCAN_ALGORITHMS = ("hillis_steele", "blelloch")


@dataclasses.dataclass(frozen=True)
class TreeScanStats:
    """What a tree scan of length T did, per sequence.

    Attributes
    ----------
    algorithm : 'hillis_steele' or 'blelloch'
    length : int, T
    levels : int, the depth: levels run one after another, each one parallel loop
    combines : int, the work: applications of the operator o
    """

    algorithm: str
    length: int
    levels: int
    combines: int


def _ceil_log2(T):
    return max(int(T) - 1, 0).bit_length()  # 0 for T <= 1


def tree_scan_counts(T: int, algorithm: ScanAlgorithm = "hillis_steele",
                     ) -> tuple[int, int]:
    """(levels, combines) of ``algorithm`` on a sequence of length T, in closed form (the
    table in the module docstring); ``'sequential'`` gives the loop's (T - 1, T - 1), h0 folded
    into the first step as the trees do."""
    T = int(check_scalar(T, name="T", kind=numbers.Integral, low=0))
    check_choice(algorithm, name="algorithm", choices=(*TREE_SCAN_ALGORITHMS, "sequential"))
    L = _ceil_log2(T)
    if algorithm == "sequential":
        return max(T - 1, 0), max(T - 1, 0)
    if algorithm == "hillis_steele":
        return L, T * L - (1 << L) + 1
    return 2 * L, 2 * ((1 << L) - 1)


def tree_scan(a: Array, b: Array, h0: Array | None = None,
              algorithm: Literal["hillis_steele", "blelloch"] = "hillis_steele",
              ) -> tuple[Array, TreeScanStats]:
    """h_t = a_t * h_{t-1} + b_t over (B, T, D) by a Hillis-Steele or Blelloch tree scan.

    Parameters
    ----------
    a, b : array (B, T, D), float32/64 or complex64/128, one dtype
    h0 : array (B, D) or None (zeros), same dtype; folded into the first step
        (b_0 <- a_0 h0 + b_0) so that every prefix is h_t itself
    algorithm : 'hillis_steele' (depth ceil(log2 T), work ~T log2 T) or 'blelloch'
        (depth 2 ceil(log2 T), work < 4 T)

    Returns
    -------
    h : array (B, T, D), a's dtype
    stats : TreeScanStats, the levels and combines counted as the scan ran
    """
    a, b = _check_pair(a, b)
    h0 = _check_h0(h0, a)
    check_choice(algorithm, name="algorithm", choices=TREE_SCAN_ALGORITHMS)
    kernels = kernels_for("scan_tree_cpu", None, a, name="a")
    B, T, D = a.shape
    n = 1 << _ceil_log2(T) if algorithm == "blelloch" else T
    A = np.ones((B, n, D), a.dtype)  # the missing Blelloch leaves: the identity (1, 0)
    H = np.zeros((B, n, D), a.dtype)
    A[:, :T], H[:, :T] = a, b
    if T:
        H[:, 0] += a[:, 0] * h0  # fold h0 into the first step
    if algorithm == "hillis_steele":
        h, levels, combines = kernels.hillis_steele(A, H, np.empty_like(A), np.empty_like(H))
    else:
        total, levels, combines = kernels.blelloch(A, H)
        h = np.empty_like(H[:, :T])  # (B, T, D): exclusive prefix at t + 1, total at T - 1
        h[:, :T - 1] = H[:, 1:T]
        if T:
            h[:, T - 1] = total
    return np.ascontiguousarray(h), TreeScanStats(algorithm, T, levels, combines)
