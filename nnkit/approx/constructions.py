"""1-D universal approximation by construction: sigmoid steps and bins, ReLU interpolants.

The construction of appendix B, one step at a time (all weights set by hand, every result
a real ``nn.Module`` that ``nk.optim`` can train further):

1. a step: one sigmoid unit, ``f(x) = a sigma(w (x - s))`` (appendix eq. E.B.1), a jump of
   height ``a`` at ``s`` when ``w`` is large;
2. a bin: two units, ``f(x; a, s, Delta) = a sigma(w(x - s + Delta/2)) - a sigma(w(x - s -
   Delta/2))`` (appendix eq. E.B.2), equal to ``a`` on ``[s - Delta/2, s + Delta/2]`` and 0
   elsewhere (appendix eq. E.B.2 is printed with the two terms' signs swapped, which gives
   ``-a`` on the bin; this is the form its text describes: up at ``s - Delta/2``, down at
   ``s + Delta/2``);
3. m bins: 2m units, ``f(x) = sum_i f(x; g_i, c_i, Delta)`` (appendix eq. E.B.3) with ``g_i``
   the mean of ``g`` over bin ``i`` (Gauss-Legendre quadrature).

The appendix centres bin ``i`` at ``i / m`` on [0, 1] (so the bins overhang the interval by
half a bin); here the m bins tile ``[lo, hi]`` exactly: ``c_i = lo + (i - 1/2) Delta``,
``Delta = (hi - lo) / m``.

Error of the bins. With ``g_i`` the bin mean, ``g - g_i ~ g'(c_i) (x - c_i)`` on bin ``i`` and
the mean squared error over the interval is, to leading order in ``Delta``,

    MSE ~ Delta^2 * mean(g'^2) / 12,        i.e. O(1 / m^2),

(:func:`predicted_bin_mse`). The sigmoid's own blur (width ~ 1/w) adds a term that depends
on ``w Delta``: measured for g = sin on [0, 10], the MSE stays within 2% of the prediction
for ``w Delta >= 100`` and grows below it (1.3x at 50, 13x at 10; benchmarks/RESULTS.md,
"Figures moved from docstrings"), so the fixed ``w = 1e4`` of the appendix serves up to
m ~ 1000 bins on [0, 10]; beyond, the steps' blur dominates. ``w=None`` scales
``w = max(1e4, 1e3 / Delta)`` (``w Delta >= 1000``), which keeps the ratio within a few
percent for any m.

ReLU interpolant (notes §2.5, Theorem 2.11): ``g(x) ~ a x + b + sum_i c_i (x - x_i)_+`` through
the m + 1 points ``x_k = lo + k Delta``; its mean squared error is
``~ Delta^4 mean(g''^2) / 120`` (:func:`predicted_relu_mse`), its sup error
``<= Delta^2 max|g''| / 8``: both O(1/m^2) in the error itself.
"""

from __future__ import annotations

import numbers

import numpy as np

from .. import functional as F
from .. import nn, optim
from .._random import get_rng, manual_seed
from .._validation import check_array, check_scalar
from ..autograd import no_grad
from ..kernels.approx import window_sum

__all__ = [
    "step",
    "bin_function",
    "bins_network",
    "bin_means",
    "sigmoid_bins",
    "relu_interpolant",
    "eval_sigmoid_net",
    "mean_squared_error",
    "predicted_bin_mse",
    "predicted_relu_mse",
    "random_network",
    "fit",
]

DEFAULT_W = 1e4
CUTOFF = 40.0  # sigma(-40) = 4e-18: beyond w |x - s| = 40 a unit is 0 or 1 to float64


# ---------------------------------------------------------------- validation
def check_function(g, name: str = "g"):
    """Raise ``ValueError`` unless ``g`` is callable."""
    if not callable(g):
        raise ValueError(f"{name} must be a callable taking a float64 array x of shape (N,) and "
                         f"returning an array of shape (N,); got {type(g).__name__}")
    return g


