"""Pretrained-checkpoint workloads: BERT-base and ViT-B/16 inference, nnkit vs
torch (transformers' models, eager, on the CPU with the same thread count), and tokenizing
10,000 sentences, nnkit's WordPieceTokenizer vs the tokenizers package's Rust WordPiece.

- BERT-base shapes (vocabulary 30522, width 768, 12 layers, 12 heads, feed-forward 3072,
  512 positions), random weights, batch 8 x 128 tokens, the encoder's forward
  (``Bert(ids, types, mask)``; transformers' ``BertModel``) without gradients;
- ViT-B/16 (224 x 224 images, 16 x 16 patches -> 197 tokens, width 768, 12 layers, 1000
  classes), random weights, batch 8, the classifier's forward without gradients;
- the corpus of ``nnkit.datasets.text`` cycled to 10,000 sentences (about 100 characters
  each), its 2000-piece vocabulary, ``encode_batch(max_length=128, truncation=True)`` with
  padding; tokenizers' ``BertWordPieceTokenizer`` on the same vocab.txt, ``encode_batch``
  (its threads) and one ``encode`` per sentence (one thread). nnkit's word cache is emptied
  before every timed call.

The weights are nnkit's, written once with ``save_pretrained`` and read by both contenders'
``from_pretrained``, so both compute the same function (each worker prints a checksum of its
outputs). Each contender runs in its own worker process under the same allocator settings
(``harness.same_allocator()``), the workers alternating; medians over the blocks of every
round. Targets: inference >= 1.0x torch eager; the tokenizer within 3x of the Rust one.

    python benchmarks/bench_pretrained.py [--quick]
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))
from harness import block_times, report, same_allocator, torch_available  # noqa: E402

BERT_BASE = dict(vocab_size=30522, hidden_size=768, num_layers=12, num_heads=12,
                 intermediate_size=3072, max_position=512)
VIT_B16 = dict(image_size=224, patch_size=16, in_channels=3, num_classes=1000, dim=768,
               depth=12, heads=12, mlp_dim=3072, layer_norm_eps=1e-12)
BATCH, LENGTH, SENTENCES = 8, 128, 10_000


def _bert_inputs():
    rng = np.random.default_rng(0)
    ids = rng.integers(1000, BERT_BASE["vocab_size"], (BATCH, LENGTH))
    ids[:, 0] = 101
    mask = np.ones_like(ids)
    mask[1::2, 100:] = 0  # every other sequence padded after 100 tokens
    return ids, np.zeros_like(ids), mask


def _images():
    return np.random.default_rng(1).standard_normal((BATCH, 3, 224, 224)).astype(np.float32)


def _sentences(folder) -> list[str]:
    """The sentences the main process wrote beside the tokenizer (so that the Rust
    contender's worker never imports nnkit, numba or torch)."""
    return json.loads((Path(folder) / "sentences.json").read_text(encoding="utf-8"))


def _nnkit_step(work: str, folder: str):
    import nnkit as nk
    from nnkit.models import Bert, ViT
    from nnkit.text import WordPieceTokenizer

    if work == "tokenize":
        tok = WordPieceTokenizer.from_pretrained(folder)
        sentences = _sentences(folder)

        def step():
            tok._cache.clear()  # cold: every word cut afresh on each call
            return tok.encode_batch(sentences, max_length=LENGTH, truncation=True).ids

        return step, lambda out: int(out.sum())
    if work == "bert":
        model = Bert.from_pretrained(folder)
        ids, types, mask = _bert_inputs()

        def step():
            with nk.no_grad():
                return model(ids, types, mask)[0].numpy()
    else:
        model = ViT.from_pretrained(folder)
        images = _images()

        def step():
            with nk.no_grad():
                return model(images).numpy()

    return step, lambda out: float(np.abs(out).mean())


def _other_step(work: str, folder: str, threads: int):
    if work.startswith("tokenize"):
        import tokenizers

        tok = tokenizers.BertWordPieceTokenizer(str(Path(folder) / "vocab.txt"), lowercase=True)
        tok.enable_truncation(LENGTH)
        tok.enable_padding()
        sentences = _sentences(folder)
        if work == "tokenize-batch":
            def step():
                return tok.encode_batch(sentences)
        else:
            def step():
                return [tok.encode(s) for s in sentences]
        return step, lambda out: int(sum(sum(e.ids) for e in out))
    import torch
    import transformers

    torch.set_num_threads(threads)
    if work == "bert":
        model = transformers.BertModel.from_pretrained(folder).eval()
        ids, types, mask = (torch.from_numpy(a) for a in _bert_inputs())

        def step():
            with torch.no_grad():
                return model(ids, attention_mask=mask, token_type_ids=types).last_hidden_state
    else:
        model = transformers.ViTForImageClassification.from_pretrained(folder).eval()
        images = torch.from_numpy(_images())

        def step():
            with torch.no_grad():
                return model(images).logits

    return step, lambda out: float(out.abs().mean())


def _worker(impl: str, work: str, folder: str, threads: int, blocks: int) -> None:
    """Time ``blocks`` calls of one contender; print seconds per call and a checksum. Only
    nnkit's worker imports numba (its OpenMP runtime beside torch's slows torch)."""
    if impl == "nnkit":
        import numba

        numba.set_num_threads(threads)
        step, checksum = _nnkit_step(work, folder)
    else:
        step, checksum = _other_step(work if impl == "torch" else f"tokenize-{impl}", folder,
                                     threads)
    times = block_times(step, blocks, 1, warmup=1, pause=0.2)
    print(json.dumps({"times": times, "checksum": checksum(step())}))


def _checkpoints(root: Path) -> dict:
    """Random BERT-base and ViT-B/16 checkpoints and the corpus tokenizer, saved once."""
    import nnkit as nk
    from nnkit.datasets import text
    from nnkit.models import Bert, ViT

    nk.manual_seed(0)
    folders = {"bert": root / "bert", "vit": root / "vit", "tokenize": root / "tokenizer"}
    Bert(**BERT_BASE).save_pretrained(folders["bert"])
    ViT(**VIT_B16).save_pretrained(folders["vit"])
    text.corpus_tokenizer().save_pretrained(folders["tokenize"])
    corpus = text.load_corpus()
    sentences = [corpus[i % len(corpus)] for i in range(SENTENCES)]
    (folders["tokenize"] / "sentences.json").write_text(json.dumps(sentences),
                                                         encoding="utf-8")
    return folders


def run(quick: bool = False) -> list[dict]:
    import importlib.util

    import numba

    threads = numba.get_num_threads()
    rounds, blocks = (1, 2) if quick else (2, 3)
    have_torch = torch_available() and importlib.util.find_spec("transformers") is not None
    have_rust = importlib.util.find_spec("tokenizers") is not None
    works = {"bert": ["nnkit"] + ["torch"] * have_torch,
             "vit": ["nnkit"] + ["torch"] * have_torch,
             "tokenize": ["nnkit"] + ["batch", "loop"] * have_rust}
    titles = {"bert": f"BERT-base encoder forward (B={BATCH}, T={LENGTH})",
              "vit": f"ViT-B/16 forward (B={BATCH}, 224x224)",
              "tokenize": f"tokenize {SENTENCES} sentences (max_length={LENGTH})"}
    rows = []
    with tempfile.TemporaryDirectory() as root:
        folders = _checkpoints(Path(root))
        for work, impls in works.items():
            samples, sums = {impl: [] for impl in impls}, {}
            for _ in range(rounds):
                for impl in impls:
                    out = subprocess.run(
                        [sys.executable, str(HERE), "--worker", impl, work,
                         str(folders[work]), str(threads), str(blocks)],
                        capture_output=True, text=True, check=True)
                    result = json.loads(out.stdout.strip().splitlines()[-1])
                    samples[impl] += result["times"]
                    sums[impl] = result["checksum"]
                    time.sleep(0.5)
            med = {impl: float(np.median(s)) for impl, s in samples.items()}
            for impl, t in med.items():
                ref = med.get("torch") if work != "tokenize" else med.get("batch")
                rows.append({"work": titles[work],
                             "impl": {"batch": "tokenizers (Rust) encode_batch",
                                      "loop": "tokenizers (Rust) encode loop"}.get(impl, impl),
                             "median_ms": f"{t * 1e3:.1f}",
                             "other/impl": "n/a" if ref is None else f"{ref / t:.2f}",
                             "checksum": f"{sums[impl]:.6g}", "threads": threads})
    return rows


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    same_allocator()  # glibc malloc tuned alike in every process, each contender's worker
    if argv and argv[0] == "--worker":
        _worker(argv[1], argv[2], argv[3], int(argv[4]), int(argv[5]))
        return
    report(run, argv)


if __name__ == "__main__":
    main()
