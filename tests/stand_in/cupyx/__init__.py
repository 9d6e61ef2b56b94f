"""``cupyx`` of the CuPy stand-in (tests/stand_in/cupy): ``scatter_add`` and
``scipy.special``."""

import numpy as _np
from cupy import _counting, _device_operand, _index_operand

from . import scipy  # noqa: F401


def scatter_add(a, slices, value):
    """a[slices] += value with repeated positions summed (``np.add.at``), in place."""
    _np.add.at(_device_operand(a), _index_operand(slices), _device_operand(value))
    _counting.record("kernel:scatter_add")
