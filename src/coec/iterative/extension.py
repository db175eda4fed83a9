"""The iterative multi-domain FLAP method as an extension of the shared modules: its config
checks (``iterative`` and ``domains`` sections), the calibrations its table and figure run,
its ``coec iterative`` command group, its claims and its artifacts in the README and report."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from coec.config.validate import ConfigError
from coec.extension import EXTENSIONS, Extension, Need
from coec.io import paths
from coec.iterative import claims as claims  # imported for its side effect: it registers the method's claims
from coec.iterative import cli, targets

Config = dict[str, Any]


def check_config(cfg: Config, need: Need) -> None:
    """Mixes and domains (``targets.check_config``), and every name its table and figure rows use."""
    try:
        targets.check_config(cfg)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    it = cfg.get("iterative") or {}
    for key in ("table", "calibration_size"):
        rows = it.get(key, {}).get("rows", [])
        for i, row in enumerate(rows):
            if "compensation" in row:
                need("compensations", row["compensation"], f"iterative.{key}.rows[{i}].compensation")
            if "compare" in row and row["compare"] not in {r["label"] for r in rows}:
                raise ConfigError(f"config: iterative.{key}.rows[{i}].compare: no row is labelled {row['compare']!r}")
    for i, m in enumerate(it.get("table", {}).get("models", [])):
        need("models", m, f"iterative.table.models[{i}]")
    if "calibration_size" in it:
        need("models", it["calibration_size"]["model"], "iterative.calibration_size.model")


def model_calibrations(cfg: Config) -> Iterable[tuple[list[str], list[str | None]]]:
    """(models, calibrations or mixes) of the iterative table and calibration-size figure."""
    it = cfg.get("iterative") or {}
    if "table" in it:
        t = it["table"]
        yield t["models"], [t["calibration"]] + [r.get("calibration") for r in t["rows"]]
    if "calibration_size" in it:
        f = it["calibration_size"]
        base = f.get("calibration", it.get("table", {}).get("calibration"))
        yield [f["model"]], [base] + [r.get("calibration") for r in f["rows"]]


def seqlen_key(cfg: Config, calib: str) -> tuple[str, int] | None:
    """(config key, length) of an iterative mix."""
    mixes = targets.mix_entries(cfg)
    return (f"iterative.mixes.{calib}.seqlen", mixes[calib]["seqlen"]) if calib in mixes else None


def claims_spec(cfg: Config) -> dict[str, Any]:
    """The result files of its claims (``coec.iterative.claims``)."""
    it = targets.section(cfg)
    return {
        "table_iterative": paths.table_file("table_iterative") if "table" in it else None,
        "iterative_size": targets.size_spec(cfg)["panels"] if "calibration_size" in it else None,
    }


def report_items(cfg: Config) -> list[tuple[str, str, str]]:
    """Its table and figure in the README and Snakemake report."""
    it = targets.section(cfg)
    items = []
    if "table" in it:
        items += [
            (paths.table_file("table_iterative"), "Iterative multi-domain FLAP: perplexity", ""),
            (
                paths.table_file("table_iterative_zeroshot"),
                "Iterative multi-domain FLAP: zero-shot mean accuracy (7 tasks)",
                "",
            ),
        ]
    if "calibration_size" in it:
        items.append(
            (
                paths.figure_file("iterative_calibration_size"),
                "Iterative multi-domain FLAP: perplexity against calibration size",
                targets.size_spec(cfg)["caption"],
            )
        )
    return items


EXTENSION = EXTENSIONS.register(
    Extension(
        name="iterative",
        check_config=check_config,
        model_calibrations=model_calibrations,
        seqlen_key=seqlen_key,
        add_cli=cli.add_parser,
        run_cli=cli.run,
        claims_spec=claims_spec,
        report_items=report_items,
    )
)
