"""The options of ``coec ppl`` and ``coec zeroshot``, each default the config schema's
(``coec.config.schema.config_field``). No torch import here."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coec.config.schema import config_field
from coec.model.stream_options import StreamOptions


@dataclass(frozen=True)
class PplOptions:
    """``coec ppl``: ``dataset``'s eval split cut into windows of ``seqlen`` tokens (at most
    ``max_windows``; None: all), scored ``batch_size`` windows at a time; with ``kl_reference``
    (the dense model's, ``coec kl-reference``) the mean token KL to the dense model too."""

    dataset: dict[str, Any]
    seqlen: int
    max_windows: int | None = None
    batch_size: int = config_field("evaluation.ppl_batch_size")
    stream: StreamOptions = StreamOptions()
    kl_reference: str | None = None


@dataclass(frozen=True)
class ZeroshotOptions:
    """``coec zeroshot``: lm-eval ``tasks`` (local data in ``data_dir``; None: lm-eval's own),
    the first ``limit`` documents of each (None: all), its batching and context length, and
    whether lm-eval's per-sample records are saved too."""

    tasks: tuple[str, ...]
    data_dir: str | Path | None = None
    limit: int | None = None
    batch_size: int = config_field("evaluation.zeroshot_batch_size")
    max_length: int = config_field("evaluation.zeroshot_max_length")
    log_samples: bool = config_field("evaluation.zeroshot_log_samples")
    stream: StreamOptions = StreamOptions()
