"""The pool of large host buffers (``nnkit.kernels._workspace``): a block is handed out
again only when nothing else refers to it, whatever views were taken; the cap holds; small
requests are plain arrays; threads never share a block."""

import threading

import numpy as np
import pytest

from nnkit.kernels import _workspace as workspace

MB = 1 << 20


@pytest.fixture(autouse=True)
def empty_pool():
    workspace.clear()
    yield
    workspace.clear()


def _address(a):
    return a.__array_interface__["data"][0]


def test_a_freed_block_is_reused_with_its_new_shape_and_dtype():
    a = workspace.empty((4, MB // 4), np.float32)
    assert a.shape == (4, MB // 4) and a.dtype == np.float32 and a.flags.c_contiguous
    where = _address(a)
    del a
    b = workspace.empty((MB // 2,), np.float64)
    assert b.shape == (MB // 2,) and b.dtype == np.float64
    assert _address(b) == where
    b[:] = 1.5  # writable, the whole block
    assert float(b.sum()) == 1.5 * (MB // 2)


@pytest.mark.parametrize("keep", [
    lambda a: a[1:],  # a slice
    lambda a: a.reshape(-1)[::3],  # a view of a view
    lambda a: a.T.view(np.int32),  # another dtype
    lambda a: memoryview(a),  # a buffer export
    lambda a: np.frombuffer(a, dtype=np.uint8),
    lambda a: [a],  # the array itself, held by someone
])
def test_a_block_with_any_live_view_is_not_handed_out(keep):
    a = workspace.empty((2, MB // 4), np.float32)
    a[:] = 7
    held = keep(a)
    where = _address(a)
    del a

    def values():
        return np.asarray(held[0] if isinstance(held, list) else held)

    before = values().copy()
    b = workspace.empty((2, MB // 4), np.float32)
    assert _address(b) != where
    b[:] = 0
    np.testing.assert_array_equal(values(), before)


def test_small_requests_are_plain_arrays_and_sizes_far_apart_are_not_matched():
    small = workspace.empty((10,), np.float64)
    assert small.base is None
    big = workspace.empty((4 * MB,), np.uint8)
    where = _address(big)
    del big
    assert _address(workspace.empty((MB,), np.uint8)) != where  # a quarter: not this block
    assert _address(workspace.empty((3 * MB,), np.uint8)) == where


def test_the_cap_is_held_unused_blocks_dropped_first(monkeypatch):
    monkeypatch.setattr(workspace, "MAX_POOLED_BYTES", 2 * MB)
    a = workspace.empty((MB,), np.uint8)
    b = workspace.empty((MB,), np.uint8)
    del a  # unused, the oldest
    c = workspace.empty((3 * MB // 2,), np.uint8)  # fits no block: 3.5 MiB pooled
    # a (unused) goes first, then b (in use, the oldest left): c alone is within the cap
    assert [_address(k) for k in workspace._blocks] == [_address(c)]
    b[:] = 1  # b lives on with its user
    assert np.all(b == 1)


def test_threads_never_get_the_same_block():
    seen, errors = [], []

    def worker(k):
        for i in range(20):
            a = workspace.empty((MB // 4,), np.float32)
            a[:] = k
            seen.append(a)  # held: no other thread may receive this block
            if not np.all(a == k):
                errors.append((k, i))

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len({_address(a) for a in seen}) == len(seen)
