"""Which model, which cell, and each stage's options: the typed arguments of the stage bodies.

A stage body takes ``(source, options, out)``: :class:`CellSource` says which model and which
cell (the model source at a revision, the compute dtype and device, the keep set and the
compensation blocks, the labels recorded in the output), the stage's options dataclass says what
to run on it. ``coec.cli`` builds both once from the parsed flags. No torch import here, so
``coec --help`` stays quick.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from coec.model.stream_options import StreamOptions
from coec.select.rounding import DEFAULT_ROUNDING


@dataclass(frozen=True)
class CellSource:
    """A model cell: ``model`` (folder or hub id) at ``revision``, loaded in ``dtype`` on
    ``device`` (or spread by ``device_map``), pruned by ``keep`` (keep.json; None: dense) and
    given the compensated weights of ``comp`` (block files); ``cell``: the labels recorded."""

    model: str
    dtype: str = "float32"
    device: str | None = None
    revision: str | None = None
    trust_remote_code: bool = False
    keep: str | None = None
    comp: tuple[str, ...] = ()
    cell: dict[str, Any] = field(default_factory=dict)
    device_map: str | None = None

    @property
    def hub(self) -> tuple[str | None, bool]:
        """(revision, trust_remote_code), as every load of the model and tokenizer takes them."""
        return self.revision, self.trust_remote_code


@dataclass(frozen=True)
class CalibrationWindows:
    """``nsamples`` windows of ``seqlen`` tokens drawn from ``dataset`` (``data.load_split`` spec)
    with ``seed``, run ``batch_size`` at a time (``coec calibrate``, ``coec imatrix``)."""

    dataset: dict[str, Any]
    nsamples: int
    seqlen: int
    seed: int = 0
    batch_size: int = 8


@dataclass(frozen=True)
class CalibrateOptions:
    """``coec calibrate``: the windows, the stored Grams' dtype, the streaming settings."""

    windows: CalibrationWindows
    gram_dtype: str = "float32"
    stream: StreamOptions = StreamOptions()


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


@dataclass(frozen=True)
class GgufPplOptions:
    """``coec ppl --gguf``: the GGUF file scored in llama.cpp with ``threads`` (None: its default)."""

    gguf: str
    threads: int | None = None


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
