"""The linear scan h_t = a_t * h_{t-1} + b_t on the GPU: Numba CUDA kernels.

Arrays (B, T, D) C-contiguous device arrays (CuPy, Numba device arrays, or NumPy arrays under
``NUMBA_ENABLE_CUDASIM=1``), one dtype (float32/64, complex64/128), outputs preallocated;
nothing is validated here (``nnkit.kernels.scan`` is the entry point).

Two strategies, chosen by the number of sequences S = B x D:

- ``S >= rows_min``: one thread per sequence walks T (``_rows_forward``, ``_rows_backward``);
  neighbouring threads read neighbouring features, so every step is one coalesced load of a
  and b and one store of h. Enough threads are in flight to keep the memory system busy.
- otherwise one single-pass kernel with a decoupled look-back (Merrill and Garland 2016), for
  the forward and for the backward. T is cut into chunks of ``steps_per_thread`` steps. A
  thread block holds ``Sg = min(S, block)`` neighbouring sequences and ``P = block // Sg``
  consecutive chunks of each; its thread (j, s) walks chunk j of sequence s and composes the
  chunk's affine map h -> A h + H. A Hillis-Steele scan over j in shared memory (maps composed
  as (A2 A1, A2 H1 + H2)) gives every thread the map of the block's chunks before its own,
  and the block's whole map. The block then publishes that map (flag 1) and looks back over
  its predecessors along T: a predecessor's published state (flag 2) ends the walk; its map
  (flag 1) is composed and the walk goes on. The block publishes its outgoing state (flag 2)
  and every thread walks its chunk again from its incoming state, writing h. Blocks take
  their place along T from a ticket counter (an atomic add), not from blockIdx, so a block
  waits only on blocks that already run: the hardware does not start blocks in index order.
  One launch instead of three; a and b are read twice (the second time mostly from L2), h
  written once.

  Memory order: a block writes its map or state, every thread fences (``threadfence``), and
  thread 0 raises the flag with an atomic; a reader's thread 0 reads the flag with an atomic,
  the block synchronises, and every thread fences before loading. The published maps and
  states are laid out (3, Q, G, width) with ``width`` a whole number of 128-byte lines, so no
  cache line holds a value that was not final when a block first read it.

The backward is the same single pass over the adjoint recurrence
g_k = dh_k + conj(a_{k+1}) g_{k+1}, with chunks taken in descending order; then db = g,
da_k = g_k conj(h_{k-1}), dh0 = conj(a_0) g_0. Maps, states and the shared-memory scan are
in the storage dtype (float32 for float32 inputs, complex64 for complex64): a chunk's map
composes at most ``steps_per_thread`` steps and the look-back a product of maps, so a
state's rounding error grows with the steps it composes, as the one-thread-per-sequence
kernels' does.
"""

from __future__ import annotations

import numpy as np
from numba import complex64, complex128, cuda, float32, float64, int32

from ._launch import kernel_factory, launch
from .launchers import launchers

__all__ = [*launchers("scan_cpu", "scan_cuda"), "MAX_BLOCK"]

MAX_BLOCK = 256  # threads per block of the look-back scan at most (its shared-memory size)
# Launch settings; the tests lower them under the simulator to cross block boundaries.
block = MAX_BLOCK
seq_threads = 128  # threads per block of the one-thread-per-sequence kernels
rows_min = 1 << 16  # at least this many sequences: one thread per sequence
steps_per_thread = 16  # the length of a chunk
publish_states = True  # False (tests only): blocks publish maps alone, look-backs run to t = 0
LINE_BYTES = 128


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


@cuda.jit
def _fill_zero(out):
    """out (n,) = 0, one thread per entry (Numba device arrays have no memset)."""
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = 0


# ---- the single-pass look-back scan -----------------------------------------------------------

