"""Synchronous data parallelism over MPI: ``nk.distributed.DistributedDataParallel``.

Each rank (``mpiexec -n N python train.py``, or ``srun python train.py``) holds a replica of
the model and computes the gradient of its share of every global batch; the gradients are
summed across ranks in flat buckets (a few messages, not one per parameter), each rank's
weighted by its share's size, so every rank ends with the gradient of the global batch's
mean loss and its optimizer takes the same step. mpi4py is imported only here, and only
when a communicator is needed (the ``mpi`` extra, ``pip install "nnkit[mpi]"``).
"""

from __future__ import annotations

import contextlib
import numbers
import sys
import time
import weakref
import zlib
from dataclasses import dataclass, field

import numpy as np

from ._backend import is_gpu_array
from ._random import set_rng
from ._validation import check_bool, check_scalar
from .nn.module import Module

__all__ = ["DistributedDataParallel", "ReplicaDivergenceError"]

_DEFAULT_BUCKET_BYTES = 25 << 20  # torch DDP's bucket_cap_mb default


class ReplicaDivergenceError(RuntimeError):
    """The ranks' copies of a parameter differ (raised on every rank alike)."""


def _world():
    try:
        from mpi4py import MPI
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ImportError('DistributedDataParallel needs mpi4py: pip install "nnkit[mpi]"'
                          ) from exc
    return MPI.COMM_WORLD


def _abort_on_uncaught_exception(comm) -> None:
    """Make an uncaught exception on this rank end the whole job at once (``MPI_Abort``,
    after the traceback, prefixed with the rank) instead of leaving the other ranks waiting
    in an all-reduce forever; what ``python -m mpi4py`` does, installed once per process."""
    if getattr(sys.excepthook, "_nnkit_mpi_abort", False):
        return
    previous, rank = sys.excepthook, comm.Get_rank()

    def hook(kind, value, tb):
        sys.stderr.write(f"nnkit: rank {rank} of {comm.Get_size()} failed; aborting the job\n")
        previous(kind, value, tb)
        sys.stderr.flush()
        time.sleep(0.5)  # let mpiexec forward the traceback before the abort kills its relay
        comm.Abort(1)

    hook._nnkit_mpi_abort = True
    sys.excepthook = hook


def _check_comm(comm):
    for name in ("Get_rank", "Get_size", "Allreduce", "Bcast", "allgather"):
        if not callable(getattr(comm, name, None)):
            raise TypeError(f"comm must be an mpi4py communicator (with {name}), got "
                            f"{type(comm).__name__}")
    return comm


@dataclass
class _Step:
    """One step's all-reduce: this rank's rows and all ranks' (the weights), the parameters
    whose gradients are complete (a set, and in the order they came), the buckets started
    and their (members, buffer, request)."""

    count: int
    total: int
    ready: set = field(default_factory=set)
    order: list = field(default_factory=list)  # the parameters, as their gradients came
    started: int = 0
    sent: list = field(default_factory=list)


