"""Where a job reads a model and a dataset from, as functions of the validated config."""

from __future__ import annotations

from typing import Any

from coec.io import paths

Config = dict[str, Any]


def model_path(config: Config, name: str) -> str:
    """What the CLI loads: the converted folder for embedded models, else the hub id / dir."""
    m = config["models"][name]
    return paths.model_dir(name) if m["source"] == "embedded" else str(m["source"])


def dataset_spec(config: Config, name: str) -> dict[str, Any]:
    """The data.load_split spec of a dataset (embedded ones read their converted folder)."""
    d = dict(config["datasets"][name])
    if d["source"] == "embedded":
        d["dir"] = paths.text_dir(name)
    return d
