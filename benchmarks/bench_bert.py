"""One BERT-mini pretraining step: nnkit vs the same model built from torch.nn layers (CPU).

BERT-mini (Turc et al. 2019): 4 layers, hidden 256, 4 heads, feed-forward 1024, the
30522-token uncased WordPiece vocabulary; sequences of 128 tokens, batches of 32, dropout
0.1. One step = forward, masked-LM (decoder tied to the word embedding) + next-sentence
loss, backward, AdamW. Two variants, each the same computation in both libraries: the MLM
head at every position (as Hugging Face's BertForPreTraining) and only at the ~15% masked
positions (as the original BERT's pretraining, which gathers them first; nnkit's
``masked_only=True``). Target: nnkit at least as fast (ratio torch/nnkit >= 1).

Each contender runs in its own worker process and the workers alternate (nnkit, torch,
nnkit, ...), as in bench_mlp.py: torch's OpenMP pool and numba's/OpenBLAS's spinning workers
slow each other down when they share a process. Every worker runs with glibc malloc tuned
alike (harness.same_allocator()).

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python benchmarks/bench_bert.py
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

CONFIG = dict(vocab_size=30522, hidden_size=256, num_layers=4, num_heads=4,
              intermediate_size=1024, max_position=512)
BATCH, SEQ = 32, 128
SPECIALS = (0, 100, 101, 102, 103)  # [PAD] [UNK] [CLS] [SEP] [MASK] in BERT's vocab.txt
MASK_ID = 103


def _data():
    """Token ids, segments, MLM labels, NSP labels: the same arrays for both contenders."""
    from nnkit.models.bert import mask_tokens

    rng = np.random.default_rng(0)
    V = CONFIG["vocab_size"]
    ids = rng.integers(1000, V, (BATCH, SEQ))
    ids[:, 0], ids[:, SEQ // 2], ids[:, -1] = 101, 102, 102  # [CLS] A [SEP] B [SEP]
    types = np.zeros_like(ids)
    types[:, SEQ // 2 + 1:] = 1
    masked, labels = mask_tokens(ids, MASK_ID, V, SPECIALS, rng=rng)
    return masked, types, labels, rng.integers(0, 2, BATCH)


def _nnkit_step(threads: int, masked_only: bool):
    import numba

    import nnkit as nk
    from nnkit.models.bert import BertForPreTraining

    numba.set_num_threads(threads)
    nk.manual_seed(0)
    model = BertForPreTraining(**CONFIG, dropout=0.1)
    opt = nk.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    ids, types, labels, nsp = _data()

    def step():
        out = model(ids, types, mlm_labels=labels, next_sentence_labels=nsp,
                    masked_only=masked_only)
        opt.zero_grad()
        out.loss.backward()
        opt.step()

    return step


def _torch_model(torch):
    """BertForPreTraining from torch.nn layers: the structure of nnkit.models.bert."""
    nn = torch.nn
    c = CONFIG
    V, H = c["vocab_size"], c["hidden_size"]

    class TorchBertForPreTraining(nn.Module):
        def __init__(self):
            super().__init__()
            self.word = nn.Embedding(V, H, padding_idx=0)
            self.position = nn.Embedding(c["max_position"], H)
            self.token_type = nn.Embedding(2, H)
            self.norm = nn.LayerNorm(H, eps=1e-12)
            self.dropout = nn.Dropout(0.1)
            layer = nn.TransformerEncoderLayer(H, c["num_heads"], c["intermediate_size"], 0.1,
                                               activation="gelu", layer_norm_eps=1e-12,
                                               batch_first=True)
            self.encoder = nn.TransformerEncoder(layer, c["num_layers"],
                                                 enable_nested_tensor=False)
            self.pooler = nn.Linear(H, H)
            self.mlm_dense = nn.Linear(H, H)
            self.mlm_norm = nn.LayerNorm(H, eps=1e-12)
            self.mlm_bias = nn.Parameter(torch.zeros(V))
            self.nsp = nn.Linear(H, 2)

        def forward(self, ids, types, labels, nsp_labels, masked_only):
            pos = torch.arange(ids.shape[1])
            x = self.dropout(self.norm(self.word(ids) + self.position(pos)
                                       + self.token_type(types)))
            x = self.encoder(x)
            pooled = torch.tanh(self.pooler(x[:, 0]))
            if masked_only:  # (N, H) at the labelled positions, row-major
                x, labels = x[labels != -100], labels[labels != -100]
            h = self.mlm_norm(nn.functional.gelu(self.mlm_dense(x)))
            logits = nn.functional.linear(h, self.word.weight, self.mlm_bias)  # tied
            return (nn.functional.cross_entropy(logits.reshape(-1, V), labels.reshape(-1))
                    + nn.functional.cross_entropy(self.nsp(pooled), nsp_labels))

    return TorchBertForPreTraining()


def _torch_step(threads: int, masked_only: bool):
    import torch

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = _torch_model(torch)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    ids, types, labels, nsp = (torch.as_tensor(a) for a in _data())

    def step():
        loss = model(ids, types, labels, nsp, masked_only)
        opt.zero_grad()
        loss.backward()
        opt.step()

    return step


def _worker(impl: str, threads: int, blocks: int, block: int, masked_only: bool) -> None:
    """Time ``blocks`` blocks of ``block`` steps after 2 warm-up steps; print JSON seconds."""
    step = (_nnkit_step if impl == "nnkit" else _torch_step)(threads, masked_only)
    print(json.dumps(block_times(step, blocks, block, warmup=2, pause=0.2)))


def _measure(impls, threads, rounds, blocks, block, masked_only) -> dict:
    """Median seconds per step of each implementation, workers alternating."""
    samples = {impl: [] for impl in impls}
    for _ in range(rounds):
        for impl in impls:
            out = subprocess.run(
                [sys.executable, str(HERE), "--worker", impl, str(threads), str(blocks),
                 str(block), str(int(masked_only))], capture_output=True, text=True,
                check=True)
            samples[impl] += json.loads(out.stdout.strip().splitlines()[-1])
            time.sleep(0.3)
    return {impl: float(np.median(s)) for impl, s in samples.items()}


def run(quick: bool = False) -> list[dict]:
    import numba

    threads = numba.get_num_threads()
    impls = ["nnkit"] + (["torch"] if torch_available() else [])
    rounds, blocks, block = (1, 1, 1) if quick else (2, 2, 1)  # a step takes ~1 s or more
    variants = ((False, "MLM head at all positions"), (True, "MLM head at masked positions"))
    rows = []
    for masked_only, head in variants[:1] if quick else variants:
        med = _measure(impls, threads, rounds, blocks, block, masked_only)
        rows += [{"work": f"BERT-mini step, {head} (B={BATCH}, T={SEQ}, V=30522, AdamW)",
                  "impl": impl, "median_ms": f"{t * 1e3:.0f}",
                  "torch/impl": f"{med['torch'] / t:.2f}" if "torch" in med else "n/a",
                  "threads": threads} for impl, t in med.items()]
    return rows


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    same_allocator()  # glibc malloc tuned alike in every process, each contender's worker
    if argv and argv[0] == "--worker":
        _worker(argv[1], int(argv[2]), int(argv[3]), int(argv[4]), bool(int(argv[5])))
        return

    report(run, argv)


if __name__ == "__main__":
    main()
