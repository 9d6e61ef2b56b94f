"""The ``nnkit tour`` section for BERT (notes §6.5).

A small BERT is pretrained on sentence pairs from the shipped documents (Alice in
Wonderland, As You Like It, Paradise Lost; ``nnkit.datasets.text.next_sentence_task``)
with the masked-LM and next-sentence losses. As in BERT, the second segment of a negative
pair comes from another document, so NSP learns whether a and b share a document; rows
give the held-out MLM accuracy (against the most frequent token) and NSP accuracy (against
:data:`NSP_TARGET`; chance is 0.5) before and after, then the accuracy of the pretrained
encoder fine-tuned on Alice tasks with each kind of head (sequence, token, span), next to
the majority baseline, and checks that the MLM decoder is still the word embedding after
training. The plot shows both accuracies per epoch. ``ctx.quick`` uses a tiny model, a
small vocabulary and subsets (seconds; the accuracy rows are then information only).
"""

from __future__ import annotations

import copy
import dataclasses
import time

import numpy as np

from .. import optim
from .._random import manual_seed
from ..datasets import text as data
from ..models.bert import (
    IGNORE_INDEX,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
)
from ..training.bert import finetune_head, head_accuracy, pretrain_epoch, unigram_accuracy
from .common import INFO, tour_row

__all__ = ["bert_section"]

SECTION = "BERT"
NSP_TARGET = 0.55  # held-out NSP accuracy after the full run (0.5 is chance)


def _row(result, value, target="", ok=INFO):
    return tour_row(SECTION, result, value, target, ok)


def _subset(task, n_train, n_test):
    def cut(split, n):
        fields = ("input_ids", "token_type_ids", "attention_mask", "labels", "texts")
        return dataclasses.replace(split, **{f: getattr(split, f)[:n] for f in fields})

    return dataclasses.replace(task, train=cut(task.train, n_train), test=cut(task.test, n_test))


def _majority(task, kind) -> str:
    """Accuracy of always answering the most frequent training label (n/a for spans)."""
    if kind == "span":
        return "n/a"
    train, test = task.train.labels, task.test.labels
    majority = np.bincount(train[train != IGNORE_INDEX]).argmax()
    return f"{np.mean(test[test != IGNORE_INDEX] == majority):.3f}"


def _plot(ctx, history):
    from .common import pyplot

    plt = pyplot()
    if plt is None:
        return
    mlm, nsp = np.array(history).T
    fig, ax = plt.subplots(figsize=(6, 3.8))
    ax.plot(mlm, "o-", label="masked LM (masked tokens)")
    ax.plot(nsp, "s-", label="next sentence")
    ax.axhline(0.5, color="grey", lw=0.8, ls=":")
    ax.set_xlabel("pretraining epoch")
    ax.set_ylabel("held-out accuracy")
    ax.set_title("BERT pretraining on three books")
    ax.legend()
    fig.tight_layout()
    fig.savefig(ctx.out_dir / "bert_pretraining.png", dpi=110)
    plt.close(fig)


HEADS = {"sequence": BertForSequenceClassification, "token": BertForTokenClassification}


def _finetune_rows(ctx, model, tokenizer, quick):
    tasks = {"sentiment (lexicon)": ("sequence", data.sentiment_task, 8, 3e-3),  # ~200 rows
             "tagging (POS-like)": ("token", data.tagging_task, 3, 1e-3),
             "who-questions (span)": ("span", data.span_task, 3, 1e-3)}
    rows = []
    for name, (kind, make, epochs, lr) in tasks.items():
        task = make(tokenizer, random_state=ctx.seed)
        if quick:
            task = _subset(task, 96, 48)
        bert = copy.deepcopy(model.bert)
        head = (BertForQuestionAnswering(bert) if kind == "span"
                else HEADS[kind](bert, task.num_labels))
        finetune_head(head, kind, task, 1 if quick else epochs, lr=lr, seed=ctx.seed)
        acc = head_accuracy(head, kind, task.test, tokenizer.sep_token_id)
        base = _majority(task, kind)
        if quick:
            target, ok = "", INFO
        elif base == "n/a":
            target, ok = "> 0 (chance ~0.01)", acc > 0
        else:
            target, ok = f"> majority {base}", acc > float(base)
        rows.append(_row(f"fine-tuned {kind} head: {name}, test accuracy", f"{acc:.3f}",
                         target, ok))
    return rows


def bert_section(ctx) -> list[dict]:
    """Rows of the BERT section (see the module docstring)."""
    quick = ctx.quick
    tokenizer = data.corpus_tokenizer(500 if quick else 2000)
    pairs = data.next_sentence_task(tokenizer, max_length=32, random_state=ctx.seed,
                                    sentences_per_document=200 if quick else None)
    if quick:
        pairs = _subset(pairs, 128, 64)
    manual_seed(ctx.seed)
    model = BertForPreTraining(tokenizer.vocab_size, hidden_size=32 if quick else 64,
                               num_layers=1 if quick else 2, num_heads=4,
                               intermediate_size=64 if quick else 128, max_position=96)
    opt = optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    rng, history = np.random.default_rng(ctx.seed), []
    epochs = 1 if quick else 7  # NSP leaves chance after 3 to 6 epochs, by seed
    start = time.perf_counter()
    for epoch in range(epochs + 1):
        if epoch:
            pretrain_epoch(model, opt, pairs.train, tokenizer, rng)
        history.append(pretrain_epoch(model, None, pairs.test, tokenizer,
                                      np.random.default_rng(ctx.seed + 1), train=False))
    seconds = time.perf_counter() - start
    (mlm0, nsp0), (mlm1, nsp1) = history[0], history[-1]
    tied = model.decoder_weight is model.bert.embeddings.word_embeddings.weight
    unigram = unigram_accuracy(pairs.train, pairs.test, tokenizer.special_ids)
    rows = [
        _row(f"pretraining {epochs} epochs: held-out MLM accuracy, before -> after",
             f"{mlm0:.3f} -> {mlm1:.3f}",
             "" if quick else f"> most frequent token {unigram:.3f}",
             INFO if quick else mlm1 > unigram),
        _row("pretraining: held-out NSP accuracy (same document?), before -> after",
             f"{nsp0:.3f} -> {nsp1:.3f}", "" if quick else
             f"> {NSP_TARGET} (chance 0.5)", INFO if quick else nsp1 > NSP_TARGET),
        _row("pretraining time", f"{seconds:.1f} s"),
        _row("MLM decoder is the word-embedding Parameter after training", str(tied), "True",
             tied),
    ]
    rows += _finetune_rows(ctx, model, tokenizer, quick)
    if ctx.plots:
        _plot(ctx, history)
    return rows
