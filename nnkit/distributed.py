"""``nk.distributed``: data-parallel training on MPI or Dask, and experiment grids.

On MPI (the ``mpi`` extra, ``pip install "nnkit[mpi]"``; mpi4py is imported only when
used): ``DistributedDataParallel(model, comm=None)``, a replica per rank whose gradients are
all-reduced in flat buckets (``nnkit._mpi``), for scripts run with ``mpiexec -n N`` or
``srun``. On ``dask.distributed`` (the ``distributed`` extra, ``pip install
"nnkit[distributed]"``; importing nnkit never imports dask):

``fit_data_parallel(model, loss_fn, optimizer, X, y, batch_size, epochs, client=None)``
    Synchronous data-parallel SGD. The rows of ``X`` are split into W contiguous shards, one
    per worker, each worker holding its shard and a replica of the model and optimizer for
    the whole run. Every step, each worker computes the gradient of its share of the global
    batch with nnkit's kernels, a tree of tasks on the workers sums the gradients (weighted
    by the share's size, so the sum is the gradient of the global batch's mean loss), and
    the driver and every replica step on that sum: the driver receives one gradient a step
    and sends none, whatever W. A worker that gives no result within ``step_timeout``
    (frozen, swapping, partitioned) has its shard recomputed on another worker, which
    keeps it.

``map_experiments(fn, grid, client=None)``
    One task per point of a parameter grid, a progress bar, a table of the results; a point
    whose ``fn`` raises is reported with its parameters and the others finish.

With ``client=None`` a ``LocalCluster`` of worker processes starts on this machine and is
closed at the end; a ``distributed.Client`` (on any cluster: a ``LocalCluster``,
dask-jobqueue's ``SLURMCluster``, a scheduler started by hand) is used as is and never
closed; a string is a scheduler address (``"tcp://10.0.0.5:8786"``).

Examples
--------
>>> import numpy as np
>>> import nnkit as nk
>>> from nnkit.distributed import fit_data_parallel
>>> rng = np.random.default_rng(0)
>>> X, y = rng.standard_normal((256, 8)), rng.integers(0, 3, 256)
>>> model = nk.nn.Sequential(nk.nn.Linear(8, 16), nk.nn.ReLU(), nk.nn.Linear(16, 3))
>>> opt = nk.optim.SGD(model.parameters(), lr=0.1)
>>> model = fit_data_parallel(model, nk.functional.cross_entropy, opt, X, y,
...                           batch_size=64, epochs=2, random_state=0,
...                           progress=False)  # doctest: +SKIP
"""

from __future__ import annotations

import copy
import itertools
import math
import numbers
import os
import statistics
import threading
import time
import traceback
import warnings
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
from tqdm.auto import tqdm

from . import _mpi
from ._mpi import DistributedDataParallel, ReplicaDivergenceError
from ._validation import check_scalar
from .nn.module import Module
from .optim import Optimizer
from .training import minibatches

__all__ = ["fit_data_parallel", "map_experiments", "StepInfo", "ExperimentTable",
           "ExperimentFailure", "DistributedDataParallel", "ReplicaDivergenceError"]

_INSTALL = 'pip install "nnkit[distributed]"'


# ----- dask and the client ----------------------------------------------------------------------
def _require_dask():
    """The ``distributed`` module, or an ImportError that says how to install it."""
    try:
        import distributed
    except ImportError as exc:
        raise ImportError(
            f"nk.distributed needs dask.distributed, which is not installed: {_INSTALL}"
        ) from exc
    return distributed


def _worker_failures(distributed) -> tuple:
    """Exceptions that mean a worker or its data went away (the step can be retried)."""
    from concurrent.futures import CancelledError as FuturesCancelled

    names = ("FutureCancelledError", "FuturesCancelledError", "CancelledError")
    found = [getattr(distributed.client, n) for n in names if hasattr(distributed.client, n)]
    from distributed.comm.core import CommClosedError
    from distributed.scheduler import KilledWorker

    return (KilledWorker, CommClosedError, FuturesCancelled, OSError, TimeoutError, *found)


def _cancellations(distributed) -> tuple:
    """What ``distributed.wait`` raises when one of its futures was cancelled."""
    from concurrent.futures import CancelledError as FuturesCancelled

    names = ("FuturesCancelledError", "FutureCancelledError", "CancelledError")
    found = [getattr(distributed.client, n) for n in names if hasattr(distributed.client, n)]
    return (FuturesCancelled, *found)


def _worker_addresses(client) -> list[str]:
    try:
        info = client.scheduler_info(n_workers=-1)
    except TypeError:  # older distributed: no n_workers argument, every worker listed
        info = client.scheduler_info()
    return sorted(info["workers"])


@contextmanager
def _client_context(client, n_workers, timeout):
    """Yield (a connected Client, numba threads per task or None): ours (closed on exit)
    for None or an address, else ``client`` as it is."""
    distributed = _require_dask()
    if isinstance(client, distributed.Client):
        yield client, None
        return
    if client is None:
        n = n_workers or 2
        # The cores shared out between the worker processes: numba's pool would otherwise
        # start one thread per core in each worker and oversubscribe the machine.
        threads = max(1, (os.cpu_count() or 1) // n)
        with distributed.LocalCluster(
            n_workers=n, threads_per_worker=1, processes=True, dashboard_address=None,
        ) as cluster, distributed.Client(cluster) as ours:
            yield ours, threads
        return
    if isinstance(client, str):
        try:
            ours = distributed.Client(client, timeout=timeout)
        except (OSError, TimeoutError) as exc:
            raise ConnectionError(
                f"could not reach the Dask scheduler at {client!r} within timeout={timeout} s "
                f"({type(exc).__name__}: {exc}); check the address and that the scheduler "
                "is running"
            ) from exc
        with ours:
            yield ours, None
        return
    raise TypeError(
        f"client must be None (start a LocalCluster), a distributed.Client or a scheduler "
        f"address string, got {type(client).__name__}"
    )


# ----- the worker side of data-parallel training ----------------------------------------------
class _ReplicaOutOfStep(RuntimeError):
    """A shard's replica is not at the optimizer step its task expects (a task recomputed
    from lineage after the replica moved on, or bytes that differ from the driver's): the
    step is retried on shards placed again from the driver's model."""


class _Shard:
    """Rows ``X[start:stop]``, ``y[start:stop]`` and a replica of the model with its own
    copy of the optimizer, kept on one worker for the whole run.

    ``version`` counts the optimizer steps applied to the replica. A step's task brings the
    previous step's summed gradient (the root of the reduction tree, fetched from the
    worker that holds it); the replica applies it with the driver's hyper-parameters, the
    same update the driver applies, so the parameters never travel. The lock serialises
    tasks on a worker that runs several threads.
    """

    def __init__(self, X, y, replica, optimizer, version, start, threads=None):
        self.X, self.y, self.start, self.threads = X, y, start, threads
        self.replica, self.optimizer, self.version = replica, optimizer, version
        self.lock = threading.Lock()

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k != "lock"}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.lock = threading.Lock()
        for p in self.replica.parameters():  # deserialised buffers may be read-only
            p.data = np.array(p.data, copy=True)

    def catch_up(self, version, hyper, total) -> None:
        """Bring the replica to ``version`` steps: apply ``total`` (the summed gradients of
        step ``version - 1``, None where no shard had one) with the hyper-parameters
        ``hyper`` (one dict per parameter group) when it is one step behind."""
        if self.version == version:
            return
        if total is None or self.version != version - 1:
            raise _ReplicaOutOfStep(f"a replica {self.version} optimizer steps into the run "
                                    f"got the task of step {version}")
        for group, values in zip(self.optimizer.param_groups, hyper, strict=True):
            group.update(values)
        params = list(self.replica.parameters())
        for p, g in zip(params, total, strict=True):
            p.grad = g
        self.optimizer.step()
        for p in params:
            p.grad = None
        self.version = version

    def gradient(self, version, hyper, total, local_idx, loss_fn, scale, check):
        """(grads scaled by ``scale``, loss * scale, compute seconds, {start: checksums})
        on rows ``local_idx`` after ``catch_up``; the checksums of the parameters (when
        ``check``) let the driver see that the replica holds its bytes."""
        start = time.perf_counter()
        with self.lock:
            if self.threads:  # numba's thread count is per calling thread
                import numba

                numba.set_num_threads(min(self.threads, numba.config.NUMBA_NUM_THREADS))
            self.catch_up(version, hyper, total)
            replica = self.replica
            sums = {self.start: _mpi.checksums(replica.parameters())} if check else {}
            if len(local_idx) == 0:  # no rows of this batch: the update only
                return ([None] * len(list(replica.parameters())), 0.0,
                        time.perf_counter() - start, sums)
            replica.zero_grad()
            loss = loss_fn(replica(self.X[local_idx]), self.y[local_idx])
            loss.backward()
            grads = [None if p.grad is None else np.asarray(p.grad * scale, dtype=p.data.dtype)
                     for p in replica.parameters()]
            replica.zero_grad()
        return grads, float(loss.item()) * scale, time.perf_counter() - start, sums


