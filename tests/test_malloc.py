"""``import nnkit`` sets glibc malloc's thresholds (nnkit/_malloc.py): a large block then
comes from the heap, not a fresh mmap; the environment can turn it off or tune malloc
itself, and ``nnkit info`` says which. Each case runs in a child process (the setting is
process-wide)."""

import json
import os
import platform
import subprocess
import sys

import pytest

GLIBC = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"
# the child reads mallinfo2, glibc 2.33 and later
MALLINFO2 = GLIBC and tuple(int(v) for v in platform.libc_ver()[1].split(".")[:2]) >= (2, 33)

# A child: import nnkit, then report _malloc.STATUS and how many bytes a 64 MiB numpy array
# added to the mmapped regions (glibc's mallinfo2().hblkhd).
CHILD = r"""
import ctypes, json, sys
import numpy as np
import nnkit
from nnkit import _malloc

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]

mallinfo2 = ctypes.CDLL(None).mallinfo2
mallinfo2.restype = MallInfo2
before = mallinfo2().hblkhd
a = np.ones(64 << 18, dtype=np.float32)  # 64 MiB
grew = mallinfo2().hblkhd - before
print(json.dumps({"status": _malloc.STATUS, "mmapped": grew}))
"""


def _child(**env):
    # without the settings this process may carry (Dask sets MALLOC_TRIM_THRESHOLD_)
    full = {k: v for k, v in os.environ.items()
            if k not in ("NNKIT_MALLOC_TUNING", "GLIBC_TUNABLES") and not k.startswith("MALLOC_")}
    full.update(env)
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                         env=full, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not MALLINFO2, reason="glibc's mallopt and mallinfo2 (glibc >= 2.33)")
def test_large_blocks_come_from_the_heap_after_import():
    got = _child()
    assert got["status"] == "mmap threshold 256 MiB, trim threshold 512 MiB"
    assert got["mmapped"] == 0


@pytest.mark.skipif(not MALLINFO2, reason="glibc's mallopt and mallinfo2 (glibc >= 2.33)")
@pytest.mark.parametrize("env, status", [
    ({"NNKIT_MALLOC_TUNING": "0"}, "off (NNKIT_MALLOC_TUNING=0)"),
    ({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1000000"},
     "left to the environment's malloc settings"),
])
def test_the_environment_keeps_glibcs_settings(env, status):
    got = _child(**env)
    assert got["status"] == status
    assert got["mmapped"] >= 64 << 20  # glibc's own default: a fresh mmap


def test_info_reports_the_malloc_setting():
    from nnkit import _malloc
    from nnkit.cli import info

    assert info()["malloc tuning"] == _malloc.STATUS
    if not GLIBC:
        assert _malloc.STATUS.startswith(("not glibc", "off", "left"))
