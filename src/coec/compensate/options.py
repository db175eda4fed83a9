"""Options of the registered compensation methods: resolving a method's typed options from a
mapping, and checking a config's ``compensations.<name>`` entry.

Each method declares its options as a frozen dataclass (``Method.options``); each field carries
``metadata`` with its ``group`` (``validators.GROUPS``), a one-line ``doc`` and a value
``check`` (``coec.compensate.validators``), which also render the options page
(``coec.compensate.options_doc``).

    from coec.compensate.options import resolve, validate_spec
    o = resolve("coec", {"alpha": 0.8})          # CoecOptions, checked; raises ValueError
    validate_spec(cfg["compensations"]["coec"], "compensations.coec")   # config time

``compensate()`` resolves its keyword options through :func:`resolve`, and the config validation
runs :func:`validate_spec` on every entry, so a typo or a bad value stops ``snakemake -n`` with
one line naming the key.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import Field, dataclass, fields
from typing import Any, NoReturn

from coec.compensate.methods import METHODS
from coec.compensate.methods.base import CommonOptions, Method
from coec.model.arch import MODULES
from coec.registry import UnknownName


def _fail(msg: str) -> NoReturn:
    raise ValueError(msg)


def method(name: Any) -> Method:
    """The registered method ``name``; ValueError listing the available ones otherwise."""
    try:
        return METHODS[name]
    except UnknownName as exc:
        raise ValueError(str(exc)) from None


def option_fields(name: str) -> list[Field[Any]]:
    """The dataclass fields of a method's options, common options first."""
    return list(fields(method(name).options))


def config_keys(name: str) -> list[str]:
    """The options a config entry of method ``name`` may set."""
    return [f.name for f in option_fields(name)]


def _unknown(name: str, key: str, allowed: list[str]) -> str:
    close = difflib.get_close_matches(key, allowed, n=1)
    if close:
        return f"unknown option {key!r} for method {name!r}; did you mean {close[0]!r}?"
    return f"unknown option {key!r} for method {name!r} (allowed: {', '.join(sorted(allowed)) or 'none'})"


def _typed(f: Field[Any], value: Any) -> Any:
    """A YAML list for a tuple-typed option (e.g. ``gcv_grid``) as a tuple; else as given."""
    return tuple(value) if isinstance(f.default, tuple) and isinstance(value, list) else value


def _build(m: Method, options: Mapping[str, Any], check: bool = True) -> CommonOptions:
    allowed = {f.name: f for f in fields(m.options)}
    for key in options:
        if key not in allowed:
            _fail(_unknown(m.name, key, list(allowed)))
    o = m.options(**{k: _typed(allowed[k], v) for k, v in options.items()})
    for f in fields(o) if check else ():
        f.metadata["check"](f.name, getattr(o, f.name))
    return o


def resolve(name: str, options: Mapping[str, Any]) -> CommonOptions:
    """The checked options of method ``name``: its dataclass with ``options`` over the defaults.

    Raises ValueError naming an unknown method, an unknown option (with the closest valid name),
    a bad value or options that cannot work together (``Method.check_options``). Values are
    kept as given (a list for a tuple option becomes a tuple).
    """
    m = method(name)
    o = _build(m, options)
    if m.check_options is not None and (problem := m.check_options(o, None)):
        _fail(f"option {problem[0]} {problem[1]}")
    return o


@dataclass(frozen=True)
class Resolved:
    """A method with its checked options (``resolve``), resolved once and passed down as they are:
    ``compensate(W0, gram, mean, keep, Resolved(m, o), ...)``."""

    method: Method
    options: CommonOptions


def planned(spec: Mapping[str, Any]) -> dict[str, Resolved]:
    """``{module: Resolved}`` of a config ``compensations.<name>`` entry whose values the config
    validation checked (:func:`validate_spec`: every value as each module sees it, and the
    method's cross-option rules per module): each module's options built once, without checking
    the values again (an unknown key still stops here). The compensate stage passes them to
    ``compensate``, which trusts a ``Resolved`` pair; a call by method name checks its options."""
    m = method(spec["method"])
    return {mod: Resolved(m, _build(m, module_options(spec, mod), check=False)) for mod in MODULES}


def top_level_options(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The options of a config entry that hold for both modules (its keys but ``method``, the
    stage's ``inputs`` and the per-module overrides)."""
    return {k: v for k, v in spec.items() if k not in ("method", "inputs", *MODULES)}


def module_options(spec: Mapping[str, Any], module: str) -> dict[str, Any]:
    """The options of a config entry for one module: its top-level keys overridden by the
    module's own sub-mapping (e.g. ``o_proj: {align_lambda: 50}``)."""
    return {**top_level_options(spec), **(spec.get(module) or {})}


def _check_keys(m: Method, spec: Mapping[str, Any], top: Mapping[str, Any], where: str) -> None:
    """Every key of a config entry, at the top level (``top``) and in the per-module overrides,
    is an option of method ``m`` (ValueError naming the key and the closest valid name)."""
    allowed = config_keys(m.name)
    for at, d in [(where, top)] + [(f"{where}.{mod}", spec.get(mod)) for mod in MODULES]:
        if d is None:
            continue
        if not isinstance(d, dict):
            _fail(f"{at}: must be a mapping of option overrides, got {d!r}")
        for key in d:
            if key not in allowed:
                _fail(f"{at}.{key}: " + _unknown(m.name, key, allowed))


def validate_spec(spec: Mapping[str, Any], where: str) -> None:
    """Check a config ``compensations.<name>`` entry: the method, every key at the top level and
    in the ``o_proj:`` / ``down_proj:`` overrides, every value as each module will see it, and
    the method's cross-option rules per module. Raises ValueError with one line starting with
    the offending key, e.g.
    ``compensations.coec.alpah: unknown option 'alpah' for method 'coec'; did you mean 'alpha'?``."""
    try:
        m = method(spec.get("method"))
    except ValueError as exc:
        _fail(f"{where}.method: {exc}")
    top = top_level_options(spec)
    _check_keys(m, spec, top, where)
    checks = {f.name: f for f in fields(m.options)}
    for module in MODULES:
        sub = spec.get(module) or {}
        merged = {**top, **sub}
        for key, value in merged.items():
            try:
                checks[key].metadata["check"](key, _typed(checks[key], value))
            except ValueError as exc:
                _fail(f"{where}.{module}.{key}: {exc}" if key in sub else f"{where}.{key}: {exc}")
        if m.check_options is not None:
            problem = m.check_options(_build(m, merged), module)
            if problem:
                at = f"{where}.{module}" if problem[0] in sub else where
                _fail(f"{at}.{problem[0]}: {problem[1]}")
