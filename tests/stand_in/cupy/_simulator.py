"""Numba's CUDA simulator, taught to take the stand-in's arrays.

The simulator launches kernels on NumPy arrays (copying them in and back, as host arrays) or
on its own device arrays. A stand-in array goes to a kernel as a simulator device array on
its buffer, shared and never copied, as Numba reads a CuPy array's
``__cuda_array_interface__``; a tuple of them as a tuple of their buffers (the simulator
hands a tuple to the kernel as it is). The simulator also lacks three calls nnkit's
launchers make: ``as_cuda_array`` (a view, the same), ``default_stream`` and
``external_stream`` (0, the only stream it has).
"""


def install(device_array_type) -> None:
    from numba import cuda
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray
    from numba.cuda.simulator.kernel import FakeCUDAKernel

    if getattr(FakeCUDAKernel, "_stand_in", False):
        return

    def view(a):
        if isinstance(a, tuple):  # a tuple of arrays (the multi-tensor optimizer kernels):
            return tuple(e._a if isinstance(e, device_array_type) else e for e in a)
        return FakeCUDAArray(a._a) if isinstance(a, device_array_type) else a

    launch = FakeCUDAKernel.__call__
    FakeCUDAKernel.__call__ = lambda self, *args: launch(self, *map(view, args))
    FakeCUDAKernel._stand_in = True
    cuda.as_cuda_array = lambda obj, sync=True: view(obj)
    cuda.default_stream = lambda: 0
    cuda.external_stream = lambda ptr: 0
