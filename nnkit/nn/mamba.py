"""Mamba's selective state-space mixer (Gu and Dao 2023) and the RMS normalisation its blocks
use.

``Mamba`` is mamba_ssm's ``Mamba`` (Mamba-1) with transformers' ``MambaMixer`` parameter
names, so ``load_state_dict`` takes either's weights. For an input (batch, L, d_model):

    x, z = split(in_proj(input))                      (batch, L, E) each, E = expand d_model
    x = silu(causal depthwise conv1d(x))              kernel d_conv, left zero padding
    dt, B, C = split(x_proj(x))                       (batch, L, R), (batch, L, N) twice
    y = selective_scan(x, dt_proj.weight dt, -exp(A_log), B, C, D, z,
                       delta_bias=dt_proj.bias, delta_softplus=True)
    output = out_proj(y)

``F.selective_scan`` runs the recurrence fused (CPU and GPU), differentiable in everything.
``Mamba.step`` decodes one token in O(1): its state is the last d_conv inputs of the
convolution (batch, E, d_conv) and the SSM state (batch, E, N), plain arrays (no autograd).
"""

from __future__ import annotations

import math
import numbers
from typing import NamedTuple

import numpy as np

from .. import functional as F
from .._backend import array_module
from .._budget import ensure_room
from .._random import get_rng
from .._validation import check_choice, check_input_dtype, check_scalar
from ..autograd import Tensor, as_tensor, no_grad
from . import init
from .conv import Conv1d
from .layers import Linear, _dtype
from .module import Module, Parameter

__all__ = ["Mamba", "MambaState", "RMSNorm"]


class RMSNorm(Module):
    """Root-mean-square normalisation over the trailing ``normalized_shape``, as
    ``torch.nn.RMSNorm``: y = x / sqrt(mean(x^2) + eps) * weight.

    Parameters
    ----------
    normalized_shape : int or tuple of ints
    eps : float > 0 or None
        None: the machine epsilon of the input's dtype (torch's default).
    elementwise_affine : bool
        A learnable ``weight`` of ``normalized_shape`` (ones), else none.
    dtype : float32 (default) or float64

    Examples
    --------
    >>> import numpy as np, nnkit as nk
    >>> norm = nk.nn.RMSNorm(2, eps=1e-12, dtype=np.float64)
    >>> np.round(norm(np.array([[3.0, 4.0]])).numpy(), 4).tolist()
    [[0.8485, 1.1314]]
    """

    def __init__(self, normalized_shape, eps: float | None = None,
                 elementwise_affine: bool = True, dtype=None):
        super().__init__()
        if isinstance(normalized_shape, numbers.Integral):
            normalized_shape = (normalized_shape,)
        if not isinstance(normalized_shape, (tuple, list)):
            raise TypeError(f"normalized_shape must be an int or a tuple of ints, got "
                            f"{normalized_shape!r:.100}")
        self.normalized_shape = tuple(
            int(check_scalar(n, name="normalized_shape entries", kind=numbers.Integral, low=0))
            for n in normalized_shape)
        self.eps = None if eps is None else float(
            check_scalar(eps, name="eps", low=0.0, low_inclusive=False))
        self.elementwise_affine = bool(elementwise_affine)
        if self.elementwise_affine:
            self.weight = Parameter.empty(self.normalized_shape, _dtype(dtype))
            self.weight.data[...] = 1
        else:
            self.register_parameter("weight", None)

    def forward(self, x):
        x = as_tensor(x)
        n = len(self.normalized_shape)
        if x.ndim < n or tuple(x.shape[x.ndim - n:]) != self.normalized_shape:
            raise ValueError(f"x has shape {x.shape} but RMSNorm normalises over "
                             f"{self.normalized_shape}; expected shape "
                             f"(..., {', '.join(map(str, self.normalized_shape))})")
        if self.weight is not None:
            check_input_dtype(x, self.weight.dtype, name="x", owner="RMSNorm")
        eps = float(np.finfo(x.dtype).eps) if self.eps is None else self.eps
        axes = tuple(range(x.ndim - n, x.ndim))
        y = x / ((x * x).mean(axis=axes, keepdims=True) + eps).sqrt()
        return y if self.weight is None else y * self.weight

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}"


