"""The ``nnkit tour`` section for associative recall: DeltaNet and Mamba on MQAR.

Multi-query associative recall (``nnkit.datasets.associative_recall``): key-value pairs, then
the sequence's keys in random order, each to be answered with its value. The model is token
embedding, two blocks of [RMSNorm -> mixer -> residual], RMSNorm and a Linear head, trained
with Adam on fresh batches; the rows are the query accuracy on held-out sequences. The delta
rule's fast-weight memory (``nk.nn.DeltaNet``) learns to bind keys to values within a few
hundred steps; guessing one of the sequence's values scores 1 / n_pairs. ``ctx.quick`` trains
DeltaNet alone, 8 pairs for 300 steps (~10-20 s on 2 cores); the full run adds Mamba and more
steps.
"""

from __future__ import annotations

from ..training.recall import N_PAIRS, VOCAB, train_recall
from .common import INFO, tour_row

__all__ = ["recall_section", "plot_recall"]

SECTION = "associative recall"

QUICK_TARGET = 0.9  # DeltaNet's query accuracy after the quick run's 300 steps


def _row(result, value, target="", ok=INFO):
    return tour_row(SECTION, result, value, target, ok)


def recall_section(ctx) -> list[dict]:
    """Rows of the associative-recall section (see the module docstring)."""
    steps = 300 if ctx.quick else 600
    kinds = ("DeltaNet",) if ctx.quick else ("DeltaNet", "Mamba")
    curves = {kind: train_recall(kind, steps, seed=ctx.seed) for kind in kinds}
    chance = f"(a value of the sequence: {1 / N_PAIRS:.3f})"
    rows = []
    for kind, curve in curves.items():
        acc = curve[-1][1]
        result = (f"MQAR {N_PAIRS} pairs, vocab {VOCAB}, {kind}: query accuracy after "
                  f"{steps} steps")
        if kind == "DeltaNet":
            rows.append(_row(result, f"{acc:.3f}", f">= {QUICK_TARGET} {chance}",
                             acc >= QUICK_TARGET))
        else:
            rows.append(_row(result, f"{acc:.3f}", chance, INFO))
    if ctx.plots:
        plot_recall(curves, ctx.out_dir / "associative_recall.png")
    return rows


def plot_recall(curves: dict, path, n_pairs: int = N_PAIRS) -> bool:
    """Learning curves {name: [(step, accuracy)]} to ``path``; False without matplotlib."""
    from .common import pyplot

    plt = pyplot()
    if plt is None:
        return False
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for name, curve in curves.items():
        steps, acc = zip(*curve, strict=True)
        ax.plot(steps, acc, label=name)
    ax.axhline(1 / n_pairs, color="gray", ls="--", label="a value of the sequence")
    ax.set(xlabel="training step", ylabel="query accuracy", ylim=(0, 1.02),
           title=f"associative recall, {n_pairs} pairs")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
