"""Synthetic long-memory sequence tasks: the adding problem, the copy task and multi-query
associative recall (seeded).

Both are the standard probes of whether a recurrent network can carry information over T
steps (Hochreiter & Schmidhuber 1997; Le et al. 2015; Arjovsky et al. 2016): the answer
depends on inputs far in the past, and the trivial predictor is known, so "solved" has a
number attached. Associative recall probes a different memory: not one value held for long,
but many key-value bindings held at once and retrieved by content (Arora et al. 2023).
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from .._random import get_rng
from .._validation import check_scalar

__all__ = ["adding_problem", "copy_task", "ADDING_BASELINE_MSE", "copy_task_baseline",
           "associative_recall", "IGNORE_INDEX"]

IGNORE_INDEX = -100
"""The target of a position that is not scored (``F.cross_entropy``'s default ignore_index)."""

ADDING_BASELINE_MSE = 1.0 / 6.0
"""MSE of always answering 1 (the mean of the sum of two U(0, 1)): Var = 2/12."""


def _check_dtype(dtype):
    dtype = np.dtype(dtype)
    if dtype.kind != "f":
        raise TypeError(f"dtype must be float32 or float64, got {dtype}")
    return dtype


def adding_problem(n_samples, seq_len, random_state=None, dtype=np.float32):
    """The adding problem: add the two marked numbers of a length-``seq_len`` sequence.

    Each sequence has two channels: values v_t ~ U(0, 1), and markers m_t in {0, 1} with
    exactly two ones, one in the first half [0, T/2) and one in the second [T/2, T). The
    target is y = sum_t m_t v_t. Always answering 1 scores MSE 1/6
    (``ADDING_BASELINE_MSE``); a model that solves the task gets far below it.

    Parameters
    ----------
    n_samples : int >= 1
    seq_len : int >= 2
        T.
    random_state : int, Generator or None
        None uses nnkit's global generator (``nk.manual_seed``).
    dtype : float32 (default) or float64

    Returns
    -------
    X : ndarray (n_samples, T, 2)
        [..., 0] values, [..., 1] markers (batch-first layout).
    y : ndarray (n_samples,)

    Examples
    --------
    >>> from nnkit.datasets.sequences import adding_problem
    >>> X, y = adding_problem(4, 10, random_state=0)
    >>> X.shape, y.shape, X[..., 1].sum(axis=1).tolist()
    ((4, 10, 2), (4,), [2.0, 2.0, 2.0, 2.0])
    """
    n = check_scalar(n_samples, name="n_samples", kind=numbers.Integral, low=1)
    T = check_scalar(seq_len, name="seq_len", kind=numbers.Integral, low=2)
    dtype = _check_dtype(dtype)
    rng = get_rng(random_state)
    values = rng.uniform(0.0, 1.0, (n, T))
    half = T // 2
    first = rng.integers(0, half, n)
    second = rng.integers(half, T, n)
    markers = np.zeros((n, T))
    rows = np.arange(n)
    markers[rows, first] = 1.0
    markers[rows, second] = 1.0
    X = np.stack([values, markers], axis=-1).astype(dtype)  # (n, T, 2)
    y = (values[rows, first] + values[rows, second]).astype(dtype)
    return X, y


def copy_task(n_samples, delay, n_symbols=8, length=10, random_state=None):
    """The copy task: reproduce ``length`` symbols after ``delay`` blank steps.

    Token ids: 0 blank, 1..n_symbols data, n_symbols + 1 the delimiter ("go"). An input is
    ``length`` random data symbols, ``delay - 1`` blanks, the delimiter, then ``length``
    blanks; the target is ``length + delay`` blanks followed by the same data symbols.
    Total length L = 2 * length + delay. Predicting blanks everywhere and a uniform guess at
    the last ``length`` steps scores ``copy_task_baseline`` (cross entropy per step).

    Parameters
    ----------
    n_samples : int >= 1
    delay : int >= 1
    n_symbols : int >= 1
    length : int >= 1
    random_state : int, Generator or None

    Returns
    -------
    X, y : ndarray (n_samples, L), int64
        Input and target token ids (vocabulary size n_symbols + 2).

    Examples
    --------
    >>> from nnkit.datasets.sequences import copy_task
    >>> X, y = copy_task(1, delay=3, n_symbols=4, length=2, random_state=0)
    >>> bool((X[0, :2] == y[0, -2:]).all()), X[0, 4].item(), X.shape
    (True, 5, (1, 7))
    """
    n = check_scalar(n_samples, name="n_samples", kind=numbers.Integral, low=1)
    delay = check_scalar(delay, name="delay", kind=numbers.Integral, low=1)
    k = check_scalar(n_symbols, name="n_symbols", kind=numbers.Integral, low=1)
    length = check_scalar(length, name="length", kind=numbers.Integral, low=1)
    rng = get_rng(random_state)
    L = 2 * length + delay
    data = rng.integers(1, k + 1, (n, length))
    X = np.zeros((n, L), dtype=np.int64)
    y = np.zeros((n, L), dtype=np.int64)
    X[:, :length] = data
    X[:, length + delay - 1] = k + 1
    y[:, length + delay:] = data
    return X, y


def copy_task_baseline(delay, n_symbols=8, length=10) -> float:
    """Cross entropy per step of the memoryless strategy: length * ln(n_symbols) / L."""
    return length * math.log(n_symbols) / (2 * length + delay)


def associative_recall(n_samples: int, n_pairs: int, vocab_size: int,
                       n_queries: int | None = None,
                       random_state: int | np.random.Generator | None = None,
                       ) -> tuple[np.ndarray, np.ndarray]:
    """Multi-query associative recall (MQAR): key-value pairs, then keys to recall.

    Token ids [0, vocab_size // 2) are keys and [vocab_size // 2, vocab_size) values. A
    sequence lists ``n_pairs`` pairs ``k_1 v_1 k_2 v_2 ...`` (distinct keys, distinct values,
    drawn afresh for each sequence), then ``n_queries`` of its keys, distinct and in random
    order. The target at a query is the value that followed that key; every other target is
    ``IGNORE_INDEX`` (-100), so ``F.cross_entropy(logits.reshape(-1, vocab_size),
    targets.reshape(-1))`` scores only the queries. T = 2 n_pairs + n_queries. Guessing a
    value of the sequence scores accuracy 1 / n_pairs at best; a model must bind each key to
    its value to do better.

    Parameters
    ----------
    n_samples : int >= 1
    n_pairs : int >= 1
        Key-value pairs per sequence, at most vocab_size // 2 (keys and values distinct).
    vocab_size : int >= 2
    n_queries : int in [1, n_pairs] or None
        Queries per sequence; None queries every key (n_pairs).
    random_state : int, Generator or None
        None uses nnkit's global generator (``nk.manual_seed``).

    Returns
    -------
    tokens : ndarray (n_samples, T), int64
        Token ids in [0, vocab_size).
    targets : ndarray (n_samples, T), int64
        The value at the query positions (the last n_queries), -100 elsewhere.

    Examples
    --------
    >>> from nnkit.datasets.sequences import associative_recall
    >>> tokens, targets = associative_recall(1, n_pairs=3, vocab_size=8, n_queries=2,
    ...                                      random_state=0)
    >>> tokens.shape, targets.shape, bool((targets[0, :6] == -100).all())
    ((1, 8), (1, 8), True)
    >>> pairs = dict(zip(tokens[0, 0:6:2].tolist(), tokens[0, 1:6:2].tolist()))
    >>> [pairs[k] for k in tokens[0, 6:].tolist()] == targets[0, 6:].tolist()
    True
    """
    n = check_scalar(n_samples, name="n_samples", kind=numbers.Integral, low=1)
    vocab = check_scalar(vocab_size, name="vocab_size", kind=numbers.Integral, low=2)
    n_keys = vocab // 2
    p = check_scalar(n_pairs, name="n_pairs", kind=numbers.Integral, low=1, high=n_keys)
    q = p if n_queries is None else check_scalar(n_queries, name="n_queries",
                                                 kind=numbers.Integral, low=1, high=p)
    rng = get_rng(random_state)
    # distinct draws per row: the first p of a random permutation of each row's choices
    keys = np.argsort(rng.random((n, n_keys)), axis=1)[:, :p]  # (n, p)
    values = n_keys + np.argsort(rng.random((n, vocab - n_keys)), axis=1)[:, :p]
    which = np.argsort(rng.random((n, p)), axis=1)[:, :q]  # (n, q): the pairs queried
    T = 2 * p + q
    tokens = np.empty((n, T), dtype=np.int64)
    tokens[:, 0:2 * p:2] = keys
    tokens[:, 1:2 * p:2] = values
    tokens[:, 2 * p:] = np.take_along_axis(keys, which, axis=1)
    targets = np.full((n, T), IGNORE_INDEX, dtype=np.int64)
    targets[:, 2 * p:] = np.take_along_axis(values, which, axis=1)
    return tokens, targets