@cuda.jit(device=True)
def _take_place(status, sh, S, Sg, L, T):
    """The block's place from the ticket counter ``status[0]``, and the thread's.

    Returns (n, q, G, g, j, s, C): ticket n = q G + g (q: the block's place along T, g: its
    sequence group of G), the thread's chunk j within the block and sequence s, and the
    number of chunks C."""
    tid = cuda.threadIdx.x
    if tid == 0:
        sh[0] = cuda.atomic.add(status, 0, 1)
    cuda.syncthreads()
    n = sh[0]
    G = (S + Sg - 1) // Sg
    q, g = n // G, n % G
    j, s = tid // Sg, g * Sg + tid % Sg
    return n, q, G, g, j, s, (T + L - 1) // L


@cuda.jit(device=True)
def _raise_flag(status, n, value):
    """Publish: the block's writes become visible before flag n reads ``value``."""
    cuda.threadfence()
    cuda.syncthreads()
    if cuda.threadIdx.x == 0:
        cuda.atomic.max(status, 1 + n, value)


@cuda.jit(device=True)
def _wait_flag(status, n, sh):
    """Wait until block n has published something; its flag (1: map, 2: state) for all
    threads, with the block's loads ordered after it."""
    cuda.syncthreads()  # everyone has read the previous flag from sh[1]
    if cuda.threadIdx.x == 0:
        f = cuda.atomic.add(status, 1 + n, 0)
        while f == 0:
            f = cuda.atomic.add(status, 1 + n, 0)
        sh[1] = f
    cuda.syncthreads()
    cuda.threadfence()
    return sh[1]


@cuda.jit(device=True)
def _block_scan(pa, ph, j, P, Sg, bufA, bufH, one):
    """Inclusive scan over the block's chunks j = 0..P-1 (stride Sg in the buffers).

    Returns the thread's exclusive prefix (EA, EH) (the identity for j = 0) and the block's
    whole map (TA, TH) for the thread's sequence; ``one``: 1 in the scan's type."""
    tid = cuda.threadIdx.x
    bufA[tid] = pa
    bufH[tid] = ph
    cuda.syncthreads()
    off = 1
    while off < P:
        if j >= off:
            qa, qh = bufA[tid - off * Sg], bufH[tid - off * Sg]
        cuda.syncthreads()
        if j >= off:
            ca = bufA[tid]
            bufH[tid] = ca * qh + bufH[tid]
            bufA[tid] = ca * qa
        cuda.syncthreads()
        off *= 2
    last = (P - 1) * Sg + tid % Sg
    TA, TH = bufA[last], bufH[last]
    zero = one - one
    EA, EH = pa * zero + one, ph * zero  # the identity (NaN where the map is)
    if j > 0:
        EA, EH = bufA[tid - Sg], bufH[tid - Sg]
    cuda.syncthreads()  # the buffers are free again
    return EA, EH, TA, TH


@cuda.jit(device=True)
def _look_back(desc, status, sh, n, q, G, g, sl, valid, writer, TA, TH, init, publish, one):
    """The state entering block q for the thread's sequence (``sl`` within group g): ``init``
    for q = 0, else composed from the published maps and states of blocks q-1, q-2, ...
    Publishes the block's map (TA, TH) and, with ``publish``, its outgoing state. ``one``: 1
    in the scan's type."""
    zero = one - one
    incoming = TA * zero + init
    if q > 0:
        if writer:
            desc[0, q, g, sl] = TA
            desc[1, q, g, sl] = TH
        _raise_flag(status, n, 1)
        ma, mh = TA * zero + one, TH * zero  # the maps of blocks r+1..q-1, composed
        r = q - 1
        while True:
            f = _wait_flag(status, r * G + g, sh)
            if f == 2:
                if valid:
                    incoming = ma * desc[2, r, g, sl] + mh
                break
            if valid:
                mh = ma * desc[1, r, g, sl] + mh
                ma = ma * desc[0, r, g, sl]
            r -= 1
    if publish or q == 0:
        if writer:
            desc[2, q, g, sl] = TA * incoming + TH
        _raise_flag(status, n, 2)
    return incoming


