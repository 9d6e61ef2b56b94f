"""nk.distributed on a LocalCluster of 2 worker processes (one thread each).

Data-parallel training against single-process training on the same global batches, a
worker killed mid-training, a worker frozen mid-training (SIGSTOP, on a cluster of its own),
experiment grids with a failing point, and the bad inputs.
"""

import math
import os
import signal
import subprocess
import sys
import threading
import time
import warnings

import numpy as np
import pytest
from helpers import fit_one_process

import nnkit as nk
import nnkit.functional as F

distributed = pytest.importorskip("distributed")
import dask  # noqa: E402

import nnkit.distributed  # noqa: E402
from nnkit.distributed import (  # noqa: E402
    ExperimentTable,
    StepInfo,
    fit_data_parallel,
    map_experiments,
)

N, D, C = 120, 6, 3
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(nk.__file__)))


@pytest.fixture(scope="module")
def client():
    # Without work stealing a shard lives on its worker only, so killing that worker loses
    # it for certain and the retry path runs (with stealing, a copy may survive elsewhere).
    with dask.config.set({"distributed.scheduler.work-stealing": False}), \
            distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                     dashboard_address=None) as cluster:
        with distributed.Client(cluster) as cl:
            cl.wait_for_workers(2, timeout=30)
            yield cl


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((N, D))
    y = rng.integers(0, C, N)
    return X, y


def _model(dtype, seed=0):
    nk.manual_seed(seed)
    return nk.nn.Sequential(nk.nn.Linear(D, 16, dtype=dtype), nk.nn.Tanh(),
                            nk.nn.Linear(16, C, dtype=dtype))


def _sgd(model):
    return nk.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def _adam(model):
    return nk.optim.Adam(model.parameters(), lr=1e-2)


def _single_process(X, y, dtype, make_opt, batch_size, epochs, shuffle=True, random_state=0):
    """The reference: the usual loop on the documented global batch schedule."""
    model = _model(dtype)
    fit_one_process(model, make_opt(model), X, y, batch_size, epochs, shuffle, random_state)
    return model


def _parallel(X, y, dtype, make_opt, batch_size, epochs, client, **kwargs):
    model = _model(dtype)
    opt = make_opt(model)
    out = fit_data_parallel(model, F.cross_entropy, opt, X, y, batch_size, epochs, client,
                            random_state=0, progress=False, **kwargs)
    assert out is model
    return model


def _assert_same(a, b, tol):
    for (name, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        np.testing.assert_allclose(p.data, q.data, rtol=tol, atol=tol, err_msg=name)


def _moved(model, dtype):
    start = _model(dtype)
    return max(float(np.abs(p.data - q.data).max())
               for p, q in zip(model.parameters(), start.parameters(), strict=True))


# ----- data-parallel == single process ----------------------------------------------------------
@pytest.mark.parametrize("make_opt", [_sgd, _adam], ids=["sgd-momentum", "adam"])
@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-9), (np.float32, 2e-5)])
def test_data_parallel_equals_single_process(client, data, make_opt, dtype, tol):
    X, y = data
    X = X.astype(dtype)
    want = _single_process(X, y, dtype, make_opt, batch_size=32, epochs=2)
    got = _parallel(X, y, dtype, make_opt, 32, 2, client)
    assert _moved(want, dtype) > 1e-2  # the comparison is not between untrained models
    _assert_same(got, want, tol)


def test_batches_with_an_empty_shard_and_more_shards_than_workers(client, data):
    # Unshuffled batches of 25 over 3 shards [0, 40), [40, 80), [80, 120): the first batch
    # lies in shard 0 only, so shards 1 and 2 only apply the update in its step.
    X, y = data
    want = _single_process(X, y, np.float64, _sgd, batch_size=25, epochs=2, shuffle=False)
    got = _parallel(X, y, np.float64, _sgd, 25, 2, client, shuffle=False, n_workers=3)
    _assert_same(got, want, 1e-9)


