"""Extensions: a method family with its own config sections, CLI command group, claims and report
items, plugged into the shared modules through the hooks below instead of branches in them.

The iterative multi-domain FLAP method is one (``coec.iterative.extension``). The shared modules
call :func:`extensions` and ask each for its part: the config validation its checks and the
calibrations its tables use; the CLI its command group; the claims report its result files and
claims; the README and Snakemake report its artifacts.

    EXTENSIONS.register(Extension(name="mine", check_config=..., add_cli=..., ...))
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from coec.registry import Registry

__all__ = ["Extension", "EXTENSIONS", "extensions", "BUILTIN"]

Config = dict[str, Any]
#: A config reference check: need(kind, name, where) raises naming ``where`` if ``config[kind]``
#: has no entry ``name``.
Need = Callable[[str, str, str], None]


@dataclass(frozen=True)
class Extension:
    """One extension's hooks (each optional).

    check_config(config, need): its sections' cross-references and rules (ConfigError/ValueError);
    model_calibrations(config): (models, calibration names) pairs its tables and figures run;
    seqlen_key(config, calib): (config key, length) of a calibration name it defines, or None;
    add_cli(subparsers): adds its command group ``coec <name> ...``; run_cli(args, parser): runs it
    (exit code); claims_spec(config): its entries of the claims spec (result files, curves);
    report_items(config): (path, title, caption) of its artifacts, in report order.
    """

    name: str
    check_config: Callable[[Config, Need], None] | None = None
    model_calibrations: Callable[[Config], Iterable[tuple[list[str], list[str | None]]]] | None = None
    seqlen_key: Callable[[Config, str], tuple[str, int] | None] | None = None
    add_cli: Callable[[Any], None] | None = None
    run_cli: Callable[[argparse.Namespace, argparse.ArgumentParser], int] | None = None
    claims_spec: Callable[[Config], dict[str, Any]] | None = None
    report_items: Callable[[Config], list[tuple[str, str, str]]] | None = None


EXTENSIONS: Registry[Extension] = Registry("extension")

#: The extensions shipped with the package (imported by :func:`extensions`).
BUILTIN = ("coec.iterative.extension",)


def extensions() -> list[Extension]:
    """Every registered extension, the built-in ones imported first."""
    for module in BUILTIN:
        importlib.import_module(module)
    return list(EXTENSIONS.values())
