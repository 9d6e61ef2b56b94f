"""Keep freed memory in the process for reuse: glibc malloc's thresholds, set on request.

A training step allocates and frees the same large temporaries every step. With glibc's
defaults each one above the (dynamic, at most 32 MiB) mmap threshold is a fresh ``mmap``
and each free that leaves more than the trim threshold at the top of the heap gives the
pages back, so the next step pays for them again in page faults. Raising both thresholds
keeps those blocks in the heap, and a ViT training step at batch 128 takes less time
(benchmarks/RESULTS.md, "Allocator settings made equal").

The setting is process-wide, so ``import nnkit`` leaves it alone. ``tune()`` (public as
``nk.tune_malloc()``; ``nnkit tour`` calls it) sets, through ``mallopt``:

- ``M_MMAP_THRESHOLD`` = ``MMAP_THRESHOLD`` (256 MiB): blocks below it come from the heap;
- ``M_TRIM_THRESHOLD`` = ``TRIM_THRESHOLD`` (512 MiB): free memory at the top of the heap
  is given back to the system beyond that, so what the process keeps is bounded.

The environment variable ``NNKIT_MALLOC_TUNING``: ``1`` tunes at ``import nnkit``; ``0``
makes ``tune()`` a no-op (glibc's defaults even under ``nnkit tour``); unset, nothing
happens until ``tune()``. What it costs: the resident size stays near the peak of the
steps (up to 512 MiB more), as a caching allocator's does. ``tune()`` changes nothing when
the environment already tunes malloc (``GLIBC_TUNABLES`` with a ``glibc.malloc`` entry,
``MALLOC_*_`` variables) or off glibc (macOS, Windows, musl); ``STATUS`` says which.
Where nnkit itself needs memory reused, a workspace it owns beats changing the process's
allocator.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys

__all__ = ["MMAP_THRESHOLD", "TRIM_THRESHOLD", "STATUS", "tune", "tune_from_environment"]

MMAP_THRESHOLD = 256 << 20
TRIM_THRESHOLD = 512 << 20
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt's parameter numbers (malloc.h)
_ENV_TUNING = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_",
               "MALLOC_MMAP_MAX_")

OFF = "off, the default (nk.tune_malloc() or NNKIT_MALLOC_TUNING=1 turns it on)"
STATUS = OFF
_TUNED = False


def _skip_reason() -> str | None:
    if os.environ.get("NNKIT_MALLOC_TUNING") == "0":
        return "off (NNKIT_MALLOC_TUNING=0)"
    if "glibc.malloc" in os.environ.get("GLIBC_TUNABLES", "") or any(
            name in os.environ for name in _ENV_TUNING):
        return "left to the environment's malloc settings"
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return "not glibc: the system allocator's defaults"
    return None


def tune() -> str:
    """Set glibc's mmap and trim thresholds (see the module docstring); return what was done,
    also kept in ``STATUS``.

    Idempotent: a second call changes nothing and returns the same status. A no-op, with the
    reason as its status, under ``NNKIT_MALLOC_TUNING=0``, when the environment tunes malloc
    itself, off glibc, or where ``mallopt`` is missing or refuses.

    Examples
    --------
    >>> import nnkit as nk
    >>> nk.tune_malloc()  # doctest: +SKIP
    'mmap threshold 256 MiB, trim threshold 512 MiB'
    """
    global STATUS, _TUNED
    if _TUNED:
        return STATUS
    reason = _skip_reason()
    if reason is None:
        try:
            mallopt = ctypes.CDLL(None).mallopt
        except (AttributeError, OSError):
            mallopt = None
        if mallopt is None:
            reason = "mallopt unavailable: the system allocator's defaults"
        else:
            mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
            _TUNED = (mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
                      and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1)
            reason = (f"mmap threshold {MMAP_THRESHOLD >> 20} MiB, trim threshold "
                      f"{TRIM_THRESHOLD >> 20} MiB" if _TUNED else "mallopt refused: defaults")
    STATUS = reason
    return STATUS


def tune_from_environment() -> str:
    """``tune()`` when ``NNKIT_MALLOC_TUNING=1``, else nothing (run by ``import nnkit``);
    return ``STATUS``."""
    if os.environ.get("NNKIT_MALLOC_TUNING") == "1":
        return tune()
    return STATUS
