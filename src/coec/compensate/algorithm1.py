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

The steps of a call: its set-up (``algorithm1_setup``: what the settings mean on this device, the
metric's slices, the alignment data), the pruned point's factors (``_start``) and first left
rotation, the round loop (``_round_loop``, one ``_round`` each) and the reported result
(``_result``).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from coec.compensate import gcv as _gcv
from coec.compensate.algorithm1_setup import (
    CoecSettings,
    Plan,
    RescaleSettings,
    Slices,
    make_plan,
    right_problem,
    setup_alignment,
    setup_info,
    slices,
)
from coec.compensate.alignment import Alignment, alignment_value
from coec.compensate.descent import Carried, RightResult
from coec.compensate.errors import relerr
from coec.compensate.linalg import polar, polar_eigh, svd, svd_eigh
from coec.compensate.methods.base import Compensation
from coec.compensate.problem import Problem
from coec.compensate.profiling import span, traced
from coec.compensate.stiefel import RightProblem, solve_full, solve_reduced
from coec.io.progress import INNER
from coec.io.progress import bar as progress_bar


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
def _frames(
    U: torch.Tensor,
    S: torch.Tensor,
    Vt: torch.Tensor,
    Gxx: torch.Tensor,
    Gyx: torch.Tensor,
    RG: torch.Tensor | None = None,
) -> _State:
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


@dataclass
class _Run:
    """Mutable bookkeeping of one COEC call (becomes ``Compensation.info``)."""

    svd_fallbacks: list[str] = field(default_factory=list)
    gcv_lambdas: list[float] = field(default_factory=list)
    gcv_lambdas_rel: list[float | None] = field(default_factory=list)
    grid_end: dict[str, int] = field(default_factory=lambda: {"low": 0, "high": 0})
    scale_skipped: int = 0
    kappa_clamped: int = 0
    rescales: int = 0
    rescale_fallbacks: int = 0
    left_rejects: int = 0


def _error(st: _State, c: float) -> float:
    S, rho, e = st.S.to(torch.float64), st.rho().to(torch.float64), st.e.to(torch.float64)
    return (float((S * S * e).sum()) - 2.0 * float((S * rho).sum()) + c) / c


def _align(st: _State, al: Alignment | None, kind: str | None = None) -> float:
    if al is None:
        return 0.0
    return alignment_value(st.Vt[: al.rank], al, kind)


class _Objective:
    """The objective of eq. 1 at a factored weight: the tempered error plus ``lambda_a A(R)``."""

    def __init__(self, c: float, align_lambda: float, align: Alignment | None):
        self.c, self.align_lambda, self.align = c, align_lambda, align

    def __call__(self, st: _State) -> float:
        return _error(st, self.c) + self.align_lambda * _align(st, self.align)


@traced("coec.rescale")
def _rescale(st: _State, rescaling: RescaleSettings, run: _Run, objective: _Objective) -> _State:
    """Alg. 1 "GCV-rescale" of the current factors.

    The rescale never increases the error (gcv.rescale), but it can re-order the modes, and the
    alignment term depends on which rows are the top r_p. If the objective rises, the global
    rescale (order-preserving, error non-increasing) is used instead, and if even that rises
    (round-off), the weight is left as is; both are counted in ``rescale_fallbacks``.
    """
    rho = st.rho()
    res = _gcv.rescale(st.S, rho, st.e, mode=rescaling.rescale, grid=rescaling.gcv_grid, kappa=rescaling.kappa)
    run.rescales += 1
    if not res.scale_ok:
        run.scale_skipped += 1
    if rescaling.rescale == "gcv" and res.lam is not None:
        run.gcv_lambdas.append(res.lam)
        run.gcv_lambdas_rel.append(res.lam_rel)
        if res.grid_end:
            run.grid_end[res.grid_end] += 1
        run.kappa_clamped += res.n_clamped
    new = _apply_sigma(st, res.sigma)
    L0 = objective(st)
    if objective(new) <= L0:
        return new
    run.rescale_fallbacks += 1
    if rescaling.rescale == "gcv":
        new = _apply_sigma(st, _gcv.rescale(st.S, rho, st.e, mode="global").sigma)
        if objective(new) <= L0:
            return new
    return st


@traced("coec.left")
def _left(st: _State, run: _Run, method: str = "svd") -> _State:
    """Left rotation (Sec. 4.1): ``Q_l U = polar(Gyx Vt^T diag(S))``."""
    A = st.GyxV * st.S
    if method == "eigh":
        U = polar_eigh(A, run.svd_fallbacks)
    else:
        U = polar(A, run.svd_fallbacks)
    return _State(U=U, S=st.S, Vt=st.Vt, GyxV=st.GyxV, RG=st.RG, e=st.e)


def _align_info(st: _State, al: Alignment, when: str) -> dict[str, float]:
    """The alignment measures at ``st``: the penalty of the option's kind, the paper's projector
    penalty (with U_v) and the principal-angle one."""
    out = {f"align_{when}": _align(st, al)}
    if al.Uv is not None:
        out[f"align_projector_{when}"] = _align(st, al, "projector")
    out[f"align_angle_{when}"] = _align(st, al, "angle")
    return out


# --------------------------------------------------------------------------- the rounds


#: the right solves' counts that ``_RightStats`` sums (``info["right"]``, in this order)
_RIGHT_COUNTS = ("backtracks", "capped", "trials", "orth_cleanups", "carried", "rg_refreshes")


@dataclass
class _RightStats:
    """Totals of the right solves over the rounds (``info["right"]``; ``restarts`` with a
    conjugate or preconditioned solve)."""

    with_restarts: bool
    backtracks: int = 0
    capped: int = 0
    trials: int = 0
    orth_cleanups: int = 0
    carried: int = 0
    rg_refreshes: int = 0
    stops: dict[str, int] = field(default_factory=dict)
    restarts: int = 0

    def add(self, res: RightResult) -> None:
        for key in (*_RIGHT_COUNTS, "restarts"):
            setattr(self, key, getattr(self, key) + getattr(res, key))
        self.stops[res.stop] = self.stops.get(res.stop, 0) + 1

    def info(self) -> dict[str, Any]:
        out: dict[str, Any] = {key: getattr(self, key) for key in _RIGHT_COUNTS}
        out["stops"] = self.stops
        if self.with_restarts:
            out["restarts"] = self.restarts
        return out


@dataclass
class _Rounds:
    """The round loop's record: the current state, the objective per round (the first is the
    set-up point's), accepted right steps and seconds per round, the stop reason and the right
    solves' totals."""

    state: _State
    history: list[float]
    right: _RightStats
    steps_per_round: list[int] = field(default_factory=list)
    round_seconds: list[float] = field(default_factory=list)
    stop: str = "max_rounds"
    rg_age: int = 0  # carried updates that state.RG has been through since it was last formed by a product


def _start(WK: torch.Tensor, m: Slices, plan: Plan, run: _Run) -> _State:
    """Line 2: the pruned weight W_K as factors."""
    with span("coec.setup.svd"):
        U, S, Vt = (svd_eigh if plan.setup_svd == "eigh" else svd)(WK, run.svd_fallbacks)
    return _frames(U, S, Vt, m.Gxx, m.Gyx)


def _round(
    rec: _Rounds, problem: RightProblem, settings: CoecSettings, plan: Plan, run: _Run, objective: _Objective
) -> _State:
    """One round from ``rec.state``: lines 6-7, the right rotation (scale recomputed inside),
    W^ <- s W^ Q_r, rescale; line 8, the left rotation (the conditional minimiser; kept only if
    round-off did not make it worse), rescale."""
    st = rec.state
    solver = {"stiefel": solve_reduced, "full": solve_full}.get(settings.right)
    if solver is not None:
        with span("coec.right"):
            res = solver(st.U, st.S, st.Vt, problem, plan.right_solve, Carried(st.RG, rec.rg_age))
        rec.rg_age = res.rg_age
        rec.steps_per_round.append(res.steps)
        rec.right.add(res)
        run.scale_skipped += res.scale_skipped
        s = res.s if res.scale_ok else 1.0
        nxt = _frames(st.U, st.S, res.R, problem.Gxx, problem.Gyx, res.RG)
        st = _apply_sigma(nxt, nxt.S.to(torch.float64) * s)
        st = _rescale(st, settings.rescaling, run, objective)
    else:
        rec.steps_per_round.append(0)
    cand = _left(st, run, plan.left_polar)
    if objective(cand) <= objective(st):
        st = cand
    else:
        run.left_rejects += 1
    return _rescale(st, settings.rescaling, run, objective)


def _round_loop(
    rec: _Rounds, problem: RightProblem, settings: CoecSettings, plan: Plan, run: _Run, objective: _Objective
) -> None:
    """Rounds until ``max_rounds``, a change of the objective below ``tol``, or a round that
    raised it (undone: "non_monotone_guard")."""
    rounds = settings.rounds
    L_prev = rec.history[0]
    # an inner bar: drawn on a terminal (after 1 s), silent in a log (the module count is there)
    for _rnd in progress_bar(range(rounds.max_rounds), desc="coec rounds", unit="round", display=INNER, delay=1.0):
        t_round = time.perf_counter()
        st = _round(rec, problem, settings, plan, run, objective)
        L = objective(st)
        rec.round_seconds.append(time.perf_counter() - t_round)
        if not math.isfinite(L) or L > L_prev:  # monotone guard: keep the previous iterate
            rec.stop = "non_monotone_guard"
            break
        rec.state = st
        rec.history.append(L)
        change = L_prev - L
        if rounds.tol_mode == "relative":
            change = change / max(abs(L_prev), 1e-300)
        L_prev = L
        if change < rounds.tol:
            rec.stop = "tol"
            break


# --------------------------------------------------------------------------- the call


def coec(problem: Problem, settings: CoecSettings) -> Compensation:
    """Algorithm 1 for one module: ``problem.W0`` (d_out, d_in), ``gram`` (d_in, d_in), ``keep``
    (k,) sorted, ``inputs["value_proj"]`` (k, d_model) the pruned v_proj in query-head layout or
    absent, solved on the problem's device in its dtype; ``settings`` from the checked options
    (``methods.coec.solver_settings``). Returns the weight (d_out, k) in the compute dtype and the
    info dict.
    """
    t0 = time.perf_counter()
    W0, gram, keep = problem.W0, problem.gram, problem.keep
    value_proj = problem.inputs.get("value_proj")
    plan = make_plan(settings, problem.device, problem.dtype)
    run = _Run()
    keep = keep.to(plan.device)
    m = slices(W0, gram, keep, settings.temper, plan, run.svd_fallbacks)
    W0c = W0.to(plan.device, plan.dtype)
    WK = W0c[:, keep]
    info = setup_info(settings, plan, m, WK)
    al = setup_alignment(W0c, keep, value_proj, settings.alignment, plan, run.svd_fallbacks)
    if m.c <= 0 or not math.isfinite(m.c):  # no output energy in this metric: nothing to fit
        info.update(_finish_info(run, None, "zero_output_energy", t0))
        info["relerr_after"] = info["relerr_before"]
        info["relerr_tempered_after"] = info["relerr_tempered_before"]
        return Compensation(weight=WK.clone(), info=info)

    st = _start(WK, m, plan, run)
    if al is not None:
        info.update(_align_info(st, al, "before"))
    lam_a = settings.alignment.align_lambda
    objective = _Objective(m.c, lam_a, al if lam_a > 0 else None)
    info["objective_pruned"] = objective(st)
    # Lines 3-4: left rotation, rescale.
    st = _rescale(_left(st, run, plan.left_polar), settings.rescaling, run, objective)
    with_restarts = settings.right_solve.right_solver == "cg" or settings.precondition != "none"
    rec = _Rounds(state=st, history=[objective(st)], right=_RightStats(with_restarts=with_restarts))
    info["seconds_setup"] = time.perf_counter() - t0
    _round_loop(rec, right_problem(m, settings, objective.align), settings, plan, run, objective)
    return _result(rec, m, al, run, info, t0)


def _result(rec: _Rounds, m: Slices, al: Alignment | None, run: _Run, info: dict[str, Any], t0: float) -> Compensation:
    """The weight of the last accepted round and the info dict, finished."""
    W = rec.state.weight()
    info.update(_finish_info(run, rec, rec.stop, t0))
    info["right"] = rec.right.info()
    info["seconds_per_round"] = rec.round_seconds
    info["relerr_after"] = relerr(W, m.Gxx0, m.Gyx0, m.c0)
    info["relerr_tempered_after"] = relerr(W, m.Gxx_t, m.Gyx_t, m.c)
    if al is not None:
        info.update(_align_info(rec.state, al, "after"))
    info["seconds"] = time.perf_counter() - t0
    return Compensation(weight=W, info=info)


def _finish_info(run: _Run, rec: _Rounds | None, stop: str, t0: float) -> dict[str, Any]:
    history = rec.history if rec is not None else []
    steps = rec.steps_per_round if rec is not None else []
    return {
        "rounds": max(len(history) - 1, 0),
        "stop_reason": stop,
        "objective_history": list(history),
        "inner_steps": int(sum(steps)),
        "inner_steps_per_round": list(steps),
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
