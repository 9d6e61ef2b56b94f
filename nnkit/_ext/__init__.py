"""Private compiled kernels: Numba CPU (``*_cpu.py``), Numba CUDA (``*_cuda.py``) and
Cython (``*.pyx``, built by setup.py). No validation here: C-contiguous arrays and a
preallocated ``out`` in, nothing allocated inside the loops. Use ``nnkit.kernels``."""
