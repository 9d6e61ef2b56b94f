"""Associative memories: the Hopfield network, dense associative memories, modern Hopfield.

Notes §1.4: n binary neurons X in {-1, +1}^n, energy
H(X) = -1/2 sum_ij w_ij X_i X_j - sum_i b_i X_i, w_ii = 0, w_ij = w_ji; the dynamics
X_i <- sgn(h_i), h_i = sum_j w_ij X_j + b_i, sgn(z) = +1 for z >= 0, -1 otherwise; Hebbian
storage W = (1/n) sum_t x_t x_t^T (with the diagonal set to zero). The biases b (``bias=``,
default none) enter with this sign in both places; notes §1.4 writes the same model with
thresholds theta = -b (energy + theta^T X, field W X - theta).

Exact arithmetic. ``Hopfield`` keeps the integer couplings C = n W (C_ij = sum_t x_ti x_tj)
in a float dtype that holds every field C x exactly (float32 while s n < 2^24, float64
otherwise). The signs, ties sgn(0) = +1 included, are therefore exact, the cached fields of the
asynchronous kernel equal a recomputation bit for bit, and every kernel equals its naive twin
(``reference_async``, ``reference_sync``) exactly. ``weights_`` is C / n in float64.

Biases. Neuron i takes +1 iff (C x)_i >= t_i, t = -n b rounded once to float64: an exact
comparison of the exact integer field, the one rounding being that of n b (the twins take the
same t). Without biases (``bias=None``) the kernels run their code for none, as before.

GPU. ``Hopfield.run`` on CuPy states runs on their GPU (dense storage): the couplings (and
the patterns' copies the fields are made from) go there at the first such call and stay
until the next ``store``; the asynchronous kernel runs one block per state in the CPU's order
of the neurons, so both devices give the same results bit for bit.

Storage. A dense C costs n^2 floats. ``storage='patterns'`` keeps only the patterns (int8,
s n bytes) and computes the fields as n h = Xi^T (Xi x) - s x: n = 100,000 at s = 5,000 needs
500 MB instead of the 40 GB of a float32 W. ``storage='auto'`` picks it when C would pass
``DENSE_MAX_BYTES``.
"""

from __future__ import annotations

import math
import numbers
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from .._backend import array_module, is_gpu_array
from .._budget import reserve
from .._random import get_rng, splitmix64
from .._validation import check_array, check_choice, check_scalar
from ..kernels import (
    dense_memory_async_run,
    hopfield_async_run,
    hopfield_async_run_patterns,
    hopfield_init_fields,
    hopfield_sync_run,
    softmax_forward,
)

MODELS = ["Hopfield", "HopfieldResult", "DenseAssociativeMemory", "ModernHopfield",
          "RetrievalCurve", "retrieval_curve"]  # what nk.classic re-exports
__all__ = [*MODELS, "reference_async", "reference_sync", "reference_dense_async", "random_orders",
           "DENSE_MAX_BYTES"]

DENSE_MAX_BYTES = 2 << 30  # storage='auto' keeps a dense C up to 2 GiB
_EXACT32 = 1 << 24
_BLOCK = 2048  # neurons per block of the pattern-storage field products (s x 2048 floats)
_PARALLEL_MIN = 1 << 16
_CPUS = os.cpu_count() or 1  # states x neurons below which one thread runs the batch


# ---- validation -----------------------------------------------------------------------------

def _spins(x, *, name, n=None, ndim=(1, 2), allow_device=False):
    """``x`` checked to hold only -1 and +1 (any int or float dtype), as a C-contiguous int8
    array of its shape on its device (a GPU array only with ``allow_device``); ``n`` the
    required last dimension."""
    x = check_array(x, name=name, ndim=ndim, allow_device=allow_device)
    xp = array_module(x)
    if x.dtype.kind not in "iuf":
        raise TypeError(f"{name} must hold numbers -1 and +1, got dtype {x.dtype}")
    if x.dtype.kind == "f" and not xp.isfinite(x).all():
        raise ValueError(f"{name} must be finite, but it holds NaN or infinity")
    if n is not None and x.shape[-1] != n:
        raise ValueError(f"{name} has {x.shape[-1]} neurons in its last dimension but the "
                         f"network has n_neurons={n}; expected shape (..., {n})")
    if x.size and not xp.all((x == 1) | (x == -1)):
        bad = x[(x != 1) & (x != -1)].ravel()[0].item()  # a Python number on either device
        raise ValueError(f"{name} must hold only -1 and +1 (spins); found {bad!r}")
    return xp.ascontiguousarray(x, dtype=np.int8)


def _patterns(patterns, n):
    patterns = _spins(patterns, name="patterns", n=n, ndim=2)
    if patterns.shape[0] == 0:
        raise ValueError("patterns is empty: store at least one pattern, shape (s, "
                         f"{n}) with s >= 1")
    return patterns


