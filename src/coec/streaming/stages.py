"""Stage entry points over a streamed model: calibrate, perplexity, zero-shot.

Each mirrors its ``coec.pipeline`` twin (same inputs, same artifact, byte for byte where the
tests say so) but never loads the whole model: calibration always streams, evaluation streams
when the checkpoint is larger than ``compute.stream_eval_above_gb`` (:func:`streams`). The
settings' defaults live in the config schema (``compute.*``); None means that default.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch

from .. import artifacts, data
from ..models import hub_kwargs, resolve_model_dir
from ..provenance import model_provenance
from .checkpoint import Checkpoint
from .model import CellWeights, StreamedModel

log = logging.getLogger(__name__)

GIB = 2**30


def setting(key: str, value):
    """``value``, or the schema default of ``compute.<key>`` when it is None."""
    if value is not None:
        return value
    from ..config import schema_default

    return schema_default(f"compute.{key}")


def budget_bytes(hidden_budget_gb: float | None) -> float:
    """The hidden-state budget in bytes (``compute.hidden_cache_budget_gb``, GiB)."""
    return float(setting("hidden_cache_budget_gb", hidden_budget_gb)) * GIB


def streams(
    model_src: str,
    revision: str | None = None,
    trust_remote_code: bool = False,
    stream_eval_above_gb: float | None = None,
    device_map: str | None = None,
) -> bool:
    """Whether an evaluation stage streams the model: its safetensors checkpoint is larger than
    ``stream_eval_above_gb`` GiB (0: always), and no ``device_map`` spreads it over devices."""
    if device_map:
        return False
    limit = float(setting("stream_eval_above_gb", stream_eval_above_gb))
    model_dir = resolve_model_dir(model_src, revision, trust_remote_code)
    return Checkpoint(model_dir).nbytes() > limit * GIB


def _tokenizer(model_dir: Path, revision: str | None, trust_remote_code: bool):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir, **hub_kwargs(revision, trust_remote_code))


def open_model(
    model_src: str,
    dtype: str,
    device: str | None,
    keep_path: str | None = None,
    comp_files: list[str] | None = None,
    revision: str | None = None,
    trust_remote_code: bool = False,
) -> tuple[StreamedModel, object]:
    """(streamed model of a cell, tokenizer): ``pipeline.build_model`` without the weights."""
    model_dir = resolve_model_dir(model_src, revision, trust_remote_code)
    sm = StreamedModel(model_dir, dtype, device, None, revision, trust_remote_code)
    if keep_path or comp_files:
        sm.cell = CellWeights(keep_path, comp_files, sm.n_layers)
    log.info(
        "streaming %s (%s, %s, %.2f GiB on disk) layer by layer on %s",
        model_src,
        sm.config.model_type,
        dtype,
        sm.ckpt.nbytes() / GIB,
        sm.device,
    )
    return sm, _tokenizer(model_dir, revision, trust_remote_code)


def stream_calibrate(
    model_src: str,
    dataset: dict,
    out_dir: str,
    nsamples: int,
    seqlen: int,
    seed: int,
    batch_size: int,
    dtype: str,
    device: str | None,
    gram_dtype: str,
    revision: str | None = None,
    trust_remote_code: bool = False,
    hidden_budget_gb: float | None = None,
    checkpoint_minutes: float | None = None,
) -> dict:
    """``pipeline.run_calibrate`` one layer at a time, resumable (``streaming.calibrate``)."""
    from .calibrate import calibrate_streamed

    torch.manual_seed(seed)
    sm, tok = open_model(model_src, dtype, device, revision=revision, trust_remote_code=trust_remote_code)
    ids = data.calibration_ids(tok, dataset, nsamples, seqlen, seed)
    meta = {
        "model": model_provenance(model_src, revision, trust_remote_code),
        "dataset": dataset,
        "nsamples": nsamples,
        "seed": seed,
        "dtype": dtype,
    }
    minutes = float(setting("calibrate_checkpoint_minutes", checkpoint_minutes))
    return calibrate_streamed(
        sm,
        ids,
        out_dir,
        batch_size=batch_size,
        gram_dtype=gram_dtype,
        meta=meta,
        budget_bytes=budget_bytes(hidden_budget_gb),
        checkpoint_seconds=60.0 * minutes,
    )


def stream_ppl(
    model_src: str,
    dataset: dict,
    seqlen: int,
    max_windows: int | None,
    batch_size: int,
    dtype: str,
    device: str | None,
    out: str,
    keep_path: str | None = None,
    comp_files: list[str] | None = None,
    cell: dict | None = None,
    revision: str | None = None,
    trust_remote_code: bool = False,
    hidden_budget_gb: float | None = None,
) -> dict:
    """``pipeline.run_ppl`` layer-sequentially: the same ppl.json."""
    from ..evaluate.layerwise import perplexity_streamed
    from ..evaluate.ppl import ppl_record

    t0 = time.time()
    sm, tok = open_model(model_src, dtype, device, keep_path, comp_files, revision, trust_remote_code)
    tokens = data.tokenize_text(tok, data.load_split(dataset, "eval"))
    windows = data.eval_windows(tokens, seqlen, max_windows)
    res = perplexity_streamed(sm, windows, batch_size, budget_bytes(hidden_budget_gb))
    prov = model_provenance(model_src, revision, trust_remote_code)
    ppl_record(res, prov, dataset, dtype, max_windows, sm.param_count(), cell, t0)
    from ..artifacts import log_timings

    log_timings(str(out), res)
    artifacts.write_result(out, res, "ppl")  # timings stay in the log
    log.info("ppl %.4f over %d tokens (%s; streamed)", res["ppl"], res["tokens_scored"], out)
    return res


def stream_zeroshot(
    model_src: str,
    tasks: list[str],
    data_dir: str | None,
    limit: int | None,
    batch_size: int,
    max_length: int,
    dtype: str,
    device: str | None,
    out: str,
    keep_path: str | None = None,
    comp_files: list[str] | None = None,
    cell: dict | None = None,
    log_samples: bool = True,
    revision: str | None = None,
    trust_remote_code: bool = False,
    hidden_budget_gb: float | None = None,
) -> dict:
    """``pipeline.run_zeroshot`` with every request scored layer by layer (``LayerwiseLM``)."""
    from ..evaluate.layerwise_lm import LayerwiseLM
    from ..evaluate.zeroshot import write_zeroshot, zeroshot_with_records

    t0 = time.time()
    sm, tok = open_model(model_src, dtype, device, keep_path, comp_files, revision, trust_remote_code)
    lm = LayerwiseLM(sm, tok, batch_size=batch_size, max_length=max_length, budget_bytes=budget_bytes(hidden_budget_gb))
    res, records = zeroshot_with_records(
        None,
        tok,
        tasks,
        data_dir=data_dir,
        limit=limit,
        batch_size=batch_size,
        max_length=max_length,
        log_samples=log_samples,
        lm=lm,
    )
    provenance = model_provenance(model_src, revision, trust_remote_code)
    return write_zeroshot(out, res, records, provenance, dtype, cell, t0)
