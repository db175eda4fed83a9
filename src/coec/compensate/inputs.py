"""Data a compensation method needs beyond its own cell's Grams, declared once per method
(``Method.inputs``) and used on both sides of a compensate job:

* the workflow side (``workflow_path``): the file or folder the compensate rule takes as an
  input for a job of a cell (None: these options need none), passed to the stage in the
  spec's ``inputs``;
* the config side (``check_reference``): the entry it names exists (given the registered methods);
* the stage side (``open`` once per job, then ``for_module``): the tensors of one module, which
  become entries of ``Problem.inputs``.

Three kinds cover the built-in methods; a plug-in may combine them or define its own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from coec.io import paths
from coec.model.arch import pruned_value_proj

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Job:
    """A compensate job: a block of layers of one cell (names as the workflow's wildcards give
    them, not paths)."""

    model: str
    calib: str
    select: str
    ratio: float | str
    first: int | str
    last: int | str


@dataclass(frozen=True)
class Module:
    """What the stage knows of one module when it builds the problem: the layer, the module
    name, the layer's keep entry, the model's attention geometry and the layer's tensors that
    the stage read (``v_proj`` among them), on ``device``."""

    layer: int
    name: str
    keep: dict[str, Any]
    geometry: Any
    tensors: dict[str, torch.Tensor]
    device: torch.device


class MethodInput(Protocol):
    """One kind of extra data (see the module docstring)."""

    @property
    def name(self) -> str: ...

    def workflow_path(self, options: Any, job: Job) -> str | None: ...

    def open(self, path: str | None, first: int, last: int) -> Any: ...

    def for_module(self, handle: Any, module: Module, options: Any) -> dict[str, Any]: ...

    def check_reference(
        self, method: str, options: Any, config: dict[str, Any], where: str, methods: Mapping[str, Any]
    ) -> str | None: ...


@dataclass(frozen=True)
class OtherCell:
    """The weights of another compensation of the same cell and layers, named by option
    ``option`` (e.g. blend's ``base``): ``<prefix>weight`` (d_out, k) and ``<prefix>bias`` (d_out,) or None."""

    name: str
    option: str
    prefix: str = "base_"

    def workflow_path(self, options: Any, job: Job) -> str | None:
        cell = paths.cell_dir(job.model, job.calib, job.select, job.ratio, getattr(options, self.option))
        return paths.block_file(cell, job.first, job.last)

    def open(self, path: str | None, first: int, last: int) -> dict[str, torch.Tensor]:
        from coec.io.artifacts import read_comp_block  # deferred: keeps the job boundary torch-free

        if path is None:
            raise ValueError(f"input {self.name!r}: the compensate stage needs its block file")
        return read_comp_block(path, first, last)

    def for_module(self, handle: dict[str, torch.Tensor], module: Module, options: Any) -> dict[str, Any]:
        key = f"layer{module.layer}.{module.name}"
        return {
            f"{self.prefix}weight": handle[f"{key}.weight"].to(module.device),
            f"{self.prefix}bias": handle.get(f"{key}.bias"),
        }

    def check_reference(
        self, method: str, options: Any, config: dict[str, Any], where: str, methods: Mapping[str, Any]
    ) -> str | None:
        """The named compensation exists and takes no other cell itself (no chains, no cycles);
        ``methods`` the registered methods by name."""
        name = getattr(options, self.option)
        comps = config.get("compensations", {})
        if name not in comps:
            return (
                f"{where}.{self.option} names unknown compensations entry {name!r} "
                f"(known: {', '.join(comps) or 'none'})"
            )
        other = methods[comps[name]["method"]]
        if any(isinstance(i, OtherCell) for i in other.inputs):
            return (
                f"{where}.{self.option}: the {self.option} of a {method} cannot be a {other.name} "
                f"(a method that takes another cell's weights itself)"
            )
        return None


@dataclass(frozen=True)
class OtherCalibration:
    """The Grams of another calibration set of the same model, named by option ``option`` (e.g.
    blend's ``holdout``; null: no input): ``<prefix>gram`` (a sum), ``<prefix>mean``, ``<prefix>count``."""

    name: str
    option: str
    prefix: str = "holdout_"

    def workflow_path(self, options: Any, job: Job) -> str | None:
        calib = getattr(options, self.option)
        return paths.grams_dir(job.model, calib) if calib else None

    def open(self, path: str | None, first: int, last: int) -> str | None:
        return path

    def for_module(self, handle: str | None, module: Module, options: Any) -> dict[str, Any]:
        if handle is None:
            return {}
        from coec.io.artifacts import read_gram_layer  # deferred: keeps the job boundary torch-free

        st = read_gram_layer(handle, module.layer, module.name)
        return {
            f"{self.prefix}gram": st["gram"].to(module.device),
            f"{self.prefix}mean": st["mean"].to(module.device),
            f"{self.prefix}count": st["count"],
        }

    def check_reference(
        self, method: str, options: Any, config: dict[str, Any], where: str, methods: Mapping[str, Any]
    ) -> str | None:
        """The named calibration set exists (or none is named)."""
        name = getattr(options, self.option)
        calibs = config.get("calibration", {})
        if name is not None and name not in calibs:
            return (
                f"{where}.{self.option} names unknown calibration entry {name!r} (known: {', '.join(calibs) or 'none'})"
            )
        return None


@dataclass(frozen=True)
class ValueProjection:
    """The pruned ``v_proj`` in the query-head layout, (k, d_model), on ``o_proj`` when
    ``needed(options)`` (COEC's alignment penalty). Read from the model, so no workflow input."""

    name: str
    needed: Callable[[Any], bool]

    def workflow_path(self, options: Any, job: Job) -> str | None:
        return None

    def open(self, path: str | None, first: int, last: int) -> None:
        return None

    def for_module(self, handle: None, module: Module, options: Any) -> dict[str, Any]:
        if module.name != "o_proj" or not self.needed(options):
            return {}
        vp = pruned_value_proj(module.tensors["v_proj"], module.keep["kv_groups"], module.geometry)
        return {self.name: vp.to(module.device)}

    def check_reference(
        self, method: str, options: Any, config: dict[str, Any], where: str, methods: Mapping[str, Any]
    ) -> str | None:
        return None