class MambaState(NamedTuple):
    """The decoding state of one ``Mamba`` layer (arrays of the layer's dtype and device)."""

    conv: object  # (batch, E, d_conv): the convolution's last d_conv inputs, oldest first
    ssm: object  # (batch, E, N): the selective scan's state


class Mamba(Module):
    """The Mamba-1 mixer: gated selective state-space layer, (batch, L, d_model) -> same.

    Parameters
    ----------
    d_model : int
        Input and output features.
    d_state : int
        N, the state size per channel (transformers' ``state_size``).
    d_conv : int
        The causal depthwise convolution's kernel (``conv_kernel``).
    expand : int
        E = expand d_model inner channels (``intermediate_size``).
    dt_rank : int or "auto"
        R, the rank of the step-size projection; "auto" is ceil(d_model / 16)
        (``time_step_rank``).
    dt_min, dt_max, dt_init_floor : float
        The initial step sizes: log-uniform in [dt_min, dt_max], at least dt_init_floor;
        ``dt_proj.bias`` holds their inverse softplus.
    dt_init : "random" or "constant"
        ``dt_proj.weight`` uniform in +-dt_scale / sqrt(R), or that constant.
    dt_scale : float
    conv_bias : bool
        A bias on the convolution (``use_conv_bias``).
    bias : bool
        Biases on in_proj and out_proj (``use_bias``).
    dtype : float32 (default) or float64

    Attributes
    ----------
    in_proj : Linear (d_model -> 2E); conv1d : Conv1d (E, 1, d_conv), groups E;
    x_proj : Linear (E -> R + 2N, no bias); dt_proj : Linear (R -> E);
    A_log : Parameter (E, N), log(1..N) per channel (S4D-real: A = -exp(A_log));
    D : Parameter (E,), ones; out_proj : Linear (E -> d_model)

    Examples
    --------
    >>> import numpy as np, nnkit as nk
    >>> layer = nk.nn.Mamba(8, d_state=4)
    >>> layer(np.zeros((2, 5, 8), np.float32)).shape
    (2, 5, 8)
    """

    def __init__(self, d_model: int, d_state: int = 16, d_conv: int = 4, expand: int = 2,
                 dt_rank="auto", dt_min: float = 0.001, dt_max: float = 0.1,
                 dt_init: str = "random", dt_scale: float = 1.0, dt_init_floor: float = 1e-4,
                 conv_bias: bool = True, bias: bool = False, dtype=None):
        super().__init__()
        size = dict(kind=numbers.Integral, low=1)
        self.d_model = int(check_scalar(d_model, name="d_model", **size))
        self.d_state = int(check_scalar(d_state, name="d_state", **size))
        self.d_conv = int(check_scalar(d_conv, name="d_conv", **size))
        self.expand = int(check_scalar(expand, name="expand", **size))
        self.d_inner = self.expand * self.d_model
        if isinstance(dt_rank, str):
            check_choice(dt_rank, name="dt_rank", choices=("auto",))
            dt_rank = math.ceil(self.d_model / 16)
        self.dt_rank = int(check_scalar(dt_rank, name="dt_rank", **size))
        check_choice(dt_init, name="dt_init", choices=("random", "constant"))
        dt_min = check_scalar(dt_min, name="dt_min", low=0.0, low_inclusive=False)
        dt_max = check_scalar(dt_max, name="dt_max", low=dt_min)
        dt_init_floor = check_scalar(dt_init_floor, name="dt_init_floor", low=0.0)
        dt_scale = check_scalar(dt_scale, name="dt_scale")
        dtype = _dtype(dtype)
        E, N, R = self.d_inner, self.d_state, self.dt_rank
        self.in_proj = Linear(self.d_model, 2 * E, bias=bias, dtype=dtype)
        self.conv1d = Conv1d(E, E, self.d_conv, groups=E, padding=self.d_conv - 1,
                             bias=conv_bias, dtype=dtype)
        self.x_proj = Linear(E, R + 2 * N, bias=False, dtype=dtype)
        self.dt_proj = Linear(R, E, bias=True, dtype=dtype)
        self._init_dt(dt_init, dt_scale, dt_min, dt_max, dt_init_floor)
        ensure_room((E, N), dtype, f"A_log of shape {(E, N)}")
        self.A_log = Parameter(np.broadcast_to(np.log(np.arange(1, N + 1, dtype=np.float64)),
                                               (E, N)).astype(dtype))
        self.D = Parameter(np.ones(E, dtype=dtype))
        self.out_proj = Linear(E, self.d_model, bias=bias, dtype=dtype)

    def _init_dt(self, dt_init, dt_scale, dt_min, dt_max, dt_floor) -> None:
        """mamba_ssm's step-size initialisation of ``dt_proj``."""
        std = self.dt_rank ** -0.5 * dt_scale
        if dt_init == "constant":
            self.dt_proj.weight.data[...] = std
        else:
            init.uniform_(self.dt_proj.weight, -std, std)
        log_min, log_max = math.log(dt_min), math.log(dt_max)
        dt = np.exp(get_rng().random(self.d_inner) * (log_max - log_min) + log_min)
        dt = np.maximum(dt, dt_floor)
        self.dt_proj.bias.data[...] = dt + np.log(-np.expm1(-dt))  # softplus^-1(dt)

    # ----- the full sequence -----------------------------------------------------------------
    def _check_x(self, x) -> Tensor:
        x = as_tensor(x)
        if x.ndim != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must have shape (batch, L, d_model={self.d_model}), got "
                             f"{x.shape}")
        check_input_dtype(x, self.A_log.dtype, name="x", owner="Mamba")
        return x

    def forward(self, x, return_state: bool = False):
        """The mixer over whole sequences.

        Parameters
        ----------
        x : Tensor or array (batch, L, d_model)
        return_state : bool
            Also return the ``MambaState`` after the last step (to go on with ``step``).

        Returns
        -------
        Tensor (batch, L, d_model), differentiable in x and every parameter; with
        ``return_state``, ``(output, MambaState)``.
        """
        x = self._check_x(x)
        E, N, R, L = self.d_inner, self.d_state, self.dt_rank, x.shape[1]
        # channels-first from the start: W x^T gives (batch, E, L) rows that the convolution
        # and the scan read contiguously, with no transposed copies in between
        xz = _channels_first(self.in_proj, x.swapaxes(1, 2))  # (batch, 2E, L)
        u_in, z = xz[:, :E], xz[:, E:]
        u = _silu(self.conv1d(u_in)[..., :L])
        dbc = _channels_first(self.x_proj, u)  # (batch, R + 2N, L)
        delta = self.dt_proj.weight @ dbc[:, :R]  # (batch, E, L)
        B, C = dbc[:, R:R + N], dbc[:, R + N:]  # (batch, N, L)
        out = F.selective_scan(u, delta, -self.A_log.exp(), B, C, self.D, z=z,
                               delta_bias=self.dt_proj.bias, delta_softplus=True,
                               return_last_state=return_state)
        if not return_state:
            return self.out_proj(out.swapaxes(1, 2))
        y, ssm = out
        return self.out_proj(y.swapaxes(1, 2)), MambaState(self._window(u_in.data), ssm.data)

    def _window(self, u_in):
        """The convolution's last d_conv inputs of (batch, E, L) (zeros before the start)."""
        xp = array_module(u_in)
        K, L = self.d_conv, u_in.shape[-1]
        window = xp.zeros((*u_in.shape[:2], K), dtype=u_in.dtype)
        keep = min(K, L)
        if keep:
            window[..., K - keep:] = u_in[..., L - keep:]
        return window

    # ----- one token at a time ---------------------------------------------------------------
    def initial_state(self, batch: int) -> MambaState:
        """Zero state for ``batch`` sequences (before the first token)."""
        data = self.A_log.data
        xp = array_module(data)
        return MambaState(xp.zeros((batch, self.d_inner, self.d_conv), dtype=data.dtype),
                          xp.zeros((batch, self.d_inner, self.d_state), dtype=data.dtype))

    def step(self, x_t, state: MambaState | None = None):
        """One decoding step in O(1) time and memory: the output for token t from x_t and the
        state after token t - 1 (plain arrays, no gradient).

        Parameters
        ----------
        x_t : array or Tensor (batch, d_model)
        state : MambaState or None
            The state after the previous token (``initial_state`` when None).

        Returns
        -------
        (y_t (batch, d_model) array, new MambaState); the given state is not modified.
        """
        x_t = x_t.data if isinstance(x_t, Tensor) else x_t
        xp = array_module(self.A_log.data)
        x_t = xp.asarray(x_t)
        if x_t.ndim != 2 or x_t.shape[-1] != self.d_model:
            raise ValueError(f"x_t must have shape (batch, d_model={self.d_model}), got "
                             f"{x_t.shape}")
        check_input_dtype(x_t, self.A_log.dtype, name="x_t", owner="Mamba")
        state = self.initial_state(x_t.shape[0]) if state is None else state
        self._check_state(state, x_t.shape[0])
        with no_grad():
            return self._step(xp, x_t, state)

    def _check_state(self, state, batch: int) -> None:
        want = (batch, self.d_inner, self.d_conv), (batch, self.d_inner, self.d_state)
        if not isinstance(state, tuple) or len(state) != 2 or \
                tuple(state[0].shape) != want[0] or tuple(state[1].shape) != want[1]:
            raise ValueError(f"state must be a MambaState (conv {want[0]}, ssm {want[1]}) for "
                             f"batch {batch}")

    def _step(self, xp, x_t, state: MambaState):
        E, N, R = self.d_inner, self.d_state, self.dt_rank
        p = {name: t.data for name, t in self.named_parameters()}
        xz = _affine(x_t, p["in_proj.weight"], p.get("in_proj.bias"))
        u, z = xz[:, :E], xz[:, E:]
        window = xp.concatenate([state.conv[..., 1:], u[..., None]], axis=-1)  # (batch, E, K)
        u = (window * p["conv1d.weight"][:, 0, :]).sum(-1)
        if "conv1d.bias" in p:
            u = u + p["conv1d.bias"]
        u = u * _sigmoid(xp, u)
        dbc = u @ p["x_proj.weight"].T
        dt = _softplus(xp, _affine(dbc[:, :R], p["dt_proj.weight"], p["dt_proj.bias"]))
        B, C = dbc[:, R:R + N], dbc[:, R + N:]
        A = -xp.exp(p["A_log"])
        ssm = xp.exp(dt[..., None] * A) * state.ssm + (dt * u)[..., None] * B[:, None, :]
        y = (ssm * C[:, None, :]).sum(-1) + p["D"] * u
        y = y * (z * _sigmoid(xp, z))
        return _affine(y, p["out_proj.weight"], p.get("out_proj.bias")), MambaState(window, ssm)

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, d_state={self.d_state}, d_conv={self.d_conv}, "
                f"expand={self.expand}, dt_rank={self.dt_rank}")


def _channels_first(linear, x_t: Tensor) -> Tensor:
    """``linear`` applied to x_t (batch, in, L) as W x_t (+ b): (batch, out, L)."""
    y = linear.weight @ x_t
    return y if linear.bias is None else y + linear.bias.reshape(-1, 1)


def _silu(x: Tensor) -> Tensor:
    return x * F.sigmoid(x)


def _affine(x, weight, bias):
    """x W^T + b on arrays."""
    y = x @ weight.T
    return y if bias is None else y + bias


def _sigmoid(xp, x):
    return 0.5 * (xp.tanh(0.5 * x) + 1)  # no overflow for large |x|


def _softplus(xp, x):
    """torch's softplus as the scan kernels compute it: x above 20, else
    max(x, 0) + log1p(e^-|x|)."""
    return xp.where(x > 20, x, xp.maximum(x, 0) + xp.log1p(xp.exp(-xp.abs(x))))
