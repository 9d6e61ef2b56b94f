"""The window convolution's C threads (nnkit/_ext/part_threads.h) after pauses: the forward
of (32, 3, 32, 32) -> 16 3x3 padding 1 (0.1-0.3 ms of work, so a slow hand-off shows) on one
run of images and on two, called back to back or after a pause of 0.3 or 1 ms, with the
threads' spin before sleeping at its default (100 us) and at 0. Mean and minimum of 300
calls, ms. On a virtual machine whose idle CPU looks preempted to the guest, two runs that
a sleeping worker starts late are no faster than one.

    python benchmarks/bench_conv_threads.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import environment, same_allocator  # noqa: E402


def main() -> None:
    same_allocator()
    from nnkit._ext import conv_window
    from nnkit.kernels.conv.cpu_window import pack
    from nnkit.tour import format_table

    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, 3, 32, 32)).astype(np.float32)
    wp = pack(rng.standard_normal((16, 27)).astype(np.float32))
    y = np.empty((32, 16, 32, 32), np.float32)
    geometry = (3, 32, 32, 16, 3, 3, 1, 1, 1, 1, 32, 32, 1, 1)
    default_spin = conv_window.set_spin(0)
    rows = []
    for spin in (default_spin, 0):
        conv_window.set_spin(spin)
        for pause in (0.0, 0.3e-3, 1e-3):
            row = {"spin_us": spin // 1000, "pause_ms": pause * 1e3}
            for threads in (1, 2):
                times = []
                for _ in range(300):
                    if pause:
                        time.sleep(pause)
                    start = time.perf_counter()
                    conv_window.forward(x, wp, None, y, geometry, threads)
                    times.append(time.perf_counter() - start)
                row[f"{threads} thread(s) mean"] = f"{np.mean(times) * 1e3:.3f}"
                row[f"{threads} thread(s) min"] = f"{np.min(times) * 1e3:.3f}"
            rows.append(row)
    conv_window.set_spin(default_spin)
    print(environment())
    print(format_table(rows, list(rows[0])))


if __name__ == "__main__":
    main()
