"""The backtracking descent loop shared by the right solves (paper Sec. 4.2, App. B).

A solver (``stiefel.py``) supplies the profiled objective (``objective.py``) and a
:class:`Space`: how its variable x (the frame R, or the full solver's Q) gives R, and, at each
point, the :class:`Tangent` with the Riemannian gradient and the :class:`Direction` along a
search direction (its norm, its R-velocity and the retraction ``step(t)``).

Steps. The paper normalises the step as ``eta / s^2`` and never gives eta. Here
``t = eta * base`` with ``base`` chosen by ``eta_scale``:

* ``"rayleigh"`` (default): ``base = ||g||^2 / <g, H g>``, the exact line-search step of the
  quadratic model along the search direction g at fixed s, with
  ``H[g] = (2 s^2 / c) S^2 g Gxx``. It is of the paper's form ``eta' / s^2`` with a per-step,
  unit-free eta'; costs one extra (r, k, k) product per step. eta = 1 by default. Where the
  model has no positive curvature along g, ``base = 1 / (s^2 L0)`` with the worst-case
  curvature ``L0 = 2 S_max^2 lambda_max(Gxx) / c``.
* ``"raw"``: ``base = 1 / s^2`` (the paper's literal form; eta then carries the layer's units).

App. B step cap: ``t <= 1 / ||grad||_F`` so that ``||t grad|| <= 1``. Backtracking: a step that
raises F is rejected and eta halved (for the rest of this solve), so F is monotone.
Stop: ``||R_new - R||_F / sqrt(r) < delta`` (``delta_norm="rms"``, the RMS change of a frame row,
so one delta serves every width) or ``||R_new - R||_F < delta`` (``"fro"``, the unscaled
reading), no descent possible, or ``max_inner_steps`` accepted steps.

Evaluations (``rg_update``): each trial's ``R_new Gxx`` by an (r, k, k) product ("product"), or,
for a direction that can carry it through its retraction (the polar one,
``retraction.retract_polar_with``), from the step size's ``g Gxx`` ("carry"), formed afresh
every ``rg_refresh`` carried updates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

import torch

from coec.compensate.newton_schulz import ns_polar
from coec.compensate.objective import Evaluation, ProfiledObjective
from coec.compensate.profiling import span, traced


@dataclass(frozen=True)
class RightSolveSettings:
    """How a right solve runs (the module docstring; ``coec`` takes them from its options once
    per call, each field named as its option). eta / eta_scale: the step; delta / delta_norm:
    the stop on the change of R; max_inner_steps: accepted steps; max_backtracks: halvings of a
    step; right_solver: "gd" (Riemannian gradient) or "cg" (Polak–Ribière+ conjugate
    directions); cayley_inverse: the inverse inside a Cayley retraction ("newton_schulz" |
    "solve"); rg_update: "product" | "carry" (a caller resolves the option's "auto" first), with
    rg_refresh the carried updates between fresh products (0: never); track: record F after
    every accepted step (``RightResult.history``)."""

    eta: float = 1.0
    eta_scale: str = "rayleigh"
    delta: float = 7e-4
    delta_norm: str = "rms"
    max_inner_steps: int = 100
    max_backtracks: int = 30
    right_solver: str = "gd"
    cayley_inverse: str = "newton_schulz"
    rg_update: str = "product"
    rg_refresh: int = 0
    track: bool = False


@dataclass(frozen=True)
class Carried:
    """What a right solve starts from beyond its frame: ``RG`` the frame's ``R Gxx`` (r, k) when
    the caller has it (None: formed by a product) and ``age`` the carried updates it has been
    through (``rg_refresh`` counts them across rounds)."""

    RG: torch.Tensor | None = None
    age: int = 0


@dataclass
class RightResult:
    """Output of a right solve. R (r, k) row-orthonormal; Q (k, k) only for the full solver."""

    R: torch.Tensor
    s: float
    scale_ok: bool
    RG: torch.Tensor
    F_start: float
    F_end: float
    err_end: float
    A_start: float
    A_end: float
    steps: int = 0
    trials: int = 0
    backtracks: int = 0
    capped: int = 0
    scale_skipped: int = 0
    stop: str = ""
    eta_end: float = 0.0
    orth_cleanups: int = 0
    Q: torch.Tensor | None = None
    history: list[float] = field(default_factory=list)
    carried: int = 0
    rg_refreshes: int = 0
    rg_age: int = 0
    restarts: int = 0


class Direction(Protocol):
    """A search direction at the current point: its norm, its R-velocity ``vel`` (Euclidean,
    (r, k)), the retraction ``step(t)`` (the new variable), and whether ``step_carrying(t, RG,
    gG)`` can also carry ``R Gxx`` through the step (returns the new variable and its R Gxx)."""

    norm: float
    vel: torch.Tensor
    carries: bool

    def step(self, t: float) -> torch.Tensor: ...

    def step_carrying(
        self, t: float, RG: torch.Tensor, gG: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]: ...


class Tangent(Protocol):
    """The tangent space at the current point: the Riemannian gradient ``grad`` (in the space
    of the directions), its preconditioned image ``pgrad`` (None without a preconditioner), the
    direction ``along(P)`` and the vector transport of a direction from the previous point."""

    grad: torch.Tensor
    pgrad: torch.Tensor | None

    def along(self, P: torch.Tensor) -> Direction: ...

    def transport(self, P: torch.Tensor) -> torch.Tensor: ...


class Space(Protocol):
    """A solver's variable: ``measure(x)`` its frame R; ``tangent(x, R, Xi)`` the tangent space at
    x for the Euclidean gradient Xi (r, k) of F at R."""

    def measure(self, x: torch.Tensor) -> torch.Tensor: ...

    def tangent(self, x: torch.Tensor, R: torch.Tensor, Xi: torch.Tensor) -> Tangent: ...


@traced("coec.right.step_size")
def _step_base(
    obj: ProfiledObjective, ev: Evaluation, search: _Search, L0: float, eta_scale: str, gG: torch.Tensor | None = None
) -> float:
    """Step unit multiplied by eta (module docstring) along ``search``: its direction's velocity
    g (Euclidean, r x k) and ``slope`` ``<grad F, g>`` when g is not the gradient itself
    (conjugate directions; None: ``||g||^2``); gG: ``g Gxx`` when the caller already has it."""
    g, slope = search.direction.vel, search.slope
    s2 = ev.s**2 if ev.s != 0 else 1.0
    if eta_scale == "raw":
        return 1.0 / s2
    if eta_scale == "rayleigh":
        # exact line search of the quadratic model at fixed s: ||g||^2 / <g, H g>,
        # H[g] = (2 s^2 / c) S^2 g Gxx (Euclidean Hessian of the error in R at fixed scale)
        gG = g @ obj.Gxx if gG is None else gG
        curv = (2.0 * s2 / obj.c) * float((obj.S2 * gG * g).sum())
        gg = float((g * g).sum()) if slope is None else slope
        if curv > 0 and math.isfinite(curv):
            return gg / curv
    return 1.0 / (s2 * L0) if L0 > 0 else 1.0 / s2


def _orth_error(R: torch.Tensor) -> float:
    """``max |R R^T - I|``."""
    return float((R @ R.mT - torch.eye(R.shape[0], dtype=R.dtype, device=R.device)).abs().max())


def _orth_tol(dtype: torch.dtype) -> float:
    return 1e-10 if dtype == torch.float64 else 1e-5


@dataclass(frozen=True)
class _CgMemory:
    """What a conjugate direction needs from the previous step: its gradient, the gradient's
    preconditioned image (the gradient without a preconditioner) and the direction taken."""

    grad: torch.Tensor
    pgrad: torch.Tensor
    dir: torch.Tensor


@dataclass(frozen=True)
class _Conjugate:
    """``_conjugate``'s result: the direction, and whether it restarted from the gradient."""

    direction: torch.Tensor
    restarted: bool


def _conjugate(tangent: Tangent, prev: _CgMemory | None) -> _Conjugate:
    """Polak–Ribière+ direction ``P = Z + beta T(P_prev)``, ``beta = max(0, <G, Z - T(Z_prev)> /
    <G_prev, Z_prev>)`` with G the Riemannian gradient and Z its preconditioned image (``Z = G``
    without a preconditioner), T the solver's vector transport (orthogonal projection onto the new
    tangent space, so ``<G, T(Z_prev)> = <G, Z_prev>`` for tangent G and only the direction is
    transported: 4 r^2 k FLOPs a step); restarts (P = Z) when P is no descent direction."""
    G = tangent.grad
    Z = G if tangent.pgrad is None else tangent.pgrad
    if prev is None:
        return _Conjugate(Z, True)
    Zp = prev.pgrad
    den = float((prev.grad * Zp).sum())
    beta = max(0.0, float((G * (Z - Zp)).sum()) / den) if den > 0 else 0.0
    P = Z + beta * tangent.transport(prev.dir)
    if not float((G * P).sum()) > 0:
        return _Conjugate(Z, True)
    return _Conjugate(P, beta == 0.0)


@dataclass
class Counts:
    """What a descent counts (``RightResult`` reports them)."""

    steps: int = 0
    trials: int = 0
    backtracks: int = 0
    capped: int = 0
    skipped: int = 0
    carried: int = 0
    refreshes: int = 0
    restarts: int = 0


@dataclass(frozen=True)
class _Search:
    """The direction a step searches along, and its slope ``<Xi, vel>`` (None: the gradient's)."""

    direction: Direction
    slope: float | None


@dataclass(frozen=True)
class _Trial:
    """An accepted trial point: the variable, its R and evaluation, and whether R Gxx was carried."""

    x: torch.Tensor
    R: torch.Tensor
    ev: Evaluation
    carried: bool


@dataclass(frozen=True)
class Descent:
    """Outcome of ``descend``: the last variable x, its R and evaluation ``ev``, the evaluation
    it started from, the counts, the stop reason, the final eta, the tracked F values and the
    carried updates the returned R Gxx has been through (``rg_age``)."""

    x: torch.Tensor
    R: torch.Tensor
    ev: Evaluation
    start: Evaluation
    counts: Counts
    stop: str
    eta_end: float
    history: list[float]
    rg_age: int


class _Loop:
    """The mutable state of one descent: the counts, the current eta and the CG memory."""

    def __init__(self, obj: ProfiledObjective, space: Space, settings: RightSolveSettings, L0: float):
        self.obj, self.space, self.settings, self.L0 = obj, space, settings, L0
        self.counts = Counts()
        self.eta = float(settings.eta)
        self.prev: _CgMemory | None = None  # cg: the last gradient and direction

    def direction(self, x: torch.Tensor, R: torch.Tensor, ev: Evaluation) -> _Search:
        """The search direction at x: the gradient's, or (cg, or a preconditioner) the conjugate
        or preconditioned one when it is a descent direction."""
        s = self.settings
        with span("coec.right.direction"):
            Xi = self.obj.grad(R, ev)
            tangent = self.space.tangent(x, R, Xi)
            dirn = tangent.along(tangent.grad)
            restarted = False
            if s.right_solver != "cg":
                if tangent.pgrad is None:  # the gradient
                    return _Search(dirn, None)
                P = tangent.pgrad
            else:
                conj = _conjugate(tangent, self.prev)
                P, restarted = conj.direction, conj.restarted
                pgrad = tangent.grad if tangent.pgrad is None else tangent.pgrad
                self.prev = _CgMemory(grad=tangent.grad, pgrad=pgrad, dir=P)
            cand = tangent.along(P)
            slope = float((Xi * cand.vel).sum())
            search = _Search(cand, slope)
            if not slope > 0:  # a preconditioned direction that is no descent direction: the gradient
                restarted, self.prev = True, None
                search = _Search(tangent.along(tangent.grad), None)
            self.counts.restarts += int(restarted)
        return search

    def line_search(self, search: _Search, ev: Evaluation, unit: float) -> _Trial | None:
        """Backtracking along the direction from the point of ``ev``: the first trial that does
        not raise F, or None (no descent)."""
        s, obj, dirn = self.settings, self.obj, search.direction
        gnorm = dirn.norm
        gG = None
        if s.rg_update == "carry" and dirn.carries:  # g Gxx feeds the carried R Gxx too
            with span("coec.right.step_size"):
                gG = dirn.vel @ obj.Gxx
        base = _step_base(obj, ev, search, self.L0, s.eta_scale, gG)
        t = self.eta * base
        if t * gnorm > 1.0:  # App. B step cap: ||t * grad|| <= 1
            t = 1.0 / gnorm
            self.counts.capped += 1
        for _bt in range(s.max_backtracks + 1):
            self.counts.trials += 1
            x_new, RG_new = dirn.step_carrying(t, ev.RG, gG) if gG is not None else (dirn.step(t), None)
            R_new = self.space.measure(x_new)
            ev_new = obj.evaluate(R_new, RG_new)
            if math.isfinite(ev_new.F) and ev_new.F <= ev.F:
                return _Trial(x_new, R_new, ev_new, carried=gG is not None)
            t *= 0.5
            self.eta = min(self.eta, t / base)  # halve eta for the rest of this solve
            self.counts.backtracks += 1
            if t * gnorm / unit < 1e-3 * s.delta:  # steps this small cannot pass delta anyway
                break
        return None


def descend(
    obj: ProfiledObjective,
    space: Space,
    settings: RightSolveSettings,
    L0: float,
    x0: torch.Tensor,
    carried: Carried | None = None,
) -> Descent:
    """The backtracking descent from x0 (module docstring). ``carried``: ``R0 Gxx`` when the
    caller has it, and its carried updates; L0 the worst-case curvature (the step unit where the
    Rayleigh step has none)."""
    s, loop = settings, _Loop(obj, space, settings, L0)
    counts = loop.counts
    x = x0
    R = space.measure(x)
    carried = carried or Carried()
    ev = start = obj.evaluate(R, carried.RG)
    age = int(carried.age) if carried.RG is not None else 0
    counts.skipped += 0 if ev.ok else 1
    hist = [ev.F] if s.track else []
    unit = math.sqrt(R.shape[0]) if s.delta_norm == "rms" else 1.0  # the change of R is measured in these units
    stop = "max_steps"
    for _ in range(s.max_inner_steps):
        search = loop.direction(x, R, ev)
        gnorm = search.direction.norm
        if not math.isfinite(gnorm):
            stop = "nonfinite_grad"
            break
        if gnorm == 0.0:
            stop = "stationary"
            break
        trial = loop.line_search(search, ev, unit)
        if trial is None:
            stop = "no_descent"
            break
        dR = float(torch.linalg.matrix_norm(trial.R - R)) / unit
        x, R, ev = trial.x, trial.R, trial.ev
        if trial.carried:
            age += 1
            counts.carried += 1
            if s.rg_refresh and age >= s.rg_refresh:  # bound the carried round-off: one fresh product
                ev = obj.evaluate(R)
                age = 0
                counts.refreshes += 1
        else:
            age = 0
        counts.steps += 1
        counts.skipped += 0 if ev.ok else 1
        if s.track:
            hist.append(ev.F)
        if dR < s.delta:
            stop = "delta"
            break
    return Descent(x=x, R=R, ev=ev, start=start, counts=counts, stop=stop, eta_end=loop.eta, history=hist, rg_age=age)


def finish(obj: ProfiledObjective, d: Descent, Q: torch.Tensor | None = None, drifts: bool = True) -> RightResult:
    """The result of a descent. The polar retraction re-orthonormalises at every step; Cayley
    steps compose (``drifts``), and in low precision their round-off accumulates: checked once per
    solve and re-projected if needed (``orth_cleanups``)."""
    R, ev = d.R, d.ev
    cleanups = 0
    if drifts and d.counts.steps > 0 and R.dtype != torch.float64 and _orth_error(R) > _orth_tol(R.dtype):
        R = ns_polar(R, scale=1.5)[0]
        ev = obj.evaluate(R)
        cleanups = 1
    c = d.counts
    return RightResult(
        R=R,
        s=ev.s,
        scale_ok=ev.ok,
        RG=ev.RG,
        F_start=d.start.F,
        F_end=ev.F,
        err_end=ev.err,
        A_start=d.start.A,
        A_end=ev.A,
        steps=c.steps,
        trials=c.trials,
        backtracks=c.backtracks,
        capped=c.capped,
        scale_skipped=c.skipped,
        stop=d.stop,
        eta_end=d.eta_end,
        orth_cleanups=cleanups,
        Q=Q,
        history=d.history,
        carried=c.carried,
        rg_refreshes=c.refreshes,
        rg_age=0 if cleanups else d.rg_age,
        restarts=c.restarts,
    )
