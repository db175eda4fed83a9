"""The options of ``coec select``, each default the config schema's
(``coec.config.schema.config_field``). No torch import here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from coec.config.schema import config_field


@dataclass(frozen=True)
class SelectOptions:
    """``coec select``: the score ``method`` and its variant ``options`` (``select.SCORE_OPTIONS``;
    None: the paper's formula), the pruning ``ratio``, the rounding of kept KV groups, and the
    kept MLP width's rule (``channel_multiple`` / ``channel_rounding``, ``coec.select.widths``)."""

    method: str
    ratio: float
    group_rounding: str = config_field("group_rounding")
    options: dict[str, Any] | None = None
    channel_multiple: int = config_field("channel_multiple")
    channel_rounding: str = config_field("channel_rounding")
