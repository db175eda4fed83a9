"""Typed options of every compensation method: one dataclass per method, defaults, one-line docs
and value checks in one place.

Each field carries ``metadata``: ``group`` (``"paper"``: a hyperparameter of the paper's method,
App. B defaults where it gives one; ``"method"``: a design choice of this project's own method
beyond the paper (blend); ``"solver"``: how the same objective is computed, backends and
caps; ``"stage"``: supplied by the compensate stage, not settable in a config), ``doc`` (one
line) and ``check`` (the allowed values, which also render in docs/compensation-options.md).

    from coec.compensate.options import resolve, validate_spec
    o = resolve("coec", {"alpha": 0.8})          # CoecOptions, checked; raises ValueError
    validate_spec(cfg["compensations"]["coec"], "compensations.coec")   # config time

``compensate()`` resolves its keyword options through :func:`resolve`, and the config validation
(``coec.config.validate_config``) runs :func:`validate_spec` on every ``compensations.<name>``
entry, so a typo or a bad value stops ``snakemake -n`` with one line naming the key.

Longer notes on a few options:

* ``compute_dtype`` None for coec means float32 also on the CPU, where it halves the time per
  round against float64 with the same objective history to ~1e-7.
* ``align_lambda``: the paper uses 50 on o_proj and 0 on down_proj; the caller knows the module,
  so the neutral 0 is the default and configs set 50 under ``o_proj:``.
* ``eta_scale``: "rayleigh" is the exact line search of the quadratic model at fixed s (of the
  paper's eta/s^2 form, unit-free); "lipschitz" uses L0 = 2 S_max^2 lambda_max(Gxx)/c; "raw" is
  the paper's literal 1/s^2, where eta carries units.
* ``setup_svd``: the thin SVD of W_K and the anchor's and U_v's top-r_p frames; "eigh" is the
  float64 eigh of the smaller Gram, refined, with an SVD fallback as for ``left_polar``.
* ``cayley_inverse``: "solve" gives the same retraction to round-off with fewer FLOPs.

* ``left_polar``: "eigh" is the float64 eigh of A^T A, Newton–Schulz-refined until orthonormal,
  with an SVD fallback (recorded in svd_fallbacks) when cond(A) > ~2e7; about 10x faster than the
  SVD on a GPU at 4096. "newton" is a scaled Newton iteration on the QR factor (float64 LU
  inverses, refined), with no conditioning limit short of a singular A.
* ``direction_matmul``: "tf32" runs the float32 products of the right solve's search direction
  and step size on TF32 tensor cores (CUDA, float32 loop only; elsewhere they stay float32:
  ``info["direction_matmul_used"]``); in these blocks only, the final error stays within ~2 %
  (trajectory noise; emulated in benchmarks/tf32_precision.py), while TF32 everywhere stops COEC
  early. With rg_update carry the step size's g Gxx stays float32.
* ``rg_update``: "carry" carries R Gxx through a polar-retraction step as F (R Gxx - t g Gxx)
  from the step size's g Gxx (then float32), with no (r, k, k) product; equal in exact arithmetic.
  "auto" leaves CPU results unchanged (``info["rg_update_used"]``); ``rg_refresh`` bounds the
  carried round-off.
* ``delta_norm``: "rms" measures ||R_new - R||_F / sqrt(r) (one delta for every width); "fro" is
  unscaled and so tighter by sqrt(r) (~64x at 8B).
"""

from __future__ import annotations

import difflib
import re
import math
import numbers
from dataclasses import dataclass, field, fields

__all__ = ["OPTIONS", "METHODS", "MODULES", "resolve", "as_dict", "validate_spec", "defaults",
           "option_fields", "config_keys", "markdown"]

MODULES = ("o_proj", "down_proj")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


# ----------------------------------------------------------------------------- value checks
class _Check:
    """A value check with a human-readable description (used in errors and the docs)."""

    def __init__(self, desc: str, fn):
        self.desc, self.fn = desc, fn

    def __call__(self, name: str, v) -> None:
        self.fn(name, v)

    def __str__(self) -> str:
        return self.desc


def _fail(msg: str):
    raise ValueError(msg)


