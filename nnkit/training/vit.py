"""Training the Vision Transformer on scikit-learn's digits: the model the tour, the example
``examples/vit_digits.py`` and the ViT benchmarks use, and its AdamW recipe."""

from __future__ import annotations

import numpy as np

from .loops import minibatches

__all__ = ["DIGITS_VIT", "make_digits_vit", "train_vit"]


#: The digits model: 16 tokens of 2x2 pixels + [CLS], 3 layers, 8 heads of 8 features.
DIGITS_VIT = dict(image_size=8, patch_size=2, in_channels=1, num_classes=10, dim=64, depth=3,
                  heads=8, mlp_dim=128, dropout=0.1)


def make_digits_vit(seed: int = 0, **overrides):
    """``ViT(**DIGITS_VIT)`` (with ``overrides``), seeded."""
    from .._random import manual_seed
    from ..models.vit import ViT

    manual_seed(seed)
    return ViT(**{**DIGITS_VIT, **overrides})


def train_vit(model, X, y, epochs: int, lr: float = 2e-3, batch_size: int = 32,
              weight_decay: float = 0.05, warmup: int = 50, seed: int = 0) -> list[float]:
    """AdamW with ``warmup`` steps of linear warm-up, then cosine decay to 0; full batches
    only (the short last one is dropped). Returns the mean loss per epoch; leaves the model
    in eval mode. (Its GEMMs are small enough that ``nnkit._backend.matmul`` runs them on
    one BLAS thread; see SMALL_GEMM_FLOPS there.)
    """
    from .. import functional as F
    from .. import optim

    opt = optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    rng = np.random.default_rng(seed)
    total, step, history = epochs * (len(X) // batch_size), 0, []
    model.train()
    for _ in range(epochs):
        losses = []
        for idx in minibatches(len(X), batch_size, rng=rng):
            if len(idx) < batch_size:
                continue
            opt.param_groups[0]["lr"] = (lr * min(1.0, (step + 1) / warmup)
                                         * 0.5 * (1 + np.cos(np.pi * step / total)))
            loss = F.cross_entropy(model(X[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
            step += 1
        history.append(float(np.mean(losses)))
    model.eval()
    return history
