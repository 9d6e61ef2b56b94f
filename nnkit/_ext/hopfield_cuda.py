"""Synchronous Hopfield step on the GPU (Numba CUDA): the twin of ``hopfield_cpu.sync_run``.

``sync_step(couplings, states, out)``: out[b, i] = sgn(sum_j C[i, j] x[b, j]), sgn(0) = +1,
one thread per (state, neuron) on a 2-D grid; ``couplings`` (n, n) float32/float64 integers
(C = n W), ``states`` and ``out`` (B, n) int8. Sums of integers below 2^24 (float32) or 2^53
(float64) are exact in any order, so the GPU step equals the CPU one exactly.
``sync_run`` repeats the step on the device until no state changes or ``max_sweeps``.
Both take ``thresholds`` (n,) float64 or None, as the CPU kernels: neuron i takes +1 iff
(C x)_i >= t_i (t = -n b for biases b); None runs the kernel without biases (compared with 0).
Launchers take device arrays (or NumPy arrays under ``NUMBA_ENABLE_CUDASIM=1``) and validate
nothing.
"""

from __future__ import annotations

from numba import cuda

from ._launch import launch

__all__ = ["sync_step", "sync_run", "block"]

block = (8, 32)  # threads per block (states, neurons); the simulator tests use (2, 4)


@cuda.jit(device=True)
def _field(couplings, states, b, i, n):
    """(C x_b)_i, summed in the couplings' dtype (exact: integers)."""
    acc = couplings[i, 0] * 0
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
    """One synchronous step of every state (B, n) into ``out`` (B, n)."""
    B, n = states.shape
    if B == 0 or n == 0:
        return
    if thresholds is None:
        launch(_sync_step_kernel, _grid(B, n), block, couplings, states, out)
    else:
        launch(_sync_step_thresholds_kernel, _grid(B, n), block, couplings, states, out,
               thresholds)


def sync_run(couplings, states, work, active, sweeps, converged, n_active, max_sweeps,
             thresholds=None):
    """Synchronous steps on the device, per state as ``hopfield_cpu.sync_run``: a state stops
    after a step that changes nothing (``converged`` 1, ``sweeps`` that step's count) and
    otherwise runs ``max_sweeps`` steps (``sweeps`` must hold ``max_sweeps`` and
    ``converged`` 0 on entry, ``active`` 1). ``work`` (B, n) int8 scratch, ``n_active`` (1,)
    int64 scratch. The step kernel runs on every state; inactive states are fixed points,
    so stepping them changes nothing."""
    B, n = states.shape
    if B == 0 or n == 0:
        return
    threads = block[0] * block[1]
    for step in range(max_sweeps):
        sync_step(couplings, states, work, thresholds)
        n_active[0:1] = 0
        launch(_finish_step_kernel, (B + threads - 1) // threads, threads,
               states, work, active, sweeps, converged, step, n_active)
        if int(n_active[0]) == 0:
            return
