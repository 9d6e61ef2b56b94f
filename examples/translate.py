"""Translate number words to digits with an RNN + attention and with a transformer.
================================================================================

"three hundred five thousand forty two" -> "3 0 5 0 4 2" (nnkit.datasets.translation). Both
models learn by teacher forcing (predict token i from the reference tokens before it), then
decode held-out sentences on their own, greedily and with beam search, reusing a cache so
that each new token costs one decoder step. Exact match = the whole number is right.

    python examples/translate.py            # 3000 pairs, ~30 s on 2 quiet cores; >= 95% both
    python examples/translate.py --small    # a few hundred pairs, seconds (the smoke test)

Prints the exact-match table and writes the attention alignment of one test sentence to
translate.png (rows: emitted digits, columns: source words).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import nnkit as nk
import nnkit.functional as F
from nnkit.datasets.translation import PAD_ID, exact_match, number_translation
from nnkit.models import Seq2Seq, TransformerTranslator, beam_search, greedy_decode


def train(model, task, epochs, lr, batch=64):
    """Adam on teacher-forced cross entropy, lr decaying linearly to lr / 10."""
    opt = nk.optim.Adam(model.parameters(), lr=lr)
    rng = np.random.default_rng(0)
    for epoch in range(epochs):
        opt.param_groups[0]["lr"] = lr * (1 - 0.9 * epoch / max(epochs - 1, 1))
        for idx in nk.training.minibatches(len(task.src_train), batch, rng=rng):
            src, tgt = task.src_train[idx], task.tgt_train[idx]  # (B, S), (B, T)
            logits = model(src, tgt[:, :-1])  # reads <bos> y_1 .. y_{T-1}: (B, T-1, V)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                   tgt[:, 1:].reshape(-1), ignore_index=PAD_ID)
            opt.zero_grad()
            loss.backward()
            nk.optim.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
    return model.eval()


def alignment(model, src_row, output):
    """Attention over the source (T, S) at each decoding step that produced ``output``."""
    with nk.no_grad():
        cache, rows = model.encode(src_row[None]), []
        for token in np.concatenate([[model.bos_id], output[:-1]]):
            _, cache = model.decode_step(np.array([token]), cache)
            rows.append(cache.attention.numpy()[0])
    return np.stack(rows)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--small", action="store_true", help="a few hundred pairs, 2 epochs")
    parser.add_argument("--out", default="translate.png")
    args = parser.parse_args(argv)
    task = number_translation(300 if args.small else 3000, 100 if args.small else 1000,
                              random_state=0)
    V_src, V_tgt = len(task.src_vocab), len(task.tgt_vocab)
    nk.manual_seed(0)
    models = {"Seq2Seq": (Seq2Seq(V_src, V_tgt, embed_dim=32, hidden_size=64), 3e-3, 8),
              "Transformer": (TransformerTranslator(V_src, V_tgt, d_model=64, nhead=4,
                                                    dim_feedforward=128, max_len=32), 2e-3, 12)}
    results, maps = {}, {}
    k = int(np.argmax((task.src_test != PAD_ID).sum(axis=1)))  # a long test sentence
    print(f"{'model':12s} {'greedy':>7s} {'beam 4':>7s} {'train s':>8s}")
    for name, (model, lr, epochs) in models.items():
        start = time.perf_counter()
        train(model, task, 2 if args.small else epochs, lr)
        seconds = time.perf_counter() - start
        greedy = greedy_decode(model, task.src_test, max_len=8)
        beam = beam_search(model, task.src_test, beam_size=4, max_len=8)
        results[name] = (exact_match(greedy, task.tgt_test), exact_match(beam, task.tgt_test))
        print(f"{name:12s} {results[name][0]:7.3f} {results[name][1]:7.3f} {seconds:8.1f}")
        maps[name] = (alignment(model, task.src_test[k], greedy[k]), greedy[k])
    _plot(maps, task, task.src_test[k], args.out)
    return results


def _plot(maps, task, src_row, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot")
        return
    words = task.src_vocab.decode(src_row)
    fig, axes = plt.subplots(1, len(maps), figsize=(10, 3.8))
    for ax, (name, (weights, output)) in zip(axes, maps.items(), strict=True):
        digits = task.tgt_vocab.decode(output) + ["<eos>"]
        ax.imshow(weights[: len(digits), : len(words)], vmin=0, vmax=1, cmap="viridis")
        ax.set_xticks(range(len(words)), words, rotation=60, ha="right")
        ax.set_yticks(range(len(digits)), digits)
        ax.set_title(f"{name}: attention alignment")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