def check_interval(interval, name: str = "interval") -> tuple[float, float]:
    """``(lo, hi)`` as floats with ``lo < hi``, both finite; ``ValueError`` otherwise."""
    if isinstance(interval, (str, bytes)) or not hasattr(interval, "__len__"):
        raise TypeError(f"{name} must be a pair (lo, hi), got {type(interval).__name__}")
    if len(interval) != 2:
        raise ValueError(f"{name} must be a pair (lo, hi), got {len(interval)} values")
    lo = float(check_scalar(interval[0], name=f"{name}[0]"))
    hi = float(check_scalar(interval[1], name=f"{name}[1]"))
    if not lo < hi:
        raise ValueError(f"{name} is empty: need lo < hi, got ({lo!r}, {hi!r})")
    return lo, hi


def check_m(m, name: str = "m") -> int:
    """A positive integer (``ValueError`` for m < 1, ``TypeError`` for a non-integer)."""
    return int(check_scalar(m, name=name, kind=numbers.Integral, low=1))


def evaluate(g, x: np.ndarray, name: str = "g") -> np.ndarray:
    """``g(x)`` as a finite float64 array of ``x``'s shape (N,), or ``ValueError``."""
    try:
        y = np.asarray(g(x), dtype=np.float64)
    except Exception as exc:  # g failed on an array: it must be vectorised
        raise ValueError(f"{name} failed on a float64 array of shape {x.shape}: {exc!r}; "
                         f"{name} must be vectorised (e.g. np.sin, not math.sin)") from None
    if y.shape != x.shape:
        raise ValueError(f"{name} must return an array of shape {x.shape} for x of shape "
                         f"{x.shape}; got shape {y.shape}")
    if not np.isfinite(y).all():
        raise ValueError(f"{name} returned NaN or infinity on the interval")
    return y


def _check_w(w, delta: float) -> float:
    if w is None:
        return max(DEFAULT_W, 1e3 / delta)
    return float(check_scalar(w, name="w", low=0, low_inclusive=False))


# ---------------------------------------------------------------- building blocks
def _sigmoid_layer(weight, bias, out_weight, out_bias: float = 0.0) -> nn.Sequential:
    """``x -> sum_j out_weight_j sigma(weight_j x + bias_j) + out_bias`` as a float64 module."""
    k = len(weight)
    net = nn.Sequential(nn.Linear(1, k, dtype=np.float64), nn.Sigmoid(),
                        nn.Linear(k, 1, dtype=np.float64))
    net[0].weight.data[:, 0] = weight  # (k, 1)
    net[0].bias.data[:] = bias
    net[2].weight.data[0, :] = out_weight  # (1, k)
    net[2].bias.data[:] = out_bias
    return net


def step(a: float, s: float, w: float = DEFAULT_W) -> nn.Sequential:
    """One sigmoid unit as a step of height ``a`` at ``s`` (appendix eq. E.B.1):
    ``a sigma(w (x - s))``.

    Returns ``Sequential(Linear(1, 1), Sigmoid(), Linear(1, 1))`` in float64 with weight
    ``w``, bias ``-w s``, output weight ``a`` and output bias 0. Input (N, 1), output (N, 1).

    Examples
    --------
    >>> import numpy as np
    >>> from nnkit.approx import step
    >>> float(step(2.0, 0.3)(np.array([[0.0], [1.0]])).numpy()[1, 0])  # float64 input
    2.0
    """
    a = float(check_scalar(a, name="a"))
    s = float(check_scalar(s, name="s"))
    w = float(check_scalar(w, name="w", low=0, low_inclusive=False))
    return _sigmoid_layer([w], [-w * s], [a])


def _bin_units(heights, centers, delta, w):
    """Unit arrays (weight, bias, out_weight) of 2k units: up at c - D/2, down at c + D/2."""
    heights, centers = np.asarray(heights, float), np.asarray(centers, float)
    edges = np.stack([centers - delta / 2, centers + delta / 2], axis=1).ravel()  # (2k,)
    amplitudes = np.stack([heights, -heights], axis=1).ravel()  # (2k,)
    return np.full(edges.shape, w), -w * edges, amplitudes


