"""What a compensation method is, without torch: its options (a frozen dataclass deriving from
:class:`CommonOptions`), the :class:`Method` entry it registers and the :class:`Compensation` it
returns. The config validation and the workflow's planning read only these; the problem a
method solves (``coec.compensate.method.Problem``) and the solvers are torch code, imported
when a method runs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from coec.compensate.inputs import MethodInput
from coec.compensate.validators import float_dtype, opt

if TYPE_CHECKING:
    import torch

    from coec.compensate.problem import Problem


@dataclass(frozen=True)
class CommonOptions:
    """Options of every method."""

    compute_dtype: str | None = opt(
        None,
        "dtype of the solve (null: the method's default: float32 for coec; float64 on the CPU and "
        "float32 on CUDA for the others); the ridge solve, scale scalars and reported errors run in "
        "float64 regardless",
        float_dtype(),
        evidence="default: null, and each value is a default somewhere (float32: coec on every device "
        "and the others on CUDA; float64: the others on the CPU)",
    )


@dataclass
class Compensation:
    """Result of a method: weight (d_out, k) and bias (d_out,) or None; info: JSON-serialisable
    diagnostics (``compensate`` adds the errors and timings every method reports)."""

    weight: torch.Tensor
    bias: torch.Tensor | None = None
    info: dict[str, Any] = field(default_factory=dict)


def _float64_on_cpu(device: torch.device) -> torch.dtype:
    import torch  # deferred: keeps the job boundary torch-free

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
    needs_metric: the solve reads ``Problem.metric`` (formed up front by
    ``coec.compensate.method.prepare``; a method that does not read it leaves the expensive
    float64 metric unformed where it can).
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
    needs_metric: bool = True
    reports_errors: bool = False
    default_dtype: Callable[[torch.device], torch.dtype] = _float64_on_cpu
    check_options: Callable[[Any, str | None], tuple[str, str] | None] | None = None
    check_data: Callable[[Problem, Any], None] | None = None

    def dtype(self, options: CommonOptions, device: torch.device) -> torch.dtype:
        """The solve dtype: ``compute_dtype`` if set, else the method's default on ``device``."""
        import torch  # deferred: keeps the job boundary torch-free

        cdt = options.compute_dtype
        if cdt is None:
            return self.default_dtype(device)
        return cdt if isinstance(cdt, torch.dtype) else getattr(torch, cdt)
