"""How the stages reach a cell's model: loaded whole (:func:`build_cell`) or streamed layer by
layer (:func:`open_model`), and which of the two an evaluation takes (:func:`open_cell`).

Calibration always streams; evaluation streams when the checkpoint is larger than
``compute.stream_eval_above_gb`` (:func:`streams`). The stage bodies (``coec.calibrate.stage``,
``coec.evaluate.stage``, ...) are one each, whichever way the layers are reached. Every function
here reads the cell's sources as the job resolved them (``coec.model.source.resolve_source``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import torch
from transformers import AutoTokenizer

from coec.evaluate.layerwise import perplexity_streamed
from coec.evaluate.ppl import OnLogits, perplexity
from coec.io import artifacts
from coec.model.checkpoint import Checkpoint
from coec.model.load import hub_kwargs, load_resolved
from coec.model.prune import install_weights_, prune_model_
from coec.model.source import CellSource, resolve_source
from coec.model.stream_options import StreamOptions
from coec.model.streamed import CellWeights, StreamedModel
from coec.report.cost import GIB

log = logging.getLogger(__name__)


def streams(source: CellSource, stream: StreamOptions) -> bool:
    """Whether an evaluation stage streams the model: its safetensors checkpoint is larger than
    ``compute.stream_eval_above_gb`` GiB (0: always), and no ``device_map`` spreads it over devices."""
    if source.device_map:
        return False
    return Checkpoint(resolve_source(source).local.model_dir).nbytes() > stream.stream_above_bytes()


def open_model(source: CellSource) -> tuple[StreamedModel, Any]:
    """(streamed model of a cell, tokenizer): :func:`build_cell` without the weights."""
    source = resolve_source(source)
    model_dir = source.local.model_dir
    sm = StreamedModel(model_dir, source.dtype, source.device, None, *source.hub)
    if source.keep or source.comp:
        sm.cell = CellWeights(source.keep, list(source.comp), sm.n_layers, keep=source.local.keep_for(sm.n_layers))
    log.info(
        "streaming %s (%s, %s, %.2f GiB on disk) layer by layer on %s",
        source.model,
        sm.config.model_type,
        source.dtype,
        sm.ckpt.nbytes() / GIB,
        sm.device,
    )
    return sm, AutoTokenizer.from_pretrained(model_dir, **hub_kwargs(*source.hub))


def load_source(source: CellSource) -> tuple[Any, Any]:
    """(model, tokenizer) of a cell's dense model (``model.load.load_model``) from the folder the
    job resolved (:func:`resolve_source`), in ``source.dtype`` on ``source.device`` (or spread by
    ``source.device_map``)."""
    t0 = time.time()
    source = resolve_source(source)
    return load_resolved(source.local.model_dir, source.dtype, source.device, source.hub, source.device_map,
                         (source.model, t0))  # fmt: skip


def build_cell(source: CellSource) -> tuple[Any, Any]:
    """Load the dense model (on ``source.device``, or spread by ``source.device_map``), then prune
    it by its keep.json (if any) and install the compensated weights of its block files.
    Returns (model, tokenizer)."""
    source = resolve_source(source)
    model, tok = load_source(source)
    keep = source.local.keep_for(model.config.num_hidden_layers)
    if keep is not None:
        prune_model_(model, keep)
    install_weights_(model, artifacts.read_comp_blocks(list(source.comp)))
    return model, tok


def build_model(
    model_src: str, dtype: str, device: str | None, keep_path: str | None = None, comp_files: list[str] | None = None
) -> tuple[Any, Any]:
    """:func:`build_cell` of a local cell (no hub revision, no device map), as tests and the
    deploy worker name it."""
    return build_cell(CellSource(model_src, dtype, device, keep=keep_path, comp=tuple(comp_files or ())))


@dataclass
class CellModel:
    """A cell's model as an evaluation stage reaches it, the one part the two paths differ in:
    loaded whole (``loaded``), or streamed layer by layer (``streamed``, holding at most
    ``budget`` bytes of hidden states)."""

    tokenizer: Any
    loaded: torch.nn.Module | None = None
    streamed: StreamedModel | None = None
    budget: float = float("inf")

    def params(self) -> int:
        """The cell's parameter count."""
        if self.streamed is not None:
            return self.streamed.param_count()
        assert self.loaded is not None
        return sum(p.numel() for p in self.loaded.parameters())

    def perplexity(self, windows: torch.Tensor, batch_size: int, on_logits: OnLogits | None = None) -> dict[str, Any]:
        """``evaluate.ppl.perplexity`` of the cell over (n, seqlen) windows; ``on_logits`` sees
        every batch's logits (e.g. ``evaluate.kl.KlMeter``)."""
        if self.streamed is not None:
            return perplexity_streamed(self.streamed, windows, batch_size, self.budget, on_logits=on_logits)
        assert self.loaded is not None
        return perplexity(self.loaded, windows, batch_size=batch_size, on_logits=on_logits)

    def lm(self, batch_size: int, max_length: int) -> Any:
        """The lm-eval ``LM`` of a streamed cell (``LayerwiseLM``); None: lm-eval's ``HFLM``
        around the loaded model."""
        if self.streamed is None:
            return None
        from coec.evaluate.layerwise_lm import LayerwiseLM  # deferred: lm_eval is an optional dependency

        return LayerwiseLM(self.streamed, self.tokenizer, batch_size=batch_size, max_length=max_length,
                           budget_bytes=self.budget)  # fmt: skip


def open_cell(source: CellSource, stream: StreamOptions) -> CellModel:
    """The cell of an evaluation stage: streamed when :func:`streams` says so, else loaded whole
    (:func:`build_cell`)."""
    source = resolve_source(source)
    if streams(source, stream):
        sm, tok = open_model(source)
        return CellModel(tok, streamed=sm, budget=stream.budget_bytes())
    model, tok = build_cell(source)
    return CellModel(tok, loaded=model)