def _bias(bias, n):
    """``bias`` None, or checked to be n finite real numbers: a read-only float64 (n,)."""
    if bias is None:
        return None
    b = check_array(bias, name="bias", ndim=1, finite=True, allow_device=False)
    if b.dtype.kind not in "iuf":
        raise TypeError(f"bias must hold real numbers (a float array of shape ({n},)), got "
                        f"dtype {b.dtype}")
    if b.shape[0] != n:
        raise ValueError(f"bias has {b.shape[0]} entries but the network has n_neurons={n}; "
                         f"expected shape ({n},)")
    b = np.array(b, dtype=np.float64)
    limit = np.finfo(np.float64).max / (2 * n)  # n b (the thresholds) and b^T x stay finite
    if b.size and np.abs(b).max() > limit:
        raise ValueError(f"bias entries must be at most {limit:.3g} in magnitude for "
                         f"n_neurons={n} (n |b_i| must stay a finite float), got "
                         f"{np.abs(b).max():.3g}")
    b.flags.writeable = False
    return b


def _n_neurons(n):
    return int(check_scalar(n, name="n_neurons", kind=numbers.Integral, low=1))


def _max_sweeps(max_sweeps):
    return int(check_scalar(max_sweeps, name="max_sweeps", kind=numbers.Integral, low=1,
                            high=2**62))  # the compiled loops count in int64


def _not_fitted(obj):
    if getattr(obj, "patterns_", None) is None:
        raise ValueError(f"this {type(obj).__name__} has no stored patterns; call "
                         "store(patterns) first")


# ---- results --------------------------------------------------------------------------------

@dataclass
class HopfieldResult:
    """The outcome of ``run``.

    Attributes
    ----------
    states : ndarray int8, the input's shape (n,) or (B, n)
        Final states.
    sweeps : int or ndarray int64 (B,)
        Sweeps (async: n visits each; sync: steps) run per state, the last one, which
        changed nothing, included when converged.
    converged : bool or ndarray bool (B,)
        Whether the state reached a fixed point within ``max_sweeps``.
    """

    states: np.ndarray
    sweeps: int | np.ndarray
    converged: bool | np.ndarray


def _result(states, sweeps, converged, single):
    if single:
        return HopfieldResult(states[0], int(sweeps[0]), bool(converged[0]))
    return HopfieldResult(states, sweeps, converged.astype(bool))


_MASK64 = (1 << 64) - 1


def _seed(random_state):
    """The kernels' RNG seed: ``random_state`` itself when it is an int >= 0, else 63 bits
    drawn from ``get_rng(random_state)`` (the global generator for None)."""
    if isinstance(random_state, numbers.Integral) and not isinstance(random_state, bool):
        if random_state < 0:
            raise ValueError(f"random_state must be >= 0, got {random_state}")
        return int(random_state) & _MASK64
    return int(get_rng(random_state).integers(0, 1 << 63))


def random_orders(n, n_sweeps, seed):
    """The neuron orders of ``run(order='random', random_state=seed)``, (n_sweeps, n) int64.

    The kernels start from 0..n-1 and, before every sweep, apply a Fisher-Yates shuffle
    (i = n-1 .. 1: swap entries i and ((z >> 32) (i + 1)) >> 32, Lemire's multiply-shift)
    driven by splitmix64 seeded with ``seed`` (see ``_seed``; ``nnkit._random.splitmix64``).
    Plain Python, for the twins and the tests.
    """
    order, out, per_sweep = list(range(n)), [], max(n - 1, 0)
    for sweep in range(n_sweeps):  # draw k of the stream is splitmix64(seed, k)
        draws = splitmix64(seed, np.arange(sweep * per_sweep, (sweep + 1) * per_sweep))
        for i, z in zip(range(n - 1, 0, -1), draws.tolist(), strict=True):
            j = ((z >> 32) * (i + 1)) >> 32
            order[i], order[j] = order[j], order[i]
        out.append(list(order))
    return np.array(out, dtype=np.int64).reshape(n_sweeps, n)


def _threaded(fn, rows, n, n_jobs):
    """Run ``fn(rows_part)`` over contiguous parts of ``rows`` on ``n_jobs`` threads (the
    kernel releases the GIL); one thread when the work is small."""
    if n_jobs == 1 or rows.size < 2 or rows.size * n < _PARALLEL_MIN:
        fn(rows)
        return
    n_jobs = n_jobs or _CPUS
    parts = np.array_split(rows, min(n_jobs, rows.size))
    with ThreadPoolExecutor(len(parts)) as pool:
        list(pool.map(fn, parts))


# ---- the Hopfield network -------------------------------------------------------------------

class _StoresPatterns:
    """What ``nk.save`` keeps of a network: its patterns; ``nk.load`` stores them again."""

    def _nnkit_fitted(self) -> dict:
        return {} if self.patterns_ is None else {"patterns_": self.patterns_}

    def _nnkit_restore(self, fitted: dict) -> None:
        if "patterns_" in fitted:
            self.store(fitted["patterns_"])


