"""Activation patterns and linear regions of ReLU networks (notes §2.5).

A ReLU layer's pattern at x is ``1{W x + b > 0}``; a network's pattern concatenates every ReLU
layer's. The set of inputs with one full pattern is an intersection of half-spaces (given the
pattern every layer is affine in x), hence convex and connected: the regions are exactly the
distinct patterns with non-empty interior. ``count_linear_regions`` counts them inside a box:

* 1-D, any depth: exact, by following the breakpoints layer by layer;
* 2-D, one hidden ReLU layer: exact, the cells of a line arrangement inside a box by Euler's
  formula, ``R = 1 + C + sum_p (k_p - 1)`` (C lines crossing the box's interior, k_p lines
  through each interior intersection point p);
* otherwise: a lower bound by dense sampling (every distinct pattern seen is one region).

These are *activation* regions; the function's linear pieces are the same unless two adjacent
regions happen to carry the same affine map (e.g. a unit with zero output weight).

``montufar_network`` builds the Montufar et al. (2014) network whose regions reach
``R(m) floor(m/n)^{n(L-1)}`` with ``R(m) = sum_{i<=n} C(m, i)`` on ``[0, 1]^n``.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from .. import nn
from .._validation import check_array, check_scalar

__all__ = ["RegionCount", "activation_patterns", "count_linear_regions", "montufar_network"]

TOL = 1e-9  # relative: breakpoints / points closer than TOL * box size are one


class RegionCount(int):
    """An ``int`` (the number of regions) with ``exact`` (bool) and ``method`` (str)."""

    def __new__(cls, count: int, exact: bool, method: str):
        obj = super().__new__(cls, int(count))
        obj.exact, obj.method = bool(exact), method
        return obj

    def __repr__(self) -> str:
        return f"RegionCount({int(self)}, exact={self.exact}, method={self.method!r})"


# ---------------------------------------------------------------- the network as affine maps
def _flatten(net):
    if isinstance(net, nn.Sequential):
        for m in net:
            yield from _flatten(m)
    else:
        yield net


def _layers(net) -> list:
    """[('affine', W (out, in) float64, b (out,)) | ('relu',)] with consecutive affines fused."""
    if not isinstance(net, nn.Module):
        raise TypeError(f"net must be an nn.Module, got {type(net).__name__}")
    out = []
    for mod in _flatten(net):
        if isinstance(mod, nn.Linear):
            W = np.asarray(mod.weight.data, np.float64)
            b = (np.zeros(W.shape[0]) if mod.bias is None
                 else np.asarray(mod.bias.data, np.float64))
            if out and out[-1][0] == "affine":  # fuse: W2 (W1 x + b1) + b2
                _, W1, b1 = out.pop()
                W, b = W @ W1, W @ b1 + b
            out.append(("affine", W, b))
        elif isinstance(mod, nn.ReLU):
            out.append(("relu",))
        elif not isinstance(mod, nn.Identity):
            raise TypeError(f"net may hold only Linear, ReLU and Identity layers (a ReLU "
                            f"network); found {type(mod).__name__}")
    if not any(kind[0] == "affine" for kind in out):
        raise ValueError("net has no Linear layer: its input size is unknown")
    return out


def _input_size(layers) -> int:
    return next(layer[1].shape[1] for layer in layers if layer[0] == "affine")


def activation_patterns(net, X) -> np.ndarray:
    """Activation pattern ``1{z > 0}`` of every ReLU unit at every input.

    Parameters
    ----------
    net : nn.Module
        A ReLU network: ``Sequential`` of ``Linear``, ``ReLU`` (and ``Identity``).
    X : array_like, shape (N, n)

    Returns
    -------
    ndarray of bool, shape (N, H)
        H the total number of ReLU units, layers in order; column j is unit j's pattern
        (the pre-activation strictly positive).
    """
    layers = _layers(net)
    X = check_array(X, name="X", ndim=2, finite=True).astype(np.float64, copy=False)
    n = _input_size(layers)
    if X.shape[1] != n:
        raise ValueError(f"X has {X.shape[1]} features but net takes {n}; expected (N, {n})")
    h, pats = X, []
    for layer in layers:
        if layer[0] == "affine":
            h = h @ layer[1].T + layer[2]
        else:
            pats.append(h > 0)
            h = np.where(pats[-1], h, 0.0)
    return np.concatenate(pats, axis=1) if pats else np.zeros((len(X), 0), bool)


# ---------------------------------------------------------------- 1-D: breakpoints, exact
def _count_1d(layers, lo: float, hi: float) -> int:
    """Exact count on (lo, hi): split the pieces at every unit's zero, layer by layer."""
    tol = TOL * (hi - lo)
    breaks = np.array([lo, hi])
    A, c = np.ones((1, 1)), np.zeros((1, 1))  # features = A x + c on each piece; (P, k)
    pats = np.zeros((1, 0), bool)
    for layer in layers:
        if layer[0] == "affine":
            A, c = A @ layer[1].T, c @ layer[1].T + layer[2]
            continue
        with np.errstate(divide="ignore", invalid="ignore"):
            roots = -c / A  # (P, k)
        inside = (roots > breaks[:-1, None] + tol) & (roots < breaks[1:, None] - tol)
        new = np.sort(np.concatenate([breaks, roots[inside & (A != 0)]]))
        new = new[np.concatenate([[True], np.diff(new) > tol])]
        new[-1] = hi
        mids = (new[:-1] + new[1:]) / 2
        parent = np.searchsorted(breaks, mids) - 1  # the old piece each new one lies in
        A, c, pats, breaks = A[parent], c[parent], pats[parent], new
        active = A * mids[:, None] + c > 0  # (P, k), constant on each new piece
        A, c = A * active, c * active
        pats = np.concatenate([pats, active], axis=1)
    return 1 + int(np.any(pats[1:] != pats[:-1], axis=1).sum())


