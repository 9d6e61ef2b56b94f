"""The selective scan (Mamba's S6 recurrence) on the GPU: Numba CUDA kernels, fused like the
CPU's (``nnkit._ext.selective_scan_cpu``, whose module docstring gives the formulas and the
array layouts the launchers receive), so the (batch, dim, L, N) tensors exp(dt A) and dt B u
are never materialised.

One thread per (b, d) row, neighbouring threads neighbouring channels d, walks L:

- forward (``_forward``): the state (N,) of the row, the checkpoints (the state before every
  ``CHUNK`` steps) and the last state as the CPU's; the step size softplus(delta + bias)
  (torch's threshold 20) on the device in the arrays' precision.
- backward (``_backward``): chunks from the last, each recomputed from its checkpoint into a
  scratch array and walked backwards (the adjoint g (N,) carried across chunks). Per-row
  outputs (du, ddelta, dz) are written; the sums across rows go to the zeroed outputs with
  ``cuda.atomic.add``: dB and dC of a varying B and C at every (t, n) (summed over a group's
  channels), dA, dD, the bias's gradient and a time-invariant B's and C's once per row
  (summed over the batch) from the row's running sums.

Per-thread arrays (the state, the adjoint, the running sums, the chunk's states) live in
global scratch arrays laid out (..., N, rows), row last: a thread's n-th value and its
neighbour's are adjacent, so every access of a warp is coalesced, as the hardware's local
memory interleaves it, but without a maximum N, and the kernels keep no stack (the compile
audit's rule). The scratch is L1/L2-resident at Mamba's sizes (N = 16). The chunk's states
(``CHUNK``, N, rows) are recomputed into scratch rather than stepped backwards
(x_{t-1} = (x_t - dt B u) / exp(dt A) loses precision where the decay is small); the decays
are recomputed in the backward walk (one exp) rather than stored.

float32 arrays compute in float32 (constants typed as the arrays' dtype, ``u.dtype.type``;
``math.exp``/``math.log1p`` on float32 values), float64 in float64. Arrays are the CPU
launchers' (CuPy arrays, or NumPy arrays under ``NUMBA_ENABLE_CUDASIM=1``), C-contiguous and
validated by ``nnkit.kernels.selective_scan``; outputs preallocated.
"""

from __future__ import annotations

import math

from numba import cuda

from ._launch import device_empty, launch
from .launchers import launchers

__all__ = [*launchers("selective_scan_cpu", "selective_scan_cuda"), "CHUNK", "threads"]

CHUNK = 64  # steps between two saved states (the CPU's CHUNK: the checkpoints are shared)
threads = 128  # threads per block


@cuda.jit(device=True)
def _sigmoid(a, zero, one):
    """1 / (1 + exp(-a)) in a's type without overflow (exp of a non-positive argument)."""
    if a >= zero:
        return one / (one + math.exp(-a))
    e = math.exp(a)
    return e / (one + e)


@cuda.jit(device=True)
def _step_size(delta, bias, b, d, t, softplus_on, twenty):
    """softplus(delta[b, d, t] + bias[d]) (torch's: v when v > 20), or the sum alone."""
    v = delta[b, d, t] + bias[d]
    if softplus_on and not v > twenty:
        return math.log1p(math.exp(v))
    return v


