"""The tour's rows: a check passes only when its target is met; information reads "info"."""

import importlib.util

import numpy as np
import pytest

from nnkit.tour import TourContext, _verdict
from nnkit.tour import distributed as _distributed_tour
from nnkit.tour import persistence as _persistence_tour
from nnkit.tour.common import INFO, is_information, missed_targets, tour_row


# ----- the row and the verdict ----------------------------------------------------------------
def test_a_row_without_a_check_is_information():
    row = tour_row("s", "time", "1.0 s")
    assert row == {"section": "s", "result": "time", "value": "1.0 s", "target": "",
                   "ok": "info"}
    assert is_information(row) and missed_targets([row]) == []


def test_a_check_is_a_bool_and_needs_its_target():
    assert tour_row("s", "r", "1", ">= 0", np.float64(1) >= 0)["ok"] is True
    assert tour_row("s", "r", "-1", ">= 0", np.float64(-1) >= 0)["ok"] is False
    with pytest.raises(ValueError, match="'time' has a check but no target"):
        tour_row("s", "time", "1 s", "", True)
    with pytest.raises(ValueError, match="ok must be a check"):
        tour_row("s", "r", "1", ">= 0", "yes")


def test_missed_targets_and_the_verdict_line():
    rows = [tour_row("a", "met", "1", ">= 0", True),
            tour_row("a", "missed", "-1", ">= 0", np.False_),
            tour_row("b", "time", "2 s")]
    assert missed_targets(rows) == [rows[1]]
    # a hand-made row with a numpy bool counts by its truth, not by identity with True
    assert missed_targets([{**rows[0], "ok": np.True_}, {**rows[0], "ok": np.False_}]) == [
        {**rows[0], "ok": np.False_}]
    lines = _verdict(rows).splitlines()
    assert lines == ["1 of 2 targets met; 1 rows are information",
                     "MISSED: a: missed = -1 (target >= 0)"]
    assert _verdict(rows[::2]) == "1 of 1 targets met; 1 rows are information"


# ----- save and resume ------------------------------------------------------------------------
def _persistence_rows(tmp_path):
    return _persistence_tour.persistence_section(TourContext(tmp_path, quick=True, plots=False))


def test_persistence_section_quick(tmp_path):
    rows = _persistence_rows(tmp_path)
    assert [row["ok"] for row in rows] == [True, INFO, INFO], rows
    assert rows[0]["value"] == "0.0e+00" and rows[0]["target"] == "0 (bit-exact)"


def test_persistence_row_fails_when_the_resumed_run_differs(tmp_path, monkeypatch):
    # without the saved global generator the resumed run draws other dropout masks
    monkeypatch.setattr(_persistence_tour, "set_rng", lambda rng: None)
    rows = _persistence_rows(tmp_path)
    assert rows[0]["ok"] is False and float(rows[0]["value"]) > 0, rows[0]


def test_persistence_row_fails_when_nothing_trained_after_the_checkpoint(tmp_path, monkeypatch):
    """Equal because neither run moved proves nothing: the row fails."""
    train, calls = _persistence_tour._epochs, []

    def first_call_only(*args):
        calls.append(args)
        if len(calls) == 1:
            train(*args)

    monkeypatch.setattr(_persistence_tour, "_epochs", first_call_only)
    rows = _persistence_rows(tmp_path)
    assert len(calls) == 3
    assert rows[0]["ok"] is False and "no training after the checkpoint" in rows[0]["value"]


# ----- distributed ----------------------------------------------------------------------------
def _distributed_rows(tmp_path):
    return _distributed_tour.distributed_section(TourContext(tmp_path, quick=True, plots=False))


def test_distributed_section_quick(tmp_path):
    pytest.importorskip("distributed")
    rows = _distributed_rows(tmp_path)
    assert [row["ok"] for row in rows] == [True, True, INFO, True, INFO], rows
    assert float(rows[1]["value"]) <= 1e-4  # data-parallel parameters = one process's


def test_distributed_row_fails_when_data_parallel_differs(tmp_path, monkeypatch):
    pytest.importorskip("distributed")
    single = _distributed_tour._single_process

    def nudged(*args):
        model = single(*args)
        next(iter(model.parameters())).data[0, 0] += 1e-3  # beyond the row's 1e-4
        return model

    monkeypatch.setattr(_distributed_tour, "_single_process", nudged)
    rows = _distributed_rows(tmp_path)
    assert rows[1]["result"].startswith("data-parallel vs single-process parameters")
    assert rows[1]["ok"] is False and float(rows[1]["value"]) >= 1e-3 * (1 - 1e-6), rows[1]


def test_distributed_section_without_dask_is_information(tmp_path, monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "distributed" else find_spec(name, *a))
    rows = _distributed_rows(tmp_path)
    assert len(rows) == 1 and rows[0]["ok"] == INFO and "dask not installed" in rows[0]["value"]
