"""The options of ``coec calibrate`` (and the calibration windows ``coec imatrix`` shares), each
default the config schema's (``coec.config.schema.config_field``). No torch import here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from coec.config.schema import config_field
from coec.model.stream_options import StreamOptions


@dataclass(frozen=True)
class CalibrationWindows:
    """``nsamples`` windows of ``seqlen`` tokens drawn from ``dataset`` (``data.load_split`` spec)
    with ``seed``, run ``batch_size`` at a time (``coec calibrate``, ``coec imatrix``)."""

    dataset: dict[str, Any]
    nsamples: int
    seqlen: int
    seed: int = config_field("calibration.*.seed")
    batch_size: int = config_field("calibration.*.batch_size")


@dataclass(frozen=True)
class CalibrateOptions:
    """``coec calibrate``: the windows, the stored Grams' dtype, the streaming settings."""

    windows: CalibrationWindows
    gram_dtype: str = config_field("calibration.*.gram_dtype")
    stream: StreamOptions = StreamOptions()
