"""What a COEC call (``algorithm1.coec``) sets up once from its options and data: what the options
mean on this device (``make_plan``), the settings of the right solves (``right_settings``), the
tempered and untempered metric's slices (``slices``, Algorithm 1 line 1), the info it starts from
(``setup_info``), the alignment data (``setup_alignment``) and the data of the right solves
(``right_problem``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

import torch

from ..profiling import span
from .alignment import Alignment, alignment_setup
from .descent import RightSolveSettings
from .errors import relerr
from .gram import gram_psd, normalize_gram, power_max_eig, temper_gram
from .method import CommonOptions
from .stiefel import Preconditioner, RightProblem, make_preconditioner

if TYPE_CHECKING:
    from .methods.coec import CoecOptions

__all__ = ["direction_matmul_used", "resolve_dtype", "Plan", "make_plan", "right_settings", "Slices", "slices",
           "setup_info", "setup_alignment", "right_problem"]


def direction_matmul_used(option: str, device: torch.device, dtype: torch.dtype) -> str:
    """What option ``direction_matmul`` does here: "tf32" only on CUDA with a float32 loop
    (TF32 is a CUDA tensor-core format); "float32" products everywhere else."""
    return "tf32" if option == "tf32" and device.type == "cuda" and dtype == torch.float32 else "float32"


def resolve_dtype(name: str | torch.dtype | None) -> torch.dtype:
    """A dtype option as a torch dtype (None: float32, COEC's default loop dtype)."""
    if name is None:
        return torch.float32
    if isinstance(name, torch.dtype):
        return name
    dtype = getattr(torch, str(name))
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"not a torch dtype: {name!r}")
    return dtype


@dataclass(frozen=True)
class Plan:
    """What the options mean on this device, resolved once per call: the device, the loop's and
    the tempering's dtypes, and the factorisations, direction precision and R Gxx update used."""

    device: torch.device
    dtype: torch.dtype
    temper_dtype: torch.dtype
    left_polar: str
    setup_svd: str
    direction_matmul: str
    rg_update: str


def make_plan(options: CoecOptions, device: torch.device, compute_dtype: str | torch.dtype | None) -> Plan:
    """The options' "auto" choices resolved on ``device`` (eigh factorisations and a carried R Gxx
    on CUDA; SVDs and products on the CPU) and the dtypes."""
    cdt = resolve_dtype(compute_dtype)
    auto = "eigh" if device.type == "cuda" else "svd"  # the "auto" factorisation of this device
    rg_update = ("carry" if device.type == "cuda" else "product") if options.rg_update == "auto" else options.rg_update
    return Plan(
        device=device, dtype=cdt, temper_dtype=resolve_dtype(options.temper_dtype),
        left_polar=auto if options.left_polar == "auto" else options.left_polar,
        setup_svd=auto if options.setup_svd == "auto" else options.setup_svd,
        direction_matmul=direction_matmul_used(options.direction_matmul, device, cdt), rg_update=rg_update,
    )


def right_settings(options: CoecOptions, plan: Plan) -> RightSolveSettings:
    """The right solve's settings (the same for every round)."""
    return RightSolveSettings(
        eta=float(options.eta), eta_scale=options.eta_scale, delta=float(options.delta),
        delta_norm=options.delta_norm, max_steps=int(options.max_inner_steps),
        max_backtracks=int(options.max_backtracks), method=options.right_solver,
        cayley_inverse=options.cayley_inverse, direction_matmul=plan.direction_matmul, rg_update=plan.rg_update,
        rg_refresh=int(options.rg_refresh),
    )


@dataclass(frozen=True)
class Slices:
    """The metric of one call: untempered (``Gxx0``, ``Gyx0``, ``c0``: the reported errors) and
    tempered (``Gxx_t``, ``Gyx_t``, ``c``) slices in the temper dtype; the loop's tempered slices
    ``Gxx``, ``Gyx`` in the compute dtype with ``lam_max`` >= lambda_max(Gxx); the tempering's
    clipped eigenvalues and the PSD check's outcome."""

    Gxx0: torch.Tensor
    Gyx0: torch.Tensor
    c0: float
    Gxx_t: torch.Tensor
    Gyx_t: torch.Tensor
    c: float
    Gxx: torch.Tensor
    Gyx: torch.Tensor
    lam_max: float
    n_negative: int
    psd: dict[str, Any]


