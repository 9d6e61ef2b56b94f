"""Multi-query associative recall (MQAR, ``nnkit.datasets.associative_recall``): the model
and training loop the tour section and examples/associative_recall.py share."""

from __future__ import annotations

import numpy as np

from .. import functional as F
from .. import optim
from .._random import manual_seed
from ..autograd import no_grad
from ..datasets.sequences import IGNORE_INDEX, associative_recall
from ..nn.attention import MultiheadAttention
from ..nn.deltanet import DeltaNet
from ..nn.layers import Embedding, Linear
from ..nn.mamba import Mamba, RMSNorm
from ..nn.module import Module, ModuleList
from ..nn.transformer import generate_square_subsequent_mask

__all__ = ["Recaller", "CausalAttention", "train_recall"]

N_PAIRS, VOCAB, WIDTH = 8, 64, 64  # the tour's task: 8 pairs over 64 tokens, width 64


class CausalAttention(Module):
    """Causal multi-head self-attention, (batch, T, d) -> same."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.attn = MultiheadAttention(width, heads, batch_first=True)

    def forward(self, x):
        mask = generate_square_subsequent_mask(x.shape[1])
        return self.attn(x, x, x, attn_mask=mask, need_weights=False, is_causal=True)[0]


def _mixer(kind: str, width: int, heads: int) -> Module:
    if kind == "DeltaNet":
        return DeltaNet(hidden_size=width, num_heads=heads)
    if kind == "Mamba":
        return Mamba(width, d_state=16)
    return CausalAttention(width, heads)


class Recaller(Module):
    """Embedding -> ``layers`` x [RMSNorm -> mixer -> residual] -> RMSNorm -> Linear:
    (B, T) ids -> (B, T, vocab) logits. ``kind``: 'DeltaNet', 'Mamba' or 'attention' (which
    also gets learned position embeddings: without them it cannot tell which value followed
    which key)."""

    def __init__(self, kind: str, vocab: int, T: int, width: int = WIDTH, heads: int = 2,
                 layers: int = 2):
        super().__init__()
        self.embed = Embedding(vocab, width)
        self.position = Embedding(T, width) if kind == "attention" else None
        self.norms = ModuleList([RMSNorm(width) for _ in range(layers)])
        self.mixers = ModuleList([_mixer(kind, width, heads) for _ in range(layers)])
        self.norm = RMSNorm(width)
        self.head = Linear(width, vocab)

    def forward(self, tokens):
        x = self.embed(tokens)
        if self.position is not None:
            x = x + self.position(np.arange(tokens.shape[1]))
        for norm, mixer in zip(self.norms, self.mixers, strict=True):
            x = x + mixer(norm(x))
        return self.head(self.norm(x))


def _accuracy(model: Module, tokens: np.ndarray, targets: np.ndarray) -> float:
    with no_grad():
        predicted = model(tokens).numpy().argmax(-1)
    scored = targets != IGNORE_INDEX
    return float((predicted[scored] == targets[scored]).mean())


def train_recall(kind: str, steps: int, n_pairs: int = N_PAIRS, vocab: int = VOCAB,
                 seed: int = 0, batch: int = 32, lr: float = 5e-3,
                 every: int = 25) -> list[tuple[int, float]]:
    """Train a two-block ``kind`` model (``Recaller``) on MQAR with ``n_pairs`` pairs over
    ``vocab`` tokens: Adam at ``lr`` decayed linearly to 0, gradients clipped at norm 1,
    fresh batches; return (step, held-out query accuracy) every ``every`` steps and at the
    end."""
    manual_seed(seed)
    model = Recaller(kind, vocab, 3 * n_pairs)
    opt = optim.Adam(model.parameters(), lr=lr)
    X_test, y_test = associative_recall(256, n_pairs, vocab, random_state=seed + 1)
    rng = np.random.default_rng(seed)
    curve = []
    for step in range(steps):
        if step % every == 0:
            curve.append((step, _accuracy(model, X_test, y_test)))
        opt.param_groups[0]["lr"] = lr * (1 - step / steps)  # linear decay to 0
        X, y = associative_recall(batch, n_pairs, vocab, random_state=rng)
        loss = F.cross_entropy(model(X).reshape(-1, vocab), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        optim.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    curve.append((steps, _accuracy(model, X_test, y_test)))
    return curve
