"""The linear scan h_t = a_t * h_{t-1} + b_t on the GPU: Numba CUDA kernels.

Arrays (B, T, D) C-contiguous device arrays (CuPy, Numba device arrays, or NumPy arrays under
``NUMBA_ENABLE_CUDASIM=1``), one dtype (float32/64, complex64/128), outputs preallocated;
nothing is validated here (``nnkit.kernels.scan`` is the entry point).

Forward, two strategies (``linear_scan`` picks by the number of sequences S = B x D):

- ``S >= seq_min``: one thread per sequence walks T; neighbouring threads read neighbouring
  features, so every step is one coalesced load of a and b and one store of h.
- otherwise a block scan with carries across blocks: each thread block scans a tile of
  ``tile`` consecutive steps of one sequence in shared memory (Hillis-Steele over the affine
  maps (A, H): h -> A h + H, composed as (A2 A1, A2 H1 + H2)) and writes the tile's aggregate
  (``_tile_reduce``); one thread per sequence scans the aggregates serially into each tile's
  incoming state (``_tile_carries``); every tile is scanned again and applied to its carry
  (``_tile_apply``). The scan's depth is log2(tile) per tile plus T / tile for the carries.

Shared-memory accumulators are float64 for real inputs and complex128 for complex ones.
Backward is the fused reverse walk, one thread per sequence (``_rows_backward``).
"""

from __future__ import annotations

from numba import complex128, cuda, float64

__all__ = ["linear_scan", "linear_scan_backward", "MAX_TILE"]

MAX_TILE = 256  # shared-memory tile (threads per block of the block scan); a power of two
# Launch settings; the tests lower them under the simulator to cross tile boundaries.
tile = MAX_TILE
seq_threads = 128
seq_min = 2048


def _index(k, T, reverse):
    return T - 1 - k if reverse else k


_index_dev = cuda.jit(device=True)(_index)


@cuda.jit
def _rows_forward(a, b, h0, out, reverse):
    s = cuda.grid(1)
    B, T, D = a.shape
    if s >= B * D:
        return
    i, d = s // D, s % D
    h = h0[i, d]
    for k in range(T):
        t = _index_dev(k, T, reverse)
        h = a[i, t, d] * h + b[i, t, d]
        out[i, t, d] = h


@cuda.jit
def _rows_backward(dh, a, h, h0, da, db, dh0, reverse):
    """g_t = dh_t + conj(a_next) g_next; db = g; da_t = g_t conj(h_prev); dh0 = conj(a_0) g_0."""
    s = cuda.grid(1)
    B, T, D = a.shape
    if s >= B * D:
        return
    i, d = s // D, s % D
    if T == 0:
        dh0[i, d] = 0
        return
    g = dh[i, 0, d]  # replaced at k = T-1; only gives g its type
    for j in range(T):
        k = T - 1 - j
        t = _index_dev(k, T, reverse)
        if j == 0:
            g = dh[i, t, d]
        else:
            g = dh[i, t, d] + a[i, _index_dev(k + 1, T, reverse), d].conjugate() * g
        db[i, t, d] = g
        if k > 0:
            da[i, t, d] = g * h[i, _index_dev(k - 1, T, reverse), d].conjugate()
        else:
            da[i, t, d] = g * h0[i, d].conjugate()
    dh0[i, d] = a[i, _index_dev(0, T, reverse), d].conjugate() * g


@cuda.jit(device=True)
def _tile_scan(a, b, i, d, k0, T, reverse, bufA, bufH):
    """Inclusive scan of this block's tile (steps k0..k0+blockDim-1) in bufA, bufH; steps past
    T are the identity map (1, 0). Every thread returns its prefix (A, H)."""
    tid = cuda.threadIdx.x
    k = k0 + tid
    if k < T:
        t = _index_dev(k, T, reverse)
        bufA[tid] = a[i, t, d]
        bufH[tid] = b[i, t, d]
    else:
        bufA[tid] = 1
        bufH[tid] = 0
    cuda.syncthreads()
    off = 1
    while off < cuda.blockDim.x:
        if tid >= off:
            pa, ph = bufA[tid - off], bufH[tid - off]
        cuda.syncthreads()
        if tid >= off:
            ca = bufA[tid]
            bufH[tid] = ca * ph + bufH[tid]
            bufA[tid] = ca * pa
        cuda.syncthreads()
        off *= 2
    return bufA[tid], bufH[tid]


