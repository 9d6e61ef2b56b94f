"""The linear-attention recurrence (causal linear attention, gated linear attention, the delta
rule and the gated delta rule) on the GPU: Numba CUDA kernels, the twins of
``nnkit._ext.linear_attention_cpu``'s launchers (same names, signatures and array layouts).

Per (batch, head) row ``bh``, state S (dk, dv), for t = 0..T-1::

    S = exp(g_t) * S                     (G == 1 a scalar, G == dk per key, G == 0 none)
    S = S + beta_t outer(k_t, r),        r = v_t - S^T k_t (delta) or v_t
    o_t = scale S^T q_t

The columns of S are independent (column j evolves from column j alone), so one thread
walks one (bh, j) pair, ``row = bh * dv + j`` (neighbouring threads neighbouring columns of
one head: the loads of v, o, dv are coalesced, those of q, k, beta, g broadcast):

- forward (``_forward``): the column S[:, j] (dk,), the checkpoints (the state at the start
  of every ``CHUNK`` steps, ``checkpoints[:, 0] == S0``), o[bh, :, j] and the final state.
- backward (``_backward``): chunks from the last, each recomputed from its checkpoint into a
  scratch array of the chunk's states and walked backwards with the column G[:, j] of the
  adjoint dL/dS (from dfinal). dv[bh, t, j] and dS0[bh, :, j] are the thread's own; dq, dk,
  dbeta and dg sum over the dv columns and go to the zeroed outputs with
  ``cuda.atomic.add``. The state before a step is the previous one decayed again (one exp
  per key, or one per step for a scalar decay) rather than stored.

Per-thread arrays (the column, the adjoint, the chunk's states) live in global scratch
arrays laid out (..., dk, rows), row last: a thread's i-th value and its neighbour's are
adjacent, so every access of a warp is coalesced (as the hardware's local memory interleaves
it, but without a maximum dk), and the kernels keep no stack (the compile audit's rule).

Register budget: a thread keeps the row's indices, the step's scalars (beta, r, the
decay) and some fifteen arrays' pointers and shapes live; no per-key values are held in
registers, so the count does not grow with dk (measured on sm_80/89/90: the forward 40-62,
the backward 72-104, no stack, no spills).

float32 arrays compute in float32 (constants typed as the arrays' dtype, ``q.dtype.type``;
``scale`` converted on the host to that dtype; ``math.exp`` on float32 values), float64 in
float64. Arrays are the CPU launchers' (CuPy arrays, or NumPy arrays under
``NUMBA_ENABLE_CUDASIM=1``), C-contiguous, one float dtype, validated by
``nnkit.kernels.linear_attention``; outputs preallocated.
"""

from __future__ import annotations

import math

from numba import cuda

from ._launch import device_empty, launch
from .launchers import launchers

__all__ = [*launchers("linear_attention_cpu", "linear_attention_cuda"), "CHUNK"]

CHUNK = 64  # steps between two saved states (the CPU's CHUNK: the checkpoints are shared)
threads = 128  # threads per block


@cuda.jit(device=True)
def _decay(g, bh, t, i, G, scalar_e, one):
    """The decay factor of key i at step t: exp(g[bh, t, i]) per key (G > 1), the step's
    ``scalar_e`` (G == 1), or one (G == 0)."""
    if G > 1:
        return math.exp(g[bh, t, i])
    if G == 1:
        return scalar_e
    return one


@cuda.jit(device=True)
def _scalar_decay(g, bh, t, G, one):
    """exp(g[bh, t, 0]) for a scalar decay (G == 1), else one."""
    if G == 1:
        return math.exp(g[bh, t, 0])
    return one


