"""Hopfield dynamics on the GPU (Numba CUDA): the twins of the CPU launchers of
``nnkit._ext.hopfield_cpu`` (``async_run`` and ``init_fields``, the Cython kernels of
``nnkit._ext.hopfield``; ``sync_run``, Numba), with their names and arguments
(``nnkit._ext.launchers``).

Conventions as the CPU kernels: ``couplings`` C (n, n) float32/float64 holding integers
(C = n W, symmetric, zero diagonal), states int8 in {-1, +1}, ``rows`` int64 indices of the
states to run, ``sweeps`` (B,) int64 and ``converged`` (B,) uint8 written, sgn(0) = +1.
Fields of integers below 2^24 (float32) or 2^53 (float64) are exact in any order of their
sums, so the GPU takes every decision the CPU takes and the runs agree bit for bit.

- ``async_run``: one block per state. The block walks the neurons in the CPU's order (0..n-1,
  or with ``shuffle`` the splitmix64 Fisher-Yates permutation of every sweep, drawn on the
  device from the same stream: draw k of the generator seeded with ``seed`` is
  ``splitmix64(seed, k)``, and sweep s takes draws s (n-1) .. (s+1)(n-1) - 1); every thread
  reads the visited neuron's field and decides alike, and after a flip the threads add
  2 x_i C[i, :] to the fields together.
- ``init_fields``: fields C x from the patterns (s < n / 2: 2 s n instead of n^2 per state).
- ``sync_run``: synchronous steps, the first from the caller's fields, the next ones by
  ``sync_step`` (one thread per (state, neuron), the field summed from scratch), each
  followed by a per-state check, until no state changes or ``max_sweeps``.

Thresholds: ``thresholds`` (n,) float64 t or None, neuron i takes +1 iff (C x)_i >= t_i. The
launchers compare in the couplings' dtype with ceil(t) (clipped to +-2^24 for float32): for an
integer field h, h >= t iff h >= ceil(t), and a float32 field stays within +-2^24, so the
comparison equals the CPU's exactly with no float64 on the device. Launchers take device
arrays (or NumPy arrays under ``NUMBA_ENABLE_CUDASIM=1``) and validate nothing.
"""

from __future__ import annotations

import numpy as np
from numba import cuda, int64, uint64

from .._backend import array_module
from ._launch import device_empty, launch
from .launchers import launchers
from .simd_math import splitmix64_dev

__all__ = [*launchers("hopfield_cpu", "hopfield_cuda"), "sync_step", "block", "async_threads"]

block = (8, 32)  # threads per block (states, neurons); the simulator tests use (2, 4)
# Most threads of a block of ``async_run`` (one state; tests use 4). A visit is sequential and
# a flip's update is n / threads steps, so more resident states beat wider blocks.
async_threads = 128
_FLOAT32_FIELDS = 1 << 24  # |C x| < 2^24 for float32 couplings (the caller's dtype rule)


# ---- thresholds ------------------------------------------------------------------------------

def _thresholds_as(couplings, thresholds):
    """The thresholds in the couplings' dtype, as the kernels compare: ceil(t) (clipped to
    +-2^24 for float32, beyond every field), zeros for None."""
    xp = array_module(couplings)
    n = couplings.shape[0]
    if thresholds is None:
        return xp.zeros(n, couplings.dtype)
    t = xp.ceil(thresholds)
    if couplings.dtype == np.float32:
        t = xp.clip(t, -_FLOAT32_FIELDS, _FLOAT32_FIELDS)
    return xp.ascontiguousarray(t.astype(couplings.dtype))


# ---- synchronous steps ------------------------------------------------------------------------

@cuda.jit(device=True)
def _field(couplings, states, b, i, n):
    """(C x_b)_i, summed in the couplings' dtype (exact: integers)."""
    acc = couplings[i, 0] - couplings[i, 0]
    for j in range(n):
        acc += couplings[i, j] * states[b, j]
    return acc


@cuda.jit
def _sync_step_kernel(couplings, states, out):
    b, i = cuda.grid(2)
    B, n = states.shape
    if b < B and i < n:
        out[b, i] = 1 if _field(couplings, states, b, i, n) >= 0 else -1


@cuda.jit
def _sync_step_thresholds_kernel(couplings, states, out, thresholds):
    b, i = cuda.grid(2)
    B, n = states.shape
    if b < B and i < n:
        out[b, i] = 1 if _field(couplings, states, b, i, n) >= thresholds[i] else -1


