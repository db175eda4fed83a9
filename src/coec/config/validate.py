"""Config validation: JSON Schema (src/coec/config/schemas/config.schema.yaml, package data) plus cross-references,
with one error line naming the offending key."""

from __future__ import annotations

import contextlib
import copy
import os
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from coec.compensate.methods import METHODS
from coec.compensate.options import method, resolve, top_level_options, validate_spec
from coec.config.modelcheck import ModelMismatch, check_expected, config_shape
from coec.config.schema import SCHEMA, deref, schema
from coec.config.schema import schema_default as schema_default  # validate.schema_default, as ever
from coec.data.bundled import EMBEDDED_MODELS
from coec.evaluate.tasks import TASKS
from coec.io.paths import NAME_PATTERN
from coec.iterative import targets as iterative_targets
from coec.iterative.targets import Need
from coec.registry import PLUGINS_ENV, Registry, load_plugins
from coec.select.scores import SCORES, selection_registry
from coec.select.search.checks import check_search_entries


class ConfigError(ValueError):
    """A bad config key; the message is one line naming it."""


@contextlib.contextmanager
def one_line_errors() -> Iterator[None]:
    """A block (the Snakefile's reading of the config) whose ConfigError prints its one line to
    stderr and exits with status 1: Snakemake prints an exception raised while it reads the
    Snakefile with the traceback's frames after the message."""
    try:
        yield
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        raise SystemExit(1) from None


def _path(parts: Iterable[Any]) -> str:
    return ".".join(str(p) for p in parts) or "<root>"


def fill_defaults(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with the schema's defaults filled in place (what ``validate_config`` does
    after validating; ``coec.workflow.targets`` reads configs in this form). Returns config."""
    _fill_defaults(schema(), config, schema())
    return config


def _fill_defaults(schema: dict[str, Any], obj: Any, root: dict[str, Any]) -> None:
    """Insert ``default`` values of object properties (recursively, following local $refs and
    the ``then`` branches of ``allOf: [{if, then}]`` whose ``if`` the object satisfies)."""
    import jsonschema  # jsonschema takes ~0.3-0.9 s to import (measured), needed only to validate

    schema = deref(schema, root)
    if not isinstance(obj, dict) or schema.get("type") not in ("object", None):
        return
    props = dict(schema.get("properties") or {})
    for branch in schema.get("allOf") or []:
        if "if" in branch and jsonschema.Draft202012Validator(branch["if"]).is_valid(obj):
            props.update(branch.get("then", {}).get("properties") or {})
    for key, sub in props.items():
        if key not in obj and isinstance(sub, dict) and "default" in sub:
            obj[key] = copy.deepcopy(sub["default"])
        if key in obj:
            _fill_defaults(sub, obj[key], root)
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict):
        for key, val in obj.items():
            if key not in props:
                _fill_defaults(extra, val, root)


def registries() -> dict[str, Registry[Any]]:
    """The plug-in registries a schema node names with ``x-registry`` (their built-in entries
    registered): ``methods``, ``scores``, ``tasks``."""
    return {"methods": METHODS, "scores": SCORES, "tasks": TASKS}


def registry_schema(schema_path: str | Path = SCHEMA) -> dict[str, Any]:
    """The config schema with every ``x-registry: <kind>`` node given ``enum`` = the names
    registered now (built-ins and loaded plug-ins) and its ``x-registry-extra`` names, so the
    schema's lists of methods, scores and tasks are the registries themselves."""
    regs = registries()
    out = copy.deepcopy(schema(schema_path))

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if "x-registry" in node:  # x-registry-extra: names beside the registry's (a search)
                node["enum"] = [*regs[node["x-registry"]].names(), *node.get("x-registry-extra", [])]
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(out)
    return out


def load_config_plugins(config: dict[str, Any]) -> list[str]:
    """Import the config's ``plugins`` (``coec.registry.load_plugins``), and hand them to every
    job the workflow starts (``COEC_PLUGINS``). ConfigError naming the entry on failure."""
    specs = config.get("plugins", [])
    if not isinstance(specs, list) or not all(isinstance(s, str) and s for s in specs):
        raise ConfigError(f"config: bad value at plugins: expected a list of file paths or module names, got {specs!r}")
    try:
        load_plugins(specs)
    except ValueError as exc:
        raise ConfigError(f"config: {exc}") from None
    if specs:
        os.environ[PLUGINS_ENV] = os.pathsep.join(specs)
    else:
        os.environ.pop(PLUGINS_ENV, None)
    return specs


