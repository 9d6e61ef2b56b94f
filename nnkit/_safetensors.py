"""The safetensors file format, read and written with NumPy alone (no pickle, no extra package).

Layout (https://github.com/huggingface/safetensors): 8 bytes little-endian u64 N, then N bytes
of a JSON header ``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__":
{str: str}}`` (padded with spaces to a multiple of 8), then the tensors' bytes, little-endian,
C order, back to back.

bfloat16 tensors (dtype ``BF16``, what many published checkpoints hold) are read as float32:
NumPy has no bfloat16, and a bfloat16 is the top half of a float32, so the conversion is
exact (the 16 bits become the high half, the low half zero). They are never written.

Writes are atomic: the bytes go to a temporary file in the same folder, which is flushed,
fsynced, read back (its header parsed and checked as a read would) and renamed over the
target, so a crash mid-write leaves the previous file intact, and the temporary file of a
writer that was killed is removed by the next write to the same path. Arrays are stored
little-endian (a big-endian array reads back little-endian, equal values), 0-d arrays with
shape []. Reads check everything a truncated or corrupted file can get wrong and say what
it is.
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ._files import quote, regular_size, write_atomic

__all__ = ["write_file", "read_file", "read_header", "TensorEntry", "FileFormatError"]

_DTYPES = {
    "BOOL": np.bool_, "U8": np.uint8, "I8": np.int8, "U16": np.uint16, "I16": np.int16,
    "U32": np.uint32, "I32": np.int32, "U64": np.uint64, "I64": np.int64,
    "F16": np.float16, "F32": np.float32, "F64": np.float64,
}
_CODES = {np.dtype(v): k for k, v in _DTYPES.items()}
_BF16 = "BF16"  # read as uint16 (its bytes), then widened to float32
_READ_ONLY = {_BF16: np.uint16}
_MAX_HEADER = 100 * 2**20  # the reference implementation's limit
_MAX_NDIM = 32  # NumPy's array rank limit (NumPy 1; NumPy 2 allows 64)
_MAX_DIM = 2**63 - 1  # one axis of a NumPy array (intp)


class FileFormatError(ValueError):
    """A file that is not a valid (or not a complete) safetensors / nnkit file."""


def _code(name: str, array: np.ndarray) -> str:
    dtype = array.dtype.newbyteorder("=") if array.dtype.byteorder == ">" else array.dtype
    if dtype not in _CODES:
        raise TypeError(f"cannot save tensor '{name}' of dtype {array.dtype}: safetensors holds "
                        f"{', '.join(str(np.dtype(v)) for v in _DTYPES.values())}")
    return _CODES[dtype]


def _as_stored(name: str, array: np.ndarray) -> np.ndarray:
    """C-contiguous and little-endian, its shape kept (0-d too)."""
    array = np.asarray(array)
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    return array if array.flags.c_contiguous else array.copy(order="C")


def _header(tensors: dict, metadata: dict) -> tuple[bytes, list]:
    entries, order, offset = {}, [], 0
    for name, array in tensors.items():
        if name == "__metadata__":
            raise ValueError("cannot save a tensor named '__metadata__': safetensors keeps "
                             "that name for the file's metadata")
        size = array.nbytes
        entries[name] = {"dtype": _code(name, array), "shape": list(array.shape),
                         "data_offsets": [offset, offset + size]}
        order.append(array)
        offset += size
    if metadata:
        entries["__metadata__"] = metadata
    raw = json.dumps(entries, separators=(",", ":"), allow_nan=False).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    return raw, order


def write_file(path, tensors: dict, metadata: dict | None = None) -> None:
    """Write ``tensors`` {name: ndarray} and ``metadata`` {str: str} to ``path`` atomically.

    The folder of ``path`` must exist (FileNotFoundError naming it otherwise); nothing is
    written when an argument is invalid.
    """
    path = Path(path)
    stored = {str(n): _as_stored(n, a) for n, a in tensors.items()}
    header, arrays = _header(stored, {str(k): str(v) for k, v in (metadata or {}).items()})

    def write(f):
        f.write(struct.pack("<Q", len(header)))
        f.write(header)
        for array in arrays:
            if array.size:
                f.write(array.reshape(-1).view(np.uint8).data)

    write_atomic(path, write, check=lambda tmp: _check_written(tmp, path))


def _check_written(tmp: Path, path: Path) -> None:
    """Check the header of the file just written as ``read_file`` will: a file that could
    not be read back never replaces ``path``."""
    try:
        with open(tmp, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            header = _parse_header(tmp, f, size)
            _check_metadata(tmp, header.pop("__metadata__", None))
            end = max((_check_entry(tmp, n, e)[2][1] for n, e in header.items()), default=0)
            if f.tell() + end != size:
                raise FileFormatError(f"the header describes {end} bytes of tensor data, the "
                                      f"file holds {size - f.tell()}")
    except FileFormatError as exc:
        raise ValueError(f"cannot save to '{path}': the file written would not read back "
                         f"({exc})") from None


def _unique(pairs):
    """A JSON object's dict; a key given twice is refused (as the safetensors package does)."""
    out = dict(pairs)
    if len(out) != len(pairs):
        keys = [k for k, _ in pairs]
        raise _Duplicate(next(k for k in keys if keys.count(k) > 1))
    return out


