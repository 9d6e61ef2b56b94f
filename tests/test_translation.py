"""Translation: the number-words task, Seq2Seq (Bahdanau attention), TransformerTranslator,
and greedy / beam-search decoding over a key/value cache."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from helpers import import_torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import nnkit as nk
import nnkit.functional as F
from nnkit.datasets.translation import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    Vocabulary,
    exact_match,
    number_to_words,
    number_translation,
    strip_specials,
)
from nnkit.models import (
    Seq2Seq,
    TransformerTranslator,
    beam_search,
    greedy_decode,
    length_penalty,
    sequence_log_prob,
)
from nnkit.models.seq2seq import Seq2SeqCache

# ----- the dataset ---------------------------------------------------------------------------
_UNITS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen".split())}
_TENS = {w: 10 * (i + 2) for i, w in enumerate(
    "twenty thirty forty fifty sixty seventy eighty ninety".split())}


def _words_to_number(words):
    """The inverse of number_to_words, written independently: a running total per group."""
    total, group = 0, 0
    for w in words:
        if w in _UNITS:
            group += _UNITS[w]
        elif w in _TENS:
            group += _TENS[w]
        elif w == "hundred":
            group *= 100
        elif w == "thousand":
            total, group = (total + group) * 1000, 0
    return total + group


@pytest.mark.parametrize("n, words", [
    (0, "zero"), (7, "seven"), (13, "thirteen"), (20, "twenty"), (21, "twenty one"),
    (100, "one hundred"), (105, "one hundred five"), (110, "one hundred ten"),
    (1000, "one thousand"), (1001, "one thousand one"), (20_000, "twenty thousand"),
    (305_042, "three hundred five thousand forty two"),
    (999_999, "nine hundred ninety nine thousand nine hundred ninety nine"),
])
def test_number_to_words_known_cases(n, words):
    assert " ".join(number_to_words(n)) == words


@settings(max_examples=200)
@given(st.integers(0, 999_999))
def test_number_to_words_round_trips_through_an_independent_parser(n):
    words = number_to_words(n)
    assert _words_to_number(words) == n
    assert len(words) <= 9


def test_task_is_determined_by_its_seed():
    a = number_translation(300, 100, random_state=3)
    b = number_translation(300, 100, random_state=3)
    c = number_translation(300, 100, random_state=4)
    for name in ("src_train", "tgt_train", "src_test", "tgt_test", "values_train"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    assert not np.array_equal(a.values_train, c.values_train)


def test_splits_do_not_overlap_and_pairs_are_correct():
    task = number_translation(2000, 500, random_state=0)
    train = {tuple(strip_specials(r)) for r in task.src_train}
    test = {tuple(strip_specials(r)) for r in task.src_test}
    assert len(train) == 2000 and len(test) == 500 and not train & test
    for src, tgt, value in zip(task.src_test, task.tgt_test, task.values_test, strict=True):
        assert task.src_vocab.decode(src) == number_to_words(int(value))
        assert "".join(task.tgt_vocab.decode(tgt)) == str(value)
        assert tgt[0] == BOS_ID and EOS_ID in tgt
    digit_counts = np.bincount([len(str(v)) for v in task.values_train], minlength=7)[1:]
    assert digit_counts.min() > 0 and digit_counts[2:].min() > 300  # short numbers present
    assert task.src_train.dtype == np.int64 and task.src_train.shape[1] <= 9


def test_dataset_rejects_bad_sizes():
    with pytest.raises(ValueError, match="n_train"):
        number_translation(0, 10)
    with pytest.raises(TypeError, match="n_test"):
        number_translation(10, 2.5)
    with pytest.raises(ValueError, match="do not fit"):
        number_translation(60, 60, max_value=99)
    with pytest.raises(ValueError, match="max_value"):
        number_translation(2, 2, max_value=5)
    with pytest.raises(ValueError, match="n"):
        number_to_words(1_000_000)
    with pytest.raises(ValueError, match="n"):
        number_to_words(-1)


def test_vocabulary_encode_decode_and_errors():
    v = Vocabulary(["x", "y"])
    assert v.encode(["y", "x"]).tolist() == [4, 3]
    assert v.decode([BOS_ID, 3, PAD_ID, 4, EOS_ID, 3]) == ["x", "y"]
    with pytest.raises(ValueError, match="'z'"):
        v.encode(["z"])
    with pytest.raises(ValueError, match="distinct"):
        Vocabulary(["x", "x"])
    with pytest.raises(ValueError, match="<eos>"):
        Vocabulary(["<eos>"])


def test_exact_match_compares_up_to_eos():
    ref = np.array([[BOS_ID, 5, 6, EOS_ID, PAD_ID], [BOS_ID, 7, EOS_ID, PAD_ID, PAD_ID]])
    pred = np.array([[5, 6, EOS_ID, 9], [7, 7, EOS_ID, PAD_ID]])
    assert exact_match(pred, ref) == 0.5
    with pytest.raises(ValueError, match="rows"):
        exact_match(pred[:1], ref)


# ----- a constructed model for the decoding algorithms ------------------------------------
class MarkovDecoder:
    """p(y_i | y_{i-1}) from a fixed table: the decoding protocol with a trivial cache.

    Ids: 0 pad, 1 bos, 2 eos, then ordinary tokens. The cache is each row's last token.
    """

    pad_id, bos_id, eos_id = PAD_ID, BOS_ID, EOS_ID

    def __init__(self, table):
        table = np.array(table, dtype=np.float64)
        table[[PAD_ID, EOS_ID]] = 1.0 / table.shape[1]  # what a finished row is fed
        with np.errstate(divide="ignore"):
            self.log_table = np.log(table)  # impossible tokens: -inf

    def encode(self, src):
        return np.full(np.asarray(src).shape[0], -1)

    def decode_step(self, tokens, cache):
        return nk.tensor(self.log_table[tokens]), tokens.copy()

    def reorder_cache(self, cache, rows):
        return cache[rows]


def _greedy_trap():
    """Greedy takes 'a' (0.6) then must stop with 0.4: 0.24; 'b' (0.4) then eos (1.0): 0.4."""
    t = np.zeros((5, 5))
    t[BOS_ID, 3], t[BOS_ID, 4] = 0.6, 0.4
    t[3, EOS_ID], t[3, 3], t[3, 4] = 0.4, 0.3, 0.3
    t[4, EOS_ID] = 1.0
    return MarkovDecoder(t)


def test_beam_search_beats_greedy_on_a_constructed_case():
    model, src = _greedy_trap(), np.ones((2, 1), dtype=np.int64)
    greedy, g_score = greedy_decode(model, src, return_scores=True)
    beam, b_score = beam_search(model, src, beam_size=2, return_scores=True)
    np.testing.assert_array_equal(greedy, [[3, EOS_ID]] * 2)
    np.testing.assert_array_equal(beam, [[4, EOS_ID]] * 2)
    np.testing.assert_allclose(g_score, math.log(0.24))
    np.testing.assert_allclose(b_score, math.log(0.4))
    np.testing.assert_allclose(sequence_log_prob(model, src, beam), b_score)
    np.testing.assert_array_equal(beam_search(model, src, beam_size=1), greedy)


def _exhaustive_best(log_table, max_len, alpha):
    """The naive twin of beam search: score every output over tokens {3, 4} (each ended by
    <eos> within max_len, or cut at max_len) and keep the best log p / lp."""
    candidates = [(*body, EOS_ID) for n in range(max_len) for body in
                  itertools.product((3, 4), repeat=n)]
    candidates += list(itertools.product((3, 4), repeat=max_len))
    best, best_rank = None, -np.inf
    for seq in candidates:
        prev = (BOS_ID,) + seq[:-1]
        score = sum(log_table[p, y] for p, y in zip(prev, seq, strict=True))
        rank = score / length_penalty(len(seq), alpha)
        if rank > best_rank:
            best, best_rank = (list(seq), score), rank
    return best


@settings(max_examples=40)
@given(weights=hnp.arrays(np.float64, (3, 3), elements=st.floats(0.05, 1.0)),
       alpha=st.sampled_from([0.0, 0.6, 2.0]))
def test_wide_beam_equals_exhaustive_search(weights, alpha):
    """With beam_size >= every candidate (3 * 2^(max_len-1) = 24), nothing is pruned."""
    t = np.zeros((5, 5))
    for row, w in zip((BOS_ID, 3, 4), weights, strict=True):
        t[row, [EOS_ID, 3, 4]] = w / w.sum()
    model, src = MarkovDecoder(t), np.ones((1, 1), dtype=np.int64)
    ids, score = beam_search(model, src, beam_size=24, alpha=alpha, max_len=4,
                             return_scores=True)
    want_seq, want_score = _exhaustive_best(model.log_table, 4, alpha)
    assert ids[0].tolist() == want_seq
    np.testing.assert_allclose(score[0], want_score, rtol=1e-12)


def test_length_normalisation_changes_the_choice():
    """'a <eos>' has p = 0.5 and 'b c d <eos>' p = 0.45: alpha = 0 ranks by p and picks the
    first; alpha = 2 divides log p by lp = ((5 + |Y|) / 6)^2, 1.36 for 2 tokens and 2.25 for
    4, and picks the second (-0.51 < -0.35)."""
    a, b, c, d = 3, 4, 5, 6
    t = np.zeros((7, 7))
    t[BOS_ID, a], t[BOS_ID, b] = 0.5, 0.5
    t[a, EOS_ID] = t[b, c] = t[c, d] = 1.0
    t[d, EOS_ID], t[d, a] = 0.9, 0.1
    model, src = MarkovDecoder(t), np.ones((1, 1), dtype=np.int64)
    assert beam_search(model, src, beam_size=2, alpha=0.0).tolist() == [[a, EOS_ID]]
    assert beam_search(model, src, beam_size=2, alpha=2.0).tolist() == [[b, c, d, EOS_ID]]
    np.testing.assert_allclose(length_penalty([1, 4], 1.0), [1.0, 1.5])


def test_max_len_cuts_rows_without_eos():
    t = np.zeros((5, 5))
    t[:, 3] = 1.0  # never stops
    model, src = MarkovDecoder(t), np.ones((3, 2), dtype=np.int64)
    np.testing.assert_array_equal(greedy_decode(model, src, max_len=4), np.full((3, 4), 3))
    np.testing.assert_array_equal(beam_search(model, src, beam_size=3, max_len=4),
                                  np.full((3, 4), 3))


def test_decoding_rejects_bad_arguments():
    model, src = _greedy_trap(), np.ones((2, 1), dtype=np.int64)
    with pytest.raises(ValueError, match="beam_size"):
        beam_search(model, src, beam_size=0)
    with pytest.raises(TypeError, match="beam_size"):
        beam_search(model, src, beam_size=2.0)
    with pytest.raises(ValueError, match="alpha"):
        beam_search(model, src, alpha=-0.5)
    with pytest.raises(ValueError, match="max_len"):
        greedy_decode(model, src, max_len=0)
    with pytest.raises(ValueError, match="src"):
        greedy_decode(model, np.ones(3, dtype=np.int64))
    with pytest.raises(ValueError, match="rows"):
        sequence_log_prob(model, src, np.array([[2]]))


# ----- the two models ----------------------------------------------------------------------
SRC = np.array([[5, 6, 7, 8, 9], [9, 4, 3, 0, 0], [4, 0, 0, 0, 0]])  # right-padded, pad 0
TGT = np.array([[1, 3, 4, 5, 2], [1, 6, 3, 2, 0], [1, 7, 2, 0, 0]])  # <bos> ... <eos> pad


def _seq2seq(dtype=np.float64, seed=0, vocab=(10, 8)):
    nk.manual_seed(seed)
    return Seq2Seq(*vocab, embed_dim=6, hidden_size=7, attention_size=5, dtype=dtype).eval()


def _translator(dtype=np.float64, seed=0, vocab=(10, 8), norm_first=False):
    nk.manual_seed(seed)
    return TransformerTranslator(*vocab, d_model=12, nhead=3, num_encoder_layers=2,
                                 num_decoder_layers=2, dim_feedforward=16, dropout=0.1,
                                 norm_first=norm_first, max_len=16, dtype=dtype).eval()


def _prenorm_translator(dtype=np.float64, seed=0, vocab=(10, 8)):
    return _translator(dtype, seed, vocab, norm_first=True)


MODELS = {"seq2seq": _seq2seq, "transformer": _translator,
          "transformer-prenorm": _prenorm_translator}


def _incremental_logits(model, src, tgt_in):
    cache, steps = model.encode(src), []
    for t in range(tgt_in.shape[1]):
        logits, cache = model.decode_step(tgt_in[:, t], cache)
        steps.append(logits.numpy())
    return np.stack(steps, axis=1), cache  # (B, T, V)


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-12), (np.float32, 2e-5)])
def test_cached_decoding_equals_full_recomputation(name, dtype, tol):
    model = MODELS[name](dtype)
    full = model(SRC, TGT[:, :-1]).numpy()  # (B, T, V): all positions at once
    steps, _ = _incremental_logits(model, SRC, TGT[:, :-1])
    assert full.dtype == dtype and full.shape == (3, 4, 8)
    np.testing.assert_allclose(steps, full, rtol=tol, atol=tol)


def test_transformer_step_computes_only_the_new_position(monkeypatch):
    model = _translator()
    cache = model.encode(SRC)
    cross = cache.cross_kv
    for layer in model.decoder.layers:  # the full decoder layer is never run while decoding
        monkeypatch.setattr(layer, "forward", lambda *a, **k: pytest.fail("recomputed"))
    for t in range(3):
        _, cache = model.decode_step(TGT[:, t], cache)
        for k, v in cache.self_kv:
            assert k.shape == v.shape == (3, 3, t + 1, 4)  # (B, N, t, d): one more per step
        assert cache.cross_kv is cross  # the memory's keys and values: computed once
    assert cross[0][0].shape == cross[0][1].shape == (3, 3, 5, 4)  # (B, N, S, d)
    assert cache.position == 3


@pytest.mark.parametrize("name", MODELS)
def test_padding_does_not_change_results(name):
    model = MODELS[name]()
    alone, _ = _incremental_logits(model, SRC[2:, :1], TGT[2:, :3])
    batched, _ = _incremental_logits(model, SRC, TGT[:, :3])
    np.testing.assert_allclose(batched[2:], alone, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", MODELS)
def test_later_target_tokens_do_not_change_earlier_logits(name):
    model = MODELS[name]()
    a = model(SRC, TGT[:, :-1]).numpy()
    changed = TGT[:, :-1].copy()
    changed[:, 2:] = 7
    b = model(SRC, changed).numpy()
    np.testing.assert_allclose(a[:, :2], b[:, :2], rtol=1e-12, atol=1e-12)  # reads y_{<2}
    assert not np.allclose(a[:, 2], b[:, 2])


@pytest.mark.parametrize("name", MODELS)
def test_beam_size_one_is_greedy_and_scores_are_log_probs(name):
    model = MODELS[name](seed=3)
    greedy, g_scores = model.greedy_decode(SRC, max_len=6, return_scores=True)
    beam1, b1_scores = model.beam_search(SRC, beam_size=1, max_len=6, return_scores=True)
    np.testing.assert_array_equal(beam1, greedy)
    np.testing.assert_allclose(b1_scores, g_scores, rtol=1e-9)
    np.testing.assert_allclose(sequence_log_prob(model, SRC, greedy), g_scores, rtol=1e-9)
    beam, scores = model.beam_search(SRC, beam_size=4, max_len=6, return_scores=True)
    np.testing.assert_allclose(sequence_log_prob(model, SRC, beam), scores, rtol=1e-9)
    assert np.all(scores >= g_scores - 1e-9)  # holds here; beam search does not promise it
    assert model.training is False


@pytest.mark.parametrize("name", MODELS)
def test_reorder_cache_gathers_rows(name):
    model = MODELS[name]()
    _, cache = _incremental_logits(model, SRC, TGT[:, :2])
    rows = np.array([2, 0, 0])
    picked = model.reorder_cache(cache, rows)
    logits, _ = model.decode_step(TGT[rows, 2], picked)
    want, _ = model.decode_step(TGT[:, 2], cache)
    np.testing.assert_allclose(logits.numpy(), want.numpy()[rows], rtol=1e-12)


@pytest.mark.parametrize("name", MODELS)
def test_teacher_forced_loss_decreases(name):
    task = number_translation(64, 8, max_value=999, random_state=1)
    model = MODELS[name](np.float32, vocab=(len(task.src_vocab), len(task.tgt_vocab))).train()
    src, tgt = task.src_train[:, :5], task.tgt_train
    params = list(model.parameters())
    opt = nk.optim.Adam(params, lr=1e-2)

    def loss_fn():
        logits = model(src, tgt[:, :-1])  # (B, T, V)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt[:, 1:].reshape(-1),
                               ignore_index=PAD_ID)

    first = loss_fn().item()
    for _ in range(40):
        loss = loss_fn()
        opt.zero_grad()
        loss.backward()
        nk.optim.clip_grad_norm_(params, 1.0)
        opt.step()
    assert loss_fn().item() < 0.6 * first
    assert all(p.grad is not None for p in params)


def test_seq2seq_attention_weights_are_distributions_off_padding():
    model = _seq2seq()
    logits, weights = model(SRC, TGT[:, :-1], return_attention=True)
    w = weights.numpy()
    assert w.shape == (3, 4, 5)
    np.testing.assert_allclose(w.sum(axis=-1), 1.0, rtol=1e-12)
    assert np.all(w[SRC[:, None, :].repeat(4, 1) == PAD_ID] == 0)


def test_bahdanau_attention_gradient_matches_finite_differences(rng):
    model = _seq2seq()
    cache = model.encode(SRC)

    def attend(state, annotations):
        keys = model.attn_key(annotations)
        return model.attend(state, Seq2SeqCache(annotations, keys, cache.mask, state))

    inputs = [nk.tensor(rng.standard_normal((3, 7)), requires_grad=True),
              nk.tensor(rng.standard_normal((3, 5, 14)), requires_grad=True)]
    assert nk.gradcheck(lambda s, a: attend(s, a)[0], inputs)
    assert nk.gradcheck(lambda s, a: attend(s, a)[1], inputs)


def test_section_5_3_bahdanau_score_is_the_notes_formula_by_hand():
    """Notes §5.3: a_ij = softmax_j(MLP(z_{i-1}, zeta_j)), with Bahdanau's MLP
    e_ij = v^T tanh(W z_{i-1} + U zeta_j + b), written out per (i, j) in plain loops from the
    model's parameters and compared with the weights of every decoder step (softmax over the
    sentence's real tokens only); the context c_i = sum_j a_ij zeta_j likewise."""
    model = _seq2seq()
    W = model.attn_query.weight.numpy()  # (A, H)
    U, b = model.attn_key.weight.numpy(), model.attn_key.bias.numpy()  # (A, 2H), (A,)
    v = model.attn_score.weight.numpy()[0]  # (A,)
    cache = model.encode(SRC)
    zeta = cache.annotations.numpy()  # (B, S, 2H)
    for i in range(TGT.shape[1] - 1):
        z_prev = cache.state.numpy()  # (B, H): z_{i-1}
        context, weights = (t.numpy() for t in model.attend(cache.state, cache))
        _, cache = model.decode_step(TGT[:, i], cache)
        np.testing.assert_array_equal(cache.attention.numpy(), weights)  # what the step used
        for row in range(len(SRC)):
            real = [j for j in range(SRC.shape[1]) if SRC[row, j] != PAD_ID]
            e = [sum(v[a] * math.tanh(sum(W[a, h] * z_prev[row, h] for h in range(W.shape[1]))
                                      + sum(U[a, c] * zeta[row, j, c] for c in range(U.shape[1]))
                                      + b[a]) for a in range(len(v))) for j in real]
            top = max(e)
            a = [math.exp(x - top) / sum(math.exp(y - top) for y in e) for x in e]
            np.testing.assert_allclose(weights[row, real], a, rtol=1e-12, atol=1e-14)
            assert (weights[row, len(real):] == 0).all()
            c = sum(a_j * zeta[row, j] for a_j, j in zip(a, real, strict=True))
            np.testing.assert_allclose(context[row], c, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("name", MODELS)
def test_models_reject_bad_input(name):
    model = MODELS[name]()
    with pytest.raises(TypeError, match="src"):
        model(SRC.astype(np.float64), TGT)
    with pytest.raises(ValueError, match=r"vocabulary \[0, 10\)"):
        model(SRC + 5, TGT)
    with pytest.raises(ValueError, match="only padding"):
        model.greedy_decode(np.array([[3, 4], [0, 0]]))
    with pytest.raises(ValueError, match="pad on the right"):
        model.greedy_decode(np.array([[3, 0, 4]]))
    with pytest.raises(ValueError, match="src must be 2-dimensional"):
        model.encode(np.array([3, 4]))
    with pytest.raises(ValueError, match="tgt_in"):
        model(SRC, TGT[:2])
    cache = model.encode(SRC)
    with pytest.raises(ValueError, match="tokens"):
        model.decode_step(np.array([1, 1]), cache)
    with pytest.raises(ValueError, match="tgt_vocab_size|src_vocab_size"):
        type(model)(0, 5)


def test_transformer_rejects_sequences_longer_than_max_len():
    model = _translator()
    with pytest.raises(ValueError, match="max_len=16"):
        model(np.full((1, 17), 3), TGT[:1])


# ----- torch: the translator's composition against torch's layers ------------------------
def test_transformer_translator_matches_torch_after_state_dict_copy():
    torch = import_torch()
    nn = torch.nn
    model = _translator(np.float64, seed=5)
    d = model.d_model

    class TorchTranslator(nn.Module):
        def __init__(self):
            super().__init__()
            kw = dict(dim_feedforward=16, dropout=0.0, batch_first=True, dtype=torch.float64)
            self.src_embed = nn.Embedding(10, d, padding_idx=0, dtype=torch.float64)
            self.tgt_embed = nn.Embedding(8, d, padding_idx=0, dtype=torch.float64)
            self.encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(d, 3, **kw), 2,
                                                 nn.LayerNorm(d, dtype=torch.float64),
                                                 enable_nested_tensor=False)
            self.decoder = nn.TransformerDecoder(nn.TransformerDecoderLayer(d, 3, **kw), 2,
                                                 nn.LayerNorm(d, dtype=torch.float64))
            self.generator = nn.Linear(d, 8, dtype=torch.float64)
            self.register_buffer("positions", torch.zeros(16, d, dtype=torch.float64))

        def forward(self, src, tgt_in):
            pad = src == 0
            T = tgt_in.shape[1]
            x = self.src_embed(src) * math.sqrt(d) + self.positions[: src.shape[1]]
            y = self.tgt_embed(tgt_in) * math.sqrt(d) + self.positions[:T]
            memory = self.encoder(x, src_key_padding_mask=pad)
            causal = nn.Transformer.generate_square_subsequent_mask(T, dtype=torch.float64)
            out = self.decoder(y, memory, tgt_mask=causal, memory_key_padding_mask=pad,
                               tgt_is_causal=True)
            return self.generator(out)

    reference = TorchTranslator().eval()
    reference.load_state_dict({k: torch.from_numpy(np.array(v))
                               for k, v in model.state_dict().items()})
    src, tgt_in = SRC, TGT[:, :-1]
    want = reference(torch.from_numpy(src), torch.from_numpy(tgt_in))
    got = model(src, tgt_in)
    np.testing.assert_allclose(got.numpy(), want.detach().numpy(), rtol=1e-10, atol=1e-10)
    weights = np.random.default_rng(0).standard_normal(got.shape)
    got.backward(weights)
    want.backward(torch.from_numpy(weights))
    torch_grads = dict(reference.named_parameters())
    for name, p in model.named_parameters():
        np.testing.assert_allclose(p.grad, torch_grads[name].grad.numpy(), rtol=1e-8,
                                   atol=1e-10, err_msg=name)