@cuda.jit
def _forward(q, k, v, beta, g, scale, S0, delta, o, final, checkpoints, state):
    """o[bh, :, j], final[bh, :, j] and checkpoints[bh, :, :, j] for the thread's (bh, j);
    ``state`` (dk, rows) scratch holds the column S[:, j]."""
    row = cuda.grid(1)
    BH, T, dk = q.shape
    dv = v.shape[2]
    if row >= BH * dv:
        return
    bh, j = row // dv, row % dv
    G = g.shape[2]
    zero, one = q.dtype.type(0), q.dtype.type(1)
    sc = q.dtype.type(scale)
    for i in range(dk):
        state[i, row] = S0[bh, i, j]
    for t in range(T):
        if t % CHUNK == 0:
            c = t // CHUNK
            for i in range(dk):
                checkpoints[bh, c, i, j] = state[i, row]
        es = _scalar_decay(g, bh, t, G, one)
        kS = zero
        for i in range(dk):  # decay; S^T k for the delta rule
            s = _decay(g, bh, t, i, G, es, one) * state[i, row]
            state[i, row] = s
            kS += k[bh, t, i] * s
        r = v[bh, t, j]
        if delta:
            r -= kS
        br = beta[bh, t] * r
        acc = zero
        for i in range(dk):
            s = state[i, row] + k[bh, t, i] * br
            state[i, row] = s
            acc += q[bh, t, i] * s
        o[bh, t, j] = sc * acc
    for i in range(dk):
        final[bh, i, j] = state[i, row]


@cuda.jit(device=True)
def _chunk_states(k, v, beta, g, delta, bh, j, row, c, t0, t1, checkpoints, xs, zero, one):
    """xs[i, :, row] = the column j of the state after step t0 + i of the chunk c = [t0, t1),
    recomputed from its checkpoint."""
    dk = k.shape[2]
    G = g.shape[2]
    for t in range(t0, t1):
        n = t - t0
        es = _scalar_decay(g, bh, t, G, one)
        kS = zero
        for i in range(dk):
            prev = checkpoints[bh, c, i, j] if n == 0 else xs[n - 1, i, row]
            s = _decay(g, bh, t, i, G, es, one) * prev
            xs[n, i, row] = s
            kS += k[bh, t, i] * s
        r = v[bh, t, j]
        if delta:
            r -= kS
        br = beta[bh, t] * r
        for i in range(dk):
            xs[n, i, row] += k[bh, t, i] * br


@cuda.jit(device=True)
def _step_back(do, q, k, v, beta, g, sc, delta, bh, j, row, t, c, n, checkpoints, xs, work,
               dq, dk, dv, dbeta, dg, zero, one):
    """One step t (the n-th of chunk c) backwards for column j: the adjoint column
    ``work[:, row]`` goes from dL/dS_t (less o_t's part) to dL/dS_{t-1}; dv[bh, t, j] written,
    dq, dk, dbeta, dg added to."""
    nk = k.shape[2]
    G = g.shape[2]
    dot = do[bh, t, j]
    es = _scalar_decay(g, bh, t, G, one)
    # G += scale outer(q_t, do_t); dq_t = scale S_t do_t; S' (decayed S_{t-1}) . k for r
    Gk = zero
    kS = zero
    for i in range(nk):
        qi, ki = q[bh, t, i], k[bh, t, i]
        gi = work[i, row] + sc * qi * dot
        work[i, row] = gi
        Gk += ki * gi
        cuda.atomic.add(dq, (bh, t, i), sc * xs[n, i, row] * dot)
        prev = checkpoints[bh, c, i, j] if n == 0 else xs[n - 1, i, row]
        kS += ki * _decay(g, bh, t, i, G, es, one) * prev
    r = v[bh, t, j]
    if delta:
        r -= kS
    b = beta[bh, t]
    dr = b * Gk
    dv[bh, t, j] = dr
    cuda.atomic.add(dbeta, (bh, t), Gk * r)
    gsum = zero
    for i in range(nk):
        ki = k[bh, t, i]
        gi = work[i, row]
        e = _decay(g, bh, t, i, G, es, one)
        prev = checkpoints[bh, c, i, j] if n == 0 else xs[n - 1, i, row]
        sp = e * prev  # S' = the state after the decay, before the update
        dki = b * gi * r
        if delta:
            dki -= sp * dr
            gi -= ki * dr  # dS' = G - outer(k, dr)
        cuda.atomic.add(dk, (bh, t, i), dki)
        if G > 1:
            cuda.atomic.add(dg, (bh, t, i), gi * sp)
        else:
            gsum += gi * sp
        work[i, row] = e * gi
    if G == 1:
        cuda.atomic.add(dg, (bh, t, 0), gsum)