class Hopfield(_StoresPatterns):
    """Hopfield network of ``n_neurons`` binary neurons with Hebbian storage.

    Parameters
    ----------
    n_neurons : int >= 1
    storage : {'auto', 'dense', 'patterns'}
        'dense' keeps C = n W (n, n); 'patterns' keeps the patterns (s, n) int8 and computes
        fields as n h = Xi^T (Xi x) - s x (O(s) per asynchronous visit instead of O(1), but
        s n bytes instead of 4 n^2); 'auto' is 'dense' unless C would need more than
        ``DENSE_MAX_BYTES``.
    bias : array_like (n,) of real numbers, optional
        Biases b of the local field h = W x + b and of the energy
        E = -1/2 x^T W x - b^T x (notes §1.4, whose thresholds are -b). None: no
        biases, the code path and the numbers of a network without them. A large
        |b_i| > sum_j |W_ij| pins neuron i to sgn(b_i).

    Attributes
    ----------
    bias : ndarray float64 (n,) or None
        The biases, read-only.
    patterns_ : ndarray int8 (s, n)
    couplings_ : ndarray float32 or float64 (n, n), dense storage only
        C = sum_t x_t x_t^T with zero diagonal (integers).
    weights_ : ndarray float64 (n, n)
        W = C / n, symmetric, zero diagonal (computed on access).

    Examples
    --------
    >>> import numpy as np
    >>> xi = np.random.default_rng(0).choice([-1, 1], size=(3, 100))
    >>> net = Hopfield(100).store(xi)
    >>> noisy = xi[0].copy(); noisy[:10] *= -1
    >>> bool((net.run(noisy, random_state=0).states == xi[0]).all())
    True
    """

    def __init__(self, n_neurons, storage="auto", bias=None):
        self.n_neurons = _n_neurons(n_neurons)
        self.storage = check_choice(storage, name="storage",
                                    choices=("auto", "dense", "patterns"))
        self.bias = _bias(bias, self.n_neurons)
        # the kernels' thresholds: +1 iff (C x)_i >= t_i, C = n W (see the module docstring)
        self._thresholds = None if self.bias is None else -(self.n_neurons * self.bias)
        self.patterns_ = None
        self.couplings_ = None
        self._on_devices = {}

    # -- storage --
    def store(self, patterns, rule="hebbian"):
        """Store ``patterns`` (s, n) in {-1, +1}: C = sum_t x_t x_t^T, diagonal zeroed.

        Replaces what was stored before. Returns ``self``.
        """
        check_choice(rule, name="rule", choices=("hebbian",))
        xi = _patterns(patterns, self.n_neurons)
        s, n = xi.shape
        dtype = np.float32 if s * n < _EXACT32 else np.float64
        dense_bytes = n * n * np.dtype(dtype).itemsize
        self.storage_ = ("dense" if self.storage == "dense" or
                         (self.storage == "auto" and dense_bytes <= DENSE_MAX_BYTES)
                         else "patterns")
        if s * n >= 1 << 53:
            raise ValueError(f"patterns of shape {xi.shape}: fields up to s n = {s * n} are "
                             "not exact in float64 (s n must be < 2^53)")
        self.patterns_t_ = np.ascontiguousarray(xi.T)  # (n, s), the one copy kept
        self.patterns_ = self.patterns_t_.T  # (s, n) view
        del xi
        self.couplings_ = self._patterns_f = self._patterns_rows_f = None
        self._patterns_rows_i8 = None
        self._on_devices = {}  # (attribute, device) -> its copy there (``_like``)
        if self.storage_ == "dense":
            reserve(n * n * np.dtype(dtype).itemsize, f"the couplings of n_neurons={n}, "
                    "storage='dense'")
            xi = self.patterns_
            xf = xi.astype(dtype)
            c = xf.T @ xf  # (n, n), integers, exact in dtype
            np.fill_diagonal(c, 0)
            self.couplings_ = c
            if 2 * s < n:  # fields from the overlaps: C x = Xi^T (Xi x) - s x, 2sn < n^2
                self._patterns_f = self.patterns_t_.astype(dtype)  # (n, s)
                self._patterns_rows_f = np.ascontiguousarray(self._patterns_f.T)  # (s, n)
                self._patterns_rows_i8 = np.ascontiguousarray(self.patterns_)  # (s, n)
        self._dtype = dtype
        return self

    @property
    def weights_(self):
        """W = C / n (n, n) float64, symmetric with zero diagonal."""
        _not_fitted(self)
        if self.couplings_ is not None:
            return self.couplings_.astype(np.float64) / self.n_neurons
        if 8 * self.n_neurons ** 2 > DENSE_MAX_BYTES:
            raise ValueError(f"weights_ of n_neurons={self.n_neurons} would need "
                             f"{8 * self.n_neurons ** 2 / 2**30:.1f} GiB; this network keeps "
                             "its patterns instead (storage='patterns'): use field()")
        xf = self.patterns_.astype(np.float64)
        w = xf.T @ xf
        np.fill_diagonal(w, 0)
        return w / self.n_neurons

    def _like(self, name, x):
        """The array attribute ``name`` where ``x`` lives: itself for a NumPy ``x``, else its
        copy on that device, made at the first call and kept until the next ``store``."""
        host = getattr(self, name)
        if host is None:
            return None
        key = (name, getattr(getattr(x, "device", None), "id", None))  # a GPU's number
        out = self._on_devices.get(key)
        if out is None:
            out = self._on_devices[key] = array_module(x).asarray(host)
        return out

    def _int_fields(self, x8):
        """n h = C x for int8 states (B, n), exact, in the couplings' dtype (B, n), on the
        states' device (dense storage; on the GPU, CuPy's products: exact IEEE sums of
        integers unless CUPY_TF32=1 asks for TF32)."""
        xp = array_module(x8)
        if self.couplings_ is not None and self._patterns_f is None:
            return xp.ascontiguousarray(x8.astype(self._dtype) @ self._like("couplings_", x8))
        if self.couplings_ is not None:  # s < n/2: C x = Xi^T (Xi x) - s x, 2sn < n^2 flops
            xf = x8.astype(self._dtype)
            h = (xf @ self._like("_patterns_f", x8)) @ self._like("_patterns_rows_f", x8)
            h -= self.patterns_t_.shape[1] * xf  # (B, s) then (B, n)
            return xp.ascontiguousarray(h)
        out = np.empty(x8.shape, np.float64)
        m = self._overlaps(x8).astype(np.float64)  # (B, s)
        s = self.patterns_t_.shape[1]
        for a in range(0, self.n_neurons, _BLOCK):  # blocks of neurons: (B, _BLOCK)
            block = self.patterns_t_[a:a + _BLOCK].astype(np.float64)  # (_BLOCK, s)
            out[:, a:a + _BLOCK] = m @ block.T - s * x8[:, a:a + _BLOCK]
        return out

    def _overlaps(self, x8):
        """m = x Xi^T (B, s) int64, exact (float64 BLAS on integers), in blocks of neurons."""
        m = np.zeros((x8.shape[0], self.patterns_t_.shape[1]), np.float64)
        for a in range(0, self.n_neurons, _BLOCK):
            m += x8[:, a:a + _BLOCK].astype(np.float64) @ self.patterns_t_[a:a + _BLOCK].astype(
                np.float64)
        return np.rint(m).astype(np.int64)

    # -- measurements --
    def field(self, states):
        """Local fields h = W x + b: states (n,) or (B, n) in {-1, +1} -> float64, same
        shape."""
        _not_fitted(self)
        x8 = _spins(states, name="states", n=self.n_neurons)
        h = self._int_fields(np.atleast_2d(x8)).astype(np.float64) / self.n_neurons
        if self.bias is not None:
            h += self.bias
        return h.reshape(x8.shape)

    def energy(self, states):
        """E(x) = -1/2 x^T W x - b^T x: states (n,) -> float, (B, n) -> ndarray float64
        (B,)."""
        _not_fitted(self)
        x8 = _spins(states, name="states", n=self.n_neurons)
        x2 = np.atleast_2d(x8)
        h = self._int_fields(x2).astype(np.float64)
        e = -0.5 * np.einsum("bi,bi->b", x2.astype(np.float64), h) / self.n_neurons
        if self.bias is not None:
            e -= x2.astype(np.float64) @ self.bias
        return float(e[0]) if x8.ndim == 1 else e

    def crosstalk(self, patterns=None):
        """Crosstalk C_ti = h_i(x_t) - x_ti of notes §1.4: x_t is a fixed point of the dynamics
        iff sgn(x_ti + C_ti) = x_ti for every i. patterns (s, n), default the stored ones ->
        ndarray float64 (s, n). For random patterns C_ti ~ N(0, s/n) approximately
        (plus b_i with biases)."""
        _not_fitted(self)
        xi = self.patterns_ if patterns is None else _patterns(patterns, self.n_neurons)
        return self.field(xi) - xi

    # -- dynamics --
    def run(self, states, mode="async", order="random", max_sweeps=100, random_state=None,
            n_jobs=None):
        """Run the dynamics x_i <- sgn(h_i), h = W x + b, from ``states`` until a fixed point
        or ``max_sweeps``.

        Parameters
        ----------
        states : array_like (n,) or (B, n) in {-1, +1}
            A CuPy array runs on its GPU (dense storage only) and gives CuPy arrays: the
            CPU's results, bit for bit, for the same arguments and seed.
        mode : {'async', 'sync'}
            'async': one neuron at a time (energy never increases; converges). 'sync': all
            neurons at once, x <- sgn(W x + b) (may end in a 2-cycle: converged False).
        order : {'random', 'sequential'}
            Async visiting order: a fresh random permutation per sweep (``random_orders``,
            seeded by ``random_state``; every state of a batch sees the same permutations,
            so a batch equals its states run one by one), or 0..n-1.
        max_sweeps : int >= 1
        random_state : None, int >= 0 or numpy.random.Generator
            An int is the seed of the kernels' splitmix64 stream itself.
        n_jobs : int, optional
            Threads over the batch (default: all cores; small batches run on one). States on
            a GPU run in one launch.

        Returns
        -------
        HopfieldResult
        """
        _not_fitted(self)
        mode = check_choice(mode, name="mode", choices=("async", "sync"))
        order = check_choice(order, name="order", choices=("random", "sequential"))
        max_sweeps = _max_sweeps(max_sweeps)
        if n_jobs is not None:
            n_jobs = int(check_scalar(n_jobs, name="n_jobs", kind=numbers.Integral, low=1))
        x8 = _spins(states, name="states", n=self.n_neurons, allow_device=True)
        if is_gpu_array(x8) and self.storage_ == "patterns":
            raise TypeError("states on a GPU need the dense couplings: this network keeps "
                            "its patterns (storage='patterns'); pass NumPy states, or store "
                            "with storage='dense'")
        if is_gpu_array(x8):
            n_jobs = 1  # one launch runs the whole batch
        single = x8.ndim == 1
        xp = array_module(x8)
        x = xp.array(xp.atleast_2d(x8), order="C")  # (B, n), a copy run in place
        if mode == "sync":
            sweeps, conv = self._run_sync(x, max_sweeps)
        else:
            sweeps, conv = self._run_async(x, order == "random", _seed(random_state),
                                           max_sweeps, n_jobs)
        return _result(x, sweeps, conv, single)

    def _run_async(self, x, shuffle, seed, max_sweeps, n_jobs):
        B, xp = x.shape[0], array_module(x)
        sweeps, conv = xp.zeros(B, np.int64), xp.zeros(B, np.uint8)
        work, rows = xp.empty(x.shape, np.int32), xp.arange(B, dtype=np.int64)
        if self.storage_ == "patterns":
            m = self._overlaps(x)
            hopfield_async_run_patterns(self.patterns_t_, x, m, work, rows, max_sweeps, shuffle,
                                        np.uint64(seed), sweeps, conv, self._thresholds)
            return sweeps, conv
        init = self._patterns_f is not None  # fields per state in the worker threads
        h = xp.empty(x.shape, self._dtype) if init else self._int_fields(x)
        couplings, thresholds = self._like("couplings_", x), self._like("_thresholds", x)

        def part_run(part):
            if init:
                hopfield_init_fields(self._like("_patterns_rows_i8", x),
                                     self._like("_patterns_rows_f", x), x, h, part)
            hopfield_async_run(couplings, x, h, work, part, max_sweeps, shuffle, seed,
                               sweeps, conv, thresholds)
        _threaded(part_run, rows, self.n_neurons, n_jobs)
        return sweeps, conv

    def _run_sync(self, x, max_sweeps):
        B, xp = x.shape[0], array_module(x)
        sweeps, conv = xp.zeros(B, np.int64), xp.zeros(B, np.uint8)
        if self.storage_ == "patterns":
            return _sync_numpy(self._int_fields, x, max_sweeps, self._thresholds)
        h = self._int_fields(x)
        work = xp.empty(x.shape, np.int64)
        hopfield_sync_run(h, self._like("couplings_", x), x, work, max_sweeps, sweeps, conv,
                          self._like("_thresholds", x))
        return sweeps, conv


