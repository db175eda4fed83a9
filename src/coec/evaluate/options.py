"""The options of ``coec ppl`` and ``coec zeroshot``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coec.model.stream_options import StreamOptions


@dataclass(frozen=True)
class PplOptions:
    """``coec ppl``: ``dataset``'s eval split cut into windows of ``seqlen`` tokens (at most
    ``max_windows``; None: all), scored ``batch_size`` windows at a time."""

    dataset: dict[str, Any]
    seqlen: int
    max_windows: int | None = None
    batch_size: int = 4
    stream: StreamOptions = StreamOptions()


@dataclass(frozen=True)
class ZeroshotOptions:
    """``coec zeroshot``: lm-eval ``tasks`` (local data in ``data_dir``; None: lm-eval's own),
    the first ``limit`` documents of each (None: all), its batching and context length, and
    whether lm-eval's per-sample records are saved too."""

    tasks: tuple[str, ...]
    data_dir: str | Path | None = None
    limit: int | None = None
    batch_size: int = 8
    max_length: int = 2048
    log_samples: bool = True
    stream: StreamOptions = StreamOptions()
