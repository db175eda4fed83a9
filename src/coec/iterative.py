"""Iterative multi-domain FLAP (docs/iterative.md, eq. 1–14).

FLAP prunes input columns of o_proj (whole KV groups) and down_proj (MLP channels) by the
fluctuation score Var(X_j)·||W[:, j]||² (eq. 5) and replaces the pruned columns by the bias
B = W[:, P] mean[P] (eq. 2–4). This module adds

- **multi-domain calibration** (eq. 6–8): calibration sequences from K domains (natural language,
  code, math; :mod:`coec.domains`), per-domain statistics accumulated in one pass and mixed with
  weights alpha_k by :func:`mix_stats`;
- **iterative calibration** (eq. 11–13): the target ratio rho is reached in steps
  rho_1 < ... < rho_S = rho (fractions of the ORIGINAL width of every layer); before step s the
  statistics are measured again on the model pruned and bias-compensated by steps < s, scores are
  computed over the remaining groups/channels, and the biases of all steps add up;
- a **layer-sequential** mode: within one pass, the statistics of layer l are taken after layers
  < l were pruned and compensated in this same pass (stats of l -> prune + bias l -> re-run the
  pruned l to produce the inputs of l+1);
- FLAP's **adaptive structure** AL-AM (``structure="al-am"``): scores standardised per layer and
  module, KV groups and channels ranked together across layers, each unit weighted by its
  parameter count, keeping a global parameter fraction 1 - rho (per-layer widths then differ).

With one domain, one step, ``structure="uniform"`` and ``mode="global"`` the result is bit-for-bit
the workflow's ``flap`` selection + ``bias`` compensation (same keep sets, same bias tensors).

Outputs follow the codebase's cell layout: ``keep.json`` (kept KV groups and channels per layer,
ORIGINAL indices), a block file ``block0-{L-1}.safetensors`` with ``layer{i}.{o_proj|down_proj}
.weight|bias`` (bias in the weight dtype), ``state.safetensors`` (the float64 accumulated biases,
so a later step continues exactly) and ``iterative.json`` (per-step info and timings).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import torch

from . import artifacts as A
from .calibrate import (GramAccumulator, NonFiniteActivations, _layer_call, embed_batches,
                        channel_sumsq, gram_tensors, layer_masks, load_layer_stats, run_layerwise)
from .cli import add_hub_args
from .compensate.baselines import bias as flap_bias
from .arch import MODULES, adapter_for
from .models import (AttnGeometry, attention_geometry, decoder_layers, torch_dtype)
from .progress import bar as progress_bar
from .prune import install_weights_, prune_layer_, prune_model_, set_output_weights_
from .select import ROUNDINGS, check_ratio, column_scores, group_scores, n_keep, o_proj_columns, top_k_sorted

log = logging.getLogger(__name__)

VARIANCE_MIXES = ("pooled", "eq8")
STRUCTURES = ("uniform", "al-am")
MODES = ("global", "sequential")


# ============================================================================ statistics (eq. 6–8)
def normalise_alphas(alphas) -> list[float]:
    """Domain weights alpha_k >= 0 scaled to sum 1 (eq. 7)."""
    a = [float(x) for x in alphas]
    if not a or any(x < 0 or not math.isfinite(x) for x in a) or sum(a) <= 0:
        raise ValueError(f"domain weights must be finite, >= 0 and not all 0, got {alphas}")
    return [x / sum(a) for x in a]


def mix_stats(per_domain: list[dict], alphas, variance_mix: str = "pooled") -> dict:
    """Mix per-domain statistics {gram (d,d), sum (d,), count} into one set, float64 (eq. 8).

    With n_k tokens, m_k = sum_k / n_k, alpha normalised, N = sum of the n_k, m = sum alpha_k m_k:

    - ``pooled``: the statistics of the alpha-weighted pooled data, gram = N sum alpha_k G_k/n_k,
      so Var_j = N/(N-1) (sum alpha_k E_k[x_j^2] - m_j^2) = eq. 8's sum alpha_k V_k **plus**
      the between-domain spread sum alpha_k (m_k - m)^2 (the variance of P_calib, eq. 7);
    - ``eq8``: eq. 8 literally, Var = sum alpha_k V_k (V_k unbiased per domain); stored as
      gram = (N-1) sum alpha_k C_k + N m m^T with C_k the domain's unbiased covariance.

    Both store sum = N m and count = N, so ``select.column_scores`` and the bias (mean = m) work
    unchanged. One domain (or one with alpha > 0) is returned as is (bit-for-bit plain FLAP).
    A 1-D ``gram`` is taken as the Gram's diagonal (d,) and mixed elementwise (same bits as the
    diagonal of the full mixture). ``sumsq`` (float64 Σx², the Gram's diagonal, from which the
    selection's variance comes) is mixed the same way, from each domain's ``sumsq`` or, if it
    has none, its Gram's diagonal.
    """
    if variance_mix not in VARIANCE_MIXES:
        raise ValueError(f"unknown variance_mix {variance_mix!r}; expected {VARIANCE_MIXES}")
    alphas = list(alphas)
    if len(per_domain) != len(alphas) or not per_domain:
        raise ValueError(f"{len(per_domain)} domain statistics but {len(alphas)} weights")
    alphas = normalise_alphas(alphas)
    used = [(a, s) for a, s in zip(alphas, per_domain) if a > 0]
    for _, s in used:
        if int(s["count"]) < (2 if variance_mix == "eq8" else 1):
            raise ValueError(f"a domain with weight > 0 has {int(s['count'])} tokens")
    used = [(a, {**s, "sumsq": channel_sumsq(s)}) for a, s in used]
    if len(used) == 1:
        s = used[0][1]
        out = {"gram": s["gram"], "sum": s["sum"], "sumsq": s["sumsq"], "count": int(s["count"])}
        if s.get("abssum") is not None:
            out["abssum"] = s["abssum"]
        return out
    n = sum(int(s["count"]) for _, s in used)
    means = [s["sum"].double() / int(s["count"]) for _, s in used]
    m = sum(a * mk for (a, _), mk in zip(used, means))

    def mix(key, outer):  # the Gram (outer = torch.outer) or its diagonal Σx² (torch.mul)
        if variance_mix == "pooled":
            return n * sum(a * s[key].double() / int(s["count"]) for a, s in used)
        cov = sum(a * (s[key].double() - int(s["count"]) * outer(mk, mk))
                  / (int(s["count"]) - 1) for (a, s), mk in zip(used, means))
        return (n - 1) * cov + n * outer(m, m)

    gram = mix("gram", torch.outer if used[0][1]["gram"].dim() == 2 else torch.mul)
    out = {"gram": gram, "sum": n * m, "sumsq": mix("sumsq", torch.mul), "count": n}
    if all(s.get("abssum") is not None for _, s in used):  # E|x| of the mixture: linear in alpha
        out["abssum"] = n * sum(a * s["abssum"].double() / int(s["count"]) for a, s in used)
    return out


def finalize_stats(per_domain: list[dict], alphas, variance_mix: str, gram_dtype: str) -> dict:
    """Mixed statistics in the form ``calibrate.load_layer_stats`` returns (gram cast to the
    stored ``gram_dtype`` exactly as a Gram file would hold it, float64 sum, count, mean)."""
    mixed = mix_stats(per_domain, alphas, variance_mix)
    t = gram_tensors({"m": SimpleNamespace(**mixed)}, torch_dtype(gram_dtype))
    gram, total, count = t["m.gram"], t["m.sum"], int(t["m.count"][0])
    if not (torch.isfinite(gram).all() and torch.isfinite(total).all()):
        raise NonFiniteActivations("NaN/Inf in mixed calibration statistics")
    out = {"gram": gram, "sum": total, "sumsq": t["m.sumsq"], "count": count, "mean": total / max(count, 1)}
    if "m.abssum" in t:
        out["abssum"] = t["m.abssum"]
    return out


class DomainAccumulator:
    """Per-domain :class:`GramAccumulator` s of one module input; the rows of each batch are
    routed by the domain label of their calibration sequence (batches arrive in order)."""

    def __init__(self, dim: int, device, labels: torch.Tensor, batch_size: int, n_domains: int):
        self.accs = [GramAccumulator(dim, device) for _ in range(n_domains)]
        self.labels, self.batch_size, self.calls = labels, batch_size, 0

    def update(self, x: torch.Tensor) -> None:
        """Add a batch (B, T, d) whose rows are calibration sequences ``calls*bs ...``."""
        lab = self.labels[self.calls * self.batch_size:][: x.shape[0]]
        self.calls += 1
        if lab.numel() != x.shape[0]:
            raise RuntimeError("calibration batch does not match the domain labels")
        for k in lab.unique().tolist():
            sel = lab == k
            self.accs[k].update(x if bool(sel.all()) else x[sel.to(x.device)])

    def stats(self, diag: bool = False) -> list[dict]:
        """Per-domain {gram, sum, count}; ``diag``: only the Gram's diagonal (d,)."""
        return [{"gram": a.sumsq if diag else a.gram, "sum": a.sum, "sumsq": a.sumsq,
                 "abssum": a.abssum, "count": a.count} for a in self.accs]


def _module(layer, name: str):
    """o_proj or down_proj of a decoder layer, where its family's adapter keeps it."""
    return adapter_for(layer).output_module(layer, name)


def attach_accumulators(layer, calib: "CalibSet", batch_size: int, device) -> tuple[dict, list]:
    """Forward pre-hooks on o_proj / down_proj of ``layer`` feeding DomainAccumulators."""
    accs, handles = {}, []
    for name in MODULES:
        mod = _module(layer, name)
        acc = accs[name] = DomainAccumulator(mod.in_features, device, calib.labels, batch_size,
                                             len(calib.names))
        handles.append(mod.register_forward_pre_hook(lambda _m, args, acc=acc: acc.update(args[0])))
    return accs, handles


# ============================================================================ calibration data
@dataclass
class CalibSet:
    """Calibration windows of all domains, (n, seqlen) ids with the domain index of each row."""

    ids: torch.Tensor
    labels: torch.Tensor
    names: list[str]
    alphas: list[float]
    counts: list[int]


def calib_set(tokenizer, domains: list[dict], nsamples: int, seqlen: int, seed: int) -> CalibSet:
    """Windows of every domain {name, alpha, dataset}: nsamples split by alpha (largest
    remainder), each domain's windows from ``data.sample_windows`` with ``seed`` (one domain
    gives exactly the workflow's calibration windows)."""
    from .domains import apportion
    from .pipeline import calibration_ids

    if not domains:
        raise ValueError("no calibration domains given")
    alphas = normalise_alphas([d.get("alpha", 1.0) for d in domains])
    counts = apportion(nsamples, alphas)
    ids, labels = [], []
    for k, (dom, n) in enumerate(zip(domains, counts)):
        if n == 0:
            continue
        ids.append(calibration_ids(tokenizer, dom["dataset"], n, seqlen, seed))
        labels.append(torch.full((n,), k, dtype=torch.long))
    return CalibSet(torch.cat(ids), torch.cat(labels), [d["name"] for d in domains], alphas, counts)


# ============================================================================ pruning state
@dataclass
class PruneState:
    """Kept units (ORIGINAL indices) and accumulated float64 bias of every layer."""

    geom: AttnGeometry
    d_ff: int
    kv_groups: list[list[int]]
    channels: list[list[int]]
    bias: list[dict] = field(default_factory=list)       # module -> float64 (d_out,) or None
    base_bias: list[dict] = field(default_factory=list)  # module -> original bias or None

    @classmethod
    def fresh(cls, model) -> "PruneState":
        adapter = adapter_for(model.config)
        geom = attention_geometry(model.config)
        layers = decoder_layers(model)
        d_ff = adapter.ffn_width(layers[0])
        base = [{m: (None if _module(l, m).bias is None else _module(l, m).bias.detach().clone())
                 for m in MODULES} for l in layers]
        return cls(geom, d_ff, [list(range(geom.n_kv)) for _ in layers],
                   [list(range(d_ff)) for _ in layers], [{m: None for m in MODULES} for _ in layers],
                   base)

    def ratio_done(self) -> float:
        """Fraction of prunable parameters (KV groups + channels) removed so far."""
        wg, wc = unit_params(self.geom, 1)
        total = len(self.kv_groups) * (self.geom.n_kv * wg + self.d_ff * wc)
        kept = sum(len(g) * wg + len(c) * wc for g, c in zip(self.kv_groups, self.channels))
        return 1.0 - kept / total


def unit_params(geom: AttnGeometry, d_model: int) -> tuple[int, int]:
    """Parameters of one KV group (its q/k/v rows and o_proj columns) and of one MLP channel
    (gate/up rows, down column): (2 hd (groups + 1) d, 3 d)."""
    return 2 * geom.head_dim * (geom.groups + 1) * d_model, 3 * d_model


def current_geometry(layer, geom0: AttnGeometry) -> AttnGeometry:
    """The attention geometry of a (partially pruned) layer: same head_dim and groups."""
    n_kv = adapter_for(layer).kv_width(layer) // geom0.head_dim
    return AttnGeometry(n_kv * geom0.groups, n_kv, geom0.head_dim)


def install_bias_(layer, module: str, base: torch.Tensor | None, total: torch.Tensor) -> None:
    """Give ``module`` the bias base + total, rounded exactly as a block file stores and
    ``pipeline.build_model`` installs it (weight dtype, then float32, then added to base)."""
    lin = _module(layer, module)
    lin.bias = None if base is None else torch.nn.Parameter(base.clone(), requires_grad=False)
    file_bias = total.to(lin.weight.dtype).to(lin.weight.device)
    set_output_weights_(layer, module, lin.weight.data, file_bias.to(torch.float32))


def apply_layer_step_(layer, state: PruneState, i: int, groups_local: list[int],
                      channels_local: list[int], means: dict) -> None:
    """Prune layer ``i`` to the kept local groups/channels and add this step's bias
    b = W[:, P] mean[P] (eq. 3, W the current weight, mean from this step's statistics)."""
    geom = current_geometry(layer, state.geom)
    keeps = {"o_proj": o_proj_columns(groups_local, geom),
             "down_proj": torch.tensor(channels_local, dtype=torch.long)}
    for m in MODULES:  # float64 where the weight lives, accumulated on the CPU
        W = _module(layer, m).weight.detach().double()
        _, b = flap_bias(W, means[m].to(W.device, torch.float64), keeps[m].to(W.device))
        b = b.cpu()
        state.bias[i][m] = b if state.bias[i][m] is None else state.bias[i][m] + b
    prune_layer_(layer, geom, groups_local, channels_local)
    state.kv_groups[i] = [state.kv_groups[i][g] for g in groups_local]
    state.channels[i] = [state.channels[i][c] for c in channels_local]
    for m in MODULES:
        install_bias_(layer, m, state.base_bias[i][m], state.bias[i][m])


# ============================================================================ selection
def layer_scores(layer, stats: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """FLAP column scores (eq. 5) of the current o_proj and down_proj inputs, (k_o,), (k_d,),
    on the CPU (computed where the weight lives; the Gram may be full or its diagonal)."""
    out = []
    for m in MODULES:
        st, w = stats[m], _module(layer, m).weight.detach()
        out.append(column_scores("flap", w, channel_sumsq(st).to(w.device), st["sum"].to(w.device),
                                 st["count"]).cpu())
    return out[0], out[1]


def uniform_keep(o_scores, d_scores, geom: AttnGeometry, n_groups: int, n_channels: int):
    """Local keep sets of one layer: the ``n_groups`` best KV groups (group score = sum of its
    o_proj column scores, as ``select.select_layer``) and the ``n_channels`` best channels."""
    if n_groups > geom.n_kv or n_channels > d_scores.numel():
        raise ValueError(f"the schedule asks to keep {n_groups} groups / {n_channels} channels but "
                         f"only {geom.n_kv} / {d_scores.numel()} remain (ratios must not decrease)")
    return (top_k_sorted(group_scores(o_scores, geom), n_groups),
            top_k_sorted(d_scores, n_channels))


def standardise(x: torch.Tensor) -> torch.Tensor:
    """(x - mean) / std over one layer's module (FLAP); zeros when std is 0 or undefined."""
    x = x.double()
    if x.numel() < 2:
        return torch.zeros_like(x)
    sd = x.std()
    if not torch.isfinite(sd) or sd == 0:
        return torch.zeros_like(x)
    return (x - x.mean()) / sd


def alam_keep(scores: list[tuple], geoms: list[AttnGeometry], state: PruneState, d_model: int,
              ratio: float) -> list[tuple[list[int], list[int]]]:
    """FLAP AL-AM: KV groups and channels of all layers ranked together.

    Attention: column scores squared, standardised per layer, averaged over each group's columns;
    MLP: channel scores standardised per layer. Units sorted by score (descending, stable); the
    kept prefix is the one whose parameter count (group 2·hd·(g+1)·d, channel 3·d) is closest to
    (1 - ratio) × the ORIGINAL prunable parameters. Every layer keeps >= 1 group and channel.
    Returns local keep sets per layer.
    """
    wg, wc = unit_params(state.geom, d_model)
    budget = (1.0 - ratio) * len(scores) * (state.geom.n_kv * wg + state.d_ff * wc)
    vals, weights, owner = [], [], []
    for i, ((o, d), geom) in enumerate(zip(scores, geoms)):
        g = standardise(o**2).view(geom.n_kv, -1).mean(1)
        vals += [g, standardise(d)]
        weights += [torch.full((geom.n_kv,), float(wg), dtype=torch.float64),
                    torch.full((d.numel(),), float(wc), dtype=torch.float64)]
        owner += [(i, 0, j) for j in range(geom.n_kv)] + [(i, 1, j) for j in range(d.numel())]
    v, w = torch.cat(vals), torch.cat(weights)
    order = torch.sort(-v, stable=True).indices
    prefix = torch.cat([torch.zeros(1, dtype=torch.float64), torch.cumsum(w[order], 0)])
    t = int(torch.argmin((prefix - budget).abs()))
    kept = [[[], []] for _ in scores]
    for idx in order[:t].tolist():
        i, kind, j = owner[idx]
        kept[i][kind].append(j)
    for i, ((o, d), geom) in enumerate(zip(scores, geoms)):
        if not kept[i][0]:
            kept[i][0] = [int(torch.argmax(standardise(o**2).view(geom.n_kv, -1).mean(1)))]
        if not kept[i][1]:
            kept[i][1] = [int(torch.argmax(d))]
    return [(sorted(g), sorted(c)) for g, c in kept]


# ============================================================================ passes
@dataclass
class Options:
    """How to prune: ``mode`` global | sequential, ``structure`` uniform | al-am, the rounding
    of kept counts (as ``select.n_keep``), how domains mix, and the calibration pass."""

    mode: str = "global"
    structure: str = "uniform"
    variance_mix: str = "pooled"
    group_rounding: str = "ceil"
    channel_rounding: str = "ceil"
    gram_dtype: str = "float32"
    batch_size: int = 8
    device: str | None = None
    progress: bool = True

    def check(self) -> None:
        for key, allowed in (("mode", MODES), ("structure", STRUCTURES),
                             ("variance_mix", VARIANCE_MIXES), ("group_rounding", ROUNDINGS),
                             ("channel_rounding", ROUNDINGS)):
            if getattr(self, key) not in allowed:
                raise ValueError(f"unknown {key} {getattr(self, key)!r}; expected one of {allowed}")
        if self.mode == "sequential" and self.structure == "al-am":
            raise ValueError("structure 'al-am' ranks all layers together, so it needs the "
                             "statistics of every layer before pruning: use mode 'global'")
        torch_dtype(self.gram_dtype)


def global_pass(model, calib: CalibSet, opts: Options, on_stats, diag: bool = False) -> None:
    """One calibration pass (``calibrate.run_layerwise``) of the current model; after layer i has
    produced the inputs of layer i+1, ``on_stats(i, layer, stats)`` receives its mixed
    statistics (it may prune layer i: later layers still see the model of the previous step);
    ``diag``: only the Grams' diagonals leave the device (all FLAP needs)."""
    live = {}

    def before(i, layer):
        live["accs"], live["handles"] = attach_accumulators(layer, calib, opts.batch_size,
                                                            next(layer.parameters()).device)

    def after(i, _unused):
        for h in live.pop("handles"):
            h.remove()
        stats = {m: finalize_stats(a.stats(diag), calib.alphas, opts.variance_mix,
                                   opts.gram_dtype) for m, a in live.pop("accs").items()}
        on_stats(i, decoder_layers(model)[i], stats)

    run_layerwise(model, calib.ids, batch_size=opts.batch_size, device=opts.device,
                  on_layer=after, modules=(), progress=opts.progress, before_layer=before)


@torch.no_grad()
def sequential_pass(model, calib: CalibSet, opts: Options, on_stats, diag: bool = False) -> None:
    """One layer-sequential pass: for each layer, statistics on the inputs produced by the
    already pruned earlier layers, ``on_stats(i, layer, stats)`` (prunes layer i), then the
    pruned layer is run again to produce the inputs of layer i+1 (two forwards per layer)."""
    layers = decoder_layers(model)
    store = next(model.parameters()).device
    device = torch.device(opts.device) if opts.device is not None else store
    hidden = embed_batches(model, calib.ids, opts.batch_size, device, store)
    pos = torch.arange(calib.ids.shape[1], device=device).unsqueeze(0)
    rotary = adapter_for(model.config).rotary(model)
    rot_dev = next(rotary.buffers()).device
    rotary.to(device)
    pe = rotary(hidden[0].to(device), pos)
    masks = layer_masks(model, hidden[0].to(device), pos)
    for i in progress_bar(range(len(layers)), desc="sequential", unit="layer",
                          disable=not opts.progress):
        home = next(layers[i].parameters()).device
        layer = layers[i].to(device)
        accs, handles = attach_accumulators(layer, calib, opts.batch_size, device)
        try:
            for h in hidden:
                _layer_call(layer, h.to(device), masks[i], pos, pe)
        finally:
            for hd in handles:
                hd.remove()
        layer.to(home)
        stats = {m: finalize_stats(a.stats(diag), calib.alphas, opts.variance_mix,
                                   opts.gram_dtype) for m, a in accs.items()}
        on_stats(i, layer, stats)
        layer = layers[i].to(device)
        for b, h in enumerate(hidden):
            hidden[b] = _layer_call(layer, h.to(device), masks[i], pos, pe).to(store)
        layer.to(home)
    rotary.to(rot_dev)


# ============================================================================ driver
def make_schedule(ratio: float, steps: int | None = None, step: float | None = None) -> list[float]:
    """Cumulative ratios of the ORIGINAL width: rho·s/S for s = 1..S (``steps``), or
    δ, 2δ, ... capped at rho (``step`` δ); rounded to 6 decimals."""
    check_ratio(ratio)
    if (steps is None) == (step is None):
        raise ValueError("give exactly one of steps (S) or step (δ)")
    if steps is not None:
        if int(steps) < 1:
            raise ValueError(f"steps must be >= 1, got {steps}")
        return [round(ratio * s / int(steps), 6) for s in range(1, int(steps) + 1)]
    if not 0 < step < 1:
        raise ValueError(f"step must lie in (0, 1), got {step}")
    out, s = [], 1
    while round(s * step, 6) < ratio - 1e-9:
        out.append(round(s * step, 6))
        s += 1
    return out + [round(ratio, 6)]


def check_schedule(schedule: list[float]) -> None:
    if not schedule:
        raise ValueError("empty pruning schedule")
    for r in schedule:
        check_ratio(r)
    if any(b < a for a, b in zip(schedule, schedule[1:])):
        raise ValueError(f"pruning schedule must not decrease: {schedule}")


def run_step(model, calib: CalibSet, state: PruneState, ratio: float, opts: Options,
             record=None) -> dict:
    """One iterative step to cumulative ``ratio``: a calibration pass over the current model
    (eq. 12–13), FLAP scores of the remaining units, pruning and bias. ``record(i, stats)``
    (optional) sees every layer's statistics. Returns the step's info."""
    t0 = time.time()
    layers = decoder_layers(model)
    n_groups = n_keep(state.geom.n_kv, ratio, opts.group_rounding)
    n_channels = n_keep(state.d_ff, ratio, opts.channel_rounding)
    pending = []

    def on_stats(i, layer, stats):
        if record is not None:
            record(i, stats)
        o, d = layer_scores(layer, stats)
        geom = current_geometry(layer, state.geom)
        if opts.structure == "uniform":
            g, c = uniform_keep(o, d, geom, n_groups, n_channels)
            apply_layer_step_(layer, state, i, g, c, {m: stats[m]["mean"] for m in MODULES})
        else:
            pending.append(((o, d), geom, {m: stats[m]["mean"] for m in MODULES}))

    (global_pass if opts.mode == "global" else sequential_pass)(
        model, calib, opts, on_stats, diag=record is None)
    t_pass = time.time() - t0
    if opts.structure == "al-am":
        d_model = model.config.hidden_size
        keeps = alam_keep([p[0] for p in pending], [p[1] for p in pending], state, d_model, ratio)
        for i, ((g, c), p) in enumerate(zip(keeps, pending)):
            apply_layer_step_(layers[i], state, i, g, c, p[2])
    return {"ratio": ratio, "params_removed": round(state.ratio_done(), 6),
            "kv_groups_kept": [len(g) for g in state.kv_groups],
            "channels_kept": [len(c) for c in state.channels],
            "seconds_pass": round(t_pass, 3), "seconds": round(time.time() - t0, 3)}


def run_iterative(model, calib: CalibSet, schedule: list[float], opts: Options,
                  state: PruneState | None = None, record=None) -> tuple[PruneState, list[dict]]:
    """Prune ``model`` in place along ``schedule`` (cumulative ratios), starting from ``state``
    (a previous step's result applied to the model) or the dense model. S steps cost S passes
    (layer-sequential: S passes of two forwards per layer)."""
    opts.check()
    check_schedule(schedule)
    state = state or PruneState.fresh(model)
    infos = []
    for s, ratio in enumerate(schedule):
        info = run_step(model, calib, state, ratio, opts,
                        record=None if record is None else (lambda i, st, s=s: record(s, i, st)))
        infos.append({"step": s + 1, **info})
        log.info("step %d/%d: ratio %.4g, %.1f%% of prunable params removed, %.1fs", s + 1,
                 len(schedule), ratio, 100 * info["params_removed"], info["seconds"])
    return state, infos


# ============================================================================ artifacts
def keep_dict(state: PruneState, meta: dict) -> dict:
    """keep.json in the select stage's format (ORIGINAL indices) plus the method's fields."""
    return {"selection": "iflap", **meta, "n_kv": state.geom.n_kv, "n_heads": state.geom.n_heads,
            "head_dim": state.geom.head_dim, "d_ff": state.d_ff,
            "layers": [{"kv_groups": g, "channels": c}
                       for g, c in zip(state.kv_groups, state.channels)]}


def block_tensors(model, state: PruneState) -> dict[str, torch.Tensor]:
    """``layer{i}.{module}.weight`` (the kept original columns) and ``.bias`` (accumulated,
    in the weight dtype), the compensate stage's block format."""
    out = {}
    for i, layer in enumerate(decoder_layers(model)):
        for m in MODULES:
            w = _module(layer, m).weight.data
            out[f"layer{i}.{m}.weight"] = w.detach().cpu().contiguous()
            if state.bias[i][m] is not None:
                out[f"layer{i}.{m}.bias"] = state.bias[i][m].to(w.dtype).cpu().contiguous()
    return out


def state_tensors(state: PruneState) -> dict[str, torch.Tensor]:
    return {f"layer{i}.{m}.bias": b[m].cpu().contiguous()
            for i, b in enumerate(state.bias) for m in MODULES if b[m] is not None}


def _save_tensors(tensors: dict, path: Path, fmt: str, meta: dict | None = None) -> None:
    A.write_tensors(path, tensors, fmt, {k: str(v) for k, v in (meta or {}).items()})


def write_result(model, state: PruneState, out_dir: str | Path, keep_meta: dict, info: dict,
                 block_name: str | None = None) -> dict[str, Path]:
    """Write keep.json, the block file (default ``block0-{L-1}.safetensors``),
    state.safetensors and iterative.json (timings left out: they are logged) into ``out_dir``
    (each atomically, ``artifacts``)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    n = len(state.kv_groups)
    paths = {"keep": out / "keep.json", "block": out / (block_name or f"block0-{n - 1}.safetensors"),
             "state": out / "state.safetensors", "info": out / "iterative.json"}
    _save_tensors(block_tensors(model, state), paths["block"], "comp-block", {"method": "iflap"})
    _save_tensors(state_tensors(state), paths["state"], "iterative-state", {"method": "iflap"})
    A.write_json(paths["keep"], keep_dict(state, keep_meta), "keep")
    _log_timings(str(paths["info"]), info)
    A.write_result(paths["info"], info, "iterative-info")
    return paths


def _log_timings(what: str, obj) -> None:
    t = A.timings(obj)
    if t:
        log.info("timings of %s: %s", what, json.dumps(t))


def apply_keep_(model, keep: dict, tensors: dict | None = None) -> None:
    """Prune a dense model by keep.json and install a block file's weights/biases (per-layer
    widths may differ, as with AL-AM: then the config is left alone)."""
    prune_model_(model, keep)
    install_weights_(model, tensors or {})


def load_state(model, init_dir: str | Path) -> PruneState:
    """Apply a previous step's keep.json + block file to the dense ``model`` and return its
    state with the exact float64 biases from state.safetensors."""
    init_dir = Path(init_dir)
    keep = A.read_keep(init_dir / "keep.json", len(decoder_layers(model)))
    blocks = sorted(init_dir.glob("block*.safetensors")) or sorted(init_dir.glob("bias.safetensors"))
    if not blocks or not (init_dir / "state.safetensors").is_file():
        raise FileNotFoundError(f"{init_dir} lacks a block file or state.safetensors")
    state = PruneState.fresh(model)
    apply_keep_(model, keep, A.read_comp_block(blocks[0]))
    acc = A.read_tensors(init_dir / "state.safetensors", fmt="iterative-state")
    for i, k in enumerate(keep["layers"]):
        state.kv_groups[i], state.channels[i] = list(k["kv_groups"]), list(k["channels"])
        for m in MODULES:
            state.bias[i][m] = acc.get(f"layer{i}.{m}.bias")
    return state


# ============================================================================ stage functions
def _hub(a) -> dict:
    """revision / trust_remote_code of the parsed arguments, for every model load."""
    return {"revision": getattr(a, "revision", None),
            "trust_remote_code": bool(getattr(a, "trust_remote_code", False))}


def _provenance(a) -> dict:
    """The model record of a result (``provenance.model_provenance``)."""
    from .provenance import model_provenance

    return model_provenance(a.model, **_hub(a))


def run_cli_prune(a) -> dict:
    """``iterative run``: load, (continue from --init), prune along the schedule, write."""
    from .models import load_model, resolve_device

    t0 = time.time()
    torch.manual_seed(a.seed)
    model, tok = load_model(a.model, dtype=a.dtype, device="cpu", **_hub(a))
    calib = calib_set(tok, a.domains, a.nsamples, a.seqlen, a.seed)
    opts = Options(mode=a.mode, structure=a.structure, variance_mix=a.variance_mix,
                   group_rounding=a.group_rounding, channel_rounding=a.channel_rounding,
                   gram_dtype=a.gram_dtype, batch_size=a.batch_size,
                   device=resolve_device(a.device), progress=not a.quiet)
    state = load_state(model, a.init) if a.init else None
    schedule = ([float(x) for x in a.schedule.split(",")] if a.schedule
                else make_schedule(a.ratio, a.steps, a.step))
    state, infos = run_iterative(model, calib, schedule, opts, state)
    meta = {"ratio": schedule[-1], "schedule": schedule, "mode": a.mode,
            "structure": a.structure, "group_rounding": a.group_rounding,
            "channel_rounding": a.channel_rounding}
    info = {"model": _provenance(a), "domains": a.domains,
            "alphas": calib.alphas, "sequences_per_domain": calib.counts, "seqlen": a.seqlen,
            "seed": a.seed, "variance_mix": a.variance_mix, "gram_dtype": a.gram_dtype,
            "init": a.init, **meta, "steps": infos, "seconds": round(time.time() - t0, 3)}
    write_result(model, state, a.out, meta, info, a.block_name)
    return info


def run_cli_grams(a) -> dict:
    """``iterative grams``: one pass of the dense model, per-domain statistics mixed by alpha,
    written as a Gram directory (``calibrate_to_dir`` format) for select/compensate."""
    from .models import load_model, resolve_device

    t0 = time.time()
    torch.manual_seed(a.seed)
    model, tok = load_model(a.model, dtype=a.dtype, device="cpu", **_hub(a))
    calib = calib_set(tok, a.domains, a.nsamples, a.seqlen, a.seed)
    opts = Options(variance_mix=a.variance_mix, gram_dtype=a.gram_dtype,
                   batch_size=a.batch_size, device=resolve_device(a.device), progress=not a.quiet)
    opts.check()
    with A.atomic_dir(a.out) as tmp:

        def write(i, _layer, stats):
            A.write_gram_layer(A.gram_path(tmp, i), _stats_tensors(stats))

        global_pass(model, calib, opts, write)
        meta = {"n_layers": len(decoder_layers(model)), "n_sequences": int(calib.ids.shape[0]),
                "seqlen": a.seqlen, "tokens": int(calib.ids.numel()), "gram_dtype": a.gram_dtype,
                "model": _provenance(a), "domains": a.domains, "alphas": calib.alphas,
                "sequences_per_domain": calib.counts, "variance_mix": a.variance_mix,
                "seed": a.seed, "dtype": a.dtype}
        A.write_json(tmp / "meta.json", meta, "gram-meta")
    meta["seconds"] = round(time.time() - t0, 3)
    log.info("Grams of %d layers in %.1fs", meta["n_layers"], meta["seconds"])
    return meta


def _stats_tensors(stats: dict) -> dict[str, torch.Tensor]:
    """Finalised module statistics -> ``<module>.gram|sum|sumsq|count`` file entries."""
    out = {}
    for m, st in stats.items():
        out[f"{m}.gram"] = st["gram"].contiguous()
        out[f"{m}.sum"] = st["sum"].to(torch.float64).contiguous()
        out[f"{m}.sumsq"] = channel_sumsq(st).to(torch.float64).contiguous()
        if st.get("abssum") is not None:  # Σ|x| per channel, as the calibrate stage writes it
            out[f"{m}.abssum"] = st["abssum"].to(torch.float64).contiguous()
        out[f"{m}.count"] = torch.tensor([st["count"]], dtype=torch.int64)
    return out


def mix_gram_dirs(gram_dirs: list[str], alphas, out: str | Path, variance_mix: str = "pooled",
                  gram_dtype: str = "float32") -> dict:
    """Mix existing per-domain Gram directories layer by layer (eq. 8) into ``out``."""
    metas = [A.read_gram_meta(d) for d in gram_dirs]
    n_layers = {m["n_layers"] for m in metas}
    if len(n_layers) != 1:
        raise ValueError(f"Gram directories disagree on the layer count: {sorted(n_layers)}")
    with A.atomic_dir(out) as tmp:
        for i in progress_bar(range(n_layers.pop()), desc="mix", unit="layer"):
            stats = {}
            for m in MODULES:
                per = [load_layer_stats(d, i, m) for d in gram_dirs]
                stats[m] = finalize_stats(per, alphas, variance_mix, gram_dtype)
            A.write_gram_layer(A.gram_path(tmp, i), _stats_tensors(stats))
        meta = {"n_layers": metas[0]["n_layers"], "sources": [str(d) for d in gram_dirs],
                "alphas": normalise_alphas(alphas), "variance_mix": variance_mix,
                "tokens": sum(m.get("tokens", 0) for m in metas), "gram_dtype": gram_dtype}
        A.write_json(tmp / "meta.json", meta, "gram-meta")
    return meta


def run_cli_ppl(a) -> dict:
    """``iterative ppl``: ``coec ppl`` for cells whose per-layer widths may differ (AL-AM)."""
    from . import data as D
    from .evaluate.ppl import perplexity
    from .models import load_model
    from .pipeline import run_ppl

    keep = A.read_keep(a.keep) if a.keep else None
    if keep is None or len({(len(k["kv_groups"]), len(k["channels"]))
                            for k in keep["layers"]}) == 1:
        return run_ppl(a.model, a.dataset, a.seqlen, a.max_windows, a.batch_size, a.dtype,
                       a.device, a.out, a.keep, a.comp, a.cell, **_hub(a))
    t0 = time.time()
    model, tok = load_model(a.model, dtype=a.dtype, device=a.device, **_hub(a))
    apply_keep_(model, keep, A.read_comp_blocks(a.comp))
    windows = D.eval_windows(D.tokenize_text(tok, D.load_split(a.dataset, "eval")), a.seqlen,
                             a.max_windows)
    res = perplexity(model, windows, batch_size=a.batch_size)
    res.update({"model": _provenance(a), "dataset": a.dataset, "dtype": a.dtype,
                "max_windows": a.max_windows, "params": sum(p.numel() for p in model.parameters()),
                "cell": a.cell or {}, "total_seconds": round(time.time() - t0, 3)})
    _log_timings(str(a.out), res)
    A.write_result(a.out, res, "ppl")
    return res


def collect_cell(step_infos: list[str], variant: dict, keep_out: str, info_out: str) -> dict:
    """A cell from its chain of step folders: the last step's keep.json (with the whole
    schedule) and one iterative.json with every step's info (timings are in the steps' logs)."""
    steps = [A.strip_format(A.read_json(p, "iterative-info")) for p in step_infos]
    keep = A.read_keep(Path(step_infos[-1]).parent / "keep.json")
    schedule = [st["ratio"] for st in steps]
    keep["schedule"] = schedule
    infos = [{**st["steps"][-1], "step": s + 1, "dir": str(Path(p).parent)}
             for s, (st, p) in enumerate(zip(steps, step_infos))]
    info = {**{k: v for k, v in steps[-1].items() if k not in ("steps", "seconds", "init")},
            "variant": variant, "schedule": schedule, "steps": infos,
            "calibration_passes": len(infos)}
    A.write_json(keep_out, keep, "keep")
    A.write_result(info_out, info, "iterative-info")
    return info


def copy_block(src: str, first: int, last: int, out: str) -> None:
    """Copy a step's bias block file to a cell's ``block{first}-{last}.safetensors`` after
    checking that it holds exactly layers first..last."""
    import shutil

    A.read_comp_block(src, first, last)
    with A.atomic_path(out) as tmp:
        shutil.copyfile(src, tmp)


# ============================================================================ CLI
def _json(s: str):
    try:
        return json.loads(s)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON: {s!r} ({exc})") from None


def _calib_args(s) -> None:
    s.add_argument("--model", required=True)
    s.add_argument("--domains", type=_json, required=True,
                   help='JSON list of {"name", "alpha", "dataset": <data.load_split spec>}')
    s.add_argument("--nsamples", type=int, required=True, help="sequences over all domains")
    s.add_argument("--seqlen", type=int, required=True)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--batch-size", type=int, default=8)
    s.add_argument("--dtype", default="float32")
    s.add_argument("--gram-dtype", default="float32")
    s.add_argument("--variance-mix", default="pooled", choices=VARIANCE_MIXES)
    s.add_argument("--device", default="auto")
    s.add_argument("--quiet", action="store_true", help="no progress bars")
    s.add_argument("--expect", type=_json, default={}, help="what the config says of the model "
                   "(coec --help: --expect); checked against its config.json first")
    add_hub_args(s)
    s.add_argument("--out", required=True)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="coec iterative", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)

    s = sub.add_parser("run", help="iterative (multi-domain) FLAP -> keep.json + bias block")
    _calib_args(s)
    s.add_argument("--ratio", type=float, help="target ratio rho (with --steps or --step)")
    s.add_argument("--steps", type=int, help="S steps: rho_s = rho s / S")
    s.add_argument("--step", type=float, help="step δ of the original width: δ, 2δ, ... rho")
    s.add_argument("--schedule", help="explicit cumulative ratios, e.g. 0.1,0.2,0.3")
    s.add_argument("--mode", default="global", choices=MODES)
    s.add_argument("--structure", default="uniform", choices=STRUCTURES)
    s.add_argument("--group-rounding", default="ceil", choices=ROUNDINGS)
    s.add_argument("--channel-rounding", default="ceil", choices=ROUNDINGS)
    s.add_argument("--init", default=None, help="continue from a previous step's output folder")
    s.add_argument("--block-name", default=None, help="default block0-{L-1}.safetensors")

    s = sub.add_parser("grams", help="multi-domain Gram directory (one pass, mixed by alpha)")
    _calib_args(s)

    s = sub.add_parser("mix", help="mix per-domain Gram directories (eq. 8)")
    s.add_argument("--grams", nargs="+", required=True)
    s.add_argument("--alphas", nargs="+", type=float, required=True)
    s.add_argument("--variance-mix", default="pooled", choices=VARIANCE_MIXES)
    s.add_argument("--gram-dtype", default="float32")
    s.add_argument("--out", required=True)

    s = sub.add_parser("prepare-domain", help="write a domain's calibration text")
    s.add_argument("--spec", type=_json, required=True)
    s.add_argument("--datasets", type=_json, default={})
    s.add_argument("--out", required=True)

    s = sub.add_parser("collect", help="assemble a cell from its step folders")
    s.add_argument("--steps", nargs="*", default=[], help="the steps' iterative.json, in order")
    s.add_argument("--variant", type=_json, default={})
    s.add_argument("--keep-out")
    s.add_argument("--info-out")
    s.add_argument("--block", help="a step's bias block file to copy")
    s.add_argument("--first", type=int, default=0)
    s.add_argument("--last", type=int)
    s.add_argument("--block-out")

    s = sub.add_parser("ppl", help="perplexity of a cell (per-layer widths may differ)")
    s.add_argument("--model", required=True)
    s.add_argument("--dataset", type=_json, required=True)
    s.add_argument("--seqlen", type=int, required=True)
    s.add_argument("--max-windows", type=lambda x: None if x in ("", "0", "none", "None") else int(x),
                   default=None)
    s.add_argument("--batch-size", type=int, default=4)
    s.add_argument("--dtype", default="float32")
    s.add_argument("--device", default="auto")
    s.add_argument("--keep", default=None)
    s.add_argument("--comp", nargs="*", default=[])
    s.add_argument("--cell", type=_json, default={})
    s.add_argument("--expect", type=_json, default={}, help="as for run")
    add_hub_args(s)
    s.add_argument("--out", required=True)
    return p


def _check_run_args(a, p) -> None:
    if a.cmd != "run":
        return
    given = sum(x is not None for x in (a.steps, a.step)) + bool(a.schedule)
    if a.schedule and (a.steps is not None or a.step is not None):
        p.error("--schedule excludes --steps/--step")
    if not a.schedule and (a.ratio is None or given != 1):
        p.error("give --ratio with exactly one of --steps or --step, or --schedule")


def main(argv: list[str] | None = None) -> int:
    """``python -m coec iterative <run|grams|mix|collect|prepare-domain|ppl> ...``"""
    argv = sys.argv[1:] if argv is None else argv
    p = build_parser()
    a = p.parse_args(argv)
    _check_run_args(a, p)
    from .cli import run_guarded

    return run_guarded(f"iterative {a.cmd}", lambda: _dispatch(a))


def _dispatch(a) -> None:
    if a.cmd in ("run", "grams", "ppl"):  # the model against the config, before any work
        from .cli import check_model_stage

        check_model_stage(a)
    if a.cmd == "run":
        run_cli_prune(a)
    elif a.cmd == "grams":
        run_cli_grams(a)
    elif a.cmd == "mix":
        mix_gram_dirs(a.grams, a.alphas, a.out, a.variance_mix, a.gram_dtype)
    elif a.cmd == "collect":
        if a.steps:
            collect_cell(a.steps, a.variant, a.keep_out, a.info_out)
        if a.block:
            copy_block(a.block, a.first, a.last, a.block_out)
    elif a.cmd == "prepare-domain":
        from .domains import build_domain

        build_domain(a.spec, a.out, a.datasets)
    elif a.cmd == "ppl":
        from .models import resolve_device

        a.device = str(resolve_device(a.device))
        run_cli_ppl(a)


if __name__ == "__main__":
    sys.exit(main())
