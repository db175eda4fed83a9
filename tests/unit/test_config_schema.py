"""One layer of defaults, the config schema (``coec.config.schema``): every default of a stage's
options, each options dataclass field that has one and each CLI option that names a config key,
is the schema's default of that key, or nothing (None, False, an empty collection); an option the
CLI and a dataclass both take names the same key; and a stage's options built from its CLI
defaults equal the dataclass's own."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
from collections.abc import Iterator
from typing import Any

from coec import cli
from coec.calibrate.options import CalibrateOptions, CalibrationWindows
from coec.compensate.stage import CompensateOptions
from coec.config.schema import schema_default
from coec.evaluate.llamacpp.options import GgufPplOptions
from coec.evaluate.options import PplOptions, ZeroshotOptions
from coec.export.formats import ExportRequest
from coec.model.source import CellSource
from coec.model.stream_options import StreamOptions
from coec.select.options import SelectOptions

#: the modules that hold the stages' options dataclasses (and the cell's source)
MODULES = (
    "coec.model.source",
    "coec.model.stream_options",
    "coec.calibrate.options",
    "coec.select.options",
    "coec.compensate.stage",
    "coec.evaluate.options",
    "coec.evaluate.llamacpp.options",
    "coec.export.formats",
    "coec.iterative.stages",
    "coec.select.search.stage",
)
#: CLI stage -> the dataclasses it builds from its flags
STAGE_CLASSES: dict[str, tuple[type, ...]] = {
    "calibrate": (CellSource, CalibrationWindows, CalibrateOptions, StreamOptions),
    "gram-check": (CellSource,),
    "select": (CellSource, SelectOptions),
    "compensate": (CellSource, CompensateOptions),
    "ppl": (CellSource, PplOptions, StreamOptions, GgufPplOptions),
    "zeroshot": (CellSource, ZeroshotOptions, StreamOptions),
    "geometry": (CellSource,),
    "imatrix": (CellSource, CalibrationWindows),
    "export": (ExportRequest,),
}


def options_classes() -> Iterator[type]:
    """Every dataclass defined in :data:`MODULES`."""
    for name in MODULES:
        for obj in vars(importlib.import_module(name)).values():
            if isinstance(obj, type) and dataclasses.is_dataclass(obj) and obj.__module__ == name:
                yield obj


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def _nothing(value: Any) -> bool:
    return value is None or value is False or (isinstance(value, (tuple, list, dict)) and not value)


def test_options_dataclass_defaults_are_the_schemas():
    problems, keyed = [], 0
    classes = list(options_classes())
    assert {CellSource, CalibrationWindows, PplOptions, ZeroshotOptions, SelectOptions, StreamOptions} <= set(classes)
    for cls in classes:
        for f in dataclasses.fields(cls):
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                continue  # required
            value, key = _default(f), f.metadata.get("config_key")
            where = f"{cls.__module__}.{cls.__name__}.{f.name}"
            if key is not None:
                keyed += 1
                if value != schema_default(key):
                    problems.append(f"{where}: default {value!r} != schema {key} = {schema_default(key)!r}")
            elif dataclasses.is_dataclass(value):
                if value != type(value)():  # an options dataclass at its own (checked) defaults
                    problems.append(f"{where}: default {value!r} is not {type(value).__name__}()")
            elif not _nothing(value):
                problems.append(f"{where}: default {value!r} is not the config schema's (config_field)")
    assert not problems, problems
    assert keyed >= 15


def _cli_options() -> Iterator[tuple[str, argparse.Action]]:
    """(command, action) of every option of every (nested) subcommand of ``coec``."""
    stack: list[tuple[str, argparse.ArgumentParser]] = [("", cli.build_parser())]
    while stack:
        name, parser = stack.pop()
        for a in parser._actions:
            if isinstance(a, argparse._SubParsersAction):
                stack += [(f"{name} {sub}".strip(), p) for sub, p in a.choices.items()]
            else:
                yield name, a


def test_cli_defaults_are_the_schemas():
    seen = 0
    for name, a in _cli_options():
        key = getattr(a, "config_key", None)
        if key is not None:
            assert a.default == schema_default(key), (name, a.option_strings, key)
            seen += 1
    assert seen >= 20


def test_cli_and_dataclass_name_the_same_key():
    """A flag and the dataclass field it fills (same name) default from the same config key."""
    fields = {
        stage: {f.name: f for cls in classes for f in dataclasses.fields(cls)}
        for stage, classes in STAGE_CLASSES.items()
    }
    matched, problems = 0, []
    for name, a in _cli_options():
        f = fields.get(name, {}).get(a.dest)
        if f is None or "config_key" not in f.metadata:
            continue
        matched += 1
        if getattr(a, "config_key", None) != f.metadata["config_key"]:
            problems.append(f"coec {name} {a.option_strings[0]}: {getattr(a, 'config_key', None)} != {f.metadata}")
    assert not problems, problems
    assert matched >= 15


def test_stage_options_from_cli_defaults_equal_the_dataclasses():
    parser = cli.build_parser()
    ds = '{"source": "files", "calib": "c.txt", "eval": "e.txt"}'
    model = ["--model", "m", "--out", "o"]
    a = parser.parse_args(["ppl", *model, "--dataset", ds, "--seqlen", "8"])
    assert cli.ppl_options(a) == PplOptions({"source": "files", "calib": "c.txt", "eval": "e.txt"}, 8)
    assert cli.cell_source(a) == CellSource("m", device=schema_default("compute.device"))
    a = parser.parse_args(["calibrate", *model, "--dataset", ds, "--nsamples", "4", "--seqlen", "8"])
    assert cli.calibration_windows(a) == CalibrationWindows(a.dataset, 4, 8)
    assert cli.stream_options(a) == StreamOptions()
    a = parser.parse_args(["zeroshot", *model, "--tasks", "rte"])
    opts = ZeroshotOptions(("rte",))
    assert (a.batch_size, a.max_length, a.log_samples) == (opts.batch_size, opts.max_length, opts.log_samples)
    assert opts.batch_size == schema_default("evaluation.zeroshot_batch_size") == 16  # once 8 in the dataclass
    a = parser.parse_args(["select", *model, "--grams", "g", "--method", "flap", "--ratio", "0.5"])
    opts = SelectOptions("flap", 0.5)
    assert (a.group_rounding, a.channel_multiple, a.channel_rounding) == (
        opts.group_rounding,
        opts.channel_multiple,
        opts.channel_rounding,
    )
