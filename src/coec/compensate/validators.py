"""Value checks of compensation options: each a callable ``check(name, value)`` that raises
``ValueError`` naming the option, with a description that the options page renders.

    from coec.compensate.validators import number, opt
    alpha: float = opt(0.9, "Gram tempering G^alpha", number(0.0, 1.0, lo_open=True), "paper")
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Callable
from dataclasses import field
from typing import Any, NoReturn

from coec.io.paths import NAME_PATTERN

_NAME = re.compile(NAME_PATTERN)

#: The groups of an option: ``paper`` (a hyperparameter of the paper's method), ``method`` (a
#: design choice of a method beyond the paper), ``solver`` (how the same objective is computed).
GROUPS = ("paper", "method", "solver")


class Check:
    """A value check with a human-readable description (used in errors and the docs)."""

    def __init__(self, desc: str, fn: Callable[[str, Any], None]):
        self.desc, self.fn = desc, fn

    def __call__(self, name: str, v: Any) -> None:
        self.fn(name, v)

    def __str__(self) -> str:
        return self.desc


def _fail(msg: str) -> NoReturn:
    raise ValueError(msg)


def _is_num(v: Any, integer: bool) -> bool:
    ok = isinstance(v, numbers.Integral) if integer else isinstance(v, numbers.Real)
    return ok and not isinstance(v, bool) and math.isfinite(float(v))


def number(
    lo: float | None = None,
    hi: float | None = None,
    lo_open: bool = False,
    integer: bool = False,
    allow_none: bool = False,
) -> Check:
    """A finite number (an integer with ``integer``) in ``[lo, hi]`` (``(lo, hi]`` with
    ``lo_open``), or None with ``allow_none``."""
    kind = "integer" if integer else "number"
    parts = []
    if lo is not None:
        parts.append(f"{'>' if lo_open else '>='} {lo:g}")
    if hi is not None:
        parts.append(f"<= {hi:g}")
    desc = f"{kind}{' ' + ', '.join(parts) if parts else ''}{' or null' if allow_none else ''}"

    def fn(name: str, v: Any) -> None:
        if v is None and allow_none:
            return
        if not _is_num(v, integer):
            _fail(f"option {name} must be a finite {kind}, got {v!r}")
        if lo is not None and (v < lo or (lo_open and v == lo)):
            _fail(f"option {name} must be {'>' if lo_open else '>='} {lo}, got {v!r}")
        if hi is not None and v > hi:
            _fail(f"option {name} must be <= {hi}, got {v!r}")

    return Check(desc, fn)


def choice(*choices: str) -> Check:
    """One of the given strings."""

    def fn(name: str, v: Any) -> None:
        if isinstance(v, bool) or v not in choices:
            _fail(f"option {name} must be one of {choices}, got {v!r}")

    return Check(" | ".join(f"`{c}`" for c in choices), fn)


def boolean() -> Check:
    """True or False (not 0 or 1)."""

    def fn(name: str, v: Any) -> None:
        if not isinstance(v, bool):
            _fail(f"option {name} must be a bool, got {v!r}")

    return Check("true | false", fn)


def float_dtype(allow_none: bool = True) -> Check:
    """``"float32"`` or ``"float64"`` (or the torch dtype), or None with ``allow_none``."""

    def fn(name: str, v: Any) -> None:
        if (v is None and allow_none) or v in ("float32", "float64"):
            return
        import torch  # deferred: keeps the job boundary torch-free (a config gives the dtype's name)

        if v not in (torch.float32, torch.float64):
            _fail(f"option {name} must be 'float32' or 'float64' (or the torch dtype), got {v!r}")

    return Check("`float32` | `float64`" + (" | null" if allow_none else ""), fn)


def gcv_grid() -> Check:
    """A log-spaced grid ``(lo, hi, n)`` with ``0 < lo < hi`` and ``n >= 2``."""

    def fn(name: str, g: Any) -> None:
        if not (isinstance(g, (tuple, list)) and len(g) == 3):
            _fail(f"option {name} must be (lo, hi, n), got {g!r}")
        number(0.0, lo_open=True)(f"{name}[0]", g[0])
        number(0.0, lo_open=True)(f"{name}[1]", g[1])
        number(2, integer=True)(f"{name}[2]", g[2])
        if not g[0] < g[1]:
            _fail(f"option {name} needs lo < hi, got {g!r}")

    return Check("[lo, hi, n], 0 < lo < hi, n >= 2", fn)


def name_or_none(allow_none: bool = False) -> Check:
    """The name of another config entry (a path component), or None with ``allow_none``."""

    def fn(name: str, v: Any) -> None:
        if v is None and allow_none:
            return
        if not isinstance(v, str) or not _NAME.match(v):
            _fail(f"option {name}={v!r}: must be a config entry name ([A-Za-z0-9][A-Za-z0-9._-]*)")

    return Check("a config entry name" + (" or null" if allow_none else ""), fn)


def opt(default: Any, doc: str, check: Check, group: str = "solver", evidence: str = "") -> Any:
    """A dataclass field with its group (``GROUPS``), one-line doc, value check and ``evidence``:
    what keeps the option (the paper's section of a hyperparameter, a default, or the recorded
    benchmark that shows an alternative winning); the options page prints it."""
    if group not in GROUPS:
        raise ValueError(f"option group {group!r} is not one of {GROUPS}")
    return field(default=default, metadata={"group": group, "doc": doc, "check": check, "evidence": evidence})
