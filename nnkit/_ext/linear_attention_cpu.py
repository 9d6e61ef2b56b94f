"""CPU kernels of the linear-attention recurrence family (linear attention, gated linear
attention, the delta rule and the gated delta rule), one (batch, head) row a task.

Per row the state S (dk, dv) starts from S0 and for t = 0 .. T-1:

    S = exp(g_t) * S                (g_t scalar, G == 1; per key, G == dk, row-wise; G == 0: none)
    r = v_t - S^T k_t  (delta)  or  v_t
    S = S + beta_t * outer(k_t, r)
    o_t = scale * S^T q_t

Arrays are C-contiguous, one float dtype (float32 computes in float32), validated by the
caller: q, k (BH, T, dk); v, o (BH, T, dv); beta (BH, T); g (BH, T, G) with G in {0, 1, dk};
S0, final (BH, dk, dv); checkpoints (BH, ceil(T / CHUNK), dk, dv), the state at the start of
every ``CHUNK`` steps (``checkpoints[:, 0] == S0``).

The forward keeps a row's state in a local (dk, dv) buffer, every inner loop running over
dv's contiguous numbers, and writes the checkpoints. The backward walks the chunks from the
last: it recomputes a chunk's states from its checkpoint into a (CHUNK + 1, dk, dv) buffer
(with each step's decays and r), then walks the chunk backwards with G = dL/dS:

    G += scale outer(q_t, do_t);  dq_t = scale S_t do_t
    dr = beta_t G^T k_t = dv_t;  dbeta_t = (G^T k_t) . r
    dk_t = beta_t G r - S' dr (the second term with delta; S' = exp(g_t) S_{t-1})
    dS' = G - outer(k_t, dr) (the second term with delta)
    dg_t = sum(dS' * S') (per row for G == dk);  G <- exp(g_t) dS'

and dS0 is the last G. ``fastmath={'contract', 'reassoc'}`` lets the sums over dv vectorise.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import prange

from .launchers import launchers

__all__ = [*launchers("linear_attention_cpu", "linear_attention_cuda"), "CHUNK"]

CHUNK = 64  # steps between two saved states
_FASTMATH = {"contract", "reassoc"}


def _decays(g, row, t, e):
    """e[i] = exp(g_t) (G == 1), exp(g_t[i]) (G == dk) or 1 (G == 0)."""
    G = g.shape[2]
    dk = e.shape[0]
    if G == 0:
        e[:] = 1
    elif G == 1:
        e[:] = np.exp(g[row, t, 0])
    else:
        for i in range(dk):
            e[i] = np.exp(g[row, t, i])


decays = numba.njit(cache=True, inline="always", fastmath=_FASTMATH)(_decays)


def _step(S_in, S_out, e, kt, vt, bt, delta, r):
    """One step from S_in into S_out (which may be S_in): the decay by e (dk,), then
    r = vt - S'^T kt (``delta``) or vt, and the write of beta outer(kt, r)."""
    dk, dv = S_in.shape
    for j in range(dv):
        r[j] = vt[j]
    if delta:
        for i in range(dk):
            w = kt[i] * e[i]
            for j in range(dv):
                r[j] -= w * S_in[i, j]
    for i in range(dk):
        ei = e[i]
        w = bt * kt[i]
        for j in range(dv):
            S_out[i, j] = ei * S_in[i, j] + w * r[j]


step = numba.njit(cache=True, inline="always", fastmath=_FASTMATH)(_step)


