"""Type aliases for the public signatures of ``nnkit.kernels`` and ``nnkit.functional``.

Shapes and dtypes stay in each function's docstring; these only name the kinds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

Array = Any
"""A NumPy or CuPy array (shape and dtype in the function's docstring)."""

Needs = Sequence[bool] | None
"""``nnkit.autograd.apply_op``'s mask of the inputs that want a gradient; None: all."""

__all__ = ["Array", "Needs"]
