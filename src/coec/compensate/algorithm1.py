"""COEC compensation of one pruned module (paper Algorithm 1, Sec. 4, App. B).

The weight is carried as its SVD ``W = U diag(S) Vt`` (r = min(d_out, k) modes, S >= 0 descending)
so that no block of a round needs a fresh SVD of W:

* left rotation (Sec. 4.1): ``Q_l = polar(Gyx W^T)``; only ``Q_l U = polar(Gyx Vt^T S)`` matters
  (any completion of a rank-deficient polar factor acts the same on W), a thin (d_out, r) polar
  (SVD; float64 eigh of the r x r Gram on CUDA; or scaled Newton: option left_polar), and the new factors
  are ``(Q_l U, S, Vt)``;
* right rotation (Sec. 4.2): ``W Q_r = U S R``, new factors ``(U, s S, R)``;
* rescale (Sec. 4.3): new singular values for fixed frames (re-sorted).

Mode statistics are cached: ``e_i = v_i^T Gxx v_i`` changes only with Vt and ``Gyx Vt^T`` too, so
``rho_i = u_i^T Gyx v_i`` is a column dot product. The objective (eq. 1) is the relative error in
the tempered metric plus ``lambda_a A(R)`` with R the top right singular rows of W.

Monotonicity. The right solve backtracks; the left rotation is the conditional minimiser (kept
only if round-off did not make it worse); the rescale never raises the error, and falls back to
the global scale if a re-ordering of modes would raise the alignment term. A round that still
raised the objective (round-off) is undone and ends the loop ("non_monotone_guard").

Stopping (App. B / Alg. 1): ``max_rounds`` or a change of the objective below ``tol``, relative
(default) or absolute. With the paper's delta, a right solve takes one or two steps after the
first rounds, so in practice the loop is an early-stopped descent that runs to ``max_rounds``;
``info["seconds_per_round"]`` gives the cost of raising or lowering the cap.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, fields

import torch

from ..profiling import span, traced
from ..progress import bar as progress_bar
from . import gcv as _gcv
from .method import CommonOptions
from .linalg import gram_psd, normalize_gram, polar, polar_eigh, polar_newton, power_max_eig, relerr, svd, svd_eigh, temper_gram
from .stiefel import Alignment, alignment_setup, alignment_value, make_preconditioner, solve_full, solve_reduced

__all__ = ["coec"]


def direction_matmul_used(option: str, device: torch.device, dtype: torch.dtype) -> str:
    """What option ``direction_matmul`` does here: "tf32" only on CUDA with a float32 loop
    (TF32 is a CUDA tensor-core format); "float32" products everywhere else."""
    return "tf32" if option == "tf32" and device.type == "cuda" and dtype == torch.float32 else "float32"


@dataclass
class _State:
    """Factored weight ``U diag(S) Vt`` with caches ``GyxV = Gyx Vt^T`` (d_out, r),
    ``RG = Vt Gxx`` (r, k) and ``e = diag(Vt Gxx Vt^T)`` (r,)."""

    U: torch.Tensor
    S: torch.Tensor
    Vt: torch.Tensor
    GyxV: torch.Tensor
    RG: torch.Tensor
    e: torch.Tensor

    def weight(self) -> torch.Tensor:
        return (self.U * self.S) @ self.Vt

    def rho(self) -> torch.Tensor:
        return (self.U * self.GyxV).sum(0)


@traced("coec.frames")
def _frames(U, S, Vt, Gxx, Gyx, RG=None) -> _State:
    RG = Vt @ Gxx if RG is None else RG
    return _State(U=U, S=S, Vt=Vt, GyxV=Gyx @ Vt.mT, RG=RG, e=(Vt * RG).sum(1))


def _apply_sigma(st: _State, sig: torch.Tensor) -> _State:
    """Set signed singular values ``sig`` (float64), move signs into U and re-sort descending."""
    sig = sig.to(st.S.dtype)
    sign = torch.where(sig < 0, -torch.ones_like(sig), torch.ones_like(sig))
    S = sig.abs()
    perm = torch.argsort(S, descending=True, stable=True)
    if bool((perm[1:] > perm[:-1]).all()):  # already sorted: no copies
        return _State(U=st.U * sign, S=S, Vt=st.Vt, GyxV=st.GyxV, RG=st.RG, e=st.e)
    return _State(
        U=(st.U * sign)[:, perm], S=S[perm], Vt=st.Vt[perm], GyxV=st.GyxV[:, perm], RG=st.RG[perm], e=st.e[perm]
    )


class _Run:
    """Mutable bookkeeping of one COEC call (becomes ``Compensation.info``)."""

    def __init__(self):
        self.svd_fallbacks: list = []
        self.gcv_lambdas: list = []
        self.gcv_lambdas_rel: list = []
        self.grid_end = {"low": 0, "high": 0}
        self.scale_skipped = 0
        self.kappa_clamped = 0
        self.rescales = 0
        self.rescale_fallbacks = 0
        self.left_rejects = 0


@traced("coec.rescale")
def _rescale(st: _State, o: dict, run: _Run, objective) -> _State:
    """Alg. 1 "GCV-rescale" of the current factors.

    The rescale never increases the error (gcv.rescale), but it can re-order the modes, and the
    alignment term depends on which rows are the top r_p. If the objective rises, the global
    rescale (order-preserving, error non-increasing) is used instead, and if even that rises
    (round-off), the weight is left as is; both are counted in ``rescale_fallbacks``.
    """
    rho = st.rho()
    sig, info = _gcv.rescale(st.S, rho, st.e, mode=o["rescale"], grid=tuple(o["gcv_grid"]), kappa=o["kappa"])
    run.rescales += 1
    if not info["scale_ok"]:
        run.scale_skipped += 1
    if o["rescale"] == "gcv" and info.get("lam") is not None:
        run.gcv_lambdas.append(info["lam"])
        run.gcv_lambdas_rel.append(info["lam_rel"])
        if info["grid_end"]:
            run.grid_end[info["grid_end"]] += 1
        run.kappa_clamped += info["n_clamped"]
    new = _apply_sigma(st, sig)
    L0 = objective(st)
    if objective(new) <= L0:
        return new
    run.rescale_fallbacks += 1
    if o["rescale"] == "gcv":
        sig, _ = _gcv.rescale(st.S, rho, st.e, mode="global")
        new = _apply_sigma(st, sig)
        if objective(new) <= L0:
            return new
    return st


@traced("coec.left")
def _left(st: _State, run: _Run, method: str = "svd") -> _State:
    """Left rotation (Sec. 4.1): ``Q_l U = polar(Gyx Vt^T diag(S))``."""
    A = st.GyxV * st.S
    U = {"eigh": polar_eigh, "newton": polar_newton}.get(method, polar)(A, run.svd_fallbacks)
    return _State(U=U, S=st.S, Vt=st.Vt, GyxV=st.GyxV, RG=st.RG, e=st.e)


def _error(st: _State, c: float) -> float:
    S, rho, e = st.S.to(torch.float64), st.rho().to(torch.float64), st.e.to(torch.float64)
    return (float((S * S * e).sum()) - 2.0 * float((S * rho).sum()) + c) / c


def _align(st: _State, al: Alignment | None, kind: str | None = None) -> float:
    if al is None:
        return 0.0
    return alignment_value(st.Vt[: al.rank], al, kind, grad=False)[0]


def _resolve_dtype(name, device: torch.device) -> torch.dtype:
    if name is None:
        return torch.float32
    return name if isinstance(name, torch.dtype) else getattr(torch, str(name))


def coec(W0: torch.Tensor, gram: torch.Tensor, keep: torch.Tensor, options, value_proj=None, device=None,
         compute_dtype=None):
    """Algorithm 1 for one module. W0 (d_out, d_in), gram (d_in, d_in), keep (k,) sorted;
    ``options`` the resolved ``CoecOptions`` (checked by the caller); value_proj (k, d_model) the
    pruned v_proj in query-head layout or None. Returns (weight (d_out, k) in the compute dtype,
    info dict).
    """
    t0 = time.perf_counter()
    common = {f.name for f in fields(CommonOptions)}
    o = {f.name: getattr(options, f.name) for f in fields(options) if f.name not in common}
    o["value_proj"] = value_proj
    dev = torch.device(device) if device is not None else W0.device
    cdt = _resolve_dtype(compute_dtype, dev)
    tdt = _resolve_dtype(o["temper_dtype"], dev)
    run = _Run()
    keep = keep.to(dev)
    lam_a = float(o["align_lambda"])
    auto = "eigh" if dev.type == "cuda" else "svd"  # the "auto" factorisation of this device
    left = auto if o["left_polar"] == "auto" else o["left_polar"]
    factor = auto if o["setup_svd"] == "auto" else o["setup_svd"]

    # Line 1: temper the FULL (normalised) Gram, then slice. The slices are formed in the temper
    # dtype (float64 by default), which also serves the reported errors; the loop runs in cdt.
    G0 = normalize_gram(gram.to(dev, tdt))
    with span("coec.setup.temper"):
        Gt, tinfo = temper_gram(G0, float(o["alpha"]), clip=bool(o["psd_clip"]), record=run.svd_fallbacks)
    # App. B: the untempered metric of the reported errors is the PSD projection of an indefinite
    # Gram (a PSD one, round-off included, is used as it is)
    with span("coec.setup.psd"):
        G0, psd = gram_psd(G0, run.svd_fallbacks, min_eig=tinfo["min_eig"], max_eig=tinfo.get("max_eig"))
    W0t = W0.to(dev, tdt)
    WG = W0t @ G0
    Gxx0, Gyx0, c0 = G0[keep][:, keep], WG[:, keep], float((WG * W0t).sum())  # untempered metric
    WG = W0t @ Gt
    Gxx_t, Gyx_t, c = Gt[keep][:, keep], WG[:, keep], float((WG * W0t).sum())  # tempered metric
    del G0, Gt, WG
    Gxx, Gyx = Gxx_t.to(cdt), Gyx_t.to(cdt)
    W0c = W0.to(dev, cdt)
    lam_max = tinfo["lambda_max"] if math.isfinite(tinfo["lambda_max"]) else power_max_eig(Gxx)

    WK = W0c[:, keep]
    info: dict = {
        "method": "coec",
        "compute_dtype": str(cdt).replace("torch.", ""),
        "device": str(dev),
        "options": {k: v for k, v in o.items() if k != "value_proj"},
        "left_polar_used": left,
        "setup_svd_used": factor,
        "direction_matmul_used": direction_matmul_used(o["direction_matmul"], dev, cdt),
        "rg_update_used": ("carry" if dev.type == "cuda" else "product") if o["rg_update"] == "auto" else o["rg_update"],
        "temper_negative_eigs": tinfo["n_negative"],
        "gram_psd": psd,
        "relerr_before": relerr(WK, Gxx0, Gyx0, c0),
        "relerr_tempered_before": relerr(WK, Gxx_t, Gyx_t, c),
    }

    # Alignment data (o_proj): anchor from the unpruned W0, U_v from the pruned value projection.
    al = None
    if lam_a > 0 or o["value_proj"] is not None:
        vp = o["value_proj"].to(dev, cdt) if o["value_proj"] is not None else None
        with span("coec.setup.align"):
            al = alignment_setup(W0c, keep, vp, int(o["anchor_rank"]), o["align"], run.svd_fallbacks, factor)
    al_obj = al if lam_a > 0 else None

    if c <= 0 or not math.isfinite(c):  # no output energy in this metric: nothing to fit
        info.update(_finish_info(run, [], [], 0, "zero_output_energy", t0))
        info["relerr_after"] = info["relerr_before"]
        info["relerr_tempered_after"] = info["relerr_tempered_before"]
        return WK.clone(), info

    # Line 2: W^ = W_K as factors.
    with span("coec.setup.svd"):
        U, S, Vt = (svd_eigh if factor == "eigh" else svd)(WK, run.svd_fallbacks)
    st = _frames(U, S, Vt, Gxx, Gyx)
    if al is not None:
        info["align_before"] = _align(st, al)
        if al.Uv is not None:
            info["align_projector_before"] = _align(st, al, "projector")
        info["align_angle_before"] = _align(st, al, "angle")
    info["objective_pruned"] = _error(st, c) + lam_a * _align(st, al_obj)

    def objective(s: _State) -> float:
        return _error(s, c) + lam_a * _align(s, al_obj)

    # Lines 3-4: left rotation, rescale.
    st = _rescale(_left(st, run, left), o, run, objective)
    history = [objective(st)]
    info["seconds_setup"] = time.perf_counter() - t0
    round_seconds: list = []
    steps_per_round: list = []
    right_stats = {"backtracks": 0, "capped": 0, "trials": 0, "orth_cleanups": 0, "carried": 0, "rg_refreshes": 0,
                   "stops": {}}
    if o["right_solver"] == "cg":
        right_stats["restarts"] = 0
    rg_age = 0  # carried updates that st.RG has been through since it was last formed by a product
    solver = {"stiefel": solve_reduced, "full": solve_full}.get(o["right"])
    pre = {}
    if o["precondition"] != "none":  # right: stiefel and eta_scale: rayleigh (options.resolve)
        with span("coec.setup.precondition"):
            pre["precond_inv"] = make_preconditioner(Gxx, float(o["precondition_damping"]))
        if o["precondition"] == "newton":
            pre["precond_rows"] = float(o["precondition_damping"])
        right_stats.setdefault("restarts", 0)
    stop = "max_rounds"
    L_prev = history[0]
    # an inner bar: drawn on a terminal (after 1 s), silent in a log (the module count is there)
    for _rnd in progress_bar(range(int(o["max_rounds"])), desc="coec rounds", unit="round",
                             leave=False, delay=1.0):
        t_round = time.perf_counter()
        prev = st
        # Lines 6-7: right rotation (scale recomputed inside), W^ <- s W^ Q_r, rescale.
        if solver is not None:
            with span("coec.right"):
                res = solver(
                    st.U, st.S, st.Vt, Gxx, Gyx, c, lam_max, eta=o["eta"], eta_scale=o["eta_scale"],
                    delta=o["delta"], max_steps=int(o["max_inner_steps"]), max_backtracks=int(o["max_backtracks"]),
                    align=al_obj, align_lambda=lam_a, RG0=st.RG, cayley_inverse=o["cayley_inverse"],
                    delta_norm=o["delta_norm"], direction_matmul=info["direction_matmul_used"],
                    rg_update=info["rg_update_used"], rg_refresh=int(o["rg_refresh"]), rg_age=rg_age,
                    **({"method": o["right_solver"]} if o["right"] == "stiefel" else {}), **pre,
                )
            rg_age = res.rg_age
            steps_per_round.append(res.steps)
            for key in right_stats.keys() - {"stops"}:
                right_stats[key] += getattr(res, key)
            right_stats["stops"][res.stop] = right_stats["stops"].get(res.stop, 0) + 1
            run.scale_skipped += res.scale_skipped
            s = res.s if res.scale_ok else 1.0
            nxt = _frames(st.U, st.S, res.R, Gxx, Gyx, res.RG)
            st = _apply_sigma(nxt, nxt.S.to(torch.float64) * s)
            st = _rescale(st, o, run, objective)
        else:
            steps_per_round.append(0)
        # Line 8: left rotation (the conditional minimiser; kept only if round-off did not make
        # it worse), rescale.
        cand = _left(st, run, left)
        if objective(cand) <= objective(st):
            st = cand
        else:
            run.left_rejects += 1
        st = _rescale(st, o, run, objective)
        L = objective(st)
        round_seconds.append(time.perf_counter() - t_round)
        if not math.isfinite(L) or L > L_prev:  # monotone guard: keep the previous iterate
            st = prev
            stop = "non_monotone_guard"
            break
        history.append(L)
        change = L_prev - L
        if o["tol_mode"] == "relative":
            change = change / max(abs(L_prev), 1e-300)
        L_prev = L
        if change < float(o["tol"]):
            stop = "tol"
            break

    W = st.weight()
    info.update(_finish_info(run, history, steps_per_round, sum(steps_per_round), stop, t0))
    info["right"] = right_stats
    info["seconds_per_round"] = round_seconds
    info["relerr_after"] = relerr(W, Gxx0, Gyx0, c0)
    info["relerr_tempered_after"] = relerr(W, Gxx_t, Gyx_t, c)
    if al is not None:
        info["align_after"] = _align(st, al)
        if al.Uv is not None:
            info["align_projector_after"] = _align(st, al, "projector")
        info["align_angle_after"] = _align(st, al, "angle")
    info["seconds"] = time.perf_counter() - t0
    return W, info


def _finish_info(run: _Run, history, steps_per_round, total_steps, stop, t0) -> dict:
    return {
        "rounds": max(len(history) - 1, 0),
        "stop_reason": stop,
        "objective_history": list(history),
        "inner_steps": int(total_steps),
        "inner_steps_per_round": list(steps_per_round),
        "gcv_lambdas": run.gcv_lambdas,
        "gcv_lambdas_rel": run.gcv_lambdas_rel,
        "gcv_at_grid_end": dict(run.grid_end),
        "rescales": run.rescales,
        "rescale_fallbacks": run.rescale_fallbacks,
        "left_rejects": run.left_rejects,
        "kappa_clamped": run.kappa_clamped,
        "scale_skipped": run.scale_skipped,
        "svd_fallbacks": list(run.svd_fallbacks),
        "seconds": time.perf_counter() - t0,
    }