def validate_config(config: dict[str, Any], schema_path: str | Path = SCHEMA) -> dict[str, Any]:
    """Validate ``config`` in place (defaults filled) or raise :class:`ConfigError`: its plug-ins
    loaded first (their names join the schema's enums), then the schema, then cross-references."""
    import jsonschema  # jsonschema takes ~0.3-0.9 s to import (measured), needed only to validate

    load_config_plugins(config)
    schema = registry_schema(schema_path)
    validator = jsonschema.Draft202012Validator(schema)
    error = jsonschema.exceptions.best_match(validator.iter_errors(config))
    if error is not None:
        where = _path(error.absolute_path)
        if "propertyNames" in error.absolute_schema_path:
            raise ConfigError(
                f"config: bad name {error.instance!r} under {where}: names become paths and "
                f"shell words, so they must match {NAME_PATTERN} (letters, digits, '.', "
                f"'_', '-'; starting with a letter or digit)"
            )
        if error.validator == "additionalProperties":
            raise ConfigError(f"config: unknown key under {where}: {error.message}")
        if error.validator == "enum" and isinstance(error.schema, dict) and "x-registry" in error.schema:
            known = registries()[error.schema["x-registry"]]  # a method, score or task name
            raise ConfigError(f"config: bad value at {where}: {known.unknown(error.instance)}")
        raise ConfigError(f"config: bad value at {where}: {error.message}")
    _fill_defaults(schema, config, schema)
    _check_references(config)
    _check_selections(config)
    _check_compensations(config)
    _check_searches(config)
    _check_model_shapes(config)
    return config


def _selection_refs(obj: Any, where: str = "") -> Iterator[tuple[str, str]]:
    """(where, name) of every ``selection: <name>`` in the config outside ``selections``."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            w = f"{where}.{k}" if where else str(k)
            if k == "selection" and isinstance(v, str):
                yield w, v
            elif k != "selections":
                yield from _selection_refs(v, w)
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _selection_refs(v, f"{where}[{i}]")


def _check_selections(cfg: dict[str, Any]) -> None:
    """The ``selections`` registry (coec.select.scores.selection_registry) and every name used."""
    try:
        known = selection_registry(cfg.get("selections"))
    except ValueError as exc:
        raise ConfigError(f"config: {exc}") from None
    for where, name in _selection_refs(cfg):
        if name not in known:
            raise ConfigError(f"config: {where} names unknown selection {name!r} (known: {', '.join(known)})")


def _check_searches(cfg: dict[str, Any]) -> None:
    """Every width search (``score: search``; coec.select.search.checks), one line naming the key."""
    try:
        check_search_entries(cfg)
    except ValueError as exc:
        raise ConfigError(f"config: {exc}") from None


def _check_compensations(cfg: dict[str, Any]) -> None:
    """Every option of every compensation, as each module will see it, and the entries its
    method's inputs name (coec.compensate.options, coec.compensate.inputs)."""
    for name, spec in cfg.get("compensations", {}).items():
        where = f"compensations.{name}"
        try:
            validate_spec(spec, where)
        except ValueError as exc:
            raise ConfigError(f"config: {exc}") from None
        m = method(spec["method"])
        options = resolve(m.name, top_level_options(spec))
        for inp in m.inputs:
            problem = inp.check_reference(m.name, options, cfg, where, dict(METHODS.items()))
            if problem:
                raise ConfigError(f"config: {problem}")


def _seqlen_key(cfg: dict[str, Any], calib: str) -> tuple[str, int] | None:
    """(config key, length) of a calibration entry or of an iterative mix."""
    if calib in cfg.get("calibration", {}):
        return f"calibration.{calib}.seqlen", cfg["calibration"][calib]["seqlen"]
    return iterative_targets.seqlen_key(cfg, calib)


def _model_calibrations(cfg: dict[str, Any]) -> dict[str, set[str]]:
    """{model: calibrations (or mixes) it is run with} over every table and figure of the config."""
    used: dict[str, set[str]] = {}

    def add(models: Iterable[str], calibs: Iterable[str | None]) -> None:
        for m in models:
            used.setdefault(m, set()).update(c for c in calibs if c)

    tables = {k: cfg[k] for k in ("table1", "table2", "table3") if k in cfg}
    tables.update(cfg.get("extra_tables") or {})
    for t in tables.values():
        add(t["models"], [t["calibration"]])
    for key in ("appC", "fig2"):
        if key in cfg:
            add([cfg[key]["model"]], [cfg[key]["calibration"]])
    for models, calibs in iterative_targets.model_calibrations(cfg):
        add(models, calibs)
    return used


