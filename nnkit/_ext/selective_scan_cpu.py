"""CPU kernels of the selective scan (Mamba's S6 recurrence), fused: the (batch, dim, L, N)
tensors exp(delta A) and delta B u of the reference are never materialised.

    dt_t = softplus(delta_t + bias) (or delta_t + bias)
    x_t = exp(dt_t A) * x_{t-1} + dt_t B_t u_t
    y_t = (<C_t, x_t> + D u_t) * silu(z_t)   (the gate only when z is given)

Arrays are C-contiguous and validated by ``nnkit.kernels.selective_scan``: u, delta, y
(batch, dim, L); A (dim, N); D and bias (dim,) (zeros when absent); z (batch, dim, L) or an
empty (0, 0, 0) array when absent (``has_z``). B and C arrive as (rows, G, L', N), state
index last so that a step reads N contiguous numbers: a varying B (batch, G, N, L) as its
transpose (batch, G, L, N), a time-invariant B (dim, N) as (1, dim, 1, N); ``var`` says
which, and a step reads ``M[b * var, d // (dim // G), t * var]``.

One task is one (b, d) row in the forward: the state (N,) stays in L1 while the row walks
L, its step sizes computed first for the whole row (``softplus`` vectorises; libm's log1p
and exp would cost more than the recurrence), the loop over n vectorised (``exp_approx``).
The forward also writes the state at the start of every ``CHUNK`` steps (``checkpoints``,
(batch, dim, ceil(L / CHUNK), N)), so the backward recomputes one chunk of states from its
checkpoint instead of the whole row, and walks it backwards.

In the backward one task is a block of channels of one batch row (``block``): dB and dC
of a varying B and C are sums over the channels of a group, so each task adds into its own
(L, N) partials, summed over the blocks by the caller; per-channel sums (dA, dD, the bias's
gradient, a time-invariant B's and C's) go to per-(b, d) rows, summed over b by the caller.
``fastmath={'contract', 'reassoc'}`` lets the sums over n vectorise (reassociated; NaN and
inf still propagate).
"""

from __future__ import annotations

import numba
import numpy as np
from numba import prange

from .launchers import launchers
from .simd_math import act_sigmoid, exp_approx, softplus

__all__ = [*launchers("selective_scan_cpu", "selective_scan_cuda"), "CHUNK", "block",
           "forward_rows", "backward_rows"]

CHUNK = 64  # steps between two saved states: a chunk's states and decays stay in L1
_FASTMATH = {"contract", "reassoc"}


def _step_sizes(delta, bias, softplus_on, b, d, dts):
    """dts[t] = softplus(delta[b, d, t] + bias[d]) (or the sum alone) for the row (b, d)."""
    L = dts.shape[0]
    if softplus_on:
        for t in range(L):
            dts[t] = softplus(delta[b, d, t] + bias[d])
    else:
        for t in range(L):
            dts[t] = delta[b, d, t] + bias[d]


step_sizes = numba.njit(cache=True, inline="always", fastmath=_FASTMATH)(_step_sizes)


