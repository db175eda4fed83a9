"""Rendering of results: a table as GitHub Markdown, a figure's caption and its atomic save.
Shared by the paper's tables and figures (``coec.report.tables``) and the measured deployment table
(``coec.report.measured``)."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from coec.io import atomic

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def to_markdown(
    df: pd.DataFrame, digits: int = 2, caption: str = "", column_digits: dict[str, int] | None = None
) -> str:
    """A GitHub Markdown table (no extra dependency), numbers rounded to ``digits`` (a column
    named in ``column_digits`` to its own)."""
    places = [(column_digits or {}).get(c, digits) for c in df.columns]

    def fmt(v: object, d: int) -> str:
        if isinstance(v, float):
            return "–" if math.isnan(v) else f"{v:.{d}f}"
        return str(v)

    head = "| " + " | ".join(df.columns) + " |"
    sep = "|" + "|".join("---" for _ in df.columns) + "|"
    body = [
        "| " + " | ".join(fmt(v, d) for v, d in zip(row, places, strict=True)) + " |"
        for row in df.itertuples(index=False)
    ]
    text = "\n".join([head, sep, *body]) + "\n"
    return f"{caption}\n\n{text}" if caption else text


def set_caption(fig: Figure, text: str, width: int = 150) -> None:
    """The caption as a wrapped title, with room kept for it above the panels; lines no wider
    than the figure (about 14 characters an inch at 8 pt: a one-panel figure is 4.2 in wide)."""
    lines = textwrap.wrap(text, min(width, int(fig.get_figwidth() * 14))) or [""]
    fig.suptitle("\n".join(lines), fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.035 * len(lines)))


def save_figure(fig: Figure, out: str | Path) -> None:
    out = Path(out)
    with atomic.atomic_path(out) as tmp:
        fig.savefig(tmp, dpi=130, format=out.suffix.lstrip(".") or "png")