def _sync_numpy(int_fields, x, max_sweeps, thresholds=None):
    """Synchronous steps with full field recomputations (pattern storage); +1 iff
    (C x)_i >= t_i (t = 0 without biases)."""
    t = 0 if thresholds is None else thresholds
    B = x.shape[0]
    sweeps, conv = np.full(B, max_sweeps, np.int64), np.zeros(B, np.uint8)
    active = np.arange(B)
    for step in range(max_sweeps):
        new = np.where(int_fields(x[active]) >= t, 1, -1).astype(np.int8)
        same = (new == x[active]).all(axis=1)
        x[active] = new
        sweeps[active[same]], conv[active[same]] = step + 1, 1
        active = active[~same]
        if not active.size:
            break
    return sweeps, conv


# ---- naive twins ----------------------------------------------------------------------------

def reference_async(couplings, state, orders, max_sweeps, energy_trace=False,
                    thresholds=None):
    """Naive twin of the async dynamics: plain loops, each field recomputed from scratch.

    couplings : (n, n) integer-valued C = n W (sgn(W x) = sgn(C x)); state (n,) in {-1, +1};
    orders : (K, n) permutations, sweep k visiting ``orders[k % K]``; thresholds : (n,)
    floats t or None (zeros): x_i <- +1 iff (C x)_i >= t_i; for biases b, t = -n b.
    Returns (final state int8 (n,), sweeps, converged[, energies]): with ``energy_trace``,
    n E = -1/2 x^T C x + t^T x (= n (-1/2 x^T W x - b^T x)) after every single visit (the
    first entry is the initial energy), each computed exactly and rounded once to a float.
    """
    c = [[int(v) for v in row] for row in np.asarray(couplings)]
    x = [int(v) for v in state]
    n = len(x)
    t = [0] * n if thresholds is None else [float(v) for v in thresholds]
    trace = [_naive_energy(c, x, t)] if energy_trace else None
    for sweep in range(max_sweeps):
        flips = 0
        for i in orders[sweep % len(orders)]:
            h = sum(c[i][j] * x[j] for j in range(n))
            new = 1 if h >= t[i] else -1  # an int against a float: compared exactly
            flips += new != x[i]
            x[i] = new
            if energy_trace:
                trace.append(_naive_energy(c, x, t))
        if flips == 0:
            return _twin_out(x, sweep + 1, True, trace)
    return _twin_out(x, max_sweeps, False, trace)


