"""The evaluation stages of a cell: ``coec ppl`` (perplexity), ``coec zeroshot`` (lm-eval
accuracy) and ``coec geometry`` (App. C measurements). ppl and zeroshot reach the cell's model
streamed or loaded (``coec.model.cell.open_cell``) and give the same record either way."""

from __future__ import annotations

import logging
import time
from typing import Any

import pandas as pd
import torch

from coec.data import text as data
from coec.evaluate.geometry import module_geometry
from coec.evaluate.kl import kl_record
from coec.evaluate.kl_reference import reference_meter
from coec.evaluate.options import PplOptions, ZeroshotOptions
from coec.evaluate.ppl import ppl_record
from coec.evaluate.zeroshot import write_zeroshot, zeroshot_with_records
from coec.io import artifacts
from coec.io.artifacts import log_timings
from coec.io.progress import bar as progress_bar
from coec.model.arch import attention_shape, o_proj_columns, pruned_value_proj
from coec.model.cell import open_cell
from coec.model.checkpoint import Checkpoint
from coec.model.load import layer_tensor_names
from coec.model.source import CellSource, resolve_source, source_config

log = logging.getLogger(__name__)


def run_ppl(source: CellSource, options: PplOptions, out: str) -> dict[str, Any]:
    """Perplexity of the (pruned, compensated) model -> ppl.json, the same whether the cell is
    loaded or streams (:func:`open_cell`); with ``options.kl_reference`` also the mean token KL
    to the dense model (``kl``, ``kl_reference``; the reference checked before any scoring)."""
    t0 = time.time()
    source = resolve_source(source)
    cell = open_cell(source, options.stream)
    tokens = data.tokenize_text(cell.tokenizer, data.load_split(options.dataset, "eval"))
    windows = data.eval_windows(tokens, options.seqlen, options.max_windows)
    prov = source.provenance()
    kl = reference_meter(options.kl_reference, windows, prov, source.model) if options.kl_reference else None
    res = cell.perplexity(windows, options.batch_size, on_logits=kl[0] if kl else None)
    ppl_record(res, prov, source, options, cell.params(), t0)
    if kl:
        res.update(kl_record(kl[0].mean(), kl[0].rows, kl[1]))
    log_timings(str(out), res)
    artifacts.write_result(out, res, "ppl")  # timings stay in the log
    how = "; streamed" if cell.streamed is not None else ""
    log.info("ppl %.4f over %d tokens (%s%s)", res["ppl"], res["tokens_scored"], out, how)
    return res


def run_zeroshot(source: CellSource, options: ZeroshotOptions, out: str) -> dict[str, Any]:
    """Zero-shot accuracy (lm-eval) of the (pruned, compensated) model: the summary in ``out``
    (zeroshot.json), lm-eval's own records next to it (``zeroshot_lm_eval.json``;
    ``zeroshot_samples/<task>.jsonl`` with ``log_samples``; docs/zeroshot.md), the same whether
    the cell is loaded or streams (:func:`open_cell`; streamed: ``LayerwiseLM``)."""
    t0 = time.time()
    source = resolve_source(source)
    cell = open_cell(source, options.stream)
    lm = cell.lm(options.batch_size, options.max_length)
    res, records = zeroshot_with_records(cell.loaded, cell.tokenizer, options, lm=lm)
    return write_zeroshot(out, res, records, source.provenance(), source, t0)


GEOMETRY_RANKS = {"o_proj": 16, "down_proj": 64}


def run_geometry(source: CellSource, out: str) -> list[dict[str, Any]]:
    """App. C measurements of every layer's o_proj (r_p = 16) and down_proj (r = 64) of the cell
    ``source`` (its keep set and blocks) -> geometry.csv (uncompensated cells measure W_K
    against itself)."""
    source, model_dir, cfg = source_config(source)
    geom = attention_shape(cfg)
    keep = source.local.keep_for(cfg.num_hidden_layers)
    if keep is None:
        raise ValueError("geometry needs the cell's keep.json (--keep)")
    comp = artifacts.read_comp_blocks(list(source.comp))
    rows = []
    ckpt = Checkpoint(model_dir)
    for i, k in progress_bar(list(enumerate(keep["layers"])), desc="geometry", unit="layer"):
        names = layer_tensor_names(i, cfg)
        w = ckpt.read([names["o_proj"], names["down_proj"], names["v_proj"]], check_finite=True)
        for module, cols in (
            ("o_proj", o_proj_columns(k["kv_groups"], geom)),
            ("down_proj", torch.tensor(k["channels"], dtype=torch.long)),
        ):
            W0 = w[names[module]].double()
            W_comp = comp.get(f"layer{i}.{module}.weight", W0[:, cols])
            vp = pruned_value_proj(w[names["v_proj"]], k["kv_groups"], geom) if module == "o_proj" else None
            r = min(GEOMETRY_RANKS[module], len(cols) - 1, W0.shape[0] - 1)
            row = {"layer": i, "module": module}
            row.update(module_geometry(W0, cols, W_comp, r, value_proj=vp))
            rows.append(row)
    artifacts.write_csv(out, pd.DataFrame(rows))
    return rows
