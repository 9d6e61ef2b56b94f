"""Small array helpers of autograd and ``nnkit._random`` on CuPy arrays: the GPU twins of
``nnkit._ext.elementwise_cpu`` (the same names), picked by ``nnkit._backend.kernels_for``.

- ``expit(x)``: 0.5 (tanh(x / 2) + 1), the logistic sigmoid without overflow (CuPy has no
  ``expit`` outside cupyx.scipy); three elementwise kernels.
- ``scatter_add(target, index, values)``: target[index] += values in place, repeated
  positions summed (``cupyx.scatter_add``, one kernel).
- ``full_scalar(value, like)``: ``value`` as a 0-d array of ``like``'s dtype on its GPU, by a
  fill kernel (no host array, no copy).
- ``to_device_of(a, like)``: ``a`` on ``like``'s GPU; a 0-d host array by a fill kernel.
- ``uniform(shape, seed)``: float64 draws in [0, 1) of ``shape`` made on the current GPU by
  one CuPy elementwise kernel (``_SPLITMIX_BODY``): no device generator state, no host
  array, no copy; element i (C order) is the CPU twin's.

CuPy is imported on first use (importing this module needs no GPU). ``expit``,
``full_scalar`` and ``to_device_of`` take their array module from ``like`` (``x``), so they
also run on NumPy arrays when a test sends them down this route.
"""

from __future__ import annotations

import numpy as np

from .._backend import array_module
from .launchers import launchers

__all__ = [*launchers("elementwise_cpu", "elementwise_cuda")]

# SplitMix64 in CUDA C (NVRTC), self-contained rather than including splitmix64.h: under
# NVRTC the header's function would have to be __device__ and <stdint.h> is not there.
# tests/test_activation.py checks its constants, tests/cuda its stream on a GPU.
_SPLITMIX_BODY = """
unsigned long long z = seed + (unsigned long long)(i + 1) * 0x9E3779B97F4A7C15ULL;
z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
z ^= z >> 31;
u = (double)(z >> 11) * 1.1102230246251565e-16;
"""
_kernels: dict = {}


def expit(x):
    """1 / (1 + exp(-x)) as 0.5 (tanh(x / 2) + 1), in ``x``'s dtype."""
    xp = array_module(x)
    return 0.5 * (xp.tanh(0.5 * x) + 1)


def scatter_add(target, index, values) -> None:
    """target[index] += values in place, repeated positions summed."""
    import cupyx

    cupyx.scatter_add(target, index, values)


def full_scalar(value, like):
    """``value`` (a Python or NumPy number) as a 0-d array of ``like``'s dtype, filled on
    ``like``'s device."""
    return array_module(like).full((), value, dtype=like.dtype)


def to_device_of(a, like):
    """``a`` on ``like``'s device: a 0-d NumPy array by a fill kernel, any other array by
    ``asarray`` (a GPU array stays as it is)."""
    xp = array_module(like)
    if isinstance(a, np.ndarray) and a.ndim == 0:
        return xp.full((), a[()], dtype=a.dtype)
    return xp.asarray(a)


def uniform(shape, seed: int):
    """Float64 uniform draws in [0, 1) of ``shape`` on the current GPU: element i (C order)
    is SplitMix64's draw i for ``seed`` (an int in [0, 2**64))."""
    import cupy

    kernel = _kernels.get("uniform")
    if kernel is None:
        kernel = _kernels["uniform"] = cupy.ElementwiseKernel(
            "uint64 seed", "float64 u", _SPLITMIX_BODY, "nnkit_splitmix_uniform")
    out = cupy.empty(shape, dtype=np.float64)
    if out.size:
        kernel(np.uint64(seed), out)
    return out
