"""The ``nnkit tour`` section for saving and resuming (``nk.save`` / ``nk.load``).

An MLP with dropout trains on digits, a checkpoint (model, Adam state, both random
generators, epoch) is written to ``ctx.out_dir``, training goes on; then the checkpoint is
loaded and training resumes from it: the two runs must end with identical parameters.
"""

from __future__ import annotations

import time

import numpy as np

from .. import functional as F
from .. import nn, optim
from .._random import get_rng, manual_seed, set_rng
from ..datasets import load_digits
from ..persistence import load, save
from ..training import accuracy, minibatches
from .common import INFO, tour_row

__all__ = ["persistence_section"]

SECTION = "save and resume"


def _row(result, value, target="", ok=INFO):
    return tour_row(SECTION, result, value, target, ok)


def _epochs(model, opt, split, batches, n):
    for _ in range(n):
        for idx in minibatches(len(split.X_train), 64, rng=batches):
            opt.zero_grad()
            F.cross_entropy(model(split.X_train[idx]), split.y_train[idx]).backward()
            opt.step()


def persistence_section(ctx) -> list[dict]:
    """Checkpoint, keep training, resume from the checkpoint: identical parameters."""
    manual_seed(ctx.seed)
    split = load_digits(random_state=ctx.seed)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 10))
    opt = optim.Adam(model.parameters(), lr=3e-3)
    batches = np.random.default_rng(ctx.seed)
    n = 1 if ctx.quick else 3
    _epochs(model, opt, split, batches, n)
    path = ctx.out_dir / "checkpoint.safetensors"
    start = time.perf_counter()
    save({"model": model, "optimizer": opt, "batches": batches, "rng": get_rng(),
          "epoch": n}, path)
    save_ms = 1e3 * (time.perf_counter() - start)
    saved = {name: np.array(value) for name, value in model.state_dict().items()}
    _epochs(model, opt, split, batches, n)  # the run that never stopped

    start = time.perf_counter()
    ckpt = load(path)
    load_ms = 1e3 * (time.perf_counter() - start)
    set_rng(ckpt["rng"])
    _epochs(ckpt["model"], ckpt["optimizer"], split, ckpt["batches"], n)
    never_stopped, resumed = model.state_dict(), ckpt["model"].state_dict()
    same_names = list(never_stopped) == list(resumed) == list(saved)
    diff = float(np.max([np.max(np.abs(never_stopped[k] - resumed[k])) for k in saved])
                 ) if same_names else np.inf  # np.max keeps a NaN (Python's max may drop it)
    # Both runs trained on from the checkpoint (equal because neither moved would prove nothing).
    moved = same_names and all(np.any(never_stopped[k] != saved[k]) for k in saved)
    acc = accuracy(ckpt["model"], split.X_test, split.y_test)
    return [
        _row(f"resumed at epoch {n} vs never stopped, max |param diff|",
             f"{diff:.1e}" + ("" if moved else " (but no training after the checkpoint)"),
             "0 (bit-exact)", diff == 0.0 and moved),
        _row("checkpoint size, save / load time",
             f"{path.stat().st_size / 1024:.0f} KiB, {save_ms:.0f} / {load_ms:.0f} ms"),
        _row("resumed model's test accuracy", f"{acc:.3f}", "" if ctx.quick else ">= 0.9",
             INFO if ctx.quick else acc >= 0.9),
    ]