def _shard_gradient(shard, version, hyper, total, local_idx, loss_fn, scale, check):
    total = None if total is None else total[0]
    return shard.gradient(version, hyper, total, local_idx, loss_fn, scale, check)


def _add_results(a, b):
    """Two shard results (or sums of them) added: gradients (None where neither has one),
    losses, the longest compute seconds, the checksums of both."""
    grads = [g if h is None else h if g is None else g + h for g, h in zip(a[0], b[0],
                                                                          strict=True)]
    return grads, a[1] + b[1], max(a[2], b[2]), {**a[3], **b[3]}


def _private_wait():
    """distributed's coroutine behind ``wait()``, or None where it is gone."""
    import distributed.client

    return getattr(distributed.client, "_wait", None)


async def _gather_within(client, futures, seconds, deadline_passed, cancellations):
    """Run on the client's event loop: wait for ``futures`` (a deadline interrupts only
    this wait, never a gather), then gather them; None if ``seconds`` pass first."""
    try:
        await _private_wait()(futures, timeout=seconds)
    except deadline_passed:
        return None
    except cancellations:  # done too: the gather raises its error
        pass
    return await client.gather(futures, asynchronous=True)


async def _scatter_async(client, shard, worker):
    return await client.scatter(shard, workers=[worker], hash=False, asynchronous=True)


def _keep(value):
    """Return ``value``: the task that copies a shard or a sum to the worker that runs it."""
    return value


def _warm_up(shard, loss_fn):
    """Run one forward/backward on two rows so the first real step compiles nothing
    (numba kernels load from their on-disk cache here); return the seconds it took."""
    start = time.perf_counter()
    shard.gradient(shard.version, None, None, np.arange(min(2, len(shard.X))), loss_fn, 1.0,
                   check=False)
    return time.perf_counter() - start


# ----- the driver ---------------------------------------------------------------------------
@dataclass
class StepInfo:
    """What ``fit_data_parallel`` hands its ``callback`` after each optimizer step.

    ``seconds`` is the driver's wall time of the step (submit, compute, sum, update);
    ``compute_seconds`` the longest worker compute time in it (the replica's update from the
    previous step's sum, forward, backward); the difference is communication, serialisation
    and scheduling. ``message_bytes`` counts what one worker sends and receives: its
    gradient into the reduction tree and the summed gradient back (the driver receives the
    sum once).
    ``step_timeout`` is the deadline the step ran under (seconds) and ``recomputed`` the
    number of shards recomputed on another worker because it passed.
    """

    step: int
    epoch: int
    loss: float
    seconds: float
    compute_seconds: float
    message_bytes: int
    retries: int
    warm_up_seconds: list = field(default_factory=list)
    recomputed: int = 0
    step_timeout: float = math.inf


_STEP_TIMEOUT_FLOOR = 30.0  # seconds: the least an adaptive deadline waits
_STEP_TIMEOUT_FACTOR = 10.0  # the adaptive deadline, in median step times
_STEP_HISTORY = 20  # the steps that median is taken over
_SLOW_LINK = 10e6  # bytes/s: moving a shard adds its bytes / this to a deadline
_CHECK_EVERY = 50  # steps between comparisons of the replicas' checksums with the driver's
# Frames between the driver's entry points (place_shards, step) and the user's call to
# fit_data_parallel (``_start_run`` or ``_optimizer_step``, then fit_data_parallel itself):
# the driver's warnings point at the user's line.
_CALLERS = 2


def _step_deadline(step_timeout, recent, warm_up):
    """Seconds a step waits for a shard's result before recomputing it on another worker.

    ``step_timeout`` when given; else max(30 s, 10 x the median seconds of the last 20
    steps), the warm-ups standing in for the steps before the first one.
    """
    if step_timeout is not None:
        return float(step_timeout)
    history = list(recent) or [s for s in warm_up if math.isfinite(s)]
    if not history:
        return _STEP_TIMEOUT_FLOOR
    return max(_STEP_TIMEOUT_FLOOR, _STEP_TIMEOUT_FACTOR * statistics.median(history))


@dataclass(eq=False)
class _Attempt:
    """One computation of a shard's gradient: its future, its worker, the shard it reads."""

    future: object
    worker: str
    shard: object


