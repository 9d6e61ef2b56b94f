"""The ``nnkit tour`` section for translation (notes §5.3 and §6.4).

Both translators learn number words -> digits (``nnkit.datasets.translation``) by teacher
forcing; rows give their exact match on held-out sentences with greedy and beam search, the
training time, the key/value cache against full recomputation, beam size 1 against greedy,
and the cache's decoding speed-up. The plot shows each model's attention alignment on one
held-out sentence; a second one is the sinusoidal positional encoding as a heatmap
(notes §6.3, Figure 6.2), with a row checking its defining property: p_t . p_{t+k} depends
on the offset k only (each pair of columns is a rotation by t omega_i). ``ctx.quick`` trains
on a small split for a few epochs (seconds; the accuracy rows are then information only).
"""

from __future__ import annotations

import time

import numpy as np

from .. import functional as F
from .. import optim
from .._random import manual_seed
from ..autograd import no_grad
from ..datasets.translation import PAD_ID, exact_match, number_translation
from ..functional.attention import sinusoidal_positional_encoding
from ..models import Seq2Seq, TransformerTranslator, beam_search, greedy_decode
from ..training import minibatches
from .common import INFO, tour_row

__all__ = ["translate_section", "train_translator", "attention_alignment", "make_translators"]

SECTION = "translation"


def _row(result, value, target="", ok=INFO):
    return tour_row(SECTION, result, value, target, ok)


def make_translators(task, seed: int = 0) -> dict:
    """The two models of the section, sized for the number task, seeded."""
    V_src, V_tgt = len(task.src_vocab), len(task.tgt_vocab)
    manual_seed(seed)
    seq2seq = Seq2Seq(V_src, V_tgt, embed_dim=32, hidden_size=64)
    manual_seed(seed)
    transformer = TransformerTranslator(V_src, V_tgt, d_model=64, nhead=4,
                                        num_encoder_layers=2, num_decoder_layers=2,
                                        dim_feedforward=128, dropout=0.1, max_len=32)
    return {"Seq2Seq (GRU + Bahdanau attention)": (seq2seq, 3e-3),
            "TransformerTranslator (2 + 2 layers)": (transformer, 2e-3)}


def train_translator(model, src, tgt, epochs: int, lr: float, batch_size: int = 64,
                     seed: int = 0) -> list[float]:
    """Teacher forcing with Adam: predict tgt[:, 1:] from tgt[:, :-1]; returns the mean loss
    per epoch. The learning rate decays linearly to lr / 10; gradients are clipped to norm 1.
    """
    opt = optim.Adam(model.parameters(), lr=lr)
    rng = np.random.default_rng(seed)
    model.train()
    history = []
    for epoch in range(epochs):
        opt.param_groups[0]["lr"] = lr * (1 - 0.9 * epoch / max(epochs - 1, 1))
        losses = []
        for idx in minibatches(len(src), batch_size, rng=rng):
            s, t = _trim(src[idx]), _trim(tgt[idx])
            logits = model(s, t[:, :-1])  # (B, T, V)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), t[:, 1:].reshape(-1),
                                   ignore_index=PAD_ID)
            opt.zero_grad()
            loss.backward()
            optim.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            losses.append(loss.item())
        history.append(float(np.mean(losses)))
    model.eval()
    return history


def _trim(ids):
    """Drop the columns that are padding in every row."""
    width = int((ids != PAD_ID).sum(axis=1).max())
    return ids[:, :width]


def attention_alignment(model, src_row, output_row) -> np.ndarray:
    """Attention weights (T, S) of the decoder over the source while it emits ``output_row``.

    ``src_row`` (S,) and ``output_row`` (T,) (a decoder output, ``<eos>`` included) are 1-D;
    the model's ``decode_step`` must leave its weights in ``cache.attention`` (both models
    here do: Seq2Seq's a_ij, the transformer's last cross-attention layer averaged over heads).
    """
    src = np.asarray(src_row)[None]
    out = np.asarray(output_row)
    tokens = np.concatenate([[model.bos_id], out[:-1]])
    rows = []
    model.eval()
    with no_grad():
        cache = model.encode(src)
        for token in tokens:
            _, cache = model.decode_step(np.array([token]), cache)
            rows.append(cache.attention.numpy()[0])
    return np.stack(rows)


def _cache_rows(transformer, task, quick):
    """Cached decoding against full recomputation: equal logits, and the speed-up."""
    src = task.src_test[:8]
    B, T = len(src), 16 if quick else 32
    tokens = np.random.default_rng(0).integers(3, len(task.tgt_vocab), (B, T))
    tokens[:, 0] = transformer.bos_id
    with no_grad():
        start = time.perf_counter()
        cache, cached = transformer.encode(src), []
        for t in range(T):
            logits, cache = transformer.decode_step(tokens[:, t], cache)
            cached.append(logits.numpy())
        with_cache = time.perf_counter() - start
        start = time.perf_counter()
        full = [transformer(src, tokens[:, : t + 1]).numpy()[:, -1] for t in range(T)]
        recompute = time.perf_counter() - start
    diff = float(np.max(np.abs(np.stack(cached) - np.stack(full))))
    return [
        _row(f"transformer: cached decoding vs recomputing the prefix, {T} steps, max |diff|",
             f"{diff:.1e}", "<= 1e-4", diff <= 1e-4),
        _row(f"transformer: decoding {T} tokens, key/value cache speed-up",
             f"{recompute / with_cache:.1f}x"),
    ]


