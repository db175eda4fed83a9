"""Calibration statistics of several domains and their mixture (docs/iterative.md, eq. 6–8).

The calibration set holds windows of K domains (:class:`CalibSet`); one pass accumulates the
statistics of every domain apart (:class:`DomainAccumulator`) and :func:`mix_stats` mixes them
with the weights alpha_k into the statistics of one calibration distribution.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch

from coec.calibrate.layer_pass import GramAccumulator, NonFiniteActivations, channel_sumsq, gram_tensors
from coec.data.text import calibration_ids
from coec.iterative.choices import VARIANCE_MIXES
from coec.iterative.domains import apportion
from coec.model.arch import MODULES, adapter_for
from coec.model.load import torch_dtype

#: One set of statistics: gram (d, d) or its diagonal (d,), sum (d,), sumsq (d,), count, abssum
#: (d,) or None; finalized ones also mean (d,).
Stats = dict[str, Any]


def normalise_alphas(alphas: Iterable[float]) -> list[float]:
    """Domain weights alpha_k >= 0 scaled to sum 1 (eq. 7)."""
    a = [float(x) for x in alphas]
    if not a or any(x < 0 or not math.isfinite(x) for x in a) or sum(a) <= 0:
        raise ValueError(f"domain weights must be finite, >= 0 and not all 0, got {alphas}")
    return [x / sum(a) for x in a]


def mix_stats(per_domain: Sequence[Mapping[str, Any]], alphas: Iterable[float], variance_mix: str = "pooled") -> Stats:
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
    weights = list(alphas)
    if len(per_domain) != len(weights) or not per_domain:
        raise ValueError(f"{len(per_domain)} domain statistics but {len(weights)} weights")
    used = [(a, s) for a, s in zip(normalise_alphas(weights), per_domain, strict=True) if a > 0]
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
    m = sum(a * mk for (a, _), mk in zip(used, means, strict=True))

    def mix(
        key: str, outer: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    ) -> Any:  # the Gram (outer = torch.outer) or its diagonal Σx² (torch.mul)
        if variance_mix == "pooled":
            return n * sum(a * s[key].double() / int(s["count"]) for a, s in used)
        cov = sum(
            a * (s[key].double() - int(s["count"]) * outer(mk, mk)) / (int(s["count"]) - 1)
            for (a, s), mk in zip(used, means, strict=True)
        )
        return (n - 1) * cov + n * outer(m, m)

    gram = mix("gram", torch.outer if used[0][1]["gram"].dim() == 2 else torch.mul)
    out = {"gram": gram, "sum": n * m, "sumsq": mix("sumsq", torch.mul), "count": n}
    if all(s.get("abssum") is not None for _, s in used):  # E|x| of the mixture: linear in alpha
        out["abssum"] = n * sum(a * s["abssum"].double() / int(s["count"]) for a, s in used)
    return out


def finalize_stats(
    per_domain: Sequence[Mapping[str, Any]], alphas: Iterable[float], variance_mix: str, gram_dtype: str
) -> Stats:
    """Mixed statistics in the form ``artifacts.read_gram_layer`` returns (gram cast to the
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

    def __init__(self, dim: int, device: torch.device, labels: torch.Tensor, batch_size: int, n_domains: int):
        self.accs = [GramAccumulator(dim, device) for _ in range(n_domains)]
        self.labels, self.batch_size, self.calls = labels, batch_size, 0

    def update(self, x: torch.Tensor) -> None:
        """Add a batch (B, T, d) whose rows are calibration sequences ``calls*bs ...``."""
        lab = self.labels[self.calls * self.batch_size :][: x.shape[0]]
        self.calls += 1
        if lab.numel() != x.shape[0]:
            raise RuntimeError("calibration batch does not match the domain labels")
        for k in torch.unique(lab).tolist():
            sel = lab == k
            self.accs[k].update(x if bool(sel.all()) else x[sel.to(x.device)])

    def stats(self, diag: bool = False) -> list[Stats]:
        """Per-domain {gram, sum, count}; ``diag``: only the Gram's diagonal (d,)."""
        return [
            {"gram": a.sumsq if diag else a.gram, "sum": a.sum, "sumsq": a.sumsq, "abssum": a.abssum, "count": a.count}
            for a in self.accs
        ]


@dataclass
class CalibSet:
    """Calibration windows of all domains, (n, seqlen) ids with the domain index of each row."""

    ids: torch.Tensor
    labels: torch.Tensor
    names: list[str]
    alphas: list[float]
    counts: list[int]


def attach_accumulators(
    layer: torch.nn.Module, calib: CalibSet, batch_size: int, device: torch.device
) -> tuple[dict[str, DomainAccumulator], list[torch.utils.hooks.RemovableHandle]]:
    """Forward pre-hooks on o_proj / down_proj of ``layer`` feeding DomainAccumulators."""
    accs: dict[str, DomainAccumulator] = {}
    handles = []
    for name in MODULES:
        mod = adapter_for(layer).output_module(layer, name)
        acc = accs[name] = DomainAccumulator(mod.in_features, device, calib.labels, batch_size, len(calib.names))
        handles.append(mod.register_forward_pre_hook(lambda _m, args, acc=acc: acc.update(args[0])))
    return accs, handles


def calib_set(tokenizer: Any, domains: list[dict[str, Any]], nsamples: int, seqlen: int, seed: int) -> CalibSet:
    """Windows of every domain {name, alpha, dataset}: nsamples split by alpha (largest
    remainder), each domain's windows from ``data.sample_windows`` with ``seed`` (one domain
    gives exactly the workflow's calibration windows)."""
    if not domains:
        raise ValueError("no calibration domains given")
    alphas = normalise_alphas([d.get("alpha", 1.0) for d in domains])
    counts = apportion(nsamples, alphas)
    ids, labels = [], []
    for k, (dom, n) in enumerate(zip(domains, counts, strict=True)):
        if n == 0:
            continue
        ids.append(calibration_ids(tokenizer, dom["dataset"], n, seqlen, seed))
        labels.append(torch.full((n,), k, dtype=torch.long))
    return CalibSet(torch.cat(ids), torch.cat(labels), [d["name"] for d in domains], alphas, counts)
