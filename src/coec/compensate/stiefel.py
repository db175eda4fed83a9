"""Right-rotation solvers and the inter-layer alignment penalty (paper Sec. 4.1, 4.2, 4.5, App. B).

Reduced Stiefel reading (docs/design.md): with the thin SVD of the current weight
``W = U diag(S) Vt`` (r = min(d_out, k) modes), ``W Q_r = U diag(S) R`` with
``R = Vt Q_r in St(r, k)`` (rows orthonormal, ``R R^T = I_r``). The right solve minimises the
profiled objective

    F(R) = min_s  err(s U S R) + lambda_a A(R),
    err(W) = (tr(W Gxx W^T) - 2 tr(W Gyx^T) + c) / c,

with the optimal global scale recomputed after every step (Sec. 4.1). Because ``U^T U = I``,
``err(s U S R) = (s^2 q - 2 s p + c)/c`` with ``q = sum_i S_i^2 (R Gxx R^T)_ii`` and
``p = <S U^T Gyx, R>``; by the envelope theorem the gradient at ``s = s*`` is
``Xi = (2/c) (s^2 S^2 R Gxx - s S U^T Gyx) + lambda_a dA/dR``.

Steps. The paper normalises the step as ``eta / s^2`` and never gives eta. Here
``t = eta * base`` with ``base`` chosen by ``eta_scale``:

* ``"rayleigh"`` (default): ``base = ||g||^2 / <g, H g>``, the exact line-search step of the
  quadratic model along the search direction g at fixed s, with
  ``H[g] = (2 s^2 / c) S^2 g Gxx``. It is of the paper's form ``eta' / s^2`` with a per-step,
  unit-free eta'; costs one extra (r, k, k) product per step. eta = 1 by default.
* ``"lipschitz"``: ``base = 1 / (s^2 L0)``, ``L0 = 2 S_max^2 lambda_max(Gxx) / c`` (the
  worst-case curvature; safe but slow when a few outlier channels dominate lambda_max).
* ``"raw"``: ``base = 1 / s^2`` (the paper's literal form; eta then carries the layer's units).

App. B step cap: ``t <= 1 / ||grad||_F`` so that ``||t grad|| <= 1``. Backtracking: a step that
raises F is rejected and eta halved (for the rest of this solve), so F is monotone.
Retraction: Newton–Schulz polar when r < k, Cayley (inverse by Newton–Schulz, App. B, or by an LU
solve: ``cayley_inverse``) when r = k.
Stop: ``||R_new - R||_F / sqrt(r) < delta`` (``delta_norm="rms"``, the RMS change of a frame row,
so one delta serves every width) or ``||R_new - R||_F < delta`` (``"fro"``, the unscaled
reading), no descent possible, or ``max_steps`` accepted steps.

Precision of the search direction (``direction_matmul``): "tf32" runs the float32 products of the
direction and of its step size (the named blocks ``coec.right.direction`` and
``coec.right.step_size``) at ``torch.set_float32_matmul_precision("high")``, TF32 tensor cores on
CUDA; the objective's evaluations and the retraction stay float32, so backtracking and the stop
still see float32 values. A direction a few 1e-4 off is still a descent direction.

Evaluations (``rg_update``): each trial's ``R_new Gxx`` by an (r, k, k) product ("product"), or,
for the polar retraction, carried through it from the step size's ``g Gxx`` ("carry",
``retract_polar_with``; that ``g Gxx`` then stays float32), formed afresh every ``rg_refresh``
carried updates.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field

import torch

from ..profiling import span, traced
from .linalg import ns_inverse, ns_polar, ns_polar_with, polar, top_singular_vectors

__all__ = [
    "Alignment",
    "alignment_setup",
    "alignment_value",
    "riemannian_grad",
    "retract_polar",
    "retract_polar_with",
    "retract_cayley",
    "RightResult",
    "ProfiledObjective",
    "solve_reduced",
    "solve_full",
    "matmul_precision",
    "make_preconditioner",
]


# --------------------------------------------------------------------------- alignment (Sec. 4.5)


@dataclass
class Alignment:
    """Precomputed alignment data for one o_proj (paper Sec. 4.5).

    kind: "projector" (paper) or "angle" (principal-angle variant, see ``alignment_value``).
    Va (k, rp): anchor frame ``orth(V_full[K, :rp])`` (polar orthonormalisation; same subspace
    as QR, which is all either penalty uses).
    Uv (k, rp) or None: leading left singular vectors of the pruned, query-layout v_proj.
    C (rp, rp) or None: ``Uv^T Pi_anchor Uv = (Va^T Uv)^T (Va^T Uv)``.
    """

    kind: str
    rank: int
    Va: torch.Tensor
    Uv: torch.Tensor | None = None
    C: torch.Tensor | None = None


def alignment_setup(
    W0: torch.Tensor,
    keep: torch.Tensor,
    value_proj: torch.Tensor | None,
    rank: int,
    kind: str = "projector",
    record: list | None = None,
    factor: str = "svd",
) -> Alignment:
    """Build the anchor from the UNPRUNED weight W0 (d_out, d_in) and U_v from value_proj (k, d_model).

    anchor = orth(V_full[K, :]) with V_full the top-``rank`` right singular vectors of W0 (Sec. 4.5).
    ``factor``: how the top singular vectors are found, "svd" or "eigh" (``top_singular_vectors``;
    both penalties depend only on the two top-``rank`` subspaces).
    """
    Vtop = top_singular_vectors(W0, rank, "right", factor, record)
    Va = polar(Vtop[keep], record)  # (k, rp)
    Uv = C = None
    if value_proj is not None:
        Uv = top_singular_vectors(value_proj.to(W0.dtype), rank, "left", factor, record)
        B = Va.mT @ Uv
        C = B.mT @ B
    if kind == "projector" and Uv is None:
        raise ValueError("align='projector' needs value_proj (k x d_model)")
    return Alignment(kind=kind, rank=rank, Va=Va, Uv=Uv, C=C)


@traced("coec.align.value")
def alignment_value(
    Rp: torch.Tensor, al: Alignment, kind: str | None = None, grad: bool = True
) -> tuple[float, torch.Tensor | None]:
    """Alignment penalty and its Euclidean gradient w.r.t. the top-rp rows ``Rp`` (rp, k) of R.

    projector (paper Sec. 4.5): ``A = ||Uv^T (Rp^T Rp - Va Va^T) Uv||_F^2 / rp^2``. With
    ``M = Rp Uv`` and ``E = M^T M - C``: ``A = ||E||_F^2 / rp^2``, ``dA/dRp = 4 M E Uv^T / rp^2``.

    angle (option): mean squared sine of the principal angles theta_i between the row space of
    Rp (top-rp right singular subspace of the compensated weight) and the anchor subspace,
    ``A = (1/rp) sum_i sin^2 theta_i = 1 - ||Rp Va||_F^2 / rp = ||Rp^T Rp - Va Va^T||_F^2 / (2 rp)``,
    ``dA/dRp = -(2/rp) (Rp Va) Va^T``. Why: App. C finds the projector penalty at ~1e-7 while the
    principal angles stay at ~22 deg. Any subspace metric is invariant to rotations inside the
    subspace (principal angles too, despite App. C's wording); what the paper's penalty misses is
    everything outside span(Uv), because the Uv^T (.) Uv sandwich keeps only an rp x rp block. This
    variant drops the sandwich, so it targets exactly the angles App. C measures; it needs no Uv.
    It depends only on the top-rp subspace, not on the order of the rows inside it.
    Returns (value, gradient (rp, k), or None when ``grad`` is False: the objective's evaluations
    need only the value).
    """
    kind = kind or al.kind
    rp = al.rank
    f64 = torch.float64  # values in float64 (they are small differences); gradients in R's dtype
    if kind == "projector":
        M = Rp.to(f64) @ al.Uv.to(f64)
        E = M.mT @ M - al.C.to(f64)
        val = float((E * E).sum()) / rp**2
        return val, (((4.0 / rp**2) * (M @ E)).to(Rp.dtype) @ al.Uv.mT if grad else None)
    if kind == "angle":
        B = Rp.to(f64) @ al.Va.to(f64)  # (rp, rp): singular values are cos(theta_i)
        val = 1.0 - float((B * B).sum()) / rp
        return val, (((-2.0 / rp) * B).to(Rp.dtype) @ al.Va.mT if grad else None)
    raise ValueError(f"unknown align kind {kind!r}; expected 'projector' or 'angle'")


# --------------------------------------------------------------------------- manifold primitives


@contextlib.contextmanager
def matmul_precision(kind: str = "float32"):
    """Precision of the float32 matrix products inside the block: "float32" (IEEE, unchanged) or
    "tf32" (``torch.set_float32_matmul_precision("high")``: TF32 tensor cores on CUDA), restored
    on exit. The caller decides where TF32 applies (``coec`` resolves it to CUDA only)."""
    if kind == "float32":
        yield
        return
    if kind != "tf32":
        raise ValueError(f"matmul precision must be 'float32' or 'tf32', got {kind!r}")
    prev = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(prev)


def riemannian_grad(R: torch.Tensor, Xi: torch.Tensor) -> torch.Tensor:
    """Riemannian gradient on St(r, k) (rows orthonormal), embedded metric: ``Xi - sym(Xi R^T) R``."""
    B = Xi @ R.mT
    return Xi - 0.5 * (B + B.mT) @ R


@traced("coec.right.retract")
def retract_polar(R: torch.Tensor, D: torch.Tensor) -> torch.Tensor:
    """Newton–Schulz polar retraction ``polar(R - D)`` for R (r, k), r <= k, D tangent (App. B).

    For tangent D, ``(R - D)(R - D)^T = I + D D^T`` has its spectrum in ``[1, 1 + ||D||_F^2]``,
    inside the Newton–Schulz convergence region (0, 3) without rescaling when ``||D||_F <= 1``
    (the step cap); larger D is rescaled.
    """
    return retract_polar_with(R, D)[0]


@traced("coec.right.retract")
def retract_polar_with(R: torch.Tensor, D: torch.Tensor, RG: torch.Tensor | None = None,
                       DG: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``retract_polar`` that also carries ``R Gxx`` through the step: given ``RG = R Gxx`` and
    ``DG = D Gxx`` (r, k), returns ``(R_new, R_new Gxx)`` with ``R_new Gxx = F (RG - DG)``, F the
    retraction's left factor (``linalg.ns_polar_with``): no (r, k, k) product. R_new is
    ``retract_polar``'s, bit for bit. Without RG the second value is None.
    """
    X = R - D
    bound = 1.0 + float((D * D).sum())
    Y = None if RG is None else RG - DG
    P, PG, _ = ns_polar_with(X, Y, scale=1.0 if bound < 2.5 else bound)
    return P, PG


@traced("coec.right.retract")
def retract_cayley(R: torch.Tensor, A: torch.Tensor, t: float, inverse: str = "newton_schulz") -> torch.Tensor:
    """Cayley retraction ``(I + t/2 A)^{-1} (I - t/2 A) R`` for skew A (n, n) (Wen & Yin 2012).

    Its velocity at t = 0 is ``-A R``. ``inverse="newton_schulz"`` (App. B) iterates from
    ``X0 = M^T / (1 + (t/2)^2 ||A||_F^2)`` (``M^T M = I + (t/2)^2 A^T A``, so this converges);
    ``"solve"`` applies the same inverse by one LU solve (about 2.7 n^3 FLOPs against ~4 n^3 per
    Newton–Schulz iteration; same result to round-off).
    """
    h = 0.5 * t
    n = A.shape[0]
    eye = torch.eye(n, dtype=A.dtype, device=A.device)
    M = eye + h * A
    rhs = (eye - h * A) @ R
    if inverse == "solve":
        return torch.linalg.solve(M, rhs)
    if inverse != "newton_schulz":
        raise ValueError(f"cayley inverse must be 'newton_schulz' or 'solve', got {inverse!r}")
    with span("coec.right.retract.ns_inverse"):
        Minv, _ = ns_inverse(M, M.mT / (1.0 + h * h * float((A * A).sum())))
    return Minv @ rhs


# --------------------------------------------------------------------------- profiled objective


class ProfiledObjective:
    """``F(R) = min_s err(s U S R) + lambda_a A(R)`` and its Euclidean gradient (module docstring).

    U (d_out, r), S (r,) >= 0 descending, Gxx (k, k), Gyx (d_out, k), c > 0. The scale is only
    applied when its denominator q is positive (App. B); otherwise s = 1 and ``scale_ok`` False.
    """

    def __init__(self, U, S, Gxx, Gyx, c: float, align: Alignment | None = None, align_lambda: float = 0.0):
        self.S = S
        self.S2 = (S * S)[:, None]
        self.P = S[:, None] * (U.mT @ Gyx)  # (r, k)
        self.Gxx = Gxx
        self.c = float(c)
        self.align = align if (align is not None and align_lambda > 0) else None
        self.lam = float(align_lambda)

    @traced("coec.right.evaluate")
    def evaluate(self, R: torch.Tensor, RG: torch.Tensor | None = None) -> dict:
        RG = R @ self.Gxx if RG is None else RG
        q = float((self.S2 * RG * R).sum())
        p = float((self.P * R).sum())
        ok = q > 0 and math.isfinite(q)
        s = p / q if ok else 1.0
        err = (s * s * q - 2.0 * s * p + self.c) / self.c
        A = 0.0
        if self.align is not None:
            A = alignment_value(R[: self.align.rank], self.align, grad=False)[0]
        return {"F": err + self.lam * A, "err": err, "A": A, "s": s, "ok": ok, "RG": RG}

    def grad(self, R: torch.Tensor, ev: dict) -> torch.Tensor:
        s = ev["s"]
        Xi = (2.0 / self.c) * (s * s * self.S2 * ev["RG"] - s * self.P)
        if self.align is not None:
            rp = self.align.rank
            Xi[:rp] += self.lam * alignment_value(R[:rp], self.align)[1]
        return Xi


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
    history: list = field(default_factory=list)
    carried: int = 0
    rg_refreshes: int = 0
    rg_age: int = 0
    restarts: int = 0


@traced("coec.right.step_size")
def _step_base(obj, ev: dict, g: torch.Tensor, L0: float, eta_scale: str, gG: torch.Tensor | None = None,
               slope: float | None = None) -> float:
    """Step unit multiplied by eta (module docstring). g: the search direction (Euclidean, r x k);
    gG: ``g Gxx`` when the caller already has it; slope: ``<grad F, g>`` when g is not the
    gradient itself (conjugate directions; default ``||g||^2``)."""
    s2 = ev["s"] ** 2 if ev["s"] != 0 else 1.0
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


def _orth_tol(dtype) -> float:
    return 1e-10 if dtype == torch.float64 else 1e-5


def _conjugate(dirn: dict, prev: dict | None) -> tuple[torch.Tensor, bool]:
    """Polak–Ribière+ direction ``P = Z + beta T(P_prev)``, ``beta = max(0, <G, Z - T(Z_prev)> /
    <G_prev, Z_prev>)`` with G the Riemannian gradient and Z its preconditioned image (``Z = G``
    without a preconditioner), T the solver's vector transport (orthogonal projection onto the new
    tangent space, so ``<G, T(Z_prev)> = <G, Z_prev>`` for tangent G and only the direction is
    transported: 4 r^2 k FLOPs a step); restarts (P = Z) when P is no descent direction.
    Returns (P, restarted)."""
    G = dirn["grad"]
    Z = dirn.get("pgrad", G)
    if prev is None:
        return Z, True
    Zp = prev.get("pgrad", prev["grad"])
    den = float((prev["grad"] * Zp).sum())
    beta = max(0.0, float((G * (Z - Zp)).sum()) / den) if den > 0 else 0.0
    P = Z + beta * dirn["transport"](prev["dir"])
    if not float((G * P).sum()) > 0:
        return Z, True
    return P, beta == 0.0


def _descend(obj, R0, L0, retract_step, measure, *, eta, eta_scale, delta, max_steps, max_backtracks, track, RG0=None,
             delta_norm="rms", direction_matmul="float32", rg_update="product", rg_refresh=0, rg_age=0,
             method="gd"):
    """Shared backtracking descent loop. ``retract_step(x, R, Xi)`` -> dict with the direction's
    norm, its R-velocity ``vel`` and ``go(t)`` -> new variable, and optionally
    ``go_with(t, RG, gG)`` -> (new R, its R Gxx) carried through the step (polar retraction);
    x is the solver's variable (R, or Q for the full solver); ``measure(x)`` -> R. ``RG0``
    optionally caches ``R0 Gxx``, ``rg_age`` the carried updates it has been through.
    ``direction_matmul``: precision of the direction's and step size's products (module docstring).
    ``rg_update``/``rg_refresh``: how each trial's ``R Gxx`` is formed (``solve_reduced``).
    ``method``: "gd" steps along the Riemannian gradient; "cg" along Polak–Ribière+ conjugate
    directions (``retract_step`` then also returns ``grad``, ``transport`` and ``along(P)``)."""
    x = R0
    R = measure(x)
    ev = obj.evaluate(R, RG0)
    age = int(rg_age) if RG0 is not None else 0
    res = dict(F_start=ev["F"], A_start=ev["A"], steps=0, trials=0, backtracks=0, capped=0, skipped=0,
               carried=0, refreshes=0, restarts=0)
    prev = None  # cg: the last gradient and direction
    res["skipped"] += 0 if ev["ok"] else 1
    hist = [ev["F"]] if track else []
    r = R.shape[0]
    unit = math.sqrt(r) if delta_norm == "rms" else 1.0  # the change of R is measured in these units
    eta_cur = float(eta)
    stop = "max_steps"
    for _ in range(max_steps):
        with span("coec.right.direction"), matmul_precision(direction_matmul):
            Xi = obj.grad(R, ev)
            dirn = retract_step(x, R, Xi)  # closure with the search direction for this point
            slope = None
            if method == "cg" or "pgrad" in dirn:
                restarted = False
                if method == "cg":
                    P, restarted = _conjugate(dirn, prev)
                    prev = {"grad": dirn["grad"], "pgrad": dirn.get("pgrad", dirn["grad"]), "dir": P}
                else:
                    P = dirn["pgrad"]
                cand = dirn["along"](P)
                slope = float((Xi * cand["vel"]).sum())
                if slope > 0:
                    dirn = cand
                else:  # a preconditioned direction that is no descent direction: the gradient
                    restarted, prev = True, None
                    dirn = dirn["along"](dirn["grad"])
                    slope = None
                res["restarts"] += int(restarted)
        gnorm = dirn["norm"]
        if not math.isfinite(gnorm):
            stop = "nonfinite_grad"
            break
        if gnorm == 0.0:
            stop = "stationary"
            break
        carry = rg_update == "carry" and "go_with" in dirn
        gG = None
        if carry:  # g Gxx feeds the carried R Gxx, so it stays float32 (the step size reuses it)
            with span("coec.right.step_size"):
                gG = dirn["vel"] @ obj.Gxx
        with matmul_precision(direction_matmul):
            base = _step_base(obj, ev, dirn["vel"], L0, eta_scale, gG, slope)
        t = eta_cur * base
        if t * gnorm > 1.0:  # App. B step cap: ||t * grad|| <= 1
            t = 1.0 / gnorm
            res["capped"] += 1
        accepted = False
        for _bt in range(max_backtracks + 1):
            res["trials"] += 1
            if carry:
                x_new, RG_new = dirn["go_with"](t, ev["RG"], gG)
            else:
                x_new, RG_new = dirn["go"](t), None
            R_new = measure(x_new)
            ev_new = obj.evaluate(R_new, RG_new)
            if math.isfinite(ev_new["F"]) and ev_new["F"] <= ev["F"]:
                accepted = True
                break
            t *= 0.5
            eta_cur = min(eta_cur, t / base)  # halve eta for the rest of this solve
            res["backtracks"] += 1
            if t * gnorm / unit < 1e-3 * delta:  # steps this small cannot pass delta anyway
                break
        if not accepted:
            stop = "no_descent"
            break
        dR = float(torch.linalg.matrix_norm(R_new - R)) / unit
        x, R, ev = x_new, R_new, ev_new
        if carry:
            age += 1
            res["carried"] += 1
            if rg_refresh and age >= rg_refresh:  # bound the carried round-off: one fresh product
                ev = obj.evaluate(R)
                age = 0
                res["refreshes"] += 1
        else:
            age = 0
        res["steps"] += 1
        res["skipped"] += 0 if ev["ok"] else 1
        if track:
            hist.append(ev["F"])
        if dR < delta:
            stop = "delta"
            break
    res["rg_age"] = age
    return x, R, ev, res, stop, eta_cur, hist


def _finish(obj, x, R, ev, res, stop, eta_cur, hist, Q=None, drifts=True) -> RightResult:
    cleanups = 0
    # The polar retraction re-orthonormalises at every step; Cayley steps compose, and in low
    # precision their round-off accumulates: check once per solve and re-project if needed.
    if drifts and res["steps"] > 0 and R.dtype != torch.float64 and _orth_error(R) > _orth_tol(R.dtype):
        R = ns_polar(R, scale=1.5)[0]
        ev = obj.evaluate(R)
        cleanups = 1
    return RightResult(
        R=R, s=ev["s"], scale_ok=ev["ok"], RG=ev["RG"], F_start=res["F_start"], F_end=ev["F"],
        err_end=ev["err"], A_start=res["A_start"], A_end=ev["A"], steps=res["steps"],
        trials=res["trials"], backtracks=res["backtracks"], capped=res["capped"],
        scale_skipped=res["skipped"], stop=stop, eta_end=eta_cur, orth_cleanups=cleanups, Q=Q,
        history=hist, carried=res["carried"], rg_refreshes=res["refreshes"],
        rg_age=0 if cleanups else res["rg_age"], restarts=res["restarts"],
    )


def make_preconditioner(Gxx: torch.Tensor, damping: float) -> torch.Tensor:
    """``(Gxx + mu I)^-1`` (k, k), ``mu = damping * mean(diag Gxx)``, by a float64 Cholesky
    factorisation (once per module: Gxx is fixed across rounds), returned in Gxx's dtype."""
    G = Gxx.to(torch.float64)
    k = G.shape[0]
    mu = float(damping) * float(G.diagonal().mean())
    eye = torch.eye(k, dtype=G.dtype, device=G.device)
    L = torch.linalg.cholesky(0.5 * (G + G.mT) + mu * eye)
    return torch.cholesky_inverse(L).to(Gxx.dtype)


def _lipschitz(S: torch.Tensor, lam_max: float, c: float) -> float:
    """``L0 = 2 S_max^2 lambda_max(Gxx) / c``: curvature bound of the unscaled error in R."""
    return 2.0 * float(S.max()) ** 2 * float(lam_max) / c if c > 0 else 0.0


def solve_reduced(
    U: torch.Tensor,
    S: torch.Tensor,
    Vt: torch.Tensor,
    Gxx: torch.Tensor,
    Gyx: torch.Tensor,
    c: float,
    lam_max: float,
    *,
    eta: float = 1.0,
    eta_scale: str = "rayleigh",
    delta: float = 7e-4,
    max_steps: int = 100,
    max_backtracks: int = 30,
    align: Alignment | None = None,
    align_lambda: float = 0.0,
    track: bool = False,
    RG0: torch.Tensor | None = None,
    cayley_inverse: str = "newton_schulz",
    delta_norm: str = "rms",
    direction_matmul: str = "float32",
    rg_update: str = "product",
    rg_refresh: int = 0,
    rg_age: int = 0,
    method: str = "gd",
    precond_inv: torch.Tensor | None = None,
    precond_rows: float | None = None,
) -> RightResult:
    """ReducedStiefelSolve (Alg. 1 line 6, Sec. 4.2): minimise F(R) over St(r, k) from ``R = Vt``.

    U (d_out, r), S (r,), Vt (r, k) the thin SVD of the current weight (S descending);
    Gxx (k, k), Gyx (d_out, k), c = ||Y||^2 in the same metric; ``lam_max`` >= lambda_max(Gxx)
    (sets the step unit). Polar retraction when r < k, Cayley when r = k.

    ``rg_update``: how a trial's ``R_new Gxx`` is formed for its evaluation. "product": one
    (r, k, k) product per trial. "carry" (polar retraction only): ``R_new Gxx = F (R Gxx - t g Gxx)``
    through the retraction's left factor F (``retract_polar_with``), from the ``g Gxx`` of the
    step size (then formed in float32 whatever ``direction_matmul`` says): a scaling, or an
    (r, r, k) product when F needs a Newton–Schulz update. Equal in exact arithmetic; in floating
    point the carried product drifts from a fresh one by round-off, so after ``rg_refresh``
    carried updates (0: never) it is formed afresh. ``rg_age``: carried updates ``RG0`` has
    been through (the solver returns its own in ``RightResult.rg_age``).

    Preconditioning (beyond the paper): with ``precond_inv`` = M^-1 (k, k), ``M ~ Gxx`` SPD, the
    search direction is the tangent image of ``D^-1 Xi M^-1``, the Euclidean Newton direction of
    the error at fixed scale (its Hessian is ``S^2 (x) Gxx``, ``make_preconditioner``), with
    ``D = S^2 + precond_rows * max(S^2)`` (``precond_rows`` None: D = I). A direction that is
    no descent direction falls back to the gradient (counted in ``restarts``). Steps then need
    ``eta_scale="rayleigh"``, the exact line search along the direction.
    """
    obj = ProfiledObjective(U, S, Gxx, Gyx, c, align, align_lambda)
    r, k = Vt.shape
    square = r == k
    row_w = None
    if precond_inv is not None and precond_rows is not None:
        S2 = (S * S).to(Gxx.dtype)
        row_w = (1.0 / (S2 + float(precond_rows) * float(S2.max())))[:, None]

    def precondition(Xi):
        Z = Xi if row_w is None else Xi * row_w
        return Z @ precond_inv

    def cayley_along(R, A):
        return {"norm": float(torch.linalg.matrix_norm(A)), "go": lambda t: retract_cayley(R, A, t, cayley_inverse),
                "vel": A @ R}

    def polar_along(R, g):
        return {"norm": float(torch.linalg.matrix_norm(g)), "go": lambda t: retract_polar(R, t * g), "vel": g,
                "go_with": lambda t, RG, gG: retract_polar_with(R, t * g, RG, t * gG)}

    def retract_step(x, R, Xi):
        if square:
            B = Xi @ R.mT
            A = 0.5 * (B - B.mT)  # skew part: grad = A R
            out = cayley_along(R, A)
            # cg: directions are skew generators (velocity P R); they need no transport
            out.update(grad=A, transport=lambda P: P, along=lambda P: cayley_along(R, P))
            if precond_inv is not None:
                Bp = precondition(Xi) @ R.mT
                out["pgrad"] = 0.5 * (Bp - Bp.mT)
            return out
        g = riemannian_grad(R, Xi)
        out = polar_along(R, g)
        # cg: vector transport by projection onto the tangent space at R
        out.update(grad=g, transport=lambda P: riemannian_grad(R, P), along=lambda P: polar_along(R, P))
        if precond_inv is not None:
            out["pgrad"] = riemannian_grad(R, precondition(Xi))
        return out

    out = _descend(
        obj, Vt, _lipschitz(S, lam_max, c), retract_step, lambda x: x, eta=eta, eta_scale=eta_scale,
        delta=delta, max_steps=max_steps, max_backtracks=max_backtracks, track=track, RG0=RG0,
        delta_norm=delta_norm, direction_matmul=direction_matmul, rg_update=rg_update, rg_refresh=rg_refresh,
        rg_age=rg_age, method=method,
    )
    return _finish(obj, *out, drifts=square)


def solve_full(
    U: torch.Tensor,
    S: torch.Tensor,
    Vt: torch.Tensor,
    Gxx: torch.Tensor,
    Gyx: torch.Tensor,
    c: float,
    lam_max: float,
    *,
    eta: float = 1.0,
    eta_scale: str = "rayleigh",
    delta: float = 7e-4,
    max_steps: int = 100,
    max_backtracks: int = 30,
    align: Alignment | None = None,
    align_lambda: float = 0.0,
    track: bool = False,
    RG0: torch.Tensor | None = None,
    cayley_inverse: str = "newton_schulz",
    delta_norm: str = "rms",
    direction_matmul: str = "float32",
    rg_update: str = "product",
    rg_refresh: int = 0,
    rg_age: int = 0,
) -> RightResult:
    """Full right solve over ``Q_r in O(k)`` from ``Q = I`` with Cayley steps (ablation "converged
    two-sided rotation"; Sec. 4.1). Same objective as ``solve_reduced`` through ``R = Vt Q``; the
    Euclidean gradient is ``Vt^T Xi_R`` and the canonical direction ``skew(Xi_Q Q^T) Q``. Costs
    O(k^3) per step (``rg_update`` does not apply: every trial forms ``R Gxx``). Returns R = Vt Q
    and Q.
    """
    obj = ProfiledObjective(U, S, Gxx, Gyx, c, align, align_lambda)
    k = Vt.shape[1]
    Q0 = torch.eye(k, dtype=Vt.dtype, device=Vt.device)

    def retract_step(Q, R, Xi):
        XQ = Vt.mT @ Xi
        B = XQ @ Q.mT
        A = 0.5 * (B - B.mT)
        return {"norm": float(torch.linalg.matrix_norm(A)), "go": lambda t: retract_cayley(Q, A, t, cayley_inverse),
                "vel": Vt @ (A @ Q)}

    Q, R, ev, res, stop, eta_cur, hist = _descend(
        obj, Q0, _lipschitz(S, lam_max, c), retract_step, lambda Q: Vt @ Q, eta=eta,
        eta_scale=eta_scale, delta=delta, max_steps=max_steps, max_backtracks=max_backtracks,
        track=track, RG0=RG0, delta_norm=delta_norm, direction_matmul=direction_matmul, rg_age=rg_age,
    )
    return _finish(obj, Q, R, ev, res, stop, eta_cur, hist, Q=Q)