def _forward_rows(u, delta, A, Bm, Cm, D, z, bias, softplus_on, has_z, B_var, C_var, y,
                  last, checkpoints):
    """y (batch, dim, L), ``last`` (batch, dim, N) the final states and ``checkpoints``
    (batch, dim, ceil(L / CHUNK), N) the states before every chunk, for every row in
    parallel."""
    batch, dim, L = u.shape
    N = A.shape[1]
    gB, gC = dim // Bm.shape[1], dim // Cm.shape[1]
    vB, vC = (1 if B_var else 0), (1 if C_var else 0)
    for row in prange(batch * dim):
        b, d = row // dim, row % dim
        dts = np.empty(L, u.dtype)
        step_sizes(delta, bias, softplus_on, b, d, dts)
        x = np.zeros(N, u.dtype)
        for t in range(L):
            if t % CHUNK == 0:
                checkpoints[b, d, t // CHUNK] = x
            dt = dts[t]
            du = dt * u[b, d, t]
            Bt = Bm[b * vB, d // gB, t * vB]
            Ct = Cm[b * vC, d // gC, t * vC]
            acc = u.dtype.type(0)
            for n in range(N):
                xn = exp_approx(dt * A[d, n]) * x[n] + du * Bt[n]
                x[n] = xn
                acc += Ct[n] * xn
            out = acc + D[d] * u[b, d, t]
            if has_z:
                zt = z[b, d, t]
                out *= zt * act_sigmoid(zt)
            y[b, d, t] = out
        last[b, d] = x


forward_rows = numba.njit(cache=True, parallel=True, fastmath=_FASTMATH)(_forward_rows)


def _chunk_states(u, A, Bm, b, d, t0, t1, gB, vB, dts, x0, xs, decays):
    """xs[i] = the state after step t0 + i and decays[i] = exp(dts[t0 + i] A[d]) for the
    chunk [t0, t1), from x0, the state before t0."""
    N = A.shape[1]
    for t in range(t0, t1):
        i = t - t0
        dt = dts[t]
        du = dt * u[b, d, t]
        Bt = Bm[b * vB, d // gB, t * vB]
        for n in range(N):
            e = exp_approx(dt * A[d, n])
            decays[i, n] = e
            x0n = x0[n] if i == 0 else xs[i - 1, n]
            xs[i, n] = e * x0n + du * Bt[n]


chunk_states = numba.njit(cache=True, inline="always", fastmath=_FASTMATH)(_chunk_states)


def _backward_rows(dy, dlast, u, delta, A, Bm, Cm, D, z, bias, softplus_on, has_z, B_var, C_var,
                   checkpoints, block, du, ddelta, dz, dA_rows, dB_parts, dC_parts, dD_rows,
                   dbias_rows):
    """Gradients of the selective scan for blocks of ``block`` channels of each batch row,
    from dy (batch, dim, L) and dlast (batch, dim, N), the gradient of the last state.

    du, ddelta and (with ``has_z``) dz (batch, dim, L) are written; dA_rows (batch, dim, N),
    dD_rows and dbias_rows (batch, dim) hold each row's sums. dB_parts and dC_parts, zeroed
    by the caller: for a varying B (C), (batch * dim / block, L, N), the sum over a block's
    channels; for a time-invariant one, (batch, dim, N), each row's sum."""
    batch, dim, L = u.shape
    N = A.shape[1]
    zero, one = u.dtype.type(0), u.dtype.type(1)
    gB, gC = dim // Bm.shape[1], dim // Cm.shape[1]
    vB, vC = (1 if B_var else 0), (1 if C_var else 0)
    blocks = dim // block
    for task in prange(batch * blocks):
        b, k = task // blocks, task % blocks
        dts = np.empty(L, u.dtype)
        xs = np.empty((CHUNK, N), u.dtype)
        decays = np.empty((CHUNK, N), u.dtype)
        g = np.empty(N, u.dtype)
        dA = np.empty(N, u.dtype)
        for d in range(k * block, (k + 1) * block):
            step_sizes(delta, bias, softplus_on, b, d, dts)
            g[:] = dlast[b, d]
            dA[:] = zero
            dD = zero
            dbias = zero
            dBi = dB_parts[b, d] if not B_var else dB_parts[task, 0]  # a row of sums, if any
            dCi = dC_parts[b, d] if not C_var else dC_parts[task, 0]
            for c in range((L + CHUNK - 1) // CHUNK - 1, -1, -1):
                t0 = c * CHUNK
                t1 = min(L, t0 + CHUNK)
                x0 = checkpoints[b, d, c]
                chunk_states(u, A, Bm, b, d, t0, t1, gB, vB, dts, x0, xs, decays)
                for t in range(t1 - 1, t0 - 1, -1):
                    i = t - t0
                    dt = dts[t]
                    ut = u[b, d, t]
                    Bt = Bm[b * vB, d // gB, t * vB]
                    Ct = Cm[b * vC, d // gC, t * vC]
                    gy = dy[b, d, t]
                    if has_z:
                        zt = z[b, d, t]
                        s = act_sigmoid(zt)
                        pre = zero
                        for n in range(N):
                            pre += Ct[n] * xs[i, n]
                        pre += D[d] * ut
                        dz[b, d, t] = gy * pre * s * (one + zt * (one - s))
                        gy = gy * zt * s
                    dD += gy * ut
                    du_t = gy * D[d]
                    gdt = zero
                    dBrow = dBi if not B_var else dB_parts[task, t]
                    dCrow = dCi if not C_var else dC_parts[task, t]
                    for n in range(N):
                        xn = xs[i, n]
                        xp = x0[n] if i == 0 else xs[i - 1, n]
                        e = decays[i, n]
                        dCrow[n] += gy * xn
                        gn = g[n] + gy * Ct[n]
                        gxe = gn * xp * e
                        dA[n] += gxe * dt
                        dBrow[n] += gn * dt * ut
                        du_t += gn * dt * Bt[n]
                        gdt += gxe * A[d, n] + gn * Bt[n] * ut
                        g[n] = gn * e
                    if softplus_on:
                        v = delta[b, d, t] + bias[d]
                        gdt = gdt * act_sigmoid(v) if v <= u.dtype.type(20) else gdt
                    du[b, d, t] = du_t
                    ddelta[b, d, t] = gdt
                    dbias += gdt
            dA_rows[b, d] = dA
            dD_rows[b, d] = dD
            dbias_rows[b, d] = dbias


backward_rows = numba.njit(cache=True, parallel=True, fastmath=_FASTMATH)(_backward_rows)


def block(dim: int, batch: int, groups: tuple[int, ...]) -> int:
    """Channels per backward task: a divisor of every varying group's size (so a block lies
    in one group of B and one of C), halved while there are fewer than 4 tasks a thread."""
    size = dim
    for g in groups:
        size = int(np.gcd(size, dim // g))
    while size % 2 == 0 and batch * (dim // size) < 4 * numba.get_num_threads():
        size //= 2
    return size


# ---- launchers (the names and signatures of selective_scan_cuda's) --------------------------

def selective_scan_forward(u, delta, A, Bm, Cm, D, z, bias, softplus_on, has_z, B_var, C_var,
                           y, last, checkpoints):
    """y, last and checkpoints of the selective scan (layouts in the module docstring)."""
    forward_rows(u, delta, A, Bm, Cm, D, z, bias, softplus_on, has_z, B_var, C_var, y, last,
                 checkpoints)


def selective_scan_backward(dy, dlast, u, delta, A, Bm, Cm, D, z, bias, softplus_on, has_z,
                            B_var, C_var, checkpoints, du, ddelta, dz, dA, dBm, dCm, dD,
                            dbias):
    """Every gradient of the selective scan, written into du, ddelta, dz (batch, dim, L),
    dA (dim, N), dBm and dCm (B's and C's kernel layouts), dD and dbias (dim,)."""
    batch, dim, L = u.shape
    N = A.shape[1]
    size = block(dim, batch, tuple(M.shape[1] for M, var in ((Bm, B_var), (Cm, C_var))
                                   if var))
    tasks = batch * (dim // size)

    def parts(var):
        return np.zeros((tasks, L, N) if var else (batch, dim, N), u.dtype)

    dB_parts, dC_parts = parts(B_var), parts(C_var)
    dA_rows = np.empty((batch, dim, N), u.dtype)
    dD_rows, dbias_rows = np.empty((batch, dim), u.dtype), np.empty((batch, dim), u.dtype)
    backward_rows(dy, dlast, u, delta, A, Bm, Cm, D, z, bias, softplus_on, has_z, B_var, C_var,
                  checkpoints, size, du, ddelta, dz, dA_rows, dB_parts, dC_parts, dD_rows,
                  dbias_rows)
    dA[...] = dA_rows.sum(0)
    dD[...] = dD_rows.sum(0)
    dbias[...] = dbias_rows.sum(0)
    for dM, M, var, part in ((dBm, Bm, B_var, dB_parts), (dCm, Cm, C_var, dC_parts)):
        if var:  # (batch * blocks, L, N): the blocks of a group summed
            G = M.shape[1]
            dM[...] = part.reshape(batch, G, dim // (size * G), L, N).sum(2)
        else:  # (batch, dim, N) -> (1, dim, 1, N)
            dM[...] = part.sum(0).reshape(1, dim, 1, N)
