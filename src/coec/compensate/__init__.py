"""Post-pruning compensation of one module: none, bias (FLAP), lstsq (ridge), rcpu, coec, and
blend (beyond the paper: COEC and ridge with an intercept, blended on held-out tokens).

    from coec.compensate import compensate
    out = compensate(W0, gram, mean, keep, "coec", alpha=0.9, align_lambda=50.0, value_proj=V)
    out.weight, out.bias, out.info

Inputs. W0 (d_out, d_in) original o_proj/down_proj weight (any float dtype/device); gram (d_in, d_in)
``sum_t x_t x_t^T`` or its mean (results do not depend on which: the Gram is normalised to unit
mean diagonal first); mean (d_in,) channel means (needed by "bias"; may be None otherwise);
keep (k,) sorted, unique kept column indices.

Options: one dataclass per method in ``coec.compensate.options`` (defaults, one-line docs, the
allowed values, and which are the paper's hyperparameters and which solver switches), rendered
as docs/compensation-options.md. Every method takes ``device`` (None: W0's device),
``compute_dtype`` (None: float32 for coec; float32 on CUDA and float64 on CPU for the cheap
baselines; the GCV/scale scalars, the ridge solve and every reported error run in float64
regardless) and ``n_tokens`` (the tokens gram sums over; required by the methods that return a
bias, bias and blend, whose error needs the Gram's scale); lstsq takes ``ridge``; coec
Algorithm 1's options (``alpha``, ``align_lambda``, ``max_rounds``, ...).

Reported errors (``info``): ``relerr_before`` of the pruned weight W0[:, K], ``relerr_after`` of
the module as the method returns it (with its bias, if any; then ``relerr_after_weight_only``
too), all from one float64 product per module (``linalg.OutputError``).

Solver watchdog (App. B; not an option, since it does not change results): the device entries of
the SVD and eigh fallback chains run with a wall-clock limit, 600 s on CUDA and none on the CPU
by default; ``COEC_SOLVER_TIMEOUT`` (seconds, 0 = off) or ``watchdog.solver_timeout(s)`` set it,
and a timeout appears in ``info["svd_fallbacks"]`` as ``"<entry>:timeout"``.

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

from . import baselines, blend
from . import options as _options
from .coec import COEC_DEFAULTS, coec
from .linalg import OutputError, gram_psd, gram_scale, normalize_gram, psd_project

__all__ = ["Compensation", "compensate", "METHODS", "COMMON_DEFAULTS", "METHOD_DEFAULTS", "COEC_DEFAULTS"]

# the options, their defaults and checks live in coec.compensate.options (one dataclass per method)
METHODS = _options.METHODS
COMMON_DEFAULTS: dict = _options.defaults("none")
METHOD_DEFAULTS: dict = {m: _options.defaults(m, common=False) for m in METHODS}


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


def _validate_coec(o: dict, k: int, d_out: int):
    """The checks of the coec options that depend on the data (the rest: ``options.resolve``)."""
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


def _mean_gram(gram: torch.Tensor, n_tokens, dev, psd: dict) -> torch.Tensor:
    """``E[x x^T]`` in float64 from a Gram summed over ``n_tokens``, symmetrised, with the same
    PSD projection as the errors when ``psd`` (a ``gram_psd`` outcome) says it was indefinite."""
    gm = gram.to(dev, torch.float64) / float(n_tokens)
    gm = 0.5 * (gm + gm.mT)
    return psd_project(gm)[0] if psd.get("indefinite") else gm


def _validate_blend(o: dict, k: int, d_out: int, d_in: int):
    """The checks of the blend options that depend on the data."""
    bw = o["base_weight"]
    if bw is None:
        _fail("method 'blend' requires base_weight (the base compensation's (d_out, k) weight)")
    _check_tensor("base_weight", bw, 2)
    if tuple(bw.shape) != (d_out, k):
        _fail(f"base_weight shape {tuple(bw.shape)} does not match (d_out, k) = ({d_out}, {k})")
    if o["base_bias"] is not None:
        _check_tensor("base_bias", o["base_bias"], 1)
        if o["base_bias"].shape[0] != d_out:
            _fail(f"base_bias has {o['base_bias'].shape[0]} entries, expected d_out = {d_out}")
    if o["n_tokens"] is None:
        _fail("method 'blend' requires n_tokens (the Gram's token count) for its intercept and errors")
    if o["mix"] == "holdout" and o["holdout_gram"] is None:
        _fail("blend with mix 'holdout' requires holdout_gram, holdout_mean and holdout_count "
              "(the held-out calibration set's statistics)")
    if o["holdout_gram"] is not None:
        _check_tensor("holdout_gram", o["holdout_gram"], 2)
        if tuple(o["holdout_gram"].shape) != (d_in, d_in):
            _fail(f"holdout_gram shape {tuple(o['holdout_gram'].shape)}, expected ({d_in}, {d_in})")
        if o["holdout_mean"] is None or o["holdout_count"] is None:
            _fail("holdout_gram needs holdout_mean and holdout_count too")
        _check_tensor("holdout_mean", o["holdout_mean"], 1)
        if o["holdout_mean"].shape[0] != d_in:
            _fail(f"holdout_mean has {o['holdout_mean'].shape[0]} entries, expected d_in = {d_in}")


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
    unique; method in {"none", "bias", "lstsq", "rcpu", "coec", "blend"}. Returns ``Compensation`` with
    weight (d_out, k) and bias (d_out,) | None in W0's dtype/device, and ``info`` with at least
    relerr_before / relerr_after (untempered metric; relerr_after with the bias), rounds, inner_steps, gcv_lambdas,
    gcv_at_grid_end, objective_history, seconds, svd_fallbacks, scale_skipped, kappa_clamped.
    Raises ValueError naming the problem for bad input or an unknown method/option.
    """
    t0 = time.perf_counter()
    o = _options.as_dict(_options.resolve(method, options))  # unknown method/option, bad values

    _check_tensor("W0", W0, 2)
    _check_tensor("gram", gram, 2)
    d_out, d_in = W0.shape
    if tuple(gram.shape) != (d_in, d_in):
        _fail(f"gram shape {tuple(gram.shape)} does not match W0 shape {tuple(W0.shape)}: expected ({d_in}, {d_in})")
    if mean is not None:
        _check_tensor("mean", mean, 1)
        if mean.shape[0] != d_in:
            _fail(f"mean has {mean.shape[0]} entries, expected d_in = {d_in}")
    elif method in ("bias", "blend"):
        _fail(f"method {method!r} requires mean (d_in,) channel means")
    if method == "bias" and o["n_tokens"] is None:
        _fail("method 'bias' requires n_tokens (the Gram's token count) for the error of its bias")
    keep = _check_keep(keep, d_in)
    k = keep.numel()
    if method == "coec":
        _validate_coec(o, k, d_out)
    if method == "blend":
        _validate_blend(o, k, d_out, d_in)

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
        fb: list = []
        g64 = gram.to(dev, torch.float64)
        # App. B: an indefinite Gram is replaced by its PSD projection (solves and errors)
        G64, psd = gram_psd(normalize_gram(g64), fb)
        G = G64.to(cdt)
        W0c = W0.to(dev, cdt)
        info = {"method": method, "compute_dtype": str(cdt).replace("torch.", ""), "device": str(dev),
                "gram_psd": psd}
        if method == "none":
            W = baselines.none(W0c, keep_d)
        elif method == "bias":
            W, b = baselines.bias(W0c, mean.to(dev, cdt), keep_d)
        elif method == "lstsq":
            W = baselines.lstsq(W0c, G, keep_d, float(o["ridge"]))
            info["ridge"] = float(o["ridge"])
        elif method == "blend":
            gm = _mean_gram(gram, o["n_tokens"], dev, psd)
            W, b, bi = blend.blend(W0c, G, gm, mean.to(dev, torch.float64), keep_d, o)
            info.update(bi)
        else:
            W, ri = baselines.rcpu(W0c, G, keep_d, fb)
            info.update(scale=ri["scale"], scale_skipped=0 if ri["scale_ok"] else 1, svd_fallbacks=fb)
        # reported errors: float64, untempered, one (d_out, d_in, d_in) product for all of them
        n = o["n_tokens"]
        err = OutputError(W0.to(dev, torch.float64), G64, keep_d,
                          mean.to(dev, torch.float64) if mean is not None else None,
                          gram_scale(g64) / float(n) if n is not None else None)  # E[x x^T] = scale G64
        info["relerr_before"] = err(W0.to(dev, torch.float64)[:, keep_d])
        # none and bias keep W0[:, K]: their weight's error is the pruned one
        weight_only = info["relerr_before"] if method in ("none", "bias") else err(W)
        if b is None:
            info["relerr_after"] = weight_only
        else:  # what the method did: the module with its bias
            info["relerr_after"] = err(W, b)
            info["relerr_after_weight_only"] = weight_only
        info.setdefault("scale_skipped", 0)
        info.setdefault("svd_fallbacks", fb)
        info.update(
            rounds=0, inner_steps=0, inner_steps_per_round=[], objective_history=[], gcv_lambdas=[],
            gcv_lambdas_rel=[], gcv_at_grid_end={"low": 0, "high": 0}, kappa_clamped=0,
        )
    info["seconds"] = time.perf_counter() - t0
    weight = W.to(W0.device, W0.dtype).contiguous()
    bias_out = b.to(W0.device, W0.dtype) if b is not None else None
    return Compensation(weight=weight, bias=bias_out, info=_jsonable(info))
