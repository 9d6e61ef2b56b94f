"""One launch path for nnkit's Numba CUDA kernels: ``launch(kernel, grid, block, *args)``.

Every CUDA kernel in ``nnkit._ext`` is launched through ``launch``, the only code that knows
how arguments reach the device. It picks a path once per (kernel, argument signature) and
keeps it:

- ``"simulator"`` (``NUMBA_ENABLE_CUDASIM=1``): ``kernel[grid, block, stream, shared](*args)``
  on NumPy arrays or the tests' CuPy stand-in, as Numba launches it; each signature of
  one of nnkit's kernels is held to the compile audit's list (``_launch_types.seen``).
- ``"raw"`` (a real GPU, CuPy arrays): Numba compiles the kernel for the signature (its own
  dispatcher, so both paths share one compilation), CuPy loads the PTX once, and each launch
  packs the arguments in Numba's kernel ABI (``pack_args``) and launches through CuPy, on
  CuPy's current stream. The PTX's parameter list is checked against the packing before
  the path is taken.
- ``"numba"``: everything else (Numba device arrays, NumPy arrays on a GPU, a ``stream``
  given by the caller, an argument type ``pack_args`` does not know, a raw path that failed
  to build): Numba's dispatcher, CuPy arrays viewed without a host synchronisation
  (``cuda.as_cuda_array(sync=False)``), on CuPy's current stream.

An argument may also be a tuple of arrays (a kernel over many tensors: the multi-tensor
optimizer steps of ``optim_cuda``), which Numba's ABI passes as its arrays one after the
other; both paths take it. Numba's kernel parameters must stay within CUDA's 4 KiB (56
bytes per 1-D array): the caller splits its tensors into launches to fit.

Why: the host cost of a launch through Numba's dispatcher with CuPy arguments is about ten
times that of Numba's PTX launched by CuPy with packed arguments (benchmarks/RESULTS.md,
"GPU checklist on an NVIDIA H100").

``NNKIT_LAUNCH_PATH`` chooses: ``numba`` (the default until the raw path has been checked on
a GPU, see ``_DEFAULT``) sends every launch down the Numba path; ``auto`` takes the raw path
where it can; ``raw`` makes a CuPy signature that cannot take the raw path an error instead
of a quiet fallback (the GPU check, ``benchmarks/gpu_launch_check.py``). ``fallbacks``
records why a signature fell back.

Launches are always counted, by kernel name: ``launch_counts`` (a Counter), ``launches()``,
and ``count_launches()``, a context manager yielding a Counter of the launches made inside
its block (by every thread), so tests can hold an op to its launch budget. A launch whose
grid is empty does nothing and is not counted, on every path.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import os
import re
import tempfile
from itertools import chain

import numpy as np
from numba import config

from . import _launch_types

__all__ = ["launch", "kernel_factory", "factories", "launch_counts", "path_counts", "launches",
           "count_launches", "fallbacks", "device_empty", "packed_sizes", "pack_args",
           "param_sizes", "ptx_params", "set_path"]

_SIMULATOR = bool(config.ENABLE_CUDASIM)
_PATHS = ("auto", "raw", "numba")
# The raw path has run only against stand-ins (its packing equals Numba's own argument
# preparation, its PTX parameter sizes match): until ``benchmarks/gpu_launch_check.py`` has
# passed on a real GPU, real devices launch through Numba unless NNKIT_LAUNCH_PATH says
# otherwise.
_DEFAULT = "numba"

launch_counts: collections.Counter = collections.Counter()  # kernel name -> launches
path_counts: collections.Counter = collections.Counter()  # "simulator"/"raw"/"numba" -> launches
fallbacks: dict = {}  # (kernel name, signature key) -> why it took the Numba path
_recorders: tuple = ()  # the Counters of the open ``count_launches`` blocks
_entries: dict = {}  # (kernel, signature key) -> _Entry
_names: dict = {}  # kernel -> name
_variants: dict = {}  # kernel -> "module.factory(args)", for a kernel made by a factory
factories: dict = {}  # "module.factory" -> the cached factory (``kernel_factory``)


def _path_from_env() -> str:
    path = os.environ.get("NNKIT_LAUNCH_PATH", _DEFAULT).strip().lower() or _DEFAULT
    if path not in _PATHS:
        raise ValueError(f"NNKIT_LAUNCH_PATH={path!r}; expected one of {', '.join(_PATHS)}.")
    return path


_path = _path_from_env()


def set_path(path: str) -> None:
    """Choose the launch path for later launches: "auto" (raw where it can), "raw" (raw, or
    an error for a CuPy signature that cannot take it) or "numba"; forgets the choices made."""
    global _path
    if path not in _PATHS:
        raise ValueError(f"path={path!r}; expected one of {', '.join(_PATHS)}.")
    _path = path
    _entries.clear()
    fallbacks.clear()


def launches() -> int:
    """Kernel launches so far in this process."""
    return sum(launch_counts.values())


@contextlib.contextmanager
def count_launches():
    """Yield a Counter (kernel name -> launches) of the launches made inside the block."""
    global _recorders
    counts = collections.Counter()
    _recorders = (*_recorders, counts)
    try:
        yield counts
    finally:
        _recorders = tuple(r for r in _recorders if r is not counts)


def _name(kernel) -> str:
    name = _names.get(kernel)
    if name is None:
        fn = getattr(kernel, "py_func", kernel)
        module = getattr(fn, "__module__", "") or ""
        name = _names[kernel] = (f"{module.rsplit('.', 1)[-1]}."
                                 f"{getattr(fn, '__qualname__', repr(fn))}")
    return name


def kernel_factory(factory=None, *, on_gpu=None):
    """Decorator of a function that makes a kernel from literal arguments (str, int, bool):
    caches it and names each kernel it makes ``module.factory(args)`` in the list of launch
    types (``_launch_types``), so that the compile audit can make the same kernel again.
    ``on_gpu(args) -> args``, where the tests launch a variant a GPU would not (smaller
    tiles), gives the variant a GPU makes for the same inputs: the audit compiles that one.
    """
    if factory is None:
        return functools.partial(kernel_factory, on_gpu=on_gpu)
    module = factory.__module__.rsplit(".", 1)[-1]
    qualified = f"{module}.{factory.__name__}"

    @functools.cache
    def make(*args):
        kernel = factory(*args)
        _variants[kernel] = f"{qualified}({', '.join(map(repr, args))})"
        return kernel

    make.on_gpu = on_gpu
    factories[qualified] = functools.update_wrapper(make, factory)
    return make


def _is_nnkit(kernel) -> bool:
    """Whether ``kernel`` is one of nnkit's (its launches are held to the compile audit's
    list); a script's own kernels are not."""
    fn = getattr(kernel, "py_func", kernel)
    return (getattr(fn, "__module__", "") or "").startswith("nnkit.")