def _plot(ctx, alignments, task, src_row):
    """One heatmap per model: alignments maps a name to (weights (T, S), output ids (T,))."""
    from .common import pyplot

    plt = pyplot()
    if plt is None:
        return
    words = task.src_vocab.decode(src_row)
    fig, axes = plt.subplots(1, len(alignments), figsize=(5 * len(alignments), 3.6))
    for ax, (name, (weights, output)) in zip(np.atleast_1d(axes), alignments.items(),
                                             strict=True):
        digits = task.tgt_vocab.decode(output) + ["<eos>"]
        ax.imshow(weights[: len(digits), : len(words)], cmap="viridis", vmin=0, vmax=1)
        ax.set_xticks(range(len(words)), words, rotation=60, ha="right")
        ax.set_yticks(range(len(digits)), digits)
        ax.set_title(name.split(" (")[0])
    fig.suptitle("attention alignment (rows: emitted digits, columns: source words)")
    fig.tight_layout()
    fig.savefig(ctx.out_dir / "translation_attention.png", dpi=110)
    plt.close(fig)


def _positional_row(ctx):
    """p_t . p_{t+k} is a function of k alone; the heatmap of P (T = 100, d = 64)."""
    P = sinusoidal_positional_encoding(100, 64, dtype=np.float64).numpy()  # (T, d)
    gram = P @ P.T
    spread = max(float(np.ptp(np.diagonal(gram, offset=k))) for k in range(50))
    if ctx.plots:
        from .common import pyplot

        plt = pyplot()
        if plt is not None:
            fig, ax = plt.subplots(figsize=(6, 3.6))
            image = ax.imshow(P, aspect="auto", cmap="RdBu", vmin=-1, vmax=1)
            ax.set(xlabel="dimension k", ylabel="position t",
                   title="sinusoidal positional encoding p[t, k]")
            fig.colorbar(image, ax=ax)
            fig.tight_layout()
            fig.savefig(ctx.out_dir / "positional_encoding.png", dpi=110)
            plt.close(fig)
    return _row("positional encoding: p_t . p_(t+k) depends on k only (max spread over t)",
                f"{spread:.1e}", "<= 1e-9", spread <= 1e-9)


def translate_section(ctx) -> list[dict]:
    """Rows of the translation section (see the module docstring)."""
    quick = ctx.quick
    task = number_translation(1000 if quick else 3000, 200 if quick else 1000,
                              random_state=ctx.seed)
    epochs = {"Seq2Seq": 3 if quick else 8, "TransformerTranslator": 3 if quick else 12}
    target = "(full run >= 0.95)" if quick else ">= 0.95"
    rows, alignments = [_positional_row(ctx)], {}
    sentence = int(np.argmax((task.src_test != PAD_ID).sum(axis=1)))  # a long one
    for name, (model, lr) in make_translators(task, ctx.seed).items():
        start = time.perf_counter()
        train_translator(model, task.src_train, task.tgt_train,
                         epochs[type(model).__name__], lr, seed=ctx.seed)
        seconds = time.perf_counter() - start
        greedy = greedy_decode(model, task.src_test, max_len=8)
        beam = beam_search(model, task.src_test, beam_size=4, max_len=8)
        em_greedy, em_beam = exact_match(greedy, task.tgt_test), exact_match(beam, task.tgt_test)
        rows += [_row(f"{name}: exact match, greedy", f"{em_greedy:.3f}", target,
                      INFO if quick else em_greedy >= 0.95),
                 _row(f"{name}: exact match, beam search (4)", f"{em_beam:.3f}", target,
                      INFO if quick else em_beam >= 0.95),
                 _row(f"{name}: training time", f"{seconds:.1f} s")]
        same = np.array_equal(beam_search(model, task.src_test[:64], beam_size=1, max_len=8),
                              greedy_decode(model, task.src_test[:64], max_len=8))
        rows.append(_row(f"{name}: beam_size=1 gives the greedy output", str(same), "True",
                         same))
        alignments[name] = (attention_alignment(model, task.src_test[sentence],
                                                greedy[sentence]), greedy[sentence])
        if isinstance(model, TransformerTranslator):
            rows += _cache_rows(model, task, quick)
    if ctx.plots:
        _plot(ctx, alignments, task, task.src_test[sentence])
    return rows