# ---------------------------------------------------------------- 2-D, one layer: Euler
def _distinct_lines(W, b, tol):
    """Unit normals and offsets of the distinct lines w.x + b = 0 (zero rows dropped)."""
    norms = np.linalg.norm(W, axis=1)
    keep = norms > 0
    W, b = W[keep] / norms[keep, None], b[keep] / norms[keep]
    flip = (W[:, 0] < 0) | ((W[:, 0] == 0) & (W[:, 1] < 0))  # canonical orientation
    W[flip], b[flip] = -W[flip], -b[flip]
    lines = np.concatenate([W, b[:, None]], axis=1)  # (k, 3)
    kept = []
    for i in range(len(lines)):
        if all(np.abs(lines[i] - lines[j]).max() > tol for j in kept):
            kept.append(i)
    return lines[kept]


def _count_arrangement(W, b, bounds) -> int:
    """Cells of the arrangement of lines W x + b = 0 inside the open box ``bounds``.

    Lines are added one at a time: a chord (a line through the box's interior) that crosses
    the earlier chords at D distinct interior points is cut into D + 1 segments, each of which
    splits one cell in two, so ``R = 1 + sum_i (1 + D_i)`` (Euler's formula; a point where k
    lines meet counts k - 1 times in all). Crossings are compared along each line (1-D), so
    concurrent lines are found without clustering points in the plane: two crossings are one
    when closer than ``_rounding_bound``, 1e-11 (1 + |t| + |offset|) / |sin(angle)|, some
    thousand times float64's rounding of Cramer's rule and far below the gaps of lines in
    general position.
    """
    (x0, x1), (y0, y1) = bounds
    tol = TOL * max(x1 - x0, y1 - y0, abs(x0), abs(x1), abs(y0), abs(y1))
    lines = _distinct_lines(W, b, TOL)  # (k, 3): unit normal, offset
    corners = np.array([[x0, y0], [x0, y1], [x1, y0], [x1, y1]])
    vals = corners @ lines[:, :2].T + lines[:, 2]  # (4, k)
    lines = lines[(vals.min(axis=0) < -tol) & (vals.max(axis=0) > tol)]  # chords only
    normals, offsets = lines[:, :2], lines[:, 2]
    directions = np.stack([-normals[:, 1], normals[:, 0]], axis=1)  # (k, 2)
    regions = 1
    for i in range(len(lines)):
        origin = -offsets[i] * normals[i]  # the line's point closest to 0
        denom = normals[:i] @ directions[i]  # (i,)
        crossing = np.abs(denom) > TOL  # parallel lines never meet
        t = -(normals[:i][crossing] @ origin + offsets[:i][crossing]) / denom[crossing]
        p = origin + t[:, None] * directions[i]  # (q, 2) crossing points
        inside = ((p[:, 0] > x0 + tol) & (p[:, 0] < x1 - tol)
                  & (p[:, 1] > y0 + tol) & (p[:, 1] < y1 - tol))
        t, slack = t[inside], _rounding_bound(t[inside], offsets[i], denom[crossing][inside])
        order = np.argsort(t)
        t, slack = t[order], slack[order]
        gaps = np.diff(t) > np.maximum(slack[1:], slack[:-1])
        distinct = int(t.size > 0) + int(np.sum(gaps))
        regions += 1 + distinct
    return regions


