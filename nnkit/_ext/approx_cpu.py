"""Fast evaluation of one-hidden-layer sigmoid networks on a line (Numba CPU).

The kernel behind ``nnkit.approx.constructions.eval_sigmoid_net``: with the units' transition
points sorted, each point sums a prefix of the units that are fully on plus a window of the
units whose transition is near it. Parallel over points for large inputs.
"""

import numba
import numpy as np

from ._dispatch import serial_or_parallel

__all__ = ["window_sum"]


def _window_sum(x, s, w, b, a, prefix, tau, out):
    """out[n] = prefix[#(s <= x_n - tau)] + sum over s_j in (x_n - tau, x_n + tau) of
    a_j sigma(w_j x_n + b_j); s sorted ascending, all w_j > 0. (N,) in, (N,) out."""
    k = s.shape[0]
    for n in numba.prange(x.shape[0]):
        xn = x[n]
        lo, hi = 0, k  # first index with s > xn - tau
        while lo < hi:
            mid = (lo + hi) // 2
            if s[mid] <= xn - tau:
                lo = mid + 1
            else:
                hi = mid
        acc = prefix[lo]
        j = lo
        while j < k and s[j] < xn + tau:
            z = w[j] * xn + b[j]
            if z >= 0:
                acc += a[j] / (1.0 + np.exp(-z))
            else:
                e = np.exp(z)
                acc += a[j] * e / (1.0 + e)
            j += 1
        out[n] = acc


window_sum = serial_or_parallel(_window_sum)
