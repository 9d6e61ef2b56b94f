"""The chunked parallel form of the linear-attention family: matrix products inside a chunk
of C steps, a recurrence across chunks (written with NumPy/CuPy calls, so the same code runs
on either; the products are BLAS/cuBLAS batched GEMMs).

Rows layout (``nnkit.kernels.linear_attention`` flattens (batch, heads) into BH rows): q, k
(BH, T, dk), v (BH, T, dv), beta (BH, T), g (BH, T, G) with G in {0, 1, dk}, S0 (BH, dk, dv).
The recurrence (S (dk, dv), keys index rows, as flash-linear-attention):

    S_t = a_t S_{t-1} + beta_t k_t (v_t - [delta] (a_t S_{t-1})^T k_t)^T,   o_t = scale S_t^T q_t

with a_t = exp(g_t) a scalar (G = 1), a diagonal over the keys (G = dk, not with the delta
rule) or 1 (G = 0). Inside a chunk, with Gc the cumulative sum of g from the chunk's start,
Gamma_ri = exp(Gc_r - Gc_i) for i <= r (0 above the diagonal) and S0 the state before it,
every state is S_r = exp(Gc_r) S0 + sum_{i <= r} exp(Gc_r - Gc_i) k_i x_i^T, where

    x = beta v                                   (linear attention: no delta)
    x = U - W S0,  U = T V,  W = T (exp(Gc) K),
    T = (I + tril(diag(beta) (Gamma * K K^T), -1))^-1 diag(beta)

(the delta rules' WY/UT form: T by forward substitution). So o = (exp(Gc) Q) S0 +
(tril(Q K^T) * Gamma) x and the next chunk starts from exp(Gc_C) S0 + (exp(Gc_C - Gc) K)^T x.
Every exponent is <= 0 when g <= 0 (log-decays): nothing overflows at any T. For a per-key
decay the chunk's scores sum_k q_rk k_ik exp(Gc_rk - Gc_ik) are computed row by row in that
stable form instead of one GEMM.

The backward runs the chunk recurrence in reverse for dL/dS at each chunk's start, then
differentiates the products of every chunk at once.
"""

from __future__ import annotations

from typing import NamedTuple

from .._backend import array_module
from .._types import Array

__all__ = ["ChunkCache", "chunk_forward", "chunk_backward"]


class ChunkCache(NamedTuple):
    """What ``chunk_backward`` reads (chunked arrays (BH, n, C, ...))."""

    Q: object  # scale * q
    K: object
    V: object
    beta: object  # (BH, n, C)
    Gc: object  # (BH, n, C, G) cumulative log-decay inside each chunk
    Gam: object  # (BH, n, C, C) decays exp(Gc_r - Gc_i) on and below the diagonal (G <= 1)
    A: object  # (BH, n, C, C) the chunk's decayed scores
    P: object  # (I + L)^-1 (delta rules)
    Tm: object  # P diag(beta) (delta rules)
    W: object  # Tm (exp(Gc) K) (delta rules)
    X: object  # (BH, n, C, dv) the x of every chunk
    starts: object  # (BH, n, dk, dv) the state before every chunk
    scale: float
    delta: bool
    T: int


def _swap(x):
    return x.swapaxes(-1, -2)


