"""``cupy.cuda`` of the stand-in: one device (id 0), the null stream (ptr 0), events that
time with the host clock."""

import time
import types

from . import _core


class Device:
    def __init__(self, device=None):
        self.id = 0 if device is None else int(device)
        if self.id != 0:
            raise RuntimeError(f"the CuPy stand-in has one device (0), not {self.id}")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def synchronize(self):
        _core.syncdetect._declare_synchronize()


class Stream:
    ptr = 0

    def synchronize(self):
        _core.syncdetect._declare_synchronize()


def get_current_stream():
    return Stream()


class Event:
    def __init__(self, *args, **kwargs):
        self.time = None

    def record(self, stream=None):
        self.time = time.perf_counter()

    def synchronize(self):
        _core.syncdetect._declare_synchronize()


def get_elapsed_time(start, end):
    return (end.time - start.time) * 1e3


runtime = types.SimpleNamespace(
    getDeviceCount=lambda: 1,
    getDeviceProperties=lambda index: {"name": b"CuPy stand-in (NumPy)"},
)
