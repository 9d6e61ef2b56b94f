"""Test helpers shared by every op family: hypothesis strategies for arrays, tolerances,
the kernel-vs-reference comparison, and the torch import that skips cleanly."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

FLOAT_DTYPES = (np.float32, np.float64)


def tolerance(dtype, factor: float = 64.0) -> dict:
    """rtol/atol for comparing a kernel with its float64 twin: ``factor`` ulps of ``dtype``."""
    eps = float(np.finfo(dtype).eps)
    return {"rtol": factor * eps, "atol": factor * eps}


def assert_matches_reference(actual, expected, dtype=None, factor: float = 64.0, err_msg=""):
    """Assert a kernel's output equals its naive twin's within ``factor`` ulps of ``dtype``."""
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    assert actual.shape == expected.shape, f"shape {actual.shape} != {expected.shape}"
    dtype = dtype or actual.dtype
    assert actual.dtype == np.dtype(dtype), f"dtype {actual.dtype} != {np.dtype(dtype)}"
    np.testing.assert_allclose(
        actual.astype(np.float64), expected.astype(np.float64), err_msg=err_msg,
        **tolerance(dtype, factor),
    )


def float_dtypes():
    return st.sampled_from(FLOAT_DTYPES)


@st.composite
def arrays(draw, dtype=None, min_dims=1, max_dims=3, min_side=0, max_side=6,
           low=-5.0, high=5.0, allow_noncontiguous=True):
    """Bounded finite float arrays; sides include 0 and 1; sometimes a non-contiguous view.

    Non-contiguous views are drawn by slicing a larger array with a step of 2 on the last axis
    or by transposing, so kernels behind the public boundary see strided input.
    """
    dtype = draw(float_dtypes()) if dtype is None else dtype
    shape = draw(hnp.array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=min_side,
                                  max_side=max_side))
    elements = st.floats(low, high, allow_nan=False, allow_infinity=False,
                         allow_subnormal=False, width=np.dtype(dtype).itemsize * 8)
    layout = draw(st.sampled_from(["c", "strided", "transposed"])) if allow_noncontiguous else "c"
    if layout == "strided":
        big = draw(hnp.arrays(dtype, shape[:-1] + (2 * shape[-1],), elements=elements))
        return big[..., ::2]
    if layout == "transposed" and len(shape) >= 2:
        base = draw(hnp.arrays(dtype, shape[::-1], elements=elements))
        return base.T
    return draw(hnp.arrays(dtype, shape, elements=elements))


def import_torch():
    """Import torch or skip the test cleanly: torch is an optional test dependency."""
    return pytest.importorskip("torch")
