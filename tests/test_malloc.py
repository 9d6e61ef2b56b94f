"""glibc malloc's thresholds (nnkit/_malloc.py) are an opt-in: ``import nnkit`` changes
nothing, ``nk.tune_malloc()`` or ``NNKIT_MALLOC_TUNING=1`` raises them (a large block then
comes from the heap, not a fresh mmap), the environment can refuse or tune malloc itself,
and ``nnkit info`` says which. Each case that touches the allocator runs in a child process
(the setting is process-wide)."""

import json
import os
import platform
import subprocess
import sys

import pytest

GLIBC = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"
# the child reads mallinfo2, glibc 2.33 and later
MALLINFO2 = GLIBC and tuple(int(v) for v in platform.libc_ver()[1].split(".")[:2]) >= (2, 33)

# A child: import nnkit, call nk.tune_malloc() (twice) when asked, then report _malloc.STATUS,
# what tune_malloc returned, and how many bytes a 64 MiB numpy array added to the mmapped
# regions (glibc's mallinfo2().hblkhd): 0 when tuned, at least 64 MiB with glibc's defaults
# (its dynamic mmap threshold stops at 32 MiB).
CHILD = r"""
import ctypes, json, sys
import numpy as np
import nnkit
from nnkit import _malloc

returned = [nnkit.tune_malloc(), nnkit.tune_malloc()] if sys.argv[1] == "tune" else []

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]

mallinfo2 = ctypes.CDLL(None).mallinfo2
mallinfo2.restype = MallInfo2
before = mallinfo2().hblkhd
a = np.ones(64 << 18, dtype=np.float32)  # 64 MiB
grew = mallinfo2().hblkhd - before
print(json.dumps({"status": _malloc.STATUS, "returned": returned, "mmapped": grew}))
"""
TUNED = "mmap threshold 256 MiB, trim threshold 512 MiB"


def _child(action="import", **env):
    # without the settings this process may carry (Dask sets MALLOC_TRIM_THRESHOLD_)
    full = {k: v for k, v in os.environ.items()
            if k not in ("NNKIT_MALLOC_TUNING", "GLIBC_TUNABLES") and not k.startswith("MALLOC_")}
    full.update(env)
    out = subprocess.run([sys.executable, "-c", CHILD, action], capture_output=True, text=True,
                         env=full, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not MALLINFO2, reason="glibc's mallopt and mallinfo2 (glibc >= 2.33)")
def test_import_alone_leaves_glibcs_settings():
    from nnkit import _malloc

    got = _child("import")
    assert got["status"] == _malloc.OFF
    assert got["mmapped"] >= 64 << 20  # glibc's own default: a fresh mmap


@pytest.mark.skipif(not MALLINFO2, reason="glibc's mallopt and mallinfo2 (glibc >= 2.33)")
def test_tune_malloc_keeps_large_blocks_in_the_heap_and_is_idempotent():
    got = _child("tune")
    assert got["returned"] == [TUNED, TUNED]
    assert got["status"] == TUNED
    assert got["mmapped"] == 0


@pytest.mark.skipif(not MALLINFO2, reason="glibc's mallopt and mallinfo2 (glibc >= 2.33)")
def test_environment_variable_tunes_at_import():
    got = _child("import", NNKIT_MALLOC_TUNING="1")
    assert got["status"] == TUNED
    assert got["mmapped"] == 0


@pytest.mark.skipif(not MALLINFO2, reason="glibc's mallopt and mallinfo2 (glibc >= 2.33)")
@pytest.mark.parametrize("env, status", [
    ({"NNKIT_MALLOC_TUNING": "0"}, "off (NNKIT_MALLOC_TUNING=0)"),
    ({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1000000"},
     "left to the environment's malloc settings"),
    ({"MALLOC_TRIM_THRESHOLD_": "65536"}, "left to the environment's malloc settings"),
])
def test_the_environment_keeps_its_settings_even_when_asked_to_tune(env, status):
    got = _child("tune", **env)
    assert got["returned"] == [status, status]
    assert got["status"] == status
    assert got["mmapped"] >= 64 << 20


@pytest.fixture
def untuned(monkeypatch):
    """nnkit._malloc as if never tuned in this process (monkeypatch restores it)."""
    from nnkit import _malloc

    monkeypatch.setattr(_malloc, "_TUNED", False)
    monkeypatch.setattr(_malloc, "STATUS", _malloc.OFF)
    monkeypatch.delenv("NNKIT_MALLOC_TUNING", raising=False)
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    for name in _malloc._ENV_TUNING:
        monkeypatch.delenv(name, raising=False)
    return _malloc


def test_off_glibc_tune_is_a_no_op_that_says_so(untuned, monkeypatch):
    import nnkit as nk

    monkeypatch.setattr(untuned.sys, "platform", "darwin")
    assert nk.tune_malloc() == "not glibc: the system allocator's defaults"
    assert untuned.STATUS == "not glibc: the system allocator's defaults"


@pytest.mark.skipif(not GLIBC, reason="the glibc path, with mallopt taken away")
def test_without_mallopt_tune_is_a_no_op_that_says_so(untuned, monkeypatch):
    monkeypatch.setattr(untuned.ctypes, "CDLL", lambda name: object())
    assert untuned.tune() == "mallopt unavailable: the system allocator's defaults"
    assert untuned._TUNED is False


def test_tune_malloc_is_public():
    import nnkit as nk

    assert "tune_malloc" in nk.__all__ and nk.tune_malloc is nk._malloc.tune


def test_the_tour_tunes_malloc_first(monkeypatch, tmp_path, capsys):
    from nnkit import _malloc, tour

    calls = []
    monkeypatch.setattr(_malloc, "tune", lambda: calls.append(1) or "tuned (stub)")
    monkeypatch.setattr(tour, "SECTIONS", [])
    tour.run_tour(tmp_path)
    assert calls == [1]
    assert capsys.readouterr().out.startswith("malloc tuning: tuned (stub)")


def test_info_reports_the_malloc_setting():
    from nnkit import _malloc
    from nnkit.cli import info

    assert info()["malloc tuning"] == _malloc.STATUS
    if not GLIBC:
        assert _malloc.STATUS.startswith(("not glibc", "off", "left"))
