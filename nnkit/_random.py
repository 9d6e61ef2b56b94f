"""nnkit's global random generator (parameter initialisation, dropout, shuffling).

``nk.manual_seed(seed)`` makes every later draw reproducible, as ``torch.manual_seed``.
"""

from __future__ import annotations

import numpy as np

__all__ = ["manual_seed", "get_rng"]

_state = {"rng": np.random.default_rng()}


def manual_seed(seed: int) -> np.random.Generator:
    """Reseed the global generator and return it."""
    _state["rng"] = np.random.default_rng(seed)
    return _state["rng"]


def get_rng(random_state=None) -> np.random.Generator:
    """The global generator, or one made from ``random_state`` (int, Generator, or None)."""
    if random_state is None:
        return _state["rng"]
    if isinstance(random_state, np.random.Generator):
        return random_state
    return np.random.default_rng(random_state)