class _Duplicate(ValueError):
    pass


def _parse_header(path: Path, f, file_size: int) -> dict:
    if file_size < 8:
        raise FileFormatError(f"'{path}' is {file_size} bytes long: too short to be a "
                              "safetensors file (truncated or empty)")
    (n,) = struct.unpack("<Q", f.read(8))
    if n > _MAX_HEADER:
        raise FileFormatError(f"'{path}' declares a {n}-byte header, more than the "
                              f"{_MAX_HEADER} bytes a safetensors header may have; the file is "
                              "corrupted, hostile or not a safetensors file")
    if 8 + n > file_size:
        raise FileFormatError(f"'{path}' declares a {n}-byte header but holds {file_size} "
                              "bytes: truncated, corrupted or not a safetensors file")
    try:
        header = json.loads(f.read(n).decode("utf-8"), object_pairs_hook=_unique)
    except RecursionError:
        raise FileFormatError(f"'{path}': the header is JSON nested too deeply to be a "
                              "safetensors header; the file is corrupted or hostile") from None
    except _Duplicate as exc:
        raise FileFormatError(f"'{path}': the header has the key {quote(exc.args[0])} twice "
                              "in one object; the file is corrupted or hostile") from None
    except ValueError as exc:  # UnicodeDecodeError, JSONDecodeError, int digit limit
        raise FileFormatError(f"'{path}': the header is not valid JSON ({str(exc)[:200]}); "
                              "the file is corrupted or not a safetensors file") from None
    if not isinstance(header, dict):
        raise FileFormatError(f"'{path}': the header is a {type(header).__name__}, not a "
                              "JSON object; the file is corrupted")
    return header


def _check_entry(path: Path, name: str, entry) -> tuple:
    def bad(what):
        return FileFormatError(f"'{path}': the header entry of tensor {quote(name, 80)} is "
                               f"malformed: {what} ({entry!r:.200}); the file is corrupted")

    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
        raise bad("expected a JSON object with the keys dtype, shape and data_offsets")
    code, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not isinstance(code, str) or (code not in _DTYPES and code not in _READ_ONLY):
        raise FileFormatError(f"'{path}': tensor {quote(name, 80)} has dtype {code!r:.100}, which "
                              f"nnkit does not read (it reads "
                              f"{', '.join([*_DTYPES, *_READ_ONLY])})")
    if not (isinstance(shape, list) and all(type(s) is int and 0 <= s <= _MAX_DIM
                                            for s in shape)):
        raise bad("shape must be a list of integers from 0 to 2**63 - 1")
    if len(shape) > _MAX_NDIM:
        raise bad(f"shape has {len(shape)} dimensions, more than {_MAX_NDIM}")
    if not (isinstance(offsets, list) and len(offsets) == 2
            and all(type(o) is int and o >= 0 for o in offsets) and offsets[0] <= offsets[1]):
        raise bad("data_offsets must be [begin, end], integers with 0 <= begin <= end")
    dtype = np.dtype(_DTYPES.get(code) or _READ_ONLY[code])
    size = math.prod(shape) * dtype.itemsize  # Python ints: no wrap-around
    if offsets[1] - offsets[0] != size:
        raise FileFormatError(f"'{path}': tensor {quote(name, 80)} of shape {tuple(shape)} and "
                              f"dtype {code} needs {size} bytes but its offsets {offsets} span "
                              f"{offsets[1] - offsets[0]}; the file is corrupted")
    return dtype, tuple(shape), offsets, code


