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

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import torch

from ..registry import Registry
from .gram import gram_psd, gram_scale, normalize_gram_
from .inputs import MethodInput
from .validators import float_dtype, opt

__all__ = ["CommonOptions", "Problem", "Metric", "Compensation", "Method", "METHODS", "MODULES"]

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
    indefinite (``psd`` records the outcome), the solver fallbacks recorded on the way, and the
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
    dtype the method solves in (``Method.dtype``).
    """

    W0: torch.Tensor
    gram: torch.Tensor
    mean: torch.Tensor | None
    keep: torch.Tensor
    n_tokens: float | None = None
    inputs: Mapping[str, Any] = field(default_factory=dict)
    dtype: torch.dtype = torch.float64

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
    def metric(self) -> Metric:
        """The float64 metric (normalised, PSD-checked Gram), formed once per problem."""
        fallbacks: list[str] = []
        g64 = self.gram.to(self.device, torch.float64, copy=True)  # normalised in place below
        scale = gram_scale(g64)
        G, psd = gram_psd(normalize_gram_(g64), fallbacks)
        return Metric(G=G, psd=psd, fallbacks=fallbacks, scale=scale)

    def mean_gram(self) -> torch.Tensor:
        """``E[x x^T]`` in float64 (the Gram over ``n_tokens``, symmetrised), with the metric's PSD
        projection when the Gram was indefinite."""
        from .gram import psd_project, symmetrize_

        if self.n_tokens is None:
            raise ValueError("the mean Gram needs n_tokens")
        gm = symmetrize_(self.gram.to(self.device, torch.float64) / float(self.n_tokens))
        return psd_project(gm)[0] if self.metric.psd.get("indefinite") else gm


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
