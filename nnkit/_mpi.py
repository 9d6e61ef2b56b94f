"""Synchronous data parallelism over MPI: ``nk.distributed.DistributedDataParallel``.

Each rank (``mpiexec -n N python train.py``, or ``srun python train.py``) holds a replica of
the model and computes the gradient of its share of every global batch; the gradients are
summed across ranks in flat buckets (a few messages, not one per parameter), each rank's
weighted by its share's size, so every rank ends with the gradient of the global batch's
mean loss and its optimizer takes the same step. mpi4py is imported only here, and only
when a communicator is needed (the ``mpi`` extra, ``pip install "nnkit[mpi]"``).
"""

from __future__ import annotations

import numbers
import sys
import time
import zlib

import numpy as np

from ._backend import is_gpu_array
from ._random import set_rng
from ._validation import check_scalar
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
        comm.Abort(1)

    hook._nnkit_mpi_abort = True
    sys.excepthook = hook


def _check_comm(comm):
    for name in ("Get_rank", "Get_size", "Allreduce", "Bcast", "allgather"):
        if not callable(getattr(comm, name, None)):
            raise TypeError(f"comm must be an mpi4py communicator (with {name}), got "
                            f"{type(comm).__name__}")
    return comm


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
        dtype go together, in the reverse of ``module.parameters()``' order, as the
        backward pass produces them).
    check_every : int, default 0
        Every this many ``allreduce_gradients`` calls, ``check_replicas`` compares the
        ranks' parameters (0: never).
    seed : int >= 0, optional
        Seeds this rank's global generator (dropout, shuffling) with ``np.random.
        default_rng([seed, rank])``: a stream of its own on each rank, the same from run to
        run. None leaves the generator as it is.

    The loop a script runs on every rank::

        ddp = nk.distributed.DistributedDataParallel(model)
        for idx in batches:                         # the same global batches on every rank
            local = ddp.local_share(idx)            # this rank's rows of the batch
            loss = loss_fn(ddp(X[local]), y[local])  # the mean over the local rows
            optimizer.zero_grad()
            loss.backward()
            ddp.allreduce_gradients(len(local))     # now the global batch's mean gradient
            optimizer.step()

    A parameter that no rank used in the step keeps ``grad = None``, as in one process; one
    used on some ranks only gets the sum of those ranks' gradients (torch DDP's
    ``find_unused_parameters``). With more than one rank, an uncaught exception on any rank
    aborts the whole job (``MPI_Abort``) after printing its traceback and rank, and a rank
    killed outright ends the job too (``mpiexec``'s fail-fast): rerun from a checkpoint.
    """

    def __init__(self, module: Module, comm=None, *, bucket_bytes: int = _DEFAULT_BUCKET_BYTES,
                 check_every: int = 0, seed: int | None = None):
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
        self._steps = 0
        if self.size > 1:
            _abort_on_uncaught_exception(self.comm)
        self.broadcast_parameters()

    # ----- set-up --------------------------------------------------------------------------
    def _plan_buckets(self) -> list[list[int]]:
        """Parameter indices per bucket: reverse order, one dtype a bucket, at most
        ``bucket_bytes`` each (a larger parameter goes alone)."""
        buckets, current, size, dtype = [], [], 0, None
        for i in reversed(range(len(self._named))):
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
        parts: the first ``len % size`` ranks take one row more)."""
        indices = np.asarray(indices)
        if indices.ndim != 1:
            raise ValueError(f"indices must be 1-D, got shape {indices.shape}")
        return np.array_split(indices, self.size)[self.rank]

    def allreduce_gradients(self, local_count: int | None = None) -> None:
        """Replace each parameter's gradient with the global batch's: the sum over ranks of
        ``local_count`` x the local gradient, divided by the summed counts. Equal shares
        when ``local_count`` is None. Gradients missing on this rank count as zeros."""
        if local_count is None:
            weight = 1.0 / self.size
        else:
            count = check_scalar(local_count, name="local_count", kind=numbers.Integral, low=0)
            total = np.array([count], dtype=np.int64)
            self.comm.Allreduce(np.array([count], dtype=np.int64), total)
            if total[0] == 0:
                raise ValueError("local_count is 0 on every rank: the global batch is empty")
            weight = count / int(total[0])
        used = self._used_anywhere()
        for bucket in self._buckets:  # a parameter no rank used keeps its None
            self._reduce_bucket([i for i in bucket if used[i]], weight)
        self._steps += 1
        if self.check_every and self._steps % self.check_every == 0:
            self.check_replicas()

    def _used_anywhere(self) -> np.ndarray:
        local = np.array([p.grad is not None for _, p in self._named], dtype=np.uint8)
        used = np.empty_like(local)
        from mpi4py import MPI

        self.comm.Allreduce(local, used, op=MPI.MAX)
        return used.astype(bool)

    def _reduce_bucket(self, members: list[int], weight: float) -> None:
        if not members:
            return
        params = [self._named[i][1] for i in members]
        dtype = params[0].data.dtype
        flat = np.empty(sum(p.data.size for p in params), dtype=dtype)
        offset = 0
        for p in params:
            n = p.data.size
            if p.grad is None:
                flat[offset:offset + n] = 0
            else:
                np.multiply(np.asarray(p.grad).reshape(-1), weight, out=flat[offset:offset + n],
                            casting="same_kind")
            offset += n
        from mpi4py import MPI

        self.comm.Allreduce(MPI.IN_PLACE, flat)
        offset = 0
        for p in params:
            n = p.data.size
            p.grad = flat[offset:offset + n].reshape(p.data.shape).copy()
            offset += n

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
