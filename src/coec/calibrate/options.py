"""The options of ``coec calibrate`` (and the calibration windows ``coec imatrix`` shares)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from coec.model.stream_options import StreamOptions


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
