"""Which model and which cell: the first typed argument of every stage body.

A stage body takes ``(source, options, out)``: :class:`CellSource` says which model and which
cell (the model source at a revision, the compute dtype and device, the keep set and the
compensation blocks, the labels recorded in the output); the stage's options dataclass (in the
stage's package: ``coec.calibrate.options``, ``coec.select.options``, ``coec.evaluate.options``,
...) says what to run on it. ``coec.cli`` builds both once from the parsed flags. No torch import
here, so ``coec --help`` stays quick.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class CellSource:
    """A model cell: ``model`` (folder or hub id) at ``revision``, loaded in ``dtype`` on
    ``device`` (or spread by ``device_map``), pruned by ``keep`` (keep.json; None: dense) and
    given the compensated weights of ``comp`` (block files); ``cell``: the labels recorded."""

    model: str
    dtype: str = "float32"
    device: str | None = None
    revision: str | None = None
    trust_remote_code: bool = False
    keep: str | None = None
    comp: tuple[str, ...] = ()
    cell: dict[str, Any] = field(default_factory=dict)
    device_map: str | None = None

    @property
    def hub(self) -> tuple[str | None, bool]:
        """(revision, trust_remote_code), as every load of the model and tokenizer takes them."""
        return self.revision, self.trust_remote_code
