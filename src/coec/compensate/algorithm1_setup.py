"""What a COEC call (``algorithm1.coec``) takes and sets up once: its settings (``CoecSettings``,
derived from the options of method coec once per call by ``methods.coec.solver_settings``), what
they mean on this device (``make_plan``), the tempered and untempered metric's slices
(``slices``, Algorithm 1 line 1), the info it starts from (``setup_info``), the alignment data
(``setup_alignment``) and the data of the right solves (``right_problem``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import torch

from coec.compensate.alignment import Alignment, AlignmentSettings, alignment_setup
from coec.compensate.descent import RightSolveSettings
from coec.compensate.errors import relerr
from coec.compensate.gram import gram_psd, normalize_gram_, power_max_eig, temper_gram
from coec.compensate.linalg import eigh_overwrites
from coec.compensate.profiling import span
from coec.compensate.stiefel import Preconditioner, RightProblem, make_preconditioner


@dataclass(frozen=True)
class TemperSettings:
    """The metric's tempering (Sec. 4.4): ``G^alpha``, negative eigenvalues clipped first with
    ``psd_clip``; in float64, which also serves the reported errors."""

    alpha: float
    psd_clip: bool


@dataclass(frozen=True)
class RescaleSettings:
    """The rescale (Sec. 4.3): ``rescale`` "gcv" | "global", the GCV lambda grid ``gcv_grid``
    (lo, hi, n) and the per-mode dose band ``kappa`` (None: off)."""

    rescale: str
    gcv_grid: tuple[float, float, int]
    kappa: float | None


@dataclass(frozen=True)
class RoundSettings:
    """The round loop's stop: ``max_rounds``, and a change of the objective below ``tol``
    (``tol_mode`` "relative" | "absolute")."""

    max_rounds: int
    tol: float
    tol_mode: str


@dataclass(frozen=True)
class CoecSettings:
    """What Algorithm 1 takes from the options of method coec, grouped by step, each field named
    as its option: the tempering, the alignment, the rescale, the rounds; the right rotation
    (``right``: "stiefel" | "full" | "none"), its solves' settings (``right_solve``, whose
    ``rg_update`` is the option's value until ``make_plan`` resolves it on the device) and preconditioner
    (``precondition`` "none" | "gram" | "newton", ``precondition_damping``); the factorisations
    (``left_polar``, ``setup_svd``: "auto" resolved by ``make_plan``); and ``reported``, the
    options as ``info["options"]`` reports them."""

    temper: TemperSettings
    alignment: AlignmentSettings
    rescaling: RescaleSettings
    rounds: RoundSettings
    right: str
    right_solve: RightSolveSettings
    precondition: str
    precondition_damping: float
    left_polar: str
    setup_svd: str
    reported: dict[str, Any]


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
    """What the settings mean on this device, resolved once per call: the device, the loop's
    dtype, the factorisations used and the right solves' settings with the R Gxx update used."""

    device: torch.device
    dtype: torch.dtype
    left_polar: str
    setup_svd: str
    right_solve: RightSolveSettings


def make_plan(settings: CoecSettings, device: torch.device, compute_dtype: str | torch.dtype | None) -> Plan:
    """The settings' "auto" choices resolved on ``device`` (eigh factorisations and a carried R Gxx
    on CUDA; SVDs and products on the CPU) and the loop's dtype."""
    cdt = resolve_dtype(compute_dtype)
    auto = "eigh" if device.type == "cuda" else "svd"  # the "auto" factorisation of this device
    rs = settings.right_solve
    rg_update = ("carry" if device.type == "cuda" else "product") if rs.rg_update == "auto" else rs.rg_update
    return Plan(
        device=device,
        dtype=cdt,
        left_polar=auto if settings.left_polar == "auto" else settings.left_polar,
        setup_svd=auto if settings.setup_svd == "auto" else settings.setup_svd,
        right_solve=replace(rs, rg_update=rg_update),
    )


@dataclass(frozen=True)
class Slices:
    """The metric of one call: untempered (``Gxx0``, ``Gyx0``, ``c0``: the reported errors) and
    tempered (``Gxx_t``, ``Gyx_t``, ``c``) slices in float64; the loop's tempered slices ``Gxx``,
    ``Gyx`` in the compute dtype with ``lam_max`` >= lambda_max(Gxx); the tempering's clipped
    eigenvalues and the PSD check's outcome."""

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


