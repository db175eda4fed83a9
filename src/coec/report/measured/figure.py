"""The measured table's figure: decode and prefill speedup of each cell over the dense model, per
runtime and type (solid), beside its bound (dashed: bytes read per decoded token, FLOPs per
prefill token)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from coec.report.rendering import save_figure, set_caption

if TYPE_CHECKING:
    import pandas as pd


def plot_measured(df: pd.DataFrame, out: str | Path, caption: str = "") -> None:
    """Two panels (decode, prefill) over the cells in table order; ``df`` is the measured table."""
    import matplotlib  # deferred: the Agg backend is chosen before pyplot loads

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # deferred: after matplotlib.use("Agg")

    cells = list(dict.fromkeys(df["cell"]))
    x = {c: i for i, c in enumerate(cells)}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    panels = (("decode_speedup", "byte_bound", "decode (batch 1)"), ("prefill_speedup", "flop_bound", "prefill"))
    for ax, (speed, bound, title) in zip(axes, panels, strict=True):
        for i, ((runtime, typ), d) in enumerate(df.groupby(["runtime", "type"], sort=False)):
            color = f"C{i}"
            xs = [x[c] for c in d["cell"]]
            ax.plot(xs, d[speed], "o-", color=color, label=f"{runtime} {typ}")
            ax.plot(xs, d[bound], "x--", color=color, alpha=0.6)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xticks(range(len(cells)), cells, rotation=20, ha="right", fontsize=8)
        ax.set_title(f"{title}: measured (solid) and bound (dashed)", fontsize=9)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("speedup over dense")
    axes[0].legend(fontsize=7)
    set_caption(fig, caption or "Measured deployment cost")
    save_figure(fig, out)
    plt.close(fig)