class DistributedDataParallel:
    """A model replicated on every rank of an MPI communicator, its gradients all-reduced.

    Parameters
    ----------
    module : nn.Module
        The replica on this rank. Its parameters are overwritten with rank 0's at
        construction, so every rank starts from the same weights.
    comm : mpi4py communicator, optional
        ``MPI.COMM_WORLD`` when None.
    bucket_bytes : int, default 25 MiB
        The largest flat buffer of gradients sent in one all-reduce (parameters of one
        dtype go together, in the reverse of ``module.parameters()``' order at first;
        after the first step, in the order rank 0's backward produced them, parameters
        without a gradient there last, as torch's DDP rebuilds its buckets).
    check_every : int, default 0
        Every this many ``allreduce_gradients`` calls, ``check_replicas`` compares the
        ranks' parameters (0: never).
    seed : int >= 0, optional
        Seeds this rank's global generator (dropout, shuffling) with ``np.random.
        default_rng([seed, rank])``: a stream of its own on each rank, the same from run to
        run. None leaves the generator as it is.
    overlap : bool, default True
        When the step's rows were announced (``local_share`` or ``begin_step``), start
        each bucket's all-reduce (non-blocking) in the backward pass as soon as its
        gradients are complete, so communication runs while the earlier layers' backward
        still computes; ``allreduce_gradients`` then waits. Buckets start in the same
        order on every rank, so one holding a parameter this rank did not use waits for
        ``allreduce_gradients``. MPICH progresses them inside MPI calls (each gradient's
        hook tests them); ``MPIR_CVAR_ASYNC_PROGRESS=1`` gives it a thread of its own.
        False: every bucket is sent by ``allreduce_gradients``.

    Notes
    -----
    The loop a script runs on every rank::

        ddp = nk.distributed.DistributedDataParallel(model)
        for idx in batches:                         # the same global batches on every rank
            local = ddp.local_share(idx)            # this rank's rows of the batch
            loss = loss_fn(ddp(X[local]), y[local])  # the mean over the local rows
            optimizer.zero_grad()
            loss.backward()
            ddp.allreduce_gradients(len(local))     # now the global batch's mean gradient
            optimizer.step()

    Accumulating micro-batches: run all but the last backward inside ``with
    ddp.no_sync():`` (a second backward outside it, after the all-reduces started, raises).
    A parameter that no rank used in the step keeps ``grad = None``, as in one process; one
    used on some ranks only gets the sum of those ranks' gradients (torch DDP's
    ``find_unused_parameters``). With more than one rank, an uncaught exception on any rank
    aborts the whole job (``MPI_Abort``) after printing its traceback and rank, and a rank
    killed outright ends the job too (``mpiexec``'s fail-fast): rerun from a checkpoint.
    """

    def __init__(self, module: Module, comm=None, *, bucket_bytes: int = _DEFAULT_BUCKET_BYTES,
                 check_every: int = 0, seed: int | None = None, overlap: bool = True):
        if not isinstance(module, Module):
            raise TypeError(f"module must be an nn.Module, got {type(module).__name__}")
        self.module = module
        self.comm = _check_comm(_world() if comm is None else comm)
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.bucket_bytes = check_scalar(bucket_bytes, name="bucket_bytes",
                                         kind=numbers.Integral, low=1)
        self.check_every = check_scalar(check_every, name="check_every",
                                        kind=numbers.Integral, low=0)
        self._named = list(module.named_parameters())
        for name, p in self._named:
            if is_gpu_array(p.data):
                raise TypeError(f"parameter {name!r} is on the GPU; DistributedDataParallel "
                                "all-reduces host (NumPy) arrays")
        if seed is not None:
            seed = check_scalar(seed, name="seed", kind=numbers.Integral, low=0)
            set_rng(np.random.default_rng([seed, self.rank]))
        self._buckets = self._plan_buckets()
        self._index = {id(p): i for i, (_, p) in enumerate(self._named)}
        self.overlap = check_bool(overlap, name="overlap")
        self._step, self._syncing, self._steps = None, True, 0
        ready = weakref.WeakMethod(self._gradient_ready)  # the hooks do not keep self alive
        self._hooks = [p.register_post_accumulate_grad_hook(
            lambda t: (hook := ready()) is not None and hook(t)) for _, p in self._named]
        if self.size > 1:
            _abort_on_uncaught_exception(self.comm)
        self.broadcast_parameters()

    def __del__(self):
        for handle in getattr(self, "_hooks", ()):
            handle.remove()

    # ----- set-up --------------------------------------------------------------------------
    def _plan_buckets(self, order=()) -> list[list[int]]:
        """Parameter indices per bucket: those in ``order`` first, then the others in
        reverse order; one dtype a bucket, at most ``bucket_bytes`` each (a larger
        parameter goes alone)."""
        buckets, current, size, dtype = [], [], 0, None
        first = set(order)
        rest = [i for i in reversed(range(len(self._named))) if i not in first]
        for i in [*order, *rest]:
            p = self._named[i][1].data
            if current and (p.dtype != dtype or size + p.nbytes > self.bucket_bytes):
                buckets.append(current)
                current, size = [], 0
            current.append(i)
            size += p.nbytes
            dtype = p.dtype
        if current:
            buckets.append(current)
        return buckets

    def broadcast_parameters(self, root: int = 0) -> None:
        """Overwrite every rank's parameters with rank ``root``'s."""
        for _, p in self._named:
            data = np.ascontiguousarray(p.data)
            self.comm.Bcast(data, root=root)
            if data is not p.data:
                p.data[...] = data

    # ----- the step ------------------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def local_share(self, indices) -> np.ndarray:
        """This rank's contiguous part of a global batch's ``indices`` (``np.array_split``'s
        parts: the first ``len % size`` ranks take one row more); also ``begin_step`` with
        its length and the batch's, so the backward can start the all-reduces."""
        indices = np.asarray(indices)
        if indices.ndim != 1:
            raise ValueError(f"indices must be 1-D, got shape {indices.shape}")
        mine = np.array_split(indices, self.size)[self.rank]
        self.begin_step(len(mine), len(indices))
        return mine

    def begin_step(self, local_count: int, global_count: int) -> None:
        """Announce the coming step's rows: ``local_count`` on this rank, ``global_count``
        over all ranks. With ``overlap``, each bucket's all-reduce then starts in the
        backward pass as soon as its gradients are complete (in bucket order on every
        rank), and ``allreduce_gradients`` waits for them."""
        count = check_scalar(local_count, name="local_count", kind=numbers.Integral, low=0)
        total = check_scalar(global_count, name="global_count", kind=numbers.Integral, low=0)
        if count > total:
            raise ValueError(f"local_count ({count}) exceeds global_count ({total})")
        if total == 0:
            raise ValueError("global_count is 0: the global batch is empty")
        self._step = _Step(count, total)

    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes inside this block start no all-reduce: gradients accumulate
        locally (micro-batches), and the backward after it sends the sum (torch's
        ``no_sync``)."""
        self._syncing = False
        try:
            yield
        finally:
            self._syncing = True

    def allreduce_gradients(self, local_count: int | None = None) -> None:
        """Replace each parameter's gradient with the global batch's: the sum over ranks of
        the rank's rows x its local gradient, over the rows of all ranks. The rows are
        ``begin_step``'s (or ``local_share``'s) when it was called for this step (then
        ``local_count``, if given, must agree), else ``local_count`` (summed over the
        ranks first), else equal shares. Gradients missing on this rank count as zeros; a
        parameter no rank has a gradient for keeps ``grad = None``."""
        step, self._step = self._step, None
        if step is None:
            step = self._counted(local_count)
        elif local_count is not None and local_count != step.count:
            raise ValueError(f"local_count ({local_count}) differs from the {step.count} "
                             "rows that begin_step/local_share announced for this step")
        while step.started < len(self._buckets):  # what the backward did not start
            self._start_bucket(step)
        from mpi4py import MPI

        MPI.Request.Waitall([r for _, _, r in step.sent])
        for members, flat, _ in step.sent:
            self._unpack(members, flat)
        if self._steps == 0:  # every rank, once: buckets in the order rank 0's gradients came
            self._buckets = self._plan_buckets(self.comm.bcast(step.order, root=0))
        self._steps += 1
        if self.check_every and self._steps % self.check_every == 0:
            self.check_replicas()

    def _counted(self, local_count) -> _Step:
        """The step's rows when nothing announced them: equal shares, or ``local_count``
        summed over the ranks."""
        if local_count is None:
            return _Step(1, self.size)
        count = check_scalar(local_count, name="local_count", kind=numbers.Integral, low=0)
        total = np.array([count], dtype=np.int64)
        self.comm.Allreduce(np.array([count], dtype=np.int64), total)
        if total[0] == 0:
            raise ValueError("local_count is 0 on every rank: the global batch is empty")
        return _Step(count, int(total[0]))

    # ----- buckets -------------------------------------------------------------------------
    def _gradient_ready(self, p) -> None:
        """The post-accumulate-grad hook: start every bucket, in order, whose gradients are
        all complete, and let MPI progress the ones in flight."""
        step = self._step
        if step is None or not self._syncing or not self.overlap:
            return
        i = self._index[id(p)]
        if i in step.ready:
            raise RuntimeError(
                "a second backward before allreduce_gradients(): its all-reduce had started; "
                "accumulate micro-batches inside `with ddp.no_sync():` and run the last "
                "backward outside it")
        step.ready.add(i)
        step.order.append(i)
        while (step.started < len(self._buckets)
               and step.ready.issuperset(self._buckets[step.started])):
            self._start_bucket(step)
        if step.sent:
            from mpi4py import MPI

            MPI.Request.Testall([r for _, _, r in step.sent])

    def _start_bucket(self, step) -> None:
        """Start the all-reduce of the next bucket: each member's gradient weighted by this
        rank's share of the rows, zeros where this rank has none, then one flag per member
        (1 where it has one)."""
        members = self._buckets[step.started]
        params = [self._named[i][1] for i in members]
        n = sum(p.data.size for p in params)
        flat = np.zeros(n + len(params), dtype=params[0].data.dtype)
        offset = 0
        for j, p in enumerate(params):
            size = p.data.size
            if p.grad is not None:
                np.multiply(np.asarray(p.grad).reshape(-1), step.count / step.total,
                            out=flat[offset:offset + size], casting="same_kind")
                flat[n + j] = 1
            offset += size
        from mpi4py import MPI

        step.sent.append((members, flat, self.comm.Iallreduce(MPI.IN_PLACE, flat)))
        step.started += 1

    def _unpack(self, members, flat) -> None:
        """Each member's gradient from its bucket's sum; None where no rank had one."""
        params = [self._named[i][1] for i in members]
        offset, n = 0, len(flat) - len(params)
        for j, p in enumerate(params):
            size = p.data.size
            p.grad = (None if flat[n + j] == 0 else
                      flat[offset:offset + size].reshape(p.data.shape).copy())
            offset += size

    # ----- agreement -----------------------------------------------------------------------
    def check_replicas(self) -> None:
        """Raise ``ReplicaDivergenceError`` on every rank if any parameter's bytes differ
        between ranks (a CRC-32 per parameter, gathered), naming the first such parameter
        and the ranks that disagree with rank 0."""
        local = checksums(p for _, p in self._named)
        every = self.comm.allgather(local)
        for i, (name, _) in enumerate(self._named):
            differ = [r for r, sums in enumerate(every) if sums[i] != every[0][i]]
            if differ:
                raise ReplicaDivergenceError(
                    f"parameter {name!r} differs from rank 0's on rank(s) {differ} (checked on "
                    f"rank {self.rank} after {self._steps} all-reduces)")


def checksums(params) -> list[int]:
    """A CRC-32 of each parameter's bytes: replicas agree when their lists are equal."""
    return [zlib.crc32(np.ascontiguousarray(p.data).view(np.uint8)) for p in params]