def bin_function(a: float, s: float, delta: float, w: float = DEFAULT_W) -> nn.Sequential:
    """Two units as a bin (appendix eq. E.B.2): ``f(x; a, s, Delta) = a sigma(w(x - s +
    Delta/2)) - a sigma(w(x - s - Delta/2))``, about ``a`` on ``[s - Delta/2, s + Delta/2]``,
    0 elsewhere.

    Appendix eq. E.B.2 as printed has the two signs swapped (it is ``-a`` on the bin as
    printed); this is the form the appendix's text describes.

    Examples
    --------
    >>> import numpy as np
    >>> from nnkit.approx import bin_function
    >>> bin_function(0.5, 0.5, 0.2)(np.array([[0.5], [0.9]])).numpy().round(6).ravel().tolist()
    [0.5, 0.0]
    """
    a = float(check_scalar(a, name="a"))
    s = float(check_scalar(s, name="s"))
    delta = float(check_scalar(delta, name="delta", low=0, low_inclusive=False))
    w = float(check_scalar(w, name="w", low=0, low_inclusive=False))
    return _sigmoid_layer(*_bin_units([a], [s], delta, w))


def bins_network(heights, centers, delta: float, w: float = DEFAULT_W) -> nn.Sequential:
    """The sum of k bins (appendix eq. E.B.3): 2k sigmoid units, bin i of height
    ``heights[i]`` centred at ``centers[i]``, width ``delta``. Units are ordered (up_1,
    down_1, up_2, down_2, ...)."""
    heights = check_array(heights, name="heights", ndim=1, finite=True).astype(np.float64)
    centers = check_array(centers, name="centers", ndim=1, finite=True).astype(np.float64)
    if heights.shape != centers.shape or heights.size == 0:
        raise ValueError(f"heights and centers must be non-empty and of one length, got "
                         f"{heights.shape} and {centers.shape}")
    delta = float(check_scalar(delta, name="delta", low=0, low_inclusive=False))
    w = float(check_scalar(w, name="w", low=0, low_inclusive=False))
    return _sigmoid_layer(*_bin_units(heights, centers, delta, w))


def bin_means(g, m: int, interval=(0.0, 1.0), nodes: int = 8) -> np.ndarray:
    """``g_i = (1/Delta) int_{B_i} g(x) dx`` for the m equal bins of ``interval``, shape (m,).

    Gauss-Legendre quadrature with ``nodes`` points per bin (exact for polynomials of degree
    ``2 nodes - 1``); one vectorised call ``g(x)`` with x of shape (m * nodes,).
    """
    g = check_function(g)
    m = check_m(m)
    lo, hi = check_interval(interval)
    t, wq = np.polynomial.legendre.leggauss(nodes)  # nodes on [-1, 1], weights sum to 2
    delta = (hi - lo) / m
    centers = lo + (np.arange(m) + 0.5) * delta
    x = (centers[:, None] + 0.5 * delta * t[None, :]).ravel()  # (m * nodes,)
    y = evaluate(g, x).reshape(m, nodes)
    return y @ wq / 2.0


def sigmoid_bins(g, m: int, interval=(0.0, 1.0), w: float | None = DEFAULT_W) -> nn.Sequential:
    """The appendix's construction: m bins, 2m sigmoid units, heights the bin means of g.

    Parameters
    ----------
    g : callable
        Vectorised target, ``g(x)`` for x of shape (N,) float64 returns shape (N,).
    m : int >= 1
        Number of bins.
    interval : (lo, hi)
        The domain, lo < hi; bins tile it, ``Delta = (hi - lo) / m``.
    w : float > 0 or None
        Sigmoid steepness (1e4, the appendix's choice). ``None`` scales it with the bins,
        ``w = max(1e4, 1e3 / Delta)``, keeping the blur's share of the error ~1%.

    Returns
    -------
    nn.Sequential
        ``Linear(1, 2m) -> Sigmoid -> Linear(2m, 1)``, float64, input (N, 1), output (N, 1):
        ``f(x) = sum_i g_i [sigma(w(x - c_i + Delta/2)) - sigma(w(x - c_i - Delta/2))]``.
        A forward through it costs O(N m) memory; :func:`eval_sigmoid_net` evaluates the same
        function in O(N (log m + window)).

    Examples
    --------
    >>> import numpy as np
    >>> from nnkit.approx import sigmoid_bins
    >>> net = sigmoid_bins(np.sin, 50, (0, 10))
    >>> net[0].out_features
    100
    """
    m = check_m(m)
    lo, hi = check_interval(interval)
    delta = (hi - lo) / m
    w = _check_w(w, delta)
    heights = bin_means(g, m, (lo, hi))
    centers = lo + (np.arange(m) + 0.5) * delta
    return _sigmoid_layer(*_bin_units(heights, centers, delta, w))


