"""Option models: the hand-written validators against pydantic v2, on COEC's options
(docs/benchmarks.md "Option models: hand-written or pydantic").

COEC's options (``coec.compensate.methods.coec.CoecOptions``, 27 fields) declared both ways, each
without its doc and evidence strings (the same text either way): a frozen dataclass whose fields
carry the value checks of ``coec.compensate.validators``, and a strict, frozen pydantic model
(``extra="forbid"``, ``Field`` bounds, ``Literal`` choices, a validator for the grid and one for
the cross-option rule). Printed:

* import time of each, in a fresh interpreter (best of ``--repeat``): the library plus the class,
  and the package's own import of the real options (torch included), which pydantic would add to;
* validation time of one call, the defaults and a few options set;
* the message each gives for the same bad inputs: the hand-written one as the config validation
  prints it (``options.validate_spec``), pydantic's ``ValidationError`` as it comes;
* line counts: the hand-written machinery (options.py, validators.py, options_doc.py) and what a
  pydantic version keeps or adds (the per-module overrides, a one-line message with the closest
  valid name, the options page's "allowed" column, the torch dtype and the grid's order).

    python benchmarks/options_models.py --repeat 5

pydantic is no dependency of the package (Snakemake's environment brings it).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

# ----------------------------------------------------------------------------- the two declarations
HAND = """
from dataclasses import dataclass
from coec.compensate.validators import boolean, choice, float_dtype, gcv_grid, number, opt

@dataclass(frozen=True)
class CoecOptions:
    compute_dtype: str | None = opt(None, "", float_dtype())
    alpha: float = opt(0.9, "", number(0.0, 1.0, lo_open=True), "paper")
    rescale: str = opt("gcv", "", choice("gcv", "global"), "paper")
    right: str = opt("stiefel", "", choice("stiefel", "full", "none"), "paper")
    align_lambda: float = opt(0.0, "", number(0.0), "paper")
    anchor_rank: int = opt(16, "", number(1, integer=True), "paper")
    align: str = opt("projector", "", choice("projector", "angle"), "paper")
    max_rounds: int = opt(50, "", number(0, integer=True), "paper")
    tol: float = opt(1e-4, "", number(0.0), "paper")
    tol_mode: str = opt("relative", "", choice("relative", "absolute"), "paper")
    delta: float = opt(7e-4, "", number(0.0, lo_open=True), "paper")
    delta_norm: str = opt("rms", "", choice("rms", "fro"), "paper")
    kappa: float | None = opt(10.0, "", number(1.0, allow_none=True), "paper")
    eta: float = opt(1.0, "", number(0.0, lo_open=True))
    eta_scale: str = opt("rayleigh", "", choice("rayleigh", "raw"))
    right_solver: str = opt("gd", "", choice("gd", "cg"))
    precondition: str = opt("none", "", choice("none", "gram", "newton"))
    precondition_damping: float = opt(3.0, "", number(0.0, lo_open=True))
    max_inner_steps: int = opt(100, "", number(1, integer=True))
    max_backtracks: int = opt(30, "", number(0, integer=True))
    gcv_grid: tuple[float, float, int] = opt((1e-4, 1e5, 120), "", gcv_grid(), "paper")
    psd_clip: bool = opt(True, "", boolean(), "paper")
    left_polar: str = opt("auto", "", choice("auto", "svd", "eigh"))
    setup_svd: str = opt("auto", "", choice("auto", "svd", "eigh"))
    cayley_inverse: str = opt("newton_schulz", "", choice("newton_schulz", "solve"))
    rg_update: str = opt("auto", "", choice("auto", "product", "carry"))
    rg_refresh: int = opt(4, "", number(0, integer=True))
"""

PYDANTIC = """
from typing import Annotated, Any, Literal
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

def _dtype(v: Any) -> Any:
    import torch
    if v is None or v in ("float32", "float64") or v in (torch.float32, torch.float64):
        return v
    raise ValueError(f"must be 'float32' or 'float64' (or the torch dtype), got {v!r}")

def _grid(g: tuple[float, float, int]) -> tuple[float, float, int]:
    if not g[0] < g[1]:
        raise ValueError(f"needs lo < hi, got {g!r}")
    return g

Pos = Annotated[float, Field(gt=0, allow_inf_nan=False)]
Grid = Annotated[tuple[Pos, Pos, Annotated[int, Field(ge=2)]], AfterValidator(_grid)]

class CoecOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, arbitrary_types_allowed=True)
    compute_dtype: Annotated[Any, AfterValidator(_dtype)] = None
    alpha: float = Field(0.9, gt=0, le=1, allow_inf_nan=False)
    rescale: Literal["gcv", "global"] = "gcv"
    right: Literal["stiefel", "full", "none"] = "stiefel"
    align_lambda: float = Field(0.0, ge=0, allow_inf_nan=False)
    anchor_rank: int = Field(16, ge=1)
    align: Literal["projector", "angle"] = "projector"
    max_rounds: int = Field(50, ge=0)
    tol: float = Field(1e-4, ge=0, allow_inf_nan=False)
    tol_mode: Literal["relative", "absolute"] = "relative"
    delta: float = Field(7e-4, gt=0, allow_inf_nan=False)
    delta_norm: Literal["rms", "fro"] = "rms"
    kappa: float | None = Field(10.0, ge=1, allow_inf_nan=False)
    eta: float = Field(1.0, gt=0, allow_inf_nan=False)
    eta_scale: Literal["rayleigh", "raw"] = "rayleigh"
    right_solver: Literal["gd", "cg"] = "gd"
    precondition: Literal["none", "gram", "newton"] = "none"
    precondition_damping: float = Field(3.0, gt=0, allow_inf_nan=False)
    max_inner_steps: int = Field(100, ge=1)
    max_backtracks: int = Field(30, ge=0)
    gcv_grid: Grid = Field((1e-4, 1e5, 120), strict=False)  # a YAML list for the tuple
    psd_clip: bool = True
    left_polar: Literal["auto", "svd", "eigh"] = "auto"
    setup_svd: Literal["auto", "svd", "eigh"] = "auto"
    cayley_inverse: Literal["newton_schulz", "solve"] = "newton_schulz"
    rg_update: Literal["auto", "product", "carry"] = "auto"
    rg_refresh: int = Field(4, ge=0)

    @model_validator(mode="after")
    def _together(self) -> "CoecOptions":
        if self.precondition != "none" and (self.right != "stiefel" or self.eta_scale != "rayleigh"):
            raise ValueError(f"precondition {self.precondition!r} needs right: stiefel and eta_scale: rayleigh")
        return self
