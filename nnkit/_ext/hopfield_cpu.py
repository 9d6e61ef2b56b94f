"""Hopfield-family dynamics in Numba: synchronous Hopfield steps, asynchronous dynamics from
stored patterns (no weight matrix), and the dense associative memories. The CPU side of the
pair with ``hopfield_cuda`` (``nnkit._ext.launchers``): the Cython ``async_run`` and
``init_fields`` of ``nnkit._ext.hopfield`` are its launchers too.

Conventions as ``nnkit._ext.hopfield`` (the Cython asynchronous kernel): states int8 in
{-1, +1}, rows (R,) int64 indices of the states to run, order_work (B, n) int32 scratch,
``shuffle``/``seed``: a splitmix64-driven Fisher-Yates shuffle of the order before every
sweep (the same stream as the Cython kernel), sweeps (B,) int64, converged (B,) uint8,
sgn(0) = +1. ``thresholds`` (n,) float64: neuron i takes +1 iff its integer field n h_i is
>= t_i (t = -n b for the biases b of the local field W x + b; zeros without biases, which is
the comparison with 0). Comparing an exact integer with a double is exact, as in Cython.
Everything is exact integer arithmetic (or float integers within the exact range), so each
kernel equals its naive twin bit for bit. ``fastmath`` is off. Nothing is validated here.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numba import prange

from ._dispatch import serial_or_parallel
from .hopfield import async_run, init_fields  # noqa: F401  (Cython: launchers here too)
from .launchers import launchers
from .simd_math import SPLITMIX64_GAMMA, splitmix64

__all__ = [*launchers("hopfield_cpu", "hopfield_cuda"), "async_run_patterns", "dense_async_run",
           "shuffle_order", "INTERACTIONS"]

INTERACTIONS = {"quadratic": 0, "poly": 1, "exp": 2}


@numba.njit(cache=True)
def shuffle_order(order, state):
    """Fisher-Yates, i = n-1 .. 1: swap order[i] with order[((z >> 32) (i + 1)) >> 32] (as
    the Cython kernel: Lemire's multiply-shift, bias below n / 2^32), z the next output of
    the splitmix64 generator whose state is ``state`` (a (1,) uint64 array, advanced)."""
    for i in range(order.shape[0] - 1, 0, -1):
        z = splitmix64(state[0], 0)  # mix(state + gamma): the next output
        state[0] += SPLITMIX64_GAMMA
        j = np.int64(((z >> np.uint64(32)) * np.uint64(i + 1)) >> np.uint64(32))
        t = order[i]
        order[i] = order[j]
        order[j] = t


@numba.njit(cache=True)
def _start(order, seed):
    """order <- 0..n-1; returns the RNG state (1,) uint64 seeded with ``seed``."""
    for k in range(order.shape[0]):
        order[k] = k
    state = np.empty(1, np.uint64)
    state[0] = seed
    return state


def _sync_run(fields, couplings, states, work, max_sweeps, sweeps, converged, thresholds):
    """Synchronous steps x <- sgn(C x) on every state (B, n), parallel over the batch.

    ``fields`` (B, n) holds h = C x for the initial states (float integers, exact) and is
    kept up to date incrementally: only the neurons that changed in a step add
    2 x_i(new) C[i] to the fields (C symmetric), O(n) per change. Stops a state after a step
    that changes nothing (converged) or after ``max_sweeps`` steps; a 2-cycle runs to
    ``max_sweeps``. ``work`` (B, n) int64 is scratch (indices of the changed neurons).
    """
    B, n = states.shape
    for b in prange(B):
        x = states[b]
        h = fields[b]
        changed = work[b]
        sweeps[b] = max_sweeps
        converged[b] = 0
        for sweep in range(max_sweeps):
            k = 0
            for i in range(n):
                new = 1 if h[i] >= thresholds[i] else -1
                if new != x[i]:
                    changed[k] = i
                    k += 1
            if k == 0:
                sweeps[b] = sweep + 1
                converged[b] = 1
                break
            for c in range(k):
                i = changed[c]
                x[i] = -x[i]
                d = 2.0 * x[i]
                row = couplings[i]
                for j in range(n):
                    h[j] += d * row[j]


sync_run = serial_or_parallel(_sync_run)


def _async_patterns_rows(patterns_t, states, overlaps, order_work, rows, max_sweeps, shuffle,
                         seed, sweeps, converged, thresholds):
    """Async Hopfield dynamics from the stored patterns, parallel over ``rows``.

    ``patterns_t`` (n, s) int8 holds the patterns as columns; ``overlaps`` (B, s) int64 holds
    m = Xi x for the initial states. The field of neuron i under the Hebbian W with zero
    diagonal is n h_i = sum_mu Xi[mu, i] m_mu - s x_i: O(s) per visit, no (n, n) matrix.
    A flip of x_i adds 2 x_i(new) Xi[:, i] to m, O(s).
    """
    n, s = patterns_t.shape
    for k in prange(rows.shape[0]):
        r = rows[k]
        x = states[r]
        m = overlaps[r]
        order = order_work[r]
        rng = _start(order, seed)
        sweeps[r] = max_sweeps
        converged[r] = 0
        for sweep in range(max_sweeps):
            if shuffle:
                shuffle_order(order, rng)
            flips = 0
            for t in range(n):
                i = order[t]
                p = patterns_t[i]
                acc = 0
                for mu in range(s):
                    acc += p[mu] * m[mu]
                new = 1 if acc - s * x[i] >= thresholds[i] else -1
                if new != x[i]:
                    x[i] = new
                    flips += 1
                    for mu in range(s):
                        m[mu] += 2 * new * p[mu]
            if flips == 0:
                sweeps[r] = sweep + 1
                converged[r] = 1
                break


async_run_patterns = serial_or_parallel(_async_patterns_rows)


@numba.njit(cache=True)
def _drive(r, interaction, degree):
    """sum_mu xi_mu,i [F(r_mu + xi) - F(r_mu - xi)] / xi-factor, term for one overlap r:
    G(r) = F(r + 1) - F(r - 1) for F(z) = z^degree ('poly'); exp(r) for 'exp' (the common
    factor e - 1/e dropped; the caller subtracts the largest r first)."""
    if interaction == 1:
        up = 1
        down = 1
        for _ in range(degree):
            up *= r + 1
            down *= r - 1
        return float(up - down)
    return math.exp(r)


def _dense_rows(patterns_t, states, overlaps, order_work, rows, max_sweeps, shuffle, seed,
                interaction, degree, sweeps, converged):
    """Async dense-associative-memory dynamics (Krotov-Hopfield 'poly', Demircigil 'exp').

    Energy E(x) = -sum_mu F(xi_mu . x). Neuron i takes the value with the lower energy:
    with r_mu = m_mu - xi_mu,i x_i (the overlap without neuron i),
    x_i <- sgn(sum_mu [F(r_mu + xi_mu,i) - F(r_mu - xi_mu,i)]) = sgn(sum_mu xi_mu,i G(r_mu)),
    G(r) = F(r + 1) - F(r - 1) (ties -> +1). For 'exp', G(r) = (e - 1/e) exp(r) and the sum
    is taken as sum_mu xi_mu,i exp(r_mu - max_nu r_nu) (same sign, no overflow).
    'poly' terms are integers below 2^53 (checked by the caller), so the sums are exact.
    """
    n, s = patterns_t.shape
    for k in prange(rows.shape[0]):
        r = rows[k]
        x = states[r]
        m = overlaps[r]
        order = order_work[r]
        rng = _start(order, seed)
        sweeps[r] = max_sweeps
        converged[r] = 0
        for sweep in range(max_sweeps):
            if shuffle:
                shuffle_order(order, rng)
            flips = 0
            for t in range(n):
                i = order[t]
                p = patterns_t[i]
                shift = 0
                if interaction == 2:
                    shift = m[0] - p[0] * x[i]
                    for mu in range(1, s):
                        shift = max(shift, m[mu] - p[mu] * x[i])
                acc = 0.0
                for mu in range(s):
                    acc += p[mu] * _drive(m[mu] - p[mu] * x[i] - shift, interaction, degree)
                new = 1 if acc >= 0 else -1
                if new != x[i]:
                    x[i] = new
                    flips += 1
                    for mu in range(s):
                        m[mu] += 2 * new * p[mu]
            if flips == 0:
                sweeps[r] = sweep + 1
                converged[r] = 1
                break


dense_async_run = serial_or_parallel(_dense_rows)

