"""Backend choice by array type: NumPy arrays run on the CPU kernels, GPU arrays
(CuPy, or anything with ``__cuda_array_interface__``) on the Numba CUDA kernels.

``backend`` names the device of an array and ``kernels_for`` returns the kernel module of
``nnkit._ext`` for it: the one place where a call's backend is chosen. Kernel modules,
CuPy and numba.cuda are imported lazily, so a CPU-only install never touches the GPU ones.
"""

from __future__ import annotations

import contextlib
import importlib

import numpy as np

__all__ = ["is_gpu_array", "backend", "describe_device", "kernels_for", "load_kernels",
           "numpy_on_gpu_route",
           "array_module", "cuda_available", "unbroadcast", "matmul", "SMALL_GEMM_FLOPS",
           "ROWS_PARALLEL_MIN_ROWS", "ROWS_PARALLEL_MIN_FLOPS", "to_host"]

# A matrix product under this many flops (a few ms on one core) runs on one BLAS thread
# (``matmul``). Alone, OpenBLAS's second thread makes such a product faster; but numba's
# OpenMP workers spin for a while after each parallel kernel, and a two-thread BLAS call made
# then waits for a core: a ViT training step (many such GEMMs between numba kernels) ran far
# faster with this guard, which slows a step of few parallel kernels (bench_mlp.py) a little.
# Larger products run on numba's threads too when ``_blocks`` can split them: OpenBLAS's
# threads (each spinning for a while after its call) and numba's workers took cores from each
# other, and a BERT-mini step took less time with its products on numba's threads although
# alone OpenBLAS is the faster. Products above it that ``_blocks`` cannot split keep both BLAS
# threads. Figures: benchmarks/RESULTS.md, "BERT and ViT" and "Figures moved from code
# comments".
SMALL_GEMM_FLOPS = 1 << 28


def is_gpu_array(x) -> bool:
    """True for CuPy arrays and Numba device arrays (``__cuda_array_interface__``)."""
    return hasattr(x, "__cuda_array_interface__") and not isinstance(x, np.ndarray)


def backend(x) -> str:
    """``'cuda'`` for a GPU array, ``'cpu'`` for anything else (NumPy arrays, lists)."""
    return "cuda" if is_gpu_array(x) else "cpu"


def describe_device(x) -> str:
    """Where ``x`` lives, for a message: 'a GPU array (ndarray)', 'a NumPy array', or the
    type of what is neither ('list')."""
    if is_gpu_array(x):
        return f"a GPU array ({type(x).__module__.split('.')[0]}.{type(x).__name__})"
    if isinstance(x, np.ndarray):
        return "a NumPy array"
    return type(x).__name__


_LOADED: dict = {}
_NUMPY_ON_GPU_ROUTE = False


def load_kernels(name: str):
    """The kernel module ``nnkit._ext.<name>`` (or ``name`` itself when it is a full
    ``nnkit.`` path), imported on first use (a CUDA module only when it is asked for:
    importing it imports numba.cuda)."""
    module = _LOADED.get(name)
    if module is None:
        path = name if name.startswith(f"{__package__}.") else f"{__package__}._ext.{name}"
        module = _LOADED[name] = importlib.import_module(path)
    return module


@contextlib.contextmanager
def numpy_on_gpu_route():
    """Within the block ``kernels_for`` picks the CUDA kernels for NumPy arrays too: how
    tests run the GPU kernels under the CUDA simulator (NUMBA_ENABLE_CUDASIM=1)."""
    global _NUMPY_ON_GPU_ROUTE
    previous, _NUMPY_ON_GPU_ROUTE = _NUMPY_ON_GPU_ROUTE, True
    try:
        yield
    finally:
        _NUMPY_ON_GPU_ROUTE = previous


def kernels_for(cpu: str | None, cuda: str | None, x, *, name: str = "x"):
    """The kernel module for ``x``'s device (``load_kernels``): ``cuda`` for a GPU array,
    ``cpu`` otherwise; the one place where a call's backend is chosen, so the CPU and CUDA
    modules of a family expose the same launcher names. None for a device the family has
    no kernels for: a ``TypeError`` naming ``name`` then (a CPU-only family given a CuPy
    array, say)."""
    if is_gpu_array(x) or (_NUMPY_ON_GPU_ROUTE and cuda is not None):
        if cuda is None:
            raise TypeError(f"{name} must be a NumPy array (these kernels run on the CPU "
                            f"only), got {describe_device(x)}")
        return load_kernels(cuda)
    if cpu is None:
        raise TypeError(f"{name} must be a GPU array (these kernels run on the GPU only), "
                        f"got {describe_device(x)}")
    return load_kernels(cpu)


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


