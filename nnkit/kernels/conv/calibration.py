"""The CPU convolution's algorithm by measurement: on the first call of each layer shape,
time every path that applies (forward + backward, on the call's own inputs; the forward
alone under ``nk.no_grad()``, where no backward follows) and keep the fastest, in memory
and in a file of the user's cache folder, per machine.

Why: which path wins depends on the CPU, not only on the shape. The table of
``algorithms.cpu_algorithm`` was measured on one machine; on another (an AVX2-only AMD EPYC,
benchmarks/RESULTS.md, "Convolution by measurement") the packed path beat the window path
by a fifth at a shape the table sends to ``window``. Off by default, like torch's
``cudnn.benchmark``: the first call of a shape then costs a few passes of every path, and
two runs may pick different paths (numbers equal to rounding, not bit for bit). Turn it on
with ``NNKIT_CONV_CALIBRATE=1`` or ``calibration.ENABLED = True``.

The file (``$XDG_CACHE_HOME/nnkit/conv_algorithms.json``, else ``~/.cache/nnkit/...``)
maps a machine (CPU model, C kernels' instruction set, numba threads) to {shape: path}. It
is read as untrusted: an entry whose path is not a known one, or a file that is not that
shape of JSON, is ignored (never an error), and a file larger than ``MAX_FILE_BYTES`` is
not read. Writes replace the file atomically.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import threading
import time
from pathlib import Path

from . import algorithms

__all__ = ["ENABLED", "MAX_FILE_BYTES", "choose", "cache_file", "machine_key"]

ENABLED = os.environ.get("NNKIT_CONV_CALIBRATE", "") == "1"
MAX_FILE_BYTES = 1 << 20
PATHS = ("window", "packed", "image", "im2col", "pointwise", "winograd", "direct")
_ROUNDS = 3  # timed passes of each path, after one untimed (compilation, first touch)

_known: dict | None = None  # {machine: {shape: path}}, loaded on first use
_lock = threading.Lock()


def cache_file() -> Path:
    """The file of measured choices in the user's cache folder."""
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "nnkit" / "conv_algorithms.json"


def machine_key() -> str:
    """CPU model | C kernels' instruction set | numba threads: what a choice holds for."""
    import numba

    try:
        from ..._ext import conv_window

        isa = conv_window.isa_names()[conv_window.ISA_LEVEL] if conv_window.AVAILABLE else "-"
    except ImportError:
        isa = "-"
    return f"{_cpu_model()}|{isa}|{numba.get_num_threads()}"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def shape_key(x, weight, cache, training=True) -> str:
    """The layer's shape: x, weight, stride, pads, dilation, groups, dtype, bias or not, and
    what was timed ('fwd+bwd' when ``training``, else 'fwd')."""
    return json.dumps([list(x.shape), list(weight.shape), list(cache.stride),
                       [list(p) for p in cache.pads], list(cache.dilation), cache.groups,
                       x.dtype.name, bool(cache.has_bias), "fwd+bwd" if training else "fwd"])


def _training() -> bool:
    """Whether a backward may follow: grad mode on (nnkit.autograd's, read lazily: the
    kernels do not depend on autograd otherwise)."""
    from ...autograd import is_grad_enabled

    return is_grad_enabled()


def _load() -> dict:
    """The file's choices that are well formed (anything else in it is dropped)."""
    path = cache_file()
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            return {}
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {machine: {shape: p for shape, p in table.items()
                      if isinstance(shape, str) and p in PATHS}
            for machine, table in data.items()
            if isinstance(machine, str) and isinstance(table, dict)}


def _save(known: dict) -> None:
    path = cache_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(known, indent=0, sort_keys=True), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:  # a read-only home: the choice stays in memory
        pass


def choose(x, weight, bias, cache, paths) -> str:
    """The measured path for this layer shape; ``paths`` (algorithm -> (forward, backward))
    are ``nnkit.kernels.conv.cpu``'s. Candidates: the paths ``algorithms.candidates``
    lists (a single candidate is returned without timing)."""
    global _known
    candidates = algorithms.candidates(x.shape, weight.shape, cache.stride, cache.pads,
                                       cache.dilation, cache.groups, cache.out_hw, x.dtype)
    if len(candidates) == 1:
        return candidates[0]
    training = _training()
    machine, shape = machine_key(), shape_key(x, weight, cache, training)
    with _lock:
        if _known is None:
            _known = _load()
        chosen = _known.get(machine, {}).get(shape)
    if chosen in candidates:
        return chosen
    times = {name: _time(paths[name], x, weight, bias, cache, name, training)
             for name in candidates}
    chosen = min(times, key=times.get)
    with _lock:
        _known.setdefault(machine, {})[shape] = chosen
        _save(_known)
    return chosen


def _time(path, x, weight, bias, cache, name, training) -> float:
    """Seconds of the fastest of ``_ROUNDS`` passes of one path, forward + backward (the
    output as the upstream gradient) when ``training``, after one untimed pass."""
    from .cpu import release

    forward, backward = path
    best = float("inf")
    for round_ in range(_ROUNDS + 1):
        trial = dataclasses.replace(cache, algorithm=name, cols=None)
        start = time.perf_counter()
        y = forward(x, weight, bias, trial)
        if training:
            backward(y, trial, (True, True, bias is not None))
        elapsed = time.perf_counter() - start
        release(trial)
        if round_:
            best = min(best, elapsed)
    return best
