"""What a compensation method is: one registered entry with typed options, the data it needs
beyond the Grams, and a solve function of one shared signature.

    solve(problem: Problem, options: MyOptions) -> Compensation

A method lives in one module that defines its options (a frozen dataclass deriving from
:class:`CommonOptions`, fields made with ``validators.opt``) and registers a :class:`Method`
in :data:`METHODS`. The built-in methods are in ``coec.compensate.methods``; a researcher's own
is a file named in the config's ``plugins`` (docs/adding-a-method.md). Everything else (the
config schema's method names, the option checks and page, the compensate rule's inputs, the
compensate stage) reads the registry.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import torch

from ..registry import Registry
from .gram import gram_psd, gram_scale, normalize_gram_
from .gram_check import GramCheck, frobenius
from .inputs import MethodInput
from .validators import float_dtype, opt

log = logging.getLogger(__name__)

__all__ = ["CommonOptions", "Problem", "Metric", "Compensation", "Method", "METHODS", "MODULES", "check_module"]

#: The two compensated modules of a decoder layer (a config entry may override options per module).
MODULES = ("o_proj", "down_proj")


@dataclass(frozen=True)
class CommonOptions:
    """Options of every method."""

    compute_dtype: str | None = opt(
        None,
        "dtype of the solve (null: the method's default: float32 for coec; float64 on the CPU and "
        "float32 on CUDA for the others); the ridge solve, scale scalars and reported errors run in "
        "float64 regardless",
        float_dtype(),
    )


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


@dataclass(frozen=True)
class Problem:
    """One pruned module to compensate, on the device it is solved on.

    W0 (d_out, d_in) the original weight; gram (d_in, d_in) ``sum_t x_t x_t^T`` or its mean (no
    method's result depends on which); mean (d_in,) the channel means or None; keep (k,) the
    sorted, unique kept input columns (long); n_tokens the tokens ``gram`` sums over (None when
    unknown); inputs the method's declared extra data (``Method.inputs``), by name; dtype the
    dtype the method solves in (``Method.dtype``); check the calibration's
    :class:`~coec.compensate.gram_check.GramCheck` of this module, or None (then the metric's
    PSD check and output energy are formed here).
    """

    W0: torch.Tensor
    gram: torch.Tensor
    mean: torch.Tensor | None
    keep: torch.Tensor
    n_tokens: float | None = None
    inputs: Mapping[str, Any] = field(default_factory=dict)
    dtype: torch.dtype = torch.float64
    check: GramCheck | None = None

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

    @cached_property
    def checked(self) -> bool:
        """Whether ``check`` was formed from this Gram (``GramCheck.fits_gram``); a check of
        another Gram is not used, and the log says so."""
        if self.check is None:
            return False
        if self.check.fits_gram(self.gram):
            return True
        log.warning("the Gram check was formed from another Gram (stale?): App. B's check is run again")
        return False

    @property
    def _check_stands_in(self) -> bool:
        """The check replaces the metric for what it holds: it fits, the Gram is PSD (the metric
        is the normalised Gram itself) and the metric has not been formed anyway."""
        fits = self.checked and self.check is not None and not self.check.psd["indefinite"]
        return fits and "metric" not in vars(self)

    @cached_property
    def metric(self) -> Metric:
        """The float64 metric (normalised, PSD-checked Gram), formed once per problem; App. B's
        verdict comes from ``check`` when it was formed from this Gram."""
        fallbacks: list[str] = []
        g64 = self.gram.to(self.device, torch.float64, copy=True)  # normalised in place below
        scale = gram_scale(g64)
        G = normalize_gram_(g64)
        chk = self.check if self.checked else None
        if chk is not None and not chk.psd["indefinite"]:
            psd = dict(chk.psd)
        elif chk is not None:  # indefinite: its eigenvalues decide, no Cholesky
            G, psd = gram_psd(G, fallbacks, min_eig=chk.psd.get("min_eig"), max_eig=chk.psd.get("max_eig"))
        else:
            G, psd = gram_psd(G, fallbacks)
        return Metric(G=G, psd=psd, fallbacks=fallbacks, scale=scale)

    @property
    def psd(self) -> dict[str, Any]:
        """App. B's outcome for the Gram (``Metric.psd``), without forming the metric when the
        check stands in for it."""
        return dict(self.check.psd) if self._check_stands_in and self.check is not None else self.metric.psd

    @property
    def scale(self) -> float:
        """``Metric.scale`` (the Gram is ``scale * G``), from the check when it stands in."""
        return self.check.scale if self._check_stands_in and self.check is not None else self.metric.scale

    @property
    def fallbacks(self) -> list[str]:
        """``Metric.fallbacks``: none when the metric was not formed (a PSD Gram needs no eigh)."""
        return self.metric.fallbacks if "metric" in vars(self) else []

    def metric_block(self, idx: torch.Tensor) -> torch.Tensor:
        """``metric.G[idx][:, idx]`` (len(idx), len(idx)); when the check stands in for the
        metric, formed from the Gram's block alone with the bits of the whole metric's
        (``normalize_gram_`` entry by entry: ``(g_ij + g_ji) * 0.5 / scale``)."""
        if self._check_stands_in and self.check is not None:
            B = self.gram[idx[:, None], idx].to(torch.float64)
            return torch.add(B, B.mT).mul_(0.5).div_(self.check.scale)
        return self.metric.G[idx[:, None], idx]

    @cached_property
    def energy(self) -> float:
        """``c = tr(W0 G W0^T)`` on the metric (``errors.output_energy``), from ``check`` when it
        was formed from this Gram and this weight."""
        from .errors import output_energy

        if self.checked and self.check is not None and self.check.energy is not None:
            if self.check.fits_weight(self.W0):
                return self.check.energy
            log.warning("the Gram check was formed from another weight (stale?): the output energy is formed again")
        return output_energy(self.W0, self.metric.G)

    def mean_gram(self) -> torch.Tensor:
        """``E[x x^T]`` in float64 (the Gram over ``n_tokens``, symmetrised), with the metric's PSD
        projection when the Gram was indefinite."""
        from .gram import psd_project, symmetrize_

        if self.n_tokens is None:
            raise ValueError("the mean Gram needs n_tokens")
        gm = symmetrize_(self.gram.to(self.device, torch.float64) / float(self.n_tokens))
        return psd_project(gm)[0] if self.psd.get("indefinite") else gm


def check_module(W0: torch.Tensor, gram: torch.Tensor) -> GramCheck:
    """The calibration's check of one module (``coec.compensate.gram_check``): W0 (d_out, d_in)
    its weight, gram (d_in, d_in) its input's Gram (``sum_t x_t x_t^T`` or its mean), both on the
    device the compensation jobs use. Runs ``Problem.metric`` (normalise, App. B) and
    ``errors.output_energy`` on them, the code a compensation job runs without a check."""
    from .errors import output_energy

    problem = Problem(W0=W0, gram=gram, mean=None, keep=torch.empty(0, dtype=torch.long, device=W0.device))
    metric = problem.metric
    c = output_energy(W0, metric.G)
    return GramCheck(
        scale=metric.scale,
        gram_norm=frobenius(gram),
        weight_norm=frobenius(W0),
        psd=dict(metric.psd),
        energy=c if math.isfinite(c) else None,
    )


@dataclass
class Compensation:
    """Result of a method: weight (d_out, k) and bias (d_out,) or None; info: JSON-serialisable
    diagnostics (``compensate`` adds the errors and timings every method reports)."""

    weight: torch.Tensor
    bias: torch.Tensor | None = None
    info: dict[str, Any] = field(default_factory=dict)


def _float64_on_cpu(device: torch.device) -> torch.dtype:
    return torch.float64 if device.type == "cpu" else torch.float32


@dataclass(frozen=True)
class Method:
    """A registered compensation method.

    name: the ``method:`` of a config entry; options: its frozen options dataclass (a subclass of
    :class:`CommonOptions`); solve: ``(Problem, options) -> Compensation`` with weight and bias in
    any float dtype on the problem's device; doc: one line for the options page.
    inputs: data beyond the Grams (``coec.compensate.inputs``: another cell's weights, another
    calibration set's Grams, the pruned value projection), each becoming a workflow input of the
    compensate rule and an entry of ``Problem.inputs``.
    needs_mean / needs_n_tokens: the problem must carry channel means / a token count.
    reports_errors: the method fills ``relerr_before`` / ``relerr_after`` itself (in its own
    metric); otherwise ``compensate`` computes them on ``Problem.metric``.
    default_dtype: the solve dtype when ``compute_dtype`` is null, per device.
    check_options: cross-option rules a value check cannot express, per module (``None`` for a
    call outside a config): returns a problem ``(option, why)`` or None.
    check_data: checks of the problem's data against the options (raises ValueError).
    """

    name: str
    options: type[CommonOptions]
    solve: Callable[[Problem, Any], Compensation]
    doc: str
    inputs: tuple[MethodInput, ...] = ()
    needs_mean: bool = False
    needs_n_tokens: bool = False
    reports_errors: bool = False
    default_dtype: Callable[[torch.device], torch.dtype] = _float64_on_cpu
    check_options: Callable[[Any, str | None], tuple[str, str] | None] | None = None
    check_data: Callable[[Problem, Any], None] | None = None

    def dtype(self, options: CommonOptions, device: torch.device) -> torch.dtype:
        """The solve dtype: ``compute_dtype`` if set, else the method's default on ``device``."""
        cdt = options.compute_dtype
        if cdt is None:
            return self.default_dtype(device)
        return cdt if isinstance(cdt, torch.dtype) else getattr(torch, cdt)


#: Every compensation method, by name (built-ins: ``coec.compensate.methods``; plug-ins: config ``plugins``).
METHODS: Registry[Method] = Registry("compensation method")
