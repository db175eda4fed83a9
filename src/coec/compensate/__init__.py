"""Post-pruning compensation of one module: none, bias (FLAP), lstsq (ridge), rcpu, coec.

    from coec.compensate import compensate
    out = compensate(W0, gram, mean, keep, "coec", alpha=0.9, align_lambda=50.0, value_proj=V)
    out.weight, out.bias, out.info

Inputs. W0 (d_out, d_in) original o_proj/down_proj weight (any float dtype/device); gram (d_in, d_in)
``sum_t x_t x_t^T`` or its mean (results do not depend on which: the Gram is normalised to unit
mean diagonal first); mean (d_in,) channel means (needed by "bias"; may be None otherwise);
keep (k,) sorted, unique kept column indices.

Options (all methods): ``device`` (None: W0's device), ``compute_dtype`` (None: float32 for
coec, also on CPU, where it halves the time per round against float64 with the same objective
history to ~1e-7; float32 on CUDA and float64 on CPU for the cheap baselines; the GCV/scale
scalars, the ridge solve and every reported error run in float64 regardless),
``n_tokens`` (None; if given, gram is a sum over that many tokens, and ``info`` also reports the
bias-aware error ``relerr_after_with_bias``).

Solver watchdog (App. B; not an option, since it does not change results): the device entries of
the SVD and eigh fallback chains run with a wall-clock limit, 600 s on CUDA and none on the CPU
by default; ``COEC_SOLVER_TIMEOUT`` (seconds, 0 = off) or ``watchdog.solver_timeout(s)`` set it,
and a timeout appears in ``info["svd_fallbacks"]`` as ``"<entry>:timeout"``.

lstsq: ``ridge=1e-2`` (lambda = ridge * mean(diag(Gxx)), Sec. 3.2).

coec (Algorithm 1; defaults = paper's App. B where it gives one):

=================  =============  ==========================================================
option             default        meaning / why
=================  =============  ==========================================================
alpha              0.9            Gram tempering G^alpha (Sec. 4.4, App. B)
rescale            "gcv"          "gcv" per-mode (Sec. 4.3) | "global" s* only (RCPU/ablation)
right              "stiefel"      "stiefel" reduced St(r,k) (Sec. 4.2) | "full" Q_r in O(k)
                                  (ablation "converged two-sided") | "none" (left-only)
align_lambda       0.0            lambda_a; the paper uses 50 on o_proj, 0 on down_proj: the
                                  caller knows the module, so the neutral 0 is the default
value_proj         None           (k, d_model) pruned v_proj in query-head layout; required when
                                  align_lambda > 0 with align="projector"
anchor_rank        16             r_p (Sec. 4.5)
align              "projector"    paper penalty | "angle": mean sin^2 of the principal angles to
                                  the anchor (App. C's measure; needs no value_proj)
max_rounds         50             alternation cap (App. B)
tol                1e-4           early stop on the change of the objective (App. B)
tol_mode           "relative"     App. B reads relative; Alg. 1 reads absolute ("absolute")
delta              7e-4           right-solve stop on the change of R below delta (App. B)
delta_norm         "rms"          how the change is measured: "rms" ||R_new - R||_F / sqrt(r)
                                  (per frame row: one delta for every width) | "fro"
                                  ||R_new - R||_F (unscaled; tighter by sqrt(r), ~64x at 8B)
kappa              10.0           per-mode dose band around s* sigma_i; None disables (App. B)
eta                1.0            right-solve step multiplier (the paper never gives eta);
                                  backtracking halves it when a step would raise the objective
eta_scale          "rayleigh"     step unit: "rayleigh" = exact line search of the quadratic
                                  model at fixed s (of the paper's eta/s^2 form, unit-free) |
                                  "lipschitz" = 1/(s^2 L0), L0 = 2 S_max^2 lambda_max(Gxx)/c |
                                  "raw" = 1/s^2 (paper's literal form; eta carries units)
max_inner_steps    100            cap on accepted right-solve steps per round
max_backtracks     30             halvings of eta before a right solve gives up
gcv_grid           (1e-4,1e5,120) lambda grid, log-spaced, times median(e_i) (App. B)
psd_clip           True           clip negative eigenvalues of G before the power (also at
                                  alpha = 1; otherwise the objective can be unbounded below)
temper_dtype       "float64"      dtype of the eigh of the full Gram (and of the reported errors)
left_polar         "auto"         polar factor of the left rotation: "svd" (paper's U V^T) |
                                  "eigh" (float64 eigh of A^T A, Newton–Schulz-refined until
                                  orthonormal; SVD fallback, recorded in svd_fallbacks, when
                                  the spectrum is unresolved, cond(A) > ~2e7; 10x faster on GPU
                                  at 4096) | "newton" (scaled Newton iteration on the QR
                                  factor, float64 LU inverses, refined; no A^T A, so no
                                  conditioning limit short of singular A) | "auto" = eigh on
                                  CUDA, svd on CPU
setup_svd          "auto"         the one-off factorisations: thin SVD of W_K and the anchor's
                                  and U_v's top-r_p frames: "svd" | "eigh" (float64 eigh of
                                  the smaller Gram, refined; SVD fallback as left_polar) |
                                  "auto" = eigh on CUDA, svd on CPU
cayley_inverse     "newton_schulz" inverse inside the Cayley retraction (square right solves,
                                  o_proj): "newton_schulz" (App. B) | "solve" (one LU solve,
                                  same retraction to round-off, fewer FLOPs)
direction_matmul   "float32"      the right solve's search direction and step size (not its
                                  evaluations or retraction): "tf32" runs their float32
                                  products on TF32 tensor cores, CUDA only (elsewhere, and
                                  with a float64 loop, they stay float32:
                                  info["direction_matmul_used"]). TF32 everywhere stops COEC
                                  early; in these blocks only, the final error stays within
                                  ~2 %, trajectory noise (emulated: benchmarks/tf32_precision.py);
                                  with rg_update carry the step size's g Gxx stays float32
rg_update          "auto"         how each right-solve trial's R Gxx (its evaluation) is formed:
                                  "product" (one (r, k, k) product per trial) | "carry"
                                  (polar retraction, r < k: carried through the step as
                                  F (R Gxx - t g Gxx) from the step size's g Gxx, which is then
                                  float32; no (r, k, k) product; equal in exact arithmetic) |
                                  "auto" = carry on CUDA, product on CPU (CPU results unchanged;
                                  info["rg_update_used"])
rg_refresh         4              with carry: form R Gxx by a product after this many carried
                                  updates (bounds the carried round-off; 0 = never)
=================  =============  ==========================================================

Readings of the paper (details in coec.py / stiefel.py / gcv.py): the right rotation acts on the
whole weight (R in St(r, k), r = min(d_out, k)), not per output slice; the rescale is the last
block of a round and is never allowed to raise the objective (it falls back to the global scale
if a mode re-ordering would raise the alignment term); a round that would raise the objective
(round-off) is undone and ends the loop, so ``objective_history`` is non-increasing.
"""

