"""Variable-length sequences packed along time (flash-linear-attention's and mamba_ssm's
``cu_seqlens``) as a padded batch and back, with differentiable gathers.

Sequence n is steps cu_seqlens[n]:cu_seqlens[n + 1] of a batch-1 input; ``Packing.pad``
lays the N sequences out as a batch (N, ..., T_max, ...), each padded at its end with a
given step (the ops choose one that leaves their state unchanged, so each sequence's
outputs and final state are those of the sequence run alone), and ``Packing.unpad`` takes
the outputs of the real steps back to the packed layout. The padding costs N * T_max - T
steps.
"""

from __future__ import annotations

import numpy as np

from .._backend import array_module
from .._types import Array
from .._validation import INTEGERS, check_array
from ..autograd import Tensor, as_tensor, concat


class Packing:
    """The padded layout of the packed sequences ``cu_seqlens`` (N + 1 offsets) over T steps.

    Attributes
    ----------
    N, T_max : int, the number of sequences and the longest one's length
    """

    def __init__(self, cu_seqlens: Array, T: int):
        cu = check_array(cu_seqlens, name="cu_seqlens", ndim=1, dtype=INTEGERS,
                         allow_device=False)
        lengths = np.diff(cu)
        if cu.size == 0 or cu[0] != 0 or cu[-1] != T or (lengths < 0).any():
            raise ValueError(f"cu_seqlens must rise from 0 to T = {T} (N + 1 offsets), got "
                             f"{cu.tolist()}")
        self.N, self.T_max = lengths.size, int(lengths.max(initial=0))
        steps = np.arange(self.T_max)
        valid = steps < lengths[:, None]
        self._source = np.where(valid, cu[:-1, None] + steps, T).ravel()  # T: the pad step
        self._kept = np.flatnonzero(valid.ravel())

    def pad(self, x: Tensor, axis: int, fill: Tensor | Array | None = None) -> Tensor:
        """x (1, ..., T at ``axis``, ...) -> (N, ..., T_max at ``axis``, ...), every
        sequence followed by copies of ``fill`` (x's shape with 1 at ``axis``; zeros when
        None)."""
        shape = tuple(x.shape)
        step = shape[:axis] + (1,) + shape[axis + 1:]
        fill = (array_module(x.data).zeros(step, x.dtype) if fill is None
                else array_module(x.data).broadcast_to(fill, step))
        steps = concat([x, as_tensor(fill)], axis=axis)[0]
        steps = steps[(slice(None),) * (axis - 1) + (self._source,)]
        steps = steps.reshape(*shape[1:axis], self.N, self.T_max, *shape[axis + 1:])
        order = (axis - 1, *range(axis - 1), *range(axis, steps.ndim))
        return steps.permute(*order)

    def unpad(self, y: Tensor, axis: int) -> Tensor:
        """y (N, ..., T_max at ``axis``, ...) -> (1, ..., T at ``axis``, ...), the real steps."""
        order = (*range(1, axis), 0, *range(axis, y.ndim))
        flat = y.permute(*order)
        shape = tuple(flat.shape)
        flat = flat.reshape(*shape[:axis - 1], self.N * self.T_max, *shape[axis + 1:])
        kept = flat[(slice(None),) * (axis - 1) + (self._kept,)]
        return kept.reshape(1, *kept.shape)