def _is_num(v, integer: bool) -> bool:
    ok = isinstance(v, numbers.Integral) if integer else isinstance(v, numbers.Real)
    return ok and not isinstance(v, bool) and math.isfinite(float(v))


def number(lo=None, hi=None, lo_open=False, integer=False, allow_none=False) -> _Check:
    kind = "integer" if integer else "number"
    parts = []
    if lo is not None:
        parts.append(f"{'>' if lo_open else '>='} {lo:g}")
    if hi is not None:
        parts.append(f"<= {hi:g}")
    desc = f"{kind}{' ' + ', '.join(parts) if parts else ''}{' or null' if allow_none else ''}"

    def fn(name, v):
        if v is None and allow_none:
            return
        if not _is_num(v, integer):
            _fail(f"option {name} must be a finite {kind}, got {v!r}")
        if lo is not None and (v < lo or (lo_open and v == lo)):
            _fail(f"option {name} must be {'>' if lo_open else '>='} {lo}, got {v!r}")
        if hi is not None and v > hi:
            _fail(f"option {name} must be <= {hi}, got {v!r}")

    return _Check(desc, fn)


def choice(*choices) -> _Check:
    def fn(name, v):
        if isinstance(v, bool) or v not in choices:
            _fail(f"option {name} must be one of {choices}, got {v!r}")

    return _Check(" | ".join(f"`{c}`" for c in choices), fn)


def boolean() -> _Check:
    def fn(name, v):
        if not isinstance(v, bool):
            _fail(f"option {name} must be a bool, got {v!r}")

    return _Check("true | false", fn)


def float_dtype(allow_none=True) -> _Check:
    def fn(name, v):
        if v is None and allow_none:
            return
        try:
            import torch

            is_dtype = v in (torch.float32, torch.float64)
        except Exception:  # noqa: BLE001 - a non-dtype value compares unequal or raises
            is_dtype = False
        if not (is_dtype or v in ("float32", "float64")):
            _fail(f"option {name} must be 'float32' or 'float64' (or the torch dtype), got {v!r}")

    return _Check("`float32` | `float64`" + (" | null" if allow_none else ""), fn)


def gcv_grid() -> _Check:
    def fn(name, g):
        if not (isinstance(g, (tuple, list)) and len(g) == 3):
            _fail(f"option {name} must be (lo, hi, n), got {g!r}")
        number(0.0, lo_open=True)(f"{name}[0]", g[0])
        number(0.0, lo_open=True)(f"{name}[1]", g[1])
        number(2, integer=True)(f"{name}[2]", g[2])
        if not g[0] < g[1]:
            _fail(f"option {name} needs lo < hi, got {g!r}")

    return _Check("[lo, hi, n], 0 < lo < hi, n >= 2", fn)


def device() -> _Check:
    def fn(name, v):
        if v is not None and not isinstance(v, str) and type(v).__name__ != "device":
            _fail(f"option {name} must be a device name, got {v!r}")

    return _Check("device or null", fn)


def name_or_none(allow_none: bool = False) -> _Check:
    def fn(name, v):
        if v is None and allow_none:
            return
        if not isinstance(v, str) or not _NAME.match(v):
            _fail(f"option {name}={v!r}: must be a config entry name ([A-Za-z0-9][A-Za-z0-9._-]*)")
    return _Check("a config entry name" + (" or null" if allow_none else ""), fn)


def tensor_or_none() -> _Check:
    return _Check("(k, d_model) tensor or null", lambda name, v: None)  # checked by compensate()


def opt(default, doc: str, check: _Check, group: str = "solver"):
    """A dataclass field with its group, one-line doc and value check."""
    return field(default=default, metadata={"group": group, "doc": doc, "check": check})


# ----------------------------------------------------------------------------- the methods
@dataclass
class CommonOptions:
    """Options of every method."""

    compute_dtype: object = opt(None, "dtype of the solve (null: float32 for coec; float64 on the CPU and "
                                      "float32 on CUDA for the baselines); the ridge solve, scale scalars "
                                      "and reported errors run in float64 regardless", float_dtype())
    device: object = opt(None, "where the solve runs (the stage's --device)", device(), "stage")
    n_tokens: object = opt(None, "tokens the Gram sums over (the stage passes the calibration count); "
                                 "required by bias and blend (the error of a bias needs the Gram's scale)",
                           number(0, lo_open=True, allow_none=True), "stage")


