"""nnkit.datasets.associative_recall: multi-query associative recall sequences."""

import numpy as np
import pytest

import nnkit as nk
from nnkit.datasets.sequences import IGNORE_INDEX, associative_recall


@pytest.mark.parametrize(("n_pairs", "vocab", "n_queries"), [(1, 2, None), (4, 16, 2),
                                                             (8, 17, None), (8, 64, 8)])
def test_shapes_dtypes_and_layout(n_pairs, vocab, n_queries):
    tokens, targets = associative_recall(5, n_pairs, vocab, n_queries=n_queries,
                                         random_state=0)
    q = n_pairs if n_queries is None else n_queries
    T = 2 * n_pairs + q
    assert tokens.shape == targets.shape == (5, T)
    assert tokens.dtype == targets.dtype == np.int64
    assert tokens.min() >= 0 and tokens.max() < vocab
    n_keys = vocab // 2
    keys, values = tokens[:, 0:2 * n_pairs:2], tokens[:, 1:2 * n_pairs:2]
    assert (keys < n_keys).all() and (values >= n_keys).all()
    for row in range(5):  # distinct keys and values, distinct queries among the keys
        assert len(set(keys[row])) == len(set(values[row])) == n_pairs
        assert len(set(tokens[row, 2 * n_pairs:])) == q
        assert set(tokens[row, 2 * n_pairs:]) <= set(keys[row])


def test_each_query_targets_the_value_paired_with_its_key():
    tokens, targets = associative_recall(50, 6, 40, n_queries=4, random_state=3)
    for row, target in zip(tokens, targets, strict=True):
        pairs = dict(zip(row[0:12:2].tolist(), row[1:12:2].tolist(), strict=True))
        assert target[12:].tolist() == [pairs[k] for k in row[12:].tolist()]
        assert (target[:12] == IGNORE_INDEX).all()
    assert IGNORE_INDEX == -100


def test_seeded_determinism_and_variety():
    a = associative_recall(8, 5, 32, random_state=7)
    b = associative_recall(8, 5, 32, random_state=7)
    c = associative_recall(8, 5, 32, random_state=8)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not np.array_equal(a[0], c[0])
    nk.manual_seed(1)
    d = associative_recall(8, 5, 32)
    nk.manual_seed(1)
    assert np.array_equal(d[0], associative_recall(8, 5, 32)[0])
    # the queries come in varied orders, not always the pairs' order
    assert len({tuple(np.argsort(row[10:])) for row in a[0]}) > 1


def test_targets_score_only_queries_in_cross_entropy():
    tokens, targets = associative_recall(3, 4, 16, random_state=0)
    logits = np.zeros((3 * 12, 16), np.float32)
    logits[np.arange(36), np.where(targets.reshape(-1) >= 0, targets.reshape(-1), 0)] = 50.0
    logits[targets.reshape(-1) < 0] = np.random.default_rng(0).standard_normal((24, 16))
    loss = nk.functional.cross_entropy(logits, targets.reshape(-1))
    assert float(loss.item()) < 1e-6


@pytest.mark.parametrize(("kwargs", "error"), [
    (dict(n_samples=0, n_pairs=2, vocab_size=8), ValueError),
    (dict(n_samples=1, n_pairs=5, vocab_size=8), ValueError),  # more pairs than keys
    (dict(n_samples=1, n_pairs=2, vocab_size=8, n_queries=3), ValueError),
    (dict(n_samples=1, n_pairs=2, vocab_size=8, n_queries=0), ValueError),
    (dict(n_samples=1, n_pairs=2.0, vocab_size=8), TypeError),
])
def test_bad_arguments_are_refused(kwargs, error):
    with pytest.raises(error):
        associative_recall(**kwargs)
