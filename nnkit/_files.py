"""Files read from and written to folders nnkit does not control: bounded reads, atomic writes.

Reads (``read_bytes``, ``read_json``) accept regular files only (a FIFO, a device or a folder
under a file's name is refused before it is opened, so a read never blocks on a pipe or
streams a device), refuse a file larger than the caller's limit before reading it, and
name the file in every error. Errors quote at most a short, escaped prefix of what they
read (``quote``): a file of the folder may be a symlink to a secret.

Writes (``write_atomic``) go to a temporary file in the target's folder, created
exclusively (``O_CREAT | O_EXCL | O_NOFOLLOW``, a random name: a symlink planted under any
name is never followed), flushed, fsynced, optionally checked, then renamed over the
target: a symlink at the target's name is replaced, never written through, and a crash
leaves the previous file intact. A temporary file of a writer that was killed is removed by
the next write to the same target on the same host.
"""

from __future__ import annotations

import glob
import json
import os
import reprlib
import secrets
import socket
import stat
from pathlib import Path

__all__ = ["read_bytes", "read_json", "regular_size", "write_atomic", "ensure_folder", "quote"]

_HOST = "".join(c if c.isalnum() else "_" for c in socket.gethostname())


_SHORT = reprlib.Repr()  # bounded: never builds the whole repr of a large value
for _name, _most in (("maxlevel", 2), ("maxlist", 4), ("maxdict", 4), ("maxtuple", 4),
                     ("maxset", 4), ("maxstring", 48), ("maxlong", 48), ("maxother", 48)):
    setattr(_SHORT, _name, _most)


def quote(value, limit: int = 40) -> str:
    """At most ``limit`` characters of ``value``, escaped, for an error message: a string
    as ``repr`` of its prefix, anything else (a list from a hostile file: megabytes) as a
    bounded ``reprlib`` rendering cut to ``limit``."""
    if isinstance(value, int) and value.bit_length() > 128:  # 5000 digits cannot be printed
        return f"<an integer of {value.bit_length()} bits>"
    text = value[:limit + 1] if isinstance(value, str) else _SHORT.repr(value)
    if isinstance(value, str):
        return repr(text[:limit]) + ("..." if len(text) > limit else "")
    return text[:limit] + ("..." if len(text) > limit else "")


# ----- reading -------------------------------------------------------------------------------
def regular_size(path: Path) -> int:
    """The size of the regular file ``path`` (a symlink followed); ValueError otherwise."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"no such file: '{path}'") from None
    if not stat.S_ISREG(info.st_mode):
        kind = "a folder" if stat.S_ISDIR(info.st_mode) else "not a regular file"
        raise ValueError(f"'{path}' is {kind} (a FIFO, device or socket is never read); "
                         "expected a regular file")
    return info.st_size


def read_bytes(path, limit: int) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them (ValueError past it)."""
    path = Path(path)
    size = regular_size(path)
    if size > limit:
        raise ValueError(f"'{path}' is {size} bytes long, more than the {limit} such a file "
                         "may have; it is corrupted or not what its name says")
    with open(path, "rb") as f:
        data = f.read(size + 1)  # read(n) allocates n bytes first: ask for what is there
    if len(data) > size:  # it grew between the stat and the read
        raise ValueError(f"'{path}' changed while it was read")
    return data


def _no_duplicates(pairs):
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        dup = next(k for k in keys if keys.count(k) > 1)
        raise _DuplicateKey(dup)
    return dict(pairs)


class _DuplicateKey(ValueError):
    pass


def read_json(path, limit: int, *, unique_keys: bool = False) -> dict:
    """The JSON object of the (small) file ``path``; ValueError naming it otherwise.

    ``unique_keys`` refuses an object with a key twice (as serde-based readers such as the
    tokenizers and safetensors packages do) instead of keeping the last value.
    """
    data = read_bytes(path, limit)
    try:
        fields = json.loads(data.decode("utf-8"),
                            object_pairs_hook=_no_duplicates if unique_keys else None)
    except RecursionError:
        raise ValueError(f"'{path}' nests JSON too deeply") from None
    except _DuplicateKey as exc:
        raise ValueError(f"'{path}' has the field {quote(exc.args[0])} twice in one JSON "
                         "object; the file is corrupted or hostile") from None
    except ValueError as exc:  # UnicodeDecodeError, JSONDecodeError, int digit limit
        raise ValueError(f"'{path}' is not valid JSON ({str(exc)[:200]})") from None
    if not isinstance(fields, dict):
        raise ValueError(f"'{path}' holds a JSON {type(fields).__name__}, not an object")
    return fields


# ----- writing -------------------------------------------------------------------------------
def ensure_folder(folder) -> Path:
    """``folder`` as a Path, created when missing; ValueError when it names a file."""
    folder = Path(os.fspath(folder))
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"cannot save to '{folder}': it is a file, not a folder; give the "
                         "path of a folder (it is created when missing)")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _temporary(path: Path) -> tuple[Path, int]:
    """A new file beside ``path``, created exclusively: (its path, an open descriptor)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | \
        getattr(os, "O_BINARY", 0) | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        tmp = path.with_name(f".{path.name}.{_HOST}-{os.getpid()}-{secrets.token_hex(4)}.tmp")
        try:
            return tmp, os.open(tmp, flags, 0o666)  # the umask applies, as for open(.., "w")
        except FileExistsError:
            continue
    raise FileExistsError(f"could not create a temporary file beside '{path}'")


def write_atomic(path, write, check=None) -> None:
    """Write ``path`` atomically: ``write(f)`` fills a binary file object, ``check(tmp)``
    (optional) inspects the finished temporary file and raises to keep ``path`` as it was.

    The folder of ``path`` must exist (FileNotFoundError naming it otherwise).
    """
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise FileNotFoundError(f"cannot save to '{path}': the folder '{folder}' does not exist")
    if path.is_dir():
        raise IsADirectoryError(f"cannot save to '{path}': it is a folder; give a file name")
    _remove_stale_temporaries(folder, path.name)
    tmp, fd = _temporary(path)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        if check is not None:
            check(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_folder(folder)


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
        except (PermissionError, OverflowError, ValueError):  # another user's, or no pid
            continue


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
