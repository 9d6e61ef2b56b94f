"""Barron's O(1/m) rate (notes §2.4, Theorem 2.7) as an experiment.

Theorem 2.7: a target f with finite Barron norm C_f = int |omega| |f_hat(omega)| d omega has,
for every width m, a one-hidden-layer network g_m of m sigmoidal units with
``int_{rB} (f - g_m)^2 mu(dx) <= (2 r C_f)^2 / m`` for any probability measure mu on the ball
rB: the rate 1/m does not depend on the input dimension d.

The experiment trains such networks (tanh units, which are sigmoidal: tanh z = 2 sigma(2z) - 1)
of widths m on one target per d and reports the held-out mean squared error against m and
its log-log slope, which the theorem bounds by -1 for the best m-unit network. The target
(:func:`barron_target`) is a sum of K cosine ridges with unit directions and weights 1/k,

    f(x) = sum_k a_k cos(omega w_k . x + b_k) / ||a||,   a_k = 1/k,  ||w_k|| = 1,

whose Barron norm is C_f = omega sum_k a_k / ||a|| whatever d. mu is uniform on the cube
[-1, 1]^d (in the ball of radius r = sqrt(d)), so the projections w_k . x, and with them the
difficulty of each ridge, have a distribution that hardly changes with d. Each training step
draws a fresh batch from mu (online Adam on the population risk), so the error measured on a
held-out sample is the approximation error of the trained network, not overfitting. The
theorem is about the best network of each width; a trained one is an upper estimate of it.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

import numpy as np

from .. import functional as F
from .. import nn, optim
from .._random import get_rng, manual_seed
from .._validation import check_scalar
from ..autograd import no_grad

__all__ = ["BarronTarget", "BarronResult", "barron_target", "train_width", "barron_experiment"]


@dataclass(frozen=True)
class BarronTarget:
    """f(x) = sum_k a_k cos(frequency w_k . x + b_k) / ||a||: a vectorised callable.

    Attributes
    ----------
    directions : ndarray (K, d) float64, unit rows w_k
    phases : ndarray (K,) float64, b_k
    weights : ndarray (K,) float64, a_k / ||a||
    frequency : float
    """

    directions: np.ndarray
    phases: np.ndarray
    weights: np.ndarray
    frequency: float

    @property
    def dim(self) -> int:
        return self.directions.shape[1]

    @property
    def barron_norm(self) -> float:
        """C_f = frequency * sum_k |a_k|: each ridge's spectrum sits at |omega| = frequency."""
        return self.frequency * float(np.abs(self.weights).sum())

    def __call__(self, x) -> np.ndarray:
        """f at the rows of x (N, d); returns (N,) float64."""
        x = np.asarray(x, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != self.dim:
            raise ValueError(f"x must have shape (N, {self.dim}), got {x.shape}")
        return np.cos(self.frequency * x @ self.directions.T + self.phases) @ self.weights


def barron_target(d: int, n_ridges: int = 64, frequency: float = 3.0,
                  random_state=None) -> BarronTarget:
    """The experiment's target in d dimensions: K = ``n_ridges`` cosine ridges, weights 1/k.

    Directions are uniform on the unit sphere, phases uniform on [0, 2 pi); f has unit
    root-mean-square weight (sum of a_k^2 = 1).

    Examples
    --------
    >>> import numpy as np
    >>> from nnkit.approx import barron_target
    >>> f = barron_target(8, random_state=0)
    >>> f(np.zeros((3, 8))).shape, round(f.barron_norm, 2)
    ((3,), 11.15)
    """
    d = int(check_scalar(d, name="d", kind=numbers.Integral, low=1))
    n_ridges = int(check_scalar(n_ridges, name="n_ridges", kind=numbers.Integral, low=1))
    frequency = float(check_scalar(frequency, name="frequency", low=0, low_inclusive=False))
    rng = get_rng(random_state)
    w = rng.standard_normal((n_ridges, d))
    w /= np.linalg.norm(w, axis=1, keepdims=True)  # (K, d), unit rows
    a = 1.0 / np.arange(1, n_ridges + 1)
    return BarronTarget(w, rng.uniform(0, 2 * np.pi, n_ridges), a / np.linalg.norm(a), frequency)


def _cube(rng, n: int, d: int) -> np.ndarray:
    return rng.uniform(-1.0, 1.0, (n, d))  # mu: uniform on [-1, 1]^d


def train_width(target: BarronTarget, m: int, steps: int = 1500, batch_size: int = 1024,
                lr: float = 1e-2, n_test: int = 8192, random_state=None):
    """Train ``Linear(d, m) -> Tanh -> Linear(m, 1)`` (float64) on ``target`` under mu.

    Adam on a fresh batch of ``batch_size`` points of [-1, 1]^d every step, learning rate
    ``lr`` decayed to 0 on a cosine; the error is measured on ``n_test`` further points.

    Returns
    -------
    net : nn.Sequential
    mse : float
        mean over the test points of (f(x) - net(x))^2, the theorem's int (f - g_m)^2 d mu.
    """
    m = int(check_scalar(m, name="m", kind=numbers.Integral, low=1))
    steps = int(check_scalar(steps, name="steps", kind=numbers.Integral, low=1))
    batch_size = int(check_scalar(batch_size, name="batch_size", kind=numbers.Integral, low=1))
    n_test = int(check_scalar(n_test, name="n_test", kind=numbers.Integral, low=1))
    lr = float(check_scalar(lr, name="lr", low=0, low_inclusive=False))
    rng = get_rng(random_state)
    d = target.dim
    manual_seed(int(rng.integers(2**31)))  # the initialisation
    net = nn.Sequential(nn.Linear(d, m, dtype=np.float64), nn.Tanh(),
                        nn.Linear(m, 1, dtype=np.float64))
    opt = optim.Adam(net.parameters(), lr=lr)
    for t in range(steps):
        opt.param_groups[0]["lr"] = lr * 0.5 * (1.0 + math.cos(math.pi * t / steps))
        x = _cube(rng, batch_size, d)
        loss = F.mse_loss(net(x), target(x)[:, None])
        opt.zero_grad()
        loss.backward()
        opt.step()
    x = _cube(rng, n_test, d)
    with no_grad():
        residual = net(x).numpy()[:, 0] - target(x)
    return net, float(np.mean(residual ** 2))


@dataclass
class BarronResult:
    """Held-out MSE of the trained widths per dimension, and the log-log slopes.

    Attributes
    ----------
    widths : ndarray (M,) int
    mse : dict d -> ndarray (M,) float64
    slopes : dict d -> float
        Least-squares slope of log MSE against log m (Theorem 2.7: <= -1 for the best
        networks, whatever d).
    variance : dict d -> float
        Var f under mu (the MSE of the best constant), for scale.
    """

    widths: np.ndarray
    mse: dict = field(default_factory=dict)
    slopes: dict = field(default_factory=dict)
    variance: dict = field(default_factory=dict)

    def plot(self, ax, title="Barron's rate (Theorem 2.7)"):
        """Draw MSE against m per d on log-log axes, beside the 1/m line (a matplotlib Axes)."""
        for d, mse in self.mse.items():
            ax.loglog(self.widths, mse, "o-", label=f"d = {d}: slope {self.slopes[d]:.2f}")
        first = max(mse[0] for mse in self.mse.values())
        ax.loglog(self.widths, first * self.widths[0] / self.widths, "k--", label="1/m")
        ax.set_xticks(self.widths, [str(m) for m in self.widths])
        ax.set_xticks([], minor=True)
        ax.set_xlabel("hidden units m")
        ax.set_ylabel("held-out mean squared error")
        ax.set_title(title)
        ax.legend(fontsize=8)


def barron_experiment(dims=(2, 8, 32), widths=(2, 4, 8, 16, 32), steps: int = 1500,
                      batch_size: int = 1024, lr: float = 1e-2, n_ridges: int = 64,
                      n_test: int = 8192, random_state=0) -> BarronResult:
    """MSE against width m for each input dimension d (:func:`train_width` per pair).

    Parameters
    ----------
    dims : sequence of int >= 1
    widths : sequence of int >= 1, at least two
    steps, batch_size, lr, n_test : see :func:`train_width`
    n_ridges : int, the target's K (:func:`barron_target`)
    random_state : int, Generator or None
        Seeds the targets, the data and the initialisations; each d draws from its own
        stream, so its row does not depend on which other dimensions are run.

    Returns
    -------
    BarronResult

    Examples
    --------
    >>> from nnkit.approx import barron_experiment
    >>> res = barron_experiment(dims=(4,), widths=(2, 8), steps=300, batch_size=256)
    >>> bool(res.mse[4][1] < res.mse[4][0])
    True
    """
    dims = [int(check_scalar(d, name="dims[i]", kind=numbers.Integral, low=1)) for d in dims]
    widths = np.array([int(check_scalar(m, name="widths[i]", kind=numbers.Integral, low=1))
                       for m in widths])
    if len(widths) < 2 or len(set(widths.tolist())) < 2:
        raise ValueError(f"widths must hold at least two different widths to fit a slope, "
                         f"got {widths.tolist()}")
    base = int(get_rng(random_state).integers(2**63))
    result = BarronResult(widths=widths)
    for d in dims:
        rng = np.random.default_rng([base, d])  # d's draws do not depend on the other dims
        target = barron_target(d, n_ridges=n_ridges, random_state=rng)
        errors = [train_width(target, m, steps=steps, batch_size=batch_size, lr=lr,
                              n_test=n_test, random_state=rng)[1] for m in widths]
        result.mse[d] = np.array(errors)
        result.slopes[d] = float(np.polyfit(np.log(widths), np.log(errors), 1)[0])
        result.variance[d] = float(np.var(target(_cube(rng, n_test, d))))
    return result
