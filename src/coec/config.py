"""Config validation: JSON Schema (workflow/schemas/config.schema.yaml) plus cross-references,
with one error line naming the offending key."""

from __future__ import annotations

from pathlib import Path

import yaml

SCHEMA = Path(__file__).resolve().parents[2] / "workflow" / "schemas" / "config.schema.yaml"


class ConfigError(ValueError):
    """A bad config key; the message is one line naming it."""


def _path(parts) -> str:
    return ".".join(str(p) for p in parts) or "<root>"


def _fill_defaults(schema: dict, obj, root: dict) -> None:
    """Insert ``default`` values of object properties (recursively, following local $refs)."""
    if "$ref" in schema:
        ref = schema["$ref"].removeprefix("#/").split("/")
        target = root
        for r in ref:
            target = target[r]
        schema = target
    if not isinstance(obj, dict) or schema.get("type") not in ("object", None):
        return
    for key, sub in (schema.get("properties") or {}).items():
        if key not in obj and isinstance(sub, dict) and "default" in sub:
            obj[key] = sub["default"]
        if key in obj:
            _fill_defaults(sub, obj[key], root)
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict):
        for key, val in obj.items():
            if key not in (schema.get("properties") or {}):
                _fill_defaults(extra, val, root)


def validate_config(config: dict, schema_path: str | Path = SCHEMA) -> dict:
    """Validate ``config`` in place (defaults filled) or raise :class:`ConfigError`."""
    import jsonschema

    schema = yaml.safe_load(Path(schema_path).read_text())
    validator = jsonschema.Draft202012Validator(schema)
    error = jsonschema.exceptions.best_match(validator.iter_errors(config))
    if error is not None:
        where = _path(error.absolute_path)
        if error.validator == "additionalProperties":
            raise ConfigError(f"config: unknown key under {where}: {error.message}")
        raise ConfigError(f"config: bad value at {where}: {error.message}")
    _fill_defaults(schema, config, schema)
    _check_references(config)
    return config


def _check_references(cfg: dict) -> None:
    def need(kind: str, name: str, where: str):
        if name not in cfg.get(kind, {}):
            raise ConfigError(f"config: {where} names unknown {kind} entry {name!r} "
                              f"(known: {', '.join(cfg.get(kind, {})) or 'none'})")

    for name, cal in cfg["calibration"].items():
        need("datasets", cal["dataset"], f"calibration.{name}.dataset")
    need("datasets", cfg["evaluation"]["ppl_dataset"], "evaluation.ppl_dataset")
    tables = {k: cfg[k] for k in ("table1", "table2", "table3") if k in cfg}
    tables.update(cfg.get("extra_tables", {}))
    for tname, t in tables.items():
        need("calibration", t["calibration"], f"{tname}.calibration")
        for m in t["models"]:
            need("models", m, f"{tname}.models")
        for i, row in enumerate(t["rows"]):
            need("compensations", row["compensation"], f"{tname}.rows[{i}].compensation")
    for name, m in cfg["models"].items():
        if m["source"] == "embedded":
            from .resources import EMBEDDED_MODELS

            emb = m.get("embedded", name)
            if emb not in EMBEDDED_MODELS:
                raise ConfigError(f"config: models.{name}: unknown embedded model {emb!r} "
                                  f"(known: {', '.join(EMBEDDED_MODELS)})")
