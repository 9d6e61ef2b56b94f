"""Parameter initialisation, torch's ``nn.init`` formulas, drawn from nnkit's generator.

Each function fills ``tensor.data`` in place (keeping its dtype) and returns the tensor.
"""

from __future__ import annotations

import math

import numpy as np

from .._random import get_rng

__all__ = [
    "calculate_fan_in_and_fan_out",
    "uniform_",
    "normal_",
    "zeros_",
    "ones_",
    "constant_",
    "kaiming_uniform_",
    "xavier_uniform_",
]


def calculate_fan_in_and_fan_out(tensor):
    """(fan_in, fan_out) of a weight of shape ``(out, in, *receptive_field)``, as torch."""
    shape = tensor.shape
    if len(shape) < 2:
        raise ValueError(f"fan in and fan out need a tensor of >= 2 dimensions, got {shape}")
    receptive = int(np.prod(shape[2:])) if len(shape) > 2 else 1
    return shape[1] * receptive, shape[0] * receptive


_CHUNK = 1 << 18  # values drawn at a time: the float64 temporary stays at 2 MiB


def _fill(tensor, draw):
    """Fill ``tensor.data`` in C order with ``draw(n)`` (float64 values), a chunk at a time;
    the values equal one draw of them all (NumPy's generators draw sequentially), and a
    large parameter needs no temporary of its size (under ``nk.load``'s budget too)."""
    data = tensor.data
    if not data.flags.c_contiguous:
        data[...] = np.asarray(draw(data.shape), dtype=data.dtype)
        return tensor
    flat = data.reshape(-1)  # (n,) view
    for start in range(0, flat.size, _CHUNK):
        part = flat[start:start + _CHUNK]
        part[...] = np.asarray(draw(part.size), dtype=data.dtype)
    return tensor


def uniform_(tensor, a: float = 0.0, b: float = 1.0, rng=None):
    rng = get_rng(rng)
    return _fill(tensor, lambda n: rng.uniform(a, b, n))


def normal_(tensor, mean: float = 0.0, std: float = 1.0, rng=None):
    rng = get_rng(rng)
    return _fill(tensor, lambda n: rng.normal(mean, std, n))


def constant_(tensor, value: float):
    tensor.data[...] = value
    return tensor


def zeros_(tensor):
    return constant_(tensor, 0.0)


def ones_(tensor):
    return constant_(tensor, 1.0)


def kaiming_uniform_(tensor, a: float = 0.0, nonlinearity: str = "leaky_relu", rng=None):
    """U(-bound, bound), bound = gain * sqrt(3 / fan_in), gain = sqrt(2 / (1 + a^2)).

    torch's Linear and Conv layers use a = sqrt(5), i.e. bound = 1 / sqrt(fan_in).
    """
    fan_in, _ = calculate_fan_in_and_fan_out(tensor)
    gain = math.sqrt(2.0 / (1 + a * a)) if nonlinearity == "leaky_relu" else math.sqrt(2.0)
    bound = gain * math.sqrt(3.0 / fan_in) if fan_in else 0.0
    return uniform_(tensor, -bound, bound, rng)


def xavier_uniform_(tensor, gain: float = 1.0, rng=None):
    """U(-a, a), a = gain * sqrt(6 / (fan_in + fan_out))."""
    fan_in, fan_out = calculate_fan_in_and_fan_out(tensor)
    a = gain * math.sqrt(6.0 / (fan_in + fan_out))
    return uniform_(tensor, -a, a, rng)