def _check_model_shapes(cfg: dict[str, Any]) -> None:
    """Layer counts and sequence lengths against the model's own config, where it is readable
    now (local folders, embedded models); hub models are checked when their stage starts."""

    used = _model_calibrations(cfg)
    for name, model in cfg["models"].items():
        geom, what = config_shape(model, name)
        if geom is None:
            continue
        seqlen = {}
        if name in used:
            seqlen["evaluation.ppl_seqlen"] = cfg["evaluation"]["ppl_seqlen"]
            for calib in sorted(used[name]):
                ks = _seqlen_key(cfg, calib)
                if ks:
                    seqlen[ks[0]] = ks[1]
        try:
            check_expected(geom, {"model": f"models.{name}", "num_layers": model["num_layers"], "seqlen": seqlen}, what)
        except ModelMismatch as exc:
            raise ConfigError(f"config: {exc}") from None


def _needs(cfg: dict[str, Any]) -> Need:
    """need(kind, name, where): ConfigError naming ``where`` unless ``cfg[kind]`` has ``name``."""

    def need(kind: str, name: str, where: str) -> None:
        if name not in cfg.get(kind, {}):
            raise ConfigError(
                f"config: {where} names unknown {kind} entry {name!r} (known: {', '.join(cfg.get(kind, {})) or 'none'})"
            )

    return need


def _check_calibration_refs(cfg: dict[str, Any], need: Need) -> None:
    """Each calibration set's dataset and ``disjoint_from``, and the perplexity dataset."""
    for name, cal in cfg["calibration"].items():
        need("datasets", cal["dataset"], f"calibration.{name}.dataset")
        if "disjoint_from" in cal:
            other = cal["disjoint_from"]
            need("calibration", other, f"calibration.{name}.disjoint_from")
            if cfg["calibration"][other]["dataset"] != cal["dataset"] or other == name:
                raise ConfigError(
                    f"config: calibration.{name}.disjoint_from: {other!r} must be another "
                    f"calibration set of the same dataset ({cal['dataset']!r})"
                )
    need("datasets", cfg["evaluation"]["ppl_dataset"], "evaluation.ppl_dataset")


def _check_table_refs(cfg: dict[str, Any], need: Need) -> None:
    """Each table's calibration, models, rows' compensations and ``compare`` rows."""
    tables = {k: cfg[k] for k in ("table1", "table2", "table3") if k in cfg}
    tables.update(cfg.get("extra_tables", {}))
    for tname, t in tables.items():
        need("calibration", t["calibration"], f"{tname}.calibration")
        for m in t["models"]:
            need("models", m, f"{tname}.models")
        for i, row in enumerate(t["rows"]):
            need("compensations", row["compensation"], f"{tname}.rows[{i}].compensation")
            if "compare" in row and not any(
                r["selection"] == row["selection"] and r["compensation"] == row["compare"] for r in t["rows"]
            ):
                raise ConfigError(
                    f"config: {tname}.rows[{i}].compare: no row of selection "
                    f"{row['selection']!r} has compensation {row['compare']!r}"
                )


def _check_figure_refs(cfg: dict[str, Any], need: Need) -> None:
    """The names App. C, Fig. 2, Table 4 and the state-of-the-art table use."""
    if "appC" in cfg:
        a = cfg["appC"]
        need("calibration", a["calibration"], "appC.calibration")
        need("models", a["model"], "appC.model")
        need("compensations", a["compensation"], "appC.compensation")
    if "fig2" in cfg:
        f = cfg["fig2"]
        need("models", f["model"], "fig2.model")
        need("calibration", f["calibration"], "fig2.calibration")
        for i, c in enumerate(f["compensations"]):
            need("compensations", c, f"fig2.compensations[{i}]")
    for i, m in enumerate(cfg.get("table4", {}).get("models", [])):
        need("models", m, f"table4.models[{i}]")
    if "table_sota" in cfg:
        t = cfg["table_sota"]
        need("calibration", t["calibration"], "table_sota.calibration")
        for i, m in enumerate(t["models"]):
            need("models", m, f"table_sota.models[{i}]")
        for i, row in enumerate(t["rows"]):
            need("compensations", row["compensation"], f"table_sota.rows[{i}].compensation")


def _check_embedded_models(cfg: dict[str, Any]) -> None:
    """Every embedded model names one the package ships."""
    for name, m in cfg["models"].items():
        if m["source"] == "embedded":
            emb = m.get("embedded", name)
            if emb not in EMBEDDED_MODELS:
                raise ConfigError(
                    f"config: models.{name}: unknown embedded model {emb!r} (known: {', '.join(EMBEDDED_MODELS)})"
                )


def _check_references(cfg: dict[str, Any]) -> None:
    """Every name the config uses names an entry of the section it refers to."""
    need = _needs(cfg)
    _check_calibration_refs(cfg, need)
    _check_table_refs(cfg, need)
    _check_figure_refs(cfg, need)
    try:  # the iterative method's mixes, domains and rows
        iterative_targets.check_config(cfg)
        iterative_targets.check_references(cfg, need)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    _check_embedded_models(cfg)