def test_shards_on_a_worker_of_threads_each_have_their_own_replica(data, monkeypatch):
    # In-process workers with 2 threads each keep the scattered shards as they are: shards
    # that shared one replica computed their gradients on it at the same time (a 5e-2
    # mismatch against one process was seen). Four shards on two such workers.
    from nnkit import distributed as nk_distributed

    replicas, gradient = {}, nk_distributed._Shard.gradient

    def spy(shard, *args, **kwargs):
        replicas[id(shard)] = shard.replica
        return gradient(shard, *args, **kwargs)

    monkeypatch.setattr(nk_distributed._Shard, "gradient", spy)
    X, y = data
    want = _single_process(X, y, np.float64, _adam, batch_size=48, epochs=3)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=2, processes=False,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster) as threaded:
        got = _parallel(X, y, np.float64, _adam, 48, 3, threaded, n_workers=4)
    _assert_same(got, want, 1e-9)
    assert len(replicas) == 4 and len({id(r) for r in replicas.values()}) == 4


def test_parameters_stay_on_the_workers_and_the_driver_fetches_one_sum(client, data,
                                                                        monkeypatch):
    # After the shards are placed, the driver submits only row indices and small values (no
    # parameter or gradient array goes out) and gathers one result a step, the root of the
    # reduction tree, whatever the number of shards.
    from nnkit import distributed as nk_distributed

    submitted, gathered = [], []
    submit, results = client.submit, nk_distributed._DataParallel._results

    def spy_submit(fn, *args, **kwargs):
        submitted.append((fn.__name__, [a for a in args if isinstance(a, np.ndarray)]))
        return submit(fn, *args, **kwargs)

    def spy_results(run, futures, seconds):
        gathered.append(len(futures))
        return results(run, futures, seconds)

    monkeypatch.setattr(client, "submit", spy_submit)
    monkeypatch.setattr(nk_distributed._DataParallel, "_results", spy_results)
    X, y = data
    want = _single_process(X, y, np.float64, _adam, batch_size=30, epochs=2)
    got = _parallel(X, y, np.float64, _adam, 30, 2, client, n_workers=3)
    _assert_same(got, want, 1e-9)
    steps = [s for s in submitted if s[0] == "_shard_gradient"]
    assert len(steps) == 3 * 8  # every shard every step, rows or not
    assert all(a.dtype == np.int64 and a.size <= 30 for _, arrays in steps for a in arrays)
    assert [s[0] for s in submitted].count("_add_results") == 2 * 8  # a tree over 3 shards
    assert gathered[1:] == [1] * 8  # after the warm-ups' gather: the root alone


@pytest.mark.parametrize("workers", [1, 2, 3, 5, 8, 9, 256])
def test_the_sum_reaches_every_worker_in_log2_rounds(workers):
    # The broadcast plan alone (a stand-in client records the copies): every worker gets a
    # source, each copy is made from a holder, and a fetch is at most ceil(log2 W) hops
    # from the root, with at most one copy made from each holder a round.
    class Recorder:
        def submit(self, fn, source, workers, **kwargs):
            return ("copy", source, workers[0])

    run = nnkit.distributed._DataParallel.__new__(nnkit.distributed._DataParallel)
    run.client, run.homes = Recorder(), [f"w{i}" for i in range(workers)] * 2

    copies = run._broadcast("root", "w0")

    def hops(future):
        return 0 if future == "root" else 1 + hops(future[1])

    assert set(copies) == {None, *run.homes}
    assert max(hops(f) for f in copies.values()) <= math.ceil(math.log2(workers))
    made = [f for f in copies.values() if f != "root"]
    assert all(copies[f[2]] is f for f in made)  # a copy is its target worker's source
    assert len({id(f) for f in made}) == max(0, 2 ** math.ceil(math.log2(workers) - 1) - 1)