@dataclass
class NoneOptions(CommonOptions):
    """none: prune only, ``W0[:, K]`` (Wanda-sp)."""


@dataclass
class BiasOptions(CommonOptions):
    """bias: FLAP's bias compensation ``b = W0[:, P] mean[P]``."""


@dataclass
class LstsqOptions(CommonOptions):
    """lstsq: ridge refit ``Gyx (Gxx + lambda I)^-1`` (Sec. 3.2)."""

    ridge: float = opt(1e-2, "lambda = ridge * mean(diag(Gxx)) (Sec. 3.2)", number(0.0), "paper")


@dataclass
class RcpuOptions(CommonOptions):
    """rcpu: left rotation polar(Gyx W_K^T) and the global scale s* (RCPU)."""


@dataclass
class CoecOptions(CommonOptions):
    """coec: Algorithm 1 (Sec. 4, App. B); defaults are the paper's where it gives one."""

    alpha: float = opt(0.9, "Gram tempering G^alpha (Sec. 4.4, App. B)", number(0.0, 1.0, lo_open=True), "paper")
    rescale: str = opt("gcv", "gcv: per-mode GCV rescale (Sec. 4.3) | global: s* only (RCPU / ablation)",
                       choice("gcv", "global"), "paper")
    right: str = opt("stiefel", "right rotation: stiefel = reduced St(r, k) (Sec. 4.2) | full = Q_r in O(k) "
                                "(ablation) | none = left-only", choice("stiefel", "full", "none"), "paper")
    align_lambda: float = opt(0.0, "lambda_a of the anchored alignment; the paper uses 50 on o_proj, 0 on "
                                   "down_proj (set it per module)", number(0.0), "paper")
    value_proj: object = opt(None, "the pruned v_proj in query-head layout, (k, d_model); the stage passes "
                                   "it on o_proj when align_lambda > 0", tensor_or_none(), "stage")
    anchor_rank: int = opt(16, "r_p, rank of the alignment anchor (Sec. 4.5)", number(1, integer=True), "paper")
    align: str = opt("projector", "projector: the paper's penalty | angle: mean sin^2 of the principal angles "
                                  "to the anchor (App. C's measure; needs no value_proj)",
                     choice("projector", "angle"), "paper")
    max_rounds: int = opt(50, "cap on alternation rounds (App. B)", number(0, integer=True), "paper")
    tol: float = opt(1e-4, "early stop on the change of the objective (App. B)", number(0.0), "paper")
    tol_mode: str = opt("relative", "relative (App. B's reading) | absolute (Alg. 1's reading) change of the "
                                    "objective", choice("relative", "absolute"), "paper")
    delta: float = opt(7e-4, "right-solve stop: change of R below delta (App. B)", number(0.0, lo_open=True),
                       "paper")
    delta_norm: str = opt("rms", "how the change of R is measured: rms = ||dR||_F / sqrt(r) | fro = ||dR||_F",
                          choice("rms", "fro"), "paper")
    kappa: object = opt(10.0, "per-mode dose band around s* sigma_i; null disables (App. B)",
                        number(1.0, allow_none=True), "paper")
    eta: float = opt(1.0, "right-solve step multiplier (the paper gives none); backtracking halves it",
                     number(0.0, lo_open=True))
    eta_scale: str = opt("rayleigh", "step unit: rayleigh = exact line search of the quadratic model | "
                                     "lipschitz = 1/(s^2 L0) | raw = 1/s^2 (eta carries units)",
                         choice("rayleigh", "lipschitz", "raw"))
    right_solver: str = opt("gd", "reduced-Stiefel right solve: gd = Riemannian gradient steps (Alg. 1) | cg = "
                                  "Polak-Ribiere+ conjugate directions (beyond the paper)", choice("gd", "cg"))
    precondition: str = opt("none", "right-solve metric: none = Riemannian gradient (Alg. 1) | gram = directions "
                                    "(Xi (Gxx + mu I)^-1) projected | newton = also rows / (S^2 + mu max S^2), the "
                                    "Newton direction at fixed scale (beyond the paper)",
                            choice("none", "gram", "newton"))
    precondition_damping: float = opt(3.0, "mu of precondition, relative to mean(diag Gxx) (and to max S^2 for "
                                            "newton's rows)", number(0.0, lo_open=True))
    max_inner_steps: int = opt(100, "cap on accepted right-solve steps per round", number(1, integer=True))
    max_backtracks: int = opt(30, "halvings of eta before a right solve gives up", number(0, integer=True))
    gcv_grid: tuple = opt((1e-4, 1e5, 120), "GCV lambda grid (lo, hi, n), log-spaced, times median(e_i) "
                                            "(App. B)", gcv_grid(), "paper")
    psd_clip: bool = opt(True, "clip negative eigenvalues of G before the power, also at alpha = 1 "
                               "(App. B; else the objective can be unbounded below)", boolean(), "paper")
    temper_dtype: str = opt("float64", "dtype of the eigh of the full Gram and of the reported errors",
                            float_dtype(allow_none=False))
    left_polar: str = opt("auto", "polar factor of the left rotation: svd (paper's U V^T) | eigh | newton | "
                                  "auto = eigh on CUDA, svd on CPU", choice("auto", "svd", "eigh", "newton"))
    setup_svd: str = opt("auto", "one-off factorisations (thin SVD of W_K, anchor frames): svd | eigh | "
                                 "auto = eigh on CUDA, svd on CPU", choice("auto", "svd", "eigh"))
    cayley_inverse: str = opt("newton_schulz", "inverse inside the Cayley retraction (square right solves): "
                                               "newton_schulz (App. B) | solve (one LU solve)",
                              choice("newton_schulz", "solve"))
    direction_matmul: str = opt("float32", "right-solve direction and step size products: float32 | tf32 "
                                           "(CUDA tensor cores)", choice("float32", "tf32"))
    rg_update: str = opt("auto", "each trial's R Gxx: product | carry (no (r, k, k) product) | auto = carry "
                                 "on CUDA, product on CPU", choice("auto", "product", "carry"))
    rg_refresh: int = opt(4, "with carry: form R Gxx by a product after this many carried updates "
                             "(0 = never)", number(0, integer=True))