from __future__ import annotations

import math
import numbers
import time
from dataclasses import dataclass, field

import torch

from . import baselines
from .coec import COEC_DEFAULTS, coec
from .linalg import normalize_gram, relerr, relerr_with_bias

__all__ = ["Compensation", "compensate", "METHODS", "COMMON_DEFAULTS", "METHOD_DEFAULTS", "COEC_DEFAULTS"]

METHODS = ("none", "bias", "lstsq", "rcpu", "coec")
COMMON_DEFAULTS: dict = {"device": None, "compute_dtype": None, "n_tokens": None}
METHOD_DEFAULTS: dict = {
    "none": {},
    "bias": {},
    "lstsq": {"ridge": 1e-2},
    "rcpu": {},
    "coec": COEC_DEFAULTS,
}


@dataclass
class Compensation:
    """Result of ``compensate``: weight (d_out, k) and bias (d_out,) or None, in W0's dtype/device;
    info: JSON-serialisable diagnostics (floats, ints, str, lists, dicts; non-finite -> None)."""

    weight: torch.Tensor
    bias: torch.Tensor | None = None
    info: dict = field(default_factory=dict)


# ----------------------------------------------------------------------------- validation


def _fail(msg: str):
    raise ValueError(msg)


def _check_tensor(name: str, t, ndim: int):
    if not isinstance(t, torch.Tensor):
        _fail(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.ndim != ndim:
        _fail(f"{name} must be {ndim}-D, got shape {tuple(t.shape)}")
    if not t.is_floating_point():
        _fail(f"{name} must be a floating-point tensor, got {t.dtype}")
    if not bool(torch.isfinite(t).all()):
        _fail(f"{name} contains NaN or Inf")


def _check_keep(keep, d_in: int) -> torch.Tensor:
    if not isinstance(keep, torch.Tensor):
        try:
            keep = torch.as_tensor(keep)
        except Exception as exc:  # noqa: BLE001
            _fail(f"keep must be a 1-D integer tensor: {exc}")
    if keep.ndim != 1:
        _fail(f"keep must be 1-D, got shape {tuple(keep.shape)}")
    if keep.numel() == 0:
        _fail("keep is empty: at least one column must be kept")
    if keep.dtype.is_floating_point or keep.dtype == torch.bool or keep.is_complex():
        _fail(f"keep must hold integer indices, got dtype {keep.dtype}")
    keep = keep.to(torch.long)
    lo, hi = int(keep.min()), int(keep.max())
    if lo < 0 or hi >= d_in:
        _fail(f"keep index out of range [0, {d_in}): min {lo}, max {hi}")
    d = keep[1:] - keep[:-1]
    if bool((d == 0).any()):
        _fail("keep has duplicate indices")
    if bool((d < 0).any()):
        _fail("keep must be sorted ascending")
    return keep


def _num(name, v, lo=None, hi=None, lo_open=False, integer=False, allow_none=False):
    if v is None and allow_none:
        return
    ok_type = isinstance(v, numbers.Integral) if integer else isinstance(v, numbers.Real)
    if isinstance(v, bool) or not ok_type or not math.isfinite(float(v)):
        _fail(f"option {name} must be a finite {'integer' if integer else 'number'}, got {v!r}")
    if lo is not None and (v < lo or (lo_open and v == lo)):
        _fail(f"option {name} must be {'>' if lo_open else '>='} {lo}, got {v!r}")
    if hi is not None and v > hi:
        _fail(f"option {name} must be <= {hi}, got {v!r}")


def _choice(name, v, choices):
    if v not in choices:
        _fail(f"option {name} must be one of {choices}, got {v!r}")


def _dtype_opt(name, v, allow_none=True):
    if v is None and allow_none:
        return
    ok = v in (torch.float32, torch.float64) or v in ("float32", "float64")
    if not ok:
        _fail(f"option {name} must be 'float32' or 'float64' (or the torch dtype), got {v!r}")


def _validate_coec(o: dict, k: int, d_out: int):
    _num("alpha", o["alpha"], 0.0, 1.0, lo_open=True)
    _choice("rescale", o["rescale"], ("gcv", "global"))
    _choice("right", o["right"], ("stiefel", "full", "none"))
    _choice("align", o["align"], ("projector", "angle"))
    _choice("tol_mode", o["tol_mode"], ("relative", "absolute"))
    _choice("eta_scale", o["eta_scale"], ("rayleigh", "lipschitz", "raw"))
    _num("align_lambda", o["align_lambda"], 0.0)
    _num("anchor_rank", o["anchor_rank"], 1, integer=True)
    _num("max_rounds", o["max_rounds"], 0, integer=True)
    _num("max_inner_steps", o["max_inner_steps"], 1, integer=True)
    _num("max_backtracks", o["max_backtracks"], 0, integer=True)
    _num("tol", o["tol"], 0.0)
    _num("delta", o["delta"], 0.0, lo_open=True)
    _num("eta", o["eta"], 0.0, lo_open=True)
    if o["kappa"] is not None:
        _num("kappa", o["kappa"], 1.0)
    if not isinstance(o["psd_clip"], bool):
        _fail(f"option psd_clip must be a bool, got {o['psd_clip']!r}")
    _dtype_opt("temper_dtype", o["temper_dtype"], allow_none=False)
    _choice("left_polar", o["left_polar"], ("auto", "svd", "eigh", "newton"))
    _choice("setup_svd", o["setup_svd"], ("auto", "svd", "eigh"))
    _choice("cayley_inverse", o["cayley_inverse"], ("newton_schulz", "solve"))
    _choice("direction_matmul", o["direction_matmul"], ("float32", "tf32"))
    _choice("rg_update", o["rg_update"], ("auto", "product", "carry"))
    _num("rg_refresh", o["rg_refresh"], 0, integer=True)
    _choice("delta_norm", o["delta_norm"], ("rms", "fro"))
    g = o["gcv_grid"]
    if not (isinstance(g, (tuple, list)) and len(g) == 3):
        _fail(f"option gcv_grid must be (lo, hi, n), got {g!r}")
    _num("gcv_grid[0]", g[0], 0.0, lo_open=True)
    _num("gcv_grid[1]", g[1], 0.0, lo_open=True)
    _num("gcv_grid[2]", g[2], 2, integer=True)
    if not g[0] < g[1]:
        _fail(f"option gcv_grid needs lo < hi, got {g!r}")
    r = min(d_out, k)
    vp = o["value_proj"]
    if vp is not None:
        _check_tensor("value_proj", vp, 2)
        if vp.shape[0] != k:
            _fail(f"value_proj must have k = len(keep) = {k} rows (query-head layout), got shape {tuple(vp.shape)}")
    if o["align_lambda"] > 0 and o["align"] == "projector" and vp is None:
        _fail("align_lambda > 0 with align='projector' requires value_proj (k x d_model pruned v_proj)")
    if (o["align_lambda"] > 0 or vp is not None) and o["anchor_rank"] > min(r, vp.shape[1] if vp is not None else r):
        _fail(f"option anchor_rank={o['anchor_rank']} exceeds the available rank {min(r, vp.shape[1] if vp is not None else r)}")


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, bool) or x is None or isinstance(x, str):
        return x
    if isinstance(x, numbers.Integral):
        return int(x)
    if isinstance(x, numbers.Real):
        x = float(x)
        return x if math.isfinite(x) else None
    if isinstance(x, torch.dtype):
        return str(x).replace("torch.", "")
    if isinstance(x, torch.device):
        return str(x)
    return str(x)