def test_a_replica_that_drifts_is_replaced_from_the_driver(data, monkeypatch):
    # A replica whose parameters differ from the driver's when the checksums are compared
    # (every 2 steps here) is replaced, and the step is recomputed on the new replicas. On 3
    # workers, the sum reaches the third through a copy on the second (the broadcast tree).
    from nnkit import distributed as nk_distributed

    catch_up, drifted = nk_distributed._Shard.catch_up, []

    def drift(shard, version, hyper, total):
        catch_up(shard, version, hyper, total)
        if shard.start == 0 and version == 4 and not drifted:
            drifted.append(shard)
            next(shard.replica.parameters()).data[0, 0] += 1e-3

    monkeypatch.setattr(nk_distributed, "_CHECK_EVERY", 2)
    monkeypatch.setattr(nk_distributed._Shard, "catch_up", drift)
    X, y = data
    want = _single_process(X, y, np.float64, _adam, batch_size=24, epochs=2)
    with distributed.LocalCluster(n_workers=3, threads_per_worker=1, processes=False,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster) as in_process, \
            pytest.warns(RuntimeWarning, match="replica of shard 0 .* differs from the "
                                               "driver's parameters after 4 steps"):
        got = _parallel(X, y, np.float64, _adam, 24, 2, in_process)
    _assert_same(got, want, 1e-9)


def test_a_stopped_run_resumes_from_its_checkpoint(client, data, tmp_path):
    """Checkpoints every 3 steps; a run stopped at step 4 resumes from the file (3 steps
    done) and ends as one uninterrupted process; a file of another schedule is refused."""
    X, y = data
    ckpt = tmp_path / "run.nnk"

    def stop_at_4(info):
        if info.step == 4:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _parallel(X, y, np.float64, _adam, 32, 2, client, checkpoint=ckpt,
                  checkpoint_every=3, callback=stop_at_4)
    assert nk.load(ckpt)["step"] == 3
    steps = []
    got = _parallel(X, y, np.float64, _adam, 32, 2, client, checkpoint=ckpt,
                    checkpoint_every=3, callback=lambda info: steps.append(info.step))
    assert steps == list(range(3, 8))
    _assert_same(got, _single_process(X, y, np.float64, _adam, 32, 2), 1e-9)
    with pytest.raises(ValueError, match="of another schedule"):
        _parallel(X, y, np.float64, _adam, 30, 2, client, checkpoint=ckpt)
    nk.save({"model": 1}, tmp_path / "not_one.nnk")
    with pytest.raises(ValueError, match="is not a fit_data_parallel checkpoint"):
        _parallel(X, y, np.float64, _adam, 32, 2, client, checkpoint=tmp_path / "not_one.nnk")
    model = _model(np.float64)
    with pytest.raises(TypeError, match="random_state must be an int or None"):
        fit_data_parallel(model, F.cross_entropy, _adam(model), X, y, 32, 2, client,
                          random_state=np.random.default_rng(0),
                          checkpoint=tmp_path / "other.nnk", progress=False)


def test_callback_receives_step_information(client, data):
    X, y = data
    infos = []
    _parallel(X, y, np.float64, _sgd, 40, 2, client, callback=infos.append)
    assert [i.step for i in infos] == list(range(6))
    assert [i.epoch for i in infos] == [0, 0, 0, 1, 1, 1]
    first = infos[0]
    assert isinstance(first, StepInfo) and first.retries == 0
    assert 0 < first.compute_seconds <= first.seconds
    n_params = sum(p.data.size for p in _model(np.float64).parameters())
    assert first.message_bytes == 2 * 8 * n_params  # a worker's gradient out, the sum in
    assert len(first.warm_up_seconds) == 2
    assert np.isfinite(first.loss) and infos[-1].loss < first.loss
    # the adaptive deadline: max(30 s, 10 x the median of the warm-ups, then of the steps)
    assert first.step_timeout == pytest.approx(max(30.0, 10 * np.median(first.warm_up_seconds)))
    assert all(i.step_timeout == 30.0 and i.recomputed == 0 for i in infos[1:])
    infos.clear()
    _parallel(X, y, np.float64, _sgd, 40, 1, client, step_timeout=math.inf,
              callback=infos.append)
    assert [i.step_timeout for i in infos] == [math.inf] * 3


def test_worker_errors_propagate_unchanged(client, data):
    X, y = data

    def bad_loss(pred, target):
        raise ValueError("loss exploded on purpose")

    model = _model(np.float64)
    with pytest.raises(ValueError, match="on purpose"):
        fit_data_parallel(model, bad_loss, _sgd(model), X, y, 32, 1, client, progress=False)