def _forward_rows(q, k, v, beta, g, scale, S0, delta, o, final, checkpoints):
    """o, final and checkpoints of every row in parallel (layouts in the module docstring)."""
    BH, T, dk = q.shape
    dv = v.shape[2]
    sc = q.dtype.type(scale)
    for row in prange(BH):
        S = np.empty((dk, dv), q.dtype)
        S[:] = S0[row]
        e = np.empty(dk, q.dtype)
        r = np.empty(dv, q.dtype)
        acc = np.empty(dv, q.dtype)
        for t in range(T):
            if t % CHUNK == 0:
                checkpoints[row, t // CHUNK] = S
            decays(g, row, t, e)
            step(S, S, e, k[row, t], v[row, t], beta[row, t], delta, r)
            acc[:] = 0
            for i in range(dk):
                qi = q[row, t, i]
                for j in range(dv):
                    acc[j] += qi * S[i, j]
            for j in range(dv):
                o[row, t, j] = sc * acc[j]
        final[row] = S


forward_rows = numba.njit(cache=True, parallel=True, fastmath=_FASTMATH)(_forward_rows)


def _chunk_states(k, v, beta, g, delta, row, t0, t1, states, es, rs):
    """states[i + 1] (the state after step t0 + i), es[i] (its decays) and rs[i] (its r) for
    the chunk [t0, t1), from states[0], the state before t0."""
    for t in range(t0, t1):
        i = t - t0
        decays(g, row, t, es[i])
        step(states[i], states[i + 1], es[i], k[row, t], v[row, t], beta[row, t], delta, rs[i])


chunk_states = numba.njit(cache=True, inline="always", fastmath=_FASTMATH)(_chunk_states)


def _backward_step(do_t, q_t, k_t, bt, sc, dlt, S_t, S_prev, e, r, Gm, gk, dq_t, dk_t, dv_t,
                   dg_rows):
    """Step t of the backward: Gm (dk, dv) from dL/dS_t (without o_t's share) to
    dL/dS_{t-1}; writes dq_t, dk_t (dk,), dv_t (dv,), dg_rows (dk,) the per-key sums of
    dS' * S'; returns dbeta_t. ``dlt`` is 1 with the delta rule, else 0."""
    dk, dv = Gm.shape
    zero = Gm.dtype.type(0)
    gk[:] = 0
    for a in range(dk):
        sqa = sc * q_t[a]
        ka = k_t[a]
        dqa = zero
        for j in range(dv):
            Gaj = Gm[a, j] + sqa * do_t[j]
            Gm[a, j] = Gaj
            dqa += S_t[a, j] * do_t[j]
            gk[j] += ka * Gaj
        dq_t[a] = sc * dqa
    dbt = zero
    for j in range(dv):
        dbt += gk[j] * r[j]
        gk[j] *= bt  # now dr
        dv_t[j] = gk[j]
    for a in range(dk):
        ea = e[a]
        kd = dlt * k_t[a]
        gr = zero
        sdr = zero
        gs = zero
        for j in range(dv):
            sp = ea * S_prev[a, j]
            Gaj = Gm[a, j]
            gr += Gaj * r[j]
            sdr += sp * gk[j]
            dsp = Gaj - kd * gk[j]
            gs += dsp * sp
            Gm[a, j] = ea * dsp
        dk_t[a] = bt * gr - dlt * sdr
        dg_rows[a] = gs
    return dbt


backward_step = numba.njit(cache=True, inline="always", fastmath=_FASTMATH)(_backward_step)


def _backward_rows(do, dfinal, q, k, v, beta, g, scale, delta, checkpoints, dq, dk, dv, dbeta,
                   dg, dS0):
    """Every gradient of every row in parallel (layouts in the module docstring)."""
    BH, T, DK = q.shape
    DV = v.shape[2]
    G = g.shape[2]
    sc = q.dtype.type(scale)
    dlt = q.dtype.type(1) if delta else q.dtype.type(0)
    for row in prange(BH):
        states = np.empty((CHUNK + 1, DK, DV), q.dtype)
        es = np.empty((CHUNK, DK), q.dtype)
        rs = np.empty((CHUNK, DV), q.dtype)
        Gm = np.empty((DK, DV), q.dtype)
        Gm[:] = dfinal[row]
        gk = np.empty(DV, q.dtype)
        dg_rows = np.empty(DK, q.dtype)
        for c in range((T + CHUNK - 1) // CHUNK - 1, -1, -1):
            t0 = c * CHUNK
            t1 = min(T, t0 + CHUNK)
            states[0] = checkpoints[row, c]
            chunk_states(k, v, beta, g, delta, row, t0, t1, states, es, rs)
            for t in range(t1 - 1, t0 - 1, -1):
                i = t - t0
                dbeta[row, t] = backward_step(
                    do[row, t], q[row, t], k[row, t], beta[row, t], sc, dlt, states[i + 1],
                    states[i], es[i], rs[i], Gm, gk, dq[row, t], dk[row, t], dv[row, t],
                    dg_rows)
                if G == 1:
                    dg[row, t, 0] = dg_rows.sum()
                elif G > 1:
                    dg[row, t] = dg_rows
        dS0[row] = Gm


backward_rows = numba.njit(cache=True, parallel=True, fastmath=_FASTMATH)(_backward_rows)


# ---- launchers (the names and signatures of linear_attention_cuda's) -------------------------

def recurrent_forward(q: np.ndarray, k: np.ndarray, v: np.ndarray, beta: np.ndarray,
                      g: np.ndarray, scale: float, S0: np.ndarray, delta: bool, o: np.ndarray,
                      final: np.ndarray, checkpoints: np.ndarray) -> None:
    """Writes o (BH, T, dv), final (BH, dk, dv) and checkpoints (BH, ceil(T / CHUNK), dk,
    dv) of the recurrence (layouts in the module docstring)."""
    forward_rows(q, k, v, beta, g, float(scale), S0, bool(delta), o, final, checkpoints)


def recurrent_backward(do: np.ndarray, dfinal: np.ndarray, q: np.ndarray, k: np.ndarray,
                       v: np.ndarray, beta: np.ndarray, g: np.ndarray, scale: float,
                       delta: bool, checkpoints: np.ndarray, dq: np.ndarray, dk: np.ndarray,
                       dv: np.ndarray, dbeta: np.ndarray, dg: np.ndarray,
                       dS0: np.ndarray) -> None:
    """Writes dq, dk (BH, T, dk), dv (BH, T, dv), dbeta (BH, T), dg (BH, T, G) and dS0 (BH,
    dk, dv) from do (BH, T, dv) and dfinal (BH, dk, dv), the upstream gradients, and the
    forward's checkpoints."""
    backward_rows(do, dfinal, q, k, v, beta, g, float(scale), bool(delta), checkpoints, dq, dk,
                  dv, dbeta, dg, dS0)
