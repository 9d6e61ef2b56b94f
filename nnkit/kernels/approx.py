"""Fast evaluation of a one-hidden-layer sigmoid network on a line (``nnkit._ext.approx_cpu``,
Numba, parallel over points for large inputs): the kernel behind
``nnkit.approx.constructions.eval_sigmoid_net``, which validates and sorts the units.
"""

from __future__ import annotations

from .._backend import kernels_for
from .._types import Array

__all__ = ["window_sum"]


def window_sum(x: Array, s: Array, w: Array, b: Array, a: Array, prefix: Array, tau: float,
               out: Array) -> Array:
    """out[n] = prefix[#(s <= x_n - tau)] + sum over s_j in (x_n - tau, x_n + tau) of
    a_j sigma(w_j x_n + b_j), in place.

    ``x`` (N,) and ``out`` (N,) float64; ``s`` (k,) the transition points sorted ascending,
    ``w`` (all > 0), ``b``, ``a`` (k,) in the same order; ``prefix`` (k + 1,) the prefix
    sums of ``a``; ``tau`` the half-width of the window. NumPy arrays only, unchecked.
    """
    kernels_for("approx_cpu", None, x).window_sum(x, s, w, b, a, prefix, tau, out)
    return out
