"""Linear recurrent layers trained by the parallel scan: ``MinGRU``, ``MinLSTM`` (Feng et al.
2024, "Were RNNs all we needed?") and ``LRU`` (Orvieto et al. 2023, "Resurrecting recurrent
neural networks for long sequences").

The gates depend on the input only, never on h_{t-1}, so the recurrence is the diagonal
linear scan h_t = a_t * h_{t-1} + b_t (``F.linear_scan``): every step's a_t, b_t come from one
GEMM over all steps, and the scan is one fused kernel. ``step()`` runs the same recurrence one
step at a time (inference); both give the same numbers.

Notes §5.2 writes the minGRU as z_t = sigma(G x_t) z_{t-1} + (1 - sigma(G x_t)) V x_t
and calls it "LRU", a slip: that is minGRU with the gate's roles swapped (here, as in the
paper, z_t weighs the new content), while the complex diagonal lambda = exp(-exp(nu) +
i theta) is the LRU of Orvieto et al. ``LRU.from_dense`` is the change of basis of notes §5.2,
A = P Lambda P^-1: a dense linear RNN as the LRU that computes the same outputs.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from .._backend import array_module
from .._budget import ensure_room
from .._random import get_rng
from .._validation import FLOATS, check_array, check_bool, check_real, check_scalar
from ..autograd import Tensor, as_tensor, complex, real, where
from ..functional.scan import linear_scan, log_linear_scan
from .layers import Linear, _check_size, _dtype
from .module import Module, Parameter

__all__ = ["MinGRU", "MinLSTM", "LRU"]


# ---- small differentiable helpers ---------------------------------------------------------

def _softplus(x: Tensor) -> Tensor:
    """log(1 + exp(x)), stable: relu(x) + log(1 + exp(-|x|))."""
    return x.relu() + ((-x.abs()).exp() + 1.0).log()


def _log_g(x: Tensor) -> Tensor:
    """log g(x) for the paper's positive activation g(x) = x + 1/2 (x >= 0), sigmoid(x) (x < 0)."""
    return where(x.data >= 0, (x.relu() + 0.5).log(), -_softplus(-x))


def _g(x: Tensor) -> Tensor:
    return where(x.data >= 0, x.relu() + 0.5, x.sigmoid())


def _batch_first(x, batch_first, input_size, name):
    """x checked (real, 3-D, F = input_size, T >= 1, as ``nn.LSTM``) as (B, T, F)."""
    x = check_real(as_tensor(x), name="x", op=name)
    layout = "(B, T, F)" if batch_first else "(T, B, F)"
    if x.ndim != 3 or x.shape[-1] != input_size:
        raise ValueError(f"x has shape {x.shape} but {name} was built with "
                         f"input_size={input_size}; expected {layout} with F = {input_size}")
    if x.shape[1 if batch_first else 0] == 0:
        raise ValueError(f"x has shape {x.shape}: an empty sequence (T = 0); expected shape "
                         f"{layout} with T >= 1")
    return x if batch_first else x.transpose(1, 0, 2)  # (B, T, F)


def _step_input(x_t, input_size, name):
    """x_t checked (real, (B, input_size)) for ``step``."""
    x_t = check_real(as_tensor(x_t), name="x_t", op=name)
    if x_t.ndim != 2 or x_t.shape[-1] != input_size:
        raise ValueError(f"x_t must have shape (B, {input_size}), got {x_t.shape}")
    return x_t


def _state(h, B, H, dtype, name="h0"):
    if h is None:
        return None
    h = as_tensor(h)
    if h.shape != (B, H):
        raise ValueError(f"{name} must have shape (B, hidden_size) = {(B, H)}, got {h.shape}")
    if h.dtype != dtype:
        raise TypeError(f"{name} must have dtype {np.dtype(dtype)}, got {h.dtype}")
    return h


def _decay_floor(dtype) -> float:
    """The least exp(nu) the LRU uses: 4 eps of ``dtype``. With s = eps, |exp(-s + i theta)|
    computed in that dtype reaches 1.0 at some theta; 4 eps leaves it below 1 with a margin."""
    return 4 * float(np.finfo(dtype).eps)