# ----- fault tolerance ------------------------------------------------------------------------
def _kill_one_worker_after(client, step):
    pids = client.run(os.getpid)
    victim = pids[sorted(pids)[0]]

    def callback(info):
        if info.step == step and info.retries == 0:
            os.kill(victim, 9)

    return callback


def test_killed_worker_does_not_lose_the_run(client, data):
    X, y = data
    want = _single_process(X, y, np.float64, _adam, batch_size=20, epochs=2)
    with pytest.warns(RuntimeWarning, match="lost a worker"):
        got = _parallel(X, y, np.float64, _adam, 20, 2, client,
                        callback=_kill_one_worker_after(client, 3))
    _assert_same(got, want, 1e-9)
    client.wait_for_workers(2, timeout=30)  # the nanny restarted it


def test_out_of_retries_is_a_clear_error(client, data):
    X, y = data
    with pytest.raises(RuntimeError, match="max_retries=0"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            _parallel(X, y, np.float64, _sgd, 20, 2, client, max_retries=0,
                      callback=_kill_one_worker_after(client, 1))
    client.wait_for_workers(2, timeout=30)


# ----- a frozen worker (SIGSTOP) ---------------------------------------------------------------
posix_signals = pytest.mark.skipif(not hasattr(signal, "SIGSTOP"),
                                   reason="freezes workers with SIGSTOP (POSIX only)")


@pytest.fixture(scope="module")
def three_workers():
    """A cluster of its own, whose workers the tests freeze; not the default client."""
    with distributed.LocalCluster(n_workers=3, threads_per_worker=1, processes=True,
                                  dashboard_address=":0") as cluster, \
            distributed.Client(cluster, set_as_default=False) as cl:
        cl.wait_for_workers(3, timeout=30)
        yield cl


def _within(seconds, fn, unfreeze):
    """``fn()`` in a thread joined for at most ``seconds``: a stall fails the test instead of
    hanging it (``unfreeze`` resumes the workers so that the thread can end)."""
    box = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    start = time.monotonic()
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        unfreeze()
        thread.join(60)
        pytest.fail(f"fit_data_parallel stalled on a frozen worker: no return within "
                    f"{seconds} s")
    if "error" in box:
        raise box["error"]
    return box["value"], time.monotonic() - start


def _signal_all(pids, sig):
    for pid in pids:
        os.kill(pid, sig)


@posix_signals
def test_frozen_worker_costs_one_timeout_not_the_run(three_workers, data):
    # Shards go round robin over the sorted worker addresses: shard 1 lives on the victim.
    # Frozen after step 2, step 3 waits step_timeout for it and recomputes shard 1 on another
    # worker, which keeps it; resumed after step 6, the victim's late result of step 3 must
    # not count. Training equals the single process's, and no later step waits again.
    X, y = data
    want = _single_process(X, y, np.float64, _adam, batch_size=20, epochs=2)
    pids = three_workers.run(os.getpid)
    victim = pids[sorted(pids)[1]]
    infos = []

    def callback(info):
        infos.append(info)
        if info.step == 2:
            os.kill(victim, signal.SIGSTOP)
        elif info.step == 6:
            os.kill(victim, signal.SIGCONT)

    try:
        # 10 s: a worker's first steps (compiling) stay within it on a loaded machine
        with pytest.warns(RuntimeWarning, match=r"no result for shard 1 within step_timeout=10 s"):
            got, _ = _within(
                120, lambda: _parallel(X, y, np.float64, _adam, 20, 2, three_workers,
                                       step_timeout=10, callback=callback),
                lambda: os.kill(victim, signal.SIGCONT))
    finally:
        os.kill(victim, signal.SIGCONT)
    _assert_same(got, want, 1e-9)
    assert [i.step for i in infos] == list(range(12))
    assert [i.step for i in infos if i.recomputed] == [3] and infos[3].recomputed == 1
    assert infos[3].seconds >= 10 and all(i.step_timeout == 10 for i in infos)


@posix_signals
def test_worker_frozen_before_the_run_gets_no_shard(three_workers, data):
    # Shard 0's scatter to the victim times out; the shard goes to the next worker.
    X, y = data
    want = _single_process(X, y, np.float64, _sgd, batch_size=30, epochs=1)
    pids = three_workers.run(os.getpid)
    victim = pids[sorted(pids)[0]]
    os.kill(victim, signal.SIGSTOP)
    infos = []
    try:
        with pytest.warns(RuntimeWarning, match=r"did not take shard 0 within step_timeout=3 s"):
            got, _ = _within(120, lambda: _parallel(X, y, np.float64, _sgd, 30, 1,
                                                    three_workers, step_timeout=3,
                                                    callback=infos.append),
                             lambda: os.kill(victim, signal.SIGCONT))
    finally:
        os.kill(victim, signal.SIGCONT)
    _assert_same(got, want, 1e-9)
    assert len(infos) == 4 and all(i.recomputed == 0 for i in infos)


@posix_signals
@pytest.mark.parametrize("private_wait", [True, False], ids=["one-trip", "public-fallback"])
def test_every_worker_frozen_is_a_clear_error_not_a_hang(three_workers, data, private_wait,
                                                         monkeypatch):
    # The fallback (distributed.wait, then gather) runs if distributed's _wait goes away.
    if not private_wait:
        monkeypatch.setattr(nnkit.distributed, "_private_wait", lambda: None)
    X, y = data
    pids = list(three_workers.run(os.getpid).values())

    def callback(info):
        if info.step == 0:
            _signal_all(pids, signal.SIGSTOP)

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            with pytest.raises(RuntimeError, match=r"within 2 x step_timeout=1 s.*max_retries=1"):
                _within(60, lambda: _parallel(X, y, np.float64, _sgd, 20, 1, three_workers,
                                              step_timeout=1, max_retries=1,
                                              callback=callback),
                        lambda: _signal_all(pids, signal.SIGCONT))
    finally:
        _signal_all(pids, signal.SIGCONT)


# ----- experiment grids -----------------------------------------------------------------------
def _experiment(n, alpha):
    if n == 0:
        raise ZeroDivisionError("n = 0 on purpose")
    return {"load": alpha * n, "n": n}  # 'n' clashes with the parameter: renamed n_result


def test_grid_rows_in_order_failures_reported(client):
    with pytest.warns(RuntimeWarning) as record:
        table = map_experiments(_experiment, {"n": [10, 0, 20], "alpha": [0.5, 0.25]},
                                client, progress=False)
    assert [str(w.message) for w in record] == [
        f"experiment {{'n': 0, 'alpha': {a}}} failed: ZeroDivisionError: n = 0 on purpose"
        for a in (0.5, 0.25)]
    assert isinstance(table, ExperimentTable)
    assert [(r["n"], r["alpha"]) for r in table.rows] == [(10, 0.5), (10, 0.25), (20, 0.5),
                                                          (20, 0.25)]
    assert table.columns == ["n", "alpha", "load", "n_result"]
    np.testing.assert_allclose(table.column("load"), [5.0, 2.5, 10.0, 5.0])
    assert [f.params for f in table.failures] == [{"n": 0, "alpha": 0.5},
                                                  {"n": 0, "alpha": 0.25}]
    assert "ZeroDivisionError: n = 0 on purpose" in table.failures[0].error
    assert "_experiment" in table.failures[0].traceback
    md = table.to_markdown()
    assert md.splitlines()[0] == "| n | alpha | load | n_result |"
    assert "failed: {'n': 0, 'alpha': 0.5}" in md


def test_grid_as_list_of_dicts_and_scalar_results(client):
    grid = [{"x": 3}, {"x": 1}, {"x": 2}]
    table = map_experiments(lambda x: x * x, grid, client, progress=False)
    assert table.rows == [{"x": 3, "result": 9}, {"x": 1, "result": 1}, {"x": 2, "result": 4}]
    assert table.failures == [] and len(table) == 3


def test_grid_where_every_point_fails(client):
    with pytest.raises(RuntimeError, match=r"all 2 experiments failed.*\{'n': 0"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            map_experiments(_experiment, {"n": [0], "alpha": [1, 2]}, client, progress=False)


def test_local_cluster_by_default():
    table = map_experiments(lambda a: {"pid": os.getpid()}, {"a": [1, 2]}, n_workers=1,
                            progress=False)
    assert len(set(table.column("pid"))) == 1 and table.rows[0]["pid"] != os.getpid()


# ----- bad inputs -----------------------------------------------------------------------------
def test_unreachable_address_is_a_clear_error(data):
    X, y = data
    model = _model(np.float64)
    with pytest.raises(ConnectionError, match=r"tcp://127.0.0.1:9.*timeout=0.5"):
        fit_data_parallel(model, F.cross_entropy, _sgd(model), X, y, 32, 1,
                          client="tcp://127.0.0.1:9", timeout=0.5, progress=False)
    with pytest.raises(ConnectionError, match="tcp://127.0.0.1:9"):
        map_experiments(abs, {"x": [1]}, "tcp://127.0.0.1:9", timeout=0.5)


@pytest.mark.parametrize("grid, error, match", [
    ({}, ValueError, "grid is empty"),
    ([], ValueError, "grid is empty"),
    ({"a": []}, ValueError, r"grid\['a'\] is an empty list"),
    ({"a": 3}, TypeError, r"grid\['a'\] must be a list"),
    ({"a": "abc"}, TypeError, r"grid\['a'\] must be a list"),
    ([{"a": 1}, 2], TypeError, "must hold dicts"),
    ("a=1", TypeError, "grid must be a dict of lists or a list of dicts, got str"),
])
def test_bad_grids(grid, error, match):
    with pytest.raises(error, match=match):
        map_experiments(abs, grid)


def test_bad_grid_functions():
    with pytest.raises(TypeError, match="fn must be callable"):
        map_experiments(42, {"a": [1]})
    import threading

    lock = threading.Lock()
    with pytest.raises(TypeError, match="picklable by cloudpickle"):
        map_experiments(lambda a: lock.locked(), {"a": [1]})


def test_bad_fit_arguments(data, client):
    X, y = data
    model = _model(np.float64)
    opt = _sgd(model)
    other = _model(np.float64, seed=1)
    cases = [
        (dict(model=object()), TypeError, "model must be an nnkit nn.Module"),
        (dict(loss_fn=3), TypeError, "loss_fn must be callable"),
        (dict(optimizer="sgd"), TypeError, "optimizer must be an nk.optim optimizer"),
        (dict(optimizer=_sgd(other)), ValueError, "not parameters of model"),
        (dict(y=y[:-1]), ValueError, r"one entry per row of X \(120\)"),
        (dict(X=X[:0], y=y[:0]), ValueError, "at least one row"),
        (dict(batch_size=0), ValueError, "batch_size"),
        (dict(epochs=1.5), TypeError, "epochs must be an integer"),
        (dict(client=3), TypeError, "client must be None"),
        (dict(callback="print"), TypeError, "callback must be callable"),
        (dict(step_timeout=0), ValueError, "step_timeout must be > 0"),
        (dict(step_timeout="60"), TypeError, "step_timeout must be a real number"),
        (dict(step_timeout=math.nan), ValueError, "step_timeout must be finite"),
    ]
    for change, error, match in cases:
        args = dict(model=model, loss_fn=F.cross_entropy, optimizer=opt, X=X, y=y,
                    batch_size=32, epochs=1, client=client, progress=False)
        args.update(change)
        with pytest.raises(error, match=match):
            fit_data_parallel(**args)


def test_importing_nnkit_distributed_does_not_import_dask():
    code = ("import sys, nnkit, nnkit.distributed; "
            "print('distributed' in sys.modules, 'dask' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONPATH": ROOT})
    assert out.stdout.split() == ["False", "False"]


def test_missing_dask_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "distributed", None)  # import distributed -> ImportError
    with pytest.raises(ImportError, match=r'pip install "nnkit\[distributed\]"'):
        map_experiments(abs, {"x": [1]})
