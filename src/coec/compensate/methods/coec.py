"""coec: Calibrated Orthogonal-Equivalence Compensation, the paper's Algorithm 1 (Sec. 4, App. B);
the solver is ``coec.compensate.algorithm1``.

Longer notes on a few options:

* ``compute_dtype`` null means float32 also on the CPU, where it halves the time per round
  against float64 with the same objective history to ~1e-7.
* ``align_lambda``: the paper uses 50 on o_proj and 0 on down_proj; the caller knows the module,
  so the neutral 0 is the default and configs set 50 under ``o_proj:``.
* ``eta_scale``: "rayleigh" is the exact line search of the quadratic model at fixed s (of the
  paper's eta/s^2 form, unit-free); "raw" is the paper's literal 1/s^2, where eta carries units.
* ``setup_svd``: the thin SVD of W_K and the anchor's and U_v's top-r_p frames; "eigh" is the
  float64 eigh of the smaller Gram, refined, with an SVD fallback as for ``left_polar``.
* ``cayley_inverse``: "solve" gives the same retraction to round-off with fewer FLOPs.
* ``left_polar``: "eigh" is the float64 eigh of A^T A, Newton–Schulz-refined until orthonormal,
  with an SVD fallback (recorded in svd_fallbacks) when cond(A) > ~2e7; about 10x faster than the
  SVD on a GPU at 4096.
* ``rg_update``: "carry" carries R Gxx through a polar-retraction step as F (R Gxx - t g Gxx)
  from the step size's g Gxx, with no (r, k, k) product; equal in exact arithmetic.
  "auto" leaves CPU results unchanged (``info["rg_update_used"]``); ``rg_refresh`` bounds the
  carried round-off.
* ``delta_norm``: "rms" measures ||R_new - R||_F / sqrt(r) (one delta for every width); "fro" is
  unscaled and so tighter by sqrt(r) (~64x at 8B).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

from coec.compensate.inputs import ValueProjection
from coec.compensate.methods import METHODS
from coec.compensate.methods.base import CommonOptions, Compensation, Method
from coec.compensate.validators import boolean, choice, gcv_grid, number, opt

if TYPE_CHECKING:
    import torch

    from coec.compensate.algorithm1_setup import CoecSettings
    from coec.compensate.problem import Problem


@dataclass(frozen=True)
class CoecOptions(CommonOptions):
    """coec: Algorithm 1 (Sec. 4, App. B); defaults are the paper's where it gives one."""

    alpha: float = opt(
        0.9,
        "Gram tempering G^alpha (Sec. 4.4, App. B)",
        number(0.0, 1.0, lo_open=True),
        "paper",
        evidence="paper hyperparameter (Sec. 4.4, App. B: 0.9)",
    )
    rescale: str = opt(
        "gcv",
        "gcv: per-mode GCV rescale (Sec. 4.3) | global: s* only (RCPU / ablation)",
        choice("gcv", "global"),
        "paper",
        evidence="paper hyperparameter (Sec. 4.3); global is the paper's ablation and RCPU's rescale",
    )
    right: str = opt(
        "stiefel",
        "right rotation: stiefel = reduced St(r, k) (Sec. 4.2) | full = Q_r in O(k) (ablation) | none = left-only",
        choice("stiefel", "full", "none"),
        "paper",
        evidence="paper hyperparameter (Sec. 4.2); full and none are the paper's ablations",
    )
    align_lambda: float = opt(
        0.0,
        "lambda_a of the anchored alignment; the paper uses 50 on o_proj, 0 on down_proj (set it per module)",
        number(0.0),
        "paper",
        evidence="paper hyperparameter (Sec. 4.5: 50 on o_proj, set so by config.yaml)",
    )
    anchor_rank: int = opt(
        16,
        "r_p, rank of the alignment anchor (Sec. 4.5)",
        number(1, integer=True),
        "paper",
        evidence="paper hyperparameter (Sec. 4.5: r_p = 16)",
    )
    align: str = opt(
        "projector",
        "projector: the paper's penalty | angle: mean sin^2 of the principal angles "
        "to the anchor (App. C's measure; needs no value_proj)",
        choice("projector", "angle"),
        "paper",
        evidence="paper hyperparameter (Sec. 4.5's projector penalty; angle is App. C's measure)",
    )
    max_rounds: int = opt(
        50,
        "cap on alternation rounds (App. B)",
        number(0, integer=True),
        "paper",
        evidence="paper hyperparameter (App. B: 50; the embedded config uses 20)",
    )
    tol: float = opt(
        1e-4,
        "early stop on the change of the objective (App. B)",
        number(0.0),
        "paper",
        evidence="paper hyperparameter (App. B)",
    )
    tol_mode: str = opt(
        "relative",
        "relative (App. B's reading) | absolute (Alg. 1's reading) change of the objective",
        choice("relative", "absolute"),
        "paper",
        evidence="paper hyperparameter (App. B reads the tolerance as relative, Alg. 1 as absolute: docs/design.md)",
    )
    delta: float = opt(
        7e-4,
        "right-solve stop: change of R below delta (App. B)",
        number(0.0, lo_open=True),
        "paper",
        evidence="paper hyperparameter (App. B)",
    )
    delta_norm: str = opt(
        "rms",
        "how the change of R is measured: rms = ||dR||_F / sqrt(r) | fro = ||dR||_F",
        choice("rms", "fro"),
        "paper",
        evidence="paper hyperparameter (App. B); fro, the unscaled reading, reaches a lower calibration error "
        "(o_proj 0.0574 vs 0.0631: benchmarks/results/delta_norm_real_cpu.txt)",
    )
    kappa: float | None = opt(
        10.0,
        "per-mode dose band around s* sigma_i; null disables (App. B)",
        number(1.0, allow_none=True),
        "paper",
        evidence="paper hyperparameter (App. B)",
    )
    eta: float = opt(
        1.0,
        "right-solve step multiplier (the paper gives none); backtracking halves it",
        number(0.0, lo_open=True),
        evidence="default: the step multiplier of every right solve (the paper gives none)",
    )
    eta_scale: str = opt(
        "rayleigh",
        "step unit: rayleigh = exact line search of the quadratic model | raw = 1/s^2 (eta carries units)",
        choice("rayleigh", "raw"),
        evidence="default rayleigh; raw, the paper's literal step, reaches the lowest error of the right-solve"
        " study (literal-fro o_proj 0.0864: benchmarks/results/right_solver_precondition_cpu.txt, "
        "docs/benchmarks.md)",
    )
    right_solver: str = opt(
        "gd",
        "reduced-Stiefel right solve: gd = Riemannian gradient steps (Alg. 1) | cg = "
        "Polak-Ribiere+ conjugate directions (beyond the paper)",
        choice("gd", "cg"),
        evidence="cg: lower error in less time than gd (o_proj 0.0895 vs 0.0916, 29 vs 47 s: "
        "benchmarks/results/right_solver_real_cpu.txt); config.yaml's coec-pcg uses it",
    )
    precondition: str = opt(
        "none",
        "right-solve metric: none = Riemannian gradient (Alg. 1) | gram = directions "
        "(Xi (Gxx + mu I)^-1) projected | newton = also rows / (S^2 + mu max S^2), the "
        "Newton direction at fixed scale (beyond the paper)",
        choice("none", "gram", "newton"),
        evidence="gram: lowest o_proj error (0.0863), newton: lowest down_proj error (0.0579) "
        "(benchmarks/results/right_solver_precondition_cpu.txt); config.yaml's coec-pcg uses gram",
    )
    precondition_damping: float = opt(
        3.0,
        "mu of precondition, relative to mean(diag Gxx) (and to max S^2 for newton's rows)",
        number(0.0, lo_open=True),
        evidence="the damping of the winning preconditioners (gram 3, newton 1: "
        "benchmarks/results/right_solver_precondition_cpu.txt); config.yaml's coec-pcg sets 3",
    )
    max_inner_steps: int = opt(
        100,
        "cap on accepted right-solve steps per round",
        number(1, integer=True),
        evidence="default cap (reached by 0.25 % of the embedded model's right solves: docs/design.md); "
        "config.yaml's coec-pcg sets 2 (benchmarks/results/right_solver_real_cpu.txt)",
    )
    max_backtracks: int = opt(
        30,
        "halvings of eta before a right solve gives up",
        number(0, integer=True),
        evidence="default: the backtracking safeguard of every right solve (App. B's monotone descent)",
    )
    gcv_grid: tuple[float, float, int] = opt(
        (1e-4, 1e5, 120),
        "GCV lambda grid (lo, hi, n), log-spaced, times median(e_i) (App. B)",
        gcv_grid(),
        "paper",
        evidence="paper hyperparameter (App. B)",
    )
    psd_clip: bool = opt(
        True,
        "clip negative eigenvalues of G before the power, also at alpha = 1 "
        "(App. B; else the objective can be unbounded below)",
        boolean(),
        "paper",
        evidence="paper hyperparameter (App. B)",
    )
    left_polar: str = opt(
        "auto",
        "polar factor of the left rotation: svd (paper's U V^T) | eigh | auto = eigh on CUDA, svd on CPU",
        choice("auto", "svd", "eigh"),
        evidence="default auto, so svd (CPU) and eigh (CUDA) are both defaults; eigh is ~10x faster than the "
        "SVD on the H200 at 4096 (docs/benchmarks.md, the 8B layer table)",
    )
    setup_svd: str = opt(
        "auto",
        "one-off factorisations (thin SVD of W_K, anchor frames): svd | eigh | auto = eigh on CUDA, svd on CPU",
        choice("auto", "svd", "eigh"),
        evidence="default auto, so svd (CPU) and eigh (CUDA) are both defaults; eigh: 0.11 s against 1.1 s on "
        "the H200 at 4096 (docs/benchmarks.md), 4.73 -> 4.39 s on the CPU "
        "(benchmarks/results/setup_svd_cpu.txt)",
    )
    cayley_inverse: str = opt(
        "newton_schulz",
        "inverse inside the Cayley retraction (square right solves): newton_schulz (App. B) | solve (one LU solve)",
        choice("newton_schulz", "solve"),
        evidence="default newton_schulz (App. B); solve saves 20 % of an o_proj round at width 2048 (4.06 -> "
        "3.25 s: benchmarks/results/cayley_inverse_cpu.txt)",
    )
    rg_update: str = opt(
        "auto",
        "each trial's R Gxx: product | carry (no (r, k, k) product) | auto = carry on CUDA, product on CPU",
        choice("auto", "product", "carry"),
        evidence="default auto, so product (CPU) and carry (CUDA) are both defaults; carry takes 0.77x the "
        "time of the product on the embedded down_proj (benchmarks/results/rg_update_cpu.txt)",
    )
    rg_refresh: int = opt(
        4,
        "with carry: form R Gxx by a product after this many carried updates (0 = never)",
        number(0, integer=True),
        evidence="default 4 brings the carried q error back to a fresh product's (9.0e-9 vs 1.2e-7 without: "
        "benchmarks/results/rg_update_cpu.txt)",
    )


