"""nnkit's global random generator (parameter initialisation, dropout, shuffling).

``nk.manual_seed(seed)`` makes every later draw reproducible, as ``torch.manual_seed``.
"""

from __future__ import annotations

import numbers

import numpy as np

from ._backend import kernels_for

__all__ = ["manual_seed", "get_rng", "set_rng", "splitmix64", "uniform53", "uniform"]

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
# hash per element, so a draw on the GPU needs no generator state there. The compiled
# kernels' forms: nnkit._ext.simd_math (Numba, CPU and CUDA), nnkit/_ext/splitmix64.h (C).
_MASK64 = (1 << 64) - 1


def splitmix64(seed, n):
    """SplitMix64's outputs number n + 1 for ``seed`` (an int, taken mod 2**64):
    ``mix(seed + (n + 1) * 0x9E3779B97F4A7C15)`` in wrapping 64-bit arithmetic, a uint64
    array shaped like ``n`` (ints >= 0). Plain NumPy, for the reference twins and the Python
    side: the stream of the compiled kernels (``nnkit._ext.simd_math.splitmix64``), and
    ``splitmix64(seed, k)`` for k = 0, 1, ... is the sequential generator seeded with
    ``seed``.

    >>> hex(int(splitmix64(0, 0)))  # Vigna's published first output for seed 0
    '0xe220a8397b1dcdaf'
    """
    n = np.asarray(n, dtype=np.uint64)
    with np.errstate(over="ignore"):  # uint64 arithmetic wraps, as intended
        z = np.uint64(int(seed) & _MASK64) + (n + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def uniform53(z):
    """The top 53 bits of uint64 ``z`` as float64 in [0, 1): (z >> 11) * 2**-53."""
    return (np.asarray(z, dtype=np.uint64) >> np.uint64(11)).astype(np.float64) * 2.0**-53


def uniform(shape, like, rng=None):
    """Uniform draws in [0, 1), float64, of ``shape`` (an int or a tuple), made where ``like``
    (an array) lives: a NumPy array, or a CuPy array on the current GPU made there by one
    elementwise kernel (no host array, no copy; ``nnkit._ext.elementwise_cuda``).

    One seed in [0, 2**63 - 1) comes from nnkit's generator (``rng`` as in ``get_rng``), so
    ``nk.manual_seed`` makes the draws reproducible; element i (C order) is
    ``splitmix64(seed + (i + 1) * 0x9E3779B97F4A7C15) >> 11`` times 2**-53 on either device.

    >>> uniform(3, np.zeros(0), rng=np.random.default_rng(7)).shape
    (3,)
    """
    shape = (int(shape),) if isinstance(shape, numbers.Integral) else tuple(shape)
    seed = int(get_rng(rng, "rng").integers(0, 2**63 - 1))
    return kernels_for("elementwise_cpu", "elementwise_cuda", like, name="like").uniform(
        shape, seed)
