"""BERT (nnkit.models.bert): shapes, padding, the MLM/NSP losses, tied weights, mask_tokens,
best_span, bad input, float64 gradchecks, and torch models built from torch.nn layers the
same way (outputs and every parameter gradient after a state_dict copy).

Save/load round trips are in tests/test_persistence.py.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
from helpers import import_torch
from hypothesis import given, settings
from hypothesis import strategies as st

import nnkit as nk
import nnkit.functional as F
from nnkit.gradcheck import gradcheck
from nnkit.models.bert import (
    IGNORE_INDEX,
    Bert,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    best_span,
    mask_tokens,
)

PAD, UNK, CLS, SEP, MASK = 0, 1, 2, 3, 4
SPECIALS = (PAD, UNK, CLS, SEP, MASK)
V = 23
CFG = dict(vocab_size=V, hidden_size=16, num_layers=2, num_heads=4, intermediate_size=32,
           max_position=10)
TOL64 = {"rtol": 1e-8, "atol": 1e-10}


def _batch(rng, B=3, T=9, V=V):
    """[CLS] a.. [SEP] b.. [SEP] [PAD].. rows of different lengths; (ids, types, mask)."""
    ids = np.zeros((B, T), dtype=np.int64)
    types = np.zeros((B, T), dtype=np.int64)
    for b in range(B):
        n = T - 2 * b if T - 2 * b >= 5 else T
        a = (n - 3) // 2
        row = [CLS, *rng.integers(5, V, a), SEP, *rng.integers(5, V, n - a - 3), SEP]
        ids[b, :n] = row
        types[b, a + 2:n] = 1
    return ids, types, (ids != PAD).astype(np.int64)


def _model(cls=Bert, dtype=None, dropout=0.0, seed=0, **overrides):
    nk.manual_seed(seed)
    return cls(**{**CFG, **overrides}, dropout=dropout, dtype=dtype)


# ----- shapes and basics ---------------------------------------------------------------------
def test_shapes_of_the_encoder_and_every_head(rng):
    ids, types, mask = _batch(rng)
    bert = _model()
    seq, pooled = bert(ids, types, mask)
    assert seq.shape == (3, 9, 16) and pooled.shape == (3, 16)
    assert np.all(np.abs(pooled.numpy()) <= 1)  # tanh
    pre = _model(BertForPreTraining)(ids, types, mask)
    assert pre.mlm_logits.shape == (3, 9, V) and pre.nsp_logits.shape == (3, 2)
    assert pre.loss is None
    assert BertForSequenceClassification(bert, 5)(ids, types, mask).logits.shape == (3, 5)
    assert BertForTokenClassification(bert, 4)(ids, types, mask).logits.shape == (3, 9, 4)
    qa = BertForQuestionAnswering(bert)(ids, types, mask)
    assert qa.start_logits.shape == qa.end_logits.shape == (3, 9)


def test_defaults_token_types_zero_and_no_mask(rng):
    ids, _, _ = _batch(rng, B=2, T=6)
    ids[ids == PAD] = 7
    bert = _model()
    a = bert(ids)[0].numpy()
    b = bert(ids, np.zeros_like(ids), np.ones_like(ids))[0].numpy()
    np.testing.assert_array_equal(a, b)


def test_initialisation_is_berts():
    bert = _model(vocab_size=400, hidden_size=64, num_heads=4, intermediate_size=128)
    w = bert.embeddings.word_embeddings.weight.numpy()
    assert np.all(w[PAD] == 0)
    assert abs(w[1:].std() - 0.02) < 0.002
    layer = bert.encoder.layers[0]
    for p in (layer.self_attn.in_proj_weight, layer.linear1.weight, bert.pooler.weight):
        assert abs(p.numpy().std() - 0.02) < 0.003 and abs(p.numpy().mean()) < 0.002
    for p in (layer.self_attn.in_proj_bias, layer.linear1.bias, layer.norm1.bias):
        assert np.all(p.numpy() == 0)
    assert np.all(layer.norm2.weight.numpy() == 1)
    assert layer.norm1.eps == 1e-12 and layer.activation is F.gelu
    assert not layer.norm_first and layer.self_attn.batch_first


def test_layers_start_different_and_dropout_acts_only_in_training(rng):
    ids, types, mask = _batch(rng)
    bert = _model(dropout=0.3)
    l0, l1 = bert.encoder.layers[0], bert.encoder.layers[1]
    assert not np.array_equal(l0.linear1.weight.numpy(), l1.linear1.weight.numpy())
    bert.train()
    assert not np.allclose(bert(ids, types, mask)[0].numpy(), bert(ids, types, mask)[0].numpy())
    bert.eval()
    np.testing.assert_array_equal(bert(ids, types, mask)[0].numpy(),
                                  bert(ids, types, mask)[0].numpy())


# ----- padding -------------------------------------------------------------------------------
def test_padding_is_never_attended(rng):
    ids, types, mask = _batch(rng, B=3, T=9)
    bert = _model(dtype=np.float64)
    seq, pooled = bert(ids, types, mask)
    other = ids.copy()
    pad = mask == 0
    other[pad] = rng.integers(5, V, pad.sum())  # different tokens and types under the mask
    other_types = np.where(pad, 1 - types, types)
    seq2, pooled2 = bert(other, other_types, mask)
    real = mask.astype(bool)
    np.testing.assert_allclose(seq2.numpy()[real], seq.numpy()[real], **TOL64)
    np.testing.assert_allclose(pooled2.numpy(), pooled.numpy(), **TOL64)
    assert not np.allclose(seq2.numpy()[pad], seq.numpy()[pad])  # the check can fail
    for b in range(len(ids)):  # each row alone, unpadded, gives the same numbers
        n = int(mask[b].sum())
        alone, alone_pooled = bert(ids[b:b + 1, :n], types[b:b + 1, :n])
        np.testing.assert_allclose(alone.numpy()[0], seq.numpy()[b, :n], **TOL64)
        np.testing.assert_allclose(alone_pooled.numpy()[0], pooled.numpy()[b], **TOL64)


def test_padding_gets_no_gradient_through_the_real_positions(rng):
    ids, types, mask = _batch(rng, B=2, T=9)
    bert = _model(dtype=np.float64)
    seq, pooled = bert(ids, types, mask)
    real = mask.astype(bool)
    (seq[np.nonzero(real)].sum() + pooled.sum()).backward()
    pad_rows = ids[mask == 0]
    grad = bert.embeddings.word_embeddings.weight.grad
    assert np.all(grad[PAD] == 0)
    used_only_as_pad = set(pad_rows.tolist()) - set(ids[real].tolist())
    for token in used_only_as_pad:
        assert np.all(grad[token] == 0)


# ----- pretraining losses and weight tying ---------------------------------------------------
def _labels(rng, ids):
    masked, labels = mask_tokens(ids, MASK, V, SPECIALS, p=0.4, rng=rng)
    labels[0, 1] = ids[0, 1]  # at least one target
    nsp = rng.integers(0, 2, len(ids))
    return masked, labels, nsp


def test_mlm_loss_ignores_minus_100(rng):
    ids, types, mask = _batch(rng)
    model = _model(BertForPreTraining, dtype=np.float64)
    masked, labels, nsp = _labels(rng, ids)
    out = model(masked, types, mask, mlm_labels=labels)
    logits = out.mlm_logits.numpy().reshape(-1, V)
    flat = labels.reshape(-1)
    keep = flat != IGNORE_INDEX
    logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    expected = -logp[keep, flat[keep]].mean()
    np.testing.assert_allclose(out.loss.item(), expected, rtol=1e-10)
    nsp_logits = out.nsp_logits.numpy()
    nsp_logp = nsp_logits - np.log(np.exp(nsp_logits).sum(axis=1, keepdims=True))
    both = model(masked, types, mask, mlm_labels=labels, next_sentence_labels=nsp)
    np.testing.assert_allclose(both.loss.item(),
                               expected - nsp_logp[np.arange(len(nsp)), nsp].mean(), rtol=1e-10)
    # the ignored positions' logits get no gradient
    logits_t = nk.tensor(out.mlm_logits.numpy().reshape(-1, V), requires_grad=True)
    F.cross_entropy(logits_t, flat, ignore_index=IGNORE_INDEX).backward()
    assert np.all(logits_t.grad[~keep] == 0) and np.any(logits_t.grad[keep] != 0)


def test_a_batch_without_targets_has_zero_finite_loss(rng):
    ids, types, mask = _batch(rng)
    model = _model(BertForPreTraining)
    out = model(ids, types, mask, mlm_labels=np.full(ids.shape, IGNORE_INDEX))
    assert out.loss.item() == 0.0
    out.loss.backward()
    assert all(np.all(np.isfinite(p.grad)) for p in model.parameters() if p.grad is not None)


def test_masked_only_gives_the_same_loss_logits_and_gradients(rng):
    ids, types, mask = _batch(rng)
    model = _model(BertForPreTraining, dtype=np.float64)
    _perturb_all(model)
    masked, labels, nsp = _labels(rng, ids)
    full = model(masked, types, mask, mlm_labels=labels, next_sentence_labels=nsp)
    full.loss.backward()
    grads = {n: p.grad.copy() for n, p in model.named_parameters()}
    model.zero_grad()
    only = model(masked, types, mask, mlm_labels=labels, next_sentence_labels=nsp,
                 masked_only=True)
    keep = labels != IGNORE_INDEX
    assert only.mlm_logits.shape == (int(keep.sum()), V)
    np.testing.assert_allclose(only.mlm_logits.numpy(), full.mlm_logits.numpy()[keep], **TOL64)
    np.testing.assert_allclose(only.loss.item(), full.loss.item(), rtol=1e-12)
    only.loss.backward()
    for name, p in model.named_parameters():
        np.testing.assert_allclose(p.grad, grads[name], err_msg=name, **TOL64)
    none = model(masked, types, mask, mlm_labels=np.full(ids.shape, IGNORE_INDEX),
                 masked_only=True)
    assert none.mlm_logits.shape == (0, V) and none.loss.item() == 0.0
    with pytest.raises(ValueError, match="masked_only=True needs mlm_labels"):
        model(masked, masked_only=True)


def test_decoder_is_the_word_embedding_and_stays_tied_through_adamw(rng):
    ids, types, mask = _batch(rng)
    model = _model(BertForPreTraining)
    emb = model.bert.embeddings.word_embeddings.weight
    assert model.decoder_weight is emb
    params = list(model.parameters())
    assert sum(p is emb for p in params) == 1 and len({id(p) for p in params}) == len(params)
    assert [k for k in model.state_dict() if k.endswith(".weight") and
            model.state_dict()[k].shape == (V, 16)] == ["bert.embeddings.word_embeddings.weight"]
    opt = nk.optim.AdamW(model.parameters(), lr=1e-2)
    masked, labels, nsp = _labels(rng, ids)
    before = emb.numpy().copy()
    for _ in range(2):
        out = model(masked, types, mask, mlm_labels=labels, next_sentence_labels=nsp)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
    assert model.decoder_weight is model.bert.embeddings.word_embeddings.weight is emb
    assert not np.allclose(emb.numpy(), before)
    model.eval()  # the logits use the updated embedding as the decoder
    seq, _ = model.bert(masked, types, mask)
    h = model.mlm_norm(F.gelu(model.mlm_dense(seq))).numpy()
    np.testing.assert_allclose(model(masked, types, mask).mlm_logits.numpy(),
                               h @ emb.numpy().T + model.mlm_bias.numpy(), rtol=1e-5, atol=1e-6)


def test_tied_gradient_is_the_sum_of_both_uses(rng):
    ids, types, mask = _batch(rng, B=2, T=7)
    model = _model(BertForPreTraining, dtype=np.float64)
    masked, labels, nsp = _labels(rng, ids)
    model(masked, types, mask, mlm_labels=labels).loss.backward()
    total = model.decoder_weight.grad.copy()
    # decoder part alone: the loss as a function of a detached copy used only as the decoder
    model.zero_grad()
    seq, _ = model.bert(masked, types, mask)
    h = model.mlm_norm(F.gelu(model.mlm_dense(seq))).detach()
    dec = nk.tensor(model.decoder_weight.numpy().copy(), requires_grad=True)
    logits = F.linear(h, dec, model.mlm_bias)
    F.cross_entropy(logits.reshape(-1, V), labels.reshape(-1)).backward()
    lookup = total - dec.grad
    assert np.any(dec.grad != 0) and np.any(lookup != 0)
    used = np.zeros(V, dtype=bool)
    used[np.unique(masked)] = True
    used[PAD] = False  # padding_idx: no gradient from the lookup
    assert np.all(lookup[~used] == 0)


# ----- mask_tokens ---------------------------------------------------------------------------
def _binomial_bounds(n, p, z=5.0):
    sd = math.sqrt(n * p * (1 - p))
    return n * p - z * sd, n * p + z * sd


def test_mask_tokens_proportions_are_binomial_and_specials_never_chosen():
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 50, (400, 256))  # about 10% specials (ids 0..4)
    masked, labels = mask_tokens(ids, MASK, 50, SPECIALS, p=0.15, rng=rng)
    special = np.isin(ids, SPECIALS)
    chosen = labels != IGNORE_INDEX
    assert not np.any(chosen & special)
    np.testing.assert_array_equal(masked[special], ids[special])
    np.testing.assert_array_equal(masked[~chosen], ids[~chosen])
    np.testing.assert_array_equal(labels[chosen], ids[chosen])
    n = int((~special).sum())
    lo, hi = _binomial_bounds(n, 0.15)
    k = int(chosen.sum())
    assert lo <= k <= hi, (k, lo, hi)
    to_mask = chosen & (masked == MASK)
    kept = chosen & (masked == ids)
    replaced = chosen & ~to_mask & ~kept
    K = 50 - len(SPECIALS)  # a random token equals the original with probability 1/K
    for count, prob in ((to_mask.sum(), 0.8), (replaced.sum(), 0.1 * (1 - 1 / K)),
                        (kept.sum(), 0.1 + 0.1 / K)):
        lo, hi = _binomial_bounds(k, prob)
        assert lo <= count <= hi, (count, prob * k)
    assert not np.any(np.isin(masked[replaced], SPECIALS))
    counts = np.bincount(masked[replaced], minlength=50)[5:]  # about uniform over the ordinary
    lo, hi = _binomial_bounds(replaced.sum(), 1 / K)
    assert counts.min() >= lo and counts.max() <= hi


def test_mask_tokens_edges_and_seeding():
    ids = np.array([[CLS, 7, 8, 9, SEP, PAD]])
    masked, labels = mask_tokens(ids, MASK, V, SPECIALS, p=0.0, rng=0)
    np.testing.assert_array_equal(masked, ids)
    assert np.all(labels == IGNORE_INDEX)
    _, labels = mask_tokens(ids, MASK, V, SPECIALS, p=1.0, rng=0)
    np.testing.assert_array_equal(labels, [[-100, 7, 8, 9, -100, -100]])
    a = mask_tokens(ids, MASK, V, SPECIALS, rng=np.random.default_rng(5))
    b = mask_tokens(ids, MASK, V, SPECIALS, rng=np.random.default_rng(5))
    np.testing.assert_array_equal(a[0], b[0])
    assert a[0].dtype == a[1].dtype == np.int64 and a[0].shape == ids.shape
    one_d = mask_tokens(ids[0], MASK, V, SPECIALS, p=1.0, rng=0)
    assert one_d[0].shape == (6,)


def test_mask_tokens_bad_input():
    ids = np.array([[2, 7, 3]])
    with pytest.raises(ValueError, match=r"outside the vocabulary \[0, 5\)"):
        mask_tokens(ids, 4, 5, (0, 2, 3, 4))
    with pytest.raises(ValueError, match="special_ids"):
        mask_tokens(ids, 4, V, (0, 99))
    with pytest.raises(ValueError, match="whole vocabulary"):
        mask_tokens(np.array([[0, 1]]), 1, 2, (0, 1))
    with pytest.raises(ValueError, match="p"):
        mask_tokens(ids, 4, V, SPECIALS, p=1.5)
    with pytest.raises(ValueError, match="mask_id"):
        mask_tokens(ids, V, V, SPECIALS)
    with pytest.raises(TypeError, match="integer"):
        mask_tokens(ids.astype(float), 4, V, SPECIALS)


# ----- best_span -----------------------------------------------------------------------------
def _best_span_loop(s, e, max_len, ctx):
    best, arg = -np.inf, None
    for i in range(len(s)):
        for j in range(i, min(i + max_len, len(s))):
            if ctx[i] and ctx[j] and s[i] + e[j] > best:
                best, arg = s[i] + e[j], (i, j)
    return arg, best


@settings(max_examples=40)
@given(seed=st.integers(0, 2**31), B=st.integers(1, 4), T=st.integers(1, 12),
       max_len=st.integers(1, 6))
def test_best_span_is_the_best_valid_span(seed, B, T, max_len):
    rng = np.random.default_rng(seed)
    s, e = rng.standard_normal((B, T)), rng.standard_normal((B, T))
    ctx = rng.random((B, T)) < 0.6
    ctx[:, rng.integers(0, T)] = True
    start, end = best_span(nk.tensor(s), e, max_len, ctx)
    for b in range(B):
        assert start[b] <= end[b] < start[b] + max_len
        assert ctx[b, start[b]] and ctx[b, end[b]]
        _, best = _best_span_loop(s[b], e[b], max_len, ctx[b])
        assert s[b, start[b]] + e[b, end[b]] == best
    start_all, end_all = best_span(s, e, max_len)  # no context mask: any position
    for b in range(B):
        (i, j), _ = _best_span_loop(s[b], e[b], max_len, np.ones(T, bool))
        assert (start_all[b], end_all[b]) == (i, j)


def test_best_span_bad_input():
    s = np.zeros((2, 4))
    with pytest.raises(ValueError, match="row 1 has no valid span"):
        best_span(s, s, 3, np.array([[1, 0, 0, 0], [0, 0, 0, 0]], dtype=bool))
    with pytest.raises(ValueError, match="same shape"):
        best_span(s, np.zeros((2, 5)))
    with pytest.raises(ValueError, match="max_answer_len"):
        best_span(s, s, 0)
    with pytest.raises(ValueError, match="context_mask has shape"):
        best_span(s, s, 2, np.ones((2, 3), bool))


# ----- fine-tuning heads ---------------------------------------------------------------------
def test_head_losses_match_cross_entropy(rng):
    ids, types, mask = _batch(rng)
    bert = _model(dtype=np.float64)
    seq_head = BertForSequenceClassification(bert, 3)
    y = np.array([0, 2, 1])
    out = seq_head(ids, types, mask, labels=y)
    np.testing.assert_allclose(out.loss.item(), F.cross_entropy(out.logits, y).item())
    tok = BertForTokenClassification(bert, 4)
    tags = np.where(mask == 1, rng.integers(0, 4, ids.shape), IGNORE_INDEX)
    out = tok(ids, types, mask, labels=tags)
    np.testing.assert_allclose(out.loss.item(), F.cross_entropy(
        out.logits.reshape(-1, 4), tags.reshape(-1)).item())
    qa = BertForQuestionAnswering(bert)
    st_, en = np.array([1, 2, 3]), np.array([2, 2, 4])
    out = qa(ids, types, mask, start_positions=st_, end_positions=en)
    expected = 0.5 * (F.cross_entropy(out.start_logits, st_).item()
                      + F.cross_entropy(out.end_logits, en).item())
    np.testing.assert_allclose(out.loss.item(), expected)
    start, end = qa.best_span(out.start_logits, out.end_logits, 3, types == 1)
    assert np.all(types[np.arange(3), start] == 1) and np.all(start <= end)


def test_heads_share_the_given_encoder(rng):
    bert = _model()
    head = BertForSequenceClassification(bert, 2)
    assert head.bert is bert
    own = BertForSequenceClassification(copy.deepcopy(bert), 2)
    own.bert.pooler.weight.data[...] = 0
    assert np.any(bert.pooler.weight.numpy() != 0)


# ----- bad input -----------------------------------------------------------------------------
def test_bad_input_names_the_argument(rng):
    bert = _model()
    ids = np.array([[CLS, 5, SEP]])
    with pytest.raises(ValueError, match=r"T=11 .*max_position=10"):
        bert(rng.integers(5, V, (1, 11)))
    with pytest.raises(ValueError, match=r"input_ids holds ids in \[2, 23\].*\[0, 23\)"):
        bert(np.array([[CLS, V]]))
    with pytest.raises(ValueError, match=r"input_ids holds ids in \[-1"):
        bert(np.array([[-1, 5]]))
    with pytest.raises(TypeError, match="input_ids must hold integer"):
        bert(ids.astype(np.float32))
    with pytest.raises(ValueError, match="input_ids must be 2-dimensional"):
        bert(ids[0])
    with pytest.raises(ValueError, match=r"token_type_ids holds ids .*\[0, 2\)"):
        bert(ids, np.array([[0, 1, 2]]))
    with pytest.raises(ValueError, match="token_type_ids has shape"):
        bert(ids, np.array([[0, 1]]))
    with pytest.raises(ValueError, match="attention_mask has shape"):
        bert(ids, attention_mask=np.ones((1, 4)))
    with pytest.raises(ValueError, match="attention_mask must hold 1"):
        bert(ids, attention_mask=np.array([[1, 2, 1]]))
    with pytest.raises(ValueError, match="attention_mask row 0 is all 0"):
        bert(ids, attention_mask=np.zeros((1, 3), int))
    with pytest.raises(ValueError, match="hidden_size=10 is not divisible by num_heads=4"):
        Bert(V, 10, 1, 4, 8, 8)
    with pytest.raises(ValueError, match="pad_token_id"):
        Bert(V, 8, 1, 2, 8, 8, pad_token_id=V)
    with pytest.raises(TypeError, match="bert must be an nnkit.models.Bert"):
        BertForSequenceClassification(object(), 2)
    pre = _model(BertForPreTraining)
    with pytest.raises(ValueError, match=r"mlm_labels holds 23, outside \[0, 23\)"):
        pre(ids, mlm_labels=np.array([[-100, V, -100]]))
    with pytest.raises(ValueError, match="next_sentence_labels has shape"):
        pre(ids, next_sentence_labels=np.array([0, 1]))
    qa = BertForQuestionAnswering(bert)
    with pytest.raises(ValueError, match="both start_positions and end_positions"):
        qa(ids, start_positions=np.array([0]))
    with pytest.raises(ValueError, match=r"end_positions holds 3, outside \[0, 3\)"):
        qa(ids, start_positions=np.array([0]), end_positions=np.array([3]))


# ----- gradchecks (float64) ------------------------------------------------------------------
TINY = dict(vocab_size=9, hidden_size=4, num_layers=1, num_heads=2, intermediate_size=6,
            max_position=6)


def _tiny_inputs():
    ids = np.array([[CLS, 5, SEP, 6, SEP], [CLS, 7, 8, SEP, PAD]])
    types = np.array([[0, 0, 0, 1, 1], [0, 0, 0, 0, 0]])
    return ids, types, (ids != PAD).astype(int)


def _perturb_all(model, seed=0):
    """Move every parameter off its initial value (biases start at 0, LayerNorm at 1)."""
    rng = np.random.default_rng(seed)
    for p in model.parameters():
        p.data[...] += 0.3 * rng.standard_normal(p.shape)


def test_gradcheck_tiny_bert_every_parameter():
    nk.manual_seed(0)
    bert = Bert(**TINY, dropout=0.0, dtype=np.float64)
    _perturb_all(bert)
    ids, types, mask = _tiny_inputs()
    params = list(bert.parameters())
    real = np.nonzero(mask)  # the [PAD] row gets no gradient by design (padding_idx, as torch)

    def outputs(*_):
        seq, pooled = bert(ids, types, mask)
        return seq[real], pooled

    assert gradcheck(outputs, params, atol=1e-6, rtol=1e-4)


def test_gradcheck_tiny_pretraining_loss_with_tied_decoder():
    nk.manual_seed(1)
    model = BertForPreTraining(**TINY, dropout=0.0, dtype=np.float64)
    _perturb_all(model, seed=1)
    ids, types, mask = _tiny_inputs()
    labels = np.array([[-100, 5, -100, 6, -100], [-100, -100, 8, -100, -100]])
    nsp = np.array([1, 0])
    params = list(model.parameters())

    def loss(*_):
        return model(ids, types, mask, mlm_labels=labels, next_sentence_labels=nsp).loss

    assert gradcheck(loss, params, atol=1e-6, rtol=1e-4)


# ----- torch models built from torch.nn layers -----------------------------------------------
def _torch_bert_class(torch):
    nn = torch.nn

    class TorchEmbeddings(nn.Module):
        def __init__(self, V, H, P, types, eps, pad):
            super().__init__()
            self.word_embeddings = nn.Embedding(V, H, padding_idx=pad)
            self.position_embeddings = nn.Embedding(P, H)
            self.token_type_embeddings = nn.Embedding(types, H)
            self.norm = nn.LayerNorm(H, eps=eps)
            self.dropout = nn.Dropout(0.0)

        def forward(self, ids, types):
            pos = torch.arange(ids.shape[1])
            x = (self.word_embeddings(ids) + self.position_embeddings(pos)
                 + self.token_type_embeddings(types))
            return self.dropout(self.norm(x))

    class TorchBert(nn.Module):
        def __init__(self, vocab_size, hidden_size, num_layers, num_heads, intermediate_size,
                     max_position, eps=1e-12):
            super().__init__()
            self.embeddings = TorchEmbeddings(vocab_size, hidden_size, max_position, 2, eps,
                                              PAD)
            layer = nn.TransformerEncoderLayer(hidden_size, num_heads, intermediate_size, 0.0,
                                               activation="gelu", layer_norm_eps=eps,
                                               batch_first=True, norm_first=False)
            self.encoder = nn.TransformerEncoder(layer, num_layers, enable_nested_tensor=False)
            self.pooler = nn.Linear(hidden_size, hidden_size)

        def forward(self, ids, types, mask):
            x = self.encoder(self.embeddings(ids, types), src_key_padding_mask=mask == 0)
            return x, torch.tanh(self.pooler(x[:, 0]))

    class TorchPreTraining(nn.Module):
        def __init__(self, **cfg):
            super().__init__()
            H, V = cfg["hidden_size"], cfg["vocab_size"]
            self.mlm_bias = nn.Parameter(torch.zeros(V))
            self.bert = TorchBert(**cfg)
            self.mlm_dense = nn.Linear(H, H)
            self.mlm_norm = nn.LayerNorm(H, eps=1e-12)
            self.nsp = nn.Linear(H, 2)

        def forward(self, ids, types, mask, labels, nsp_labels):
            seq, pooled = self.bert(ids, types, mask)
            h = self.mlm_norm(nn.functional.gelu(self.mlm_dense(seq)))
            logits = h @ self.bert.embeddings.word_embeddings.weight.T + self.mlm_bias
            nsp = self.nsp(pooled)
            loss = (nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                labels.reshape(-1), ignore_index=-100)
                    + nn.functional.cross_entropy(nsp, nsp_labels))
            return logits, nsp, loss

    return TorchBert, TorchPreTraining


def _copy_to_torch(torch, model, torch_model):
    state = {k: torch.tensor(np.array(v)) for k, v in model.state_dict().items()}
    torch_model.load_state_dict(state)
    assert list(torch_model.state_dict()) == list(model.state_dict())


def _assert_grads(model, torch_model, tol):
    torch_params = dict(torch_model.named_parameters())
    assert [n for n, _ in model.named_parameters()] == list(torch_params)
    for name, p in model.named_parameters():
        np.testing.assert_allclose(p.grad, torch_params[name].grad.numpy(), err_msg=name, **tol)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_bert_equals_torch_layers_after_state_dict_copy(rng, dtype):
    torch = import_torch()
    TorchBert, _ = _torch_bert_class(torch)
    model = _model(dtype=dtype)
    _perturb_all(model)
    torch_model = TorchBert(**CFG).to(torch.float64 if dtype == np.float64 else torch.float32)
    _copy_to_torch(torch, model, torch_model)
    ids, types, mask = _batch(rng)
    seq, pooled = model(ids, types, mask)
    t_seq, t_pooled = torch_model(*(torch.tensor(a) for a in (ids, types, mask)))
    tol = TOL64 if dtype == np.float64 else {"rtol": 2e-4, "atol": 2e-5}
    real = mask.astype(bool)
    np.testing.assert_allclose(seq.numpy()[real], t_seq.detach().numpy()[real], **tol)
    np.testing.assert_allclose(pooled.numpy(), t_pooled.detach().numpy(), **tol)
    g_seq = rng.standard_normal(seq.shape).astype(dtype) * real[..., None]
    g_pooled = rng.standard_normal(pooled.shape).astype(dtype)
    ((seq * g_seq).sum() + (pooled * g_pooled).sum()).backward()
    ((t_seq * torch.tensor(g_seq)).sum() + (t_pooled * torch.tensor(g_pooled)).sum()).backward()
    _assert_grads(model, torch_model, tol)


def test_pretraining_equals_torch_with_the_tied_decoder(rng):
    torch = import_torch()
    _, TorchPreTraining = _torch_bert_class(torch)
    model = _model(BertForPreTraining, dtype=np.float64)
    _perturb_all(model)
    torch_model = TorchPreTraining(**CFG).double()
    _copy_to_torch(torch, model, torch_model)
    ids, types, mask = _batch(rng)
    masked, labels, nsp = _labels(rng, ids)
    out = model(masked, types, mask, mlm_labels=labels, next_sentence_labels=nsp)
    t_logits, t_nsp, t_loss = torch_model(*(torch.tensor(a) for a in
                                            (masked, types, mask, labels, nsp)))
    real = mask.astype(bool)
    np.testing.assert_allclose(out.mlm_logits.numpy()[real], t_logits.detach().numpy()[real],
                               **TOL64)
    np.testing.assert_allclose(out.nsp_logits.numpy(), t_nsp.detach().numpy(), **TOL64)
    np.testing.assert_allclose(out.loss.item(), t_loss.item(), rtol=1e-10)
    out.loss.backward()
    t_loss.backward()
    _assert_grads(model, torch_model, TOL64)


# ----- a few pretraining steps learn (a stand-in corpus) -------------------------------------
def test_pretraining_on_a_tiny_corpus_lowers_the_loss():
    rng = np.random.default_rng(0)
    # sentences that repeat a fixed pattern: token t is always followed by t + 1
    starts = rng.integers(5, 15, 64)
    ids = np.full((64, 8), PAD)
    ids[:, 0], ids[:, 7] = CLS, SEP
    ids[:, 1:7] = starts[:, None] + np.arange(6)
    model = _model(BertForPreTraining, num_layers=1)
    opt = nk.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    losses = []
    for step in range(60):
        masked, labels = mask_tokens(ids, MASK, V, SPECIALS, p=0.3, rng=step)
        out = model(masked, mlm_labels=labels)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
        losses.append(out.loss.item())
    assert np.mean(losses[-5:]) < 0.6 * np.mean(losses[:5])


# ----- the tour section (quick) --------------------------------------------------------------
def test_tour_section_quick_rows(tmp_path):
    from nnkit.tour import TourContext
    from nnkit.tour.bert import bert_section

    rows = bert_section(TourContext(tmp_path, quick=True, plots=False))
    assert {"section", "result", "value", "target", "ok"} <= set(rows[0])
    assert all(r["section"] == "BERT" for r in rows)
    tied = [r for r in rows if r["result"].startswith("MLM decoder")]
    assert tied and tied[0]["value"] == "True" and tied[0]["ok"] is True
    # quick: the one check is the tied decoder; the accuracies of a 1-epoch model only inform
    assert all(r["ok"] == "info" for r in rows if r is not tied[0]), rows
    assert sum("fine-tuned" in r["result"] for r in rows) == 3


def test_unigram_accuracy_and_head_accuracy_on_known_cases():
    from nnkit.datasets.text import TextSplit
    from nnkit.training import head_accuracy, unigram_accuracy

    ids = np.array([[CLS, 7, 7, 8, SEP], [CLS, 7, 9, SEP, PAD]])
    split = TextSplit(ids, np.zeros_like(ids), (ids != PAD).astype(int), np.array([0, 1]), ())
    assert unigram_accuracy(split, split, SPECIALS) == 3 / 5

    class Fixed:  # a head that always answers class 1, or the span (1, 2)
        def eval(self):
            return self

        def __call__(self, ids, types, mask):
            from nnkit.models.bert import ClassifierOutput, QuestionAnsweringOutput

            if self.kind == "span":
                start = np.where(np.arange(ids.shape[1]) == 1, 5.0, 0.0)[None].repeat(2, 0)
                end = np.where(np.arange(ids.shape[1]) == 2, 5.0, 0.0)[None].repeat(2, 0)
                return QuestionAnsweringOutput(nk.tensor(start), nk.tensor(end))
            return ClassifierOutput(nk.tensor(np.array([[0.0, 1.0], [0.0, 1.0]])))

    head = Fixed()
    head.kind = "sequence"
    assert head_accuracy(head, "sequence", split, SEP) == 0.5
    head.kind = "span"
    span_split = TextSplit(ids, np.ones_like(ids), (ids != PAD).astype(int),
                           np.array([[1, 2], [1, 1]]), ())
    assert head_accuracy(head, "span", span_split, SEP) == 0.5
