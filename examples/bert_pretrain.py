"""Pretrain a small BERT on Alice in Wonderland, then fine-tune its three kinds of head.

Pretraining (notes, section 6.5) reads sentence pairs [CLS] a [SEP] b [SEP] from the
corpus that ships with nnkit (nnkit.datasets_text): 15% of the tokens are masked
(nk.models.mask_tokens) and the model predicts them (masked LM), and it predicts whether b
really follows a (next-sentence prediction). Then copies of the pretrained encoder are
fine-tuned on three small tasks built from the same book, next to an encoder trained from
scratch: lexicon sentiment (a classifier on [CLS]), part-of-speech-like tagging
(a classifier on every token) and "who" questions (start/end of the answer span).

    python examples/bert_pretrain.py            # a few minutes on 2 quiet cores
    python examples/bert_pretrain.py --small    # seconds (the smoke test)

Prints held-out MLM and NSP accuracy per epoch and the fine-tuning table; writes the
accuracy curves to bert_pretrain.png.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import time

import numpy as np

import nnkit as nk
from nnkit import datasets_text as data
from nnkit.models.bert import (
    Bert,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    best_span,
    mask_tokens,
)


def batches(split, size, rng):
    """Shuffled minibatches (ids, types, mask, labels), cut to their longest row."""
    for idx in nk.training.minibatches(len(split), size, rng=rng):
        width = int(split.attention_mask[idx].sum(axis=1).max())
        labels = split.labels[idx]
        if labels.shape[1:] == split.input_ids.shape[1:]:  # per-token labels (n, T)
            labels = labels[:, :width]
        yield (split.input_ids[idx, :width], split.token_type_ids[idx, :width],
               split.attention_mask[idx, :width], labels)


def head_of(split, n):
    """The first n examples of a split (the --small runs)."""
    return dataclasses.replace(split, **{f: getattr(split, f)[:n] for f in (
        "input_ids", "token_type_ids", "attention_mask", "labels", "texts")})


def pretrain_epoch(model, opt, split, tok, rng, train=True, batch_size=16):
    """One pass over NSP pairs with fresh masks; returns (MLM accuracy, NSP accuracy)."""
    model.train(train)
    hits = np.zeros(4)  # MLM right, MLM total, NSP right, NSP total
    for ids, types, mask, nsp in batches(split, batch_size, rng):
        masked, labels = mask_tokens(ids, tok.mask_token_id, tok.vocab_size, tok.special_ids,
                                     rng=rng)
        with nk.enable_grad() if train else nk.no_grad():
            out = model(masked, types, mask, mlm_labels=labels, next_sentence_labels=nsp,
                        masked_only=True)  # mlm_logits (N, V) at the masked positions only
        if train:
            opt.zero_grad()
            out.loss.backward()
            nk.optim.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
        target = labels[labels != -100]
        hits += [(out.mlm_logits.numpy().argmax(-1) == target).sum(), target.size,
                 (out.nsp_logits.numpy().argmax(-1) == nsp).sum(), nsp.size]
    return hits[0] / max(hits[1], 1), hits[2] / hits[3]


def unigram_accuracy(train, test, special_ids):
    """MLM accuracy of always guessing the most frequent training token (the bar to beat)."""
    words = train.input_ids[~np.isin(train.input_ids, special_ids)]
    held_out = test.input_ids[~np.isin(test.input_ids, special_ids)]
    return float(np.mean(held_out == np.bincount(words).argmax()))


def head_loss(head, kind, ids, types, mask, y):
    if kind == "span":
        return head(ids, types, mask, start_positions=y[:, 0], end_positions=y[:, 1]).loss
    return head(ids, types, mask, labels=y).loss


def score(head, kind, split, sep_id):
    """Accuracy: per sentence, per labelled token, or exact answer span."""
    head.eval()
    with nk.no_grad():
        args = (split.input_ids, split.token_type_ids, split.attention_mask)
        if kind == "span":
            out = head(*args)
            context = (split.token_type_ids == 1) & (split.input_ids != sep_id)
            start, end = best_span(out.start_logits, out.end_logits, 10, context)
            return float(np.mean((start == split.labels[:, 0]) & (end == split.labels[:, 1])))
        pred = head(*args).logits.numpy().argmax(-1)
        keep = split.labels != -100
        return float(np.mean(pred[keep] == split.labels[keep]))


def finetune(head, kind, task, epochs, lr, sep_id):
    opt = nk.optim.AdamW(head.parameters(), lr=lr, weight_decay=0.01)
    rng = np.random.default_rng(0)
    for _ in range(epochs):
        head.train()
        for ids, types, mask, y in batches(task.train, 32, rng):
            opt.zero_grad()
            head_loss(head, kind, ids, types, mask, y).backward()
            opt.step()
    return score(head, kind, task.test, sep_id)


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
    pairs = data.next_sentence_task(tok, max_length=64)
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
    ax.set_title("BERT pretraining on Alice in Wonderland")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