def check_options(o: CoecOptions, module: str | None) -> tuple[str, str] | None:
    """(option, why) where the options cannot work together (on ``module``), else None: the
    preconditioned direction needs the reduced-Stiefel solve and its line search; the
    projector penalty needs the pruned v_proj, which only o_proj has."""
    if o.precondition != "none" and (o.right != "stiefel" or o.eta_scale != "rayleigh"):
        return "precondition", (
            f"{o.precondition!r} needs right: stiefel and eta_scale: rayleigh "
            f"(got right: {o.right}, eta_scale: {o.eta_scale})"
        )
    if module is not None and module != "o_proj" and o.align_lambda > 0 and o.align == "projector":
        return "align_lambda", (
            "align_lambda > 0 with align 'projector' needs the pruned v_proj, which only "
            "o_proj has; set it under o_proj: (or use align: angle)"
        )
    return None


def check_data(problem: Problem, o: CoecOptions) -> None:
    """The value projection against the options and the problem's shapes (raises ValueError)."""
    from coec.compensate.problem_checks import check_tensor  # deferred: keeps the job boundary torch-free

    vp = problem.inputs.get("value_proj")
    r = min(problem.d_out, problem.k)
    if vp is not None:
        check_tensor("value_proj", vp, 2)
        if vp.shape[0] != problem.k:
            raise ValueError(
                f"value_proj must have k = len(keep) = {problem.k} rows (query-head layout), "
                f"got shape {tuple(vp.shape)}"
            )
    if o.align_lambda > 0 and o.align == "projector" and vp is None:
        raise ValueError("align_lambda > 0 with align='projector' requires value_proj (k x d_model pruned v_proj)")
    if o.align_lambda > 0 or vp is not None:
        avail = min(r, vp.shape[1] if vp is not None else r)
        if o.anchor_rank > avail:
            raise ValueError(f"option anchor_rank={o.anchor_rank} exceeds the available rank {avail}")