def slices(W0: torch.Tensor, gram: torch.Tensor, keep: torch.Tensor, options: CoecOptions, plan: Plan,
           record: list[str]) -> Slices:
    """Line 1: temper the FULL (normalised) Gram, then slice. The slices are formed in the temper
    dtype (float64 by default), which also serves the reported errors; the loop runs in the
    compute dtype. App. B: the untempered metric of the reported errors is the PSD projection of
    an indefinite Gram (a PSD one, round-off included, is used as it is)."""
    dev, tdt = plan.device, plan.temper_dtype
    G0 = normalize_gram(gram.to(dev, tdt))
    with span("coec.setup.temper"):
        tg = temper_gram(G0, float(options.alpha), clip=bool(options.psd_clip), record=record)
    with span("coec.setup.psd"):
        G0, psd = gram_psd(G0, record, min_eig=tg.min_eig, max_eig=tg.max_eig)
    Gt, lam_t, n_negative = tg.G, tg.lambda_max, tg.n_negative
    del tg
    W0t = W0.to(dev, tdt)
    WG = W0t @ G0
    Gxx0, Gyx0, c0 = G0[keep][:, keep], WG[:, keep], float((WG * W0t).sum())  # untempered metric
    WG = W0t @ Gt
    Gxx_t, Gyx_t, c = Gt[keep][:, keep], WG[:, keep], float((WG * W0t).sum())  # tempered metric
    del G0, Gt, WG
    Gxx, Gyx = Gxx_t.to(plan.dtype), Gyx_t.to(plan.dtype)
    lam_max = lam_t if math.isfinite(lam_t) else power_max_eig(Gxx)
    return Slices(Gxx0=Gxx0, Gyx0=Gyx0, c0=c0, Gxx_t=Gxx_t, Gyx_t=Gyx_t, c=c, Gxx=Gxx, Gyx=Gyx,
                  lam_max=lam_max, n_negative=n_negative, psd=psd)


def setup_info(options: CoecOptions, plan: Plan, m: Slices, WK: torch.Tensor) -> dict[str, Any]:
    """The info of a call before its loop: the options (the method's own), what they resolved to,
    the metric's outcome and the errors of the pruned weight W_K."""
    common = {f.name for f in fields(CommonOptions)}
    return {
        "method": "coec",
        "compute_dtype": str(plan.dtype).replace("torch.", ""),
        "device": str(plan.device),
        "options": {f.name: getattr(options, f.name) for f in fields(options) if f.name not in common},
        "left_polar_used": plan.left_polar,
        "setup_svd_used": plan.setup_svd,
        "direction_matmul_used": plan.direction_matmul,
        "rg_update_used": plan.rg_update,
        "temper_negative_eigs": m.n_negative,
        "gram_psd": m.psd,
        "relerr_before": relerr(WK, m.Gxx0, m.Gyx0, m.c0),
        "relerr_tempered_before": relerr(WK, m.Gxx_t, m.Gyx_t, m.c),
    }


def setup_alignment(W0c: torch.Tensor, keep: torch.Tensor, value_proj: torch.Tensor | None,
                    options: CoecOptions, plan: Plan, record: list[str]) -> Alignment | None:
    """Alignment data (o_proj): anchor from the unpruned W0, U_v from the pruned value projection;
    None without a penalty and without value_proj."""
    if float(options.align_lambda) > 0 or value_proj is not None:
        vp = value_proj.to(plan.device, plan.dtype) if value_proj is not None else None
        with span("coec.setup.align"):
            return alignment_setup(W0c, keep, vp, int(options.anchor_rank), options.align, record,
                                   plan.setup_svd)
    return None


def right_problem(m: Slices, options: CoecOptions, align: Alignment | None) -> RightProblem:
    """The data of the right solves, with the preconditioner (built once: Gxx is fixed)."""
    pre = None
    if options.precondition != "none":  # right: stiefel and eta_scale: rayleigh (options.resolve)
        with span("coec.setup.precondition"):
            inv = make_preconditioner(m.Gxx, float(options.precondition_damping))
        pre = Preconditioner(inv, float(options.precondition_damping) if options.precondition == "newton" else None)
    return RightProblem(m.Gxx, m.Gyx, m.c, m.lam_max, align=align, align_lambda=float(options.align_lambda),
                        preconditioner=pre)
