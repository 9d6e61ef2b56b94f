"""Pretrain a small BERT on three books, then fine-tune its three kinds of head on Alice.
======================================================================================

Pretraining (notes §6.5) reads sentence pairs [CLS] a [SEP] b [SEP] from the
documents that ship with nnkit (nnkit.datasets.text.load_documents: Alice in Wonderland,
Shakespeare's As You Like It, Milton's Paradise Lost, equal shares): 15% of the tokens are
masked (nk.models.mask_tokens) and the model predicts them (masked LM), and it predicts
whether b really follows a (next-sentence prediction). As in BERT, a "not next" b is a
sentence from a *different* document, so NSP is learnable: the model has to tell whether a
and b share a document (vocabulary, topic, style). Then copies of the pretrained encoder
are fine-tuned on three small tasks built from Alice, next to an encoder trained from
scratch: lexicon sentiment (a classifier on [CLS]), part-of-speech-like tagging
(a classifier on every token) and "who" questions (start/end of the answer span).

    python examples/bert_pretrain.py            # a few minutes on 2 quiet cores
    python examples/bert_pretrain.py --small    # seconds (the smoke test)

Prints held-out MLM and NSP accuracy per epoch and the fine-tuning table; writes the
accuracy curves to bert_pretrain.png. On one thread (about a minute of pretraining)
held-out MLM accuracy rises 0.000 -> ~0.15 (the most frequent token scores 0.07) and NSP
0.50 -> ~0.74, leaving chance after 2-3 epochs (benchmarks/RESULTS.md, "Next-sentence
prediction"). With negatives drawn from the same book instead, NSP stayed at chance: within
one novel, a sentence and a random other one are hardly less related than a sentence and
its successor.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import time

import numpy as np

import nnkit as nk
from nnkit.datasets import text as data
from nnkit.models.bert import (
    Bert,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
)
from nnkit.training import finetune_head, head_accuracy, pretrain_epoch, unigram_accuracy


def head_of(split, n):
    """The first n examples of a split (the --small runs)."""
    return dataclasses.replace(split, **{f: getattr(split, f)[:n] for f in (
        "input_ids", "token_type_ids", "attention_mask", "labels", "texts")})


def finetune(head, kind, task, epochs, lr, sep_id):
    """Fine-tune ``head`` (its encoder too) and return its test accuracy."""
    finetune_head(head, kind, task, epochs, lr=lr)
    return head_accuracy(head, kind, task.test, sep_id)


HEADS = {"sequence": lambda bert, n: BertForSequenceClassification(bert, n),
         "token": lambda bert, n: BertForTokenClassification(bert, n),
         "span": lambda bert, n: BertForQuestionAnswering(bert)}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--small", action="store_true", help="a tiny model, 2 epochs")
    parser.add_argument("--out", default="bert_pretrain.png")
    args = parser.parse_args(argv)
    tok = data.corpus_tokenizer(600 if args.small else 2000)
    cfg = dict(vocab_size=tok.vocab_size, hidden_size=32 if args.small else 96,
               num_layers=1 if args.small else 2, num_heads=4,
               intermediate_size=64 if args.small else 192, max_position=96)
    pairs = data.next_sentence_task(tok, max_length=48)  # 48: about the old run time
    n_train, n_test = (192, 64) if args.small else (None, None)  # None: the whole split
    pairs = dataclasses.replace(pairs, train=head_of(pairs.train, n_train),
                                test=head_of(pairs.test, n_test))
    nk.manual_seed(0)
    model = BertForPreTraining(**cfg)
    opt = nk.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    rng, history = np.random.default_rng(0), []
    epochs = 2 if args.small else 12
    unigram = unigram_accuracy(pairs.train, pairs.test, tok.special_ids)
    print(f"held-out MLM accuracy of the most frequent token: {unigram:.3f}")
    print("epoch  MLM acc  NSP acc (held out)")
    start = time.perf_counter()
    for epoch in range(epochs + 1):
        if epoch:  # epoch 0 is the untrained model
            pretrain_epoch(model, opt, pairs.train, tok, rng)
        mlm, nsp = pretrain_epoch(model, None, pairs.test, tok, np.random.default_rng(1),
                                  train=False)
        history.append((mlm, nsp))
        print(f"{epoch:5d}  {mlm:7.3f}  {nsp:7.3f}")
    print(f"pretraining: {time.perf_counter() - start:.1f} s")
    tasks = {"sentiment": ("sequence", data.sentiment_task, 8, 3e-3),  # about 200 sentences
             "tagging": ("token", data.tagging_task, 3, 1e-3),
             "who-questions": ("span", data.span_task, 3, 1e-3)}
    results = {}
    print(f"{'task':15s} {'head':9s} {'pretrained':>10s} {'scratch':>8s}")
    for name, (kind, make, epochs, lr) in tasks.items():
        task = make(tok)
        task = dataclasses.replace(task, train=head_of(task.train, n_train),
                                   test=head_of(task.test, n_test))
        nk.manual_seed(1)
        scratch = Bert(**cfg)
        accs = [finetune(HEADS[kind](bert, task.num_labels), kind, task,
                         1 if args.small else epochs, lr, tok.sep_token_id)
                for bert in (copy.deepcopy(model.bert), scratch)]
        results[name] = accs
        print(f"{name:15s} {kind:9s} {accs[0]:10.3f} {accs[1]:8.3f}")
    _plot(history, unigram, args.out)
    return results


def _plot(history, unigram, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot")
        return
    mlm, nsp = np.array(history).T
    fig, ax = plt.subplots(figsize=(6, 3.8))
    ax.plot(mlm, "o-", label="masked LM (masked tokens)")
    ax.plot(nsp, "s-", label="next sentence")
    ax.axhline(0.5, color="grey", lw=0.8, ls=":", label="chance (NSP)")
    ax.axhline(unigram, color="C0", lw=0.8, ls=":", label="most frequent token (MLM)")
    ax.set_xlabel("pretraining epoch")
    ax.set_ylabel("held-out accuracy")
    ax.set_title("BERT pretraining on three books")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