@dataclass
class BlendOptions(CommonOptions):
    """blend (beyond the paper): a base compensation's weights (COEC) and ridge, each with the best
    intercept, blended per module by the beta in [0, 1] that minimises the error on held-out
    calibration tokens (docs/blend.md)."""

    base: str = opt("coec", "the `compensations` entry whose weights are blended (its cell is an input)",
                    name_or_none(), "method")
    holdout: object = opt(None, "the `calibration` entry (disjoint_from the cell's) whose Grams choose beta; "
                                "needed by mix holdout", name_or_none(allow_none=True), "method")
    mix: str = opt("holdout", "holdout: beta fitted on the held-out Grams | base: beta 0 | ridge: beta 1",
                   choice("holdout", "base", "ridge"), "method")
    intercept: bool = opt(True, "add the best bias b = W0 m - W m_K (ridge on centred statistics)", boolean(),
                          "method")
    ridge: float = opt(1e-2, "lambda = ridge * mean(diag(Gxx)) of the ridge end (as lstsq)", number(0.0), "method")
    base_weight: object = opt(None, "the base cell's weight (d_out, k); the stage passes it", tensor_or_none(),
                              "stage")
    base_bias: object = opt(None, "the base cell's bias (d_out,) or null; the stage passes it", tensor_or_none(),
                            "stage")
    holdout_gram: object = opt(None, "the held-out Gram (a sum); the stage passes it", tensor_or_none(), "stage")
    holdout_mean: object = opt(None, "the held-out channel means; the stage passes it", tensor_or_none(), "stage")
    holdout_count: object = opt(None, "tokens of the held-out Gram; the stage passes it",
                                number(0, lo_open=True, allow_none=True), "stage")


OPTIONS: dict[str, type] = {"none": NoneOptions, "bias": BiasOptions, "lstsq": LstsqOptions,
                            "rcpu": RcpuOptions, "coec": CoecOptions, "blend": BlendOptions}
METHODS = tuple(OPTIONS)


def option_fields(method: str) -> list:
    """The dataclass fields of a method's options, common options first."""
    return list(fields(OPTIONS[method]))


