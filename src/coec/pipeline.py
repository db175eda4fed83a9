"""Stage entry points: I/O and orchestration around the pure modules.

Each function reads the previous stage's artifact, runs one stage and writes its own artifact
atomically (temp name, then rename). The CLI (``python -m coec <stage>``) maps onto these.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from coec.calibrate.layer_pass import PassOptions
from coec.calibrate.streamed import calibrate_streamed
from coec.compensate import compensate
from coec.compensate.gram_check import GramCheck
from coec.compensate.inputs import Module
from coec.compensate.method import Compensation, Method, check_module
from coec.compensate.options import Resolved, planned
from coec.compensate.options import method as registered
from coec.compensate.output_checks import MethodOutputError
from coec.data import text as data
from coec.evaluate.geometry import module_geometry
from coec.evaluate.layerwise import perplexity_streamed
from coec.evaluate.ppl import perplexity, ppl_record
from coec.evaluate.zeroshot import write_zeroshot, zeroshot_with_records
from coec.io import artifacts
from coec.io.artifacts import GramLayer, log_timings, read_gram_layer
from coec.io.progress import bar as progress_bar
from coec.io.provenance import model_provenance
from coec.model.arch import MODULES, AttnShape, attention_shape, o_proj_columns, pruned_value_proj
from coec.model.cell import open_model, streams
from coec.model.load import (
    layer_tensor_names,
    load_config,
    load_model,
    read_model_tensors,
    resolve_device,
    resolve_model_dir,
)
from coec.model.prune import install_weights_, prune_model_
from coec.model.source import CalibrateOptions, CellSource, PplOptions, SelectOptions, ZeroshotOptions
from coec.model.stream_options import StreamOptions
from coec.model.streamed import StreamedModel
from coec.select.scores import KeepRule, aligned_steps, check_multiple, select_layer, selection_spec
from coec.select.widths import PAPER_WIDTH, width_note, width_record

log = logging.getLogger(__name__)


def run_calibrate(source: CellSource, options: CalibrateOptions, out_dir: str) -> dict[str, Any]:
    """Grams of every layer's o_proj and down_proj inputs -> ``out_dir/layer{i}.safetensors``,
    each layer read from the checkpoint when the pass reaches it; a killed pass resumes
    (``streaming.calibrate``). The files are those of ``calibrate_to_dir`` on the loaded model."""
    w = options.windows
    torch.manual_seed(w.seed)
    sm, tok = open_model(source)
    ids = data.calibration_ids(tok, w.dataset, w.nsamples, w.seqlen, w.seed)
    meta = {
        "model": model_provenance(source.model, *source.hub),
        "dataset": w.dataset,
        "nsamples": w.nsamples,
        "seed": w.seed,
        "dtype": source.dtype,
    }
    stream = options.stream
    run = PassOptions(w.batch_size, options.gram_dtype, stream.budget_bytes(), stream.checkpoint_seconds())
    return calibrate_streamed(sm, ids, out_dir, run, meta)


def run_select(source: CellSource, grams: str, options: SelectOptions, out: str) -> dict[str, Any]:
    """Keep sets of every layer of ``source.model`` from the Grams in ``grams`` -> keep.json.
    ``options.options``: score variant options (recorded as ``score_options`` when any differs
    from the paper); ``channel_multiple`` / ``channel_rounding``: the kept MLP width's rule
    (recorded with the realised ratios when not the paper's). A multiple above the MLP width
    stops before anything is read or written."""
    o = options
    spec = selection_spec({"score": o.method, **(o.options or {})}, "--options")
    width = (o.channel_multiple, o.channel_rounding)
    model_dir = resolve_model_dir(source.model, *source.hub)
    cfg = load_config(model_dir, *source.hub)
    check_multiple(cfg.intermediate_size, o.channel_multiple)
    geom = attention_shape(cfg)
    rule = KeepRule(o.ratio, o.group_rounding, o.channel_rounding, o.channel_multiple)
    layers = []
    for i in progress_bar(range(cfg.num_hidden_layers), desc=f"select {o.method}", unit="layer"):
        names = layer_tensor_names(i, cfg)
        w = read_model_tensors(model_dir, [names["o_proj"], names["down_proj"]])
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
        "model": model_provenance(source.model, *source.hub, model_dir),
    }
    if spec.options():
        keep["score_options"] = spec.options()
    artifacts.write_json(out, keep, "keep")
    return keep


def run_gram_check(source: CellSource, grams: str, out: str) -> dict[str, Any]:
    """App. B's verdict on every layer's o_proj and down_proj Gram and each module's output
    energy on it (``compensate.method.check_module``) -> gram_checks/{calib}.json, read by
    every compensation job of the calibration whose method reports no errors of its own."""
    model_dir = resolve_model_dir(source.model, *source.hub)
    cfg = load_config(model_dir, *source.hub)
    dev = resolve_device(source.device)
    layers = []
    for i in progress_bar(range(cfg.num_hidden_layers), desc="gram check", unit="layer"):
        names = layer_tensor_names(i, cfg)
        w = read_model_tensors(model_dir, [names["o_proj"], names["down_proj"]])
        layer = {}
        for module in MODULES:
            chk = check_module(w[names[module]].to(dev), read_gram_layer(grams, i, module)["gram"].to(dev))
            layer[module] = chk.to_json()
            if chk.psd.get("indefinite"):
                log.info(
                    "layer %d %s: indefinite Gram (min eig %s): PSD projection", i, module, _num(chk.psd["min_eig"])
                )
        layers.append(layer)
    result = {"layers": layers, "model": model_provenance(source.model, *source.hub, model_dir)}
    artifacts.write_json(out, result, "gram-check")
    return result


def _num(x: object) -> str:
    """A logged number: 4 significant digits, or n/a (info stores non-finite values as None)."""
    return f"{x:.4g}" if isinstance(x, (int, float)) else "n/a"


def _log_module(i: int, module: str, method: str, info: dict[str, Any]) -> None:
    wo = info.get("relerr_after_weight_only")
    log.info(
        "layer %d %s: %s relerr %s -> %s%s%s",
        i,
        module,
        method,
        _num(info.get("relerr_before")),
        _num(info.get("relerr_after")),
        f" with its bias (weight alone {_num(wo)})" if wo is not None else "",
        " (indefinite Gram: PSD projection)" if info.get("gram_psd", {}).get("indefinite") else "",
    )


@dataclass(frozen=True)
class CompensateOptions:
    """``coec compensate``: the config ``compensations`` entry ``spec`` (its ``inputs`` holds the
    paths of the method's declared inputs, ``Method.inputs``: another cell's block file, another
    calibration's Grams, which the workflow passes as rule inputs), the layers ``first..last``,
    and the calibration's gram_checks/{calib}.json (``run_gram_check``; read by methods without
    errors of their own)."""

    spec: dict[str, Any]
    first: int
    last: int
    gram_check: str | None = None


@dataclass(frozen=True)
class _Job:
    """What every module of a compensation job shares."""

    method: Method
    options: dict[str, Resolved]  # per module, as planning validated them (options.planned)
    geom: AttnShape
    device: torch.device
    checks: list[dict[str, GramCheck]] | None
    handles: dict[str, Any]


def run_compensate(source: CellSource, grams: str, options: CompensateOptions, out: str) -> dict[str, Any]:
    """Compensate o_proj and down_proj of layers ``first..last`` of the cell ``source`` (its
    ``keep`` names the keep.json) -> one safetensors file with ``layer{i}.{module}.weight|bias``
    and a JSON twin with each module's ``info``."""
    o = options
    model_dir = resolve_model_dir(source.model, *source.hub)
    cfg = load_config(model_dir, *source.hub)
    if source.keep is None:
        raise ValueError("compensate needs the cell's keep.json (--keep)")
    keep = artifacts.read_keep(source.keep, cfg.num_hidden_layers)
    m = registered(o.spec["method"])
    checks = (
        artifacts.read_gram_checks(o.gram_check, GramCheck.from_json, cfg.num_hidden_layers) if o.gram_check else None
    )
    paths_in = o.spec.get("inputs") or {}
    handles = {inp.name: inp.open(paths_in.get(inp.name), o.first, o.last) for inp in m.inputs}
    job = _Job(m, planned(o.spec), attention_shape(cfg), resolve_device(source.device), checks, handles)
    tensors: dict[str, torch.Tensor] = {}
    infos: dict[str, Any] = {}
    prog = progress_bar(total=2 * (o.last - o.first + 1), desc=f"compensate {m.name}", unit="module")
    for i in range(o.first, o.last + 1):
        names = layer_tensor_names(i, cfg)
        w = read_model_tensors(model_dir, [names["o_proj"], names["down_proj"], names["v_proj"]])
        k = keep["layers"][i]
        for module, cols in (
            ("o_proj", o_proj_columns(k["kv_groups"], job.geom)),
            ("down_proj", torch.tensor(k["channels"], dtype=torch.long)),
        ):
            prog.set_postfix_str(f"layer {i} {module}")
            where = Module(layer=i, name=module, keep=k, geometry=job.geom, tensors={"v_proj": w[names["v_proj"]]},
                           device=job.device)  # fmt: skip
            res = _compensate_module(job, where, w[names[module]], read_gram_layer(grams, i, module), cols)
            tensors[f"layer{i}.{module}.weight"] = res.weight.detach().cpu().contiguous()
            if res.bias is not None:
                tensors[f"layer{i}.{module}.bias"] = res.bias.detach().cpu().contiguous()
            infos[f"layer{i}.{module}"] = res.info
            _log_module(i, module, m.name, res.info)
            prog.update(1)
    prog.close()
    path = Path(out)
    artifacts.write_comp_block(path, tensors, {"method": m.name, "spec": json.dumps(o.spec, sort_keys=True)})
    log_timings(str(path), infos)
    infos["model"] = model_provenance(source.model, *source.hub, model_dir)
    artifacts.write_result(path.with_suffix(".json"), infos, "comp-info")  # timings stay in the log
    return infos


def _compensate_module(
    job: _Job, where: Module, weight: torch.Tensor, st: GramLayer, cols: torch.Tensor
) -> Compensation:
    """One module of a compensation job: its options as the job built them (the method's inputs
    and its solve read the same), its extra inputs gathered, the method run on ``job.device``."""
    m, dev = job.method, job.device
    typed = job.options[where.name].options
    extra: dict[str, Any] = {}
    for inp in m.inputs:
        extra.update(inp.for_module(job.handles[inp.name], where, typed))
    check = job.checks[where.layer][where.name] if job.checks is not None and not m.reports_errors else None
    try:
        return compensate(
            weight.to(dev),
            st["gram"].to(dev),
            st["mean"].to(dev),
            cols.to(dev),
            job.options[where.name],
            inputs=extra,
            n_tokens=st["count"],
            check=check,
        )
    except MethodOutputError as exc:  # nothing is written: the job stops on one line
        raise MethodOutputError(f"layer {where.layer} {where.name}: {exc}") from None


def build_cell(source: CellSource) -> tuple[Any, Any]:
    """Load the dense model (on ``source.device``, or spread by ``source.device_map``), then prune
    it by its keep.json (if any) and install the compensated weights of its block files.
    Returns (model, tokenizer)."""
    model, tok = load_model(
        source.model,
        dtype=source.dtype,
        device=source.device,
        device_map=source.device_map,
        revision=source.revision,
        trust_remote_code=source.trust_remote_code,
    )
    if source.keep:
        prune_model_(model, artifacts.read_keep(source.keep, model.config.num_hidden_layers))
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

    def perplexity(self, windows: torch.Tensor, batch_size: int) -> dict[str, Any]:
        """``evaluate.ppl.perplexity`` of the cell over (n, seqlen) windows."""
        if self.streamed is not None:
            return perplexity_streamed(self.streamed, windows, batch_size, self.budget)
        assert self.loaded is not None
        return perplexity(self.loaded, windows, batch_size=batch_size)

    def lm(self, batch_size: int, max_length: int) -> Any:
        """The lm-eval ``LM`` of a streamed cell (``LayerwiseLM``); None: lm-eval's ``HFLM``
        around the loaded model."""
        if self.streamed is None:
            return None
        from coec.evaluate.layerwise_lm import LayerwiseLM  # deferred: lm_eval is an optional dependency

        return LayerwiseLM(self.streamed, self.tokenizer, batch_size=batch_size, max_length=max_length,
                           budget_bytes=self.budget)  # fmt: skip


def open_cell(source: CellSource, stream: StreamOptions) -> CellModel:
    """The cell of an evaluation stage: streamed when ``streaming.stages.streams`` says so,
    else loaded whole (:func:`build_cell`)."""
    if streams(source, stream):
        sm, tok = open_model(source)
        return CellModel(tok, streamed=sm, budget=stream.budget_bytes())
    model, tok = build_cell(source)
    return CellModel(tok, loaded=model)


def run_ppl(source: CellSource, options: PplOptions, out: str) -> dict[str, Any]:
    """Perplexity of the (pruned, compensated) model -> ppl.json, the same whether the cell is
    loaded or streams (:func:`open_cell`)."""
    t0 = time.time()
    cell = open_cell(source, options.stream)
    tokens = data.tokenize_text(cell.tokenizer, data.load_split(options.dataset, "eval"))
    windows = data.eval_windows(tokens, options.seqlen, options.max_windows)
    res = cell.perplexity(windows, options.batch_size)
    prov = model_provenance(source.model, *source.hub)
    ppl_record(res, prov, source, options, cell.params(), t0)
    log_timings(str(out), res)
    artifacts.write_result(out, res, "ppl")  # timings stay in the log
    how = "; streamed" if cell.streamed is not None else ""
    log.info("ppl %.4f over %d tokens (%s%s)", res["ppl"], res["tokens_scored"], out, how)
    return res


GEOMETRY_RANKS = {"o_proj": 16, "down_proj": 64}


def run_geometry(source: CellSource, out: str) -> list[dict[str, Any]]:
    """App. C measurements of every layer's o_proj (r_p = 16) and down_proj (r = 64) of the cell
    ``source`` (its keep set and blocks) -> geometry.csv (uncompensated cells measure W_K
    against itself)."""
    model_dir = resolve_model_dir(source.model, *source.hub)
    cfg = load_config(model_dir, *source.hub)
    geom = attention_shape(cfg)
    keep = artifacts.read_keep(str(source.keep), cfg.num_hidden_layers)
    comp = artifacts.read_comp_blocks(list(source.comp))
    rows = []
    for i, k in progress_bar(list(enumerate(keep["layers"])), desc="geometry", unit="layer"):
        names = layer_tensor_names(i, cfg)
        w = read_model_tensors(model_dir, [names["o_proj"], names["down_proj"], names["v_proj"]])
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


def run_zeroshot(source: CellSource, options: ZeroshotOptions, out: str) -> dict[str, Any]:
    """Zero-shot accuracy (lm-eval) of the (pruned, compensated) model: the summary in ``out``
    (zeroshot.json), lm-eval's own records next to it (``zeroshot_lm_eval.json``;
    ``zeroshot_samples/<task>.jsonl`` with ``log_samples``; docs/zeroshot.md), the same whether
    the cell is loaded or streams (:func:`open_cell`; streamed: ``LayerwiseLM``)."""
    t0 = time.time()
    cell = open_cell(source, options.stream)
    lm = cell.lm(options.batch_size, options.max_length)
    res, records = zeroshot_with_records(cell.loaded, cell.tokenizer, options, lm=lm)
    provenance = model_provenance(source.model, *source.hub)
    return write_zeroshot(out, res, records, provenance, source, t0)