def reference_sync(couplings, state, max_sweeps, thresholds=None):
    """Naive twin of the sync dynamics: x_i <- +1 iff (C x)_i >= t_i, all at once, plain
    loops (thresholds t as ``reference_async``). Returns (final state int8 (n,), sweeps,
    converged)."""
    c = [[int(v) for v in row] for row in np.asarray(couplings)]
    x = [int(v) for v in state]
    n = len(x)
    t = [0] * n if thresholds is None else [float(v) for v in thresholds]
    for sweep in range(max_sweeps):
        new = [1 if sum(c[i][j] * x[j] for j in range(n)) >= t[i] else -1 for i in range(n)]
        if new == x:
            return _twin_out(x, sweep + 1, True, None)
        x = new
    return _twin_out(x, max_sweeps, False, None)


def _naive_energy(c, x, t):
    """n E = -1/2 x^T C x + t^T x, exact (Fractions), rounded once."""
    n = len(x)
    quadratic = Fraction(sum(c[i][j] * x[i] * x[j] for i in range(n) for j in range(n)), 2)
    return float(-quadratic + sum(Fraction(t[i]) * x[i] for i in range(n)))


def _twin_out(x, sweeps, converged, trace):
    out = (np.array(x, dtype=np.int8), sweeps, converged)
    return out + (trace,) if trace is not None else out