def defaults(method: str, common: bool = True) -> dict:
    """``{name: default}`` of a method's options (without the common ones if ``common`` is False)."""
    skip = {f.name for f in fields(CommonOptions)} if not common else set()
    return {f.name: f.default for f in option_fields(method) if f.name not in skip}


def config_keys(method: str) -> list[str]:
    """Options a config may set for a method (the stage supplies the others)."""
    return [f.name for f in option_fields(method) if f.metadata["group"] != "stage"]


def _unknown(method: str, key: str, allowed) -> str:
    close = difflib.get_close_matches(key, list(allowed), n=1)
    if close:
        return f"unknown option {key!r} for method {method!r}; did you mean {close[0]!r}?"
    return f"unknown option {key!r} for method {method!r} (allowed: {', '.join(sorted(allowed)) or 'none'})"


def resolve(method: str, options: dict):
    """The checked options of ``method``: its dataclass with ``options`` over the defaults.

    Raises ValueError naming an unknown method, an unknown option (with the closest valid name)
    or a bad value. Values are kept exactly as given (no coercion), so the solver sees them as is.
    """
    if not isinstance(method, str) or method not in OPTIONS:
        _fail(f"unknown method {method!r}; expected one of {METHODS}")
    allowed = [f.name for f in option_fields(method)]
    for key in options:
        if key not in allowed:
            _fail(_unknown(method, key, allowed))
    o = OPTIONS[method](**options)
    for f in option_fields(method):
        f.metadata["check"](f.name, getattr(o, f.name))
    if method == "coec" and (problem := _precondition_conflict(as_dict(o))):
        _fail(f"option precondition {problem}")
    return o


def _precondition_conflict(o: dict) -> str | None:
    """Why coec options ``o`` (every key present) cannot precondition, or None: the
    preconditioned direction needs the reduced-Stiefel solve and the line search along it."""
    if o["precondition"] != "none" and (o["right"] != "stiefel" or o["eta_scale"] != "rayleigh"):
        return (f"{o['precondition']!r} needs right: stiefel and eta_scale: rayleigh "
                f"(got right: {o['right']}, eta_scale: {o['eta_scale']})")
    return None


def as_dict(o) -> dict:
    """A resolved options object as ``{name: value}`` (values not copied: tensors stay tensors)."""
    return {f.name: getattr(o, f.name) for f in fields(o)}


def validate_spec(spec: dict, where: str) -> None:
    """Check a config ``compensations.<name>`` entry: the method, every key at the top level and
    in the ``o_proj:`` / ``down_proj:`` overrides, and every value as each module will see it.
    Raises ValueError with one line starting with the offending key, e.g.
    ``compensations.coec.alpah: unknown option 'alpah' for method 'coec'; did you mean 'alpha'?``."""
    method = spec.get("method")
    if method not in OPTIONS:
        _fail(f"{where}.method: unknown method {method!r}; expected one of {METHODS}")
    allowed = config_keys(method)
    stage = {f.name for f in option_fields(method)} - set(allowed)

    def keys_ok(d: dict, at: str):
        for key in d:
            if key in stage:
                _fail(f"{at}.{key}: option {key!r} is set by the compensate stage, not by the config")
            if key not in allowed:
                _fail(f"{at}.{key}: " + _unknown(method, key, allowed))

    top = {k: v for k, v in spec.items() if k not in ("method", *MODULES)}
    keys_ok(top, where)
    for module in MODULES:
        sub = spec.get(module)
        if sub is None:
            continue
        if not isinstance(sub, dict):
            _fail(f"{where}.{module}: must be a mapping of option overrides, got {sub!r}")
        keys_ok(sub, f"{where}.{module}")
    for module in MODULES:
        sub = spec.get(module) or {}
        merged = {**top, **sub}
        for key, value in merged.items():
            at = f"{where}.{module}.{key}" if key in sub else f"{where}.{key}"
            try:
                OPTIONS[method].__dataclass_fields__[key].metadata["check"](key, value)
            except ValueError as exc:
                _fail(f"{at}: {exc}")
        if method == "coec":
            if problem := _precondition_conflict({**defaults("coec"), **merged}):
                at = f"{where}.{module}" if "precondition" in sub else where
                _fail(f"{at}.precondition: {problem}")
            o = resolve(method, merged)
            if o.align_lambda > 0 and o.align == "projector" and module != "o_proj":
                at = f"{where}.{module}" if "align_lambda" in sub else where
                _fail(f"{at}.align_lambda: align_lambda > 0 with align 'projector' needs the pruned "
                      f"v_proj, which only o_proj has; set it under o_proj: (or use align: angle)")


