"""The options of ``coec select``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from coec.select.rounding import DEFAULT_ROUNDING


@dataclass(frozen=True)
class SelectOptions:
    """``coec select``: the score ``method`` and its variant ``options`` (``select.SCORE_OPTIONS``;
    None: the paper's formula), the pruning ``ratio``, the rounding of kept KV groups, and the
    kept MLP width's rule (``channel_multiple`` / ``channel_rounding``, ``coec.select.widths``)."""

    method: str
    ratio: float
    group_rounding: str = DEFAULT_ROUNDING
    options: dict[str, Any] | None = None
    channel_multiple: int = 1
    channel_rounding: str = DEFAULT_ROUNDING