class _DataParallel:
    """The driver's state: shard placement, the step loop, its retries and its deadlines."""

    def __init__(self, client, model, optimizer, loss_fn, X, y, n_shards, max_retries, timeout,
                 threads=None, step_timeout=None):
        self.distributed = _require_dask()
        self.failures = (*_worker_failures(self.distributed), _ReplicaOutOfStep)
        self.cancellations = _cancellations(self.distributed)
        self.deadline_passed = (TimeoutError, self.distributed.TimeoutError)
        self.client, self.model, self.optimizer, self.loss_fn = client, model, optimizer, loss_fn
        self.X, self.y = X, y
        self.params = list(model.parameters())
        self.bounds = np.linspace(0, len(X), n_shards + 1).round().astype(np.int64)
        self.max_retries, self.timeout, self.threads = max_retries, timeout, threads
        self.step_timeout = step_timeout
        self.expected_workers = 0
        self.shards: list = []
        self.homes: list = []
        self.version = 0  # optimizer steps the driver has taken in this run
        self.pending = None  # the last step's ({worker: its copy of the sum}, hyper-parameters)
        self.root = None  # (future, worker) of this step's summed results
        self.warm_up_seconds: list = []
        self.suspects: set = set()  # workers that missed a deadline another worker met
        self.recent = deque(maxlen=_STEP_HISTORY)  # seconds of the last steps
        self.last_retries = 0
        self.last_recomputed = 0
        self.last_deadline = math.inf

    def _host_shard(self, k):
        """Shard ``k`` with a replica of the driver's model and optimizer as they are now.

        A replica of its own: workers in this process (threads) keep the shard unpickled,
        and shards sharing one replica would compute on it at the same time.
        """
        a, b = self.bounds[k], self.bounds[k + 1]
        replica, optimizer = copy.deepcopy((self.model, self.optimizer))  # one memo: shared
        replica.zero_grad()
        optimizer._scratch = {}  # work arrays: rebuilt where they are needed
        return _Shard(self.X[a:b], self.y[a:b], replica, optimizer, self.version, int(a),
                      self.threads)

    def _move_seconds(self, k):
        """What moving shard ``k`` adds to a deadline: its bytes over a slow link."""
        a, b = self.bounds[k], self.bounds[k + 1]
        state = sum(v.nbytes for s in self.optimizer.state.values() for v in s.values()
                    if isinstance(v, np.ndarray))
        nbytes = (self.X[a:b].nbytes + self.y[a:b].nbytes + state
                  + sum(p.data.nbytes for p in self.params))
        return nbytes / _SLOW_LINK

    def place_shards(self, stacklevel=_CALLERS + 2):
        """Scatter every shard (rows and a fresh replica) to the live workers that are not
        suspects, round robin, then warm each replica up.

        Both within the deadline: a worker that does not take its shard becomes a suspect
        and the next one is tried; one that does not warm up becomes a suspect and its
        shards move (warm-up seconds NaN).
        """
        client = self.client
        workers = _worker_addresses(client)
        if self.expected_workers and len(workers) < self.expected_workers:
            try:  # a nanny restarts a killed worker within seconds: give it the chance
                client.wait_for_workers(self.expected_workers, timeout=self.timeout)
            except (TimeoutError, OSError):
                client.wait_for_workers(1, timeout=self.timeout)
            workers = _worker_addresses(client)
        self.expected_workers = max(self.expected_workers, len(workers))
        limit = _step_deadline(self.step_timeout, self.recent, [])
        self.shards, self.homes, self.pending = [], [], None  # new replicas: up to date
        for k in range(len(self.bounds) - 1):
            healthy = [w for w in workers if w not in self.suspects] or workers
            first = k % len(healthy)
            for worker in healthy[first:] + healthy[:first]:
                try:
                    self.shards.append(self._scatter(self._host_shard(k), worker,
                                                     limit + self._move_seconds(k)))
                    self.homes.append(worker)
                    break
                except self.deadline_passed:
                    self.suspects.add(worker)
                    warnings.warn(f"data-parallel placement: worker {worker} did not take shard "
                                  f"{k} within step_timeout={limit:g} s; trying another",
                                  RuntimeWarning, stacklevel=stacklevel)
            else:
                raise RuntimeError(
                    f"no worker took shard {k} of the data-parallel run within "
                    f"step_timeout={limit:g} s (tried {healthy}): they are frozen or too slow")
        warm = [client.submit(_warm_up, s, self.loss_fn, pure=False) for s in self.shards]
        self.warm_up_seconds = self._results(warm, limit)
        if self.warm_up_seconds is None:
            self.warm_up_seconds = [f.result() if f.done() else math.nan for f in warm]
            slow = {h for h, t in zip(self.homes, self.warm_up_seconds, strict=True)
                    if math.isnan(t)}
            if slow:
                warnings.warn(f"data-parallel placement: worker(s) {sorted(slow)} did not "
                              f"warm up within step_timeout={limit:g} s; moving their shards",
                              RuntimeWarning, stacklevel=stacklevel)
                self._evacuate(slow)

    def step(self, idx):
        """One synchronous step on global rows ``idx``: (loss, worker compute s, bytes).

        A lost worker (during the step or while re-placing the shards) re-places every
        shard on the live workers and recomputes the step from the same parameters; a shard
        with no result by the deadline is recomputed on another worker.
        """
        self.last_deadline = _step_deadline(self.step_timeout, self.recent,
                                            self.warm_up_seconds)
        self.last_recomputed = 0
        replace = False
        for attempt in range(self.max_retries + 1):
            self.last_retries = attempt
            try:
                if replace:
                    self.place_shards(stacklevel=_CALLERS + 3)
                start = time.perf_counter()
                out = self._try_step(idx)
                self.recent.append(time.perf_counter() - start)
                return out
            except self.failures as exc:
                drift = isinstance(exc, _ReplicaOutOfStep)
                if attempt == self.max_retries:
                    cause = ("replicas were out of step with the driver" if drift else
                             "workers or their data were lost")
                    raise RuntimeError(
                        f"a data-parallel step failed {attempt + 1} time(s) because {cause} "
                        f"(last error: {type(exc).__name__}: {exc}); "
                        f"max_retries={self.max_retries}"
                    ) from exc
                what = f"found that {exc}" if drift else f"lost a worker ({type(exc).__name__})"
                warnings.warn(f"data-parallel step {what}; re-placing the shards from the "
                              "driver's model and retrying the step", RuntimeWarning,
                              stacklevel=_CALLERS + 2)
                replace = True
        raise AssertionError("unreachable")  # pragma: no cover

    def _try_step(self, idx):
        """One attempt at the step on global rows ``idx``: every shard brings its replica up
        to date and computes the gradient of its share, a tree of tasks on the workers sums
        them, the driver fetches the sum alone into the parameters' ``grad`` and steps the
        optimizer; (loss, worker compute s, bytes one worker sends and receives)."""
        rows = self._rows_by_shard(idx)
        check = self.version % _CHECK_EVERY == 0
        update = (self.version, *(self.pending or (None, None)), check)  # copies, hyper
        tries = {k: [self._attempt(self.shards[k], self.homes[k], update, local, len(idx),
                                   pinned=False)]
                 for k, local in rows.items()}
        grads, loss, compute, sums = self._step_sum(tries, rows, update, len(idx))
        if check:
            self._check_replicas(sums)
        for p, g in zip(self.params, grads, strict=True):
            p.grad = None if g is None else np.require(g, requirements="W")
        hyper = [{k: v for k, v in g.items() if k != "params"}
                 for g in self.optimizer.param_groups]
        self.optimizer.step()
        self.version += 1
        self.pending = (self._broadcast(*self.root), hyper)
        nbytes = 2 * sum(p.grad.nbytes for p in self.params if p.grad is not None)
        return loss, compute, nbytes

    def _rows_by_shard(self, idx) -> dict:
        """{shard: its rows of the batch ``idx``, as indices into the shard}, for every
        shard: one without rows still applies the last step's update."""
        owner = np.searchsorted(self.bounds, idx, side="right") - 1  # shard of each row
        return {k: idx[owner == k] - self.bounds[k] for k in range(len(self.shards))}

    def _step_sum(self, tries, rows, update, batch) -> tuple:
        """The sum of every shard's result (grads, loss, seconds, checksums) over a tree of
        tasks on the workers: the first attempts', or once the deadline has passed, the first
        of each shard's recomputations. Its future is kept in ``self.root``: the next step's
        tasks fetch it from the worker that holds it."""
        self.root = self._reduce([tries[k][0] for k in sorted(tries)])
        total = self._results([self.root[0]], self.last_deadline)
        if total is None:  # the deadline passed: recompute the missing shards elsewhere
            self.root[0].release()
            won = self._first_results(tries, rows, update, batch)
            self.root = self._reduce([won[k] for k in sorted(won)])
            total = self.client.gather([self.root[0]])
        return total[0]

    def _reduce(self, attempts) -> tuple:
        """(future, worker) of the shard results summed pairwise in shard order, each sum on
        the worker of its left operand (a fixed order and placement, whichever worker
        computed a shard): the gradients travel between workers, not through the driver."""
        level = [(a.future, a.worker) for a in attempts]
        while len(level) > 1:
            pairs = [level[i:i + 2] for i in range(0, len(level), 2)]
            level = [pair[0] if len(pair) == 1 else
                     (self.client.submit(_add_results, pair[0][0], pair[1][0], pure=False,
                                         workers=[pair[0][1]], allow_other_workers=True),
                      pair[0][1]) for pair in pairs]
        return level[0]

    def _broadcast(self, root, holder) -> dict:
        """{worker: the future its next tasks fetch the sum from}, None for any other worker.

        A binary tree: each round, every worker holding a copy passes one to a worker
        without, until the holders are at least half of the shards' workers; the rest fetch
        from a holder as their task starts. Every link carries the sum at most once a
        round, ~log2(W) rounds, instead of W - 1 fetches from the root's worker.
        """
        holders, copies = [holder], {None: root, holder: root}
        waiting = [w for w in dict.fromkeys(self.homes) if w != holder]
        while len(waiting) > len(holders):
            targets, waiting = waiting[:len(holders)], waiting[len(holders):]
            for source, target in zip(list(holders), targets, strict=True):
                copies[target] = self.client.submit(_keep, copies[source], workers=[target],
                                                    allow_other_workers=True, pure=False)
                holders.append(target)
        for i, worker in enumerate(waiting):
            copies[worker] = copies[holders[i % len(holders)]]
        return copies

    def _check_replicas(self, sums) -> None:
        """Raise _ReplicaOutOfStep if a replica's parameter bytes differ from the driver's
        (an optimizer step that rounds differently on another machine): the step is retried
        on replicas copied from the driver."""
        want = _mpi.checksums(self.params)
        for k, start in enumerate(self.bounds[:-1]):
            if sums[int(start)] != want:
                raise _ReplicaOutOfStep(
                    f"the replica of shard {k} on {self.homes[k]} differs from the driver's "
                    f"parameters after {self.version} steps")

    def _attempt(self, shard, worker, update, local, batch, pinned):
        # unpinned: on the shard's worker while it lives, elsewhere if the data moves
        version, copies, hyper, check = update
        total = None if copies is None else copies.get(worker, copies[None])
        future = self.client.submit(
            _shard_gradient, shard, version, hyper, total, local, self.loss_fn,
            len(local) / batch, check, pure=False, workers=[worker],
            allow_other_workers=not pinned)
        return _Attempt(future, worker, shard)

    def _first_results(self, tries, rows, update, batch):
        """The first finished attempt of every shard in ``tries`` (shard -> attempts), once
        the step's first deadline has passed.

        A shard with none when a deadline passes gets one more attempt, on a worker that has
        not tried it, from the driver's copy of its rows; the first result wins and the
        others are never read. After max_retries + 1 deadlines without one, RuntimeError.
        """
        limit = self.last_deadline
        tried = {k: {a.worker for a in t} for k, t in tries.items()}
        won, rounds, due, recomputed = {}, 0, time.monotonic(), set()  # the first one passed
        while True:
            for k, t in tries.items():
                if k not in won and (first := self._finished(t)) is not None:
                    won[k] = first
            pending = [k for k in tries if k not in won]
            if not pending:
                break
            left = due - time.monotonic()
            if left > 0:
                self._wait([a.future for k in pending for a in tries[k]], left)
                continue
            rounds += 1
            if rounds > self.max_retries:
                workers = sorted({w for k in pending for w in tried[k]})
                raise RuntimeError(
                    f"no result for shard(s) {pending} of a data-parallel step within "
                    f"{rounds} x step_timeout={limit:g} s from worker(s) {workers}: they are "
                    f"frozen or too slow (max_retries={self.max_retries}); if steps "
                    "legitimately take this long, raise step_timeout")
            extra = 0.0  # the new copies' rows travel with their tasks
            for k in pending:
                worker = self._pick(exclude=tried[k])
                if worker is None:
                    continue  # nowhere else to go: wait another deadline
                extra = max(extra, self._move_seconds(k))
                tried[k].add(worker)
                tries[k].append(self._attempt(self._relocated(k, worker), worker, update,
                                              rows[k], batch, pinned=True))
                recomputed.add(k)
                warnings.warn(f"data-parallel step: no result for shard {k} within "
                              f"step_timeout={limit:g} s (worker {self.homes[k]}); "
                              f"recomputing it on {worker} (the first result counts)",
                              RuntimeWarning, stacklevel=_CALLERS + 5)
            due = time.monotonic() + limit + extra
        self.last_recomputed += len(recomputed)
        self._adopt(won, tries)
        return won

    def _finished(self, tries):
        """The first finished attempt, or None. A failed attempt is dropped while another
        runs; the last one raises its error (a lost worker: the step is retried; an error
        of the task: as it is)."""
        for a in tries:
            if a.future.status == "finished":
                return a
        for a in [a for a in tries if a.future.done()]:
            if len(tries) == 1:
                a.future.result()  # raises
            try:
                a.future.result()
            except self.failures:
                tries.remove(a)
        return None

    def _scatter(self, shard, worker, seconds):
        """``shard`` scattered to ``worker``; TimeoutError after ``seconds`` (a scatter waits
        for the worker's answer; if a frozen worker resumes, the copy it then takes stays
        on it until the client closes)."""
        if math.isinf(seconds):
            return self.client.scatter(shard, workers=[worker], hash=False)
        return self.client.sync(_scatter_async, self.client, shard, worker,
                                callback_timeout=seconds)

    def _results(self, futures, seconds):
        """``client.gather(futures)``, or None if they are not all done within ``seconds``
        (then nothing is gathered and the futures live on).

        One trip to the client's event loop, as a plain gather: distributed's private
        ``_wait`` coroutine, then the gather (no measurable cost over a plain gather). A
        public ``wait()`` and then ``gather()`` cost a second trip each step
        (benchmarks/RESULTS.md, "Figures moved from docstrings"); that is the fallback if
        ``_wait`` goes away.
        """
        if _private_wait() is None or math.isinf(seconds):
            if not self._wait(futures, seconds, every=True):
                return None
            return self.client.gather(futures)
        return self.client.sync(_gather_within, self.client, futures, seconds,
                                self.deadline_passed, self.cancellations)

    def _wait(self, futures, seconds, every=False):
        """Block until one of ``futures`` is done (with ``every``, all of them) or
        ``seconds`` pass: False if they passed. The caller reads the futures' states."""
        with self.client.as_current():  # wait() works on the current client's futures
            try:
                self.distributed.wait(futures, timeout=None if math.isinf(seconds) else seconds,
                                      return_when="ALL_COMPLETED" if every else
                                      "FIRST_COMPLETED")
            except self.deadline_passed:
                return False
            except self.cancellations:  # a cancelled future is done too
                pass
        return True

    def _pick(self, exclude):
        """The live worker outside ``exclude`` holding the fewest shards, suspects last;
        None if there is none."""
        live = [w for w in _worker_addresses(self.client) if w not in exclude]
        if not live:
            return None
        load = {w: self.homes.count(w) for w in live}
        return min(live, key=lambda w: (w in self.suspects, load[w], w))

    def _relocated(self, k, worker):
        """Shard ``k`` rebuilt on ``worker`` from the driver's rows, by a task: a scatter
        waits for the worker's answer, so a frozen target would block the driver; the task
        is submitted without waiting and missed deadlines catch a frozen target."""
        import dask

        with dask.config.set({"distributed.admin.large-graph-warning-threshold": 2**62}):
            return self.client.submit(_keep, self._host_shard(k), workers=[worker],
                                      allow_other_workers=False, pure=False)

    def _adopt(self, won, tries):
        """Keep every shard where its result came from and release the other attempts.

        A shard whose first attempt lost to another worker stays on that worker; the slow
        worker becomes a suspect (no shards while others are live) and its other shards
        move too. Released futures are never read: a late result does not count.
        """
        slow = set()
        for k, winner in won.items():
            for a in tries[k]:
                if a is not winner:
                    a.future.release()
                    if a.shard is not self.shards[k] and a.shard is not winner.shard:
                        a.shard.release()  # a relocated copy that lost
            if winner.shard is not self.shards[k]:
                slow.add(self.homes[k])
                self.shards[k].release()
                self.shards[k], self.homes[k] = winner.shard, winner.worker
        self._evacuate(slow)

    def _evacuate(self, slow):
        """Make the workers in ``slow`` suspects and move their shards to other workers."""
        self.suspects |= slow
        for j, home in enumerate(self.homes):
            if home in slow and (worker := self._pick(exclude=slow)) is not None:
                self.shards[j].release()
                self.shards[j], self.homes[j] = self._relocated(j, worker), worker


