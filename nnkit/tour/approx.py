"""The ``nnkit tour`` section for nk.approx: construction vs prediction, in seconds, and
Barron's rate (notes §2.4, Theorem 2.7) measured on trained networks."""

from __future__ import annotations

import numpy as np

from ..approx import constructions as C
from ..approx.barron import barron_experiment
from ..approx.regions import count_linear_regions
from .common import pyplot, tour_row

__all__ = ["approx_section"]

SIN, INTERVAL = np.sin, (0.0, 10.0)


def bins_table(ms=(15, 50, 150, 400), n_points: int = 400_000) -> list[dict]:
    """Measured MSE of sigmoid_bins(sin, m, [0, 10]) next to Delta^2 mean(g'^2) / 12."""
    rows = []
    for m in ms:
        net = C.sigmoid_bins(SIN, m, INTERVAL)
        rows.append({"m": m, "measured": C.mean_squared_error(net, SIN, INTERVAL, n_points),
                     "predicted": C.predicted_bin_mse(SIN, m, INTERVAL)})
    return rows


def _plot(rows, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ms = [r["m"] for r in rows]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.loglog(ms, [r["measured"] for r in rows], "o-", label="sigmoid bins, measured")
    ax.loglog(ms, [r["predicted"] for r in rows], "k--", label=r"$\Delta^2\,\overline{g'^2}/12$")
    ax.set_xlabel("bins m (2m sigmoid units)")
    ax.set_ylabel("mean squared error")
    ax.set_title("g = sin on [0, 10]")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def approx_section(ctx) -> list[dict]:
    """Rows: bins' MSE vs prediction for a few m, the log-log slope, a region count."""
    rows = bins_table((15, 50, 150) if ctx.quick else (15, 50, 150, 400))
    out = []
    for r in rows:
        ratio = r["measured"] / r["predicted"]
        out.append(tour_row("approximation", f"sigmoid bins m={r['m']} MSE",
                            f"{r['measured']:.3g}", f"{r['predicted']:.3g} +-20%",
                            abs(ratio - 1) <= 0.2))
    ms = np.array([r["m"] for r in rows])
    slope = np.polyfit(np.log(ms), np.log([r["measured"] for r in rows]), 1)[0]
    out.append(tour_row("approximation", "log-log slope of MSE in m", f"{slope:.3f}",
                        "-2 +- 0.2", abs(slope + 2) <= 0.2))
    out.append(_regions_row(ctx.seed))
    if ctx.plots:
        _plot(rows, ctx.out_dir / "approx_bins.png")
    out.extend(_barron_rows(ctx))
    return out


BARRON_TARGET = -0.6  # the slope a row must reach; Theorem 2.7 gives -1 for the best nets


def _barron_rows(ctx) -> list[dict]:
    """The log-log slope of held-out MSE against width m per dimension d (Theorem 2.7).

    Quick: d = 8, m = 2..16, 800 steps (seconds). Full: d = 2, 8, 32, m = 2..32, 1500
    steps, and the plot ``approx_barron.png``."""
    if ctx.quick:
        res = barron_experiment(dims=(8,), widths=(2, 4, 8, 16), steps=800, batch_size=512,
                                random_state=ctx.seed)
    else:
        res = barron_experiment(dims=(2, 8, 32), widths=(2, 4, 8, 16, 32),
                                random_state=ctx.seed)
    rows = [tour_row("approximation", f"Barron: slope of MSE in m, d={d}", f"{slope:.2f}",
                     f"<= {BARRON_TARGET} (best nets: <= -1)", slope <= BARRON_TARGET)
            for d, slope in res.slopes.items()]
    plt = pyplot() if ctx.plots else None
    if plt is not None:
        fig, ax = plt.subplots(figsize=(5, 3.5))
        res.plot(ax, title="Barron's rate, trained tanh networks")
        fig.tight_layout()
        fig.savefig(ctx.out_dir / "approx_barron.png", dpi=110)
        plt.close(fig)
    return rows


def _regions_row(seed: int) -> dict:
    from .. import nn
    from .._random import manual_seed

    manual_seed(seed)
    net = nn.Sequential(nn.Linear(2, 32, dtype=np.float64), nn.ReLU())
    W, b = net[0].weight.data, net[0].bias.data
    i, j = np.triu_indices(32, 1)
    det = W[i, 0] * W[j, 1] - W[i, 1] * W[j, 0]
    px = (W[i, 1] * b[j] - W[j, 1] * b[i]) / det  # every pairwise intersection (Cramer)
    py = (W[j, 0] * b[i] - W[i, 0] * b[j]) / det
    r = 2 * max(np.abs(px).max(), np.abs(py).max()) + 1  # a box holding all of them
    count = count_linear_regions(net, [(-r, r), (-r, r)])
    target = 1 + 32 + 32 * 31 // 2
    return tour_row("approximation", "regions of 32 ReLUs on R^2 (exact)", str(int(count)),
                    f"{target} (Zaslavsky)", count == target)
