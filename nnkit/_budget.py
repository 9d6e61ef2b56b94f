"""An allocation budget for objects built from an untrusted file (``nk.load``,
``from_pretrained``).

A file names a class and its constructor arguments; the constructor then allocates what
those arguments ask for. ``nk.load`` builds under a budget (the bytes of the file's tensors
plus the caller's ``max_bytes``), and every allocation sized by constructor arguments
is counted: ``Parameter`` and ``Module.register_buffer`` reserve the bytes of their arrays,
``ensure_room`` refuses an array before it is allocated (``Parameter.empty``, and
constructors that fill memory before it becomes a Parameter), and ``reserve`` counts
memory that never becomes one (a Hopfield network's couplings, label names) or is made
without a constructor (``nn.module.deepcopies``: a TransformerEncoder's layer copies).
Outside such a load nothing is counted.
"""

from __future__ import annotations

import contextvars
from contextlib import contextmanager

MAX_BYTES = 256 << 20  # what reading an untrusted file may allocate beyond what it holds

_BUDGET = contextvars.ContextVar("nnkit_allocation_budget", default=None)


class BudgetExceeded(Exception):
    """An allocation of ``nbytes`` for ``what`` would pass the budget of ``nk.load``."""

    def __init__(self, nbytes: int, what: str, left: int):
        super().__init__(f"{what} needs {nbytes} bytes, {left} left")
        self.nbytes, self.what, self.left = nbytes, what, left


class _Budget:
    def __init__(self, nbytes: int):
        self.left = nbytes


@contextmanager
def allocation_budget(nbytes: int):
    """Within the block, ``reserve`` draws from ``nbytes`` and raises past it."""
    token = _BUDGET.set(_Budget(int(nbytes)))
    try:
        yield
    finally:
        _BUDGET.reset(token)


def reserve(nbytes: int, what: str) -> None:
    """Count ``nbytes`` against the current budget (none outside ``nk.load``); raises
    ``BudgetExceeded`` naming ``what`` when they do not fit."""
    budget = _BUDGET.get()
    if budget is not None:
        _check(budget, int(nbytes), what)
        budget.left -= int(nbytes)


def ensure_room(shape, dtype, what: str) -> None:
    """Raise ``BudgetExceeded`` before an array of ``shape`` and ``dtype`` is allocated if it
    would not fit; counts nothing (the ``Parameter`` made of it reserves its bytes)."""
    budget = _BUDGET.get()
    if budget is not None:
        import numpy as np

        count = 1
        for n in shape:
            count *= int(n)  # Python ints: no overflow
        _check(budget, count * np.dtype(dtype).itemsize, what)


def _check(budget, nbytes, what):
    if nbytes > budget.left:
        raise BudgetExceeded(nbytes, what, budget.left)
