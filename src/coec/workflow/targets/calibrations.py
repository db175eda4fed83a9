"""The resized calibration sets of the calibration-size figures: a set with ``nsamples``
replaced is its own calibration set (own Grams, selections and cells), named ``<base>-n<N>``.
Pure: the wiring object (``coec.workflow.wiring``) adds them to its view of the config; the validated
config itself is never changed."""

from __future__ import annotations

from typing import Any

Config = dict[str, Any]


def sized_calibration(registry: Config, base: str, n: int | str) -> str:
    """Name of calibration set ``base`` of ``registry`` with nsamples = n: ``base`` itself when n
    is its own size (its Grams, selections and cells are shared with the tables), else
    ``<base>-n<N>``."""
    if int(n) == int(registry[base]["nsamples"]):
        return base
    return f"{base}-n{n}"


def sized_entry(registry: Config, base: str, n: int | str) -> dict[str, Any]:
    """{name: entry} of ``base`` resized to n sequences; {} when n is its own size."""
    name = sized_calibration(registry, base, n)
    return {} if name == base else {name: dict(registry[base], nsamples=int(n))}


def fig2_calibrations(config: Config) -> dict[str, Any]:
    """Fig. 2's calibration sets (the base set with nsamples replaced), name -> entry."""
    out: dict[str, Any] = {}
    if "fig2" in config:
        for n in config["fig2"]["nsamples"]:
            for name, entry in sized_entry(config["calibration"], config["fig2"]["calibration"], n).items():
                out.setdefault(name, entry)
    return out