def _check_data(X, y):
    X, y = np.asarray(X), np.asarray(y)
    if X.ndim < 1 or len(X) == 0:
        raise ValueError(f"X must be an array with at least one row, got shape {X.shape}")
    if y.ndim < 1 or len(y) != len(X):
        raise ValueError(f"y must have one entry per row of X ({len(X)}), got shape {y.shape}")
    return X, y


def _check_fit_args(model, loss_fn, optimizer, callback):
    if not isinstance(model, Module):
        raise TypeError(f"model must be an nnkit nn.Module, got {type(model).__name__}")
    if not callable(loss_fn):
        raise TypeError(f"loss_fn must be callable (pred, target) -> scalar Tensor, got "
                        f"{type(loss_fn).__name__}")
    if not isinstance(optimizer, Optimizer):
        raise TypeError(f"optimizer must be an nk.optim optimizer, got "
                        f"{type(optimizer).__name__}")
    owned = {id(p) for p in model.parameters()}
    foreign = [p for g in optimizer.param_groups for p in g["params"] if id(p) not in owned]
    if foreign:
        raise ValueError(f"optimizer updates {len(foreign)} tensor(s) that are not parameters "
                         "of model; build it from model.parameters()")
    if callback is not None and not callable(callback):
        raise TypeError(f"callback must be callable(StepInfo) or None, got "
                        f"{type(callback).__name__}")


