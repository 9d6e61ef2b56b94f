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

import glob
import json
import math
import os
import secrets
import socket
import struct
from pathlib import Path

import numpy as np

__all__ = ["write_file", "read_file", "FileFormatError"]

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
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise FileNotFoundError(f"cannot save to '{path}': the folder '{folder}' does not exist")
    if path.is_dir():
        raise IsADirectoryError(f"cannot save to '{path}': it is a folder; give a file name")
    stored = {str(n): _as_stored(n, a) for n, a in tensors.items()}
    header, arrays = _header(stored, {str(k): str(v) for k, v in (metadata or {}).items()})
    _remove_stale_temporaries(folder, path.name)
    tmp = folder / f".{path.name}.{_HOST}-{os.getpid()}-{secrets.token_hex(4)}.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(header)))
            f.write(header)
            for array in arrays:
                if array.size:
                    f.write(array.reshape(-1).view(np.uint8).data)
            f.flush()
            os.fsync(f.fileno())
        _check_written(tmp, path)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_folder(folder)


_HOST = "".join(c if c.isalnum() else "_" for c in socket.gethostname())


def _remove_stale_temporaries(folder: Path, name: str) -> None:
    """Remove the temporary files that writers to ``folder/name`` on this host left when
    they were killed (their process is gone); other hosts' and live writers' stay."""
    for tmp in glob.glob(os.path.join(glob.escape(str(folder)), f".{glob.escape(name)}.*.tmp")):
        writer = os.path.basename(tmp)[len(name) + 2:-len(".tmp")].rsplit("-", 2)
        if len(writer) != 3 or writer[0] != _HOST or not writer[1].isdigit():
            continue
        try:
            os.kill(int(writer[1]), 0)
        except ProcessLookupError:  # the writer is gone: its file is garbage
            Path(tmp).unlink(missing_ok=True)
        except (PermissionError, OverflowError):  # alive under another user, or no pid
            continue


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


def _fsync_folder(folder: Path) -> None:
    """Make the rename durable (POSIX); a no-op where folders cannot be opened."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _parse_header(path: Path, f, file_size: int) -> dict:
    if file_size < 8:
        raise FileFormatError(f"'{path}' is {file_size} bytes long: too short to be a "
                              "safetensors file (truncated or empty)")
    (n,) = struct.unpack("<Q", f.read(8))
    if n > _MAX_HEADER or 8 + n > file_size:
        raise FileFormatError(f"'{path}' declares a {n}-byte header but holds {file_size} "
                              "bytes: truncated, corrupted or not a safetensors file")
    try:
        header = json.loads(f.read(n).decode("utf-8"))
    except RecursionError:
        raise FileFormatError(f"'{path}': the header is JSON nested too deeply to be a "
                              "safetensors header; the file is corrupted or hostile") from None
    except ValueError as exc:  # UnicodeDecodeError, JSONDecodeError, int digit limit
        raise FileFormatError(f"'{path}': the header is not valid JSON ({exc}); the file is "
                              "corrupted or not a safetensors file") from None
    if not isinstance(header, dict):
        raise FileFormatError(f"'{path}': the header is a {type(header).__name__}, not a "
                              "JSON object; the file is corrupted")
    return header


def _check_entry(path: Path, name: str, entry) -> tuple:
    def bad(what):
        return FileFormatError(f"'{path}': the header entry of tensor '{name}' is malformed: "
                               f"{what} ({entry!r:.200}); the file is corrupted")

    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
        raise bad("expected a JSON object with the keys dtype, shape and data_offsets")
    code, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not isinstance(code, str) or (code not in _DTYPES and code not in _READ_ONLY):
        raise FileFormatError(f"'{path}': tensor '{name}' has dtype {code!r:.100}, which nnkit "
                              f"does not read (it reads {', '.join([*_DTYPES, *_READ_ONLY])})")
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
        raise FileFormatError(f"'{path}': tensor '{name}' of shape {tuple(shape)} and dtype "
                              f"{code} needs {size} bytes but its offsets {offsets} span "
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
            raise FileFormatError(f"'{path}': __metadata__ value of '{key}' is a "
                                  f"{type(value).__name__}, not a string (safetensors metadata "
                                  "is {str: str}); the file is corrupted")
    return metadata


def read_file(path) -> tuple[dict, dict]:
    """Read a safetensors file: ``(tensors {name: ndarray}, metadata {str: str})``.

    Raises FileNotFoundError for a missing file and FileFormatError (a ValueError) naming the
    problem for a truncated, corrupted or foreign file. Arrays are fresh, writable copies;
    bfloat16 tensors come back as float32 (exactly).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such file: '{path}'")
    file_size = path.stat().st_size
    with open(path, "rb") as f:
        header = _parse_header(path, f, file_size)
        metadata = _check_metadata(path, header.pop("__metadata__", None))
        entries = sorted(((_check_entry(path, n, e), n) for n, e in header.items()),
                         key=lambda item: item[0][2][0])
        data_start = f.tell()
        expected = 0
        for (_, _, offsets, _), name in entries:
            if offsets[0] != expected:
                raise FileFormatError(f"'{path}': tensor '{name}' starts at byte {offsets[0]} "
                                      f"of the data, expected {expected} (gaps or overlaps); "
                                      "the file is corrupted")
            expected = offsets[1]
        if data_start + expected != file_size:
            what = "is truncated" if data_start + expected > file_size else \
                "has trailing bytes"
            raise FileFormatError(f"'{path}' {what}: the header describes {expected} bytes "
                                  f"of tensor data, the file holds {file_size - data_start}")
        tensors = {}
        for (dtype, shape, _, code), name in entries:
            try:
                out = np.empty(shape, dtype=dtype.newbyteorder("<"))
            except (ValueError, OverflowError) as exc:  # (MemoryError: the machine, not the file)
                raise FileFormatError(f"'{path}': tensor '{name}' of shape {shape} cannot be "
                                      f"made ({exc}); the file is corrupted") from None
            if out.size and f.readinto(out.reshape(-1).view(np.uint8).data) != out.nbytes:
                raise FileFormatError(f"'{path}': could not read tensor '{name}' (truncated)")
            out = out.astype(dtype, copy=False)
            tensors[name] = _bfloat16_to_float32(out) if code == _BF16 else out
    return {n: tensors[n] for n in header}, metadata