# ----------------------------------------------------------------------------- public API


def compensate(W0, gram, mean, keep, method: str, **options) -> Compensation:
    """Compensate one pruned module (paper Sec. 3–4). See the module docstring for the options.

    W0 (d_out, d_in), gram (d_in, d_in) (sum or mean), mean (d_in,) or None, keep (k,) sorted
    unique; method in {"none", "bias", "lstsq", "rcpu", "coec"}. Returns ``Compensation`` with
    weight (d_out, k) and bias (d_out,) | None in W0's dtype/device, and ``info`` with at least
    relerr_before / relerr_after (untempered metric), rounds, inner_steps, gcv_lambdas,
    gcv_at_grid_end, objective_history, seconds, svd_fallbacks, scale_skipped, kappa_clamped.
    Raises ValueError naming the problem for bad input or an unknown method/option.
    """
    t0 = time.perf_counter()
    if not isinstance(method, str) or method not in METHODS:
        _fail(f"unknown method {method!r}; expected one of {METHODS}")
    allowed = {**COMMON_DEFAULTS, **METHOD_DEFAULTS[method]}
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        _fail(f"unknown option(s) {unknown} for method {method!r}; allowed: {sorted(allowed)}")
    o = {**allowed, **options}

    _check_tensor("W0", W0, 2)
    _check_tensor("gram", gram, 2)
    d_out, d_in = W0.shape
    if tuple(gram.shape) != (d_in, d_in):
        _fail(f"gram shape {tuple(gram.shape)} does not match W0 shape {tuple(W0.shape)}: expected ({d_in}, {d_in})")
    if mean is not None:
        _check_tensor("mean", mean, 1)
        if mean.shape[0] != d_in:
            _fail(f"mean has {mean.shape[0]} entries, expected d_in = {d_in}")
    elif method == "bias":
        _fail("method 'bias' requires mean (d_in,) channel means")
    keep = _check_keep(keep, d_in)
    k = keep.numel()
    _dtype_opt("compute_dtype", o["compute_dtype"])
    _num("n_tokens", o["n_tokens"], 0, lo_open=True, allow_none=True)
    if method == "lstsq":
        _num("ridge", o["ridge"], 0.0)
    if method == "coec":
        _validate_coec(o, k, d_out)

    dev = torch.device(o["device"]) if o["device"] is not None else W0.device
    cdt = o["compute_dtype"]
    if cdt is None:  # coec: float32 (2x faster per round on CPU, same history to ~1e-7)
        cdt = torch.float64 if (dev.type == "cpu" and method != "coec") else torch.float32
    cdt = cdt if isinstance(cdt, torch.dtype) else getattr(torch, cdt)
    keep_d = keep.to(dev)
    b = None
    if method == "coec":
        co = {key: o[key] for key in COEC_DEFAULTS}
        W, info = coec(W0, gram, keep_d, co, device=dev, compute_dtype=cdt)
    else:
        G64 = normalize_gram(gram.to(dev, torch.float64))
        G = G64.to(cdt)
        W0c = W0.to(dev, cdt)
        info = {"method": method, "compute_dtype": str(cdt).replace("torch.", ""), "device": str(dev)}
        if method == "none":
            W = baselines.none(W0c, keep_d)
        elif method == "bias":
            W, b = baselines.bias(W0c, mean.to(dev, cdt), keep_d)
        elif method == "lstsq":
            W = baselines.lstsq(W0c, G, keep_d, float(o["ridge"]))
            info["ridge"] = float(o["ridge"])
        else:
            fb: list = []
            W, ri = baselines.rcpu(W0c, G, keep_d, fb)
            info.update(scale=ri["scale"], scale_skipped=0 if ri["scale_ok"] else 1, svd_fallbacks=fb)
        W64 = W0.to(dev, torch.float64)  # reported errors in float64
        WG = W64 @ G64
        Gxx, Gyx, c = G64[keep_d][:, keep_d], WG[:, keep_d], float((WG * W64).sum())
        info["relerr_before"] = relerr(W64[:, keep_d], Gxx, Gyx, c)
        info["relerr_after"] = relerr(W, Gxx, Gyx, c)
        info.setdefault("scale_skipped", 0)
        info.setdefault("svd_fallbacks", [])
        info.update(
            rounds=0, inner_steps=0, inner_steps_per_round=[], objective_history=[], gcv_lambdas=[],
            gcv_lambdas_rel=[], gcv_at_grid_end={"low": 0, "high": 0}, kappa_clamped=0,
        )
    if o["n_tokens"] is not None and mean is not None:
        gm = gram.to(dev, torch.float64) / float(o["n_tokens"])
        gm = 0.5 * (gm + gm.mT)
        info["relerr_after_with_bias"] = relerr_with_bias(
            W, b, W0.to(dev, torch.float64), gm, mean.to(dev, torch.float64), keep_d
        )
    info["seconds"] = time.perf_counter() - t0
    weight = W.to(W0.device, W0.dtype).contiguous()
    bias_out = b.to(W0.device, W0.dtype) if b is not None else None
    return Compensation(weight=weight, bias=bias_out, info=_jsonable(info))