def slices(
    W0: torch.Tensor, gram: torch.Tensor, keep: torch.Tensor, temper: TemperSettings, plan: Plan, record: list[str]
) -> Slices:
    """Line 1: temper the FULL (normalised) Gram, then slice. The slices are formed in float64,
    which also serves the reported errors; the loop runs in the compute dtype. App. B: the
    untempered metric of the reported errors is the PSD projection of an indefinite Gram (a PSD
    one, round-off included, is used as it is)."""
    dev, tdt = plan.device, torch.float64
    G0 = normalize_gram_(gram.to(dev, tdt, copy=True))
    # On the CPU in float64 a decomposition overwrites G0 (no (d, d) copy beside LAPACK's
    # workspace), and the metric is formed again after it: the same bits, one copy less.
    overwrite = eigh_overwrites(G0)
    with span("coec.setup.temper"):
        tg = temper_gram(G0, temper.alpha, clip=temper.psd_clip, record=record, overwrite=overwrite)
    if overwrite and tg.G is not G0:  # decomposed (G0 itself is returned when nothing is to temper)
        del G0
        G0 = normalize_gram_(gram.to(dev, tdt, copy=True))
    with span("coec.setup.psd"):
        G0, psd = gram_psd(G0, record, min_eig=tg.min_eig, max_eig=tg.max_eig)
    Gt, lam_t, n_negative = tg.G, tg.lambda_max, tg.n_negative
    del tg
    W0t = W0.to(dev, tdt)
    WG = W0t @ G0
    Gxx0, Gyx0, c0 = G0[keep[:, None], keep], WG[:, keep], float((WG * W0t).sum())  # untempered metric
    del G0, WG
    WG = W0t @ Gt
    Gxx_t, Gyx_t, c = Gt[keep[:, None], keep], WG[:, keep], float((WG * W0t).sum())  # tempered metric
    del Gt, WG
    Gxx, Gyx = Gxx_t.to(plan.dtype), Gyx_t.to(plan.dtype)
    lam_max = lam_t if math.isfinite(lam_t) else power_max_eig(Gxx)
    return Slices(
        Gxx0=Gxx0,
        Gyx0=Gyx0,
        c0=c0,
        Gxx_t=Gxx_t,
        Gyx_t=Gyx_t,
        c=c,
        Gxx=Gxx,
        Gyx=Gyx,
        lam_max=lam_max,
        n_negative=n_negative,
        psd=psd,
    )


def setup_info(settings: CoecSettings, plan: Plan, m: Slices, WK: torch.Tensor) -> dict[str, Any]:
    """The info of a call before its loop: the options (the method's own), what they resolved to,
    the metric's outcome and the errors of the pruned weight W_K."""
    return {
        "method": "coec",
        "compute_dtype": str(plan.dtype).replace("torch.", ""),
        "device": str(plan.device),
        "options": settings.reported,
        "left_polar_used": plan.left_polar,
        "setup_svd_used": plan.setup_svd,
        "rg_update_used": plan.right_solve.rg_update,
        "temper_negative_eigs": m.n_negative,
        "gram_psd": m.psd,
        "relerr_before": relerr(WK, m.Gxx0, m.Gyx0, m.c0),
        "relerr_tempered_before": relerr(WK, m.Gxx_t, m.Gyx_t, m.c),
    }


def setup_alignment(
    W0c: torch.Tensor,
    keep: torch.Tensor,
    value_proj: torch.Tensor | None,
    alignment: AlignmentSettings,
    plan: Plan,
    record: list[str],
) -> Alignment | None:
    """Alignment data (o_proj): anchor from the unpruned W0, U_v from the pruned value projection;
    None without a penalty and without value_proj."""
    if alignment.align_lambda > 0 or value_proj is not None:
        vp = value_proj.to(plan.device, plan.dtype) if value_proj is not None else None
        with span("coec.setup.align"):
            return alignment_setup(W0c, keep, vp, alignment, record, plan.setup_svd)
    return None


def right_problem(m: Slices, settings: CoecSettings, align: Alignment | None) -> RightProblem:
    """The data of the right solves, with the preconditioner (built once: Gxx is fixed); ``align``
    the alignment of the objective (None without a penalty)."""
    pre = None
    if settings.precondition != "none":  # right: stiefel and eta_scale: rayleigh (options.resolve)
        damping = settings.precondition_damping
        with span("coec.setup.precondition"):
            inv = make_preconditioner(m.Gxx, damping)
        pre = Preconditioner(inv, damping if settings.precondition == "newton" else None)
    return RightProblem(
        m.Gxx, m.Gyx, m.c, m.lam_max, align=align, align_lambda=settings.alignment.align_lambda, preconditioner=pre
    )
