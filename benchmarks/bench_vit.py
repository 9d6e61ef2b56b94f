"""One training step (forward, backward, AdamW) of the digits ViT: nnkit vs the same model
built from torch.nn layers, PyTorch eager on the CPU with the same thread count.

The model is ``nnkit.training.DIGITS_VIT`` (8x8 images, 2x2 patches -> 16 tokens + [CLS],
width 64, 3 pre-norm GELU layers, 8 heads, MLP 128); the torch twin has the same parameter
names and starts from nnkit's weights (a state_dict copy), so both do the same arithmetic.
Batches of 32 (the training batch) and 128 images. Target: nnkit at least as
fast as PyTorch (ratio torch/nnkit >= 1, torch on numba's thread count). Rows: nnkit as is
(its GEMMs under ``nnkit._backend.SMALL_GEMM_FLOPS`` run on numba's threads or on one BLAS
thread, see ``nnkit._backend.matmul``), nnkit with BLAS on one thread, nnkit all on one
thread, torch on numba's thread count and torch on one thread; the ratio compares each
nnkit row with torch on the same thread count (nnkit-1 with torch-1).

Each contender runs in its own worker process, and the workers alternate (nnkit, torch,
nnkit, torch, ...) within this one run: in one process torch's OpenMP pool and numba's and
OpenBLAS's spinning workers slow each other down (see bench_mlp.py). The machine is shared;
medians of many blocks, and the rounds interleaved, keep the comparison fair, not quiet.
Every worker runs with glibc malloc tuned (harness.same_allocator()); ``--both-allocators``
adds ``nnkit-glibc`` and ``torch-glibc``, the same step under glibc's defaults
(``NNKIT_MALLOC_TUNING=0``), each compared with the other.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_vit.py \
        [--quick] [--both-allocators]
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))
from harness import block_times, report, same_allocator, torch_available  # noqa: E402

BATCHES = (32, 128)


def _nnkit_model_and_data(batch: int):
    import nnkit as nk
    from nnkit.training import make_digits_vit

    model = make_digits_vit(0)
    data = nk.datasets.load_digits(flatten=False, random_state=0)
    return model, data.X_train[:batch], data.y_train[:batch]


def _nnkit_step(threads: int, batch: int):
    import numba

    import nnkit as nk
    import nnkit.functional as F

    numba.set_num_threads(threads)
    model, X, y = _nnkit_model_and_data(batch)
    opt = nk.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)

    def step():
        loss = F.cross_entropy(model(X), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    return step


def _torch_vit(torch, config):
    """The digits ViT from torch.nn layers, parameter names as nnkit's ViT."""
    nn = torch.nn
    p, D, C = config["patch_size"], config["dim"], config["in_channels"]
    n = (config["image_size"] // p) ** 2

    class TorchViT(nn.Module):
        def __init__(self):
            super().__init__()
            self.patch_embed = nn.Linear(C * p * p, D)
            self.cls_token = nn.Parameter(torch.zeros(1, 1, D))
            self.pos_embed = nn.Parameter(torch.zeros(1, n + 1, D))
            self.dropout = nn.Dropout(config["dropout"])
            layer = nn.TransformerEncoderLayer(D, config["heads"], config["mlp_dim"],
                                               dropout=config["dropout"], activation="gelu",
                                               batch_first=True, norm_first=True)
            self.encoder = nn.TransformerEncoder(layer, config["depth"], norm=nn.LayerNorm(D),
                                                 enable_nested_tensor=False)
            self.head = nn.Linear(D, config["num_classes"])

        def forward(self, images):  # (B, C, H, W)
            B, _, H, W = images.shape
            x = images.reshape(B, C, H // p, p, W // p, p).permute(0, 2, 4, 1, 3, 5)
            x = self.patch_embed(x.reshape(B, n, C * p * p))  # (B, n, D)
            z = torch.cat([self.cls_token.expand(B, 1, D), x], dim=1) + self.pos_embed
            return self.head(self.encoder(self.dropout(z))[:, 0])

    return TorchViT()


def _torch_step(threads: int, batch: int):
    import torch

    from nnkit.training import DIGITS_VIT

    torch.set_num_threads(threads)
    model, X, y = _nnkit_model_and_data(batch)
    twin = _torch_vit(torch, DIGITS_VIT)
    twin.load_state_dict({k: torch.tensor(v) for k, v in model.state_dict().items()})
    opt = torch.optim.AdamW(twin.parameters(), lr=1e-3, weight_decay=0.05)
    X, y = torch.from_numpy(X), torch.from_numpy(y)

    def step():
        loss = torch.nn.functional.cross_entropy(twin(X), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    return step


def _worker(impl: str, threads: int, batch: int, blocks: int, block: int) -> None:
    """Time ``blocks`` blocks of ``block`` steps; print the per-step seconds as JSON.

    ``impl``: 'nnkit' (as is: ``nnkit._backend.matmul``'s choice per GEMM),
    'nnkit-blas1' (BLAS on one thread), 'nnkit-1' (numba and BLAS on one
    thread), 'torch' (``threads``), 'torch-1' (one thread); 'nnkit-glibc' and 'torch-glibc'
    as 'nnkit' and 'torch', run by ``run`` under ``NNKIT_MALLOC_TUNING=0``.
    """
    if impl in ("nnkit-blas1", "nnkit-1"):
        from threadpoolctl import threadpool_limits

        threadpool_limits(1, user_api="blas")
    if impl.endswith("-1"):
        threads = 1
    step = (_torch_step if impl.startswith("torch") else _nnkit_step)(threads, batch)
    print(json.dumps(block_times(step, blocks, block, warmup=10, pause=0.05)))


def run(quick: bool = False, both_allocators: bool = False) -> list[dict]:
    import os

    import numba

    threads = numba.get_num_threads()
    impls = ["nnkit", "nnkit-blas1", "nnkit-1"] + ["nnkit-glibc"] * both_allocators
    if torch_available():
        impls += ["torch", "torch-1"] + ["torch-glibc"] * both_allocators
    glibc = dict(os.environ, NNKIT_MALLOC_TUNING="0")  # same_allocator() then does nothing
    setting = "tuned" if same_allocator().startswith("mmap threshold") else "glibc defaults"
    rounds, blocks, block = (1, 3, 5) if quick else (3, 6, 10)
    rows = []
    for batch in BATCHES[:1] if quick else BATCHES:
        samples = {impl: [] for impl in impls}
        for _ in range(rounds):
            for impl in impls:
                out = subprocess.run(
                    [sys.executable, str(HERE), "--worker", impl, str(threads), str(batch),
                     str(blocks), str(block)], capture_output=True, text=True, check=True,
                    env=glibc if impl.endswith("-glibc") else None)
                samples[impl] += json.loads(out.stdout.strip().splitlines()[-1])
                time.sleep(0.3)
        med = {impl: float(np.median(s)) for impl, s in samples.items()}
        for impl, t in med.items():
            single = impl.endswith("-1")  # compared with torch on one thread
            untuned = impl.endswith("-glibc")  # compared with torch under glibc's defaults
            ref = med.get("torch-1" if single else "torch-glibc" if untuned else "torch")
            rows.append({"work": f"ViT digits step (B={batch}, 17 tokens, AdamW)",
                         "impl": impl, "malloc": "glibc defaults" if untuned else setting,
                         "median_ms": f"{t * 1e3:.2f}",
                         "torch/impl (same threads)": "n/a" if ref is None else f"{ref / t:.2f}",
                         "threads": 1 if single else threads})
    return rows


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    same_allocator()  # glibc malloc tuned alike in every process, each contender's worker
    if argv and argv[0] == "--worker":
        _worker(argv[1], int(argv[2]), int(argv[3]), int(argv[4]), int(argv[5]))
        return

    report(lambda quick: run(quick, "--both-allocators" in argv), argv)


if __name__ == "__main__":
    main()
