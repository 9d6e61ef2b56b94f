"""The nnkit command, the tour and the examples, run as a user would."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from nnkit import cli
from nnkit.tour import format_table
from nnkit.training import train_mlp_digits

ROOT = Path(__file__).resolve().parent.parent


def test_info_reports_versions_threads_and_cuda(capsys):
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    for key in ("numpy", "numba threads", "numba threading layer", "CUDA available",
                "cython kernels", "C kernels build"):
        assert key in out
    assert "NOT BUILT" not in out, "the Cython extension must be compiled at install"


def test_mlp_reaches_95_percent_on_digits():
    _, history, _ = train_mlp_digits(epochs=30, progress=False)
    assert history["test_accuracy"][-1] >= 0.95
    assert history["loss"][-1] < history["loss"][0]


@pytest.mark.slow  # ~3 minutes; CI runs the same quick tour as the README's tour command
def test_tour_quick_prints_table_and_writes_plot(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    status = cli.main(["tour", "--quick", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert "MLP on digits" in out and "test accuracy" in out
    assert (tmp_path / "mlp_digits.png").stat().st_size > 1000
    # every target of the quick run is met, and the exit status says so
    assert "MISSED" not in out and status == 0, out[-3000:]
    met, checked = map(int, re.search(r"(\d+) of (\d+) targets met", out).groups())
    assert met == checked > 0


def test_bench_quick_runs_and_writes_results_json(capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)
    output = tmp_path / "results.json"
    assert cli.main(["bench", "--quick", "--only", "mlp", "--output", str(output)]) == 0
    assert "MLP 64-256-256-10" in capsys.readouterr().out
    results = json.loads(output.read_text())
    assert results["quick"] is True and "numpy" in results["machine"]
    (name, entry), = results["benchmarks"].items()
    assert name == "bench_mlp" and entry["rows"] and entry["seconds"] >= 0


def test_console_script_entry_point():
    result = subprocess.run([sys.executable, "-m", "nnkit.cli", "info"], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "nnkit" in result.stdout


def test_unknown_command_is_a_usage_error():
    with pytest.raises(SystemExit) as exc:
        cli.main(["frobnicate"])
    assert exc.value.code == 2


def test_format_table_aligns_columns():
    text = format_table([{"a": "x", "b": "long value"}, {"a": "yy", "b": "z"}], ["a", "b"])
    lines = text.splitlines()
    assert lines[0].startswith("a ") and len({len(line.rstrip()) > 0 for line in lines}) == 1


# these take a Hugging Face checkpoint folder; tests/test_pretrained.py runs them on tiny ones
ON_A_CHECKPOINT = {"bert_fill_mask.py", "vit_classify.py"}


@pytest.mark.parametrize("script", sorted(p.name for p in (ROOT / "examples").glob("*.py")
                                          if p.name not in ON_A_CHECKPOINT))
def test_example_runs_with_small_flag(script, tmp_path):
    result = subprocess.run([sys.executable, str(ROOT / "examples" / script), "--small",
                             "--out", str(tmp_path / "plot.png")],
                            capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