def _count(name: str, path: str) -> None:
    launch_counts[name] += 1
    path_counts[path] += 1
    for counts in _recorders:
        counts[name] += 1


def _empty(dims) -> bool:
    return 0 in dims if isinstance(dims, (tuple, list)) else dims == 0


def _dims(dims) -> tuple:
    return dims if type(dims) is tuple else tuple(dims) if isinstance(dims, list) else (dims,)


# ---- the launch ---------------------------------------------------------------------------

def launch(kernel, grid, block, *args, stream=None, shared=0) -> None:
    """``kernel[grid, block, stream, shared](*args)``, by the cheapest path that can run it
    (see the module docstring). ``grid`` and ``block``: an int or a tuple of up to three;
    ``stream``: None for CuPy's current stream (Numba's default stream without CuPy
    arrays), or a Numba stream (then the Numba path); ``shared``: dynamic shared memory in
    bytes."""
    if _empty(grid):
        return
    if _SIMULATOR:
        name = _name(kernel)
        _count(name, "simulator")
        if _is_nnkit(kernel):
            _launch_types.seen(_variants.get(kernel, name), args)
        kernel[grid, block, 0 if stream is None else stream, shared](*args)
        return
    if stream is not None or _path == "numba":
        _count(_name(kernel), "numba")
        _launch_numba(kernel, grid, block, args, stream, shared)
        return
    nd = _cupy_ndarray()
    key = (kernel, *[(a.dtype, a.ndim, a.flags.c_contiguous, a.flags.f_contiguous)
                     if isinstance(a, nd) else _tuple_key(a, nd) if a.__class__ is tuple
                     else a.__class__ for a in args])
    entry = _entries.get(key)
    if entry is None:
        entry = _entries[key] = _specialise(kernel, key, args)
    _count(entry.name, entry.path)
    if entry.function is None:
        _launch_numba(kernel, grid, block, args, None, shared)
        return
    params = tuple(chain.from_iterable(
        [pack(a) for pack, a in zip(entry.packers, args, strict=True)]))
    entry.function(_dims(grid), _dims(block), params, shared)