@cuda.jit
def _sign_kernel(fields, out, thresholds):
    """The first step from the caller's fields: out[b, i] = +1 iff fields[b, i] >= t_i."""
    b, i = cuda.grid(2)
    B, n = fields.shape
    if b < B and i < n:
        out[b, i] = 1 if fields[b, i] >= thresholds[i] else -1


@cuda.jit
def _finish_step_kernel(states, new, active, sweeps, converged, step, n_active):
    """Per state: if the step changed nothing, mark it converged at ``step + 1`` and inactive;
    else copy the new state over the old. One thread per state."""
    b = cuda.grid(1)
    B, n = states.shape
    if b < B and active[b]:
        same = True
        for i in range(n):
            if new[b, i] != states[b, i]:
                same = False
                states[b, i] = new[b, i]
        if same:
            active[b] = 0
            converged[b] = 1
            sweeps[b] = step + 1
        else:
            cuda.atomic.add(n_active, 0, 1)


def _grid(B, n):
    return ((B + block[0] - 1) // block[0], (n + block[1] - 1) // block[1])


def sync_step(couplings, states, out, thresholds=None):
    """One synchronous step of every state (B, n) into ``out`` (B, n) int8."""
    B, n = states.shape
    if B == 0 or n == 0:
        return
    if thresholds is None:
        launch(_sync_step_kernel, _grid(B, n), block, couplings, states, out)
    else:
        launch(_sync_step_thresholds_kernel, _grid(B, n), block, couplings, states, out,
               _thresholds_as(couplings, thresholds))


def sync_run(fields, couplings, states, work, max_sweeps, sweeps, converged, thresholds):
    """Synchronous steps x <- sgn(C x) on every state (B, n) until a step changes nothing
    (``converged`` 1, ``sweeps`` that step's count) or ``max_sweeps`` (a 2-cycle), as
    ``hopfield_cpu.sync_run``. The first step takes its signs from ``fields`` (B, n), C x of
    the initial states; every later step sums the fields from scratch (``sync_step``, exact),
    so ``fields`` is left as given, and so is ``work`` (B, n) int64, the CPU kernel's
    scratch. One host synchronisation per step (are states left running?); a state that
    stopped is a fixed point, which a step keeps."""
    B, n = states.shape
    xp = array_module(states)
    sweeps[...] = max_sweeps
    converged[...] = 0
    if B == 0 or n == 0:
        return
    new = device_empty(states, (B, n), np.int8)
    active, n_active = xp.ones(B, np.uint8), xp.zeros(1, np.int64)
    t = _thresholds_as(couplings, thresholds)
    threads = block[0] * block[1]
    for step in range(max_sweeps):
        if step == 0:
            launch(_sign_kernel, _grid(B, n), block, fields, new, t)
        else:
            launch(_sync_step_thresholds_kernel, _grid(B, n), block, couplings, states, new, t)
        n_active[...] = 0
        launch(_finish_step_kernel, (B + threads - 1) // threads, threads,
               states, new, active, sweeps, converged, step, n_active)
        if int(n_active[0]) == 0:
            return


# ---- asynchronous dynamics: one block per state ------------------------------------------------

@cuda.jit(device=True)
def _shuffle(order, r, n, seed, sweep):
    """Fisher-Yates of order[r] before sweep ``sweep``, as the CPU: i = n-1 .. 1 swaps entries
    i and ((z >> 32) (i + 1)) >> 32, z the generator's next draw (draw sweep (n-1) + n-1-i)."""
    base = uint64(sweep) * uint64(n - 1)
    for i in range(n - 1, 0, -1):
        z = splitmix64_dev(seed, base + uint64(n - 1 - i))
        j = int64(((z >> uint64(32)) * uint64(i + 1)) >> uint64(32))
        t = order[r, i]
        order[r, i] = order[r, j]
        order[r, j] = t


@cuda.jit(device=True)
def _flip(couplings, fields, r, i, new, tid, step, n):
    """Neuron i of state r took the value ``new``: h_j += 2 new C[i, j] (C symmetric), the
    block's threads over j."""
    for j in range(tid, n, step):
        c = couplings[i, j]
        if new > 0:
            fields[r, j] += c + c
        else:
            fields[r, j] -= c + c


@cuda.jit
def _async_kernel(couplings, states, fields, order, rows, max_sweeps, shuffle, seed,
                  thresholds, sweeps, converged):
    """Block k runs state rows[k]. All threads read the visited neuron's field and sign and
    take the same branch; a flip is fenced by two barriers (everyone has read the old values;
    every field is updated) so the next visit reads the new fields."""
    r = rows[cuda.blockIdx.x]
    tid = cuda.threadIdx.x
    step = cuda.blockDim.x
    n = couplings.shape[0]
    for k in range(tid, n, step):
        order[r, k] = k
    run = max_sweeps
    done = 0
    for sweep in range(max_sweeps):
        cuda.syncthreads()  # the order is written (or read to its end by every thread)
        if shuffle:
            if tid == 0:
                _shuffle(order, r, n, seed, sweep)
            cuda.syncthreads()
        flips = 0
        for k in range(n):
            i = order[r, k]
            new = 1 if fields[r, i] >= thresholds[i] else -1
            if new != states[r, i]:
                cuda.syncthreads()
                if tid == 0:
                    states[r, i] = new
                _flip(couplings, fields, r, i, new, tid, step, n)
                flips += 1
                cuda.syncthreads()
        if flips == 0:
            run = sweep + 1
            done = 1
            break
    if tid == 0:
        sweeps[r] = run
        converged[r] = done


def _async_block(n):
    """Threads per state: a multiple of 32 covering n, at most ``async_threads``."""
    return max(1, min(async_threads, (n + 31) // 32 * 32))


def async_run(couplings, states, fields, order_work, rows, max_sweeps, shuffle, seed, sweeps,
              converged, thresholds=None):
    """Asynchronous dynamics on ``states[rows]`` in place, as ``hopfield.async_run`` (Cython):
    couplings (n, n), states and fields (B, n) (the fields C x on entry, kept up to date),
    order_work (B, n) int32 scratch (each state's order), rows (R,) int64, ``shuffle`` a fresh
    splitmix64 permutation per sweep seeded with ``seed``, sweeps (B,), converged (B,) uint8,
    thresholds (n,) float64 or None."""
    n, R = couplings.shape[0], rows.shape[0]
    if R == 0:
        return
    if n == 0:
        sweeps[rows] = 1
        converged[rows] = 1
        return
    launch(_async_kernel, R, _async_block(n), couplings, states, fields, order_work, rows,
           int(max_sweeps), bool(shuffle), np.uint64(int(seed) & ((1 << 64) - 1)),
           _thresholds_as(couplings, thresholds), sweeps, converged)


# ---- fields from the patterns ---------------------------------------------------------------

@cuda.jit
def _overlaps_kernel(patterns_i8, states, rows, overlaps):
    """overlaps[k, mu] = xi_mu . x_rows[k], exact integers stored in the fields' dtype
    (|m| <= n); one thread per (k, mu)."""
    idx = cuda.grid(1)
    R, s = overlaps.shape
    if idx < R * s:
        k, mu = idx // s, idx % s
        r = rows[k]
        acc = 0
        for i in range(states.shape[1]):
            acc += patterns_i8[mu, i] * states[r, i]
        overlaps[k, mu] = acc


@cuda.jit
def _fields_from_overlaps_kernel(patterns, states, rows, overlaps, fields):
    """fields[r, j] = -s x_j + sum_mu m_mu xi_mu,j (= (C x)_j, C with zero diagonal); one
    thread per (k, j), consecutive threads on consecutive j."""
    idx = cuda.grid(1)
    R, s = overlaps.shape
    n = states.shape[1]
    if idx < R * n:
        k, j = idx // n, idx % n
        r = rows[k]
        fields[r, j] = -s * states[r, j]  # an integer, converted exactly
        acc = fields[r, j]
        for mu in range(s):
            acc += overlaps[k, mu] * patterns[mu, j]
        fields[r, j] = acc


def init_fields(patterns_i8, patterns, states, fields, rows):
    """fields[r] = C states[r] for r in ``rows``, C the Hebbian couplings (zero diagonal) of
    the patterns, given as int8 ``patterns_i8`` (s, n) and as floats ``patterns`` (s, n) of
    the fields' dtype; as ``hopfield.init_fields`` (Cython)."""
    s, n = patterns.shape
    R = rows.shape[0]
    if n == 0 or s == 0 or R == 0:
        return
    overlaps = device_empty(states, (R, s), fields.dtype)
    threads = block[0] * block[1]
    launch(_overlaps_kernel, (R * s + threads - 1) // threads, threads, patterns_i8, states,
           rows, overlaps)
    launch(_fields_from_overlaps_kernel, (R * n + threads - 1) // threads, threads, patterns,
           states, rows, overlaps, fields)