def _chunks(x, C):
    """(BH, T, ...) -> (BH, ceil(T / C), C, ...), zero-padded at the end (a padded step has
    k = v = beta = g = 0 and leaves the state alone)."""
    xp = array_module(x)
    BH, T = x.shape[:2]
    n = -(-T // C)
    if n * C != T:
        x = xp.pad(x, [(0, 0), (0, n * C - T)] + [(0, 0)] * (x.ndim - 2))
    return x.reshape(BH, n, C, *x.shape[2:])


def _unchunk(x, T):
    """(BH, n, C, ...) -> (BH, T, ...)."""
    return x.reshape(x.shape[0], x.shape[1] * x.shape[2], *x.shape[3:])[:, :T]


def _unit_lower_inverse(L):
    """(I + L)^-1 for strictly lower-triangular L (..., C, C), by forward substitution."""
    xp = array_module(L)
    C = L.shape[-1]
    P = xp.zeros_like(L)
    P[..., range(C), range(C)] = 1
    for r in range(1, C):
        P[..., r, :r] = -(L[..., r:r + 1, :r] @ P[..., :r, :r])[..., 0, :]
    return P


def _reduce(t, G):
    """A per-key term (..., C, dk) summed over the keys for a scalar decay (G = 1)."""
    return t.sum(axis=-1, keepdims=True) if G == 1 else t


def _vector_scores(Q, K, Gc):
    """(..., C, C): A_ri = sum_k Q_rk K_ik exp(Gc_rk - Gc_ik) for i <= r, 0 above."""
    xp = array_module(Q)
    C = Q.shape[-2]
    A = xp.zeros((*Q.shape[:-1], C), Q.dtype)
    for r in range(C):
        E = xp.exp(Gc[..., r:r + 1, :] - Gc[..., :r + 1, :])
        A[..., r, :r + 1] = ((K[..., :r + 1, :] * E) @ Q[..., r, :, None])[..., 0]
    return A


def _vector_scores_grads(dA, Q, K, Gc):
    """The gradients of ``_vector_scores`` in Q and K (dA: (..., C, C))."""
    xp = array_module(Q)
    C = Q.shape[-2]
    dQ, dK = xp.zeros_like(Q), xp.zeros_like(K)
    for r in range(C):
        E = xp.exp(Gc[..., r:r + 1, :] - Gc[..., :r + 1, :])
        w = dA[..., r, :r + 1, None]
        dQ[..., r, :] = (w * K[..., :r + 1, :] * E).sum(axis=-2)
        dK[..., :r + 1, :] += w * Q[..., r:r + 1, :] * E
    return dQ, dK


def _decay(S, a):
    """The state (BH, dk, dv) times a chunk's total decay a (BH, G) (None: no decay)."""
    return S if a is None else S * a[:, :, None]


def chunk_forward(q: Array, k: Array, v: Array, beta: Array, g: Array, scale: float,
                  S0: Array, delta: bool, chunk_size: int) -> tuple[Array, Array, ChunkCache]:
    """The recurrence by chunks of ``chunk_size`` steps (module docstring).

    Parameters
    ----------
    q, k : array (BH, T, dk);  v : array (BH, T, dv);  beta : array (BH, T)
    g : array (BH, T, G), G in {0, 1, dk} (dk only without ``delta``)
    scale : float;  S0 : array (BH, dk, dv);  delta : bool;  chunk_size : int >= 1

    Returns
    -------
    o : array (BH, T, dv);  final : array (BH, dk, dv);  cache : ChunkCache
    """
    xp = array_module(q)
    T, G, C = q.shape[1], g.shape[2], chunk_size
    Q, K, V, beta_c = _chunks(q, C) * q.dtype.type(scale), _chunks(k, C), _chunks(v, C), \
        _chunks(beta, C)
    n = Q.shape[1]
    mask = xp.tril(xp.ones((C, C), dtype=bool))
    Gc = xp.cumsum(_chunks(g, C), axis=2) if G else None
    Gam = A = P = Tm = W = None
    if G == 1:
        Gam = xp.exp(xp.where(mask, Gc[..., :, None, 0] - Gc[..., None, :, 0], -xp.inf))
    elif G == 0:
        Gam = mask.astype(q.dtype)
    A = _vector_scores(Q, K, Gc) if G > 1 else (Q @ _swap(K)) * Gam
    eG = xp.exp(Gc) if G else 1
    if delta:
        P = _unit_lower_inverse(xp.tril(beta_c[..., :, None] * Gam * (K @ _swap(K)), -1))
        Tm = P * beta_c[..., None, :]
        W, X = Tm @ (eG * K), Tm @ V
    else:
        X = beta_c[..., None] * V
    eGL = xp.exp(Gc[:, :, -1]) if G else None  # (BH, n, G) a chunk's total decay
    Kd = xp.exp(Gc[:, :, -1:] - Gc) * K if G else K
    starts = xp.empty((q.shape[0], n, k.shape[2], v.shape[2]), q.dtype)
    S = S0
    for c in range(n):
        starts[:, c] = S
        if delta:
            X[:, c] -= W[:, c] @ S
        S = _decay(S, None if eGL is None else eGL[:, c]) + _swap(Kd[:, c]) @ X[:, c]
    o = _unchunk((eG * Q) @ starts + A @ X, T)
    cache = ChunkCache(Q, K, V, beta_c, Gc, Gam, A, P, Tm, W, X, starts, scale, delta, T)
    return xp.ascontiguousarray(o), S, cache


def chunk_backward(do: Array, dfinal: Array, cache: ChunkCache) -> tuple[Array, ...]:
    """Gradients of ``chunk_forward`` for upstream do (BH, T, dv) and dfinal (BH, dk, dv).

    Returns
    -------
    dq, dk (BH, T, dk), dv (BH, T, dv), dbeta (BH, T), dg (BH, T, G), dS0 (BH, dk, dv)
    """
    c = cache
    xp = array_module(do)
    Q, K, V, X, starts, Gc = c.Q, c.K, c.V, c.X, c.starts, c.Gc
    BH, n, C, dk = Q.shape
    G = 0 if Gc is None else Gc.shape[-1]
    dO = _chunks(do, C)
    eG = xp.exp(Gc) if G else 1
    eGL = xp.exp(Gc[:, :, -1]) if G else None
    Kd = xp.exp(Gc[:, :, -1:] - Gc) * K if G else K
    dX, after = xp.empty_like(X), xp.empty_like(starts)
    dS = dfinal
    for i in reversed(range(n)):
        after[:, i] = dS
        dX[:, i] = _swap(c.A[:, i]) @ dO[:, i] + Kd[:, i] @ dS
        Qg = eG[:, i] * Q[:, i] if G else Q[:, i]
        dS = _swap(Qg) @ dO[:, i] + _decay(dS, None if eGL is None else eGL[:, i])
        if c.delta:
            dS = dS - _swap(c.W[:, i]) @ dX[:, i]
    dS0 = dS
    mask = xp.tril(xp.ones((C, C), dtype=bool))
    dA = (dO @ _swap(X)) * mask
    dGc = xp.zeros_like(Gc) if G else None
    if G > 1:
        dQ, dK = _vector_scores_grads(dA, Q, K, Gc)
        dGc += Q * dQ - K * dK
    else:
        dQ, dK = (dA * c.Gam) @ K, _swap(dA * c.Gam) @ Q
        if G:
            t = dA * c.A
            dGc[..., 0] += t.sum(axis=-1) - t.sum(axis=-2)
    dQg = dO @ _swap(starts)  # through (exp(Gc) Q) S0
    dQ += eG * dQg
    dKd = X @ _swap(after)  # through the next chunk's start
    dK += xp.exp(Gc[:, :, -1:] - Gc) * dKd if G else dKd
    if G:
        dGc += _reduce(eG * Q * dQg, G)
        t = _reduce(Kd * dKd, G)
        dGc -= t
        dGL = t.sum(axis=2) + _reduce((after * starts).sum(axis=-1), G) * eGL
        dGc[:, :, -1] += dGL
    if c.delta:
        dW = -(dX @ _swap(starts))
        Kg = eG * K
        dT = dX @ _swap(V) + dW @ _swap(Kg)
        dV = _swap(c.Tm) @ dX
        dKg = _swap(c.Tm) @ dW
        dK += eG * dKg
        dbeta = (dT * c.P).sum(axis=-2)
        dP = dT * c.beta[..., None, :]
        dL = xp.tril(-(_swap(c.P) @ dP @ _swap(c.P)), -1)
        KK = K @ _swap(K)
        dbeta += (dL * c.Gam * KK).sum(axis=-1)
        dKK = dL * c.beta[..., :, None] * c.Gam
        dK += (dKK + _swap(dKK)) @ K
        if G:
            dGc += _reduce(Kg * dKg, G)
            t = dL * c.beta[..., :, None] * c.Gam * KK
            dGc[..., 0] += t.sum(axis=-1) - t.sum(axis=-2)
    else:
        dV = c.beta[..., None] * dX
        dbeta = (V * dX).sum(axis=-1)
    T = c.T
    dg = (xp.flip(xp.cumsum(xp.flip(dGc, axis=2), axis=2), axis=2) if G
          else xp.zeros((BH, n, C, 0), Q.dtype))
    scale = Q.dtype.type(c.scale)
    grads = (dQ * scale, dK, dV, dbeta, dg)
    return (*(xp.ascontiguousarray(_unchunk(x, T)) for x in grads), dS0)