def relu_interpolant(g, m: int, interval=(0.0, 1.0)) -> nn.Sequential:
    """Piecewise-linear interpolant of g through m + 1 equispaced points, m ReLU units.

    Notes §2.5, Theorem 2.11: ``g(x) ~ a x + b + sum_{i=1}^{m-1} c_i (x - x_i)_+`` with knots
    ``x_k = lo + k Delta``, written with the linear part as one more ReLU, ``a (x - x_0)_+``,
    which equals ``a (x - x_0)`` on the interval:

        f(x) = g(x_0) + sum_{k=0}^{m-1} c_k (x - x_k)_+,   c_0 = slope_0,
        c_k = slope_k - slope_{k-1},   slope_k = (g(x_{k+1}) - g(x_k)) / Delta.

    Returns ``Linear(1, m) -> ReLU -> Linear(m, 1)`` in float64 (input (N, 1), output (N, 1)).
    Left of ``lo`` it is constant ``g(lo)``, right of ``hi`` it continues the last piece.
    """
    g = check_function(g)
    m = check_m(m)
    lo, hi = check_interval(interval)
    knots = np.linspace(lo, hi, m + 1)
    values = evaluate(g, knots)
    slopes = np.diff(values) / np.diff(knots)  # (m,)
    coef = np.diff(slopes, prepend=0.0)  # c_0 = slope_0, c_k = slope_k - slope_{k-1}
    net = nn.Sequential(nn.Linear(1, m, dtype=np.float64), nn.ReLU(),
                        nn.Linear(m, 1, dtype=np.float64))
    net[0].weight.data[:, 0] = 1.0
    net[0].bias.data[:] = -knots[:-1]
    net[2].weight.data[0, :] = coef
    net[2].bias.data[:] = values[0]
    return net


# ---------------------------------------------------------------- fast evaluation
def _unit_arrays(net):
    """(weight, bias, out_weight, out_bias) of a 1-input one-hidden-layer sigmoid net."""
    ok = (isinstance(net, nn.Sequential) and len(net) == 3 and isinstance(net[1], nn.Sigmoid)
          and isinstance(net[0], nn.Linear) and isinstance(net[2], nn.Linear)
          and net[0].in_features == 1 and net[2].out_features == 1)
    if not ok:
        raise ValueError("net must be Sequential(Linear(1, k), Sigmoid(), Linear(k, 1)), the "
                         "shape sigmoid_bins returns")
    w = np.asarray(net[0].weight.data, np.float64)[:, 0]
    b = np.zeros_like(w) if net[0].bias is None else np.asarray(net[0].bias.data, np.float64)
    a = np.asarray(net[2].weight.data, np.float64)[0]
    c = 0.0 if net[2].bias is None else float(net[2].bias.data[0])
    return w, b, a, c


