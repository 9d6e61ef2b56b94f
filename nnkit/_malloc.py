"""Keep freed memory in the process for reuse: glibc malloc's thresholds, set at import.

A training step allocates and frees the same large temporaries every step. With glibc's
defaults each one above the (dynamic, at most 32 MiB) mmap threshold is a fresh ``mmap``
and each free that leaves more than the trim threshold at the top of the heap gives the
pages back, so the next step pays for them again in page faults. Measured here, 2 threads,
worker processes alternating (benchmarks/bench_vit.py, bench_bert.py workers), medians: a
ViT training step at batch 128 54.0 ms with glibc's defaults, 42.8 ms with these thresholds
(12 blocks of 10 steps each; torch's step, in processes that import nnkit: 51.0 / 52.6 ms);
BERT-mini, masked positions only, 1422 vs 1351 ms (6 steps each).

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