def _rounding_bound(t, offset, denom):
    """Generous bound on the float64 error of a crossing's position t along a line."""
    return 1e-11 * (1.0 + np.abs(t) + abs(offset)) / np.abs(denom)


# ---------------------------------------------------------------- sampling, a lower bound
def _grid(bounds, resolution: int) -> np.ndarray:
    axes = [lo + (np.arange(resolution) + 0.5) * (hi - lo) / resolution for lo, hi in bounds]
    mesh = np.meshgrid(*axes, indexing="ij")
    return np.stack([g.ravel() for g in mesh], axis=1)  # (resolution^n, n) cell centres


def _count_sampled(net, bounds, resolution: int) -> int:
    """Distinct activation patterns on the grid of cell centres (a lower bound)."""
    X = _grid(bounds, resolution)
    found = []
    for start in range(0, len(X), 1 << 18):
        packed = np.packbits(activation_patterns(net, X[start:start + (1 << 18)]), axis=1)
        found.append(np.unique(packed.view(np.dtype((np.void, packed.shape[1]))).ravel()))
    return len(np.unique(np.concatenate(found)))


def _check_bounds(bounds, n: int) -> list:
    if isinstance(bounds, (str, bytes)) or not hasattr(bounds, "__len__"):
        raise TypeError(f"bounds must be a sequence of (lo, hi) pairs, got "
                        f"{type(bounds).__name__}")
    arr = check_array(np.asarray(bounds, dtype=float) if len(bounds) else bounds,
                      name="bounds", ndim=2, finite=True)
    if arr.shape != (n, 2):
        raise ValueError(f"bounds must hold one (lo, hi) pair per input dimension, shape "
                         f"({n}, 2); got shape {arr.shape}")
    if not np.all(arr[:, 0] < arr[:, 1]):
        raise ValueError(f"bounds must have lo < hi in every dimension, got {arr.tolist()}")
    return [(float(lo), float(hi)) for lo, hi in arr]


def count_linear_regions(net, bounds, *, resolution: int | None = None) -> RegionCount:
    """Number of activation regions of a ReLU network inside the box ``bounds``.

    Parameters
    ----------
    net : nn.Module
        ``Sequential`` of ``Linear``, ``ReLU`` (and ``Identity``) layers, n inputs.
    bounds : sequence of n pairs (lo, hi)
        The open box ``prod_d (lo_d, hi_d)``.
    resolution : int, optional
        Grid points per dimension for the sampling estimate (default 1024 in 2-D, about
        2^20 points in all otherwise); ignored by the exact methods.

    Returns
    -------
    RegionCount
        An ``int`` with ``.exact`` and ``.method``: 'breakpoints' (n = 1, exact),
        'arrangement' (n = 2, one ReLU layer, exact), 'sampling' (otherwise: the number of
        distinct patterns on the grid, a lower bound, ``exact=False``). Exact counts treat
        breakpoints and intersection points closer than 1e-9 times the box size as one.

    Examples
    --------
    >>> import nnkit as nk
    >>> from nnkit.approx import count_linear_regions
    >>> net = nk.nn.Sequential(nk.nn.Linear(1, 3), nk.nn.ReLU(), nk.nn.Linear(3, 1))
    >>> for p, v in zip(net.parameters(), ([[1.0], [1.0], [1.0]], [-0.2, -0.5, -0.7])):
    ...     p.data[...] = v
    >>> count_linear_regions(net, [(0, 1)])
    RegionCount(4, exact=True, method='breakpoints')
    """
    layers = _layers(net)
    n = _input_size(layers)
    bounds = _check_bounds(bounds, n)
    n_relu = sum(layer[0] == "relu" for layer in layers)
    if n == 1:
        return RegionCount(_count_1d(layers, *bounds[0]), True, "breakpoints")
    if n == 2 and n_relu <= 1:
        first = next((i for i, lay in enumerate(layers) if lay[0] == "relu"), None)
        if first is None:
            return RegionCount(1, True, "arrangement")
        _, W, b = layers[first - 1]
        return RegionCount(_count_arrangement(W, b, bounds), True, "arrangement")
    if resolution is None:
        resolution = 1024 if n == 2 else max(2, round(2 ** (20 / n)))
    resolution = int(check_scalar(resolution, name="resolution", kind=numbers.Integral, low=2))
    return RegionCount(_count_sampled(net, bounds, resolution), False, "sampling")


