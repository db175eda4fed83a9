"""The ``coec select`` stage: column scores of every layer from the checkpoint's weights and the
calibration's Grams -> keep.json."""

from __future__ import annotations

import logging
from typing import Any

from coec.io import artifacts
from coec.io.artifacts import read_gram_layer
from coec.io.progress import bar as progress_bar
from coec.model.arch import MODULES, attention_shape
from coec.model.checkpoint import Checkpoint
from coec.model.load import layer_tensor_names
from coec.model.source import CellSource, source_config
from coec.select.options import SelectOptions
from coec.select.scores import KeepRule, aligned_steps, check_multiple, select_layer, selection_spec
from coec.select.widths import PAPER_WIDTH, width_note, width_record

log = logging.getLogger(__name__)


def run_select(source: CellSource, grams: str, options: SelectOptions, out: str) -> dict[str, Any]:
    """Keep sets of every layer of ``source.model`` from the Grams in ``grams`` -> keep.json.
    ``options.options``: score variant options (recorded as ``score_options`` when any differs
    from the paper); ``channel_multiple`` / ``channel_rounding``: the kept MLP width's rule
    (recorded with the realised ratios when not the paper's). A multiple above the MLP width
    stops before anything is read or written."""
    o = options
    spec = selection_spec({"score": o.method, **(o.options or {})}, "--options")
    width = (o.channel_multiple, o.channel_rounding)
    source, model_dir, cfg = source_config(source)
    check_multiple(cfg.intermediate_size, o.channel_multiple)
    geom = attention_shape(cfg)
    rule = KeepRule(o.ratio, o.group_rounding, o.channel_rounding, o.channel_multiple)
    layers = []
    ckpt = Checkpoint(model_dir)
    for i in progress_bar(range(cfg.num_hidden_layers), desc=f"select {o.method}", unit="layer"):
        names = layer_tensor_names(i, cfg)
        w = ckpt.read([names["o_proj"], names["down_proj"]], check_finite=True)
        weights = {m: w[names[m]] for m in MODULES}
        layers.append(select_layer(spec, weights, {m: read_gram_layer(grams, i, m) for m in MODULES}, geom, rule))
    if width != PAPER_WIDTH:
        n = cfg.intermediate_size
        note = width_note(n, len(layers[0]["channels"]), aligned_steps(n, o.ratio, *width), o.ratio, width)
        if note:
            log.warning(note)
    fields, layers = width_record(layers, cfg.intermediate_size, width)
    keep = {
        "selection": o.method,
        "ratio": o.ratio,
        "group_rounding": o.group_rounding,
        "n_kv": geom.n_kv,
        "n_heads": geom.n_heads,
        "head_dim": geom.head_dim,
        "d_ff": cfg.intermediate_size,
        **fields,
        "layers": layers,
        "model": source.provenance(),
    }
    if spec.options():
        keep["score_options"] = spec.options()
    artifacts.write_json(out, keep, "keep")
    return keep
