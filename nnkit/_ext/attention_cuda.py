"""Fused scaled-dot-product attention on NVIDIA GPUs: tiled flash-attention Numba CUDA kernels.

Arrays are 4-D and C-contiguous, CuPy arrays or Numba device arrays (NumPy arrays under
``NUMBA_ENABLE_CUDASIM=1``), one float dtype (float32 or float64):
q (B, H, L, E), k (B, H, S, E), v (B, H, S, Ev), mask (B, H, L, S) additive (0 takes part,
-inf is excluded; usually a zero-stride broadcast view, read in place, never copied),
out (B, H, L, Ev), lse (B, H, L). Nothing is validated here (``nnkit.kernels.attention`` is the
entry point); nothing of size L x S is ever allocated.

Scores s_ij = scale q_i . k_j + mask_ij, with s_ij = -inf where ``causal`` and j > i (torch's
``is_causal``: the top-left aligned lower triangle). P = softmax_j(s); out = (P o Z) V where Z
is the dropout mask: Z_ij = 1 / (1 - p) when u >= p, else 0, u = ``uniform53(splitmix64(seed,
((b H + h) L + i) S + j))`` (``simd_math``'s SplitMix64: the same functions, so the same
stream, as ``attention_cpu``; no dropout when p = 0). lse_i = log sum_j exp(s_ij), taken
before dropout. A row where no key takes part gets out = 0, lse = -inf and zero gradients
(torch 2.13's CPU result).

Kernels (Dao 2023, FlashAttention-2), all gathers, no atomics:

- ``forward``: one thread block per (query tile of BM rows, b * h). Q's tile stays in shared
  memory; K and V tiles of BN keys stream through one shared buffer. Thread (ty, tx) owns the
  scores of rows ty + TY i and keys tx + TX j, and the output columns tx + TX c of its rows.
  Online softmax: the running row max m (tile maxima meet in shared memory), the running sum
  l (per-thread partial sums, all rescaled by the same exp(m_old - m_new), added up at the
  end), the accumulator rescaled likewise; P o Z goes through shared memory into P V.
- ``fill_dropout_multipliers``: Z itself, a thread per element (the gradient of a mask
  that requires one, one (L, S) slab at a time; ``attention_cpu``'s launcher of that name).
- ``backward``: D_i = sum_e dout_ie out_ie (``_row_dot``); then one block per
  (key tile, b * h) loops over query tiles accumulating dK = scale dS^T Q and dV = (P o Z)^T dO
  in registers (P recomputed as exp(s - lse)); one block per (query tile, b * h) loops over
  key tiles for dQ = scale dS K, where dS = P o (Z o dP - D) and dP = dO V^T.

Tile sizes are picked per (kernel, dtype, head-dim bucket) to fit the 48 KiB of static shared
memory (``_tiles``), with at most 4 rows per thread (more and Numba leaves the register
arrays in local memory); head dims up to 256 fit in float32 (E = Ev = 256), up to 128 in
float64, larger ones raise ValueError. The module variables ``block_m``, ``block_n``, ``threads_y``,
``threads_x`` override them (the tests shrink them so tiny shapes cross tile boundaries).
The kernels are built by small factories (``_forward_kernel`` ...), cached per configuration:
Numba needs the tile sizes as compile-time constants to size shared and register arrays.
Sums run in the input dtype, D and lse included (float32 as FlashAttention's and torch's
kernels: the online softmax bounds every exp by 1), so float32 inputs use float32 arithmetic
and the CUDA cores run at full rate. The host converts the scalars once: ``scale`` and 1 / (1
- p) to the input dtype, the dropout probability to the integer threshold of its test (see
``_keep``). ``fastmath`` is off: -inf masks must propagate.

CuPy inputs run on CuPy's current stream, without a host synchronisation (``_launch.launch``).
Speed: the tiles multiply on the CUDA cores (Numba exposes no tensor-core instructions), a
fraction of torch's SDPA for long sequences; small problems are dominated by Numba's
per-launch cost (benchmarks/RESULTS.md, "On an NVIDIA H100", "Fused attention").
"""

from __future__ import annotations

import math

from numba import cuda, float32, float64, uint64

from ._launch import device_empty, kernel_factory, launch
from .launchers import launchers
from .simd_math import splitmix64_dev

__all__ = [*launchers("attention_cpu", "attention_cuda")]

