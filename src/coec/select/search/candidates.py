"""A width search's candidates of one layer (docs/search.md): for every level of its two units
(``coec.select.search.budget``: kept KV groups 1..n_kv, kept MLP channels the multiples of
``channel_multiple`` and d_ff), the keep set a registered selection picks at that count
(``select_layer`` with a ``KeepRule`` that keeps exactly it) and the refit of o_proj /
down_proj by a compensation on it (``coec.compensate.stage.compensate_module``, as the
compensate stage runs it). The full level is the dense layer itself: nothing pruned, nothing
refit, so the dense allocation is the dense model.

One file per layer, ``layer{i}.safetensors`` (format ``search-candidates``): ``o_proj.{k}.weight``
(d_out, k·g·hd) and ``down_proj.{c}.weight`` (d_out, c), with ``.bias`` where the method returns
one (added to the module's own bias, as the block files' are); its JSON twin
(``search-candidates-info``) holds each level's kept units and the refit's errors.

A method with inputs of its own (``Method.inputs``) reads them as in a compensate job: blend's
held-out Grams are that calibration's, and its base cell's weights are the base compensation's
candidates of the same layer and selection, at the same level (``module_job``, ``level_job``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

import torch
from safetensors import safe_open

from coec.compensate.inputs import Module, OtherCell
from coec.compensate.options import method as registered
from coec.compensate.options import planned
from coec.compensate.stage import ModuleJob, compensate_module
from coec.io import artifacts
from coec.io.artifacts import GramLayer
from coec.io.errors import ArtifactError
from coec.model.arch import MODULES, AttnShape, o_proj_columns
from coec.select.scores import KeepRule, ScoreSpec, select_layer
from coec.select.search.budget import KINDS, channel_levels, kv_levels

log = logging.getLogger(__name__)

#: the module each unit kind's candidates refit
MODULE_OF = {"kv_groups": "o_proj", "channels": "down_proj"}
#: relative errors of a refit kept in the JSON twin
INFO_KEYS = ("relerr_before", "relerr_after")


def level_rule(kind: str, level: int, width: int, multiple: int) -> KeepRule:
    """A ``KeepRule`` that keeps exactly ``level`` of a layer's ``width`` units of ``kind``
    (ceil of (1 - ratio) width, which is ``level`` itself; a channel level is a multiple)."""
    ratio = 1.0 - level / width
    return KeepRule(ratio, "ceil", "ceil", multiple if kind == "channels" else 1)


def unit_levels(geom: AttnShape, d_ff: int, multiple: int) -> dict[str, tuple[int, ...]]:
    """The levels of a layer's two units (``coec.select.search.budget``; no removal)."""
    return {"kv_groups": kv_levels(geom.n_kv), "channels": channel_levels(d_ff, multiple)}


@dataclass(frozen=True)
class LayerInputs:
    """What one layer's candidates read: the original o_proj / down_proj / v_proj weights, the
    Grams of o_proj's and down_proj's inputs, the attention shape."""

    layer: int
    weights: Mapping[str, torch.Tensor]
    stats: Mapping[str, GramLayer]
    geom: AttnShape


def kept_units(spec: ScoreSpec, x: LayerInputs, kind: str, level: int, multiple: int) -> list[int]:
    """The units of ``kind`` selection ``spec`` keeps at ``level`` (all at the full level)."""
    width = x.geom.n_kv if kind == "kv_groups" else x.weights["down_proj"].shape[1]
    if level == width:
        return list(range(width))
    weights = {m: x.weights[m] for m in MODULES}
    kept: list[int] = select_layer(spec, weights, x.stats, x.geom, level_rule(kind, level, width, multiple))[kind]
    if len(kept) != level:
        raise RuntimeError(f"layer {x.layer} {kind}: the selection kept {len(kept)}, the level is {level}")
    return kept


def refit(job: ModuleJob, x: LayerInputs, kind: str, kept: list[int], full: bool) -> tuple[dict[str, Any], Any]:
    """(tensors, info) of one candidate: the dense weight at the full level, else the method's
    refit of the kept columns (``compensate_module``)."""
    module = MODULE_OF[kind]
    w0 = x.weights[module]
    if full:
        return {"weight": w0.contiguous()}, {"relerr_before": 0.0, "relerr_after": 0.0}
    other = "channels" if kind == "kv_groups" else "kv_groups"
    all_other = list(range(x.geom.n_kv if other == "kv_groups" else x.weights["down_proj"].shape[1]))
    keep = {kind: kept, other: all_other}
    cols = o_proj_columns(kept, x.geom) if kind == "kv_groups" else torch.tensor(kept, dtype=torch.long)
    where = Module(layer=x.layer, name=module, keep=keep, geometry=x.geom,
                   tensors={"v_proj": x.weights["v_proj"]}, device=job.device)  # fmt: skip
    res = compensate_module(level_job(job, x.layer, kind, kept), where, w0, x.stats[module], cols)
    out = {"weight": res.weight.detach().cpu().contiguous()}
    if res.bias is not None:
        out["bias"] = res.bias.detach().cpu().contiguous()
    return out, res.info


