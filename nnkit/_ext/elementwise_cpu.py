"""Small array helpers of autograd and ``nnkit._random`` on NumPy arrays: the CPU twins of
``nnkit._ext.elementwise_cuda`` (the same names), picked by ``nnkit._backend.kernels_for``.

- ``expit(x)``: the logistic sigmoid 1 / (1 + exp(-x)) (SciPy's, exact and overflow-free).
- ``scatter_add(target, index, values)``: target[index] += values in place, repeated
  positions summed (``np.add.at``).
- ``full_scalar(value, like)``: ``value`` as a 0-d array of ``like``'s dtype.
- ``to_device_of(a, like)``: ``a`` where ``like`` lives: on the CPU ``a`` itself.
- ``uniform(shape, seed)``: float64 draws in [0, 1) of ``shape``, element i (C order) the
  SplitMix64 draw ``splitmix64(seed + (i + 1) 0x9E3779B97F4A7C15) >> 11`` times 2**-53
  (``nnkit._random.splitmix64``): the stream of the CUDA twin and of the dropout kernels.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import special

from .._random import splitmix64, uniform53
from .launchers import launchers

__all__ = [*launchers("elementwise_cpu", "elementwise_cuda")]

expit = special.expit


def scatter_add(target, index, values) -> None:
    """target[index] += values in place, repeated positions summed."""
    np.add.at(target, index, values)


def full_scalar(value, like):
    """``value`` (a Python or NumPy number) as a 0-d NumPy array of ``like``'s dtype."""
    return np.asarray(value, dtype=like.dtype)


def to_device_of(a, like):
    """``a`` (a NumPy array) where ``like`` lives: the CPU, so ``a`` itself."""
    return a


def uniform(shape, seed: int):
    """Float64 uniform draws in [0, 1) of ``shape``: element i (C order) is SplitMix64's
    draw i for ``seed`` (an int in [0, 2**64))."""
    n = np.arange(math.prod(shape), dtype=np.uint64)
    return uniform53(splitmix64(seed, n)).reshape(shape)