# ----------------------------------------------------------------------------- documentation
def _fmt_default(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, tuple):
        return "[" + ", ".join(_fmt_default(x) for x in v) + "]"
    if isinstance(v, str):
        return f"`{v}`"
    return f"{v:g}" if isinstance(v, float) else str(v)


GROUP_TITLES = {"paper": "paper hyperparameters", "method": "this project's method (beyond the paper)",
                "solver": "solver switches",
                "stage": "set by the compensate stage (not in a config)"}


def markdown() -> str:
    """docs/compensation-options.md, generated from the dataclasses."""
    out = [
        "# Compensation options",
        "",
        "<!-- generated from src/coec/compensate/options.py by `python -c \"from coec.compensate.options"
        " import markdown; print(markdown(), end='')\" > docs/compensation-options.md`;"
        " tests/test_config_validation.py checks that this file matches -->",
        "",
        "A `compensations:` entry of the config names a `method` and any of its options; an",
        "`o_proj:` or `down_proj:` sub-mapping overrides options for that module only, e.g.",
        "",
        "```yaml",
        "compensations:",
        "  coec:",
        "    method: coec",
        "    alpha: 0.9",
        "    max_rounds: 50",
        "    o_proj: {align_lambda: 50.0}",
        "```",
        "",
        "Every key and value is checked when the config is validated (so `snakemake -n` already",
        "stops with one line naming, e.g., `compensations.coec.alpah` and the closest valid name).",
        "*Paper* options are hyperparameters of the method (App. B defaults where the paper gives",
        "one); *method* options are the design choices of blend, this project's method beyond the",
        "paper ([blend.md](blend.md)); *solver* options change how the same objective is computed",
        "(backends, dtypes, caps);",
        "*stage* options are filled in by the compensate stage and cannot be set in a config.",
        "",
    ]
    for method, cls in OPTIONS.items():
        out += [f"## `{method}`", "", (cls.__doc__ or "").strip(), ""]
        out += ["| option | group | default | allowed | meaning |", "| --- | --- | --- | --- | --- |"]
        for f in sorted(option_fields(method), key=lambda f: ("paper", "method", "solver", "stage").index(
                f.metadata["group"])):
            md = f.metadata
            cells = [f"`{f.name}`", md["group"], _fmt_default(f.default), str(md["check"]), md["doc"]]
            out.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
        out.append("")
    out += [
        "## Indefinite Grams (App. B)",
        "",
        "A Gram with an eigenvalue below `-1e-4 x lambda_max` (far beyond float32 round-off) is",
        "replaced by its PSD projection (negative eigenvalues clipped to 0) for every method: the",
        "lstsq and rcpu solves and every reported error (`relerr_before`, `relerr_after`,",
        "`relerr_after_weight_only`) use it, and coec tempers with clipped eigenvalues (`psd_clip`).",
        "The result's `info[\"gram_psd\"]` records the outcome: `indefinite`, and when the",
        "eigenvalues were computed `min_eig`, `max_eig`, `clipped` (eigenvalues set to 0) and",
        "`action`. A Gram that is PSD up to round-off is used exactly as it is.",
        "",
        "## Other checks made when the config is validated",
        "",
        "- Names that become paths or wildcards (models, datasets, calibration sets, compensations,",
        "  extra tables, domains, iterative mixes and variants) must match",
        "  `^[A-Za-z0-9][A-Za-z0-9._-]*$`; `.` and `..` are refused. Every path and value in the",
        "  rules' shell commands is shell-quoted as well.",
        "- A model's `num_layers`, and the sequence lengths it is run with (its calibration sets'",
        "  `seqlen`, `evaluation.ppl_seqlen`), are compared with the model's own config.json",
        "  (`num_hidden_layers`, `max_position_embeddings`) when it can be read at that point: a local",
        "  folder or an embedded model. Hub models are compared when their first stage starts",
        "  (`--expect`), before any work, and so is a keep.json's layer and head count.",
        "",
    ]
    return "\n".join(out)


