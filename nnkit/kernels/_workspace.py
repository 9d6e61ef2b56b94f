"""Large host buffers reused between calls instead of fresh from the operating system.

glibc's malloc serves an allocation of 32 MiB or more with a fresh ``mmap`` every time (its
dynamic threshold stops at 32 MiB) and unmaps it at ``free``, so each such array is paid for
again in page faults when first written (measured here: ~3.5 ms per 32 MiB, every call);
smaller blocks come back from the heap, but not reliably once the heap is trimmed or
fragmented by the other allocations of a training step. Measured on the recurrent kernels,
2 threads, a forward and backward loop (LSTM; forward / forward + backward, ms):

    (T, B, D, H)              fresh arrays     pooled (>= 1 MiB)    preallocated
    (128, 32, 64, 128)        7.6 / 22.8       6.0 / 18.3           5.6 (forward)
    (512, 16, 128, 256)       46.3 / 139.3     37.9 / 124.9         36.6 (forward)

``empty(shape, dtype)`` returns an array over a pooled block when the request is that large.
A block is handed out again only when nothing but the pool refers to it: every ndarray whose
memory lies in the block holds a reference to the block itself (numpy points a view's
``base`` at the array that owns the memory), so a block whose reference count is the pool's
own is unused, whoever received it and whatever views were taken. The pool keeps at most
``MAX_POOLED_BYTES`` of blocks (the oldest unused ones are dropped first). Thread-safe.
"""

from __future__ import annotations

import sys
import threading

import numpy as np

__all__ = ["MIN_POOLED_BYTES", "MAX_POOLED_BYTES", "empty", "clear"]

MIN_POOLED_BYTES = 1 << 20
MAX_POOLED_BYTES = 512 << 20

_lock = threading.Lock()
_blocks: list[np.ndarray] = []  # uint8 blocks, oldest first


def _count(blocks: list, i: int) -> int:
    return sys.getrefcount(blocks[i])


# What _count reads for an object that only a list holds (measured rather than assumed 2:
# how many references the call itself adds is the interpreter's business).
_ALONE = _count([np.empty(0, np.uint8)], 0)


def _unused(i: int) -> bool:
    """Nothing but the pool holds block i."""
    return _count(_blocks, i) == _ALONE


def empty(shape, dtype) -> np.ndarray:
    """Like ``np.empty(shape, dtype)`` (C order); arrays of ``MIN_POOLED_BYTES`` or more
    reuse an unused pooled block of at most twice the size."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if nbytes < MIN_POOLED_BYTES:
        return np.empty(shape, dtype)
    with _lock:
        for i in range(len(_blocks)):
            if nbytes <= _blocks[i].nbytes <= 2 * nbytes and _unused(i):
                block = _blocks.pop(i)
                break
        else:
            block = np.empty(nbytes, np.uint8)
        _blocks.append(block)  # most recently used last
        _trim()
        return block[:nbytes].view(dtype).reshape(shape)


def _trim() -> None:
    """Drop blocks, unused ones first and oldest first, until the pool is within its cap;
    a dropped block in use lives on with its users."""
    total = sum(b.nbytes for b in _blocks)
    for want_unused in (True, False):
        i = 0
        while total > MAX_POOLED_BYTES and i < len(_blocks):
            if _unused(i) or not want_unused:
                total -= _blocks.pop(i).nbytes
            else:
                i += 1


def clear() -> None:
    """Forget every pooled block (blocks in use live on with their users)."""
    with _lock:
        _blocks.clear()