class _MinRNN(Module):
    """Shared plumbing: linear maps of the input, scan or log-scan, batch_first, step."""

    n_maps = 2

    def __init__(self, input_size, hidden_size, batch_first=True, bias=True, log_space=False,
                 dtype=None):
        super().__init__()
        self.input_size = _check_size(input_size, "input_size")
        self.hidden_size = _check_size(hidden_size, "hidden_size")
        for name, flag in (("batch_first", batch_first), ("bias", bias),
                           ("log_space", log_space)):
            check_bool(flag, name=name)
        self.batch_first, self.log_space = bool(batch_first), bool(log_space)
        dtype = _dtype(dtype)
        self.linear = Linear(input_size, self.n_maps * hidden_size, bias=bias, dtype=dtype)

    def _maps(self, x):
        """The pre-activations, each (..., H), from one GEMM."""
        # as 2-D rows (B*T, F): the backward's GEMMs then run as one BLAS call each (a 3-D
        # operand made numpy loop over B, far slower: benchmarks/RESULTS.md, "Figures moved
        # from code comments")
        k = self.linear(x.reshape(-1, x.shape[-1])).reshape(*x.shape[:-1], -1)
        H = self.hidden_size
        return [k[..., i * H:(i + 1) * H] for i in range(self.n_maps)]

    def forward(self, x, h0=None):
        """x (B, T, F) (or (T, B, F) without batch_first), h0 (B, H) or None (zeros; must be
        positive in log space) -> h (B, T, H) (or (T, B, H))."""
        x = _batch_first(x, self.batch_first, self.input_size, type(self).__name__)
        h0 = _state(h0, x.shape[0], self.hidden_size, x.dtype)
        maps = self._maps(x)
        if self.log_space:
            if h0 is not None and not np.all(h0.data > 0):
                raise ValueError("h0 must be positive with log_space=True (the state is "
                                 "computed as its logarithm); got a value <= 0")
            log_a, log_b = self._log_coefficients(*maps)
            log_h0 = None if h0 is None else h0.log()
            h = log_linear_scan(log_a, log_b, log_h0).exp()
        else:
            a, b = self._coefficients(*maps)
            h = linear_scan(a, b, h0)
        return h if self.batch_first else h.transpose(1, 0, 2)

    def step(self, x_t, h):
        """One step of the recurrence: x_t (B, F), h (B, H) -> (y_t, h_new), y_t = h_new."""
        x_t = _step_input(x_t, self.input_size, f"{type(self).__name__}.step")
        h = _state(h, x_t.shape[0], self.hidden_size, x_t.dtype, "h")
        maps = self._maps(x_t)
        if self.log_space:
            log_a, log_b = self._log_coefficients(*maps)
            a, b = log_a.exp(), log_b.exp()
        else:
            a, b = self._coefficients(*maps)
        h_new = b if h is None else a * h + b
        return h_new, h_new


class MinGRU(_MinRNN):
    """minGRU (Feng et al. 2024): a GRU whose gate sees only the input, trained by the scan.

        z_t = sigmoid(W_z x_t),  h~_t = W_h x_t,  h_t = (1 - z_t) * h_{t-1} + z_t * h~_t

    With ``log_space=True`` the paper's log-space variant for long sequences: h~_t = g(W_h x_t)
    with g(x) = x + 1/2 (x >= 0), sigmoid(x) (x < 0) keeps the state positive, and the scan
    runs on log(1 - z_t) = -softplus(k), log(z_t h~_t) = -softplus(-k) + log g(W_h x_t).

    Parameters
    ----------
    input_size, hidden_size : int
    batch_first : bool, x (B, T, F) when True (default), else (T, B, F)
    bias : bool, biases on both maps
    log_space : bool
    dtype : float32 (default) or float64

    Attributes
    ----------
    linear : Linear (2 H, F): rows [0, H) W_z, rows [H, 2H) W_h

    Examples
    --------
    >>> import numpy as np, nnkit as nk
    >>> from nnkit.nn.linear_recurrent import MinGRU
    >>> layer = MinGRU(3, 4)
    >>> layer(np.zeros((2, 5, 3), np.float32)).shape
    (2, 5, 4)
    """

    def _coefficients(self, k_z, k_h):
        z = k_z.sigmoid()
        return 1.0 - z, z * k_h  # a_t, b_t

    def _log_coefficients(self, k_z, k_h):
        return -_softplus(k_z), -_softplus(-k_z) + _log_g(k_h)


