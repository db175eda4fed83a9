"""The iterative method: calibration passes over the current model and pruning steps along a
schedule (docs/iterative.md, eq. 11–13).

A step measures the statistics of every layer on the model pruned and bias-compensated by the
previous steps, scores the remaining units (``structure``), prunes them and adds the step's
bias. The pass is global (one ``calibrate.run_layerwise`` pass: layer l sees the model of the
previous step) or layer-sequential (layer l sees the layers < l already pruned in this pass).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from coec.calibrate.layer_pass import LayerPass, LayerRun, run_layerwise
from coec.io.progress import bar as progress_bar
from coec.iterative.choices import MODES, STRUCTURES, VARIANCE_MIXES
from coec.iterative.schedule import check_schedule
from coec.iterative.state import PruneState, apply_layer_step_, current_shape
from coec.iterative.stats import CalibSet, DomainAccumulator, Stats, attach_accumulators, finalize_stats
from coec.iterative.structure import alam_keep, layer_scores, uniform_keep
from coec.model.arch import MODULES, AttnShape
from coec.model.load import decoder_layers, torch_dtype
from coec.select.rounding import DEFAULT_ROUNDING
from coec.select.scores import CHANNEL_ROUNDINGS, ROUNDINGS, n_keep

if TYPE_CHECKING:
    from transformers import PreTrainedModel

log = logging.getLogger(__name__)

#: module -> mixed statistics of one layer
LayerStats = dict[str, Stats]
#: on_stats(i, layer, stats): called per layer during a pass (may prune layer i)
OnStats = Callable[[int, nn.Module, LayerStats], None]


@dataclass
class Options:
    """How to prune: ``mode`` global | sequential, ``structure`` uniform | al-am, the rounding
    of kept counts (as ``select.n_keep``), how domains mix, and the calibration pass."""

    mode: str = "global"
    structure: str = "uniform"
    variance_mix: str = "pooled"
    group_rounding: str = DEFAULT_ROUNDING
    channel_rounding: str = DEFAULT_ROUNDING
    gram_dtype: str = "float32"
    batch_size: int = 8
    device: str | torch.device | None = None
    progress: bool = True

    def check(self) -> None:
        for key, allowed in (
            ("mode", MODES),
            ("structure", STRUCTURES),
            ("variance_mix", VARIANCE_MIXES),
            ("group_rounding", ROUNDINGS),
            ("channel_rounding", CHANNEL_ROUNDINGS),
        ):
            if getattr(self, key) not in allowed:
                raise ValueError(f"unknown {key} {getattr(self, key)!r}; expected one of {allowed}")
        if self.mode == "sequential" and self.structure == "al-am":
            raise ValueError(
                "structure 'al-am' ranks all layers together, so it needs the "
                "statistics of every layer before pruning: use mode 'global'"
            )
        torch_dtype(self.gram_dtype)


def _mixed(accs: dict[str, DomainAccumulator], calib: CalibSet, opts: Options, diag: bool) -> LayerStats:
    """module -> mixed statistics (eq. 8) of one layer's DomainAccumulators."""
    return {m: finalize_stats(a.stats(diag), calib.alphas, opts.variance_mix, opts.gram_dtype) for m, a in accs.items()}


def global_pass(model: PreTrainedModel, calib: CalibSet, opts: Options, on_stats: OnStats, diag: bool = False) -> None:
    """One calibration pass (``calibrate.run_layerwise``) of the current model; after layer i has
    produced the inputs of layer i+1, ``on_stats(i, layer, stats)`` receives its mixed
    statistics (it may prune layer i: later layers still see the model of the previous step);
    ``diag``: only the Grams' diagonals leave the device (all FLAP needs)."""
    live: dict[str, Any] = {}

    def before(i: int, layer: nn.Module) -> None:
        live["accs"], live["handles"] = attach_accumulators(
            layer, calib, opts.batch_size, next(layer.parameters()).device
        )

    def after(i: int, _unused: object) -> None:
        for h in live.pop("handles"):
            h.remove()
        stats = _mixed(live.pop("accs"), calib, opts, diag)
        on_stats(i, decoder_layers(model)[i], stats)

    run_layerwise(
        model,
        calib.ids,
        on_layer=after,
        run=LayerRun(
            batch_size=opts.batch_size, device=opts.device, modules=(), progress=opts.progress, before_layer=before
        ),
    )