def fit_data_parallel(model, loss_fn, optimizer, X, y, batch_size, epochs, client=None, *,
                      shuffle=True, random_state=None, n_workers=None, max_retries=3,
                      timeout=10.0, step_timeout=None, worker_threads=None, callback=None,
                      progress=True, backend="dask", comm=None, checkpoint=None,
                      checkpoint_every=None):
    """Train ``model`` in place by synchronous data-parallel SGD on a Dask cluster or on
    the ranks of an MPI job (``backend="mpi"``).

    The global batch schedule is a single process's: ``rng = np.random.default_rng(
    random_state)``, then for each epoch ``for idx in minibatches(N, batch_size, shuffle,
    rng)``. The N rows are split into W contiguous shards (one per worker of the cluster,
    or ``n_workers``), each scattered once to a worker together with a replica of the model
    and of the optimizer (its state included). Each step, the worker with n_k of the B rows
    returns (n_k / B) times the gradient of its rows' mean loss, so the sum over workers is
    the gradient of the batch's mean loss

        g = sum_k (n_k / B) grad L_k = grad (1/B) sum_{i in batch} loss_i .

    The shards' results are summed pairwise in shard order by tasks on the workers (a
    fixed order, whichever worker computed a shard); the driver fetches the sum and calls
    ``optimizer.step()``, and every replica applies the same step to the same sum with the
    driver's hyper-parameters (a learning rate changed in ``callback`` reaches them) at the
    start of its next task. The parameters never travel after placement: the driver's
    traffic per step is one gradient in, whatever the number of workers. Every 50 steps
    the replicas' checksums are compared with the driver's parameters; a replica that
    differs (an update rounded differently on another machine) is replaced by a copy of
    the driver's and the step recomputed. Up to float rounding of the split sum, the
    result equals single-process training on the same batches.

    A step whose workers or data are lost (a killed worker, a closed connection) is
    retried: the shards, with replicas of the driver's model and optimizer, are scattered
    again to the live workers and the same step is recomputed from unchanged parameters, so
    the result is the same as without the failure.

    A worker that stops answering without dying (stopped by SIGSTOP, swapping, behind a
    broken network) would stall the step until Dask's ``worker-ttl`` (5 minutes by default)
    removes it. Instead, a shard with no result ``step_timeout`` seconds after the step's
    submission is recomputed on another worker (the one holding the fewest shards) from the
    driver's copy of its rows and a replica of the driver's model: the same rows,
    parameters and scale, so the same gradient, summed in the same order. The first result
    of each shard counts and the others are released unread, so the frozen worker's
    result, if it resumes, is ignored. When the copy wins, the shard stays there, the slow
    worker gets no shards for the rest of the call (while other workers are live) and its
    other shards move too: one frozen worker costs one deadline, not one per step. After
    ``max_retries + 1`` deadlines with no result for a shard (every worker frozen), a
    RuntimeError. Placing the shards (at the start, and after
    a lost worker) has the same deadline: a worker that does not take its shard or warm up
    in time gets none. A deadline that includes moving a shard (a scatter, a recomputation
    elsewhere) grows by one second per 10 MB of it.

    Parameters
    ----------
    model : nn.Module
        Trained in place; must be picklable (cloudpickle). Deterministic forward passes
        (no dropout) reproduce single-process training; buffers are not synchronised.
    loss_fn : callable (pred Tensor (B_k, ...), target array (B_k, ...)) -> scalar Tensor
        With mean reduction over the rows (e.g. ``nk.functional.cross_entropy``).
    optimizer : nk.optim.Optimizer
        Built on ``model.parameters()``; it steps on the driver and a copy of it on each
        worker (picklable, as the model).
    X : array (N, ...) ; y : array (N, ...)
    batch_size : int >= 1
    epochs : int >= 1
    client : None, distributed.Client or str
        None starts a LocalCluster of ``n_workers`` (2 by default) single-thread worker
        processes and closes it at the end; a Client is used and left open; a string is a
        scheduler address (ConnectionError if not reachable within ``timeout``).
    shuffle : bool
    random_state : int, Generator or None
    n_workers : int >= 1, optional
        Workers of the local cluster, and the number of shards (default: the workers).
    max_retries : int >= 0
        Retries of one step after lost workers before a RuntimeError; also the deadlines
        one shard may miss after the first before a RuntimeError.
    timeout : float > 0
        Seconds to connect to an address, and to wait for restarted workers.
    step_timeout : float > 0, math.inf or None
        Seconds a step waits for a shard before recomputing it on another worker. None
        (default): adaptive, ``max(30, 10 * median)`` of the last 20 steps' seconds (of the
        warm-ups before the first step): a frozen worker costs 30 s once on fast steps,
        and only a shard ten times slower than the usual step sets off a recomputation
        (its first result counts either way). ``math.inf``: wait as before this option,
        until Dask's ``worker-ttl`` drops the worker. ``StepInfo.step_timeout`` reports the
        deadline each step ran under.
    worker_threads : int >= 1, optional
        Numba threads of each gradient task. Default: the cores divided by the workers on
        the local cluster; a given Client's workers keep their own setting.
    callback : callable(StepInfo), optional
        Called after every optimizer step.
    progress : bool
        A tqdm bar over the steps (on MPI, rank 0's only).
    backend : {"dask", "mpi"}
        "mpi": the script runs on every rank (``mpiexec -n N python train.py``, ``srun``)
        and makes this same call; each rank keeps a replica and uses only the rows of its
        contiguous shard (rank r of N: ``np.array_split(range(len(X)), N)[r]``), and the
        gradients are all-reduced between ranks (``DistributedDataParallel``), each rank
        stepping its own optimizer on the same summed gradient. ``client``, ``n_workers``,
        ``max_retries``, ``timeout``, ``step_timeout`` and ``worker_threads`` are Dask's
        and must stay unset. A rank that dies ends the job (MPI's fail-fast): rerun from a
        checkpoint.
    comm : mpi4py communicator, optional
        With ``backend="mpi"``: ``MPI.COMM_WORLD`` when None. The batch schedule is the
        same on every rank: ``random_state=None`` takes rank 0's fresh seed.
    checkpoint : str or path, optional
        A file that ``nk.save`` writes atomically (on MPI, rank 0 alone) every
        ``checkpoint_every`` steps and after the last: the model's and the optimizer's
        state, the steps done and the seed of the batch schedule. If the file exists when
        the call starts, training resumes from it: the same schedule (rows, batch_size,
        epochs and shuffle must match) continues at the next step, on any number of
        workers or ranks (on MPI every rank reads the file). ``random_state`` must then be
        an int or None.
    checkpoint_every : int >= 1, optional
        Steps between checkpoints (None: only after the last step).

    Returns
    -------
    model : nn.Module
        The same object, trained.
    """
    _check_fit_args(model, loss_fn, optimizer, callback)
    X, y = _check_data(X, y)
    batch_size, epochs = _check_schedule(batch_size, epochs)
    total_steps = epochs * math.ceil(len(X) / batch_size)
    backend = _check_backend(backend, comm, client=client, n_workers=n_workers,
                             max_retries=max_retries, timeout=timeout,
                             step_timeout=step_timeout, worker_threads=worker_threads)
    writer = backend == "dask" or _mpi.rank_of(comm) == 0
    ckpt = _Checkpoint(checkpoint, checkpoint_every, [len(X), batch_size, epochs,
                                                      bool(shuffle)], writer)
    done, saved_seed = ckpt.load(model, optimizer)
    rng, seed = _schedule_seed(random_state, checkpoint, saved_seed, comm, backend)
    steps = itertools.islice(enumerate(_batches(len(X), batch_size, epochs, shuffle, rng)),
                             done, None)

    def after_step(step):
        ckpt.after_step(step + 1, total_steps, model, optimizer, seed)

    if backend == "mpi":
        return _mpi.fit(model, loss_fn, optimizer, X, y, steps, (done, total_steps),
                        comm=comm, callback=callback, progress=progress, step_info=StepInfo,
                        progress_bar=_progress_bar, report=_report, after_step=after_step)
    _check_cluster_options(n_workers, max_retries, timeout, step_timeout, worker_threads)
    with _client_context(client, n_workers, timeout) as (cl, threads):
        run = _start_run(cl, model, optimizer, loss_fn, X, y, n_workers, max_retries,
                         timeout, worker_threads or threads, step_timeout)
        with _progress_bar(total_steps, progress, done) as bar:
            for step, (epoch, idx) in steps:
                info = _optimizer_step(run, optimizer, idx, step, epoch)
                after_step(step)
                _report(info, bar, callback)
    return model