def to_host(value) -> np.ndarray:
    """``value`` as a NumPy array: a CuPy or Numba device array is copied from the GPU, a
    torch tensor converted (without importing torch), a NumPy array returned as it is."""
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "detach") and hasattr(value, "cpu"):  # a torch tensor
        return value.detach().cpu().numpy()
    if hasattr(value, "__cuda_array_interface__"):
        if hasattr(value, "get"):  # CuPy
            return value.get()
        if hasattr(value, "copy_to_host"):  # a Numba device array
            return value.copy_to_host()
    return np.asarray(value)


def unbroadcast(grad, shape):
    """Sum ``grad`` over the axes that broadcasting added or stretched to reach ``shape``
    (the gradient of a broadcast); NumPy or CuPy arrays."""
    shape = tuple(shape)
    if grad.shape == shape:
        return grad
    extra = grad.ndim - len(shape)
    if extra > 0:
        grad = grad.sum(axis=tuple(range(extra)))
    stretched = tuple(i for i, n in enumerate(shape) if n == 1 and grad.shape[i] != 1)
    if stretched:
        grad = grad.sum(axis=stretched, keepdims=True)
    return grad.reshape(shape)


# The threaded paths of ``matmul``: at least this many rows (or inner dimension) and flops
# (below them, waking numba's pool cost more than the second thread gained:
# benchmarks/RESULTS.md, "Figures moved from code comments"). The flops are the figure at two
# threads; ``_machine.parallel_pays`` carries it to other thread counts, as for
# ``SMALL_GEMM_FLOPS``.
ROWS_PARALLEL_MIN_ROWS = 128
ROWS_PARALLEL_MIN_FLOPS = 1 << 22


def _blocks(a, b) -> tuple[int, str]:
    """(blocks, 'rows' | 'inner'): how ``matmul`` splits a @ b over numba's threads (1
    block: it does not). 'rows': blocks of a's rows (a C-contiguous); 'inner': blocks of
    the inner dimension, for a transposed a (a weight gradient g^T x), partials summed."""
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0] or a.dtype != b.dtype or \
            a.dtype.char not in "fd":
        return 1, ""  # (mismatched inner sizes: NumPy's @ raises)
    import numba

    from ._machine import parallel_pays

    if not parallel_pays(_gemm_flops(a, b), ROWS_PARALLEL_MIN_FLOPS):
        return 1, ""

    if a.flags.c_contiguous and a.shape[0] >= ROWS_PARALLEL_MIN_ROWS:
        return min(numba.get_num_threads(), a.shape[0] // 64), "rows"
    if a.T.flags.c_contiguous and b.flags.c_contiguous and \
            a.shape[1] >= ROWS_PARALLEL_MIN_ROWS:
        return min(numba.get_num_threads(), a.shape[1] // 64), "inner"
    return 1, ""


def _gemm_flops(a, b) -> int:
    k = a.shape[-1]
    m = a.shape[-2] if a.ndim > 1 else 1
    n = b.shape[-1] if b.ndim > 1 else 1
    batch = max(a.size // max(m * k, 1), b.size // max(k * n, 1))
    return 2 * batch * m * k * n


def matmul(a, b):
    """``a @ b``; a 2-D float NumPy product of at least ``ROWS_PARALLEL_MIN_FLOPS`` runs on
    numba's threads (``_blocks``): blocks of the rows of a C-contiguous ``a`` with nnkit's
    packed-panel kernel, or blocks of the inner dimension of a transposed ``a`` (g^T x) with
    one-thread BLAS each (``nnkit._ext.gemm_cpu``). Both cores, and no BLAS worker left
    spinning. Other products under ``SMALL_GEMM_FLOPS`` run on one BLAS thread. The row
    blocks made a ViT training step faster than one BLAS thread for every product; a
    BERT-mini step: see ``SMALL_GEMM_FLOPS`` (benchmarks/RESULTS.md, "BERT and ViT").

    The switch to one BLAS thread (threadpoolctl, restored afterwards) is cheap next to the
    products it serves (benchmarks/RESULTS.md, "Figures moved from code comments"); CuPy
    arrays and large products that cannot be split go straight to ``@``.
    """
    if type(a) is np.ndarray and type(b) is np.ndarray and a.ndim and b.ndim:
        parts, how = _blocks(a, b)
        if parts > 1:
            from ._ext import gemm_cpu

            if how == "rows":
                return gemm_cpu.matmul_rows_parallel(a, b, parts)
            return gemm_cpu.matmul_inner_parallel(a, b, parts)
        from ._ext._dispatch import serial_numpy_blas
        from ._machine import parallel_pays

        if parallel_pays(_gemm_flops(a, b), SMALL_GEMM_FLOPS):
            return a @ b

        with serial_numpy_blas():
            return a @ b
    return a @ b