@cuda.jit(device=True)
def _forward_body(a, b, h0, out, desc, status, reverse, L, Sg, P, publish, bufA, bufH, sh,
                  one):
    B, T, D = a.shape
    n, q, G, g, j, s, C = _take_place(status, sh, B * D, Sg, L, T)
    c = q * P + j
    valid = s < B * D
    active = valid and c < C
    i, d = (s // D, s % D) if valid else (0, 0)
    k0, k1 = c * L, min(c * L + L, T)
    zero = one - one
    pa, ph = one, zero
    if active:
        for k in range(k0, k1):
            t = _index_dev(k, T, reverse)
            at = a[i, t, d]
            pa = at * pa
            ph = at * ph + b[i, t, d]
    EA, EH, TA, TH = _block_scan(pa, ph, j, P, Sg, bufA, bufH, one)
    sl = s - g * Sg
    incoming = _look_back(desc, status, sh, n, q, G, g, sl, valid, valid and j == 0, TA, TH,
                          h0[i, d], publish, one)
    if active:
        h = EA * incoming + EH
        for k in range(k0, k1):
            t = _index_dev(k, T, reverse)
            h = a[i, t, d] * h + b[i, t, d]
            out[i, t, d] = h


@cuda.jit(device=True)
def _adjoint_coef(a, i, d, k, T, reverse, zero):
    """conj(a_{k+1}), the coefficient of g_{k+1} in g_k (zero past the end)."""
    if k + 1 < T:
        return a[i, _index_dev(k + 1, T, reverse), d].conjugate()
    return a[i, _index_dev(k, T, reverse), d] * zero


@cuda.jit(device=True)
def _backward_body(dh, a, h, h0, da, db, dh0, desc, status, reverse, L, Sg, P, publish,
                   bufA, bufH, sh, one):
    """The forward's pass on the adjoint recurrence: place q along T counts chunks from the
    end, and every chunk is walked from its last step down."""
    B, T, D = a.shape
    n, q, G, g, j, s, C = _take_place(status, sh, B * D, Sg, L, T)
    c = C - 1 - (q * P + j)
    valid = s < B * D
    active = valid and c >= 0
    i, d = (s // D, s % D) if valid else (0, 0)
    k0, k1 = c * L, min(c * L + L, T)
    zero = one - one
    pa, ph = one, zero
    if active:
        for m in range(k1 - k0):
            k = k1 - 1 - m
            coef = _adjoint_coef(a, i, d, k, T, reverse, zero)
            pa = coef * pa
            ph = coef * ph + dh[i, _index_dev(k, T, reverse), d]
    EA, EH, TA, TH = _block_scan(pa, ph, j, P, Sg, bufA, bufH, one)
    sl = s - g * Sg
    incoming = _look_back(desc, status, sh, n, q, G, g, sl, valid, valid and j == 0, TA, TH,
                          zero, publish, one)
    if active:
        gk = EA * incoming + EH
        for m in range(k1 - k0):
            k = k1 - 1 - m
            t = _index_dev(k, T, reverse)
            gk = _adjoint_coef(a, i, d, k, T, reverse, zero) * gk + dh[i, t, d]
            db[i, t, d] = gk
            if k > 0:
                da[i, t, d] = gk * h[i, _index_dev(k - 1, T, reverse), d].conjugate()
            else:
                da[i, t, d] = gk * h0[i, d].conjugate()
                dh0[i, d] = a[i, t, d].conjugate() * gk


@kernel_factory
def _forward_kernel(scalar_name):
    """The forward kernel for arrays of ``scalar_name`` ("float32", "float64", "complex64",
    "complex128"), its arithmetic and shared-memory scan in that type."""
    scalar = _SCALARS[scalar_name]

    @cuda.jit
    def kernel(a, b, h0, out, desc, status, reverse, L, Sg, P, publish):
        bufA = cuda.shared.array(MAX_BLOCK, scalar)
        bufH = cuda.shared.array(MAX_BLOCK, scalar)
        sh = cuda.shared.array(2, int32)
        _forward_body(a, b, h0, out, desc, status, reverse, L, Sg, P, publish, bufA, bufH,
                      sh, scalar(1.0))
    return kernel


@kernel_factory
def _backward_kernel(scalar_name):
    """The backward kernel for arrays of ``scalar_name`` (as ``_forward_kernel``'s)."""
    scalar = _SCALARS[scalar_name]

    @cuda.jit
    def kernel(dh, a, h, h0, da, db, dh0, desc, status, reverse, L, Sg, P, publish):
        bufA = cuda.shared.array(MAX_BLOCK, scalar)
        bufH = cuda.shared.array(MAX_BLOCK, scalar)
        sh = cuda.shared.array(2, int32)
        _backward_body(dh, a, h, h0, da, db, dh0, desc, status, reverse, L, Sg, P, publish,
                       bufA, bufH, sh, scalar(1.0))
    return kernel


_SCALARS = {"float32": float32, "float64": float64, "complex64": complex64,
            "complex128": complex128}
_FORWARD = {name: _forward_kernel(name) for name in _SCALARS}  # by the arrays' dtype name
_BACKWARD = {name: _backward_kernel(name) for name in _SCALARS}


# ---- host side --------------------------------------------------------------------------------

def _grid(n, threads):
    return max(1, (n + threads - 1) // threads), threads


def _layout(S, T):
    """(Sg sequences and P chunks per block, L steps per chunk, Q places along T, G groups)."""
    Sg = min(S, block)
    P = block // Sg
    L = max(1, min(steps_per_thread, T))
    C = -(-T // L)
    return Sg, P, L, -(-C // P), -(-S // Sg)


def _look_back_buffers(like, Q, G, Sg):
    """The published maps and states (3, Q, G, width) in ``like``'s dtype, and the zeroed
    status (the ticket counter, then one flag per block), on ``like``'s device."""
    dtype = np.dtype(like.dtype)
    per_line = LINE_BYTES // dtype.itemsize
    width = -(-Sg // per_line) * per_line
    shape, n_status = (3, Q, G, width), 1 + Q * G
    module = type(like).__module__
    if module.startswith("cupy"):
        import cupy

        return cupy.empty(shape, dtype), cupy.zeros(n_status, np.int32)
    if isinstance(like, np.ndarray):  # the simulator
        return np.empty(shape, dtype), np.zeros(n_status, np.int32)
    status = cuda.device_array(n_status, np.int32)
    launch(_fill_zero, *_grid(n_status, seq_threads), status)
    return cuda.device_array(shape, dtype), status


def linear_scan(a, b, h0, out, reverse):
    """h = scan(a, b) from h0 into ``out`` (B, T, D); returns ``out``."""
    B, T, D = a.shape
    S = B * D
    if S == 0 or T == 0:
        return out
    result = out
    if S >= rows_min:
        launch(_rows_forward, *_grid(S, seq_threads), a, b, h0, out, reverse)
        return result
    Sg, P, L, Q, G = _layout(S, T)
    desc, status = _look_back_buffers(a, Q, G, Sg)
    kernel = _FORWARD[np.dtype(a.dtype).name]
    launch(kernel, Q * G, P * Sg, a, b, h0, out, desc, status, reverse, L, Sg, P, publish_states)
    return result


def linear_scan_backward(dh, a, h, h0, da, db, dh0, reverse):
    """Fill da, db (B, T, D) and dh0 (B, D): the adjoint recurrence walked backwards, one
    thread per sequence or in one look-back pass (see the module docstring)."""
    B, T, D = a.shape
    S = B * D
    if S == 0:
        return
    if S >= rows_min or T == 0:
        launch(_rows_backward, *_grid(S, seq_threads), dh, a, h, h0, da, db, dh0, reverse)
        return
    Sg, P, L, Q, G = _layout(S, T)
    desc, status = _look_back_buffers(a, Q, G, Sg)
    kernel = _BACKWARD[np.dtype(a.dtype).name]
    launch(kernel, Q * G, P * Sg, dh, a, h, h0, da, db, dh0, desc, status, reverse, L, Sg, P,
           publish_states)