# ---- dense associative memory ---------------------------------------------------------------

class DenseAssociativeMemory(_StoresPatterns):
    """Dense associative memory: energy E(x) = -sum_mu F(xi_mu . x) over stored patterns.

    F(z) = z^degree ('poly', Krotov & Hopfield 2016; degree 2 is the Hopfield network up to
    its diagonal) or F(z) = exp(z) ('exp', Demircigil et al. 2017). The asynchronous update
    sets x_i to the sign that gives the lower energy with the other neurons fixed:
    x_i <- sgn(sum_mu [F(r_mu + xi_mu,i) - F(r_mu - xi_mu,i)]), r_mu = xi_mu . x - xi_mu,i x_i
    (ties -> +1), so the energy never increases. The overlaps m = Xi x are kept and updated
    on a flip (O(s)); a visit costs O(s). Capacity grows as n^(degree - 1) ('poly') and
    exponentially in n ('exp'), far beyond the 0.138 n of the Hebbian network.

    Parameters
    ----------
    interaction : {'poly', 'exp'}
    degree : int >= 2
        Degree of the 'poly' interaction (ignored for 'exp').

    Examples
    --------
    >>> import numpy as np
    >>> xi = np.random.default_rng(0).choice([-1, 1], size=(40, 50))   # load 0.8
    >>> dam = DenseAssociativeMemory(degree=4).store(xi)
    >>> noisy = xi[3].copy(); noisy[:5] *= -1
    >>> bool((dam.run(noisy, random_state=0).states == xi[3]).all())
    True
    """

    def __init__(self, interaction="poly", degree=3):
        self.interaction = check_choice(interaction, name="interaction", choices=("poly", "exp"))
        self.degree = int(check_scalar(degree, name="degree", kind=numbers.Integral, low=2,
                                       high=64))
        self.patterns_ = None

    def store(self, patterns):
        """Store ``patterns`` (s, n) in {-1, +1} (int8). Returns ``self``.

        For 'poly', every energy difference must be an exact float64 integer:
        s (n + 1)^degree < 2^53, else ValueError (lower the degree or use 'exp').
        """
        xi = _spins(patterns, name="patterns", ndim=2)
        if xi.shape[0] == 0 or xi.shape[1] == 0:
            raise ValueError(f"patterns is empty (shape {xi.shape}): store at least one "
                             "pattern of at least one neuron")
        s, n = xi.shape
        if self.interaction == "poly" and s * (n + 1) ** self.degree >= 1 << 53:
            raise ValueError(f"degree={self.degree} with s={s} patterns of n={n} neurons "
                             "overflows exact float64 sums (s (n+1)^degree >= 2^53); lower "
                             "degree or use interaction='exp'")
        self.patterns_ = xi
        self.patterns_t_ = np.ascontiguousarray(xi.T)  # (n, s)
        self.n_neurons = n
        return self

    def energy(self, states):
        """E(x) = -sum_mu F(xi_mu . x): states (n,) -> float, (B, n) -> (B,) float64
        ('exp' overflows to -inf once an overlap passes ~709)."""
        _not_fitted(self)
        x8 = _spins(states, name="states", n=self.n_neurons)
        m = np.atleast_2d(x8).astype(np.float64) @ self.patterns_t_.astype(np.float64)  # (B, s)
        f = m ** self.degree if self.interaction == "poly" else np.exp(m)
        e = -f.sum(axis=1)
        return float(e[0]) if x8.ndim == 1 else e

    def run(self, states, order="random", max_sweeps=100, random_state=None):
        """Asynchronous dynamics from ``states`` (n,) or (B, n); arguments and result as
        ``Hopfield.run`` (mode is always 'async')."""
        _not_fitted(self)
        order = check_choice(order, name="order", choices=("random", "sequential"))
        max_sweeps = _max_sweeps(max_sweeps)
        x8 = _spins(states, name="states", n=self.n_neurons)
        x = np.array(np.atleast_2d(x8), order="C")  # (B, n)
        m = np.rint(x.astype(np.float64) @ self.patterns_t_.astype(np.float64)).astype(np.int64)
        B = x.shape[0]
        sweeps, conv = np.zeros(B, np.int64), np.zeros(B, np.uint8)
        dense_memory_async_run(self.patterns_t_, x, m, np.empty(x.shape, np.int32),
                               np.arange(B, dtype=np.int64), max_sweeps, order == "random",
                               np.uint64(_seed(random_state)), self.interaction, self.degree,
                               sweeps, conv)
        return _result(x, sweeps, conv, x8.ndim == 1)


