"""The argument types nnkit's CUDA kernels are launched with, as text, and the list of them
that the compile audit compiles (``nnkit._ext._cuda_audit``).

A kernel's argument types are written as Numba writes them (``array(float32, 2d, C)``,
``int64``, ``UniTuple(array(float32, 1d, C) x 4)``), typed as a GPU launch types them: an
array by its dtype, rank and layout (C if C-contiguous, else F if F-contiguous, else A), a
Python int as int64, a float as float64, a tuple by its members.

Under Numba's simulator every launch passes through ``seen`` (``_launch.launch``). With
``NNKIT_CUDA_LAUNCH_TYPES`` naming a list (a JSON file: kernel name -> list of signatures),
a launch whose kernel and types the list lacks raises ``UncompiledLaunch``: the compile
audit never compiled that kernel for those types. With ``NNKIT_CUDA_LAUNCH_TYPES_RECORD=1``
as well, the launch is added to the list instead (at the process's exit, under a lock on the
file, so concurrent test processes can record into one list).
"""

from __future__ import annotations

import atexit
import json
import os
import re

import numpy as np

__all__ = ["type_text", "signature_text", "parse_type", "read_list", "write_list", "seen",
           "UncompiledLaunch"]

ENV_LIST = "NNKIT_CUDA_LAUNCH_TYPES"
ENV_RECORD = "NNKIT_CUDA_LAUNCH_TYPES_RECORD"


class UncompiledLaunch(RuntimeError):
    """A kernel launched with argument types that the compile audit's list lacks."""


# ---- types as text ---------------------------------------------------------------------------

def _layout(flags) -> str:
    return "C" if flags.c_contiguous else "F" if flags.f_contiguous else "A"


def _numba_type(value):
    from numba import typeof
    from numba.core import types
    from numba.np.numpy_support import from_dtype

    if value.__class__ is tuple:
        return types.BaseTuple.from_types([_numba_type(v) for v in value])
    if type(value).__name__ in ("In", "Out", "InOut") and hasattr(value, "value"):
        value = value.value  # cuda.In(array) & co.: the array, as Numba passes it
    if not isinstance(value, np.generic) and all(hasattr(value, a) for a in ("ndim", "flags")):
        return types.Array(from_dtype(np.dtype(value.dtype)), value.ndim, _layout(value.flags))
    return typeof(value)


def type_text(value) -> str:
    """The Numba type of a kernel argument as a GPU launch types it, as text."""
    return str(_numba_type(value))


def signature_text(args) -> tuple:
    """The argument types of a launch, as text: one string per argument."""
    return tuple(type_text(a) for a in args)


_TOKEN = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*|\d+d?|[(),])")


def _scalars() -> dict:
    from numba.core import types

    return {str(t): t for t in (*types.number_domain, types.boolean)}


def parse_type(text: str):
    """The Numba type written ``text`` (arrays, tuples, scalars; nothing else is accepted)."""
    from numba.core import types

    tokens, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise ValueError(f"cannot read the type {text!r} at {pos}")
        tokens.append(m.group(1))
        pos = m.end()
    scalars = _scalars()

    def take(expected=None):
        if not tokens:
            raise ValueError(f"the type {text!r} ends early")
        tok = tokens.pop(0)
        if expected is not None and tok != expected:
            raise ValueError(f"expected {expected!r} in the type {text!r}, got {tok!r}")
        return tok

    def one():
        head = take()
        if head == "array":
            take("(")
            dtype = scalars[take()]
            take(",")
            ndim = take()
            take(",")
            layout = take()
            take(")")
            if not ndim.endswith("d") or layout not in ("C", "F", "A"):
                raise ValueError(f"bad array type {text!r}")
            return types.Array(dtype, int(ndim[:-1]), layout)
        if head == "UniTuple":  # UniTuple(member x count)
            take("(")
            member = one()
            take("x")
            count = int(take())
            take(")")
            return types.UniTuple(member, count)
        if head == "Tuple":  # Tuple(member, member, ...)
            take("(")
            members = [one()]
            while take() == ",":
                members.append(one())
            return types.Tuple(members)
        if head in scalars:
            return scalars[head]
        raise ValueError(f"unknown type {head!r} in {text!r}")

    ty = one()
    if tokens:
        raise ValueError(f"trailing text in the type {text!r}")
    return ty


# ---- the list --------------------------------------------------------------------------------

def read_list(path) -> dict:
    """{kernel name: set of signatures (tuples of type texts)} from the JSON list at ``path``."""
    with open(path) as fh:
        raw = json.load(fh)
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected an object of kernel name -> signatures")
    return {name: {tuple(sig) for sig in sigs} for name, sigs in raw.items()}


def _list_text(kernels: dict) -> str:
    entries = [f"  {json.dumps(name)}: [\n" + ",\n".join(
        f"    {json.dumps(list(sig))}" for sig in sorted(kernels[name])) + "\n  ]"
        for name in sorted(kernels)]
    return "{\n" + ",\n".join(entries) + "\n}\n"


def write_list(path, kernels: dict) -> None:
    """Write {kernel name: signatures} as sorted, diff-friendly JSON (a line a signature)."""
    with open(path, "w") as fh:
        fh.write(_list_text(kernels))


_known: dict | None = None  # the list, read on the first launch
_checked: set = set()  # (name, signature) already checked in this process
_new: dict = {}  # name -> signatures to add (record mode)


def seen(name: str, args) -> None:
    """Check (or record) one simulator launch of kernel ``name`` with ``args``."""
    global _known
    path = os.environ.get(ENV_LIST)
    if not path:
        return
    sig = signature_text(args)
    if (name, sig) in _checked:
        return
    _checked.add((name, sig))
    if _known is None:
        _known = read_list(path) if os.path.exists(path) else {}
    if sig in _known.get(name, ()):
        return
    if os.environ.get(ENV_RECORD) == "1":
        if not _new:
            atexit.register(_add_new, path)
        _new.setdefault(name, set()).add(sig)
        return
    raise UncompiledLaunch(
        f"{name} launched with ({', '.join(sig)}), which {path} does not list: the compile "
        f"audit has not compiled it. Record it: {ENV_RECORD}=1 {ENV_LIST}={path} and rerun.")


def _add_new(path) -> None:
    """Merge this process's new signatures into the list, holding a lock on the file."""
    import fcntl

    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        fh.seek(0)
        text = fh.read()
        kernels = {name: {tuple(sig) for sig in sigs}
                   for name, sigs in (json.loads(text) if text.strip() else {}).items()}
        for name, sigs in _new.items():
            kernels.setdefault(name, set()).update(sigs)
        fh.seek(0)
        fh.truncate()
        fh.write(_list_text(kernels))