# ----- fit_data_parallel(..., backend="mpi") ----------------------------------------------------
def rank_of(comm) -> int:
    """This process's rank in ``comm`` (``MPI.COMM_WORLD`` when None)."""
    return _check_comm(_world() if comm is None else comm).Get_rank()


def shared_seed(comm) -> int:
    """A fresh seed drawn on rank 0 and broadcast, the same on every rank."""
    comm = _check_comm(_world() if comm is None else comm)
    seed = np.random.SeedSequence().entropy if comm.Get_rank() == 0 else None
    return comm.bcast(seed, root=0)


def shared_rng(random_state, comm) -> np.random.Generator:
    """The generator of the global batch schedule, the same on every rank: ``random_state``
    None takes ``shared_seed`` (each rank drawing its own would give each a different
    schedule); an int seeds every rank alike; a Generator is used as it is (the caller
    makes it the same on every rank)."""
    if random_state is None:
        random_state = shared_seed(comm)
    return np.random.default_rng(random_state)


def fit(model, loss_fn, optimizer, X, y, steps, progress_steps, *, comm, callback, progress,
        step_info, progress_bar, report, after_step):
    """The MPI body of ``fit_data_parallel``: every rank runs the same global ``steps``
    ((step, (epoch, indices)) pairs) and keeps to the rows of its own contiguous shard of
    X; rank 0 alone shows the progress bar, at ``progress_steps`` = (done, total).
    ``after_step(step)`` runs after each optimizer step (the checkpoint). ``step_info``,
    ``progress_bar`` and ``report`` are the Dask path's, so both backends hand the callback
    the same ``StepInfo``."""
    from mpi4py import MPI

    ddp = DistributedDataParallel(model, comm)
    shard = np.array_split(np.arange(len(X)), ddp.size)[ddp.rank]
    lo, hi = (int(shard[0]), int(shard[-1]) + 1) if len(shard) else (0, 0)
    grad_bytes = sum(p.data.nbytes for _, p in ddp._named)
    done, total = progress_steps
    with progress_bar(total, progress and ddp.rank == 0, done) as bar:
        for step, (epoch, idx) in steps:
            start = time.perf_counter()
            local = idx[(idx >= lo) & (idx < hi)]  # this rank's rows of the global batch
            ddp.begin_step(len(local), len(idx))
            optimizer.zero_grad()
            weighted = np.zeros(2)  # (n_k x local mean loss, n_k) summed over the ranks
            if len(local):
                loss = loss_fn(model(X[local]), y[local])
                loss.backward()
                weighted[:] = float(loss.item()) * len(local), len(local)
            compute = np.array([time.perf_counter() - start])
            ddp.allreduce_gradients(len(local))
            optimizer.step()
            ddp.comm.Allreduce(MPI.IN_PLACE, weighted)
            ddp.comm.Allreduce(MPI.IN_PLACE, compute, op=MPI.MAX)
            info = step_info(step, epoch, float(weighted[0] / weighted[1]),
                             time.perf_counter() - start, float(compute[0]), grad_bytes, 0)
            after_step(step)
            report(info, bar, callback if ddp.rank == 0 else None)
    return model


# ----- map_experiments(..., backend="mpi") ------------------------------------------------------
def map_points(run_point, fn, points, *, comm, progress, progress_bar) -> list:
    """The outcomes of ``run_point(fn, point)`` for every point, in grid order, on every
    rank: a static split (point i runs on rank i mod N; rank 0's bar counts its own), the
    outcomes then gathered to all ranks."""
    comm = _check_comm(_world() if comm is None else comm)
    rank, size = comm.Get_rank(), comm.Get_size()
    mine = range(rank, len(points), size)
    local = {}
    with progress_bar(len(mine), progress and rank == 0) as bar:
        for i in mine:
            local[i] = run_point(fn, points[i])
            bar.update()
    outcomes = {}
    for part in comm.allgather(local):
        outcomes.update(part)
    return [outcomes[i] for i in range(len(points))]
