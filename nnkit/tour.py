"""``nnkit tour``: the main job, one section per capability, a results table at the end.

Each section is a function ``section(ctx) -> list of result rows`` registered in
``SECTIONS``; later capabilities add theirs. A row (``_tour_rows.tour_row``) is a dict with
'section', 'result', 'value', 'target' and 'ok': True or False for a row with a target,
"info" for a row that only informs. Plots go to ``ctx.out_dir`` when matplotlib is installed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from . import functional as F
from . import nn, optim
from ._bert_tour import bert_section
from ._conv_tour import cnn_section
from ._distributed_tour import distributed_section
from ._persistence_tour import persistence_section
from ._random import manual_seed
from ._rnn_tour import rnn_section
from ._scan_tour import scan_section
from ._tour_rows import is_information, missed_targets, tour_row
from ._translate_tour import translate_section
from ._vit_tour import vit_section
from .approx._tour import approx_section
from .classic._hopfield_tour import hopfield_section
from .classic._tour import perceptron_section
from .datasets import load_digits
from .training import accuracy, minibatches

__all__ = ["TourContext", "SECTIONS", "run_tour", "missed_targets", "train_mlp_digits"]


@dataclass
class TourContext:
    out_dir: Path
    quick: bool = False
    seed: int = 0
    plots: bool = True


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        return plt
    except ImportError:
        return None


def train_mlp_digits(epochs: int = 30, hidden: int = 128, batch_size: int = 64,
                     lr: float = 1e-3, seed: int = 0, progress: bool = True):
    """Train an MLP 64-hidden-hidden-10 with Adam on scikit-learn's digits.

    Returns
    -------
    model : nn.Sequential
    history : dict of lists ('loss' per epoch, 'test_accuracy' per epoch)
    split : nnkit.datasets.Split
    """
    manual_seed(seed)
    split = load_digits(random_state=seed)
    model = nn.Sequential(
        nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
        nn.Linear(hidden, 10),
    )
    opt = optim.Adam(model.parameters(), lr=lr)
    history = {"loss": [], "test_accuracy": []}
    bar = tqdm(range(epochs), desc="MLP on digits", unit="epoch", disable=not progress)
    for _ in bar:
        losses = []
        for idx in minibatches(len(split.X_train), batch_size):
            loss = F.cross_entropy(model(split.X_train[idx]), split.y_train[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        history["loss"].append(float(np.mean(losses)))
        history["test_accuracy"].append(accuracy(model, split.X_test, split.y_test))
        bar.set_postfix(loss=f"{history['loss'][-1]:.3f}",
                        test_acc=f"{history['test_accuracy'][-1]:.3f}")
    return model, history, split


def mlp_section(ctx: TourContext) -> list[dict]:
    """MLP on digits: the foundation's end-to-end check (target >= 95% test accuracy)."""
    start = time.perf_counter()
    model, history, split = train_mlp_digits(epochs=10 if ctx.quick else 30, seed=ctx.seed)
    seconds = time.perf_counter() - start
    acc = history["test_accuracy"][-1]
    target = 0.9 if ctx.quick else 0.95  # the quick run's 10 epochs reach 0.947 (seed 0)
    plt = _pyplot() if ctx.plots else None
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


SECTIONS = [mlp_section, perceptron_section, hopfield_section, approx_section, cnn_section,
            rnn_section, scan_section, translate_section, vit_section, bert_section,
            persistence_section, distributed_section]


def run_tour(out_dir="nnkit-tour", quick: bool = False, seed: int = 0) -> list[dict]:
    """Run every section, print the results table, return its rows.

    Tunes glibc malloc first (``nk.tune_malloc()``: the ViT and BERT sections' training steps
    reuse their large temporaries); ``NNKIT_MALLOC_TUNING=0`` keeps glibc's defaults."""
    from ._malloc import tune

    print(f"malloc tuning: {tune()}")
    ctx = TourContext(out_dir=Path(out_dir), quick=quick, seed=seed)
    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    ctx.plots = _pyplot() is not None
    rows = []
    for section in SECTIONS:
        rows.extend(section(ctx))
    print(format_table(rows, ["section", "result", "value", "target", "ok"]))
    print(_verdict(rows))
    if ctx.plots:
        print(f"plots written to {ctx.out_dir.resolve()}/")
    else:
        print("matplotlib is not installed: no plots (pip install 'nnkit[plot]')")
    return rows


def _verdict(rows: list[dict]) -> str:
    """The line under the table: how many targets were met, which were missed."""
    missed = missed_targets(rows)
    checked = sum(not is_information(row) for row in rows)
    line = (f"{checked - len(missed)} of {checked} targets met; "
            f"{len(rows) - checked} rows are information")
    return line + "".join(f"\nMISSED: {row['section']}: {row['result']} = {row['value']} "
                          f"(target {row['target']})" for row in missed)


def format_table(rows: list[dict], columns: list[str]) -> str:
    """A plain-text table of ``rows`` (dicts) with the given ``columns``."""
    cells = [[str(r.get(c, "")) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    line = "  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(out)
