"""NNKIT_ISA: the instruction set nnkit's C kernels (step GEMM, window conv, scan rows) run
with. Unset, they take the CPU's best; set to a lower set the CPU runs, every family takes
that build, in a process started with it, and the twin and torch comparisons of the layers
built on them pass there too; any other value is refused at import, by name."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from nnkit._ext import ISA_NAMES, check_isa_request, conv_window

ROOT = Path(__file__).resolve().parent.parent
CPU_LEVEL = conv_window.CPU_LEVEL
# The comparisons rerun under each lower build: LSTM/GRU/RNN against torch, conv and the
# scan against their twins (the suite runs them under the CPU's best already).
UNDER_EACH_BUILD = ["tests/test_recurrent.py", "tests/test_conv.py", "tests/test_scan.py",
                    "-k", "matches_torch or matches_twin"]


def _child(isa: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "NNKIT_ISA": isa}
    return subprocess.run([sys.executable, *args], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=900)


def test_unset_means_the_cpus_best():
    assert conv_window.ISA_LEVEL == CPU_LEVEL or os.environ.get("NNKIT_ISA")
    assert conv_window.isa_names() == list(ISA_NAMES[:CPU_LEVEL + 1])


@pytest.mark.parametrize("asked", ["sse", "AVX2", "avx2 ", "native"])
def test_a_set_of_no_name_is_refused(monkeypatch, asked):
    monkeypatch.setenv("NNKIT_ISA", asked)
    with pytest.raises(ValueError, match=f"NNKIT_ISA: expected one of baseline, avx2, avx512, "
                                         f"got '{asked}'"):
        check_isa_request(CPU_LEVEL)


def test_a_set_above_the_cpu_is_refused(monkeypatch):
    monkeypatch.setenv("NNKIT_ISA", "avx512")
    with pytest.raises(ValueError, match="NNKIT_ISA: 'avx512' is not run by this CPU, which "
                                         "runs baseline, avx2$"):
        check_isa_request(1)
    check_isa_request(2)


@pytest.mark.parametrize("asked", ["", *ISA_NAMES])
def test_a_set_the_cpu_runs_is_taken(monkeypatch, asked):
    monkeypatch.setenv("NNKIT_ISA", asked)
    check_isa_request(2)


@pytest.mark.parametrize("level", range(CPU_LEVEL + 1), ids=lambda i: ISA_NAMES[i])
def test_every_family_takes_the_set_asked(level):
    name = ISA_NAMES[level]
    out = _child(name, "-c", "from nnkit._ext import conv_window as c, gemm_packed as g, "
                             "scan_rows as s; print(g.isa(), s.isa(), c.ISA_LEVEL)")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [name, name, str(level)]


def test_a_refused_set_stops_the_import():
    out = _child("avx1024", "-c", "from nnkit._ext import gemm_packed")
    assert out.returncode != 0
    assert "ValueError: NNKIT_ISA: expected one of" in out.stderr


@pytest.mark.parametrize("level", range(CPU_LEVEL), ids=lambda i: ISA_NAMES[i])
def test_layers_match_torch_and_twins_under_each_lower_build(level):
    out = _child(ISA_NAMES[level], "-m", "pytest", "-q", "-p", "no:cacheprovider",
                 *UNDER_EACH_BUILD)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert " passed" in out.stdout and " failed" not in out.stdout
