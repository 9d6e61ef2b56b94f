"""``cupy.random`` of the stand-in: one NumPy generator (seeded), results on the device."""

import numpy as _np

_RNG = _np.random.default_rng(0)


def _device(values, dtype):
    from . import _counting, ndarray

    _counting.record("kernel:random")
    return ndarray._of(_np.asarray(values, dtype=dtype))


def standard_normal(size=None, dtype=float):
    return _device(_RNG.standard_normal(size), dtype)


def uniform(low=0.0, high=1.0, size=None, dtype=float):
    return _device(_RNG.uniform(low, high, size), dtype)


def random(size=None, dtype=float):
    return _device(_RNG.random(size), dtype)