@cuda.jit
def _backward(do, dfinal, q, k, v, beta, g, scale, delta, checkpoints, dq, dk, dv, dbeta, dg,
              dS0, xs, work):
    """Every gradient for the thread's (bh, j): dv[bh, :, j] and dS0[bh, :, j] written; dq,
    dk, dbeta, dg (zeroed) added to. Scratch: ``xs`` (min(T, CHUNK), dk, rows) the chunk's
    states, ``work`` (dk, rows) the adjoint's column j."""
    row = cuda.grid(1)
    BH, T, nk = q.shape
    nv = v.shape[2]
    if row >= BH * nv:
        return
    bh, j = row // nv, row % nv
    zero, one = q.dtype.type(0), q.dtype.type(1)
    sc = q.dtype.type(scale)
    for i in range(nk):
        work[i, row] = dfinal[bh, i, j]
    chunks = (T + CHUNK - 1) // CHUNK
    for m in range(chunks):
        c = chunks - 1 - m
        t0 = c * CHUNK
        t1 = min(T, t0 + CHUNK)
        _chunk_states(k, v, beta, g, delta, bh, j, row, c, t0, t1, checkpoints, xs, zero, one)
        for s in range(t1 - t0):
            t = t1 - 1 - s
            _step_back(do, q, k, v, beta, g, sc, delta, bh, j, row, t, c, t - t0, checkpoints,
                       xs, work, dq, dk, dv, dbeta, dg, zero, one)
    for i in range(nk):
        dS0[bh, i, j] = work[i, row]


def _grid(rows: int) -> tuple[int, int]:
    return (rows + threads - 1) // threads, threads


# ---- launchers (the names and signatures of linear_attention_cpu's) --------------------------

def recurrent_forward(q, k, v, beta, g, scale: float, S0, delta: bool, o, final,
                      checkpoints) -> None:
    """o (BH, T, dv), final (BH, dk, dv) and checkpoints (BH, ceil(T / CHUNK), dk, dv) of the
    recurrence over q, k (BH, T, dk), v (BH, T, dv), beta (BH, T), g (BH, T, G) from S0
    (BH, dk, dv)."""
    BH, _, dk = q.shape
    rows = BH * v.shape[2]
    if rows == 0:
        return
    state = device_empty(q, (dk, rows), q.dtype)
    launch(_forward, *_grid(rows), q, k, v, beta, g, q.dtype.type(scale), S0, bool(delta), o,
           final, checkpoints, state)


def recurrent_backward(do, dfinal, q, k, v, beta, g, scale: float, delta: bool, checkpoints,
                       dq, dk, dv, dbeta, dg, dS0) -> None:
    """Every gradient of the recurrence from do (BH, T, dv) and dfinal (BH, dk, dv), written
    into dq, dk (BH, T, dk), dv (BH, T, dv), dbeta (BH, T), dg (BH, T, G), dS0 (BH, dk, dv)."""
    for out in (dq, dk, dbeta, dg):  # the kernel adds into them
        out.fill(0)
    BH, T, nk = q.shape
    rows = BH * v.shape[2]
    if rows == 0:
        return
    xs = device_empty(q, (min(T, CHUNK), nk, rows), q.dtype)
    work = device_empty(q, (nk, rows), q.dtype)
    launch(_backward, *_grid(rows), do, dfinal, q, k, v, beta, g, q.dtype.type(scale),
           bool(delta), checkpoints, dq, dk, dv, dbeta, dg, dS0, xs, work)
