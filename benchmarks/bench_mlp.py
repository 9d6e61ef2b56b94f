"""One training step (forward, backward, Adam) of an MLP 64-256-256-10 on batches of 64:
nnkit vs the same model in PyTorch eager on the CPU with the same thread count.

Target (foundation issue): nnkit at least as fast as PyTorch (ratio torch/nnkit >= 1).

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_mlp.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import environment, median_times, try_import_torch  # noqa: E402

import nnkit as nk  # noqa: E402
import nnkit.functional as F  # noqa: E402


def _nnkit_step(sizes, X, y):
    nk.manual_seed(0)
    layers = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        layers.append(nk.nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers.append(nk.nn.ReLU())
    model = nk.nn.Sequential(*layers)
    opt = nk.optim.Adam(model.parameters(), lr=1e-3)

    def step():
        loss = F.cross_entropy(model(X), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    return model, step


def _torch_step(torch, model_nk, X, y):
    layers = []
    for m in model_nk:
        if isinstance(m, nk.nn.Linear):
            layers.append(torch.nn.Linear(m.in_features, m.out_features))
        else:
            layers.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*layers)
    model.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in model_nk.state_dict().items()})
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    Xt, yt = torch.from_numpy(X), torch.from_numpy(y)

    def step():
        loss = torch.nn.functional.cross_entropy(model(Xt), yt)
        opt.zero_grad()
        loss.backward()
        opt.step()

    return step


def run(quick: bool = False) -> list[dict]:
    sizes = (64, 256, 256, 10)
    rng = np.random.default_rng(0)
    X = rng.standard_normal((64, sizes[0])).astype(np.float32)
    y = rng.integers(0, sizes[-1], 64)
    model, nk_step = _nnkit_step(sizes, X, y)
    contenders = {"nnkit": nk_step}
    torch = try_import_torch()
    if torch is not None:
        contenders["torch"] = _torch_step(torch, model, X, y)
    repeats = 50 if quick else 400
    times = median_times(contenders, repeats=repeats, warmup=20)
    env = environment()
    rows = [{"work": "MLP 64-256-256-10 step (B=64, Adam)", "impl": name,
             "median_us": f"{t * 1e6:.1f}",
             "torch/impl": f"{times['torch'] / t:.2f}" if "torch" in times else "n/a",
             "threads": env["numba_threads"]} for name, t in times.items()]
    return rows


def main(argv=None) -> None:
    from nnkit.tour import format_table

    print(environment())
    rows = run(quick="--quick" in (argv or sys.argv[1:]))
    print(format_table(rows, list(rows[0])))


if __name__ == "__main__":
    main()