# ---------------------------------------------------------------- Montufar et al. (2014)
def _fold_matrix(m: int, n: int, p: int) -> np.ndarray:
    """(n, m) C: u_j = sum_k c_k relu(p u_j - k), c = (1, -2, 2, -2, ...), a zigzag mapping
    each of the p intervals [k/p, (k+1)/p] onto [0, 1]."""
    C = np.zeros((n, m))
    c = np.array([1.0] + [(-2.0) * (-1) ** k for k in range(p - 1)])  # 1, -2, 2, ...
    for j in range(n):
        C[j, j * p:(j + 1) * p] = c
    return C


def _fold_inputs(m: int, n: int, p: int) -> tuple[np.ndarray, np.ndarray]:
    """(m, n) A and (m,) b of a folding layer: unit (j, k) is p u_j - k; spare units 0."""
    A, b = np.zeros((m, n)), np.zeros(m)
    for j in range(n):
        A[j * p:(j + 1) * p, j] = p
        b[j * p:(j + 1) * p] = -np.arange(p)
    return A, b


def _arrangement_inputs(m: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(m, n), (m,): m hyperplanes in general position with all intersections in (0, 1)^n.

    n = 1: points (i + 1/2)/m. n = 2: the lines tangent to the circle of radius
    r = 0.45 sin(pi / 2m) about (1/2, 1/2) at angles pi i / m; two of them meet at distance
    r / cos(half the angle between them) <= r / sin(pi / 2m) = 0.45 from the centre, no three
    meet (a point has two tangents), no two are parallel.
    """
    if n == 1:
        return np.ones((m, 1)), -(np.arange(m) + 0.5) / m
    theta = np.pi * np.arange(m) / m
    normals = np.stack([np.cos(theta), np.sin(theta)], axis=1)  # (m, 2)
    r = 0.45 * math.sin(math.pi / (2 * m))
    return normals, -(normals @ np.array([0.5, 0.5])) - r


def montufar_network(m: int, n: int, L: int) -> nn.Sequential:
    """A ReLU network on ``[0, 1]^n`` with L hidden layers of width m and
    ``R(m) floor(m/n)^{n(L-1)}`` regions, ``R(m) = sum_{i=0}^{n} C(m, i)`` (notes §2.5,
    Theorem 2.9, Montufar et al. 2014).

    Layers 1..L-1 fold: with ``p = floor(m/n)``, units ``relu(p u_j - k)``, k < p, combine
    (weights 1, -2, 2, ...) into a zigzag that maps each of p intervals of coordinate j onto
    [0, 1], so the cube is folded p^n times per layer; the L-th layer puts m hyperplanes in
    general position inside the folded cube, R(m) regions in each of the p^{n(L-1)} copies.
    Spare units (m - n p of them) have zero weights. Output: ``Linear(m, 1)`` of ones.
    Supports n = 1 and n = 2 (a closed-form general-position arrangement is built for those).
    """
    m = int(check_scalar(m, name="m", kind=numbers.Integral, low=1))
    n = int(check_scalar(n, name="n", kind=numbers.Integral, low=1, high=2))
    L = int(check_scalar(L, name="L", kind=numbers.Integral, low=1))
    if m < n:
        raise ValueError(f"m must be >= n (each input needs a unit to fold); got m={m}, n={n}")
    p = m // n
    fold_A, fold_b = _fold_inputs(m, n, p)
    C = _fold_matrix(m, n, p)
    mods, prev = [], np.eye(n)  # prev (n, width of previous layer): u = prev @ h
    for _ in range(L - 1):
        mods += [_linear(fold_A @ prev, fold_b), nn.ReLU()]
        prev = C
    arr_A, arr_b = _arrangement_inputs(m, n)
    mods += [_linear(arr_A @ prev, arr_b), nn.ReLU(), _linear(np.ones((1, m)), np.zeros(1))]
    return nn.Sequential(*mods)


def _linear(W: np.ndarray, b: np.ndarray) -> nn.Linear:
    layer = nn.Linear(W.shape[1], W.shape[0], dtype=np.float64)
    layer.weight.data[...] = W
    layer.bias.data[...] = b
    return layer
