"""The ``nnkit tour`` section for associative memories (Hopfield, dense, modern).

``hopfield_section(ctx) -> list of rows``: digits recalled from 20% noise, the capacity
transition near alpha = 0.138 located on the retrieval curve of an n = 2000 network, the flip
rate against the formula of notes §1.4, a dense associative memory far beyond it, and
modern-Hopfield one-step retrieval. Seconds on a CPU.
"""

from __future__ import annotations

import time

import numpy as np

from ..classic.hopfield import DenseAssociativeMemory, Hopfield, ModernHopfield, retrieval_curve
from ..theory import hopfield_flip_probability
from .common import INFO, tour_row

__all__ = ["hopfield_section", "digit_patterns"]

SECTION = "Hopfield"


def digit_patterns(digits=(0, 1, 4, 7), upsample=2):
    """Class means of scikit-learn's digits, upsampled, binarised against the mean over the
    ten classes: (len(digits), (8 upsample)^2) int8 in {-1, +1}."""
    from sklearn.datasets import load_digits

    data = load_digits()
    ones = np.ones((upsample, upsample))
    means = np.array([np.kron(data.images[data.target == c].mean(0), ones) for c in range(10)])
    spins = np.where(means - means.mean(0) >= 0, 1, -1).astype(np.int8)  # (10, 8u, 8u)
    return spins[list(digits)].reshape(len(digits), -1)


def _row(result, value, target="", ok=INFO):
    return tour_row(SECTION, result, value, target, ok)


def _digits(ctx, rng):
    xi = digit_patterns()
    net = Hopfield(xi.shape[1]).store(xi)
    targets = np.repeat(xi, 10 if ctx.quick else 50, axis=0)  # (probes, 256)
    noisy = targets * np.where(rng.random(targets.shape) < 0.2, -1, 1).astype(np.int8)
    final = net.run(noisy, random_state=ctx.seed).states
    recalled = float((final == targets).all(axis=1).mean())
    before = float((noisy * targets.astype(float)).mean())
    after = float((final * targets.astype(float)).mean())
    return (noisy, final), [
        _row("digits 0,1,4,7 recalled from 20% noise", f"{recalled:.3f}", ">= 0.95",
             recalled >= 0.95),
        _row("overlap before -> after", f"{before:.2f} -> {after:.3f}", "after >= 0.99",
             after >= 0.99)]


def _capacity(ctx):
    n = 500 if ctx.quick else 1000
    alphas = np.array([0.05, 0.1, 0.2])
    c = retrieval_curve(n, alphas, n_probes=10 if ctx.quick else 20, random_state=ctx.seed)
    gap = float(np.max(np.abs(c.flip_rate - hopfield_flip_probability(alphas))))
    # the transition (notes §1.4): probes from the stored patterns of an n = 2000 network
    loads = np.round(np.arange(0.10, 0.181, 0.01), 2)
    curve = retrieval_curve(2000, loads, n_probes=30 if ctx.quick else 60,
                            random_state=ctx.seed)
    where = curve.transition()
    return curve, [
        _row(f"overlap at alpha 0.1 / 0.2 (n={n})",
             f"{c.overlap[1]:.3f} / {c.overlap[2]:.3f}", "> 0.97 / < 0.7",
             c.overlap[1] > 0.97 and c.overlap[2] < 0.7),
        _row("retrieved share at alpha 0.10 / 0.18 (n=2000)",
             f"{curve.retrieved[0]:.2f} / {curve.retrieved[-1]:.2f}", "1.00 / <= 0.10",
             curve.retrieved[0] == 1.0 and curve.retrieved[-1] <= 0.1),
        _row("transition: retrieved share crosses 1/2 (n=2000)", f"alpha = {where:.3f}",
             "0.13 - 0.16 (0.138 as n -> oo)", bool(0.13 <= where <= 0.16)),
        _row("flip rate vs (1-erf(sqrt(1/2a)))/2", f"max gap {gap:.4f}", "<= 0.005",
             gap <= 0.005)]


def _dense_and_modern(ctx, rng):
    n, s = 100, 60  # alpha = 0.6
    xi = rng.choice(np.array([-1, 1], np.int8), size=(s, n))
    noisy = xi * np.where(rng.random(xi.shape) < 0.1, -1, 1).astype(np.int8)
    dam = DenseAssociativeMemory("poly", 4).store(xi).run(noisy, random_state=ctx.seed)
    hop = Hopfield(n).store(xi).run(noisy, random_state=ctx.seed)
    dense_ok = float((dam.states == xi).all(axis=1).mean())
    hop_ok = float((hop.states == xi).all(axis=1).mean())
    X = rng.standard_normal((50, 64))
    err = float(np.abs(ModernHopfield(beta=8.0).store(X).retrieve(X) - X).max())
    return [
        _row("dense (poly 4) vs Hebbian at alpha 0.6, 10% noise",
             f"{dense_ok:.2f} vs {hop_ok:.2f}", "dense >= 0.95", dense_ok >= 0.95),
        _row("modern Hopfield one step, beta 8", f"max error {err:.1e}", "<= 1e-6",
             err <= 1e-6)]


def hopfield_section(ctx) -> list[dict]:
    """Associative memories end to end; writes hopfield.png to ctx.out_dir when ctx.plots."""
    start = time.perf_counter()
    rng = np.random.default_rng(ctx.seed)
    images, rows = _digits(ctx, rng)
    curve, cap_rows = _capacity(ctx)
    rows += cap_rows + _dense_and_modern(ctx, rng)
    if ctx.plots:
        _plot(images, curve, ctx.out_dir / "hopfield.png")
    rows.append(_row("time", f"{time.perf_counter() - start:.1f} s"))
    return rows


def _plot(images, curve, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    noisy, final = images
    per = len(noisy) // 4
    fig, axes = plt.subplots(2, 5, figsize=(12, 5))
    for k in range(4):
        for r, img in enumerate((noisy[k * per], final[k * per])):
            axes[r, k].imshow(img.reshape(16, 16), cmap="gray_r")
            axes[r, k].set_title(("20% noise", "recalled")[r], fontsize=9)
            axes[r, k].axis("off")
    gs = axes[0, 4].get_gridspec()
    for ax in axes[:, 4]:
        ax.remove()
    ax = fig.add_subplot(gs[:, 4])
    ax.plot(curve.alphas, curve.overlap, "o-", label="mean final overlap")
    ax.plot(curve.alphas, curve.retrieved, "s--", label=f"share with m >= {curve.retrieved_at}")
    ax.axvline(0.138, color="gray", linestyle=":", label="alpha = 0.138")
    ax.axvline(curve.transition(), color="C3", linestyle="-", lw=0.8, label="share = 1/2")
    ax.set_xlabel("alpha = s/n")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(fontsize=7, loc="lower left")
    ax.set_title(f"retrieval from the patterns\nn = {curve.n}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
