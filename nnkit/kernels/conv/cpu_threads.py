"""The CPU convolution's runs of images on threads, and its workspace pool.

Every CPU path but the batch-wide im2col splits the batch into one contiguous run of images
per numba thread (``image_chunks``): the window path on C threads
(``nnkit/_ext/part_threads.h``), the others each on a Python thread (``over_images``) with
numpy's BLAS on one thread and the Numba kernels' serial GIL-free builds. Each core runs its
images from end to end, and no OpenBLAS or OpenMP workers spin between the steps (two BLAS
threads per image GEMM instead were several times slower: benchmarks/RESULTS.md,
"Convolution algorithms by shape").

``pool`` keeps a few large flat buffers (im2col's cols, Winograd's transforms) between
calls: a fresh array of tens of megabytes costs milliseconds of page faults at first touch
(benchmarks/RESULTS.md, "Figures moved from docstrings").
"""

from __future__ import annotations

import os
import threading

import numpy as np

__all__ = ["Pool", "pool", "numba_threads", "image_chunks", "over_images", "summed"]


class Pool:
    """A few reusable flat buffers: a fresh large array costs its page faults at first touch."""

    def __init__(self, keep=4):
        self.keep = keep
        self.free = []
        self.lock = threading.Lock()

    def take(self, size, dtype):
        """A flat buffer of ``size`` elements of ``dtype`` (the smallest kept one that fits,
        or a new one)."""
        with self.lock:
            best = None
            for k, buf in enumerate(self.free):
                if buf.dtype == dtype and buf.size >= size and (
                        best is None or buf.size < self.free[best].size):
                    best = k
            if best is not None:
                return self.free.pop(best)[:size]
        return np.empty(size, dtype=dtype)

    def give(self, buf):
        """Keep ``buf`` (its base array) for a later ``take``; the smallest goes past ``keep``."""
        base = buf if buf.base is None else buf.base
        with self.lock:
            if all(b is not base for b in self.free):
                self.free.append(base)
                if len(self.free) > self.keep:
                    self.free.sort(key=lambda b: b.size)
                    self.free.pop(0)


pool = Pool()


def numba_threads() -> int:
    """numba's thread count: how many runs of images a batch splits into."""
    import numba

    return numba.get_num_threads()


def image_chunks(N):
    """[(lo, hi)]: the batch in one contiguous run of images per numba thread."""
    parts = max(1, min(N, numba_threads()))
    return [(N * p // parts, N * (p + 1) // parts) for p in range(parts)]


def summed(parts):
    """The runs' parts (weight gradients) added into the first."""
    total = parts[0]
    for part in parts[1:]:
        total += part
    return total


_threads_lock = threading.Lock()
# [ThreadPoolExecutor, the pid that created it, the CPU its workers are kept off]
_threads = []
_sched_getcpu = []  # libc's sched_getcpu, looked up on first use


def _current_cpu():
    """The CPU this thread runs on (Linux), else None."""
    if not _sched_getcpu:
        try:
            import ctypes

            _sched_getcpu.append(ctypes.CDLL(None).sched_getcpu)
        except (OSError, AttributeError, TypeError):
            _sched_getcpu.append(lambda: -1)
    cpu = _sched_getcpu[0]()
    return cpu if cpu >= 0 else None


def _keep_workers_off_this_cpu(executor, kept):
    """Keep the executor's worker threads off the CPU the caller runs on, which runs the
    first run of images itself: a virtual machine's idle CPU looks preempted to the guest's
    scheduler, which then wakes the worker on the caller's CPU, and the two runs go one after
    the other (the C threads of nnkit/_ext/part_threads.h do the same; benchmarks/RESULTS.md,
    "Convolution: the window GEMM", "Threads on these virtual machines"). Returns the CPU now
    kept off."""
    cpu = _current_cpu()
    if cpu is None or cpu == kept or not hasattr(os, "sched_setaffinity"):
        return kept
    allowed = os.sched_getaffinity(0) - {cpu}
    if not allowed:
        return kept
    for thread in list(executor._threads):
        try:
            os.sched_setaffinity(thread.native_id, allowed)
        except OSError:  # the thread has just ended
            return kept
    return cpu


def over_images(fn, chunks):
    """[fn(lo, hi) for (lo, hi) in chunks (``image_chunks``)], the first run on the calling
    thread and the others on the worker threads, numpy's BLAS on one thread meanwhile."""
    if len(chunks) == 1:
        return [fn(*chunks[0])]
    from concurrent.futures import ThreadPoolExecutor

    from ..._ext._dispatch import serial_numpy_blas

    with _threads_lock:
        # a new executor in a forked child too: the parent's worker threads do not exist there
        if (not _threads or _threads[1] != os.getpid()
                or _threads[0]._max_workers < len(chunks)):
            _threads[:] = [ThreadPoolExecutor(len(chunks), thread_name_prefix="nnkit-conv"),
                           os.getpid(), None]
        executor = _threads[0]
        _threads[2] = _keep_workers_off_this_cpu(executor, _threads[2])
    with serial_numpy_blas():
        futures = [executor.submit(fn, lo, hi) for lo, hi in chunks[1:]]  # the first run here
        try:
            first = fn(*chunks[0])
        finally:
            done = [f.result() for f in futures]
        return [first, *done]
