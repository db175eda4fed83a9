"""Export formats: how ``coec export --format <name>`` writes a pruned, compensated cell. One
registry entry per format (``EXPORT_FORMATS``); a plug-in registers its own the same way
(``plugins:`` in the config, or ``COEC_PLUGINS`` for the CLI).

A format is a name, a one-line description, its own CLI options (added to ``coec export`` and
refused with any other format) and ``write(request) -> dict``: the record of what it wrote. The
built-in formats, declared here and registered by ``coec.export.stage`` (which implements them;
imported on their first lookup), are ``hf`` (a transformers checkpoint folder in a stock class,
reloaded and checked) and ``gguf`` (one file for llama.cpp).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from coec.model.source import CellSource, ResolvedSource
from coec.registry import Registry


@dataclass(frozen=True)
class ExportRequest:
    """What to export: the source model (folder or hub id), the cell's keep set (``None``: the
    dense model) and compensated blocks, the dtype, the output path, whether a previous export
    there may be replaced, the cell's labels (recorded in the output), the hub options, and the
    format's own options (by ``FormatOption.dest``; absent ones take the format's defaults);
    ``resolved``: the sources as the CLI's stage-start check resolved them (None: not yet)."""

    model: str
    keep: str | None
    comp: tuple[str, ...]
    dtype: str
    out: str
    force: bool = False
    cell: Mapping[str, Any] = field(default_factory=dict)
    revision: str | None = None
    trust_remote_code: bool = False
    options: Mapping[str, Any] = field(default_factory=dict)
    resolved: ResolvedSource | None = field(default=None, compare=False, repr=False)

    @property
    def source(self) -> CellSource:
        """The cell to export, built on the CPU in ``dtype``."""
        return CellSource(self.model, self.dtype, "cpu", self.revision, self.trust_remote_code, self.keep, self.comp,
                          resolved=self.resolved)  # fmt: skip


@dataclass(frozen=True)
class FormatOption:
    """A CLI option of one format: ``--flag`` stored as ``dest``, with its choices and help."""

    flag: str
    dest: str
    help: str
    choices: tuple[str, ...] | None = None


@dataclass(frozen=True)
class ExportFormat:
    name: str
    description: str
    write: Callable[[ExportRequest], dict[str, Any]]
    options: tuple[FormatOption, ...] = ()


EXPORT_FORMATS: Registry[ExportFormat] = Registry("export format")
for _name in ("hf", "gguf"):
    EXPORT_FORMATS.register_lazy(_name, "coec.export.stage")
DEFAULT_FORMAT = "hf"


def export(fmt: str | None, request: ExportRequest) -> dict[str, Any]:
    """Write ``request`` in format ``fmt`` (an unknown name: one line listing the formats); an
    option that the format does not take is refused. ``None``: :data:`DEFAULT_FORMAT`."""
    fmt = fmt or DEFAULT_FORMAT
    entry = EXPORT_FORMATS[fmt]
    unknown = sorted(set(request.options) - {o.dest for o in entry.options})
    if unknown:
        raise ValueError(f"export format {fmt!r} takes no option {', '.join(unknown)}")
    return entry.write(request)


# the tensor types coec.export.gguf writes (defined here: gguf loads lazily)
# The mixes made by llama.cpp's own quantizer (``llama_model_quantize``), from 6 down to 2.6 bits a
# weight: the K-quants q6_k, q5_k_m, q4_k_m, q3_k_m, q3_k_s and q2_k, and the i-quant iq4_xs. Each
# quantizes in super-blocks of 256 values of a row, gives some tensors another type on purpose
# (e.g. Q6_K for output) and falls back where a row width is not a multiple of 256.
QUANTIZER_MIXES = ("q6_k", "q5_k_m", "q4_k_m", "iq4_xs", "q3_k_m", "q3_k_s", "q2_k")
GGUF_TYPES = (
    "f32", "f16", "q8_0", "q6_k", "q5_k_m", "q5_1", "q5_0", "q4_k_m", "q4_1", "q4_0",
    "iq4_xs", "q3_k_m", "q3_k_s", "q2_k",
)  # fmt: skip

# The GGUF files a workflow target names (``export-{variant}.gguf``): every type, and each mix of
# llama.cpp's quantizer quantized with the importance matrix of the cell's calibration
# (``<type>-imatrix``, ``coec imatrix``; docs/export.md "Importance matrix from the calibration").
IMATRIX_SUFFIX = "-imatrix"
GGUF_VARIANTS = GGUF_TYPES + tuple(f"{t}{IMATRIX_SUFFIX}" for t in QUANTIZER_MIXES)


def split_gguf_variant(variant: str) -> tuple[str, bool]:
    """(GGUF type, whether the importance matrix is used) of a target's variant name, e.g.
    ``q4_k_m-imatrix`` -> ("q4_k_m", True); ValueError (one line) for an unknown name."""
    if variant not in GGUF_VARIANTS:
        raise ValueError(f"unknown GGUF export {variant!r}; expected one of {', '.join(GGUF_VARIANTS)}")
    if variant.endswith(IMATRIX_SUFFIX):
        return variant[: -len(IMATRIX_SUFFIX)], True
    return variant, False
