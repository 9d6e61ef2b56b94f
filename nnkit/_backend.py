"""Backend choice by array type: NumPy arrays run on the CPU kernels, GPU arrays
(CuPy, or anything with ``__cuda_array_interface__``) on the Numba CUDA kernels.

CuPy and numba.cuda are imported lazily, so a CPU-only install never touches them.
"""

from __future__ import annotations

import numpy as np

__all__ = ["is_gpu_array", "array_module", "cuda_available"]


def is_gpu_array(x) -> bool:
    """True for CuPy arrays and Numba device arrays (``__cuda_array_interface__``)."""
    return hasattr(x, "__cuda_array_interface__") and not isinstance(x, np.ndarray)


def array_module(x):
    """``cupy`` for a CuPy array, else ``numpy`` (the ``cupy.get_array_module`` idea)."""
    if is_gpu_array(x) and type(x).__module__.startswith("cupy"):
        import cupy

        return cupy
    return np


def cuda_available() -> bool:
    """True when numba.cuda finds a usable GPU (or runs under NUMBA_ENABLE_CUDASIM=1)."""
    try:
        from numba import cuda

        return bool(cuda.is_available())
    except Exception:  # no driver, no toolkit: no GPU for us
        return False
