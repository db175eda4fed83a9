"""The problem a compensation method solves: one pruned module (:class:`Problem`), with what
its method and the reported errors need formed up front (:func:`prepare`: the float64 metric,
App. B's PSD check, the output energy), and the calibration's check of a module
(:func:`check_module`). Torch code; a method's entry and options are
``coec.compensate.methods.base``."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from coec.compensate.errors import output_energy
from coec.compensate.gram import gram_psd, gram_scale, normalize_gram_, psd_project, symmetrize_
from coec.compensate.gram_check import GramCheck, frobenius

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Metric:
    """The reconstruction metric of a problem (paper Sec. 3.1, App. B): the Gram normalised to
    unit mean diagonal in float64 (``G``, (d_in, d_in)), replaced by its PSD projection when it is
    indefinite (``psd`` records the outcome), the solver fallbacks recorded on the way, the
    factor the normalisation divided by (``scale``: the Gram is ``scale * G``)."""

    G: torch.Tensor
    psd: dict[str, Any]
    fallbacks: list[str]
    scale: float


def form_metric(gram: torch.Tensor, device: torch.device, check: GramCheck | None = None) -> Metric:
    """The float64 metric of ``gram`` (d, d) on ``device``; App. B's verdict comes from ``check``
    (a check formed from this Gram) when given: its PSD outcome, or its eigenvalues for an
    indefinite Gram (no Cholesky)."""
    fallbacks: list[str] = []
    g64 = gram.to(device, torch.float64, copy=True)  # normalised in place below
    scale = gram_scale(g64)
    G = normalize_gram_(g64)
    if check is not None and not check.psd["indefinite"]:
        psd = dict(check.psd)
    elif check is not None:  # indefinite: its eigenvalues decide, no Cholesky
        G, psd = gram_psd(G, fallbacks, min_eig=check.psd.get("min_eig"), max_eig=check.psd.get("max_eig"))
    else:
        G, psd = gram_psd(G, fallbacks)
    return Metric(G=G, psd=psd, fallbacks=fallbacks, scale=scale)


@dataclass(frozen=True)
class Problem:
    """One pruned module to compensate, on the device it is solved on; plain data, formed once by
    :func:`prepare`.

    W0 (d_out, d_in) the original weight; gram (d_in, d_in) ``sum_t x_t x_t^T`` or its mean (no
    method's result depends on which); mean (d_in,) the channel means or None; keep (k,) the
    sorted, unique kept input columns (long); n_tokens the tokens ``gram`` sums over (None when
    unknown); inputs the method's declared extra data (``Method.inputs``), by name; dtype the
    dtype the method solves in (``Method.dtype``).

    What :func:`prepare` forms up front (the defaults: nothing formed, as for coec, which reads
    no metric and reports its own errors): metric the float64 :class:`Metric` (None when the
    calibration's Gram check stands in for it, or nothing needs it); psd App. B's outcome;
    scale the Gram is ``scale * G``; fallbacks the solver fallbacks recorded on the way; energy
    the output energy ``c = tr(W0 G W0^T)`` on the metric (None when no error is reported here).
    """

    W0: torch.Tensor
    gram: torch.Tensor
    mean: torch.Tensor | None
    keep: torch.Tensor
    n_tokens: float | None = None
    inputs: Mapping[str, Any] = field(default_factory=dict)
    dtype: torch.dtype = torch.float64
    metric: Metric | None = None
    psd: dict[str, Any] = field(default_factory=dict)
    scale: float | None = None
    fallbacks: list[str] = field(default_factory=list)
    energy: float | None = None

    @property
    def device(self) -> torch.device:
        return self.W0.device

    @property
    def d_out(self) -> int:
        return int(self.W0.shape[0])

    @property
    def d_in(self) -> int:
        return int(self.W0.shape[1])

    @property
    def k(self) -> int:
        return int(self.keep.numel())

    def metric_block(self, idx: torch.Tensor) -> torch.Tensor:
        """``G[idx][:, idx]`` (len(idx), len(idx)) of the metric; when the check stands in for
        the metric (``metric`` None), formed from the Gram's block alone with the bits of the
        whole metric's (``normalize_gram_`` entry by entry: ``(g_ij + g_ji) * 0.5 / scale``)."""
        if self.metric is not None:
            return self.metric.G[idx[:, None], idx]
        if self.scale is None:
            raise ValueError("the metric block needs a prepared problem (prepare(..., errors=True))")
        B = self.gram[idx[:, None], idx].to(torch.float64)
        return torch.add(B, B.mT).mul_(0.5).div_(self.scale)

    def metric_whole(self) -> torch.Tensor:
        """The whole metric G (d_in, d_in): ``metric.G``, or, when the check stands in for it (a
        PSD Gram), the normalised Gram itself (formed here, float64)."""
        if self.metric is not None:
            return self.metric.G
        return normalize_gram_(self.gram.to(self.device, torch.float64, copy=True))

    def mean_gram(self) -> torch.Tensor:
        """``E[x x^T]`` in float64 (the Gram over ``n_tokens``, symmetrised), with the metric's PSD
        projection when the Gram was indefinite."""
        if self.n_tokens is None:
            raise ValueError("the mean Gram needs n_tokens")
        gm = symmetrize_(self.gram.to(self.device, torch.float64) / float(self.n_tokens))
        return psd_project(gm)[0] if self.psd.get("indefinite") else gm


def _fitting(check: GramCheck | None, gram: torch.Tensor) -> GramCheck | None:
    """``check`` when it was formed from ``gram`` (``GramCheck.fits_gram``), else None; a check of
    another Gram is not used, and the log says so."""
    if check is None or check.fits_gram(gram):
        return check
    log.warning("the Gram check was formed from another Gram (stale?): App. B's check is run again")
    return None


def _check_energy(check: GramCheck | None, W0: torch.Tensor) -> float | None:
    """The check's output energy when it was formed from this weight, else None (the log says
    why when the check has one of another weight)."""
    if check is None or check.energy is None:
        return None
    if check.fits_weight(W0):
        return check.energy
    log.warning("the Gram check was formed from another weight (stale?): the output energy is formed again")
    return None


def prepare(problem: Problem, check: GramCheck | None, *, metric: bool, errors: bool) -> Problem:
    """``problem`` with what its method and its reported errors need formed up front, once.

    metric: the method reads ``problem.metric`` (``Method.needs_metric``); errors: ``compensate``
    reports the errors on the metric (``Method.reports_errors`` false: psd, scale, energy).
    check: the calibration's :class:`GramCheck` of this module or None; used when formed from
    this Gram (and, for the energy, this weight). It stands in for the metric, which is then not
    formed (the expensive part: a float64 copy and App. B's check), when the method does not
    read the metric, the Gram is PSD and the check holds the energy of this weight.
    """
    if not (metric or errors):
        return problem
    chk = _fitting(check, problem.gram)
    energy = _check_energy(chk, problem.W0) if errors else None
    if chk is not None and not chk.psd["indefinite"] and not metric and energy is not None:
        return replace(problem, psd=dict(chk.psd), scale=chk.scale, energy=energy)
    m = form_metric(problem.gram, problem.device, chk)
    if errors and energy is None:
        energy = output_energy(problem.W0, m.G)
    return replace(problem, metric=m, psd=m.psd, scale=m.scale, fallbacks=m.fallbacks, energy=energy)


def check_module(W0: torch.Tensor, gram: torch.Tensor) -> GramCheck:
    """The calibration's check of one module (``coec.compensate.gram_check``): W0 (d_out, d_in)
    its weight, gram (d_in, d_in) its input's Gram (``sum_t x_t x_t^T`` or its mean), both on the
    device the compensation jobs use. Runs :func:`form_metric` (normalise, App. B) and
    ``errors.output_energy`` on them, the code a compensation job runs without a check."""
    metric = form_metric(gram, W0.device)
    c = output_energy(W0, metric.G)
    return GramCheck(
        scale=metric.scale,
        gram_norm=frobenius(gram),
        weight_norm=frobenius(W0),
        psd=dict(metric.psd),
        energy=c if math.isfinite(c) else None,
    )
