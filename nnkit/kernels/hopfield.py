"""Hopfield-family dynamics, compiled: the kernels of ``nnkit.classic.hopfield``, which
validates the spins and the couplings first; nothing is validated here.

Asynchronous dynamics from a coupling matrix run in Cython (``nnkit._ext.hopfield``: one
state per call over a range of rows, the GIL released, so ``classic`` threads the batch);
synchronous runs, asynchronous runs from the stored patterns and the dense associative
memories in Numba (``nnkit._ext.hopfield_cpu``). States are int8 in {-1, +1}, ``rows`` the
int64 indices of the states to run, ``order_work`` int32 scratch of the states' shape,
``sweeps`` (B,) int64 and ``converged`` (B,) uint8 are written; sgn(0) = +1.

GPU arrays (CuPy): ``hopfield_init_fields``, ``hopfield_async_run`` and ``hopfield_sync_run``
run on the device (``nnkit._ext.hopfield_cuda``: one block per state for the asynchronous
dynamics, in the CPU's order of the neurons for the same seed), every argument array on the
states' device; they give the CPU's results bit for bit. The runs from the patterns and the
dense associative memories are CPU-only (a GPU array is a ``TypeError``).

Biases: ``thresholds`` (n,) float64 or None. Neuron i takes +1 iff its integer field
(C x)_i >= t_i; for the biases b of the local field h = W x + b (W = C / n) the caller passes
t = -n b. None is t = 0, the network without biases, on the unchanged code path (Cython) or
with zeros (Numba), bit for bit as before.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from .._backend import array_module, kernels_for
from .._types import Array

__all__ = ["hopfield_init_fields", "hopfield_async_run", "hopfield_async_run_patterns",
           "hopfield_sync_run", "dense_memory_async_run"]


def hopfield_init_fields(patterns_i8: Array, patterns: Array, states: Array, fields: Array,
                         rows: Array) -> None:
    """fields[r] = C states[r] for r in ``rows``, C the Hebbian couplings (zero diagonal) of
    the patterns, given as int8 ``patterns_i8`` (s, n) and as floats ``patterns`` (s, n)."""
    _kernels(states).init_fields(patterns_i8, patterns, states, fields, rows)


def hopfield_async_run(couplings: Array, states: Array, fields: Array, order_work: Array,
                       rows: Array, max_sweeps: int, shuffle: bool, seed: int, sweeps: Array,
                       converged: Array, thresholds: Array | None = None) -> None:
    """Asynchronous dynamics on ``states[rows]`` in place with the couplings (n, n) and the
    fields (B, n) they give (kept up to date as neurons flip); ``shuffle``: a fresh
    splitmix64-driven order of the neurons before every sweep, seeded with ``seed``."""
    _kernels(states).async_run(
        couplings, states, fields, order_work, rows, max_sweeps, shuffle, seed, sweeps,
        converged, thresholds)


def hopfield_async_run_patterns(patterns_t: Array, states: Array, overlaps: Array,
                                order_work: Array, rows: Array, max_sweeps: int,
                                shuffle: bool, seed: int, sweeps: Array, converged: Array,
                                thresholds: Array | None = None) -> None:
    """Asynchronous dynamics from the patterns ``patterns_t`` (n, s) int8 and the states'
    overlaps (B, s) int64 with them (kept up to date), without a coupling matrix."""
    kernels_for("hopfield_cpu", None, states, name="states").async_run_patterns(
        patterns_t, states, overlaps, order_work, rows, max_sweeps, shuffle, seed, sweeps,
        converged, _zeros_for(states) if thresholds is None else thresholds)


def hopfield_sync_run(fields: Array, couplings: Array, states: Array, work: Array,
                      max_sweeps: int, sweeps: Array, converged: Array,
                      thresholds: Array | None = None) -> None:
    """Synchronous steps x <- sgn(C x) on every state until one changes nothing or
    ``max_sweeps``; ``fields`` (B, n) = C x of the initial states (kept up to date),
    ``work`` (B, n) int64 scratch."""
    _kernels(states).sync_run(
        fields, couplings, states, work, max_sweeps, sweeps, converged,
        _zeros_for(states) if thresholds is None else thresholds)


def _kernels(states):
    """The launchers of the states' device: ``hopfield_cpu`` (Cython and Numba) or
    ``hopfield_cuda``."""
    return kernels_for("hopfield_cpu", "hopfield_cuda", states, name="states")


def _zeros_for(states):
    """No biases for the Numba kernels: thresholds of zeros, (n,) float64, on the states'
    device."""
    return array_module(states).zeros(states.shape[-1], np.float64)


def dense_memory_async_run(patterns_t: Array, states: Array, overlaps: Array,
                           order_work: Array, rows: Array, max_sweeps: int, shuffle: bool,
                           seed: int, interaction: Literal["quadratic", "poly", "exp"],
                           degree: int, sweeps: Array, converged: Array) -> None:
    """Asynchronous dynamics of a dense associative memory: ``interaction`` 'quadratic',
    'poly' (of ``degree``) or 'exp' of the overlaps with the patterns ``patterns_t`` (n, s)."""
    kernels = kernels_for("hopfield_cpu", None, states, name="states")
    kernels.dense_async_run(patterns_t, states, overlaps, order_work, rows, max_sweeps,
                            shuffle, seed, kernels.INTERACTIONS[interaction], degree, sweeps,
                            converged)
