"""The stages of a width search (docs/search.md): ``coec search candidates`` (one layer's
candidates, ``coec.select.search.candidates``) and ``coec search run`` (the allocation under one budget
-> keep.json with per-layer widths, and its record search.json beside it)."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from coec.calibrate.options import CalibrationWindows
from coec.data import text as data
from coec.io import artifacts
from coec.io.artifacts import read_gram_layer
from coec.model.arch import MODULES, attention_shape
from coec.model.cell import load_source
from coec.model.checkpoint import Checkpoint
from coec.model.load import layer_tensor_names, load_config, read_model_tensors, resolve_device
from coec.model.source import CellSource, source_config
from coec.report.cost import arch_dims, config_dict
from coec.select.scores import KeepRule, check_multiple, layer_scores, selection_spec
from coec.select.search import rekey
from coec.select.search.alam import alam_state
from coec.select.search.budget import SearchSpace, build_space, model_bytes, prunable_params, uniform_pair
from coec.select.search.candidates import LayerCandidateFile, LayerInputs, layer_candidates, module_job
from coec.select.search.evolve import SearchOptions, SearchResult, band, evolve
from coec.select.search.fitness import CandidateModel, KLFitness
from coec.select.widths import width_record

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- candidates
@dataclass(frozen=True)
class CandidateOptions:
    """``coec search candidates``: the selection (score ``method`` and its ``options``) whose
    keep sets the levels take, its ``channel_multiple`` (the MLP levels), the ``compensations``
    entry ``spec`` that refits them, and the ``layer``."""

    method: str
    options: Mapping[str, Any]
    channel_multiple: int
    spec: Mapping[str, Any]
    layer: int


def run_candidates(source: CellSource, grams: str, options: CandidateOptions, out: str) -> dict[str, Any]:
    """One layer's candidates (``coec.select.search.candidates``) -> ``out`` (safetensors) and its JSON
    twin. A multiple above the MLP width stops before anything is read or written."""
    o = options
    spec = selection_spec({"score": o.method, **o.options}, "--options")
    source, model_dir, cfg = source_config(source)
    check_multiple(cfg.intermediate_size, o.channel_multiple)
    if not 0 <= o.layer < cfg.num_hidden_layers:
        raise ValueError(f"--layer {o.layer}: the model has {cfg.num_hidden_layers} layers")
    geom = attention_shape(cfg)
    names = layer_tensor_names(o.layer, cfg)
    w = read_model_tensors(model_dir, [names[m] for m in (*MODULES, "v_proj")])
    x = LayerInputs(
        o.layer,
        {m: w[names[m]] for m in (*MODULES, "v_proj")},
        {m: read_gram_layer(grams, o.layer, m) for m in MODULES},
        geom,
    )
    t0 = time.time()
    tensors, levels = layer_candidates(spec, x, module_job(o.spec, geom, resolve_device(source.device), o.layer),
                                       o.channel_multiple)  # fmt: skip
    log.info("layer %d: %d candidates in %.1fs", o.layer, sum(map(len, levels.values())), time.time() - t0)
    info = {
        "layer": o.layer,
        "cell": source.cell,
        "selection": spec.score,
        "score_options": spec.options(),
        "channel_multiple": o.channel_multiple,
        "compensation": dict(o.spec),
        "levels": levels,
        "model": source.provenance(),
    }
    artifacts.write_tensors(out, tensors, "search-candidates")
    return artifacts.write_result(Path(out).with_suffix(".json"), info, "search-candidates-info")


# ----------------------------------------------------------------------------- the search
@dataclass(frozen=True)
class SearchJob:
    """``coec search run``: the search selection's ``name`` (recorded; its config key in
    messages), the layers' candidate files, the held-out ``holdout`` windows, the uniform
    selection's ``rule`` at the cell's ratio (with the candidates' channel_multiple /
    channel_rounding), the ``budget`` (config form), the ``allocation`` (evolve | alam), the
    search ``options``, and the Grams (AL-AM's scores)."""

    name: str
    candidates: tuple[str, ...]
    holdout: CalibrationWindows
    rule: KeepRule
    budget: Mapping[str, Any] | None
    allocation: str
    options: SearchOptions
    grams: str | None = None


def resolve_budget(config: Any, rule: KeepRule, budget: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """A config budget for ``build_space``: ``{type: T}`` becomes the bytes of the GGUF file of
    type T of the uniform cell at ``rule.ratio``; ``{dense: D, type: T}`` the bytes of the dense
    model's GGUF file of type D, spent on a file of type T (the pruned cell at the size of dense D);
    ``{uniform: {channel_multiple: M,
    channel_rounding: R}}`` (the wiring's form of ``{uniform: S}``) the prunable parameters of the
    uniform cell of that width rule at ``rule.ratio`` (e.g. the paper's unaligned widths, while the
    candidates' levels are multiples of 256); the others pass as they are."""
    if budget is not None and set(budget) == {"uniform"}:
        d = arch_dims(config_dict(config))
        width = budget["uniform"]
        other = replace(
            rule, channel_multiple=int(width["channel_multiple"]), channel_rounding=width["channel_rounding"]
        )
        kv, ch = uniform_pair(d, other)
        return {"params": int(d["layers"]) * (prunable_params(d, "kv_groups", kv) + prunable_params(d, "channels", ch))}
    if budget is None or set(budget) not in ({"type"}, {"dense", "type"}):
        return budget
    d = arch_dims(config_dict(config))
    key = "dense" if "dense" in budget else "type"  # whose file's size: the dense model's or the uniform cell's
    kv, ch = (int(d["kv_heads"]), int(d["ffn"])) if key == "dense" else uniform_pair(d, rule)
    widths = [{"kv_groups": kv, "channels": ch}] * int(d["layers"])
    try:
        return {"bytes": model_bytes(config, widths, str(budget[key])), "type": budget["type"]}
    except ValueError as e:
        raise ValueError(f"search.budget.{key}: {e}") from None


def check_levels(space: SearchSpace, files: Sequence[LayerCandidateFile], job: SearchJob) -> None:
    """The candidates hold exactly the search space's levels, layer by layer."""
    if len(files) != len({u.layer for u in space.units}):
        raise ValueError(f"{len(files)} candidate files for a model of {len({u.layer for u in space.units})} layers")
    for u in space.units:
        f = files[u.layer]
        if f.layer != u.layer or f.levels[u.kind] != u.levels:
            raise ValueError(
                f"selections.{job.name}.candidates: {f.path} holds layer {f.layer} {u.kind} levels "
                f"{list(f.levels[u.kind])}, the search at channel_multiple {job.rule.channel_multiple} "
                f"needs layer {u.layer}'s {list(u.levels)}"
            )


def alam_scores(source: CellSource, grams: str, n_layers: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """FLAP's o_proj and down_proj column scores of every dense layer (AL-AM's input)."""
    model_dir = source.local.model_dir
    cfg = load_config(model_dir, *source.hub)
    geom = attention_shape(cfg)
    out = []
    ckpt = Checkpoint(model_dir)
    for i in range(n_layers):
        names = layer_tensor_names(i, cfg)
        w = ckpt.read([names[m] for m in MODULES], check_finite=True)
        sc = layer_scores("flap", {m: w[names[m]] for m in MODULES}, {m: read_gram_layer(grams, i, m) for m in MODULES},
                          geom)  # fmt: skip
        out.append((sc["o_proj"], sc["down_proj"]))
    return out


def allocate(space: SearchSpace, fitness: KLFitness, job: SearchJob, source: CellSource) -> SearchResult:
    """The allocation: EvoPress's search, or AL-AM (its fitness on the last stage's tokens)."""
    if job.allocation == "evolve":
        return evolve(space, fitness, job.options)
    if job.grams is None:
        raise ValueError(f"selections.{job.name}.allocation alam needs the calibration's Grams (--grams)")
    state = alam_state(space, alam_scores(source, job.grams, len(fitness.model.candidates)))
    levels = space.values(state)
    return SearchResult(state, levels, space.cost(state), fitness(levels, job.options.tokens[-1]), ())


def keep_layers(space: SearchSpace, files: Sequence[LayerCandidateFile], state: Sequence[int]) -> list[dict[str, Any]]:
    """keep.json's layers: each layer's kept KV groups and channels at its levels."""
    widths = space.widths(state)
    return [{kind: files[i].kept[kind][w[kind]] for kind in ("kv_groups", "channels")} for i, w in enumerate(widths)]


def space_of(config: Any, job: SearchJob) -> SearchSpace:
    """The search space of the model under the job's budget; ValueError naming the config key."""
    try:
        return build_space(config, job.rule, resolve_budget(config, job.rule, job.budget))
    except ValueError as exc:
        raise ValueError(rekey(str(exc), job.name)) from None


def held_out(tokenizer: Any, windows: CalibrationWindows, tokens: int) -> torch.Tensor:
    """The held-out windows (the calibration windows of the holdout set), enough for ``tokens``."""
    ids = data.calibration_ids(tokenizer, windows.dataset, windows.nsamples, windows.seqlen, windows.seed)
    if tokens > ids.numel():
        raise ValueError(f"{tokens} fitness tokens, but the held-out windows hold {ids.numel()}")
    return ids


def run_search(source: CellSource, job: SearchJob, out: str, record_out: str) -> dict[str, Any]:
    """The allocation of per-layer widths under the budget (module docstring) -> keep.json
    (``out``) and its record (``record_out``). Refusals (a budget no allocation meets, levels the
    candidates do not hold, too few held-out tokens) stop before the model is loaded."""
    source, _, cfg = source_config(source)
    space = space_of(cfg, job)
    files = [LayerCandidateFile(p) for p in job.candidates]
    check_levels(space, files, job)
    have = job.holdout.nsamples * job.holdout.seqlen
    if max(job.options.tokens) > have:
        raise ValueError(f"{max(job.options.tokens)} fitness tokens, but the held-out windows hold {have}")
    model, tok = load_source(source)
    model.eval()
    windows = held_out(tok, job.holdout, max(job.options.tokens))
    fitness = KLFitness(CandidateModel(model, attention_shape(cfg), files), windows)
    t0 = time.time()
    result = allocate(space, fitness, job, source)
    uniform = fitness(space.values(space.uniform), job.options.tokens[-1])
    seconds = time.time() - t0
    tokens = fitness.tokens
    log.info(
        "%s: fitness %.6g (uniform %.6g), %d evaluations of %d tokens in %.1fs (%.0f tokens/s)",
        job.allocation,
        result.fitness,
        uniform,
        fitness.evaluations,
        tokens,
        seconds,
        tokens / max(seconds, 1e-9),
    )
    keep = keep_record(cfg, job, space, files, result, source)
    record = search_record(job, space, result, uniform, source)
    artifacts.write_json(out, keep, "keep")
    artifacts.write_result(record_out, record, "search")
    return keep


def keep_record(
    cfg: Any, job: SearchJob, space: SearchSpace, files: Sequence[LayerCandidateFile], result: SearchResult,
    source: CellSource,
) -> dict[str, Any]:  # fmt: skip
    """keep.json of the allocation: the select stage's fields, per-layer keep sets."""
    geom = attention_shape(cfg)
    width = (job.rule.channel_multiple, job.rule.channel_rounding)
    fields, layers = width_record(keep_layers(space, files, result.state), cfg.intermediate_size, width)
    first = files[0].info
    return {
        "selection": job.name,
        "ratio": job.rule.ratio,
        "group_rounding": job.rule.group_rounding,
        "n_kv": geom.n_kv,
        "n_heads": geom.n_heads,
        "head_dim": geom.head_dim,
        "d_ff": cfg.intermediate_size,
        **fields,
        "search": {
            "candidates": first.get("cell", {}).get("select", first["selection"]),
            "compensation": first.get("cell", {}).get("comp", first["compensation"]),
            "allocation": job.allocation,
        },
        "layers": layers,
        "model": source.provenance(),
    }


def search_record(
    job: SearchJob, space: SearchSpace, result: SearchResult, uniform: float, source: CellSource
) -> dict[str, Any]:
    """search.json: the budget and its band, the realised cost, the widths, the fitness of the
    allocation and of the uniform one on the last stage's tokens, the curve, the options."""
    lo, hi = band(space, job.options.tolerance)
    return {
        "selection": job.name,
        "allocation": job.allocation,
        "budget": {
            "given": dict(job.budget) if job.budget is not None else None,
            "measure": space.measure,
            "amount": space.budget + space.fixed,
            "fixed": space.fixed,
            "band": [lo + space.fixed, hi + space.fixed],
        },
        "cost": result.cost + space.fixed,
        "realised": {"dense": space.highest(), "kept": result.cost, "ratio": 1.0 - result.cost / space.highest()},
        "fitness": result.fitness,
        "fitness_tokens": job.options.tokens[-1],
        "uniform": {
            "widths": space.widths(space.uniform)[0],
            "cost": space.cost(space.uniform) + space.fixed,
            "fitness": uniform,
        },  # fmt: skip
        "widths": space.widths(result.state),
        "curve": [asdict(g) for g in result.curve],
        "options": asdict(job.options),
        "rule": asdict(job.rule),
        "holdout": {k: getattr(job.holdout, k) for k in ("dataset", "nsamples", "seqlen", "seed")},
        "model": source.provenance(),
    }