def reference_dense_async(patterns, state, orders, max_sweeps, interaction="poly", degree=3):
    """Naive twin of the dense-associative-memory async dynamics: for each visit, the energy
    with x_i = +1 and with x_i = -1 from scratch, E = -sum_mu F(xi_mu . x) (Python ints for
    'poly'; for 'exp' the same sum scaled by exp(-max overlap), which keeps its sign).
    Returns (final state int8 (n,), sweeps, converged)."""
    xi = [[int(v) for v in row] for row in np.asarray(patterns)]
    x = [int(v) for v in state]
    for sweep in range(max_sweeps):
        flips = 0
        for i in orders[sweep % len(orders)]:
            new = 1 if _twin_gain(xi, x, i, interaction, degree) >= 0 else -1
            flips += new != x[i]
            x[i] = new
        if flips == 0:
            return np.array(x, dtype=np.int8), sweep + 1, True
    return np.array(x, dtype=np.int8), max_sweeps, False


def _twin_gain(xi, x, i, interaction, degree):
    """E(x_i = -1) - E(x_i = +1), up to a positive factor."""
    up, down = list(x), list(x)
    up[i], down[i] = 1, -1
    m_up = [sum(a * b for a, b in zip(p, up, strict=True)) for p in xi]
    m_down = [sum(a * b for a, b in zip(p, down, strict=True)) for p in xi]
    if interaction == "poly":
        return sum(a ** degree for a in m_up) - sum(b ** degree for b in m_down)
    # sum_mu xi_mu,i exp(r_mu - shift'): the kernel's form, r_mu the overlap without i
    r = [mu_up - p[i] for mu_up, p in zip(m_up, xi, strict=True)]
    shift = max(r)
    return sum(p[i] * math.exp(rm - shift) for p, rm in zip(xi, r, strict=True))


# ---- modern Hopfield ------------------------------------------------------------------------

class ModernHopfield(_StoresPatterns):
    """Modern (continuous) Hopfield network of Ramsauer et al. (2020).

    ``retrieve(q) = softmax(beta q X^T) X``: one update of the state q against the stored
    patterns X (s, n). This is one step of attention with query q, keys = values = X and
    scale beta: ``scaled_dot_product_attention(q, X, X, scale=beta)``. For large beta and
    well-separated patterns, one step from a stored pattern (or a query near one) returns
    that pattern.

    Parameters
    ----------
    beta : float > 0
        Inverse temperature.

    Examples
    --------
    >>> import numpy as np
    >>> X = np.random.default_rng(0).choice([-1.0, 1.0], size=(10, 64))
    >>> mh = ModernHopfield(beta=1.0).store(X)
    >>> bool(np.allclose(mh.retrieve(X[2]), X[2]))
    True
    """

    def __init__(self, beta=1.0):
        self.beta = float(check_scalar(beta, name="beta", low=0, low_inclusive=False))
        self.patterns_ = None

    def store(self, X):
        """Store the patterns X (s, n), float32 or float64, finite (any real values).
        Returns ``self``."""
        X = check_array(X, name="X", ndim=2, finite=True, allow_device=False)
        if X.dtype.kind not in "fiu":
            raise TypeError(f"X must hold real numbers, got dtype {X.dtype}")
        if X.shape[0] == 0 or X.shape[1] == 0:
            raise ValueError(f"X is empty (shape {X.shape}): store at least one pattern")
        self.patterns_ = X if X.dtype.kind == "f" else X.astype(np.float64)
        self.n_features = X.shape[1]
        return self

    def retrieve(self, queries):
        """softmax(beta q X^T) X for queries (..., n) -> (..., n), float dtype of
        ``np.result_type(queries, X)``."""
        _not_fitted(self)
        q = check_array(queries, name="queries", min_ndim=1, finite=True, allow_device=False)
        if q.dtype.kind not in "fiu":
            raise TypeError(f"queries must hold real numbers, got dtype {q.dtype}")
        if q.shape[-1] != self.n_features:
            raise ValueError(f"queries have {q.shape[-1]} features but the stored patterns "
                             f"have {self.n_features}; expected shape (..., {self.n_features})")
        dtype = np.result_type(q.dtype, self.patterns_.dtype, np.float32)
        X = self.patterns_.astype(dtype, copy=False)
        scores = self.beta * (q.astype(dtype, copy=False) @ X.T)  # (..., s)
        return softmax_forward(np.ascontiguousarray(scores, dtype=dtype), axis=-1)[0] @ X


# ---- capacity -------------------------------------------------------------------------------

