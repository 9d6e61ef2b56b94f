"""nnkit's global random generator (parameter initialisation, dropout, shuffling).

``nk.manual_seed(seed)`` makes every later draw reproducible, as ``torch.manual_seed``.
"""

from __future__ import annotations

import numpy as np

__all__ = ["manual_seed", "get_rng", "set_rng"]

_state = {"rng": np.random.default_rng()}


def manual_seed(seed: int) -> np.random.Generator:
    """Reseed the global generator and return it."""
    _state["rng"] = np.random.default_rng(seed)
    return _state["rng"]


def get_rng(random_state=None, name: str = "random_state") -> np.random.Generator:
    """The global generator, or one made from ``random_state`` (int >= 0, Generator, or
    None); anything else is refused naming ``name``."""
    if random_state is None:
        return _state["rng"]
    if isinstance(random_state, np.random.Generator):
        return random_state
    expected = f"{name} must be an int seed >= 0, a numpy Generator or None"
    if isinstance(random_state, (bool, np.bool_, str, bytes, float)):
        raise TypeError(f"{expected}, got {random_state!r:.60} ({type(random_state).__name__})")
    try:
        return np.random.default_rng(random_state)
    except TypeError as exc:
        raise TypeError(f"{expected}, got {random_state!r:.60} ({exc})") from None
    except ValueError as exc:
        raise ValueError(f"{expected}, got {random_state!r:.60} ({exc})") from None


def set_rng(generator: np.random.Generator) -> None:
    """Make ``generator`` the global one (e.g. a generator restored from a checkpoint, so
    dropout and shuffling resume exactly where they stopped)."""
    if not isinstance(generator, np.random.Generator):
        raise TypeError(f"generator must be a numpy.random.Generator, got "
                        f"{type(generator).__name__}")
    _state["rng"] = generator


# splitmix64 (Steele, Lea & Flood 2014) of seed + (i + 1) * gamma: one independent 64-bit
# hash per element, so a draw on the GPU needs no generator state there.
_SPLITMIX_BODY = """
unsigned long long z = seed + (unsigned long long)(i + 1) * 0x9E3779B97F4A7C15ULL;
z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
z ^= z >> 31;
u = (double)(z >> 11) * 1.1102230246251565e-16;
"""
_device_kernels = {}


def device_uniform(shape, rng=None):
    """Uniform draws in [0, 1), float64, of ``shape``, made on the current GPU (CuPy array).

    One seed in [0, 2**63 - 1) comes from nnkit's generator (``rng`` as in ``get_rng``), so
    ``nk.manual_seed`` makes the draws reproducible; element i (C order) is
    ``splitmix64(seed + (i + 1) * 0x9E3779B97F4A7C15) >> 11`` times 2**-53, computed by one
    CuPy elementwise kernel: no device generator state, no host array, no copy.
    """
    import cupy

    seed = int(get_rng(rng, "rng").integers(0, 2**63 - 1))
    kernel = _device_kernels.get("uniform")
    if kernel is None:
        kernel = _device_kernels["uniform"] = cupy.ElementwiseKernel(
            "uint64 seed", "float64 u", _SPLITMIX_BODY, "nnkit_splitmix_uniform")
    out = cupy.empty(shape, dtype=np.float64)
    if out.size:
        kernel(np.uint64(seed), out)
    return out
