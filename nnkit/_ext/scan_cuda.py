"""The linear scan h_t = a_t * h_{t-1} + b_t on the GPU: Numba CUDA kernels.

Arrays (B, T, D) C-contiguous device arrays (CuPy, Numba device arrays, or NumPy arrays under
``NUMBA_ENABLE_CUDASIM=1``), one dtype (float32/64, complex64/128), outputs preallocated;
nothing is validated here (``nnkit.kernels.scan`` is the entry point).

Forward, three strategies (``linear_scan`` picks by the number of sequences S = B x D):

- ``S >= rows_min``: one thread per sequence walks T; neighbouring threads read neighbouring
  features, so every step is one coalesced load of a and b and one store of h.
- ``seq_min <= S < rows_min``: chunks along T. One thread per (chunk, sequence) walks its
  chunk and writes the chunk's affine map (A, H): h -> A h + H (``_chunk_reduce``); one
  thread per sequence scans the maps into each chunk's incoming state (``_chunk_carries``);
  every (chunk, sequence) thread walks its chunk again from that state and writes h
  (``_chunk_apply``). Loads stay coalesced (neighbouring threads, neighbouring features) and
  there are about ``chunk_threads`` threads in flight instead of S, which is what keeps the
  memory system busy: measured on an H100 at (16, 4096, 256) float32 (S = 4096), one thread
  per sequence reached 3.6% of the copy bandwidth. The price is reading a and b twice (five
  passes over the data instead of three).
- otherwise a block scan with carries across blocks: each thread block scans a tile of
  ``tile`` consecutive steps of one sequence in shared memory (Hillis-Steele over the affine
  maps, composed as (A2 A1, A2 H1 + H2)) and writes the tile's aggregate (``_tile_reduce``);
  ``_chunk_carries`` scans the aggregates; every tile is scanned again and applied to its
  carry (``_tile_apply``). The scan's depth is log2(tile) per tile plus T / tile for the
  carries.

Shared-memory accumulators are float64 for real inputs and complex128 for complex ones.
Backward is the fused reverse walk: one thread per sequence (``_rows_backward``) when
``S >= rows_min``, else the same three chunk passes run backwards over the adjoint recurrence
g_k = dh_k + conj(a_{k+1}) g_{k+1} (``_chunk_reduce_adjoint``, ``_chunk_carries``,
``_chunk_apply_adjoint``).
"""

from __future__ import annotations

from numba import complex128, cuda, float64

from .._backend import launch_views

__all__ = ["linear_scan", "linear_scan_backward", "MAX_TILE"]