def eval_sigmoid_net(net, x, cutoff: float = CUTOFF) -> np.ndarray:
    """Evaluate ``Sequential(Linear(1, k), Sigmoid(), Linear(k, 1))`` at many points, fast.

    ``f(x) = c + sum_j a_j sigma(w_j x + b_j)``. Units with ``w_j < 0`` are rewritten with
    ``sigma(z) = 1 - sigma(-z)`` so every slope is positive; with transition points
    ``s_j = -b_j / w_j`` sorted, a unit whose ``w_j (x - s_j)`` exceeds ``cutoff`` (40) is 1 and
    one below ``-cutoff`` is 0 to within ``sigma(-40) = 4e-18``, so

        f(x) = c + const + A(x - tau) + sum_{|s_j - x| < tau} a_j sigma(w_j x + b_j),

    with ``A`` a prefix sum of the sorted ``a_j`` and ``tau = cutoff / min_j w_j``. Units so
    flat that their transition is wider than the range of x (``|w_j| (range + 1) <= cutoff``)
    are summed densely instead, so ``tau`` never exceeds the range. Absolute
    error <= ``sum |a_j| exp(-cutoff)`` against the exact sum. Cost O(N (log k + window))
    instead of the forward's O(N k) time and memory: for the bin construction (all w equal)
    the window holds ~ 4 cutoff / (w Delta) units. Numba, parallel over points for large N.

    Parameters
    ----------
    net : nn.Sequential
        A 1-input one-hidden-layer sigmoid network (e.g. from :func:`sigmoid_bins`).
    x : array_like, shape (N,) or (N, 1)
    cutoff : float > 0

    Returns
    -------
    ndarray, float64, shape (N,)
    """
    w, b, a, c = _unit_arrays(net)
    x = check_array(x, name="x", ndim=(1, 2), finite=True).astype(np.float64, copy=False)
    if x.ndim == 2 and x.shape[1] != 1:
        raise ValueError(f"x must have shape (N,) or (N, 1), got {x.shape}")
    x = np.ascontiguousarray(x.reshape(-1))
    cutoff = float(check_scalar(cutoff, name="cutoff", low=0, low_inclusive=False))
    if x.size == 0:
        return np.empty(0)
    if not all(np.isfinite(v).all() for v in (w, b, a, c)):  # NaN/inf propagate as in the
        with np.errstate(invalid="ignore", over="ignore"):  # forward: the exact dense sum
            return c + np.broadcast_to(_dense_sum(x, w, b, a), x.shape)
    # units whose transition is wider than the data's range go to a dense sum
    dense = np.abs(w) * (x.max() - x.min() + 1.0) <= cutoff
    const = c + _dense_sum(x, w[dense], b[dense], a[dense])
    w, b, a = w[~dense], b[~dense], a[~dense]
    neg = w < 0
    const = const + float(np.sum(a[neg]))  # a sigma(z) = a - a sigma(-z)
    w, b, a = np.where(neg, -w, w), np.where(neg, -b, b), np.where(neg, -a, a)
    with np.errstate(over="ignore"):
        s = -b / w  # transition points; +-inf for units constant on any float64 x
    order = np.argsort(s, kind="stable")
    w, b, a, s = w[order], b[order], a[order], s[order]
    prefix = np.concatenate([[0.0], np.cumsum(a)])  # (k + 1,)
    tau = cutoff / w.min() if w.size else 0.0
    out = np.empty_like(x)
    window_sum(x, s, w, b, a, prefix, tau, out)
    return out + const