def _tuple_key(value, nd) -> tuple:
    """The signature key of a tuple argument: its members' (arrays by dtype, rank, layout)."""
    return (tuple, *[(a.dtype, a.ndim, a.flags.c_contiguous, a.flags.f_contiguous)
                     if isinstance(a, nd) else a.__class__ for a in value])


def device_empty(like, shape, dtype):
    """An uninitialised array (a kernel's workspace) where ``like`` lives: CuPy for a CuPy
    array (so its launches can take the raw path), NumPy for a NumPy array (the simulator),
    else a Numba device array."""
    if isinstance(like, np.ndarray):
        return np.empty(shape, dtype)
    if type(like).__module__.startswith("cupy"):
        import cupy

        return cupy.empty(shape, dtype)
    from numba import cuda

    return cuda.device_array(shape, dtype)


class _Entry:
    """How one (kernel, signature) launches: ``function`` None for the Numba path."""

    __slots__ = ("name", "path", "function", "packers")

    def __init__(self, name, path, function=None, packers=()):
        self.name, self.path, self.function, self.packers = name, path, function, packers


class _NoArray:  # matches nothing: CuPy is not imported, so no CuPy array exists
    pass


def _cupy_ndarray():
    global _ndarray
    if _ndarray is _NoArray:
        import sys

        cupy = sys.modules.get("cupy")
        if cupy is None:
            return _NoArray
        _ndarray = cupy.ndarray
    return _ndarray


_ndarray = _NoArray


def _launch_numba(kernel, grid, block, args, stream, shared) -> None:
    """Numba's dispatcher; CuPy arrays become Numba views without a host synchronisation,
    on CuPy's current stream (ordered after the CuPy work that made them)."""
    nd = _cupy_ndarray()
    if any(isinstance(a, nd) or (a.__class__ is tuple and any(isinstance(e, nd) for e in a))
           for a in args):
        from numba import cuda

        if stream is None:
            stream = _numba_stream()

        def view(a):
            return cuda.as_cuda_array(a, sync=False) if isinstance(a, nd) else a

        args = [tuple(map(view, a)) if a.__class__ is tuple else view(a) for a in args]
    kernel[grid, block, 0 if stream is None else stream, shared](*args)


_streams: dict = {}


def _numba_stream():
    """CuPy's current stream as a Numba stream (cached by pointer)."""
    import cupy
    from numba import cuda

    ptr = cupy.cuda.get_current_stream().ptr
    stream = _streams.get(ptr)
    if stream is None:
        stream = _streams[ptr] = (cuda.default_stream() if ptr == 0
                                  else cuda.external_stream(ptr))
    return stream


def _specialise(kernel, key, args) -> _Entry:
    """The entry of a signature met for the first time: raw where it can, else Numba."""
    name = _name(kernel)
    nd = _cupy_ndarray()
    members = chain.from_iterable(a if a.__class__ is tuple else (a,) for a in args)
    arrays = [a for a in members if isinstance(a, np.ndarray)
              or hasattr(a, "__cuda_array_interface__")]
    if not arrays or not all(isinstance(a, nd) for a in arrays):
        return _Entry(name, "numba")  # NumPy or Numba device arrays: Numba's transfers
    try:
        argtypes = tuple(_arg_type(kernel, a) for a in args)
        packers = _packers(argtypes, [a.__class__ for a in args])
        packed = packed_sizes(chain.from_iterable(p(a) for p, a in zip(packers, args,
                                                                      strict=True)))
        if packed != param_sizes(argtypes):
            raise TypeError(f"pack_args packs {packed} bytes for {param_sizes(argtypes)}")
        function = _load(kernel, argtypes)
    except Exception as exc:  # an argument pack_args does not know, or no PTX: Numba's path
        if _path == "raw":
            raise RuntimeError(f"{name}: the raw launch path cannot take {key[1:]} "
                               f"({type(exc).__name__}: {exc})") from exc
        fallbacks[(name, key[1:])] = f"{type(exc).__name__}: {exc}"
        return _Entry(name, "numba")
    return _Entry(name, "raw", function, packers)


def _arg_type(kernel, value):
    """Numba's type of a kernel argument; a tuple's from its members' (Numba's own typeof
    does not look into a tuple for ``__cuda_array_interface__``)."""
    if value.__class__ is tuple:
        from numba.core import types

        return types.BaseTuple.from_types([_typeof(kernel, v) for v in value])
    return _typeof(kernel, value)


def _typeof(kernel, value):
    """Numba's type of a kernel argument, as its dispatcher types it (CuPy arrays through
    ``__cuda_array_interface__``)."""
    return kernel.typeof_pyval(value)


def _load(kernel, argtypes):
    """A CuPy function launching Numba's compiled kernel for ``argtypes``; raises when its
    PTX's parameters are not what ``pack_args`` packs."""
    ptx = _ptx(kernel, argtypes)
    entry, sizes = ptx_params(ptx)
    expected = param_sizes(argtypes)
    if sizes != expected:
        raise TypeError(f"the PTX of {entry} takes parameters of {sizes} bytes; pack_args "
                        f"packs {expected}")
    return _cupy_function(ptx, entry)


def _ptx(kernel, argtypes) -> str:
    """Numba's PTX of ``kernel`` for ``argtypes`` and this device, from its dispatcher (the
    compilation the Numba path would use)."""
    from numba import cuda

    return kernel.compile(argtypes).inspect_asm(cuda.get_current_device().compute_capability)


def _cupy_function(ptx: str, entry: str):
    """The kernel ``entry`` of ``ptx``, loaded by CuPy, as f(grid, block, params, shared)."""
    import cupy

    with tempfile.TemporaryDirectory(prefix="nnkit-ptx-") as folder:
        path = os.path.join(folder, "kernel.ptx")
        with open(path, "w") as fh:
            fh.write(ptx)
        raw = cupy.RawModule(path=path).get_function(entry)  # loads the module now
        function = getattr(raw, "kernel", None)  # cupy.cuda.function.Function: no lookup
    if function is None:
        return lambda grid, block, params, shared: raw(grid, block, params, shared_mem=shared)
    return function


# ---- Numba's kernel ABI -------------------------------------------------------------------
# A kernel's parameters, argument by argument (numba-cuda's ``_Kernel._prepare_args``):
# an array of ndim d is 5 + 2 d parameters: meminfo (0), parent (0), nitems, itemsize, the
# data pointer, the d extents, the d strides in bytes, each 8 bytes; a boolean is one byte;
# an integer or float its own width; a complex number its real and imaginary parts; a tuple
# its members' parameters in order (only tuples of arrays take the raw path here).

_SCALARS = {"bool": np.bool_, "float16": np.float16, "float32": np.float32,
            "float64": np.float64, "complex64": np.float32, "complex128": np.float64,
            **{f"{s}int{b}": np.dtype(f"{s}int{b}").type for s in ("", "u")
               for b in (8, 16, 32, 64)}}


def _is_array(ty) -> bool:
    return isinstance(getattr(ty, "ndim", None), int) and hasattr(ty, "layout")


def _array_members(ty):
    """The member types of a tuple type whose members are all arrays, else None."""
    members = getattr(ty, "types", None)
    if isinstance(members, tuple) and members and all(_is_array(t) for t in members):
        return members
    return None


def param_sizes(argtypes) -> list[int]:
    """Byte sizes of the kernel parameters that Numba makes of arguments of ``argtypes``."""
    sizes = []
    for ty in argtypes:
        if _is_array(ty):
            sizes += [8] * (5 + 2 * ty.ndim)
            continue
        members = _array_members(ty)
        if members is not None:
            sizes += param_sizes(members)
            continue
        scalar = _SCALARS.get(str(ty))
        if scalar is None:
            raise TypeError(f"no raw launch for an argument of type {ty}")
        width = np.dtype(scalar).itemsize
        sizes += [width, width] if str(ty).startswith("complex") else [width]
    return sizes


def packed_sizes(params) -> list[int]:
    """The bytes CuPy passes for each packed parameter: 8 for a Python int or float and for
    an array (its pointer), 1 for a Python bool, a NumPy scalar's itemsize."""
    sizes = []
    for p in params:
        if isinstance(p, bool):
            sizes.append(1)
        elif isinstance(p, (int, float)):
            sizes.append(8)
        elif isinstance(p, np.generic):
            sizes.append(p.itemsize)
        else:  # an array: its device pointer
            sizes.append(8)
    return sizes


def _array_fields(a):
    return (0, 0, a.size, a.itemsize, a, *a.shape, *a.strides)


def _packer(ty, cls):
    """A function of one argument of Numba type ``ty`` (and class ``cls``) to its tuple of
    kernel parameters: Python ints and floats pass as CuPy passes them (8 bytes), other
    scalars as NumPy scalars of the parameter's width, an array as its fields with the
    array itself as the data pointer."""
    if _is_array(ty):
        return _array_fields
    if _array_members(ty) is not None:
        return lambda v: tuple(chain.from_iterable(_array_fields(a) for a in v))
    name = str(ty)
    scalar = _SCALARS.get(name)
    if scalar is None:
        raise TypeError(f"no raw launch for an argument of type {ty}")
    if name.startswith("complex"):
        return lambda v: (scalar(v.real), scalar(v.imag))
    if cls is scalar or (cls is int and name == "int64") or (cls is float and name == "float64"):
        return lambda v: (v,)
    return lambda v: (scalar(v),)


def _packers(argtypes, classes):
    return tuple(_packer(ty, cls) for ty, cls in zip(argtypes, classes, strict=True))


def pack_args(argtypes, args) -> tuple:
    """The kernel parameters, in order, that Numba's ABI makes of ``args`` typed
    ``argtypes``: a tuple of Python ints and floats, NumPy scalars, and the arrays
    themselves where a data pointer goes (CuPy passes an array as its pointer).

    >>> import numba
    >>> x = np.zeros((2, 3), np.float32)
    >>> params = pack_args([numba.typeof(x), numba.typeof(True)], (x, True))
    >>> params[:4], params[4] is x, params[5:9], params[9]  # meminfo, parent, size, itemsize
    ((0, 0, 6, 4), True, (2, 3, 12, 4), np.True_)
    >>> packed_sizes(params) == param_sizes([numba.typeof(x), numba.typeof(True)])
    True
    """
    packers = _packers(argtypes, [a.__class__ for a in args])
    return tuple(chain.from_iterable(pack(a) for pack, a in zip(packers, args, strict=True)))


_ENTRY = re.compile(r"\.entry\s+([\w$.]+)\s*\((.*?)\)", re.S)
_PARAM = re.compile(r"\.param\s+(?:\.align\s+\d+\s+)?\.([a-z]+)(\d+)\s+[\w$.]+(?:\[(\d+)\])?")


def ptx_params(ptx: str) -> tuple[str, list[int]]:
    """(entry name, byte size of each parameter) of the kernel in a PTX module."""
    match = _ENTRY.search(ptx)
    if match is None:
        raise ValueError("no .entry in the PTX")
    sizes = [int(bits) // 8 * int(count or 1)
             for _kind, bits, count in _PARAM.findall(match.group(2))]
    return match.group(1), sizes