_DASK_DEFAULTS = {"client": None, "n_workers": None, "max_retries": 3, "timeout": 10.0,
                  "step_timeout": None, "worker_threads": None}


def _check_backend(backend, comm, **dask_options) -> str:
    """``backend``, checked: "dask" takes no ``comm``, "mpi" none of the Dask options given
    (each must keep its default, ``_DASK_DEFAULTS``)."""
    if backend not in ("dask", "mpi"):
        raise ValueError(f"backend must be 'dask' or 'mpi', got {backend!r}")
    if backend == "dask":
        if comm is not None:
            raise ValueError("comm is for backend='mpi'; the Dask backend takes a client")
        return backend
    changed = sorted(k for k, v in dask_options.items() if v != _DASK_DEFAULTS[k])
    if changed:
        raise ValueError(f"{', '.join(changed)}: options of the Dask backend, not of "
                         "backend='mpi'")
    return backend


def _check_schedule(batch_size, epochs) -> tuple[int, int]:
    """(batch_size, epochs), both ints >= 1, or a TypeError/ValueError naming the argument."""
    return (check_scalar(batch_size, name="batch_size", kind=numbers.Integral, low=1),
            check_scalar(epochs, name="epochs", kind=numbers.Integral, low=1))


def _check_cluster_options(n_workers, max_retries, timeout, step_timeout, worker_threads):
    """Raise a TypeError/ValueError naming the first of the cluster options out of range."""
    if n_workers is not None:
        check_scalar(n_workers, name="n_workers", kind=numbers.Integral, low=1)
    check_scalar(max_retries, name="max_retries", kind=numbers.Integral, low=0)
    check_scalar(timeout, name="timeout", low=0, low_inclusive=False)
    if step_timeout is not None and step_timeout != math.inf:
        check_scalar(step_timeout, name="step_timeout", low=0, low_inclusive=False)
    if worker_threads is not None:
        check_scalar(worker_threads, name="worker_threads", kind=numbers.Integral, low=1)


