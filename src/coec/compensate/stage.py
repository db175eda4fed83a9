"""The compensation stages: ``coec gram-check`` (App. B's verdict on every Gram, once per
calibration) and ``coec compensate`` (o_proj and down_proj of a block of layers by one method
-> a block file and its info)."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from coec.compensate import compensate
from coec.compensate.gram_check import GramCheck
from coec.compensate.inputs import Module
from coec.compensate.method import Compensation, Method, check_module
from coec.compensate.options import Resolved, planned
from coec.compensate.options import method as registered
from coec.compensate.output_checks import MethodOutputError
from coec.io import artifacts
from coec.io.artifacts import GramLayer, log_timings, read_gram_layer
from coec.io.progress import bar as progress_bar
from coec.model.arch import MODULES, AttnShape, attention_shape, o_proj_columns
from coec.model.checkpoint import Checkpoint
from coec.model.load import layer_tensor_names, resolve_device
from coec.model.source import CellSource, source_config

log = logging.getLogger(__name__)


def run_gram_check(source: CellSource, grams: str, out: str) -> dict[str, Any]:
    """App. B's verdict on every layer's o_proj and down_proj Gram and each module's output
    energy on it (``compensate.method.check_module``) -> gram_checks/{calib}.json, read by
    every compensation job of the calibration whose method reports no errors of its own."""
    source, model_dir, cfg = source_config(source)
    dev = resolve_device(source.device)
    layers = []
    ckpt = Checkpoint(model_dir)
    for i in progress_bar(range(cfg.num_hidden_layers), desc="gram check", unit="layer"):
        names = layer_tensor_names(i, cfg)
        w = ckpt.read([names["o_proj"], names["down_proj"]], check_finite=True)
        layer = {}
        for module in MODULES:
            chk = check_module(w[names[module]].to(dev), read_gram_layer(grams, i, module)["gram"].to(dev))
            layer[module] = chk.to_json()
            if chk.psd.get("indefinite"):
                log.info(
                    "layer %d %s: indefinite Gram (min eig %s): PSD projection", i, module, _num(chk.psd["min_eig"])
                )
        layers.append(layer)
    result = {"layers": layers, "model": source.provenance()}
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
class ModuleJob:
    """What every module of a compensation job shares (the stage's, and the search candidates',
    ``coec.select.search.candidates``)."""

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
    source, model_dir, cfg = source_config(source)
    keep = source.local.keep_for(cfg.num_hidden_layers)
    if keep is None:
        raise ValueError("compensate needs the cell's keep.json (--keep)")
    m = registered(o.spec["method"])
    checks = (
        artifacts.read_gram_checks(o.gram_check, GramCheck.from_json, cfg.num_hidden_layers) if o.gram_check else None
    )
    paths_in = o.spec.get("inputs") or {}
    handles = {inp.name: inp.open(paths_in.get(inp.name), o.first, o.last) for inp in m.inputs}
    job = ModuleJob(m, planned(o.spec), attention_shape(cfg), resolve_device(source.device), checks, handles)
    tensors: dict[str, torch.Tensor] = {}
    infos: dict[str, Any] = {}
    prog = progress_bar(total=2 * (o.last - o.first + 1), desc=f"compensate {m.name}", unit="module")
    ckpt = Checkpoint(model_dir)
    for i in range(o.first, o.last + 1):
        names = layer_tensor_names(i, cfg)
        w = ckpt.read([names["o_proj"], names["down_proj"], names["v_proj"]], check_finite=True)
        k = keep["layers"][i]
        for module, cols in (
            ("o_proj", o_proj_columns(k["kv_groups"], job.geom)),
            ("down_proj", torch.tensor(k["channels"], dtype=torch.long)),
        ):
            prog.set_postfix_str(f"layer {i} {module}")
            where = Module(layer=i, name=module, keep=k, geometry=job.geom, tensors={"v_proj": w[names["v_proj"]]},
                           device=job.device)  # fmt: skip
            res = compensate_module(job, where, w[names[module]], read_gram_layer(grams, i, module), cols)
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
    infos["model"] = source.provenance()
    artifacts.write_result(path.with_suffix(".json"), infos, "comp-info")  # timings stay in the log
    return infos


def compensate_module(
    job: ModuleJob, where: Module, weight: torch.Tensor, st: GramLayer, cols: torch.Tensor
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
