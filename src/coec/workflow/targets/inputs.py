"""The extra inputs of a compensate job beyond its upstream rules' outputs: its method's declared
inputs (``Method.inputs``: another cell's blocks, held-out Grams) and the calibration's Gram check."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from coec.compensate.inputs import Job, OtherCell
from coec.compensate.options import method, resolve, top_level_options
from coec.io import paths
from coec.workflow.targets.figures import fig2_spec, figure_inputs
from coec.workflow.targets.tables import table_inputs, table_names

Config = dict[str, Any]


def method_inputs(config: Config, comp: str, job: Job, options: Any = None) -> dict[str, str]:
    """The extra inputs of compensate job ``job`` (``Method.inputs`` of compensation ``comp``'s
    method, with the entry's top-level options: ``options`` when resolved already), name -> path;
    {} for a method that needs none."""
    spec = config["compensations"][comp]
    m = method(spec["method"])
    if not m.inputs:
        return {}
    if options is None:
        options = resolve(m.name, top_level_options(spec))
    paths_in = {inp.name: inp.workflow_path(options, job) for inp in m.inputs}
    return {name: p for name, p in paths_in.items() if p is not None}


def consumers(config: Config) -> dict[str, list[str]]:
    """{compensation: the compensations whose blocks its method reads (``OtherCell`` inputs:
    blend's ``base``)}, for those that read any."""
    out = {}
    for name, spec in config["compensations"].items():
        m = method(spec["method"])
        cells = [inp for inp in m.inputs if isinstance(inp, OtherCell)]
        if cells:
            options = resolve(m.name, top_level_options(spec))
            out[name] = sorted({getattr(options, inp.option) for inp in cells})
    return out


def base_cells(config: Config) -> list[tuple[str, str]]:
    """(selection folder, compensation) of every cell whose blocks a method of another cell of
    the config's tables and Fig. 2 reads (blend's base), sorted."""
    reads = consumers(config)
    if not reads:
        return []
    files = [f for name in table_names(config) for f in table_inputs(config, name)]
    if "fig2" in config:
        files += figure_inputs(fig2_spec(config))
    out = set()
    for f in files:
        cell = Path(f).parent
        for base in reads.get(cell.name, []) if cell.parent.name != paths.RESULTS else []:
            out.add((cell.parent.as_posix(), base))
    return sorted(out)


def gram_check_input(config: Config, comp: str, model: str, calib: str) -> list[str]:
    """The Gram check a compensate job reads (``compensate.gram_check``): the calibration's, for a
    method that reports no errors of its own; none for one that does (coec)."""
    reports = method(config["compensations"][comp]["method"]).reports_errors
    return [] if reports else [paths.gram_check_file(model, calib)]
