"""Pretraining and fine-tuning BERT on the shipped text tasks: one pretraining epoch (masked
LM + next sentence), fine-tuning a head, and the accuracies the tour and
``examples/bert_pretrain.py`` report."""

from __future__ import annotations

import numpy as np

from .. import optim
from ..autograd import enable_grad, no_grad
from ..models.bert import IGNORE_INDEX, best_span, mask_tokens
from .loops import minibatches

__all__ = ["pretrain_epoch", "finetune_head", "head_accuracy", "unigram_accuracy",
           "text_batches"]


def text_batches(split, size, rng):
    """Minibatches (ids, types, mask, labels) of a ``TextSplit``, cut to the longest row."""
    for idx in minibatches(len(split), size, rng=rng):
        width = int(split.attention_mask[idx].sum(axis=1).max())
        labels = split.labels[idx]
        if labels.shape[1:] == split.input_ids.shape[1:]:  # per-token labels (n, T)
            labels = labels[:, :width]
        yield (split.input_ids[idx, :width], split.token_type_ids[idx, :width],
               split.attention_mask[idx, :width], labels)


def pretrain_epoch(model, opt, split, tokenizer, rng, train: bool = True,
                   batch_size: int = 16) -> tuple[float, float]:
    """One pass over NSP pairs with fresh 15% masks; (MLM accuracy, NSP accuracy).

    MLM accuracy is over the masked positions. With ``train=False`` nothing is updated.
    """
    model.train(train)
    counts = np.zeros(4)  # MLM right, MLM total, NSP right, NSP total
    for ids, types, mask, nsp in text_batches(split, batch_size, rng):
        masked, labels = mask_tokens(ids, tokenizer.mask_token_id, tokenizer.vocab_size,
                                     tokenizer.special_ids, rng=rng)
        with enable_grad() if train else no_grad():
            out = model(masked, types, mask, mlm_labels=labels, next_sentence_labels=nsp,
                        masked_only=True)
        if train:
            opt.zero_grad()
            out.loss.backward()
            optim.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
        target = labels[labels != IGNORE_INDEX]
        counts += [(out.mlm_logits.numpy().argmax(-1) == target).sum(), target.size,
                   (out.nsp_logits.numpy().argmax(-1) == nsp).sum(), nsp.size]
    return counts[0] / max(counts[1], 1), counts[2] / max(counts[3], 1)


def unigram_accuracy(train, test, special_ids) -> float:
    """Held-out MLM accuracy of always guessing the most frequent training token.

    Masked positions are uniform over the non-special tokens, so this is the share of the
    test split's non-special tokens equal to the training split's most frequent one.
    """
    words = train.input_ids[~np.isin(train.input_ids, special_ids)]
    held_out = test.input_ids[~np.isin(test.input_ids, special_ids)]
    return float(np.mean(held_out == np.bincount(words).argmax()))


def _loss(head, kind, ids, types, mask, y):
    if kind == "span":
        return head(ids, types, mask, start_positions=y[:, 0], end_positions=y[:, 1]).loss
    return head(ids, types, mask, labels=y).loss


def head_accuracy(head, kind: str, split, sep_id: int, max_answer_len: int = 10) -> float:
    """Test accuracy: per sequence ('sequence'), per labelled token ('token'), or the exact
    answer span inside the context segment ('span')."""
    head.eval()
    with no_grad():
        args = (split.input_ids, split.token_type_ids, split.attention_mask)
        if kind == "span":
            out = head(*args)
            context = (split.token_type_ids == 1) & (split.input_ids != sep_id)
            start, end = best_span(out.start_logits, out.end_logits, max_answer_len, context)
            return float(np.mean((start == split.labels[:, 0]) & (end == split.labels[:, 1])))
        pred = head(*args).logits.numpy().argmax(-1)
        keep = split.labels != IGNORE_INDEX
        return float(np.mean(pred[keep] == split.labels[keep]))


def finetune_head(head, kind: str, task, epochs: int, lr: float = 1e-3, seed: int = 0):
    """AdamW on the head's loss over ``task.train`` (the encoder is trained too)."""
    opt = optim.AdamW(head.parameters(), lr=lr, weight_decay=0.01)
    rng = np.random.default_rng(seed)
    for _ in range(epochs):
        head.train()
        for ids, types, mask, y in text_batches(task.train, 32, rng):
            opt.zero_grad()
            _loss(head, kind, ids, types, mask, y).backward()
            opt.step()
    return head
