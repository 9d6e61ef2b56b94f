"""Processes and threads around nnkit.

Fork safety: after the parent has run a parallel kernel, a child started with fork (the
default of ``multiprocessing`` on Linux), a child started with spawn and four threads
calling parallel kernels at once all get the serial builds' results. Each case runs in a
fresh Python process, so that a child killed by the threading layer cannot take the test
runner with it.

Thread safety: threads running backward through shared leaves (one ``Tensor``, or one
model's parameters) lose no gradient contribution.
"""

import multiprocessing
import subprocess
import sys
import threading

import numpy as np
import pytest

import nnkit as nk

_CHILD = r'''
import multiprocessing
import sys
import threading

import numpy as np

from nnkit._ext import softmax_cpu
from nnkit.kernels import log_softmax_forward, softmax_forward

# 512 x 256 = 131072 elements, above PARALLEL_MIN_ELEMENTS: the parallel builds run.
X = np.random.default_rng(0).standard_normal((512, 256))


def parallel_results():
    return [softmax_forward(X)[0], log_softmax_forward(X)[0]]


def serial_results():
    outs = [np.empty_like(X), np.empty_like(X)]
    softmax_cpu.softmax_rows.serial(X, outs[0])
    softmax_cpu.log_softmax_rows.serial(X, outs[1])
    return outs


def equal(results, expected):
    return all(np.array_equal(r, e) for r, e in zip(results, expected, strict=True))


def in_threads(expected, n_threads=4, calls=20):
    """``calls`` rounds of the parallel kernels in each of ``n_threads`` threads at once;
    the number of rounds that differed from ``expected`` (or raised)."""
    bad, barrier = [], threading.Barrier(n_threads)

    def work():
        barrier.wait()
        for _ in range(calls):
            try:
                bad.append(not equal(parallel_results(), expected))
            except Exception:
                bad.append(True)

    threads = [threading.Thread(target=work) for _ in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(bad) + n_threads * calls - len(bad)


def child(queue, expected, threads):
    if threads:
        queue.put(in_threads(expected, threads))
    else:
        queue.put(int(not equal(parallel_results(), expected)))


def in_process(method, expected, threads=0):
    ctx = multiprocessing.get_context(method)
    queue = ctx.Queue()
    proc = ctx.Process(target=child, args=(queue, expected, threads))
    proc.start()
    proc.join(240)
    if proc.exitcode != 0:
        proc.kill()
        ended = "hung" if proc.exitcode is None else f"ended with exit code {proc.exitcode}"
        sys.exit(f"the {method} child {ended}")
    return queue.get(timeout=10)


if __name__ == "__main__":
    case = sys.argv[1]
    expected = serial_results()
    assert equal(parallel_results(), expected), "parent: parallel != serial"
    if case == "threads":
        bad = in_threads(expected)
    elif case == "fork-threads":
        bad = in_process("fork", expected, threads=2)
    else:
        bad = in_process(case, expected)
    assert bad == 0, f"{case}: {bad} results differ from the serial builds'"
    assert equal(parallel_results(), expected), "parent after the child: parallel != serial"
    print("ok")
'''


@pytest.mark.parametrize("case", ["fork", "spawn", "threads", "fork-threads"])
def test_parallel_kernels_after_fork_spawn_and_in_threads(case, tmp_path):
    """The parent runs a parallel kernel, then: a fork child runs them ('fork'; 'fork-threads'
    with two threads in the child), a spawn child runs them, or four threads run them at once;
    every result equals the serial build's, and the parent's kernels still work after."""
    if case.startswith("fork") and "fork" not in multiprocessing.get_all_start_methods():
        pytest.skip("no fork on this platform")
    script = tmp_path / "child.py"  # a file, not -c: a spawn child imports its __main__
    script.write_text(_CHILD)
    proc = subprocess.run([sys.executable, str(script), case], capture_output=True, text=True,
                          timeout=420)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), (
        f"exit code {proc.returncode}\nstdout: {proc.stdout[-2000:]}\n"
        f"stderr: {proc.stderr[-2000:]}")


@pytest.fixture
def contention():
    """Switch threads every microsecond (CPython's default is 5 ms) while the test runs."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(interval)


def _in_threads(work, n_threads=4):
    barrier = threading.Barrier(n_threads)
    errors = []

    def run():
        barrier.wait()
        try:
            work()
        except Exception as exc:  # reported below: a thread's exception is not raised in join
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_concurrent_backward_into_one_leaf_loses_nothing(contention):
    """4 threads x 100 backward passes of (w * x).sum() with x = 1: w.grad is 400 everywhere.
    A leaf of 2**16 elements: NumPy releases the GIL inside the add, the window in which an
    unlocked read-add-write loses another thread's contribution (without the lock 19-20 of
    20 trials lost some, median 259-279 of 400)."""
    for _ in range(3):
        w = nk.tensor(np.zeros(1 << 16), requires_grad=True)
        x = nk.tensor(np.ones(1 << 16))

        def work(w=w, x=x):
            for _ in range(100):
                (w * x).sum().backward()

        _in_threads(work)
        np.testing.assert_array_equal(w.grad, np.full(1 << 16, 400.0))


def test_concurrent_backward_through_one_model_sums_every_gradient(contention):
    """4 threads x 25 forward and backward passes through one shared model: every
    parameter's .grad is 100 times one pass's, as if the passes ran one after another. A
    512 x 512 weight and a batch of 4, so the add into the weight's .grad is a large part of
    a pass (without the lock 4-5 of 5 trials lost contributions to the weight: 69-97 of 100
    kept)."""
    rng = np.random.default_rng(0)
    model = nk.nn.Sequential(nk.nn.Linear(512, 512, dtype=np.float64), nk.nn.Tanh(),
                             nk.nn.Linear(512, 10, dtype=np.float64))
    X = nk.tensor(rng.standard_normal((4, 512)))
    y = rng.integers(0, 10, 4)

    def step():
        nk.functional.cross_entropy(model(X), y).backward()

    step()
    one = {name: p.grad.copy() for name, p in model.named_parameters()}

    def work():
        for _ in range(25):
            step()

    for _ in range(3):
        model.zero_grad()
        _in_threads(work)
        for name, p in model.named_parameters():
            np.testing.assert_allclose(p.grad, 100 * one[name], rtol=1e-10, atol=1e-12,
                                       err_msg=name)


class _FakeBlas:
    """A threadpoolctl controller stand-in that records its thread count."""

    def __init__(self, threads):
        self.num_threads = threads

    def set_num_threads(self, n):
        self.num_threads = n


def test_overlapping_one_blas_thread_blocks_restore_the_first_count():
    """Two threads inside at once (A in, B in, A out, B out): BLAS stays on one thread until
    the last one leaves, then gets back the count found first, not the 1 that B found."""
    from nnkit._ext._dispatch import one_blas_thread

    lib = _FakeBlas(4)
    a, b = one_blas_thread(lib), one_blas_thread(lib)
    a.__enter__()
    b.__enter__()
    assert lib.num_threads == 1
    a.__exit__(None, None, None)
    assert lib.num_threads == 1  # B still runs its one-thread product
    b.__exit__(None, None, None)
    assert lib.num_threads == 4