# Launch settings; None picks them by head dim and dtype (``_tiles``). The tests set all four.
block_m = None  # query rows per tile
block_n = None  # keys per tile
threads_y = None  # threads along the row dimension of a tile
threads_x = None  # threads along the key / feature dimension (divides 32)
SHARED_BYTES = 48 * 1024  # static shared memory per block
row_threads = 128  # threads per block of the D_i = rowsum(dout * out) kernel

_NEG_INF = -math.inf
_DTYPES = {"float32": float32, "float64": float64}


# ---- tiles --------------------------------------------------------------------------------

def _bucket(n, least):
    """The head-dim bucket of ``n``: a power of two >= max(n, least)."""
    p = least
    while p < n:
        p *= 2
    return p


def _shared_bytes(kind, itemsize, bm, bn, tx, ep, evp):
    if kind == "forward":
        words = bm * (ep + 1) + bn * (max(ep, evp) + 1) + bm * (bn + 1) + bm * tx
    elif kind == "dkv":
        words = bn * (ep + evp + 2) + bm * (ep + evp + 2) + 2 * bn * (bm + 1) + 2 * bm
    else:  # "dq"
        words = bm * (ep + evp + 2) + bn * (ep + evp + 2) + bm * (bn + 1)
    return words * itemsize


# (BM, BN) candidates, largest first; dkv holds a key tile and streams query tiles
_CANDIDATES = {
    "forward": ((64, 32), (32, 32), (32, 16), (16, 16), (16, 8), (8, 8)),
    "dq": ((64, 32), (32, 32), (32, 16), (16, 16), (16, 8), (8, 8)),
    "dkv": ((32, 64), (32, 32), (16, 32), (16, 16), (8, 16), (8, 8)),
}


def _tiles(kind, itemsize, E, Ev):
    """(BM, BN, TY, TX, EP, EVP) for one kernel: the largest tiles that fit in shared memory,
    or the module overrides when the tests set them. EP, EVP: padded E, Ev (multiples of TX)."""
    if block_m is not None:
        tx = threads_x
        return (block_m, block_n, threads_y, tx, _bucket(E, tx), _bucket(Ev, tx))
    return _gpu_tiles(kind, itemsize, E, Ev)


