"""Keep freed memory in the process for reuse: glibc malloc's thresholds, set at import.

A training step allocates and frees the same large temporaries every step. With glibc's
defaults each one above the (dynamic, at most 32 MiB) mmap threshold is a fresh ``mmap``
and each free that leaves more than the trim threshold at the top of the heap gives the
pages back, so the next step pays for them again in page faults. Measured here, 2 threads,
a ViT training step at batch 128 (the issue 9 benchmark): 48-66 ms with the defaults,
38-46 ms with these thresholds; BERT-mini, masked positions only: 1.38-1.50 s vs 1.32-1.39 s.

``tune()`` (run by ``import nnkit``) sets, through ``mallopt``:

- ``M_MMAP_THRESHOLD`` = ``MMAP_THRESHOLD`` (256 MiB): blocks below it come from the heap;
- ``M_TRIM_THRESHOLD`` = ``TRIM_THRESHOLD`` (512 MiB): free memory at the top of the heap
  is given back to the system beyond that, so what the process keeps is bounded.

What it costs: the resident size stays near the peak of the steps (up to 512 MiB more),
as a caching allocator's does. It changes nothing when the environment already tunes
malloc (``GLIBC_TUNABLES`` with a ``glibc.malloc`` entry, ``MALLOC_*_`` variables), when
``NNKIT_MALLOC_TUNING=0``, or off glibc (macOS, Windows, musl): ``STATUS`` says which.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys

__all__ = ["MMAP_THRESHOLD", "TRIM_THRESHOLD", "STATUS", "tune"]

MMAP_THRESHOLD = 256 << 20
TRIM_THRESHOLD = 512 << 20
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt's parameter numbers (malloc.h)
_ENV_TUNING = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_",
               "MALLOC_MMAP_MAX_")

STATUS = "not set"


def _skip_reason() -> str | None:
    if os.environ.get("NNKIT_MALLOC_TUNING", "1") == "0":
        return "off (NNKIT_MALLOC_TUNING=0)"
    if "glibc.malloc" in os.environ.get("GLIBC_TUNABLES", "") or any(
            name in os.environ for name in _ENV_TUNING):
        return "left to the environment's malloc settings"
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return "not glibc: the system allocator's defaults"
    return None


def tune() -> str:
    """Set glibc's mmap and trim thresholds (once; see the module docstring); return and
    record in ``STATUS`` what was done."""
    global STATUS
    reason = _skip_reason()
    if reason is None:
        mallopt = ctypes.CDLL(None).mallopt
        mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
        done = (mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
                and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1)
        reason = (f"mmap threshold {MMAP_THRESHOLD >> 20} MiB, trim threshold "
                  f"{TRIM_THRESHOLD >> 20} MiB" if done else "mallopt refused: defaults")
    STATUS = reason
    return STATUS
