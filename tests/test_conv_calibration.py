"""The CPU convolution's algorithm by measurement (``nnkit.kernels.conv.calibration``): the
fastest path is kept per machine and shape, in memory and on disk; the file is untrusted
(malformed entries and files are ignored); the numbers are the twin's whichever path wins."""

import json

import numpy as np
import pytest

from nnkit.kernels import conv as K
from nnkit.kernels.conv import algorithms, calibration
from nnkit.kernels.reference import conv as R


@pytest.fixture
def calibrating(monkeypatch, tmp_path):
    """Calibration on, a fresh cache folder, nothing known in memory; yields the timings
    asked for, as a list of path names."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(calibration, "ENABLED", True)
    monkeypatch.setattr(calibration, "_known", None)
    timed = []
    yield timed


def _fake_times(monkeypatch, timed, seconds):
    """Replace the timing of each path by ``seconds[path]`` (default 1 s), recording calls."""
    def fake(path, x, weight, bias, cache, name, training):
        timed.append(name)
        return seconds.get(name, 1.0)

    monkeypatch.setattr(calibration, "_time", fake)


def _layer(rng, dtype=np.float32, C=4, K_=6, groups=1):
    x = rng.standard_normal((2, C, 9, 8)).astype(dtype)
    w = rng.standard_normal((K_, C // groups, 3, 3)).astype(dtype)
    return x, w


def test_the_fastest_path_is_kept_in_memory_and_on_disk(calibrating, monkeypatch, rng):
    _fake_times(monkeypatch, calibrating, {"packed": 0.5, "window": 0.7})
    x, w = _layer(rng)
    assert K.conv2d_forward(x, w, None, padding=1)[1].algorithm == "packed"
    assert set(calibrating) == set(algorithms.candidates(
        x.shape, w.shape, (1, 1), ((1, 1), (1, 1)), (1, 1), 1, (9, 8)))
    calibrating.clear()
    assert K.conv2d_forward(x, w, None, padding=1)[1].algorithm == "packed"
    assert calibrating == []  # known: no timing
    monkeypatch.setattr(calibration, "_known", None)  # a new process: read from the file
    assert K.conv2d_forward(x, w, None, padding=1)[1].algorithm == "packed"
    assert calibrating == []
    saved = json.loads(calibration.cache_file().read_text())
    assert list(saved[calibration.machine_key()].values()) == ["packed"]
    assert K.conv2d_forward(x, w, None, padding=2)[1].algorithm == "packed"  # a new shape
    assert calibrating  # was timed


def test_inference_is_timed_on_its_own(calibrating, monkeypatch, rng):
    """Under no_grad the forward alone is timed, and kept apart from the training choice."""
    import nnkit as nk

    seen = []
    monkeypatch.setattr(calibration, "_time", lambda *args: seen.append(args[-1]) or (
        0.1 if (args[-2] == "im2col") == args[-1] else 1.0))  # im2col wins training only
    x, w = _layer(rng)
    assert K.conv2d_forward(x, w, None, padding=1)[1].algorithm == "im2col"
    assert set(seen) == {True}
    seen.clear()
    with nk.no_grad():
        assert K.conv2d_forward(x, w, None, padding=1)[1].algorithm != "im2col"
    assert set(seen) == {False}


def test_depthwise_layers_run_direct_without_timing(calibrating, monkeypatch, rng):
    _fake_times(monkeypatch, calibrating, {})
    x, w = _layer(rng, C=4, K_=4, groups=4)
    assert K.conv2d_forward(x, w, None, padding=1, groups=4)[1].algorithm == "direct"
    assert calibrating == []


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_measured_choices_give_the_twins_numbers(calibrating, rng, dtype):
    """Real timings: whichever path wins, forward and backward equal the twin's."""
    x, w = _layer(rng, dtype)
    b = rng.standard_normal(6).astype(dtype)
    y, cache = K.conv2d_forward(x, w, b, padding=1, stride=(1, 2))
    assert cache.algorithm in algorithms.candidates(x.shape, w.shape, cache.stride, cache.pads,
                                                    cache.dilation, 1, cache.out_hw, dtype)
    ry, rcache = R.conv2d_forward(x, w, b, (1, 2), 1, 1, 1)
    dy = rng.standard_normal(y.shape).astype(dtype)
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == np.float32 else dict(rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(y, ry, **tol)
    for got, want in zip(K.conv2d_backward(dy, cache), R.conv2d_backward(dy, rcache),
                         strict=True):
        np.testing.assert_allclose(got, want, **tol)


@pytest.mark.parametrize("content", [
    b"not json", b"[1, 2]", b'{"m": 3}', b'{"m": {"s": 5}}', b"\xff\xfe", b"{" * 100_000,
])
def test_a_malformed_file_is_ignored(calibrating, monkeypatch, rng, content):
    path = calibration.cache_file()
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    _fake_times(monkeypatch, calibrating, {"image": 0.1})
    x, w = _layer(rng)
    assert K.conv2d_forward(x, w, None, padding=1)[1].algorithm == "image"
    assert calibrating  # timed: nothing usable was read


def test_unknown_paths_and_oversized_files_are_not_used(calibrating, monkeypatch, rng):
    x, w = _layer(rng)
    _, cache = K.conv2d_forward(x, w, None, padding=1)  # learn the keys
    machine = calibration.machine_key()
    shape = calibration.shape_key(x, w, cache)
    path = calibration.cache_file()
    for table in ({machine: {shape: "os.system"}}, {machine: {shape: "packed"}, "pad": "x" *
                                                    calibration.MAX_FILE_BYTES}):
        path.write_text(json.dumps(table))
        monkeypatch.setattr(calibration, "_known", None)
        calibrating.clear()
        _fake_times(monkeypatch, calibrating, {"im2col": 0.1})
        assert K.conv2d_forward(x, w, None, padding=1)[1].algorithm == "im2col"
        assert calibrating


def test_an_unwritable_cache_folder_keeps_the_choice_in_memory(calibrating, monkeypatch,
                                                               tmp_path, rng):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))  # a file, not a folder
    _fake_times(monkeypatch, calibrating, {"window": 0.1})
    x, w = _layer(rng)
    assert K.conv2d_forward(x, w, None, padding=1)[1].algorithm == "window"
    calibrating.clear()
    assert K.conv2d_forward(x, w, None, padding=1)[1].algorithm == "window"
    assert calibrating == []