"""

#: the validators without the package's __init__ (which imports the solvers, and torch)
TORCH_FREE = """
import sys, types, coec
pkg = types.ModuleType("coec.compensate")
pkg.__path__ = [coec.__path__[0] + "/compensate"]
sys.modules["coec.compensate"] = pkg
"""

#: what each variant's import runs in a fresh interpreter (timed inside the child)
IMPORTS = {
    "hand-written: validators + the dataclass": TORCH_FREE + HAND,
    "pydantic: the library + the model": PYDANTIC,
    "package: coec.compensate.methods.coec (torch)": "from coec.compensate.methods.coec import CoecOptions\n",
    "torch alone": "import torch\n",
    "pydantic alone": "import pydantic\nfrom pydantic import BaseModel, Field\n",
}

CHILD = """
import sys, time
sys.path.insert(0, {src!r})
t0 = time.perf_counter()
exec(compile({code!r}, "<options>", "exec"), {{}})
print(time.perf_counter() - t0)
"""

# ----------------------------------------------------------------------------- the bad inputs
#: (what is wrong, the config entry's options)
BAD = [
    ("unknown option", {"alpah": 0.8}),
    ("wrong type", {"max_rounds": "50"}),
    ("out of range", {"alpha": 1.5}),
    ("bad choice", {"rescale": "local"}),
    ("structured: the grid's order", {"gcv_grid": [10.0, 1.0, 120]}),
    ("structured: a per-module override", {"o_proj": {"anchor_rank": 0}}),
    ("options that cannot work together", {"precondition": "gram", "right": "full"}),
]


def import_seconds(code: str, repeat: int) -> float:
    """Best of ``repeat`` fresh interpreters, each timing ``code`` from its first line."""
    child = CHILD.format(src=str(REPO / "src"), code=code)
    runs = [float(subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, check=True).stdout)
            for _ in range(repeat)]  # fmt: skip
    return min(runs)


def load(code: str) -> Any:
    ns: dict[str, Any] = {"__name__": "options_models_declaration"}
    exec(compile(code, "<options>", "exec", dont_inherit=True), ns)  # no postponed annotations here
    return ns["CoecOptions"]


def per_call_us(fn: Any, n: int = 2000) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


# ----------------------------------------------------------------------------- pydantic in the config
def pydantic_spec(model: Any, spec: dict[str, Any], where: str) -> None:
    """What ``options.validate_spec`` would be around the pydantic model: the per-module overrides
    merged, each module's options validated, the first error on one line naming the key, an unknown
    key with the closest valid name (pydantic gives none)."""
    from pydantic import ValidationError

    top = {k: v for k, v in spec.items() if k not in ("method", "o_proj", "down_proj")}
    for module in ("o_proj", "down_proj"):
        sub = spec.get(module) or {}
        try:
            model(**{**top, **sub})
        except ValidationError as exc:
            err = exc.errors()[0]
            key = ".".join(str(p) for p in err["loc"]) or "options"
            at = f"{where}.{module}" if err["loc"] and err["loc"][0] in sub else where
            msg = err["msg"]
            if err["type"] == "extra_forbidden":
                close = difflib.get_close_matches(str(err["loc"][0]), list(model.model_fields), n=1)
                msg = f"unknown option {key!r}" + (f"; did you mean {close[0]!r}?" if close else "")
            raise ValueError(f"{at}.{key}: {msg}") from None


def pydantic_allowed(info: Any) -> str:
    """The options page's "allowed" column of a pydantic field (``validators.Check``'s text)."""
    import typing

    args = typing.get_args(info.annotation)
    if typing.get_origin(info.annotation) is typing.Literal:
        return " | ".join(f"`{a}`" for a in args)
    bounds = {type(m).__name__: m for m in info.metadata}
    parts = [f">= {bounds['Ge'].ge:g}"] if "Ge" in bounds else [f"> {bounds['Gt'].gt:g}"] if "Gt" in bounds else []
    parts += [f"<= {bounds['Le'].le:g}"] if "Le" in bounds else []
    kind = "integer" if info.annotation is int else "number"
    return f"{kind} {', '.join(parts)}".strip() + (" or null" if type(None) in args else "")


def count(path: Path) -> int:
    return len(path.read_text().splitlines())


def function_lines(*fns: Any) -> int:
    import inspect

    return sum(len(inspect.getsource(f).splitlines()) for f in fns)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--repeat", type=int, default=5, help="fresh interpreters per import (best taken)")
    args = ap.parse_args()
    import pydantic

    from coec.compensate import options
    from coec.compensate.methods.coec import CoecOptions

    hand, pyd = load(HAND), load(PYDANTIC)
    real = {f.name: f.default for f in dataclasses.fields(CoecOptions)}
    assert {f.name: f.default for f in dataclasses.fields(hand)} == real, "the copy is not CoecOptions"
    assert {n: f.default for n, f in pyd.model_fields.items()} == real, "the pydantic model is not CoecOptions"
    print(f"python {sys.version.split()[0]}, pydantic {pydantic.VERSION}; {len(real)} options")

    print(f"\nimport in a fresh interpreter, best of {args.repeat}:")
    for label, code in IMPORTS.items():
        print(f"  {label:48s} {import_seconds(code, args.repeat) * 1e3:8.1f} ms")

    some = {"alpha": 0.8, "max_rounds": 20, "align_lambda": 50.0, "gcv_grid": [1e-3, 1e4, 50]}
    print("\nvalidation of one call (the defaults | four options set):")
    print(f"  hand-written (options.resolve)  {per_call_us(lambda: options.resolve('coec', {})):6.1f} us | "
          f"{per_call_us(lambda: options.resolve('coec', some)):6.1f} us")  # fmt: skip
    print(f"  pydantic (model(**options))     {per_call_us(lambda: pyd()):6.1f} us | "
          f"{per_call_us(lambda: pyd(**some)):6.1f} us")  # fmt: skip
    print("  values kept: hand-written alpha=1 ->", repr(options.resolve("coec", {"alpha": 1}).alpha),
          "| pydantic ->", repr(pyd(alpha=1).alpha))  # fmt: skip

    print("\nerror messages (hand-written: options.validate_spec as `snakemake -n` prints it; pydantic: as raised):")
    for what, bad in BAD:
        spec = {"method": "coec", **bad}
        try:
            options.validate_spec(spec, "compensations.coec")
            hand_msg = "(accepted)"
        except ValueError as exc:
            hand_msg = str(exc)
        top = {k: v for k, v in bad.items() if k != "o_proj"}
        try:
            pyd(**{**top, **bad.get("o_proj", {})})
            pyd_msg = "(accepted)"
        except pydantic.ValidationError as exc:
            pyd_msg = str(exc)
        try:
            pydantic_spec(pyd, spec, "compensations.coec")
            adapted = "(accepted)"
        except ValueError as exc:
            adapted = str(exc)
        print(f"\n  {what}: {bad}")
        print(f"    hand-written  (1 line)  {hand_msg}")
        print(f"    pydantic      ({len(pyd_msg.splitlines())} lines) " + " / ".join(pyd_msg.splitlines()))
        print(f"    pydantic, one line      {adapted}")

    print("\nthe options page's allowed column (validators.Check | from the pydantic field):")
    for name in ("alpha", "max_rounds", "kappa", "rescale"):
        check = next(f for f in dataclasses.fields(CoecOptions) if f.name == name).metadata["check"]
        print(f"  {name:12s} {str(check):28s} | {pydantic_allowed(pyd.model_fields[name])}")

    src = REPO / "src" / "coec" / "compensate"
    files = {name: count(src / name) for name in ("options.py", "validators.py", "options_doc.py")}
    print("\nlines (the 27 declarations themselves: one per option either way, as above):")
    for name, n in files.items():
        print(f"  {name:16s} {n:4d}")
    print(f"  {'hand-written':16s} {sum(files.values()):4d}")
    adapter = function_lines(pydantic_spec, pydantic_allowed)
    print(f"  pydantic adapter in this file (per-module overrides, one-line errors, closest name, allowed text): "
          f"{adapter} lines, plus the torch dtype and grid validators (PYDANTIC: 12 lines)")  # fmt: skip
    print(f"  the two declarations: HAND {len(HAND.strip().splitlines())} lines, PYDANTIC "
          f"{len(PYDANTIC.strip().splitlines())} lines")  # fmt: skip


if __name__ == "__main__":
    main()
