"""The options of ``coec ppl --gguf`` (no torch import here)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GgufPplOptions:
    """``coec ppl --gguf``: the GGUF file scored in llama.cpp with ``threads`` (None: its default)."""

    gguf: str
    threads: int | None = None
