"""``cupy.testing`` of the stand-in: NumPy's assertions on host copies."""

import numpy as _np


def _host(x):
    return x.get() if hasattr(x, "get") and not isinstance(x, _np.ndarray) else x


def assert_array_equal(x, y, *args, **kwargs):
    _np.testing.assert_array_equal(_host(x), _host(y), *args, **kwargs)


def assert_allclose(actual, desired, *args, **kwargs):
    _np.testing.assert_allclose(_host(actual), _host(desired), *args, **kwargs)
