"""The model a stage reads against what the config expects: layer count, head counts, sequence
lengths, and the weights the workflow planned the job for.

Checked twice: when the config is validated (``coec.config.validate``), for models whose config.json is
readable then (a local folder, or an embedded model whose shape the package knows), and at
the start of every stage that loads a model (``--expect``), before any work. Each mismatch is
one line naming the config key and both values, e.g.
``models.tiny.num_layers = 1 but the model's config.json has num_hidden_layers = 2``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coec.data.bundled import EMBEDDED_SHAPES
from coec.io.provenance import PLAN_DIGITS, resolved_commit

if TYPE_CHECKING:
    from coec.model.source import ResolvedSource


class ModelMismatch(ValueError):
    """The model disagrees with the config / the stage's arguments / the plan."""


def shape_of(cfg: dict[str, Any]) -> dict[str, Any]:
    """The checked keys of an HF config dict (num_key_value_heads defaults to the heads)."""
    heads = cfg.get("num_attention_heads")
    return {
        "num_hidden_layers": cfg.get("num_hidden_layers"),
        "num_attention_heads": heads,
        "num_key_value_heads": cfg.get("num_key_value_heads") or heads,
        "max_position_embeddings": cfg.get("max_position_embeddings"),
    }


def read_shape(model_dir: str | Path) -> dict[str, Any] | None:
    """The shape of a model folder's config.json (layers, heads, sequence length), or None when it cannot be read."""
    path = Path(model_dir).expanduser() / "config.json"
    try:
        return shape_of(json.loads(path.read_text()))
    except (OSError, ValueError):
        return None


def local_model_type(source: str) -> str | None:
    """The ``model_type`` of a local model folder's config.json; None for a hub id or an
    unreadable folder."""
    try:
        model_type: str | None = json.loads((Path(source).expanduser() / "config.json").read_text()).get("model_type")
        return model_type
    except (OSError, ValueError, AttributeError):
        return None


def config_shape(model: dict[str, Any], name: str) -> tuple[dict[str, Any] | None, str]:
    """(shape, where it came from) of a config ``models.<name>`` entry, when known without
    loading anything: an embedded model's (package data) or a local folder's config.json.
    Hub ids give (None, "")."""
    if model["source"] == "embedded":
        emb = model.get("embedded", name)
        return EMBEDDED_SHAPES.get(emb), f"the embedded model {emb!r}"
    path = Path(model["source"]).expanduser()
    if path.is_dir():
        return read_shape(path), f"the model's config.json ({path})"
    return None, ""


def _mismatch(key: str, value: object, what: str, field: str, actual: object) -> ModelMismatch:
    return ModelMismatch(f"{key} = {value} but {what} has {field} = {actual}")


def check_expected(geom: dict[str, Any], expect: dict[str, Any], what: str = "the model's config.json") -> None:
    """Raise :class:`ModelMismatch` (one line) when ``geom`` disagrees with ``expect``.

    expect: ``model`` (config key of the model, e.g. ``models.tiny``; default ``model``),
    ``num_layers`` (== num_hidden_layers), ``seqlen`` ({config key: length}, each at most
    max_position_embeddings)."""
    where = expect.get("model", "model")
    n = expect.get("num_layers")
    if n is not None and geom.get("num_hidden_layers") is not None and int(n) != int(geom["num_hidden_layers"]):
        raise _mismatch(f"{where}.num_layers", n, what, "num_hidden_layers", geom["num_hidden_layers"])
    max_pos = geom.get("max_position_embeddings")
    for key, length in (expect.get("seqlen") or {}).items():
        if max_pos is not None and length is not None and int(length) > int(max_pos):
            raise _mismatch(key, length, what, "max_position_embeddings", max_pos)


def check_keep(
    geom: dict[str, Any], keep: dict[str, Any], keep_path: str, what: str = "the model's config.json"
) -> None:
    """A keep.json against the model it will prune: layer count and head counts."""
    pairs = (
        ("layers", len(keep.get("layers", [])), "num_hidden_layers"),
        ("n_heads", keep.get("n_heads"), "num_attention_heads"),
        ("n_kv", keep.get("n_kv"), "num_key_value_heads"),
    )
    for key, value, field in pairs:
        actual = geom.get(field)
        if value is not None and actual is not None and int(value) != int(actual):
            raise _mismatch(f"{keep_path}: {key}", value, what, field, actual)


def check_identity(resolved: ResolvedSource, expect: dict[str, Any]) -> None:
    """The weights a stage is about to read (the folder it resolved, its digests) against those
    its job was planned for (``provenance.planned_identity``, in ``expect``): the same files with
    the same contents (``weights``), or the same hub commit (``commit``). Raises
    :class:`ModelMismatch` (one line naming the model and the changed files) otherwise, before
    any work."""
    where = expect.get("model", "model")
    model_dir = resolved.model_dir
    planned = expect.get("weights")
    if planned is not None:
        now = {name: sha[:PLAN_DIGITS] for name, sha in resolved.manifest.items()}
        diff = [f"{n} changed" for n in sorted(planned.keys() & now.keys()) if planned[n] != now[n]]
        diff += [f"{n} added" for n in sorted(now.keys() - planned.keys())]
        diff += [f"{n} removed" for n in sorted(planned.keys() - now.keys())]
        if diff:
            raise ModelMismatch(
                f"{where}: the weights in {model_dir} changed since the workflow planned "
                f"this job ({', '.join(diff)}); run snakemake again to re-plan"
            )
    commit = expect.get("commit")
    if commit is not None and resolved_commit(model_dir) != commit:
        raise ModelMismatch(
            f"{where}: the hub revision now resolves to commit {resolved_commit(model_dir)} "
            f"({model_dir}), but the workflow planned this job for {commit}; run "
            f"snakemake again to re-plan"
        )


def check_stage(
    resolved: ResolvedSource, expect: dict[str, Any] | None = None, seqlen: int | None = None
) -> dict[str, Any]:
    """Stage start: the model's config.json against ``expect`` (from the workflow), the stage's
    sequence length (named by ``expect['seqlen_key']``, else ``--seqlen``) and the cell's
    keep.json. Returns the shape. ``resolved``: the stage's sources as the job resolved them
    (``coec.model.source.resolve_source``); reads config.json and, where the plan recorded the
    weights, their cached digests and the keep set, each kept there for the stage."""
    model_dir = resolved.model_dir
    geom = read_shape(model_dir)
    if geom is None:
        raise FileNotFoundError(f"no readable config.json in model folder {model_dir}")
    what = f"the model's config.json ({model_dir})"
    expect = dict(expect or {})
    if seqlen is not None:
        key = expect.pop("seqlen_key", None) or "--seqlen"
        expect["seqlen"] = {**(expect.get("seqlen") or {}), key: seqlen}
    check_expected(geom, expect, what)
    check_identity(resolved, expect)
    if resolved.keep is not None:
        check_keep(geom, resolved.keep, str(resolved.keep_path), what)
    return geom