def solver_settings(o: CoecOptions) -> CoecSettings:
    """What Algorithm 1 takes from the options, grouped by step (once per call); every field
    keeps its option's name."""
    # deferred: keeps the job boundary torch-free
    from coec.compensate.algorithm1_setup import CoecSettings, RescaleSettings, RoundSettings, TemperSettings
    from coec.compensate.alignment import AlignmentSettings
    from coec.compensate.descent import RightSolveSettings

    common = {f.name for f in fields(CommonOptions)}
    return CoecSettings(
        temper=TemperSettings(alpha=float(o.alpha), psd_clip=bool(o.psd_clip)),
        alignment=AlignmentSettings(align_lambda=float(o.align_lambda), anchor_rank=int(o.anchor_rank), align=o.align),
        rescaling=RescaleSettings(rescale=o.rescale, gcv_grid=o.gcv_grid, kappa=o.kappa),
        rounds=RoundSettings(max_rounds=int(o.max_rounds), tol=float(o.tol), tol_mode=o.tol_mode),
        right=o.right,
        right_solve=RightSolveSettings(
            eta=float(o.eta),
            eta_scale=o.eta_scale,
            delta=float(o.delta),
            delta_norm=o.delta_norm,
            max_inner_steps=int(o.max_inner_steps),
            max_backtracks=int(o.max_backtracks),
            right_solver=o.right_solver,
            cayley_inverse=o.cayley_inverse,
            rg_update=o.rg_update,
            rg_refresh=int(o.rg_refresh),
        ),
        precondition=o.precondition,
        precondition_damping=float(o.precondition_damping),
        left_polar=o.left_polar,
        setup_svd=o.setup_svd,
        reported={f.name: getattr(o, f.name) for f in fields(o) if f.name not in common},
    )


def solve(problem: Problem, options: CoecOptions) -> Compensation:
    from coec.compensate.algorithm1 import coec  # deferred: keeps the job boundary torch-free

    return coec(problem, solver_settings(options))


def float32(device: torch.device) -> torch.dtype:
    """coec's solve dtype when ``compute_dtype`` is null: float32 on every device."""
    import torch  # deferred: keeps the job boundary torch-free

    return torch.float32


METHOD = METHODS.register(
    Method(
        name="coec",
        options=CoecOptions,
        solve=solve,
        doc=CoecOptions.__doc__ or "",
        inputs=(ValueProjection("value_proj", needed=lambda o: o.align_lambda > 0),),
        reports_errors=True,
        needs_metric=False,
        default_dtype=float32,
        check_options=check_options,
        check_data=check_data,
    )
)