def _gpu_tiles(kind, itemsize, E, Ev):
    """``_tiles`` without the tests' overrides."""
    ep, evp = _bucket(E, 16), _bucket(Ev, 16)
    for bm, bn in _CANDIDATES[kind]:
        # forward, dq: TY splits the query rows, TX the keys; dkv: TY the keys, TX the queries
        # (at most 4 rows a thread: more and Numba's arrays spill to local memory)
        tx, ty = (min(16, bm), max(8, bn // 4)) if kind == "dkv" else (min(16, bn),
                                                                         max(8, bm // 4))
        if _shared_bytes(kind, itemsize, bm, bn, tx, ep, evp) <= SHARED_BYTES:
            return bm, bn, ty, tx, ep, evp
    raise ValueError(f"head dims E={E}, Ev={Ev} are too large for the CUDA attention kernels "
                     f"in {8 * itemsize}-bit floats ({SHARED_BYTES} bytes of shared memory per "
                     f"block); E = Ev = 256 fits in float32, E = Ev = 128 in float64")


def _on_gpu(kind):
    """The variant a GPU launches for the inputs a test variant was made for (its padded head
    dims give the same buckets): the one the compile audit compiles."""
    def variant(args):
        dtype_name, EP, EVP = args[0], args[5], args[6]
        return (dtype_name, *_gpu_tiles(kind, _DTYPES[dtype_name].bitwidth // 8, EP, EVP))
    return variant


def _seed(seed):
    """The seed as an int64 (one kernel signature; the kernels read it modulo 2**64)."""
    import numpy

    return numpy.array(int(seed) % 2**64, numpy.uint64).view(numpy.int64)[()]


def _scalars(dtype, scale, dropout_p, seed):
    """(scale, drop_below, keep_scale, seed) as the kernels take them, converted once here:
    scale and 1 / (1 - p) in the arrays' ``dtype``, the dropout test's threshold ceil(p 2**53)
    as a uint64 (``_keep``), the seed as an int64."""
    import numpy

    p = float(dropout_p)
    dt = numpy.dtype(dtype).type
    return (dt(scale), numpy.uint64(math.ceil(p * 2.0**53)), dt(1.0 / (1.0 - p)), _seed(seed))


def _grid(n, threads):
    return max(1, (n + threads - 1) // threads), threads


def _key_tiles(causal, q0, BM, L, S, BN):
    """How many key tiles a query tile starting at q0 visits (causal tiles stop at the
    diagonal)."""
    n = (S + BN - 1) // BN
    if causal:  # the tile's last row, min(q0 + BM, L) - 1 (Numba 0.68's CUDA target has no
        last = q0 + BM - 1 if q0 + BM < L else L - 1  # min()/max() on ints: spelt out)
        if last // BN + 1 < n:
            n = last // BN + 1
    return n


_key_tiles_dev = cuda.jit(device=True)(_key_tiles)


def _load_rows(src, b, h, r0, n_rows, n_cols, dst, n_tile, t, nt):
    """dst[r, c] = src[b, h, r0 + r, c] for the tile's ``n_tile`` rows (0 past ``n_rows``),
    the ``nt`` threads of the block striding over the tile (thread ``t``): coalesced loads."""
    for idx in range(t, n_tile * n_cols, nt):
        r = idx // n_cols
        c = idx - r * n_cols
        if r0 + r < n_rows:
            dst[r, c] = src[b, h, r0 + r, c]
        else:
            dst[r, c] = 0


_load_rows_dev = cuda.jit(device=True)(_load_rows)


def _score(s, scale, mask, has_mask, causal, b, h, i, j, L, S, neg_inf):
    """The scaled, masked score of query i and key j, ``neg_inf`` where the pair does not
    take part (padding rows and keys included)."""
    if i >= L or j >= S or (causal and j > i):
        return neg_inf
    s = s * scale
    if has_mask:
        s += mask[b, h, i, j]
    return s


_score_dev = cuda.jit(device=True)(_score)


def _keep(drop_below, keep_scale, zero, seed, row_base, i, S, j):
    """Z_ij: ``keep_scale`` = 1 / (1 - p) for a kept element, ``zero`` for a dropped one;
    row_base = (b H + h) L. ``uniform53``'s test u < p in integers: the draw's top 53 bits n
    against ``drop_below`` = ceil(p 2**53) (uint64; n 2**-53 < p iff n < ceil(p 2**53)), so
    the mask is the CPU's with no float64 arithmetic."""
    if drop_below != uint64(0):
        if (splitmix64_dev(seed, (row_base + i) * S + j) >> uint64(11)) < drop_below:
            return zero
    return keep_scale


_keep_dev = cuda.jit(device=True)(_keep)


# ---- forward ------------------------------------------------------------------------------

@kernel_factory(on_gpu=_on_gpu("forward"))
def _forward_kernel(dtype_name, BM, BN, TY, TX, EP, EVP):
    dt = _DTYPES[dtype_name]
    RM, RN, RV = BM // TY, BN // TX, EVP // TX  # per-thread rows, keys, output columns
    EW = max(EP, EVP) + 1
    KF = max(RN, RV)
    EP1, BN1 = EP + 1, BN + 1  # padded rows: no shared-memory bank conflicts

    @cuda.jit
    def forward(q, k, v, mask, has_mask, causal, scale, drop_below, keep_scale, seed, out, lse):
        sQ = cuda.shared.array((BM, EP1), dt)
        sKV = cuda.shared.array((BN, EW), dt)
        sP = cuda.shared.array((BM, BN1), dt)
        sRed = cuda.shared.array((BM, TX), dt)
        s = cuda.local.array((RM, RN), dt)
        acc = cuda.local.array((RM, RV), dt)
        m = cuda.local.array(RM, dt)
        ls = cuda.local.array(RM, dt)
        qf = cuda.local.array(RM, dt)
        kf = cuda.local.array(KF, dt)
        B, H, L, E = q.shape
        S, Ev = k.shape[2], v.shape[3]
        bh = cuda.blockIdx.y
        b, h = bh // H, bh % H
        q0 = cuda.blockIdx.x * BM
        tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
        t = ty * TX + tx
        sc, ks = dt(scale), dt(keep_scale)
        neg_inf = dt(_NEG_INF)
        zero = dt(0)
        _load_rows_dev(q, b, h, q0, L, E, sQ, BM, t, TY * TX)
        for i in range(RM):
            m[i] = neg_inf
            ls[i] = zero
            for c in range(RV):
                acc[i, c] = zero
        for kt in range(_key_tiles_dev(causal, q0, BM, L, S, BN)):
            k0 = kt * BN
            cuda.syncthreads()  # the last tile's P V is done with sKV and sP
            _load_rows_dev(k, b, h, k0, S, E, sKV, BN, t, TY * TX)
            cuda.syncthreads()
            for i in range(RM):
                for j in range(RN):
                    s[i, j] = zero
            for e in range(E):  # s = Q K^T on the thread's rows x keys
                for i in range(RM):
                    qf[i] = sQ[ty + TY * i, e]
                for j in range(RN):
                    kf[j] = sKV[tx + TX * j, e]
                for i in range(RM):
                    for j in range(RN):
                        s[i, j] += qf[i] * kf[j]
            for i in range(RM):
                mx = neg_inf
                for j in range(RN):
                    s[i, j] = _score_dev(s[i, j], sc, mask, has_mask, causal, b, h,
                                         q0 + ty + TY * i, k0 + tx + TX * j, L, S, neg_inf)
                    if s[i, j] > mx:
                        mx = s[i, j]
                sRed[ty + TY * i, tx] = mx
            cuda.syncthreads()  # tile maxima in sRed; every read of K is done
            for i in range(RM):
                r = ty + TY * i
                m_new = m[i]
                for x in range(TX):
                    if sRed[r, x] > m_new:
                        m_new = sRed[r, x]
                alpha = zero if m[i] == neg_inf else math.exp(m[i] - m_new)
                m[i] = m_new
                ls[i] *= alpha
                for c in range(RV):
                    acc[i, c] *= alpha
                for j in range(RN):
                    p = zero if s[i, j] == neg_inf else math.exp(s[i, j] - m_new)
                    ls[i] += p
                    sP[r, tx + TX * j] = p * _keep_dev(drop_below, ks, zero, seed, bh * L,
                                                       q0 + r, S, k0 + tx + TX * j)
            _load_rows_dev(v, b, h, k0, S, Ev, sKV, BN, t, TY * TX)
            cuda.syncthreads()
            for kk in range(BN):  # acc += (P o Z) V
                for i in range(RM):
                    qf[i] = sP[ty + TY * i, kk]
                for c in range(RV):
                    kf[c] = sKV[kk, tx + TX * c]
                for i in range(RM):
                    for c in range(RV):
                        acc[i, c] += qf[i] * kf[c]
        cuda.syncthreads()
        for i in range(RM):
            sRed[ty + TY * i, tx] = ls[i]
        cuda.syncthreads()
        for i in range(RM):
            r = ty + TY * i
            row = q0 + r
            if row >= L:
                continue
            total = zero
            for x in range(TX):
                total += sRed[r, x]
            inv = zero if total == zero else dt(1) / total
            for c in range(RV):
                col = tx + TX * c
                if col < Ev:
                    out[b, h, row, col] = acc[i, c] * inv
            if tx == 0:
                lse[b, h, row] = neg_inf if total == zero else m[i] + math.log(total)

    return forward


def attention_forward(q, k, v, mask, has_mask, causal, scale, dropout_p, seed, out, lse):
    """Fill ``out`` (B, H, L, Ev) and ``lse`` (B, H, L) with fused attention; see the module
    docstring for the formulas. Returns ``out``."""
    B, H, L, E = q.shape
    Ev = v.shape[3]
    if B * H * L == 0:
        return out
    BM, BN, TY, TX, EP, EVP = _tiles("forward", q.dtype.itemsize, E, Ev)
    kernel = _forward_kernel(q.dtype.name, BM, BN, TY, TX, EP, EVP)
    grid = ((L + BM - 1) // BM, B * H)
    launch(kernel, grid, (TX, TY), q, k, v, mask, bool(has_mask), bool(causal),
           *_scalars(q.dtype, scale, dropout_p, seed), out, lse)
    return out


# ---- backward -----------------------------------------------------------------------------

@cuda.jit
def _row_dot(dout, out, D):
    """D[b, h, i] = sum_e dout[b, h, i, e] out[b, h, i, e] in D's dtype; a thread per row."""
    t = cuda.grid(1)
    B, H, L, Ev = out.shape
    if t >= B * H * L:
        return
    i = t % L
    h = (t // L) % H
    b = t // (L * H)
    acc = D.dtype.type(0)
    for e in range(Ev):
        acc += dout[b, h, i, e] * out[b, h, i, e]
    D[b, h, i] = acc


@kernel_factory(on_gpu=_on_gpu("dkv"))
def _dkv_kernel(dtype_name, BM, BN, TY, TX, EP, EVP):
    dt = _DTYPES[dtype_name]
    RK, RQ = BN // TY, BM // TX  # per-thread keys and queries
    RE, RV = EP // TX, EVP // TX  # per-thread dK and dV columns
    G1, G2 = max(RE, RQ), max(RV, RQ)
    EP1, EVP1, BM1 = EP + 1, EVP + 1, BM + 1  # shapes must be constants, not expressions

    @cuda.jit
    def dkv(q, k, v, mask, has_mask, causal, scale, drop_below, keep_scale, seed, lse, D, dout,
            dk, dv):
        sK = cuda.shared.array((BN, EP1), dt)
        sV = cuda.shared.array((BN, EVP1), dt)
        sQ = cuda.shared.array((BM, EP1), dt)
        sdO = cuda.shared.array((BM, EVP1), dt)
        sPZ = cuda.shared.array((BN, BM1), dt)
        sdS = cuda.shared.array((BN, BM1), dt)
        sL = cuda.shared.array(BM, dt)
        sD = cuda.shared.array(BM, dt)
        s = cuda.local.array((RK, RQ), dt)
        dp = cuda.local.array((RK, RQ), dt)
        ak = cuda.local.array((RK, RE), dt)
        av = cuda.local.array((RK, RV), dt)
        f1 = cuda.local.array(RK, dt)
        f2 = cuda.local.array(RK, dt)
        g1 = cuda.local.array(G1, dt)
        g2 = cuda.local.array(G2, dt)
        B, H, L, E = q.shape
        S, Ev = k.shape[2], v.shape[3]
        bh = cuda.blockIdx.y
        b, h = bh // H, bh % H
        k0 = cuda.blockIdx.x * BN
        tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
        t = ty * TX + tx
        nt = TY * TX
        sc, ks = dt(scale), dt(keep_scale)
        neg_inf = dt(_NEG_INF)
        zero = dt(0)
        _load_rows_dev(k, b, h, k0, S, E, sK, BN, t, nt)
        _load_rows_dev(v, b, h, k0, S, Ev, sV, BN, t, nt)
        for i in range(RK):
            for c in range(RE):
                ak[i, c] = zero
            for c in range(RV):
                av[i, c] = zero
        first = k0 // BM if causal else 0
        for qt in range(first, (L + BM - 1) // BM):
            q0 = qt * BM
            cuda.syncthreads()  # the last tile's dK, dV updates are done with the buffers
            _load_rows_dev(q, b, h, q0, L, E, sQ, BM, t, nt)
            _load_rows_dev(dout, b, h, q0, L, Ev, sdO, BM, t, nt)
            for r in range(t, BM, nt):
                sL[r] = lse[b, h, q0 + r] if q0 + r < L else neg_inf
                sD[r] = D[b, h, q0 + r] if q0 + r < L else zero
            cuda.syncthreads()
            for i in range(RK):
                for j in range(RQ):
                    s[i, j] = zero
                    dp[i, j] = zero
            for e in range(E):  # s^T = K Q^T
                for i in range(RK):
                    f1[i] = sK[ty + TY * i, e]
                for j in range(RQ):
                    g1[j] = sQ[tx + TX * j, e]
                for i in range(RK):
                    for j in range(RQ):
                        s[i, j] += f1[i] * g1[j]
            for e in range(Ev):  # dP^T = V dO^T
                for i in range(RK):
                    f2[i] = sV[ty + TY * i, e]
                for j in range(RQ):
                    g2[j] = sdO[tx + TX * j, e]
                for i in range(RK):
                    for j in range(RQ):
                        dp[i, j] += f2[i] * g2[j]
            for i in range(RK):
                key = k0 + ty + TY * i
                for j in range(RQ):
                    r = tx + TX * j
                    x = _score_dev(s[i, j], sc, mask, has_mask, causal, b, h, q0 + r, key, L, S,
                                   neg_inf)
                    p = zero if sL[r] == neg_inf else math.exp(x - sL[r])
                    z = _keep_dev(drop_below, ks, zero, seed, bh * L, q0 + r, S, key)
                    sPZ[ty + TY * i, r] = p * z
                    sdS[ty + TY * i, r] = p * (z * dp[i, j] - sD[r])
            cuda.syncthreads()
            for qq in range(BM):  # dV += (P o Z)^T dO, dK += dS^T Q
                for i in range(RK):
                    f1[i] = sPZ[ty + TY * i, qq]
                    f2[i] = sdS[ty + TY * i, qq]
                for c in range(RV):
                    g2[c] = sdO[qq, tx + TX * c]
                for c in range(RE):
                    g1[c] = sQ[qq, tx + TX * c]
                for i in range(RK):
                    for c in range(RV):
                        av[i, c] += f1[i] * g2[c]
                    for c in range(RE):
                        ak[i, c] += f2[i] * g1[c]
        for i in range(RK):
            key = k0 + ty + TY * i
            if key >= S:
                continue
            for c in range(RE):
                if tx + TX * c < E:
                    dk[b, h, key, tx + TX * c] = ak[i, c] * sc
            for c in range(RV):
                if tx + TX * c < Ev:
                    dv[b, h, key, tx + TX * c] = av[i, c]

    return dkv


@kernel_factory(on_gpu=_on_gpu("dq"))
def _dq_kernel(dtype_name, BM, BN, TY, TX, EP, EVP):
    dt = _DTYPES[dtype_name]
    RM, RN, RE = BM // TY, BN // TX, EP // TX  # per-thread queries, keys, dQ columns
    G1 = max(RE, RN)
    EP1, EVP1, BN1 = EP + 1, EVP + 1, BN + 1

    @cuda.jit
    def dq_kernel(q, k, v, mask, has_mask, causal, scale, drop_below, keep_scale, seed, lse, D,
                  dout, dq):
        sQ = cuda.shared.array((BM, EP1), dt)
        sdO = cuda.shared.array((BM, EVP1), dt)
        sK = cuda.shared.array((BN, EP1), dt)
        sV = cuda.shared.array((BN, EVP1), dt)
        sdS = cuda.shared.array((BM, BN1), dt)
        s = cuda.local.array((RM, RN), dt)
        dp = cuda.local.array((RM, RN), dt)
        acc = cuda.local.array((RM, RE), dt)
        row_lse = cuda.local.array(RM, dt)
        row_d = cuda.local.array(RM, dt)
        f1 = cuda.local.array(RM, dt)
        g1 = cuda.local.array(G1, dt)
        B, H, L, E = q.shape
        S, Ev = k.shape[2], v.shape[3]
        bh = cuda.blockIdx.y
        b, h = bh // H, bh % H
        q0 = cuda.blockIdx.x * BM
        tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
        t = ty * TX + tx
        nt = TY * TX
        sc, ks = dt(scale), dt(keep_scale)
        neg_inf = dt(_NEG_INF)
        zero = dt(0)
        _load_rows_dev(q, b, h, q0, L, E, sQ, BM, t, nt)
        _load_rows_dev(dout, b, h, q0, L, Ev, sdO, BM, t, nt)
        for i in range(RM):
            row = q0 + ty + TY * i
            row_lse[i] = lse[b, h, row] if row < L else neg_inf
            row_d[i] = D[b, h, row] if row < L else zero
            for c in range(RE):
                acc[i, c] = zero
        for kt in range(_key_tiles_dev(causal, q0, BM, L, S, BN)):
            k0 = kt * BN
            cuda.syncthreads()  # the last tile's dQ update is done with sK and sdS
            _load_rows_dev(k, b, h, k0, S, E, sK, BN, t, nt)
            _load_rows_dev(v, b, h, k0, S, Ev, sV, BN, t, nt)
            cuda.syncthreads()
            for i in range(RM):
                for j in range(RN):
                    s[i, j] = zero
                    dp[i, j] = zero
            for e in range(E):  # s = Q K^T
                for i in range(RM):
                    f1[i] = sQ[ty + TY * i, e]
                for j in range(RN):
                    g1[j] = sK[tx + TX * j, e]
                for i in range(RM):
                    for j in range(RN):
                        s[i, j] += f1[i] * g1[j]
            for e in range(Ev):  # dP = dO V^T
                for i in range(RM):
                    f1[i] = sdO[ty + TY * i, e]
                for j in range(RN):
                    g1[j] = sV[tx + TX * j, e]
                for i in range(RM):
                    for j in range(RN):
                        dp[i, j] += f1[i] * g1[j]
            for i in range(RM):
                r = ty + TY * i
                for j in range(RN):
                    key = k0 + tx + TX * j
                    x = _score_dev(s[i, j], sc, mask, has_mask, causal, b, h, q0 + r, key, L, S,
                                   neg_inf)
                    p = zero if row_lse[i] == neg_inf else math.exp(x - row_lse[i])
                    z = _keep_dev(drop_below, ks, zero, seed, bh * L, q0 + r, S, key)
                    sdS[r, tx + TX * j] = p * (z * dp[i, j] - row_d[i])
            cuda.syncthreads()
            for kk in range(BN):  # dQ += dS K
                for i in range(RM):
                    f1[i] = sdS[ty + TY * i, kk]
                for c in range(RE):
                    g1[c] = sK[kk, tx + TX * c]
                for i in range(RM):
                    for c in range(RE):
                        acc[i, c] += f1[i] * g1[c]
        for i in range(RM):
            row = q0 + ty + TY * i
            if row >= L:
                continue
            for c in range(RE):
                if tx + TX * c < E:
                    dq[b, h, row, tx + TX * c] = acc[i, c] * sc

    return dq_kernel


def attention_backward(q, k, v, mask, has_mask, causal, scale, dropout_p, seed, out, lse, dout,
                       dq, dk, dv):
    """Fill dq (B, H, L, E), dk (B, H, S, E), dv (B, H, S, Ev) from the forward's ``out`` and
    ``lse`` and the upstream gradient ``dout`` (B, H, L, Ev); see the module docstring."""
    B, H, L, E = q.shape
    S, Ev = k.shape[2], v.shape[3]
    if B * H == 0:
        return
    D = device_empty(q, (B, H, L), q.dtype)
    args = (q, k, v, mask, bool(has_mask), bool(causal), *_scalars(q.dtype, scale, dropout_p,
                                                                     seed), lse)
    if L > 0:
        launch(_row_dot, *_grid(B * H * L, row_threads), dout, out, D)
    if S > 0:  # dK, dV: a block per key tile (they are zero when L == 0)
        BM, BN, TY, TX, EP, EVP = _tiles("dkv", q.dtype.itemsize, E, Ev)
        kernel = _dkv_kernel(q.dtype.name, BM, BN, TY, TX, EP, EVP)
        launch(kernel, ((S + BN - 1) // BN, B * H), (TX, TY), *args, D, dout, dk, dv)
    if L > 0:  # dQ: a block per query tile (zero when S == 0)
        BM, BN, TY, TX, EP, EVP = _tiles("dq", q.dtype.itemsize, E, Ev)
        kernel = _dq_kernel(q.dtype.name, BM, BN, TY, TX, EP, EVP)
        launch(kernel, ((L + BM - 1) // BM, B * H), (TX, TY), *args, D, dout, dq)


# ---- the dropout multipliers ------------------------------------------------------------------

@cuda.jit
def _dropout_multipliers_kernel(seed, drop_below, keep_scale, bh0, out):
    """out[b, h, i, j] = Z of (batch, head) bh0 + b H + h, query i, key j; a thread each."""
    t = cuda.grid(1)
    B, H, L, S = out.shape
    if t >= B * H * L * S:
        return
    j = t % S
    i = (t // S) % L
    bh = t // (S * L)
    out[bh // H, bh % H, i, j] = _keep_dev(drop_below, keep_scale, out.dtype.type(0), seed,
                                           (bh0 + bh) * L, i, S, j)


def fill_dropout_multipliers(seed, dropout_p, out, bh0=0):
    """Fill ``out`` (B, H, L, S) with the dropout multipliers Z the kernels apply (0 or
    1 / (1 - dropout_p)); ``bh0``: the flat (batch, head) index of the first slab. Returns
    ``out``."""
    _, drop_below, keep_scale, seed = _scalars(out.dtype, 1.0, dropout_p, seed)
    launch(_dropout_multipliers_kernel, *_grid(out.size, row_threads), seed, drop_below,
           keep_scale, int(bh0), out)
    return out