@cuda.jit(device=True)
def _reduce_body(a, b, A, H, reverse, bufA, bufH):
    c, s = cuda.blockIdx.x, cuda.blockIdx.y
    B, T, D = a.shape
    i, d = s // D, s % D
    pa, ph = _tile_scan(a, b, i, d, c * cuda.blockDim.x, T, reverse, bufA, bufH)
    if cuda.threadIdx.x == cuda.blockDim.x - 1:
        A[c, s] = pa
        H[c, s] = ph


@cuda.jit(device=True)
def _apply_body(a, b, carry, out, reverse, bufA, bufH):
    c, s = cuda.blockIdx.x, cuda.blockIdx.y
    B, T, D = a.shape
    i, d = s // D, s % D
    k = c * cuda.blockDim.x + cuda.threadIdx.x
    pa, ph = _tile_scan(a, b, i, d, c * cuda.blockDim.x, T, reverse, bufA, bufH)
    if k < T:
        out[i, _index_dev(k, T, reverse), d] = pa * carry[c, s] + ph


@cuda.jit
def _tile_reduce_real(a, b, A, H, reverse):
    bufA = cuda.shared.array(MAX_TILE, float64)
    bufH = cuda.shared.array(MAX_TILE, float64)
    _reduce_body(a, b, A, H, reverse, bufA, bufH)


@cuda.jit
def _tile_reduce_complex(a, b, A, H, reverse):
    bufA = cuda.shared.array(MAX_TILE, complex128)
    bufH = cuda.shared.array(MAX_TILE, complex128)
    _reduce_body(a, b, A, H, reverse, bufA, bufH)


@cuda.jit
def _tile_apply_real(a, b, carry, out, reverse):
    bufA = cuda.shared.array(MAX_TILE, float64)
    bufH = cuda.shared.array(MAX_TILE, float64)
    _apply_body(a, b, carry, out, reverse, bufA, bufH)


@cuda.jit
def _tile_apply_complex(a, b, carry, out, reverse):
    bufA = cuda.shared.array(MAX_TILE, complex128)
    bufH = cuda.shared.array(MAX_TILE, complex128)
    _apply_body(a, b, carry, out, reverse, bufA, bufH)


@cuda.jit
def _tile_carries(A, H, h0, carry):
    """carry[0, s] = h0[s]; carry[c+1, s] = A[c, s] carry[c, s] + H[c, s]; thread per s."""
    s = cuda.grid(1)
    C, S = carry.shape
    if s >= S:
        return
    D = h0.shape[1]
    state = h0[s // D, s % D]
    for c in range(C):
        carry[c, s] = state
        state = A[c, s] * state + H[c, s]


def _grid(n, threads):
    return max(1, (n + threads - 1) // threads), threads


def _empty_like_module(x):
    """The array module of ``x`` (cupy for device arrays, numpy under the simulator)."""
    if type(x).__module__.startswith("cupy"):
        import cupy

        return cupy
    import numpy

    return numpy


def linear_scan(a, b, h0, out, reverse):
    """h = scan(a, b) from h0 into ``out`` (B, T, D); returns ``out``."""
    B, T, D = a.shape
    S = B * D
    if S == 0 or T == 0:
        return out
    if S >= seq_min:
        blocks, threads = _grid(S, seq_threads)
        _rows_forward[blocks, threads](a, b, h0, out, reverse)
        return out
    xp = _empty_like_module(a)
    C = (T + tile - 1) // tile
    A, H = xp.empty((C, S), a.dtype), xp.empty((C, S), a.dtype)
    carry = xp.empty((C, S), a.dtype)
    complex_ = a.dtype.kind == "c"
    reduce_ = _tile_reduce_complex if complex_ else _tile_reduce_real
    apply_ = _tile_apply_complex if complex_ else _tile_apply_real
    reduce_[(C, S), tile](a, b, A, H, reverse)
    blocks, threads = _grid(S, seq_threads)
    _tile_carries[blocks, threads](A, H, h0, carry)
    apply_[(C, S), tile](a, b, carry, out, reverse)
    return out


def linear_scan_backward(dh, a, h, h0, da, db, dh0, reverse):
    """Fill da, db (B, T, D) and dh0 (B, D): one thread per sequence walks T backwards."""
    B, T, D = a.shape
    if B * D == 0:
        return
    blocks, threads = _grid(B * D, seq_threads)
    _rows_backward[blocks, threads](dh, a, h, h0, da, db, dh0, reverse)
