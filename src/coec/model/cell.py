"""How the stages reach a streamed model: whether an evaluation streams, and the streamed
model of a cell with its tokenizer.

Calibration always streams; evaluation streams when the checkpoint is larger than
``compute.stream_eval_above_gb`` (:func:`streams`). The stage bodies are those of
``coec.pipeline``: one each, whichever way the layers are reached.
"""

from __future__ import annotations

import logging
from typing import Any

from transformers import AutoTokenizer

from coec.model.checkpoint import Checkpoint
from coec.model.load import hub_kwargs, resolve_model_dir
from coec.model.source import CellSource
from coec.model.stream_options import StreamOptions
from coec.model.streamed import CellWeights, StreamedModel
from coec.report.cost import GIB

log = logging.getLogger(__name__)


def streams(source: CellSource, stream: StreamOptions) -> bool:
    """Whether an evaluation stage streams the model: its safetensors checkpoint is larger than
    ``compute.stream_eval_above_gb`` GiB (0: always), and no ``device_map`` spreads it over devices."""
    if source.device_map:
        return False
    model_dir = resolve_model_dir(source.model, *source.hub)
    return Checkpoint(model_dir).nbytes() > stream.stream_above_bytes()


def open_model(source: CellSource) -> tuple[StreamedModel, Any]:
    """(streamed model of a cell, tokenizer): ``pipeline.build_model`` without the weights."""
    model_dir = resolve_model_dir(source.model, *source.hub)
    sm = StreamedModel(model_dir, source.dtype, source.device, None, *source.hub)
    if source.keep or source.comp:
        sm.cell = CellWeights(source.keep, list(source.comp), sm.n_layers)
    log.info(
        "streaming %s (%s, %s, %.2f GiB on disk) layer by layer on %s",
        source.model,
        sm.config.model_type,
        source.dtype,
        sm.ckpt.nbytes() / GIB,
        sm.device,
    )
    return sm, AutoTokenizer.from_pretrained(model_dir, **hub_kwargs(*source.hub))