def _start_run(client, model, optimizer, loss_fn, X, y, n_workers, max_retries, timeout,
               threads, step_timeout) -> _DataParallel:
    """The driver, its shards placed and warmed up: one shard per worker of ``client`` (or
    ``n_workers``), at most one per row."""
    shards = n_workers or len(_worker_addresses(client)) or 1
    run = _DataParallel(client, model, optimizer, loss_fn, X, y, min(shards, len(X)),
                        max_retries, timeout, threads, step_timeout)
    run.place_shards()
    return run


class _Checkpoint:
    """``fit_data_parallel``'s checkpoint file: the model's and the optimizer's state dicts,
    the steps done, the seed of the batch schedule and the schedule's shape, written with
    ``nk.save`` (atomically) every ``every`` steps and after the last, by one process only
    (the Dask driver, MPI's rank 0); read back by every process to resume."""

    def __init__(self, path, every, schedule: list, writer: bool):
        self.path = None if path is None else os.fspath(path)
        self.every = None if every is None else check_scalar(
            every, name="checkpoint_every", kind=numbers.Integral, low=1)
        self.schedule, self.writer = schedule, writer

    def load(self, model, optimizer) -> tuple[int, int | None]:
        """(steps done, seed) from an existing file, its states loaded into ``model`` and
        ``optimizer``; (0, None) when there is none."""
        if self.path is None or not os.path.exists(self.path):
            return 0, None
        from .persistence import load

        saved = load(self.path)
        if not isinstance(saved, dict) or set(saved) != _CHECKPOINT_KEYS:
            raise ValueError(f"checkpoint {self.path!r} is not a fit_data_parallel checkpoint")
        if list(saved["schedule"]) != self.schedule:
            raise ValueError(
                f"checkpoint {self.path!r} is of another schedule: (rows, batch_size, epochs, "
                f"shuffle) = {list(saved['schedule'])}, this call's {self.schedule}")
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        return int(saved["step"]), int(saved["seed"])

    def after_step(self, done, total, model, optimizer, seed) -> None:
        """Write the file after ``done`` steps when it is due."""
        if self.path is None or not self.writer or not (
                done == total or (self.every and done % self.every == 0)):
            return
        from .persistence import save

        save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": done,
              "seed": seed, "schedule": self.schedule}, self.path)


_CHECKPOINT_KEYS = {"model", "optimizer", "step", "seed", "schedule"}


def _schedule_seed(random_state, checkpoint, saved_seed, comm, backend):
    """The batch schedule's generator and, when checkpointing, its seed (an int, kept in the
    file so a resumed run replays the same batches)."""
    if saved_seed is not None:
        return np.random.default_rng(saved_seed), saved_seed
    if checkpoint is None:
        if backend == "mpi":
            return _mpi.shared_rng(random_state, comm), None
        return np.random.default_rng(random_state), None
    if random_state is None:
        seed = _mpi.shared_seed(comm) if backend == "mpi" else np.random.SeedSequence().entropy
        return np.random.default_rng(seed), seed
    if not isinstance(random_state, numbers.Integral):
        raise TypeError("random_state must be an int or None with a checkpoint (its seed is "
                        f"saved to replay the batches), got {type(random_state).__name__}")
    return np.random.default_rng(int(random_state)), int(random_state)


def _batches(n, batch_size, epochs, shuffle, rng):
    """(epoch, row indices) of every step: a single process's schedule, ``minibatches`` of
    the ``n`` rows epoch after epoch."""
    for epoch in range(epochs):
        for idx in minibatches(n, batch_size, shuffle, rng):
            yield epoch, idx


def _optimizer_step(run, optimizer, idx, step, epoch) -> StepInfo:
    """One step on global rows ``idx``: the shards' gradients summed into the parameters,
    then ``optimizer.step()`` on the driver; what happened, as a StepInfo."""
    start = time.perf_counter()
    optimizer.zero_grad()
    loss, compute, nbytes = run.step(idx)
    return StepInfo(step, epoch, loss, time.perf_counter() - start, compute, nbytes,
                    run.last_retries, list(run.warm_up_seconds), run.last_recomputed,
                    run.last_deadline)


def _progress_bar(total, enabled, done=0):
    return tqdm(total=total, initial=done, desc="data-parallel", unit="step",
                disable=not enabled)


def _report(info, bar, callback) -> None:
    """A step's progress: the bar advanced with its loss, then ``callback(info)``."""
    bar.update()
    bar.set_postfix(loss=f"{info.loss:.4f}")
    if callback is not None:
        callback(info)


# ----- experiment grids -----------------------------------------------------------------------
@dataclass
class ExperimentFailure:
    """A grid point whose function raised: its parameters, the error and the traceback."""

    params: dict
    error: str
    traceback: str = ""