@torch.no_grad()
def sequential_pass(
    model: PreTrainedModel, calib: CalibSet, opts: Options, on_stats: OnStats, diag: bool = False
) -> None:
    """One layer-sequential pass: for each layer, statistics on the inputs produced by the
    already pruned earlier layers, ``on_stats(i, layer, stats)`` (prunes layer i), then the
    pruned layer is run again to produce the inputs of layer i+1 (two forwards per layer)."""
    layers = decoder_layers(model)
    with LayerPass(model, calib.ids, opts.batch_size, opts.device) as lp:
        for i in progress_bar(range(len(layers)), desc="sequential", unit="layer", disable=not opts.progress):
            home = next(layers[i].parameters()).device
            layer = layers[i].to(lp.device)
            accs, handles = attach_accumulators(layer, calib, opts.batch_size, lp.device)
            try:
                lp.run(i, layer, keep_outputs=False)
            finally:
                for hd in handles:
                    hd.remove()
            layer.to(home)
            on_stats(i, layer, _mixed(accs, calib, opts, diag))
            layer = layers[i].to(lp.device)
            lp.run(i, layer)
            layer.to(home)


def run_step(
    model: PreTrainedModel,
    calib: CalibSet,
    state: PruneState,
    ratio: float,
    opts: Options,
    record: Callable[[int, LayerStats], None] | None = None,
) -> dict[str, Any]:
    """One iterative step to cumulative ``ratio``: a calibration pass over the current model
    (eq. 12–13), FLAP scores of the remaining units, pruning and bias. ``record(i, stats)``
    (optional) sees every layer's statistics. Returns the step's info."""
    t0 = time.time()
    layers = decoder_layers(model)
    n_groups = n_keep(state.geom.n_kv, ratio, opts.group_rounding)
    n_channels = n_keep(state.d_ff, ratio, opts.channel_rounding)
    pending: list[tuple[tuple[torch.Tensor, torch.Tensor], AttnShape, dict[str, torch.Tensor]]] = []

    def on_stats(i: int, layer: nn.Module, stats: LayerStats) -> None:
        if record is not None:
            record(i, stats)
        o, d = layer_scores(layer, stats)
        geom = current_shape(layer, state.geom)
        if opts.structure == "uniform":
            g, c = uniform_keep(o, d, geom, n_groups, n_channels)
            apply_layer_step_(layer, state, i, g, c, {m: stats[m]["mean"] for m in MODULES})
        else:
            pending.append(((o, d), geom, {m: stats[m]["mean"] for m in MODULES}))

    (global_pass if opts.mode == "global" else sequential_pass)(model, calib, opts, on_stats, diag=record is None)
    t_pass = time.time() - t0
    if opts.structure == "al-am":
        d_model = model.config.hidden_size
        keeps = alam_keep([p[0] for p in pending], [p[1] for p in pending], state, d_model, ratio)
        for i, ((g, c), p) in enumerate(zip(keeps, pending, strict=True)):
            apply_layer_step_(layers[i], state, i, g, c, p[2])
    return {
        "ratio": ratio,
        "params_removed": round(state.ratio_done(), 6),
        "kv_groups_kept": [len(g) for g in state.kv_groups],
        "channels_kept": [len(c) for c in state.channels],
        "seconds_pass": round(t_pass, 3),
        "seconds": round(time.time() - t0, 3),
    }


def run_iterative(
    model: PreTrainedModel,
    calib: CalibSet,
    schedule: list[float],
    opts: Options,
    state: PruneState | None = None,
    record: Callable[[int, int, LayerStats], None] | None = None,
) -> tuple[PruneState, list[dict[str, Any]]]:
    """Prune ``model`` in place along ``schedule`` (cumulative ratios), starting from ``state``
    (a previous step's result applied to the model) or the dense model. S steps cost S passes
    (layer-sequential: S passes of two forwards per layer)."""
    opts.check()
    check_schedule(schedule)
    state = state or PruneState.fresh(model)
    infos = []
    for s, ratio in enumerate(schedule):
        info = run_step(model, calib, state, ratio, opts, record=None if record is None else partial(record, s))
        infos.append({"step": s + 1, **info})
        log.info(
            "step %d/%d: ratio %.4g, %.1f%% of prunable params removed, %.1fs",
            s + 1,
            len(schedule),
            ratio,
            100 * info["params_removed"],
            info["seconds"],
        )
    return state, infos
