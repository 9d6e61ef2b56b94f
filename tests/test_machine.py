"""The machine model behind the CPU heuristics (``nnkit._machine``): cache sizes read
from sysfs as untrusted text, the serial-or-parallel rule carried from its two-thread figure
to any thread count, and the cache-sized blocks."""

from __future__ import annotations

import numba
import pytest

from nnkit import _machine as machine
from nnkit._machine import MEASURED_ON, Caches, parallel_pays, read_caches


def _cache_dir(root, index, level, kind, size, shared):
    d = root / f"index{index}"
    d.mkdir()
    for name, text in (("level", level), ("type", kind), ("size", size),
                       ("shared_cpu_list", shared)):
        (d / name).write_text(text + "\n")


def test_reads_the_sizes_and_sharers_sysfs_gives(tmp_path):
    _cache_dir(tmp_path, 0, "1", "Data", "48K", "0,32")
    _cache_dir(tmp_path, 1, "1", "Instruction", "32K", "0,32")
    _cache_dir(tmp_path, 2, "2", "Unified", "2048K", "0,32")
    _cache_dir(tmp_path, 3, "3", "Unified", "105M", "0-31,64-95")
    assert read_caches(tmp_path) == Caches(l1d=48 << 10, l2=2 << 20, llc=105 << 20,
                                           llc_shared_by=64, source="sysfs")


def test_without_an_l3_the_l2_is_the_last_level(tmp_path):
    _cache_dir(tmp_path, 0, "1", "Data", "64K", "0")
    _cache_dir(tmp_path, 1, "2", "Unified", "4M", "0-3")
    assert read_caches(tmp_path) == Caches(64 << 10, 4 << 20, 4 << 20, 4, "sysfs")


@pytest.mark.parametrize(("size", "shared"), [
    ("lots", "0"), ("99999999999K", "0"), ("1K", "0"), ("-32K", "0"), ("\x00\x01", "0"),
])
def test_a_size_that_does_not_parse_or_is_not_believable_is_ignored(tmp_path, size, shared):
    _cache_dir(tmp_path, 0, "1", "Data", size, shared)
    _cache_dir(tmp_path, 1, "2", "Unified", "1M", shared)
    assert read_caches(tmp_path) == MEASURED_ON  # no L1d left: the defaults stand in


@pytest.mark.parametrize("shared", ["", "0-", "a-b", "3-1x", "0,,1"])
def test_a_sharer_list_that_does_not_parse_counts_one(tmp_path, shared):
    _cache_dir(tmp_path, 0, "1", "Data", "32K", "0")
    _cache_dir(tmp_path, 1, "2", "Unified", "1M", "0")
    _cache_dir(tmp_path, 2, "3", "Unified", "8M", shared)
    assert read_caches(tmp_path).llc_shared_by >= 1


def test_no_sysfs_gives_the_measured_machine(tmp_path):
    assert read_caches(tmp_path / "missing") == MEASURED_ON
    (tmp_path / "index0").mkdir()  # an entry without its files
    assert read_caches(tmp_path) == MEASURED_ON


def _threads(monkeypatch, n):
    monkeypatch.setattr(numba, "get_num_threads", lambda: n)


@pytest.mark.parametrize("at_two", [1 << 16, 1 << 20, 1000])
def test_at_two_threads_the_rule_is_the_measured_threshold(monkeypatch, at_two):
    _threads(monkeypatch, 2)
    for size in (0, at_two // 2 - 1, at_two // 2, at_two - 1, at_two, 10 * at_two):
        assert parallel_pays(size, at_two) == (size >= at_two), size


def test_more_threads_pay_from_smaller_sizes_and_one_thread_never_below_the_figure(
        monkeypatch):
    at_two = 1 << 16
    thresholds = {}
    for threads in (1, 2, 4, 8, 16, 64):
        _threads(monkeypatch, threads)
        paying = [s for s in range(0, 2 * at_two, 64) if parallel_pays(s, at_two)]
        thresholds[threads] = paying[0]
        assert paying == list(range(paying[0], 2 * at_two, 64))  # a threshold, not a band
    assert thresholds[1] == at_two == thresholds[2]
    assert thresholds[4] < thresholds[2] and thresholds[16] < thresholds[4]
    assert thresholds[64] >= at_two // 2
    # (W / c) t / (t - 1) with W / c = at_two / 2, to the 64-element grid
    assert abs(thresholds[16] - at_two * 16 / 30) < 64


def test_blocks_scale_with_the_l2_and_stream_from_one_cores_llc_share(monkeypatch):
    def on(**fields):
        monkeypatch.setattr(machine, "caches", lambda: Caches(**{
            **MEASURED_ON.__dict__, **fields}))

    on(llc_shared_by=2)  # this VM: sysfs names the guest's two CPUs
    assert machine.scaled_to_l2(256) == 256 and machine.stream_min_bytes() == 4 << 20
    on(l2=2 << 20, llc=105 << 20, llc_shared_by=64)
    assert machine.scaled_to_l2(256) == 1024 and machine.stream_min_bytes() == (105 << 20) // 64
    on(l2=256 << 10, llc=4 << 20, llc_shared_by=4)
    assert machine.scaled_to_l2(256) == 128 and machine.stream_min_bytes() == 1 << 20
    on(l2=1 << 12)
    assert machine.scaled_to_l2(256) == 16  # kept at the low bound


def test_nnkit_info_reports_the_caches():
    from nnkit.cli import info

    row = info()["CPU caches (the heuristics' view)"]
    c = machine.caches()
    assert f"L2 {c.l2 >> 10} KiB" in row and c.source in row