def _dense_sum(x, w, b, a, chunk: int = 1 << 22):
    """sum_j a_j sigma(w_j x + b_j) for every x, in blocks of ``chunk`` entries; (N,) or 0."""
    if w.size == 0:
        return 0.0
    rows = max(1, chunk // w.size)
    out = np.empty_like(x)
    for i in range(0, len(x), rows):
        z = x[i:i + rows, None] * w + b  # (rows, k)
        out[i:i + rows] = (0.5 * (1.0 + np.tanh(0.5 * z))) @ a
    return out


def forward_numpy(net, x) -> np.ndarray:
    """The module's own forward without autograd, in chunks; x (N,) -> (N,) float64."""
    x = np.asarray(x, np.float64).reshape(-1, 1)
    chunk = max(1, 2_000_000 // max(1, _width(net)))
    with no_grad():
        parts = [np.asarray(net(x[i:i + chunk]).numpy(), np.float64).reshape(-1)
                 for i in range(0, len(x), chunk)]
    return np.concatenate(parts) if parts else np.empty(0)


def _width(net) -> int:
    return max((p.data.size for p in net.parameters()), default=1)


def mean_squared_error(net, g, interval=(0.0, 1.0), n_points: int = 200_000) -> float:
    """``(1 / (hi - lo)) int (g - f)^2 dx`` by the midpoint rule on ``n_points`` points.

    Uses :func:`eval_sigmoid_net` for 1-D sigmoid networks (any size), the module's forward
    otherwise. ``n_points`` must resolve the sigmoid's width 1/w where it matters.
    """
    g = check_function(g)
    lo, hi = check_interval(interval)
    n_points = check_m(n_points, "n_points")
    x = lo + (np.arange(n_points) + 0.5) * (hi - lo) / n_points
    try:
        f = eval_sigmoid_net(net, x)
    except ValueError:
        f = forward_numpy(net, x)
    return float(np.mean((evaluate(g, x) - f) ** 2))


def _derivative_mean_square(g, lo, hi, order, n=200_001):
    x = np.linspace(lo, hi, n)
    d = evaluate(g, x)
    for _ in range(order):
        d = np.gradient(d, x, edge_order=2)
    return float(np.mean(d ** 2))


def predicted_bin_mse(g, m: int, interval=(0.0, 1.0)) -> float:
    """Leading-order MSE of the bin construction: ``Delta^2 mean(g'^2) / 12``, g' by finite
    differences on 200001 points."""
    m = check_m(m)
    lo, hi = check_interval(interval)
    delta = (hi - lo) / m
    return delta ** 2 * _derivative_mean_square(check_function(g), lo, hi, 1) / 12.0


def predicted_relu_mse(g, m: int, interval=(0.0, 1.0)) -> float:
    """Leading-order MSE of linear interpolation: ``Delta^4 mean(g''^2) / 120``
    (the error on a piece is ``~ g'' t (Delta - t) / 2``; its mean square is the above)."""
    m = check_m(m)
    lo, hi = check_interval(interval)
    delta = (hi - lo) / m
    return delta ** 4 * _derivative_mean_square(check_function(g), lo, hi, 2) / 120.0


# ---------------------------------------------------------------- training
def random_network(hidden: int, activation: str = "sigmoid", random_state=None):
    """``Linear(1, hidden) -> act -> Linear(hidden, 1)``, float64, torch's default init."""
    hidden = check_m(hidden, "hidden")
    acts = {"sigmoid": nn.Sigmoid, "relu": nn.ReLU, "tanh": nn.Tanh}
    if activation not in acts:
        raise ValueError(f"activation must be one of {sorted(acts)}, got {activation!r}")
    if random_state is not None:
        manual_seed(int(get_rng(random_state).integers(2 ** 31)))
    return nn.Sequential(nn.Linear(1, hidden, dtype=np.float64), acts[activation](),
                         nn.Linear(hidden, 1, dtype=np.float64))


def fit(net, g, interval=(0.0, 1.0), steps: int = 2000, lr: float = 1e-2,
        n_points: int = 512, standardize: bool = False):
    """Train ``net`` in place with full-batch Adam on the MSE to ``g`` at ``n_points``
    equispaced points of ``interval``; return the list of losses (one per step).

    ``standardize=True`` feeds the net ``(x - mid) / half_width`` (in [-1, 1]) instead of x,
    the usual preprocessing; the net then approximates ``g(mid + half_width u)`` in u.
    """
    g = check_function(g)
    lo, hi = check_interval(interval)
    steps = check_m(steps, "steps")
    lr = float(check_scalar(lr, name="lr", low=0, low_inclusive=False))
    n_points = check_m(n_points, "n_points")
    x = np.linspace(lo, hi, n_points)
    y = evaluate(g, x).reshape(-1, 1)
    if standardize:
        x = (x - (lo + hi) / 2) / ((hi - lo) / 2)
    x = x.reshape(-1, 1)
    opt = optim.Adam(net.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        loss = F.mse_loss(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses
