"""Data parallelism on MPI (``nk.distributed.DistributedDataParallel``): N ranks started by
``mpiexec`` equal one process on the same global batches, with SGD, Adam and AdamW, in
float64 and float32, shares of unequal size, a head that some ranks (or all) leave unused in
a step and a layer never used; diverged replicas are named. The in-process tests use a
one-rank communicator."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import nnkit as nk
from nnkit.distributed import DistributedDataParallel

pytest.importorskip("mpi4py")  # the test extra brings it; a bare install has no MPI

sys.path.insert(0, str(Path(__file__).parent))
from ddp_problem import CASES, Routed, fit_one_process, train_one_process  # noqa: E402

HERE = Path(__file__).parent
TOLERANCE = {"float64": 1e-10, "float32": 1e-5}


def _mpiexec() -> str:
    found = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or \
        shutil.which("mpiexec")
    assert found, "mpiexec not found: the MPICH wheel (test extra) installs it beside python"
    return found


def _run(n, *args, timeout=240, check=True):
    env = {**os.environ, "NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
           "OPENBLAS_NUM_THREADS": "1", "PYTHONPATH": str(HERE.parent)}
    done = subprocess.run([_mpiexec(), "-n", str(n), sys.executable,
                           str(HERE / "mpi_ddp_run.py"), *args],
                          env=env, capture_output=True, text=True, timeout=timeout)
    if check:
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def one_process():
    results = {}
    for case in CASES:
        results.update(train_one_process(case))
    return results


@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_n_ranks_equal_one_process(tmp_path, one_process, ranks):
    out = tmp_path / "params.npz"
    _run(ranks, str(out))
    got = np.load(out)
    assert set(got.files) == set(one_process)
    for key, want in one_process.items():
        dtype = key.split("-")[0]
        np.testing.assert_allclose(got[key], want, rtol=TOLERANCE[dtype],
                                   atol=TOLERANCE[dtype], err_msg=f"{ranks} ranks: {key}")


@pytest.mark.parametrize("ranks", [2, 3])
def test_fit_data_parallel_on_mpi_equals_one_process(tmp_path, ranks):
    out = tmp_path / "fit.npz"
    _run(ranks, str(out), "fit")
    got = np.load(out)
    model, losses = fit_one_process()
    np.testing.assert_allclose(got["losses"], losses, rtol=1e-10)
    for name, p in model.named_parameters():
        np.testing.assert_allclose(got[name], p.data, rtol=1e-10, atol=1e-12, err_msg=name)


def test_a_run_stopped_part_way_resumes_on_another_rank_count(tmp_path):
    """2 ranks checkpoint every 4 steps and stop at step 5 (the file holds 4 steps); 3
    ranks resume from it and finish: the same parameters as one uninterrupted process."""
    ckpt, out = tmp_path / "run.nnk", tmp_path / "fit.npz"
    first = _run(2, str(out), "resume", str(ckpt), "5", check=False)
    assert first.returncode != 0 and "stopped at step 5" in first.stderr
    assert ckpt.exists() and not out.exists()
    assert nk.load(ckpt)["step"] == 4
    _run(3, str(out), "resume", str(ckpt))
    got = np.load(out)
    model, losses = fit_one_process()
    np.testing.assert_allclose(got["losses"], losses[4:], rtol=1e-10)
    for name, p in model.named_parameters():
        np.testing.assert_allclose(got[name], p.data, rtol=1e-10, atol=1e-12, err_msg=name)
    assert nk.load(ckpt)["step"] == len(losses)


def test_dropout_streams_are_per_rank_and_repeat_from_run_to_run(tmp_path):
    runs = []
    for k in range(2):
        _run(3, str(tmp_path / f"run{k}.npz"), "dropout")
        runs.append(np.load(tmp_path / f"run{k}.npz"))
    assert len(set(runs[0]["firsts"])) == 3  # a stream of its own on each rank
    for name in runs[0].files:  # and the same training twice
        np.testing.assert_array_equal(runs[0][name], runs[1][name], err_msg=name)


def test_map_experiments_on_the_ranks(tmp_path):
    out = tmp_path / "grid.json"
    _run(3, str(out), "grid")
    got = json.loads(out.read_text())
    points = [(a, b) for a in (1, 2, 3) for b in (10, 20) if (a, b) != (2, 20)]
    assert [(r["a"], r["b"], r["sum"]) for r in got["rows"]] == [(a, b, a + b)
                                                                   for a, b in points]
    # point i of the grid on rank i mod 3 (the failing point is i = 3)
    assert [r["rank"] for r in got["rows"]] == [0, 1, 2, 1, 2]
    assert got["failures"] == [[{"a": 2, "b": 20}, "ValueError: a bad point"]]
    assert got["same"]  # every rank returned the whole table


def test_an_unseeded_schedule_is_the_same_on_every_rank(tmp_path):
    """random_state=None: each step the ranks' shares make one global batch, and every
    epoch covers each row once (a seed drawn on each rank would give each rank its own
    permutation, and shares of different batches)."""
    out = tmp_path / "rows.json"
    _run(2, str(out), "unseeded")
    per_rank = json.loads(out.read_text())  # [rank][step] -> rows of that rank's share
    steps = len(per_rank[0])
    assert steps == 12 and all(len(r) == steps for r in per_rank)
    # one global batch a step: the ranks' shares add up to it (own seeds would not)
    assert [sum(len(r[step]) for r in per_rank) for step in range(steps)] == [10] * steps
    for epoch in range(2):
        rows = [row for steps_of_rank in per_rank
                for step in steps_of_rank[epoch * 6:(epoch + 1) * 6] for row in step]
        assert sorted(rows) == list(range(60)), f"epoch {epoch}"


def test_dask_options_are_refused_on_mpi():
    from nnkit.distributed import fit_data_parallel

    model = Routed("float64")
    opt = nk.optim.SGD(model.parameters(), lr=0.1)
    X, y = np.zeros((4, 6)), np.zeros(4, int)
    loss = nk.functional.cross_entropy
    with pytest.raises(ValueError, match="n_workers, step_timeout: options of the Dask"):
        fit_data_parallel(model, loss, opt, X, y, 2, 1, backend="mpi", n_workers=2,
                          step_timeout=5.0)
    with pytest.raises(ValueError, match="backend must be 'dask' or 'mpi'"):
        fit_data_parallel(model, loss, opt, X, y, 2, 1, backend="gloo")
    with pytest.raises(ValueError, match="comm is for backend='mpi'"):
        fit_data_parallel(model, loss, opt, X, y, 2, 1, comm=object())
    from nnkit.distributed import map_experiments

    with pytest.raises(ValueError, match="client: options of the Dask backend"):
        map_experiments(lambda a: a, {"a": [1]}, "tcp://host:1", backend="mpi")
    with pytest.raises(ValueError, match="backend must be 'dask' or 'mpi'"):
        map_experiments(lambda a: a, {"a": [1]}, backend="ray")


@pytest.mark.parametrize("how", ["raise", "exit"])
def test_a_failing_rank_ends_the_job_soon(tmp_path, how):
    """Without the abort, the other ranks would wait in their all-reduce for ever."""
    start = time.monotonic()
    done = _run(3, str(tmp_path / "unused"), "fail", how, timeout=120, check=False)
    assert done.returncode != 0
    assert time.monotonic() - start < 60
    if how == "raise":
        assert "nnkit: rank 1 of 3 failed" in done.stderr
        assert "RuntimeError: a failure on rank 1" in done.stderr


def test_diverged_replicas_are_named(tmp_path):
    out = tmp_path / "message.txt"
    _run(2, str(out), "diverge")
    message = out.read_text()
    assert "'head_a.bias'" in message and "[1]" in message, message


# ----- one rank, in this process ----------------------------------------------------------
def _ddp(model, **kwargs):
    from mpi4py import MPI

    return DistributedDataParallel(model, MPI.COMM_SELF, **kwargs)


def test_buckets_hold_one_dtype_and_respect_their_size():
    model = nk.nn.Sequential(nk.nn.Linear(4, 8, dtype="float64"), nk.nn.Linear(8, 2))
    ddp = _ddp(model, bucket_bytes=100)
    named = ddp._named
    for bucket in ddp._buckets:
        assert len({named[i][1].data.dtype for i in bucket}) == 1
        assert len(bucket) == 1 or sum(named[i][1].data.nbytes for i in bucket) <= 100
    order = [i for bucket in ddp._buckets for i in bucket]
    assert order == list(reversed(range(len(named))))  # as the backward produces them


def test_unused_parameters_keep_no_gradient_and_used_ones_are_unchanged_on_one_rank():
    model = Routed("float64")
    ddp = _ddp(model)
    x = nk.tensor(np.ones((3, 6)))
    ddp(x).sum().backward()
    before = model.body.weight.grad.copy()
    ddp.allreduce_gradients(3)
    np.testing.assert_array_equal(model.body.weight.grad, before)
    assert model.never.weight.grad is None and model.head_a.weight.grad is None


def _mlp3(dtype="float64"):
    nk.manual_seed(0)
    return nk.nn.Sequential(nk.nn.Linear(6, 16, dtype=dtype), nk.nn.Tanh(),
                            nk.nn.Linear(16, 16, dtype=dtype), nk.nn.Tanh(),
                            nk.nn.Linear(16, 3, dtype=dtype))


def test_buckets_start_in_the_backward_and_follow_its_order_after_the_first_step():
    model = _mlp3()
    ddp = _ddp(model, bucket_bytes=200)
    X = np.random.default_rng(0).standard_normal((8, 6))
    started = []
    for _ in range(3):
        local = ddp.local_share(np.arange(8))
        model.zero_grad()
        ddp(X[local]).sum().backward()
        started.append(ddp._step.started)  # buckets sent while the backward ran
        ddp.allreduce_gradients()
    assert started[0] > 0 and started[1] == started[2] == len(ddp._buckets)
    first = [i for bucket in ddp._buckets for i in bucket]
    assert first == [4, 5, 2, 3, 0, 1]  # weight then bias, last layer first


def test_micro_batches_accumulate_inside_no_sync_and_a_second_backward_outside_is_refused():
    model = _mlp3()
    ddp = _ddp(model, bucket_bytes=200)
    X = np.random.default_rng(0).standard_normal((8, 6))
    ddp.local_share(np.arange(8))
    model.zero_grad()
    with ddp.no_sync():
        ddp(X[:4]).sum().backward()
    ddp(X[4:]).sum().backward()
    ddp.allreduce_gradients()
    got = [p.grad.copy() for p in model.parameters()]
    model.zero_grad()
    ddp(X).sum().backward()
    for g, p in zip(got, model.parameters(), strict=True):
        np.testing.assert_allclose(g, p.grad, rtol=1e-12, atol=1e-12)
    ddp.allreduce_gradients()
    ddp.local_share(np.arange(8))
    ddp(X[:4]).sum().backward()
    with pytest.raises(RuntimeError, match="second backward.*no_sync"):
        ddp(X[4:]).sum().backward()


def test_a_collected_wrapper_leaves_no_hooks_on_the_model():
    import gc

    from nnkit.autograd import _GRAD_HOOKS

    model = _mlp3()
    wrappers = [_ddp(model) for _ in range(3)]
    assert sum(len(_GRAD_HOOKS[id(p)][1]) for p in model.parameters()) == 3 * 6
    del wrappers
    gc.collect()
    assert all(not _GRAD_HOOKS[id(p)][1] for p in model.parameters())


def test_announced_rows_are_checked():
    ddp = _ddp(_mlp3())
    with pytest.raises(ValueError, match="exceeds global_count"):
        ddp.begin_step(5, 4)
    with pytest.raises(ValueError, match="global_count is 0"):
        ddp.begin_step(0, 0)
    ddp.begin_step(3, 4)
    with pytest.raises(ValueError, match=r"local_count \(2\) differs from the 3 rows"):
        ddp.allreduce_gradients(2)


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"bucket_bytes": 0}, ValueError, "bucket_bytes"),
    ({"bucket_bytes": 1.5}, TypeError, "bucket_bytes"),
    ({"check_every": -1}, ValueError, "check_every"),
    ({"seed": -1}, ValueError, "seed"),
    ({"seed": "5"}, TypeError, "seed"),
])
def test_bad_options_are_refused(kwargs, error, match):
    with pytest.raises(error, match=match):
        _ddp(Routed("float64"), **kwargs)


def test_bad_module_comm_and_counts_are_refused():
    with pytest.raises(TypeError, match="module must be an nn.Module"):
        _ddp(object())
    with pytest.raises(TypeError, match="comm must be an mpi4py communicator"):
        DistributedDataParallel(Routed("float64"), comm="world")
    ddp = _ddp(Routed("float64"))
    with pytest.raises(ValueError, match="local_count"):
        ddp.allreduce_gradients(-1)
    with pytest.raises(ValueError, match="empty"):
        ddp.allreduce_gradients(0)
    with pytest.raises(ValueError, match="indices must be 1-D"):
        ddp.local_share(np.zeros((2, 2), int))
