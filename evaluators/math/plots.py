"""Pictures of constructions for `discover plot` (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from evaluators.math.autoconvolution import autoconvolution  # noqa: E402

_TITLES = {"ac1": "first autocorrelation inequality", "ac2": "second autocorrelation inequality"}


def plot_erdos(h: np.ndarray, overlap: np.ndarray, bound: float, path: str) -> None:
    """h on [0, 2] (rescaled to integral 1) and its overlap (h ⋆ (1 - h))(x) at every shift (the
    caller's `overlap_function(h)`), whose max is the bound."""
    n = len(h)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), constrained_layout=True)
    top.stairs(h, np.linspace(0.0, 2.0, n + 1), fill=True, alpha=0.6)
    top.set(xlim=(0, 2), ylim=(0, 1.05), xlabel="x", ylabel="h(x)", title=f"Erdős minimum overlap: h, {n} pieces")
    shifts = np.arange(-(n - 1), n) * (2.0 / n)
    bottom.plot(shifts, overlap, lw=1)
    bottom.axhline(bound, color="C3", ls="--", lw=1, label=f"bound {bound:.8f}")
    bottom.set(xlabel="shift", ylabel="overlap", title="overlap of h and 1 - h at each shift")
    bottom.legend(loc="lower center")
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_autoconvolution(f: np.ndarray, problem: str, bound: float, path: str) -> None:
    """f on [-1/4, 1/4] (normalised to integral 1) and its autoconvolution f * f on [-1/2, 1/2]."""
    n = len(f)
    width = 0.5 / n
    f = f / (f.sum() * width)  # integral 1, so the curves of different constructions compare
    c, _ = autoconvolution(f)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), constrained_layout=True)
    top.stairs(f, np.linspace(-0.25, 0.25, n + 1), lw=0.6)
    top.set(xlim=(-0.25, 0.25), xlabel="x", ylabel="f(x)", title=f"{_TITLES[problem]}: f, {n} pieces")
    bottom.plot(np.linspace(-0.5, 0.5, len(c) + 2), np.concatenate(([0.0], c * width, [0.0])), lw=0.8)
    if problem == "ac1":  # with integral f = 1 the maximum of f * f is the bound itself
        bottom.axhline(bound, color="C3", ls="--", lw=0.8)
    bottom.set(xlim=(-0.5, 0.5), xlabel="t", ylabel="(f * f)(t)", title=f"autoconvolution f * f; bound {bound:.8f}")
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_circles(circles: list[list[float]], total: float, tolerance: float, path: str) -> None:
    """The circles in the unit square, each numbered, with the sum of radii in the title."""
    fig, ax = plt.subplots(figsize=(6, 6), constrained_layout=True)
    ax.add_patch(plt.Rectangle((0, 0), 1, 1, fill=False, lw=1.5))
    for i, (x, y, r) in enumerate(circles):
        ax.add_patch(plt.Circle((x, y), r, alpha=0.35, ec="C0", lw=1))
        ax.text(x, y, str(i), ha="center", va="center", fontsize=7)
    ax.set(xlim=(-0.02, 1.02), ylim=(-0.02, 1.02), aspect="equal")
    ax.set_title(f"{len(circles)} circles, sum of radii {total:.7f} (tolerance {tolerance:g})")
    fig.savefig(path, dpi=120)
    plt.close(fig)