@cuda.jit
def _forward(u, delta, A, Bm, Cm, D, z, bias, softplus_on, has_z, B_var, C_var, y, last,
             checkpoints, state):
    """y, last and checkpoints for the row (b, d) of the thread; ``state`` (N, rows)
    scratch."""
    row = cuda.grid(1)
    batch, dim, L = u.shape
    if row >= batch * dim:
        return
    b, d = row // dim, row % dim
    N = A.shape[1]
    zero, one, twenty = u.dtype.type(0), u.dtype.type(1), u.dtype.type(20)
    rB, jB, vB = (b, d // (dim // Bm.shape[1]), 1) if B_var else (0, d, 0)
    rC, jC, vC = (b, d // (dim // Cm.shape[1]), 1) if C_var else (0, d, 0)
    for n in range(N):
        state[n, row] = zero
    for t in range(L):
        if t % CHUNK == 0:
            for n in range(N):
                checkpoints[b, d, t // CHUNK, n] = state[n, row]
        dt = _step_size(delta, bias, b, d, t, softplus_on, twenty)
        ut = u[b, d, t]
        dtu = dt * ut
        Bt, Ct = Bm[rB, jB, t * vB], Cm[rC, jC, t * vC]
        acc = zero
        for n in range(N):
            xn = math.exp(dt * A[d, n]) * state[n, row] + dtu * Bt[n]
            state[n, row] = xn
            acc += Ct[n] * xn
        out = acc + D[d] * ut
        if has_z:
            zt = z[b, d, t]
            out *= zt * _sigmoid(zt, zero, one)
        y[b, d, t] = out
    for n in range(N):
        last[b, d, n] = state[n, row]


@cuda.jit(device=True)
def _chunk_states(u, delta, A, Bm, bias, softplus_on, b, d, row, c, t0, t1, rB, jB, vB,
                  checkpoints, xs, twenty):
    """xs[i, n, row] = the state after step t0 + i of the chunk c = [t0, t1), from its
    checkpoint."""
    N = A.shape[1]
    for t in range(t0, t1):
        i = t - t0
        dt = _step_size(delta, bias, b, d, t, softplus_on, twenty)
        dtu = dt * u[b, d, t]
        Bt = Bm[rB, jB, t * vB]
        for n in range(N):
            xp = checkpoints[b, d, c, n] if i == 0 else xs[i - 1, n, row]
            xs[i, n, row] = math.exp(dt * A[d, n]) * xp + dtu * Bt[n]


@cuda.jit
def _backward(dy, dlast, u, delta, A, Bm, Cm, D, z, bias, softplus_on, has_z, B_var, C_var,
              checkpoints, du, ddelta, dz, dA, dBm, dCm, dD, dbias, xs, work):
    """Every gradient for the row (b, d) of the thread: du, ddelta, dz written; dA, dBm,
    dCm, dD, dbias (zeroed) added to. Scratch: ``xs`` (min(L, CHUNK), N, rows) the chunk's
    states, ``work`` (4, N, rows) the adjoint g and the running sums of dA and of a
    time-invariant B's and C's gradient."""
    row = cuda.grid(1)
    batch, dim, L = u.shape
    if row >= batch * dim:
        return
    b, d = row // dim, row % dim
    N = A.shape[1]
    zero, one, twenty = u.dtype.type(0), u.dtype.type(1), u.dtype.type(20)
    rB, jB, vB = (b, d // (dim // Bm.shape[1]), 1) if B_var else (0, d, 0)
    rC, jC, vC = (b, d // (dim // Cm.shape[1]), 1) if C_var else (0, d, 0)
    for n in range(N):
        work[0, n, row] = dlast[b, d, n]
        work[1, n, row] = zero
        work[2, n, row] = zero
        work[3, n, row] = zero
    sum_dD = zero
    sum_dbias = zero
    chunks = (L + CHUNK - 1) // CHUNK
    for k in range(chunks):
        c = chunks - 1 - k
        t0 = c * CHUNK
        t1 = min(L, t0 + CHUNK)
        _chunk_states(u, delta, A, Bm, bias, softplus_on, b, d, row, c, t0, t1, rB, jB, vB,
                      checkpoints, xs, twenty)
        for j in range(t1 - t0):
            t = t1 - 1 - j
            i = t - t0
            dt = _step_size(delta, bias, b, d, t, softplus_on, twenty)
            ut = u[b, d, t]
            gy = dy[b, d, t]
            Bt, Ct = Bm[rB, jB, t * vB], Cm[rC, jC, t * vC]
            if has_z:  # y = pre * silu(z): dz, and gy becomes the gradient of pre
                zt = z[b, d, t]
                s = _sigmoid(zt, zero, one)
                pre = zero
                for n in range(N):
                    pre += Ct[n] * xs[i, n, row]
                pre += D[d] * ut
                dz[b, d, t] = gy * pre * s * (one + zt * (one - s))
                gy = gy * zt * s
            sum_dD += gy * ut
            du_t = gy * D[d]
            gdt = zero
            for n in range(N):
                xn = xs[i, n, row]
                xp = checkpoints[b, d, c, n] if i == 0 else xs[i - 1, n, row]
                a = A[d, n]
                e = math.exp(dt * a)
                Bn = Bt[n]
                gn = work[0, n, row] + gy * Ct[n]
                gxe = gn * xp * e
                work[1, n, row] += gxe * dt
                if B_var:
                    cuda.atomic.add(dBm, (b, jB, t, n), gn * dt * ut)
                else:
                    work[2, n, row] += gn * dt * ut
                if C_var:
                    cuda.atomic.add(dCm, (b, jC, t, n), gy * xn)
                else:
                    work[3, n, row] += gy * xn
                du_t += gn * dt * Bn
                gdt += gxe * a + gn * Bn * ut
                work[0, n, row] = gn * e
            if softplus_on:
                v = delta[b, d, t] + bias[d]
                if not v > twenty:
                    gdt = gdt * _sigmoid(v, zero, one)
            du[b, d, t] = du_t
            ddelta[b, d, t] = gdt
            sum_dbias += gdt
    for n in range(N):
        cuda.atomic.add(dA, (d, n), work[1, n, row])
        if not B_var:
            cuda.atomic.add(dBm, (0, d, 0, n), work[2, n, row])
        if not C_var:
            cuda.atomic.add(dCm, (0, d, 0, n), work[3, n, row])
    cuda.atomic.add(dD, d, sum_dD)
    cuda.atomic.add(dbias, d, sum_dbias)


def _grid(rows):
    return (rows + threads - 1) // threads, threads


# ---- launchers (the names and signatures of selective_scan_cpu's) ---------------------------

def selective_scan_forward(u, delta, A, Bm, Cm, D, z, bias, softplus_on, has_z, B_var, C_var,
                           y, last, checkpoints):
    """y, last and checkpoints of the selective scan (layouts in selective_scan_cpu's module
    docstring)."""
    batch, dim, _ = u.shape
    rows = batch * dim
    if rows == 0:
        return
    state = device_empty(u, (A.shape[1], rows), u.dtype)
    launch(_forward, *_grid(rows), u, delta, A, Bm, Cm, D, z, bias, bool(softplus_on),
           bool(has_z), bool(B_var), bool(C_var), y, last, checkpoints, state)


def selective_scan_backward(dy, dlast, u, delta, A, Bm, Cm, D, z, bias, softplus_on, has_z,
                            B_var, C_var, checkpoints, du, ddelta, dz, dA, dBm, dCm, dD,
                            dbias):
    """Every gradient of the selective scan, written into du, ddelta, dz (batch, dim, L),
    dA (dim, N), dBm and dCm (B's and C's kernel layouts), dD and dbias (dim,)."""
    for out in (dA, dBm, dCm, dD, dbias):  # the kernel adds into them
        out.fill(0)
    batch, dim, L = u.shape
    rows = batch * dim
    if rows == 0:
        return
    N = A.shape[1]
    xs = device_empty(u, (min(L, CHUNK), N, rows), u.dtype)
    work = device_empty(u, (4, N, rows), u.dtype)
    launch(_backward, *_grid(rows), dy, dlast, u, delta, A, Bm, Cm, D, z, bias,
           bool(softplus_on), bool(has_z), bool(B_var), bool(C_var), checkpoints, du, ddelta,
           dz, dA, dBm, dCm, dD, dbias, xs, work)
