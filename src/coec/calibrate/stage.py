"""The ``coec calibrate`` stage: the Gram pass over the streamed dense model -> a Gram folder."""

from __future__ import annotations

from typing import Any

import torch

from coec.calibrate.layer_pass import PassOptions
from coec.calibrate.options import CalibrateOptions
from coec.calibrate.streamed import calibrate_streamed
from coec.data import text as data
from coec.model.cell import open_model
from coec.model.source import CellSource, resolve_source


def run_calibrate(source: CellSource, options: CalibrateOptions, out_dir: str) -> dict[str, Any]:
    """Grams of every layer's o_proj and down_proj inputs -> ``out_dir/layer{i}.safetensors``,
    each layer read from the checkpoint when the pass reaches it; a killed pass resumes
    (``streaming.calibrate``). The files are those of ``calibrate_to_dir`` on the loaded model."""
    source = resolve_source(source)
    w = options.windows
    torch.manual_seed(w.seed)
    sm, tok = open_model(source)
    ids = data.calibration_ids(tok, w.dataset, w.nsamples, w.seqlen, w.seed)
    meta = {
        "model": source.provenance(),
        "dataset": w.dataset,
        "nsamples": w.nsamples,
        "seed": w.seed,
        "dtype": source.dtype,
    }
    stream = options.stream
    run = PassOptions(w.batch_size, options.gram_dtype, stream.budget_bytes(), stream.checkpoint_seconds())
    return calibrate_streamed(sm, ids, out_dir, run, meta)