def _bfloat16_to_float32(bits: np.ndarray) -> np.ndarray:
    """uint16 array of bfloat16 bit patterns -> the float32 array of the same values."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _check_metadata(path: Path, metadata) -> dict:
    if metadata is None:
        return {}
    if not isinstance(metadata, dict):
        raise FileFormatError(f"'{path}': __metadata__ is a {type(metadata).__name__}, not a "
                              "JSON object {str: str}; the file is corrupted")
    for key, value in metadata.items():
        if not isinstance(value, str):
            raise FileFormatError(f"'{path}': __metadata__ value of {quote(key, 80)} is a "
                                  f"{type(value).__name__}, not a string (safetensors metadata "
                                  "is {str: str}); the file is corrupted")
    return metadata


def _physical_memory() -> int | None:
    """This machine's memory in bytes (None where the OS does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of a safetensors file, described by its (checked) header entry; ``read``
    loads it. Lets a reader check names, dtypes and shapes before reading any data."""

    path: Path
    name: str
    code: str  # the file's dtype code (F32, BF16, ...)
    dtype: np.dtype  # what read() returns (float32 for BF16)
    shape: tuple
    start: int  # byte offset in the file
    nbytes: int  # bytes in the file

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def read(self) -> np.ndarray:
        """A fresh, writable array; MemoryError naming the file and tensor when this
        machine cannot hold it."""
        stored = np.dtype(_DTYPES.get(self.code) or _READ_ONLY[self.code]).newbyteorder("<")
        memory = _physical_memory()
        try:
            if memory is not None and self.nbytes > memory:  # never try: it could only swap
                raise MemoryError
            out = np.empty(self.shape, dtype=stored)
        except MemoryError:
            raise MemoryError(f"'{self.path}': tensor {quote(self.name, 80)} of shape "
                              f"{self.shape} needs {self.nbytes} bytes, more than this "
                              f"machine could allocate (it has {memory} bytes of memory)") from None
        except (ValueError, OverflowError) as exc:
            raise FileFormatError(f"'{self.path}': tensor {quote(self.name, 80)} of shape "
                                  f"{self.shape} cannot be made ({exc}); the file is "
                                  "corrupted") from None
        with open(self.path, "rb") as f:
            f.seek(self.start)
            if out.size and f.readinto(out.reshape(-1).view(np.uint8).data) != out.nbytes:
                raise FileFormatError(f"'{self.path}': could not read tensor "
                                      f"{quote(self.name, 80)} (truncated)")
        out = out.astype(stored.newbyteorder("="), copy=False)
        return _bfloat16_to_float32(out) if self.code == _BF16 else out


def read_header(path) -> tuple[dict, dict]:
    """``({name: TensorEntry}, metadata {str: str})`` of a safetensors file, in the header's
    order, without reading any tensor data; the same checks as ``read_file``."""
    path = Path(path)
    file_size = regular_size(path)  # a FIFO or device is refused, never opened
    with open(path, "rb") as f:
        header = _parse_header(path, f, file_size)
        data_start = f.tell()
    metadata = _check_metadata(path, header.pop("__metadata__", None))
    entries = {name: _check_entry(path, name, entry) for name, entry in header.items()}
    expected = 0
    for name, (_, _, offsets, _) in sorted(entries.items(), key=lambda item: item[1][2][0]):
        if offsets[0] != expected:
            raise FileFormatError(f"'{path}': tensor {quote(name, 80)} starts at byte "
                                  f"{offsets[0]} of the data, expected {expected} (gaps or "
                                  "overlaps); the file is corrupted")
        expected = offsets[1]
    if data_start + expected != file_size:
        what = "is truncated" if data_start + expected > file_size else "has trailing bytes"
        raise FileFormatError(f"'{path}' {what}: the header describes {expected} bytes "
                              f"of tensor data, the file holds {file_size - data_start}")
    return {name: TensorEntry(path, name, code, np.dtype(np.float32) if code == _BF16 else dtype,
                              shape, data_start + offsets[0], offsets[1] - offsets[0])
            for name, (dtype, shape, offsets, code) in entries.items()}, metadata


def read_file(path) -> tuple[dict, dict]:
    """Read a safetensors file: ``(tensors {name: ndarray}, metadata {str: str})``.

    Raises FileNotFoundError for a missing file and FileFormatError (a ValueError) naming the
    problem for a truncated, corrupted or foreign file. Arrays are fresh, writable copies;
    bfloat16 tensors come back as float32 (exactly).
    """
    entries, metadata = read_header(path)
    return {name: entry.read() for name, entry in entries.items()}, metadata
