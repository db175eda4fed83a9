"""The config schema (src/coec/config/schemas/config.schema.yaml, package data) and its defaults:
the one home of every default the workflow, the CLI and the stages' options share. Light (no
validation, no coec import), so an options dataclass reads its defaults here
(:func:`config_field`) without importing the validator (``coec.config.validate``)."""

from __future__ import annotations

import dataclasses
import functools
from importlib.resources import files
from pathlib import Path
from typing import Any

import yaml

SCHEMA = Path(str(files("coec") / "config" / "schemas" / "config.schema.yaml"))  # package data


@functools.cache
def _load_schema(path: str) -> dict[str, Any]:
    out: dict[str, Any] = yaml.safe_load(Path(path).read_text())
    return out


def schema(path: str | Path = SCHEMA) -> dict[str, Any]:
    """The config schema (read once per process)."""
    return _load_schema(str(path))


def schema_default(key: str) -> Any:
    """The schema's default of a config key, the one home of every default the workflow and the
    CLI share. ``key`` is dotted; ``*`` stands for any entry name, e.g.
    ``schema_default("calibration.*.seed") == 0``. A default given under a conditional
    (``allOf: [{if: ..., then: ...}]``, e.g. an embedded dataset's ``eval_every``) counts too.
    Raises KeyError naming the key when the schema gives it no default."""
    node, root = schema(), schema()
    for part in key.split("."):
        node = deref(node, root)
        props = dict(node.get("properties") or {})
        for branch in node.get("allOf") or []:
            props.update(branch.get("then", {}).get("properties") or {})
        if part == "*" and isinstance(node.get("additionalProperties"), dict):
            node = node["additionalProperties"]
        elif part in props:
            node = props[part]
        else:
            raise KeyError(f"the config schema has no key {key!r}")
    if "default" not in node:  # a default beside a $ref wins over the target's
        node = deref(node, root)
    if "default" not in node:
        raise KeyError(f"the config schema gives {key!r} no default")
    return node["default"]


def config_field(key: str) -> Any:
    """A dataclass field whose default is the schema's default of ``key`` (:func:`schema_default`),
    the key kept in the field's ``metadata["config_key"]``: a stage's options default as the CLI
    (``coec.cli.config_arg``) and the workflow do (tests/unit/test_config_schema.py checks every
    options dataclass)."""
    return dataclasses.field(default=schema_default(key), metadata={"config_key": key})


def deref(node: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    """A schema node with its local ``$ref`` followed."""
    while isinstance(node, dict) and "$ref" in node:
        target = root
        for r in node["$ref"].removeprefix("#/").split("/"):
            target = target[r]
        node = target
    return node
