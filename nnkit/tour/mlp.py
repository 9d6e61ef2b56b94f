"""The ``nnkit tour`` section for the MLP on digits: the foundation's end-to-end check."""

from __future__ import annotations

import time

from ..training.mlp import train_mlp_digits
from .common import TourContext, pyplot, tour_row

__all__ = ["mlp_section"]


def mlp_section(ctx: TourContext) -> list[dict]:
    """MLP on digits: the foundation's end-to-end check (target >= 95% test accuracy)."""
    start = time.perf_counter()
    model, history, split = train_mlp_digits(epochs=10 if ctx.quick else 30, seed=ctx.seed)
    seconds = time.perf_counter() - start
    acc = history["test_accuracy"][-1]
    target = 0.9 if ctx.quick else 0.95  # the quick run's 10 epochs reach 0.947 (seed 0)
    plt = pyplot() if ctx.plots else None
    if plt is not None:
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.5))
        ax1.plot(history["loss"], label="train loss")
        ax1.set_xlabel("epoch")
        ax1.set_ylabel("cross-entropy")
        ax1.legend()
        ax2.plot(history["test_accuracy"], color="C1", label="test accuracy")
        ax2.axhline(target, color="gray", linestyle=":", label=f"target {target}")
        ax2.set_xlabel("epoch")
        ax2.legend()
        fig.suptitle(f"MLP 64-128-128-10 on digits: test accuracy {acc:.3f}")
        fig.tight_layout()
        fig.savefig(ctx.out_dir / "mlp_digits.png", dpi=110)
        plt.close(fig)
    return [
        tour_row("MLP on digits", "test accuracy" + (" (quick: 10 epochs)" if ctx.quick else ""),
                 f"{acc:.4f}", f">= {target}", acc >= target),
        tour_row("MLP on digits", "training time", f"{seconds:.1f} s"),
    ]