def module_job(spec: Mapping[str, Any], geom: AttnShape, device: torch.device, layer: int) -> ModuleJob:
    """The compensate stage's job of one layer for a ``compensations`` entry, its method's inputs
    opened from the paths in the entry's ``inputs`` (as the compensate stage opens them): another
    calibration's Grams (blend's ``holdout``) as they are; another cell's weights (blend's
    ``base``) from that compensation's candidates of the same layer (:class:`LayerCandidateFile`,
    one level at a time, :func:`level_job`); coec's value projection from the model."""
    m = registered(spec["method"])
    paths_in = spec.get("inputs") or {}
    handles: dict[str, Any] = {}
    for inp in m.inputs:
        path = paths_in.get(inp.name)
        if isinstance(inp, OtherCell):
            if path is None:
                raise ValueError(
                    f"{m.name} candidates need {inp.name!r}: the candidates of its {inp.option} compensation "
                    f"(--spec inputs.{inp.name})"
                )
            base = LayerCandidateFile(path)
            if base.layer != layer:
                raise ValueError(
                    f"--spec inputs.{inp.name}: {path} holds layer {base.layer}'s candidates, not {layer}'s"
                )
            handles[inp.name] = base
        else:
            handles[inp.name] = inp.open(path, layer, layer)
    return ModuleJob(m, planned(spec), geom, device, None, handles)


def level_job(job: ModuleJob, layer: int, kind: str, kept: list[int]) -> ModuleJob:
    """``job`` with each other cell's candidates (a blend's base) narrowed to the candidate of
    ``kind`` keeping ``kept``: the weights ``OtherCell.for_module`` reads, as from a block file.
    ValueError when that file's keep set at the level differs (another selection's candidates)."""
    narrowed = dict(job.handles)
    for name, handle in job.handles.items():
        if not isinstance(handle, LayerCandidateFile):
            continue
        level = len(kept)
        if handle.kept[kind].get(level) != kept:
            raise ValueError(
                f"--spec inputs.{name}: {handle.path}'s {kind} at level {level} keep other units "
                "(candidates of another selection)"
            )
        weight, bias = handle.tensors(kind, level)
        key = f"layer{layer}.{MODULE_OF[kind]}"
        narrowed[name] = {f"{key}.weight": weight, **({f"{key}.bias": bias} if bias is not None else {})}
    return replace(job, handles=narrowed)


def layer_candidates(
    spec: ScoreSpec, x: LayerInputs, job: ModuleJob, multiple: int
) -> tuple[dict[str, torch.Tensor], dict[str, list[dict[str, Any]]]]:
    """(tensors, levels) of one layer: per unit kind, every level's keep set and refit."""
    d_ff = x.weights["down_proj"].shape[1]
    tensors: dict[str, torch.Tensor] = {}
    levels: dict[str, list[dict[str, Any]]] = {}
    for kind, lv in unit_levels(x.geom, d_ff, multiple).items():
        levels[kind] = []
        for level in lv:
            kept = kept_units(spec, x, kind, level, multiple)
            out, info = refit(job, x, kind, kept, level == lv[-1])
            for name, t in out.items():
                tensors[f"{MODULE_OF[kind]}.{level}.{name}"] = t
            entry = {"level": level, "kept": kept, **{k: info.get(k) for k in INFO_KEYS}}
            levels[kind].append(entry)
            log.info("layer %d %s %d: relerr %s -> %s", x.layer, kind, level, *(info.get(k) for k in INFO_KEYS))
    return tensors, levels


# ----------------------------------------------------------------------------- reading
class LayerCandidateFile:
    """One layer's candidates as the search reads them: the kept units of every level (its JSON
    twin) and each refit, read from the file when asked (``safe_open``: the OS caches it)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        info = artifacts.read_json(self.path.with_suffix(".json"), "search-candidates-info")
        self.info: dict[str, Any] = info
        self.layer = int(info["layer"])
        self.levels = {kind: tuple(int(e["level"]) for e in info["levels"][kind]) for kind in KINDS}
        self.kept = {kind: {int(e["level"]): list(e["kept"]) for e in info["levels"][kind]} for kind in KINDS}
        meta = artifacts.tensors_metadata(self.path)
        if meta.get(artifacts.FORMAT_KEY) != "search-candidates":
            raise ArtifactError(self.path, f"is not a search-candidates file ({meta.get(artifacts.FORMAT_KEY)!r})")
        self._file = cast(Any, safe_open(str(self.path), framework="pt"))  # open while the search runs
        self._names = set(self._file.keys())

    def tensors(self, kind: str, level: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(weight, bias or None) of the candidate of ``kind`` at ``level``."""
        key = f"{MODULE_OF[kind]}.{level}"
        if f"{key}.weight" not in self._names:
            raise ArtifactError(self.path, f"missing tensor {key}.weight")
        bias = self._file.get_tensor(f"{key}.bias") if f"{key}.bias" in self._names else None
        return self._file.get_tensor(f"{key}.weight"), bias