class ExperimentTable:
    """Results of ``map_experiments``: one row per successful point, in grid order.

    Attributes
    ----------
    rows : list of dict
        The point's parameters merged with its result (a dict's items, or ``'result'``).
    failures : list of ExperimentFailure
        Points whose function raised (or whose worker was lost), in grid order.
    """

    def __init__(self, rows, failures):
        self.rows, self.failures = list(rows), list(failures)

    @property
    def columns(self) -> list[str]:
        return list(dict.fromkeys(k for r in self.rows for k in r))

    def column(self, name) -> np.ndarray:
        """The values of column ``name`` over the rows (missing entries are None)."""
        if name not in self.columns:
            raise KeyError(f"no column {name!r}; the columns are {self.columns}")
        return np.array([r.get(name) for r in self.rows])

    def __len__(self):
        return len(self.rows)

    def __iter__(self):
        return iter(self.rows)

    def __repr__(self):
        return (f"ExperimentTable({len(self.rows)} rows, {len(self.failures)} failures, "
                f"columns={self.columns})")

    def to_markdown(self, floatfmt: str = ".4g") -> str:
        """A Markdown table of the rows, then one line per failure."""
        cols = self.columns

        def cell(v):
            if isinstance(v, (float, np.floating)):
                return format(float(v), floatfmt)
            return "" if v is None else str(v)

        lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        lines += ["| " + " | ".join(cell(r.get(c)) for c in cols) + " |" for r in self.rows]
        lines += [f"\nfailed: {f.params}: {f.error}" for f in self.failures]
        return "\n".join(lines)


def _grid_points(grid) -> list[dict]:
    """The points of ``grid``: a dict of lists (cartesian product, last key fastest) or a
    list of dicts (as given)."""
    if isinstance(grid, dict):
        if not grid:
            raise ValueError("grid is empty: give a dict of non-empty lists or a list of dicts")
        for key, values in grid.items():
            if isinstance(values, (str, bytes, dict)) or not hasattr(values, "__iter__"):
                raise TypeError(f"grid[{key!r}] must be a list of values, got "
                                f"{type(values).__name__} ({values!r})")
        values = [list(v) for v in grid.values()]
        for key, v in zip(grid, values, strict=True):
            if not v:
                raise ValueError(f"grid[{key!r}] is an empty list: every parameter needs "
                                 "at least one value")
        return [dict(zip(grid, combo, strict=True)) for combo in itertools.product(*values)]
    if isinstance(grid, (list, tuple)):
        if not grid:
            raise ValueError("grid is empty: give a dict of non-empty lists or a list of dicts")
        bad = [type(p).__name__ for p in grid if not isinstance(p, dict)]
        if bad:
            raise TypeError(f"a grid given as a list must hold dicts of parameters, got "
                            f"{bad[0]}")
        return [dict(p) for p in grid]
    raise TypeError(f"grid must be a dict of lists or a list of dicts, got "
                    f"{type(grid).__name__}")


def _run_point(fn, params):
    """Call ``fn(**params)`` on a worker; errors come back as values, not task failures."""
    try:
        return True, fn(**params), ""
    except Exception as exc:  # noqa: BLE001 - reported with the point's parameters
        return False, f"{type(exc).__name__}: {exc}", traceback.format_exc()


def _as_row(params, value) -> dict:
    row = dict(params)
    items = value.items() if isinstance(value, dict) else [("result", value)]
    for key, v in items:
        row[f"{key}_result" if key in params else key] = v
    return row


def map_experiments(fn, grid, client=None, *, progress=True, n_workers=None, timeout=10.0,
                    backend="dask", comm=None):
    """Run ``fn(**point)`` for every point of ``grid`` on a Dask cluster or on the ranks of
    an MPI job; gather a table.

    Parameters
    ----------
    fn : callable(**params) -> dict or value
        Picklable by cloudpickle (lambdas and closures are). A dict result becomes columns
        (a key equal to a parameter's name is renamed ``<key>_result``); anything else the
        column ``'result'``.
    grid : dict of lists, or list of dicts
        A dict gives the cartesian product in ``itertools.product`` order over the keys in
        insertion order (the last key varies fastest); a list gives its points as they are.
    client : None, distributed.Client or str
        As in ``fit_data_parallel``.
    progress : bool
        A tqdm bar that advances as points complete (in any order).
    n_workers : int, optional
        Workers of the local cluster when ``client`` is None.
    timeout : float
        Seconds to connect to a scheduler address.
    backend : {"dask", "mpi"}
        "mpi": every rank makes this call; point i runs on rank i mod N (a static split)
        and every rank returns the whole table. ``client`` and ``n_workers`` must stay
        unset; results travel between ranks by pickle.
    comm : mpi4py communicator, optional
        With ``backend="mpi"``: ``MPI.COMM_WORLD`` when None.

    Returns
    -------
    ExperimentTable
        ``rows`` in grid order; ``failures`` for points that raised, each with its
        parameters, also announced by a RuntimeWarning. If every point fails, a
        RuntimeError with the first failure's parameters and traceback.

    Examples
    --------
    >>> table = map_experiments(lambda a, b: {"sum": a + b}, {"a": [1, 2], "b": [10]},
    ...                         progress=False)  # doctest: +SKIP
    >>> table.rows  # doctest: +SKIP
    [{'a': 1, 'b': 10, 'sum': 11}, {'a': 2, 'b': 10, 'sum': 12}]
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable(**params), got {type(fn).__name__} ({fn!r})")
    points = _grid_points(grid)
    if _check_backend(backend, comm, client=client, n_workers=n_workers,
                      timeout=timeout) == "mpi":
        outcomes = _mpi.map_points(
            _run_point, fn, points, comm=comm, progress=progress,
            progress_bar=lambda total, enabled: tqdm(total=total, desc="experiments",
                                                     unit="point", disable=not enabled))
        return _table(points, outcomes)
    distributed = _require_dask()
    import cloudpickle

    try:
        cloudpickle.dumps(fn)
    except Exception as exc:  # noqa: BLE001 - any pickling error means the same thing
        raise TypeError(f"fn must be picklable by cloudpickle to run on workers: "
                        f"{type(exc).__name__}: {exc}") from exc
    with _client_context(client, n_workers, timeout) as (cl, _):
        futures = [cl.submit(_run_point, fn, p, pure=False) for p in points]
        position = {f.key: i for i, f in enumerate(futures)}
        outcomes = [None] * len(points)
        bar = tqdm(total=len(points), desc="experiments", unit="point", disable=not progress)
        with bar:
            for future in distributed.as_completed(futures):
                i = position[future.key]
                try:
                    outcomes[i] = future.result()
                except Exception as exc:  # noqa: BLE001 - a lost worker, not fn's error
                    outcomes[i] = (False, f"{type(exc).__name__}: {exc}", "")
                bar.update()
    return _table(points, outcomes)


def _table(points, outcomes) -> ExperimentTable:
    rows, failures = [], []
    for params, (ok, value, tb) in zip(points, outcomes, strict=True):
        if ok:
            rows.append(_as_row(params, value))
        else:
            failures.append(ExperimentFailure(params, value, tb))
            warnings.warn(f"experiment {params} failed: {value}", RuntimeWarning, stacklevel=3)
    if not rows:
        first = failures[0]
        raise RuntimeError(f"all {len(failures)} experiments failed; the first, {first.params}, "
                           f"with {first.error}\n{first.traceback}")
    return ExperimentTable(rows, failures)
