"""Loss modules: torch's names over ``nnkit.functional``."""

from __future__ import annotations

from .. import functional as F
from .._validation import check_choice
from .module import Module

_REDUCTIONS = ("mean", "sum", "none")

__all__ = ["MSELoss", "CrossEntropyLoss", "BCEWithLogitsLoss"]


class MSELoss(Module):
    def __init__(self, reduction: str = "mean"):
        super().__init__()
        self.reduction = check_choice(reduction, name="reduction", choices=_REDUCTIONS)

    def forward(self, pred, target):
        return F.mse_loss(pred, target, self.reduction)


class CrossEntropyLoss(Module):
    """Cross-entropy of logits (N, C) and integer targets (N,), ``ignore_index`` skipped."""

    def __init__(self, ignore_index: int = -100, reduction: str = "mean"):
        super().__init__()
        self.ignore_index = ignore_index
        self.reduction = check_choice(reduction, name="reduction", choices=_REDUCTIONS)

    def forward(self, logits, target):
        return F.cross_entropy(logits, target, self.ignore_index, self.reduction)


class BCEWithLogitsLoss(Module):
    def __init__(self, weight=None, reduction: str = "mean", pos_weight=None):
        super().__init__()
        self.weight, self.pos_weight = weight, pos_weight
        self.reduction = check_choice(reduction, name="reduction", choices=_REDUCTIONS)

    def forward(self, logits, target):
        return F.binary_cross_entropy_with_logits(logits, target, self.weight, self.pos_weight,
                                                  self.reduction)
