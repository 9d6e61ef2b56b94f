"""What the CPU heuristics know of the machine: its caches and the threads in use.

Every serial-or-parallel threshold in nnkit was measured on 2 threads. ``parallel_pays``
turns such a figure into a rule for any thread count, from a two-term model: a loop of n
units costs n c on one thread and W + n c / t on t (W: waking the pool and the barrier).
Parallel wins from n = (W / c) t / (t - 1), and the figure measured at two threads is
2 W / c, so the threshold falls from that figure (t = 2) towards half of it (many threads).
W is taken as fixed: how it grows with the pool is not measured.

Cache sizes come from Linux's sysfs (``/sys/devices/system/cpu/cpu0/cache``), not sysconf,
which misreports the last-level cache on some VMs; where sysfs is missing (macOS, Windows,
containers that hide it) the sizes of the machine the figures were measured on stand in.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

import numba

__all__ = ["Caches", "MEASURED_ON", "caches", "read_caches", "parallel_pays", "scaled_to_l2",
           "stream_min_bytes"]

SYSFS_CACHES = Path("/sys/devices/system/cpu/cpu0/cache")
_MIN_SIZE, _MAX_SIZE = 1 << 12, 1 << 32  # a size outside 4 KiB .. 4 GiB is not believed
_SIZE = re.compile(r"(\d+)([KMG]?)\s*$")
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


@dataclass(frozen=True)
class Caches:
    """Per-core L1 data and L2 sizes, the last-level cache's size and how many CPUs share
    it (bytes); ``source`` says where they came from ("sysfs" or "default")."""

    l1d: int
    l2: int
    llc: int
    llc_shared_by: int
    source: str


# The machine the thresholds were measured on: AMD EPYC, 32 KiB L1d and 512 KiB L2 a core,
# 32 MiB of L3 shared by 8 cores.
MEASURED_ON = Caches(l1d=32 << 10, l2=512 << 10, llc=32 << 20, llc_shared_by=8,
                     source="default")


def _size(text: str) -> int | None:
    match = _SIZE.match(text.strip())
    if match is None:
        return None
    size = int(match.group(1)) * _UNITS[match.group(2)]
    return size if _MIN_SIZE <= size <= _MAX_SIZE else None


def _cpu_count(cpu_list: str) -> int:
    """How many CPUs a sysfs list such as '0-7,16-23' names (1 when it cannot be read)."""
    count = 0
    for part in cpu_list.strip().split(","):
        low, _, high = part.partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            return 1
        count += int(high) - int(low) + 1 if high else 1
    return max(count, 1)


def read_caches(root: Path = SYSFS_CACHES) -> Caches:
    """The caches sysfs describes under ``root``; ``MEASURED_ON``'s sizes for what it does
    not say (every file is read as untrusted text: a size that does not parse, or lies
    outside 4 KiB .. 4 GiB, is ignored)."""
    found = {}
    try:
        entries = sorted(root.glob("index*"))
    except OSError:
        entries = []
    for entry in entries:
        try:
            level = (entry / "level").read_text().strip()
            kind = (entry / "type").read_text().strip()
            size = _size((entry / "size").read_text())
            shared = (entry / "shared_cpu_list").read_text()
        except (OSError, UnicodeDecodeError):
            continue
        if size is None or kind == "Instruction" or not level.isdigit():
            continue
        found[int(level)] = (size, _cpu_count(shared))
    if 1 not in found or 2 not in found:
        return MEASURED_ON
    last = max(found)
    return Caches(l1d=found[1][0], l2=found[2][0], llc=found[last][0],
                  llc_shared_by=found[last][1], source="sysfs")


@functools.cache
def caches() -> Caches:
    """This machine's caches, read once."""
    return read_caches()


def parallel_pays(size: int, at_two: int) -> bool:
    """Whether a parallel loop of ``size`` units beats the serial one on the threads numba
    runs now, given ``at_two``, the size from which it did at two threads (model above).
    Sizes from ``at_two`` on run parallel and those under half of it serially whatever the
    thread count (so the common calls never ask numba for it)."""
    if size >= at_two:
        return True
    if 2 * size < at_two:
        return False
    threads = numba.get_num_threads()
    return threads > 1 and 2 * size * (threads - 1) >= at_two * threads


def scaled_to_l2(measured: int, multiple: int = 16, low: int = 16, high: int = 4096) -> int:
    """A block size measured on ``MEASURED_ON``'s L2, scaled to this machine's L2 (a block
    that filled part of that L2 fills the same part of this one), rounded down to
    ``multiple`` and kept within [low, high]."""
    size = measured * caches().l2 // MEASURED_ON.l2
    return min(max(size // multiple * multiple, low), high)


def stream_min_bytes() -> int:
    """The output size from which non-temporal stores pay: one core's share of the
    last-level cache (measured: 4 MiB, an eighth of the 32 MiB L3 that 8 cores share).
    Under VMs sysfs names only the guest's CPUs as sharing the cache, so the share is
    taken as an eighth of it unless sysfs names more sharers."""
    info = caches()
    return max(info.llc // max(info.llc_shared_by, 8), 1 << 20)