@dataclass
class RetrievalCurve:
    """Retrieval against load, one entry per alpha.

    Attributes
    ----------
    alphas : ndarray (A,) float64
        Loads alpha = s/n asked for; ``n_patterns`` (A,) the s = max(1, round(alpha n)) used.
    overlap : ndarray (A,) float64
        Mean final overlap m = x . xi / n between each probe's fixed point and its pattern.
    overlap_std : ndarray (A,)
    retrieved : ndarray (A,)
        Share of probes whose fixed point keeps overlap m >= ``retrieved_at`` with their
        pattern (the retrieval branch; see ``retrieval_curve``).
    flip_rate : ndarray (A,)
        Fraction of the stored patterns' bits that one update flips, sgn(h_i(x_t)) != x_ti:
        the quantity notes §1.4 estimates by (1 - erf(sqrt(1/(2 alpha)))) / 2.
    retrieved_at : float
        The overlap that counts as retrieved.
    """

    n: int
    alphas: np.ndarray
    n_patterns: np.ndarray
    overlap: np.ndarray
    overlap_std: np.ndarray
    retrieved: np.ndarray
    flip_rate: np.ndarray
    retrieved_at: float = 0.9

    def transition(self, share=0.5):
        """The load where the share of retrieved probes first falls below ``share``.

        Linear interpolation between the two loads (in increasing alpha) that bracket the
        first drop of ``retrieved`` below ``share``; NaN when no load of the curve is on
        each side. Notes §1.4 puts the transition at alpha ~ 0.138 for n -> oo.

        Parameters
        ----------
        share : float in (0, 1)

        Returns
        -------
        float
        """
        share = float(check_scalar(share, name="share", low=0, high=1, low_inclusive=False,
                                   high_inclusive=False))
        order = np.argsort(self.alphas, kind="stable")
        a, r = self.alphas[order], self.retrieved[order]
        for k in range(1, a.size):
            if r[k - 1] >= share > r[k]:
                return float(a[k - 1] + (r[k - 1] - share) / (r[k - 1] - r[k])
                             * (a[k] - a[k - 1]))
        return float("nan")


def retrieval_curve(n, alphas, n_probes=20, noise=0.0, order="random", max_sweeps=100,
                    random_state=None, retrieved_at=0.9):
    """Measure retrieval of random patterns against the load alpha = s/n.

    For each alpha: s random patterns in {-1, +1}^n are stored (Hebbian); ``n_probes``
    of them (at most s), each with a fraction ``noise`` of its bits flipped, run
    asynchronously to a fixed point; the final overlaps with their patterns and the one-step
    flip rate of all stored bits are recorded.

    The final overlaps are bimodal: the retrieval branch near m = 1 (Amit, Gutfreund and
    Sompolinsky's retrieval state still has m ~ 0.97 at alpha_c ~ 0.138) and the spin-glass
    branch below m ~ 0.6 once errors avalanche; ``retrieved_at`` = 0.9 falls in the gap
    between them (at n = 2000 hardly any fixed point lands between 0.6 and 0.9).

    Parameters
    ----------
    n : int >= 2
    alphas : array_like (A,) of floats > 0
    n_probes : int >= 1
    noise : float in [0, 0.5]
    order, max_sweeps, random_state : as ``Hopfield.run``
    retrieved_at : float in (0, 1]
        A probe counts as retrieved when its final overlap is at least this.

    Returns
    -------
    RetrievalCurve
    """
    n = int(check_scalar(n, name="n", kind=numbers.Integral, low=2))
    alphas = check_array(alphas, name="alphas", ndim=1, finite=True, allow_device=False)
    if alphas.dtype.kind not in "fiu" or alphas.size == 0 or (alphas <= 0).any():
        raise ValueError("alphas must be a non-empty 1-D array of loads > 0")
    n_probes = int(check_scalar(n_probes, name="n_probes", kind=numbers.Integral, low=1))
    noise = float(check_scalar(noise, name="noise", low=0, high=0.5))
    retrieved_at = float(check_scalar(retrieved_at, name="retrieved_at", low=0, high=1,
                                      low_inclusive=False))
    rng = get_rng(random_state)
    rows = [_one_load(n, float(a), n_probes, noise, order, max_sweeps, rng, retrieved_at)
            for a in alphas]
    cols = [np.array(c) for c in zip(*rows, strict=True)]
    return RetrievalCurve(n, alphas.astype(np.float64), *cols, retrieved_at=retrieved_at)


def _one_load(n, alpha, n_probes, noise, order, max_sweeps, rng, retrieved_at):
    s = max(1, round(alpha * n))
    xi = rng.choice(np.array([-1, 1], np.int8), size=(s, n))
    net = Hopfield(n).store(xi)
    flip_rate = float(np.mean(np.where(net.field(xi) >= 0, 1, -1) != xi))
    targets = xi[:min(n_probes, s)]
    probes = targets * np.where(rng.random(targets.shape) < noise, -1, 1).astype(np.int8)
    final = net.run(probes, order=order, max_sweeps=max_sweeps, random_state=rng).states
    m = (final.astype(np.float64) * targets).mean(axis=1)  # (probes,)
    return s, m.mean(), m.std(), np.mean(m >= retrieved_at), flip_rate
