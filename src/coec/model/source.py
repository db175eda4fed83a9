"""Which model and which cell: the first typed argument of every stage body.

A stage body takes ``(source, options, out)``: :class:`CellSource` says which model and which
cell (the model source at a revision, the compute dtype and device, the keep set and the
compensation blocks, the labels recorded in the output); the stage's options dataclass (in the
stage's package: ``coec.calibrate.options``, ``coec.select.options``, ``coec.evaluate.options``,
...) says what to run on it. ``coec.cli`` builds both once from the parsed flags.

A job resolves its sources once (:class:`ResolvedSource`, :func:`resolve_source`): the
model's local folder, the digests of its weight files and the keep set, read by the stage-start
check, the load or stream of the model and the provenance alike. No torch import here, so
``coec --help`` stays quick.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from coec.config.schema import config_field


@dataclass(frozen=True)
class ResolvedSource:
    """A cell's sources as one job resolved them (:func:`resolve_source`): the local
    folder ``model_dir`` of the model (config.json and every shard header checked once), and,
    each read on first use and then kept, the digests of its weight files (``manifest``: the
    plan's identity check and the provenance read the same) and the keep set (``keep``: the
    stage-start check and the cell read the same)."""

    model_dir: Path
    keep_path: str | None = None

    @cached_property
    def manifest(self) -> dict[str, str]:
        """``{file name: sha256}`` of the model's weight files (``io.provenance.weights_manifest``)."""
        from coec.io.provenance import weights_manifest  # deferred: huggingface_hub, +0.9 s at CLI start

        return weights_manifest(self.model_dir)

    @cached_property
    def keep(self) -> dict[str, Any] | None:
        """keep.json as read (``io.artifacts.read_keep``); None: a dense cell."""
        from coec.io.artifacts import read_keep  # deferred: torch, ~3 s at CLI start

        return read_keep(self.keep_path) if self.keep_path else None

    def keep_for(self, n_layers: int) -> dict[str, Any] | None:
        """The keep set checked against the model's ``n_layers`` (as ``read_keep(path, n_layers)``)."""
        from coec.io.artifacts import check_keep_layers  # deferred: torch, ~3 s at CLI start

        keep = self.keep
        return None if keep is None else check_keep_layers(keep, str(self.keep_path), n_layers)


@dataclass(frozen=True)
class CellSource:
    """A model cell: ``model`` (folder or hub id) at ``revision``, loaded in ``dtype`` on
    ``device`` (or spread by ``device_map``), pruned by ``keep`` (keep.json; None: dense) and
    given the compensated weights of ``comp`` (block files); ``cell``: the labels recorded;
    ``resolved``: what the job resolved of it (None: not yet, :func:`resolve_source`)."""

    model: str
    dtype: str = config_field("models.*.dtype")
    device: str | None = None
    revision: str | None = None
    trust_remote_code: bool = False
    keep: str | None = None
    comp: tuple[str, ...] = ()
    cell: dict[str, Any] = field(default_factory=dict)
    device_map: str | None = None
    resolved: ResolvedSource | None = field(default=None, compare=False, repr=False)

    @property
    def hub(self) -> tuple[str | None, bool]:
        """(revision, trust_remote_code), as every load of the model and tokenizer takes them."""
        return self.revision, self.trust_remote_code

    @property
    def local(self) -> ResolvedSource:
        """What the job resolved of the cell; a source not resolved yet raises."""
        if self.resolved is None:
            raise RuntimeError(f"{self.model}: the cell's sources are not resolved (resolve_source)")
        return self.resolved

    def provenance(self) -> dict[str, Any]:
        """``io.provenance.model_provenance`` of the resolved model: its folder and its digests as
        the job read them."""
        from coec.io.provenance import model_provenance  # deferred: huggingface_hub, +0.9 s at CLI start

        return model_provenance(self.model, *self.hub, self.local.model_dir, self.local.manifest)


def resolve_source(source: CellSource) -> CellSource:
    """``source`` with its sources resolved (``source.resolved``: the model's folder by
    ``coec.model.load.resolve_model_dir``, its digests and keep set read on first use), once per
    job: a source already resolved (by the CLI's stage-start check) is returned as it is."""
    if source.resolved is not None:
        return source
    from coec.model.load import resolve_model_dir  # deferred: torch, ~3 s at CLI start

    return replace(source, resolved=ResolvedSource(resolve_model_dir(source.model, *source.hub), source.keep))


def source_config(source: CellSource) -> tuple[CellSource, Path, Any]:
    """``source`` resolved (:func:`resolve_source`), its model's local folder and its config
    (``coec.model.load.load_config``)."""
    from coec.model.load import load_config  # deferred: torch, ~3 s at CLI start

    source = resolve_source(source)
    return source, source.local.model_dir, load_config(source.local.model_dir, *source.hub)