MAX_TILE = 256  # shared-memory tile (threads per block of the block scan); a power of two
# Launch settings; the tests lower them under the simulator to cross tile boundaries.
tile = MAX_TILE
seq_threads = 128
rows_min = 1 << 16  # at least this many sequences: one thread per sequence
seq_min = 2048  # at least this many (and fewer than rows_min): chunks; fewer still: tiles
chunk_threads = 1 << 18  # aim for this many (chunk, sequence) threads
min_chunk = 16  # steps per chunk at the least
max_chunks = 4096  # the carries are scanned serially per sequence


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
def _fill_zero(out):
    """out (B, D) = 0, one thread per entry (no host array uploaded)."""
    i = cuda.grid(1)
    if i < out.shape[0] * out.shape[1]:
        out[i // out.shape[1], i % out.shape[1]] = 0


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
def _chunk_carries(A, H, init, carry, descending):
    """The state entering each chunk, one thread per sequence s: carry[first, s] = init[s],
    then carry[next] = A[c] carry[c] + H[c], chunks in ascending order (the forward) or
    descending (the adjoint)."""
    s = cuda.grid(1)
    C, S = carry.shape
    if s >= S:
        return
    D = init.shape[1]
    state = init[s // D, s % D]
    for j in range(C):
        c = C - 1 - j if descending else j
        carry[c, s] = state
        state = A[c, s] * state + H[c, s]


# ---- chunks along T: (chunk, sequence) threads ---------------------------------------------

@cuda.jit(device=True)
def _chunk_of(n, S, D, L, T):
    """Thread n's chunk c, batch row i, feature d, sequence s and step range [k0, k1)."""
    c, s = n // S, n % S
    k0 = c * L
    return c, s // D, s % D, s, k0, min(k0 + L, T)


@cuda.jit
def _chunk_reduce(a, b, A, H, reverse, L):
    """(A, H)[c, s]: the affine map of steps [c L, (c+1) L) of sequence s."""
    n = cuda.grid(1)
    C, S = A.shape
    B, T, D = a.shape
    if n >= C * S:
        return
    c, i, d, s, k0, k1 = _chunk_of(n, S, D, L, T)
    pa = a[i, _index_dev(k0, T, reverse), d] * 0 + 1  # one, in a's type
    ph = pa * 0
    for k in range(k0, k1):
        t = _index_dev(k, T, reverse)
        at = a[i, t, d]
        pa = at * pa
        ph = at * ph + b[i, t, d]
    A[c, s] = pa
    H[c, s] = ph


@cuda.jit
def _chunk_apply(a, b, carry, out, reverse, L):
    """Walk each chunk again from its incoming state, writing h."""
    n = cuda.grid(1)
    C, S = carry.shape
    B, T, D = a.shape
    if n >= C * S:
        return
    c, i, d, s, k0, k1 = _chunk_of(n, S, D, L, T)
    h = carry[c, s]
    for k in range(k0, k1):
        t = _index_dev(k, T, reverse)
        h = a[i, t, d] * h + b[i, t, d]
        out[i, t, d] = h


@cuda.jit(device=True)
def _adjoint_coef(a, i, d, k, T, reverse):
    """conj(a_{k+1}), the coefficient of g_{k+1} in g_k (zero past the end)."""
    if k + 1 < T:
        return a[i, _index_dev(k + 1, T, reverse), d].conjugate()
    return a[i, _index_dev(k, T, reverse), d] * 0


@cuda.jit
def _chunk_reduce_adjoint(dh, a, A, H, reverse, L):
    """(A, H)[c, s]: the map g_{k1} -> g_{k0} of the adjoint recurrence over chunk c."""
    n = cuda.grid(1)
    C, S = A.shape
    B, T, D = a.shape
    if n >= C * S:
        return
    c, i, d, s, k0, k1 = _chunk_of(n, S, D, L, T)
    pa = a[i, _index_dev(k0, T, reverse), d] * 0 + 1
    ph = pa * 0
    for j in range(k1 - k0):
        k = k1 - 1 - j
        coef = _adjoint_coef(a, i, d, k, T, reverse)
        pa = coef * pa
        ph = coef * ph + dh[i, _index_dev(k, T, reverse), d]
    A[c, s] = pa
    H[c, s] = ph


@cuda.jit
def _chunk_apply_adjoint(dh, a, h, h0, carry, da, db, dh0, reverse, L):
    """Walk each chunk backwards from g_{k1} = carry: db = g, da_k = g_k conj(h_{k-1})."""
    n = cuda.grid(1)
    C, S = carry.shape
    B, T, D = a.shape
    if n >= C * S:
        return
    c, i, d, s, k0, k1 = _chunk_of(n, S, D, L, T)
    g = carry[c, s]
    for j in range(k1 - k0):
        k = k1 - 1 - j
        t = _index_dev(k, T, reverse)
        g = _adjoint_coef(a, i, d, k, T, reverse) * g + dh[i, t, d]
        db[i, t, d] = g
        if k > 0:
            da[i, t, d] = g * h[i, _index_dev(k - 1, T, reverse), d].conjugate()
        else:
            da[i, t, d] = g * h0[i, d].conjugate()
            dh0[i, d] = a[i, t, d].conjugate() * g


def _grid(n, threads):
    return max(1, (n + threads - 1) // threads), threads


def _chunking(S, T):
    """(number of chunks C, steps per chunk L) for S sequences of T steps."""
    C = max(1, min(-(-chunk_threads // S), -(-T // min_chunk), max_chunks))
    L = -(-T // C)
    return -(-T // L), L


def _chunk_buffers(a, C, S):
    """The per-chunk maps A, H and incoming states, (C, S) each, as Numba device arrays."""
    return tuple(cuda.device_array((C, S), a.dtype) for _ in range(3))


def linear_scan(a, b, h0, out, reverse):
    """h = scan(a, b) from h0 into ``out`` (B, T, D); returns ``out``."""
    B, T, D = a.shape
    S = B * D
    if S == 0 or T == 0:
        return out
    result = out
    a, b, h0, out = launch_views(a, b, h0, out)
    if S >= rows_min:
        blocks, threads = _grid(S, seq_threads)
        _rows_forward[blocks, threads](a, b, h0, out, reverse)
        return result
    if S >= seq_min:
        C, L = _chunking(S, T)
        A, H, carry = _chunk_buffers(a, C, S)
        blocks, threads = _grid(C * S, seq_threads)
        _chunk_reduce[blocks, threads](a, b, A, H, reverse, L)
        _chunk_carries[_grid(S, seq_threads)](A, H, h0, carry, False)
        _chunk_apply[blocks, threads](a, b, carry, out, reverse, L)
        return result
    C = (T + tile - 1) // tile
    A, H, carry = _chunk_buffers(a, C, S)
    complex_ = a.dtype.kind == "c"
    reduce_ = _tile_reduce_complex if complex_ else _tile_reduce_real
    apply_ = _tile_apply_complex if complex_ else _tile_apply_real
    reduce_[(C, S), tile](a, b, A, H, reverse)
    _chunk_carries[_grid(S, seq_threads)](A, H, h0, carry, False)
    apply_[(C, S), tile](a, b, carry, out, reverse)
    return result


def linear_scan_backward(dh, a, h, h0, da, db, dh0, reverse):
    """Fill da, db (B, T, D) and dh0 (B, D): the adjoint recurrence walked backwards, one
    thread per sequence or in chunks (see the module docstring)."""
    B, T, D = a.shape
    S = B * D
    if S == 0:
        return
    dh, a, h, h0, da, db, dh0 = launch_views(dh, a, h, h0, da, db, dh0)
    if S >= rows_min or T == 0:
        blocks, threads = _grid(S, seq_threads)
        _rows_backward[blocks, threads](dh, a, h, h0, da, db, dh0, reverse)
        return
    C, L = _chunking(S, T)
    A, H, carry = _chunk_buffers(a, C, S)
    blocks, threads = _grid(C * S, seq_threads)
    _chunk_reduce_adjoint[blocks, threads](dh, a, A, H, reverse, L)
    zeros = cuda.device_array(h0.shape, a.dtype)
    _fill_zero[_grid(S, seq_threads)](zeros)
    _chunk_carries[_grid(S, seq_threads)](A, H, zeros, carry, True)
    _chunk_apply_adjoint[blocks, threads](dh, a, h, h0, carry, da, db, dh0, reverse, L)