class MinLSTM(_MinRNN):
    """minLSTM (Feng et al. 2024), with the paper's normalised gates:

        f_t = sigmoid(W_f x_t), i_t = sigmoid(W_i x_t), h~_t = W_h x_t,
        f'_t = f_t / (f_t + i_t), i'_t = i_t / (f_t + i_t),  h_t = f'_t * h_{t-1} + i'_t * h~_t

    ``log_space=True``: log f'_t = -softplus(d), log i'_t = -softplus(-d) with
    d = softplus(-W_i x) - softplus(-W_f x), and h~_t = g(W_h x_t) as in ``MinGRU``.

    Parameters and attributes as ``MinGRU``, with ``linear`` (3 H, F): rows f, i, h.
    """

    n_maps = 3

    def _coefficients(self, k_f, k_i, k_h):
        f, i = k_f.sigmoid(), k_i.sigmoid()
        total = f + i
        return f / total, (i / total) * k_h

    def _log_coefficients(self, k_f, k_i, k_h):
        d = _softplus(-k_i) - _softplus(-k_f)
        return -_softplus(d), -_softplus(-d) + _log_g(k_h)


class LRU(Module):
    """Linear Recurrent Unit (Orvieto et al. 2023): a complex diagonal linear recurrence.

        lambda = exp(-max(exp(nu), 4 eps) + i theta)   (|lambda| < 1 for every nu)
        h_t = lambda * h_{t-1} + gamma * (B x_t),   y_t = Re(C h_t) + D * x_t

    with h complex (state_size,), B (state_size, input_size) and C (input_size, state_size)
    complex (stored as real parameters ``B_re``, ``B_im``, ``C_re``, ``C_im``), D (input_size,)
    real, and gamma = exp(gamma_log), initialised to sqrt(1 - |lambda|^2) so that a white input
    gives a state of unit variance at any |lambda| (the paper keeps gamma trainable).

    Two deviations from notes §5.2, both the paper's:

    - the ring initialisation draws |lambda|^2 uniformly on [r_min^2, r_max^2] (lambda uniform
      on the ring's area), not r ~ U[r_min, r_max] as notes §5.2 writes; then
      nu = log(-log|lambda|) and theta uniform on [0, max_phase];
    - exp(nu) is bounded below by 4 eps of the dtype (nu >= log(4 eps), about -14.6 in float32
      and -34.6 in float64; no gradient to nu below): exp(-exp(nu)) alone rounds to 1.0 once
      exp(nu) < eps / 2 (nu = -20 in float32), and "|lambda| < 1 for every nu" would fail.

    Parameters
    ----------
    input_size, state_size : int
    r_min, r_max : float, 0 <= r_min < r_max <= 1
    max_phase : float > 0
    dtype : float32 (default; state complex64) or float64 (complex128)
    random_state : seed for the initialisation

    Examples
    --------
    >>> import numpy as np
    >>> from nnkit.nn.linear_recurrent import LRU
    >>> lru = LRU(2, 8, r_min=0.9, r_max=0.99, random_state=0)
    >>> bool(np.all(np.abs(lru.eigenvalues()) < 1))
    True
    >>> lru(np.zeros((3, 10, 2), np.float32)).shape
    (3, 10, 2)
    """

    def __init__(self, input_size, state_size, r_min=0.0, r_max=1.0, max_phase=2 * math.pi,
                 dtype=None, random_state=None):
        super().__init__()
        self.input_size = _check_size(input_size, "input_size")
        self.state_size = _check_size(state_size, "state_size")
        check_scalar(r_min, name="r_min", low=0.0, high=1.0, high_inclusive=False)
        check_scalar(r_max, name="r_max", low=0.0, high=1.0, low_inclusive=False)
        if not r_min < r_max:
            raise ValueError(f"r_min must be < r_max, got r_min={r_min}, r_max={r_max}")
        check_scalar(max_phase, name="max_phase", kind=numbers.Real, low=0.0,
                     low_inclusive=False)
        self.r_min, self.r_max, self.max_phase = float(r_min), float(r_max), float(max_phase)
        dtype = _dtype(dtype)
        rng = get_rng(random_state)
        P, F = self.state_size, self.input_size
        ensure_room((4, P, F), np.float64, f"input_size={F}, state_size={P}")  # B and C
        u1, u2 = rng.random(P), rng.random(P)
        top = min(1 - 1e-7, math.exp(-2 * _decay_floor(dtype)))  # |lambda|^2 the bound allows
        radius2 = np.clip(u1 * (r_max ** 2 - r_min ** 2) + r_min ** 2, 1e-12, top)
        self.nu = Parameter(np.log(-0.5 * np.log(radius2)).astype(dtype))
        self.theta = Parameter((u2 * max_phase).astype(dtype))
        self.gamma_log = Parameter(0.5 * np.log(1 - radius2).astype(dtype))
        self.B_re = Parameter((rng.standard_normal((P, F)) / math.sqrt(2 * F)).astype(dtype))
        self.B_im = Parameter((rng.standard_normal((P, F)) / math.sqrt(2 * F)).astype(dtype))
        self.C_re = Parameter((rng.standard_normal((F, P)) / math.sqrt(P)).astype(dtype))
        self.C_im = Parameter((rng.standard_normal((F, P)) / math.sqrt(P)).astype(dtype))
        self.D = Parameter(rng.standard_normal(F).astype(dtype))

    @classmethod
    def from_dense(cls, A, B, C, D=None, dtype=None, max_condition=1e8):
        """The LRU that computes what the dense linear RNN does (notes §5.2):

            h_t = A h_{t-1} + B x_t,   y_t = C h_t + D x_t,   h_{-1} = 0

        With A = P Lambda P^-1 (``numpy.linalg.eig``), the state zeta_t = P^-1 h_t obeys
        zeta_t = Lambda zeta_{t-1} + (P^-1 B) x_t and y_t = (C P) zeta_t + D x_t: a diagonal
        complex recurrence with B' = P^-1 B and C' = C P. y is real, so y = Re(C' zeta_t) +
        D x_t as the LRU writes it. The LRU's parameters: nu = log(-log|lambda|), theta =
        arg(lambda), gamma = sqrt(1 - |lambda|^2) as at initialisation (so the module trains
        as a fresh one would) and B = B' / gamma; a zero eigenvalue becomes |lambda| =
        exp(-700), below every float32 and about 1e-304 in float64.

        Parameters
        ----------
        A : array (P, P), float32/64
            Diagonalisable, spectral radius < 1.
        B : array (P, F)
        C : array (F, P)
            The LRU's output has the input's F features.
        D : None (zero), array (F,) or a diagonal array (F, F)
            The LRU's skip is elementwise.
        dtype : float32 or float64
            The module's; default A's dtype.
        max_condition : float
            The largest condition number of P accepted.

        Returns
        -------
        LRU
            With state_size P and input_size F; a dense initial state h0 is P^-1 h0 in its
            basis (the eigenvectors of ``numpy.linalg.eig(A)``).

        Raises
        ------
        ValueError
            A not diagonalisable (cond(P) > max_condition: a defective A, such as a Jordan
            block, has no basis of eigenvectors), A not stable (an eigenvalue of modulus
            >= 1, or too close to 1 for the LRU's bound on |lambda| in ``dtype``), shapes
            that do not fit, or a D that is not diagonal.

        Examples
        --------
        >>> import numpy as np
        >>> from nnkit.nn.linear_recurrent import LRU
        >>> A = np.array([[0.5, -0.4], [0.4, 0.5]])  # eigenvalues 0.5 +- 0.4i
        >>> lru = LRU.from_dense(A, np.eye(2), np.eye(2))
        >>> np.round(np.sort_complex(lru.eigenvalues()), 6)
        array([0.5-0.4j, 0.5+0.4j])
        """
        A = check_array(A, name="A", ndim=2, dtype=FLOATS, finite=True, allow_device=False)
        B = check_array(B, name="B", ndim=2, dtype=FLOATS, finite=True, allow_device=False)
        C = check_array(C, name="C", ndim=2, dtype=FLOATS, finite=True, allow_device=False)
        P = A.shape[0]
        if A.shape != (P, P) or P == 0:
            raise ValueError(f"A must be a square (P, P) matrix with P >= 1, got shape {A.shape}")
        if B.shape[0] != P or B.shape[1] == 0:
            raise ValueError(f"B must have shape (P, F) = ({P}, F) with F >= 1 to match A of "
                             f"shape {A.shape}, got {B.shape}")
        F = B.shape[1]
        if C.shape != (F, P):
            raise ValueError(f"C must have shape (F, P) = {(F, P)} (the LRU's output has the "
                             f"input's F features), got {C.shape}")
        if D is None:
            d = np.zeros(F)
        else:
            D = check_array(D, name="D", ndim=(1, 2), dtype=FLOATS, finite=True,
                            allow_device=False)
            if D.shape not in ((F,), (F, F)):
                raise ValueError(f"D must have shape (F,) or (F, F) with F = {F}, got {D.shape}")
            d = np.diagonal(D) if D.ndim == 2 else D
            if D.ndim == 2 and np.any(D != np.diag(d)):
                raise ValueError("D must be diagonal (the LRU's skip D * x is elementwise), got "
                                 "off-diagonal entries")
        dtype = _dtype(A.dtype if dtype is None else dtype)
        lam, vectors = np.linalg.eig(A.astype(np.float64))
        condition = np.linalg.cond(vectors)
        if not condition <= max_condition:  # inf or NaN for a singular basis
            raise ValueError(f"A must be diagonalisable: its eigenvector matrix P has condition "
                             f"number {condition:.3g} > max_condition={max_condition:g} (A is "
                             f"defective or nearly so, as a Jordan block [[l, 1], [0, l]])")
        radius = np.abs(lam)
        top = math.exp(-_decay_floor(dtype))  # the largest |lambda| the LRU has in dtype
        if radius.max() >= 1 or radius.max() > top:
            raise ValueError(f"A must be stable: spectral radius < 1 (at most {top!r} in "
                             f"{dtype.name}), got {radius.max()!r} (eigenvalue "
                             f"{lam[np.argmax(radius)]:.6g})")
        radius = np.maximum(radius, math.exp(-700.0))
        gamma = np.sqrt(1.0 - radius ** 2)
        b = np.linalg.solve(vectors, B.astype(np.float64)) / gamma[:, None]  # (P, F)
        c = C.astype(np.float64) @ vectors  # (F, P)
        lru = cls(F, P, dtype=dtype, random_state=0)  # every parameter set below
        for param, value in ((lru.nu, np.log(-np.log(radius))), (lru.theta, np.angle(lam)),
                             (lru.gamma_log, np.log(gamma)), (lru.B_re, b.real),
                             (lru.B_im, b.imag), (lru.C_re, c.real), (lru.C_im, c.imag),
                             (lru.D, d)):
            param.data[...] = value
        return lru

    def _lambda(self) -> Tensor:
        decay = self.nu.exp().clip(min=_decay_floor(self.nu.dtype))  # NaN stays NaN
        return complex(-decay, self.theta).exp()  # (P,) complex

    def eigenvalues(self) -> np.ndarray:
        """lambda (state_size,), complex128: the diagonal of the recurrence (with the bound
        on exp(nu) of the parameters' dtype)."""
        nu, theta = self.nu.data.astype(np.float64), self.theta.data.astype(np.float64)
        return np.exp(-np.maximum(np.exp(nu), _decay_floor(self.nu.dtype)) + 1j * theta)

    def _input(self, x):
        """gamma * (B x) as a complex tensor, (..., P)."""
        gamma = self.gamma_log.exp()
        rows = x.reshape(-1, x.shape[-1])  # (B*T, F): one GEMM each way (see _MinRNN._maps)
        shape = (*x.shape[:-1], self.state_size)
        return complex((rows @ self.B_re.transpose()).reshape(*shape) * gamma,
                        (rows @ self.B_im.transpose()).reshape(*shape) * gamma)

    def _output(self, h, x):
        """Re(C h) + D * x = Re(h) C_re^T - Im(h) C_im^T + D * x."""
        c = complex(self.C_re, self.C_im)
        rows = h.reshape(-1, self.state_size)  # (B*T, P)
        return real(rows @ c.transpose()).reshape(*x.shape) + x * self.D

    def forward(self, x, h0=None):
        """x (B, T, F) real, h0 (B, P) complex or None -> y (B, T, F) real, by the scan."""
        x = _batch_first(x, True, self.input_size, "LRU")
        B, T, _ = x.shape
        b = self._input(x)  # (B, T, P)
        ones = array_module(b.data).ones((B, T, self.state_size), b.data.dtype)  # where b is
        a = self._lambda() * Tensor(ones)
        h0 = _state(h0, B, self.state_size, b.dtype)
        h = linear_scan(a, b, h0)
        return self._output(h, x)

    def step(self, x_t, h):
        """x_t (B, F), h (B, P) complex or None (zeros) -> (y_t (B, F), h_new (B, P))."""
        x_t = _step_input(x_t, self.input_size, "LRU.step")
        b = self._input(x_t)
        h = _state(h, x_t.shape[0], self.state_size, b.dtype, "h")
        h_new = b if h is None else self._lambda() * h + b
        return self._output(h_new, x_t), h_new
