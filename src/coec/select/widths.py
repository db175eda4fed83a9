"""Aligned MLP widths (config ``channel_multiple`` / ``channel_rounding``; docs/selection-variants.md
"Aligned widths"): the selection's rule, per selection name, as the select job's arguments, and
what keep.json records of it.

A quantizer stores a row in blocks (32 values for llama.cpp's q4_0 / q5_0 / q8_0, 256 for the
K-quants); a width that is no multiple of the block falls back to another type, and odd widths
run slower. Rounding each layer's kept channel count to a multiple avoids both. The rounding
itself is ``coec.select.scores.aligned_keep``.
"""

from __future__ import annotations

from shlex import quote as shlex_quote
from typing import Any

from coec.select.rounding import DEFAULT_ROUNDING

#: the config keys of the rule (top level, and per ``selections`` entry)
WIDTH_KEYS = ("channel_multiple", "channel_rounding")
#: the paper's rule: ceil((1 - ratio) d_ff) channels, no multiple; keep.json records nothing of it
PAPER_WIDTH = (1, DEFAULT_ROUNDING)


def selection_width(config: dict[str, Any], name: str) -> tuple[int, str]:
    """(channel_multiple, channel_rounding) of selection ``name``: its ``selections`` entry's, else
    the config's top-level values (filled from the schema)."""
    entry = (config.get("selections") or {}).get(name) or {}
    multiple, rounding = (entry.get(k, config[k]) for k in WIDTH_KEYS)
    return int(multiple), str(rounding)


def width_args(width: tuple[int, str]) -> str:
    """``--channel-multiple`` / ``--channel-rounding`` of the select job; nothing for the paper's
    rule, so the params (a rerun trigger) of every existing select job stay as they were."""
    if tuple(width) == PAPER_WIDTH:
        return ""
    multiple, rounding = width
    return f"--channel-multiple {int(multiple)} --channel-rounding {shlex_quote(rounding)}"


def realised_ratio(kept: int, width: int) -> float:
    """The pruning ratio a kept count realises: (width - kept) / width."""
    return (width - kept) / width


def width_record(
    layers: list[dict[str, Any]], d_ff: int, width: tuple[int, str]
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(top-level fields, layers) of keep.json: for a rule other than the paper's the fields
    ``channel_multiple``, ``channel_rounding`` and ``realised_channel_ratio`` (all layers' MLP
    channels), and each layer with its own ``realised_channel_ratio``; for the paper's rule
    ({}, ``layers``), so its keep.json is byte for byte what it was."""
    if tuple(width) == PAPER_WIDTH:
        return {}, layers
    kept = [len(k["channels"]) for k in layers]
    fields = {
        "channel_multiple": int(width[0]),
        "channel_rounding": width[1],
        "realised_channel_ratio": realised_ratio(sum(kept), d_ff * len(kept)),
    }
    return fields, [{**k, "realised_channel_ratio": realised_ratio(n, d_ff)} for k, n in zip(layers, kept, strict=True)]


def width_note(n: int, kept: int, steps: int, ratio: float, width: tuple[int, str]) -> str | None:
    """A log line when the rule keeps every channel of ``n`` or rounded to 0 multiples (one kept)."""
    multiple, rounding = width
    if steps < 1:
        return (
            f"channel_multiple {multiple} ({rounding}) rounds (1 - {ratio}) x {n} channels to 0: "
            f"keeping one multiple, {kept} channels"
        )
    if kept == n:
        return (
            f"channel_multiple {multiple} ({rounding}) keeps all {n} MLP channels at ratio {ratio} "
            f"(the ratio asks for {(1 - ratio) * n:.1f}): the MLP is not pruned"
        )
    return None
