"""Writing an exported checkpoint folder without ever destroying data.

Rules: the output folder must be absent or empty; a non-empty one is replaced only with
``force`` and only when it is a previous export of ours (it holds ``coec_export.json`` and no
file that the marker does not list). The source model folder, a folder inside it or one holding
it, and a folder holding any input file are never valid outputs. The new checkpoint is written to
a temporary sibling first; the old folder is moved aside, the new one renamed into place, and only
then are the old folder's listed files deleted (one by one, never a recursive delete of a folder
we did not create).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coec.export.formats import EXPORT_FORMATS, GGUF_TYPES, ExportFormat, ExportRequest, FormatOption, export
from coec.io.atomic import umask_modes
from coec.model.source import CellSource, resolve_source

if TYPE_CHECKING:
    from coec.export.imatrix import Imatrix

log = logging.getLogger(__name__)

MARKER = "coec_export.json"
FORMAT = "coec-export"


class ExportRefused(ValueError):
    """The output folder may not be written (it would destroy data that is not ours)."""


def _files(folder: Path) -> list[str]:
    """Every file and link under ``folder`` as sorted POSIX paths relative to it."""
    out = []
    for root, dirs, files in os.walk(folder, followlinks=False):
        rel = Path(root).relative_to(folder)
        out += [(rel / f).as_posix() for f in files]
        out += [(rel / d).as_posix() for d in dirs if (Path(root) / d).is_symlink()]
    return sorted(out)


def _check_target(out: Path, protected: list[str | Path], kind: str) -> None:
    """Refuse a link, or an output (a ``kind``: folder or file) that is, lies inside or holds one
    of the ``protected`` paths."""
    if out.is_symlink():
        raise ExportRefused(f"--out {out} is a symbolic link; give a real {'file name' if kind == 'file' else kind}")
    target = out.resolve()
    for p in protected:
        q = Path(p).resolve()
        if target == q or target in q.parents or q in target.parents:
            raise ExportRefused(
                f"--out {out} overlaps the export's input {p}; "
                f"choose a {kind} outside the source model and the cell's files"
            )


def read_marker(folder: Path) -> dict[str, Any] | None:
    """The marker of a previous export in ``folder`` (None when absent or not ours)."""
    try:
        marker = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) and marker.get("format") == FORMAT else None


def check_out_dir(out: str | Path, protected: list[str | Path], force: bool = False) -> str:
    """Validate an export folder; returns 'new' (absent), 'empty' or 'replace'.

    ``protected``: the source model folder and the input files, which the output may neither
    be, lie inside, nor contain. Raises ExportRefused naming the reason."""
    out = Path(out)
    _check_target(out, protected, "folder")
    if not out.exists():
        return "new"
    if not out.is_dir():
        raise ExportRefused(f"--out {out} exists and is not a folder")
    present = _files(out)
    if not present and not any(out.iterdir()):
        return "empty"
    if not force:
        raise ExportRefused(
            f"--out {out} exists and is not empty; pass --force to replace a "
            "previous export (a folder holding coec_export.json)"
        )
    marker = read_marker(out)
    if marker is None:
        raise ExportRefused(
            f"--out {out} is not a previous export ({MARKER} missing or not "
            "ours); refusing to replace it even with --force"
        )
    foreign = sorted(set(present) - set(marker.get("files", [])) - {MARKER})
    if foreign:
        raise ExportRefused(
            f"--out {out} holds files the previous export did not write "
            f"({', '.join(foreign[:3])}); refusing to replace it"
        )
    return "replace"


def _delete_listed(folder: Path, files: list[str]) -> None:
    """Delete the listed files (and the marker) of an old export, then its empty folders."""
    for rel in [*files, MARKER]:
        p = folder / rel
        if p.is_file() or p.is_symlink():
            p.unlink()
    for root, _, _ in sorted(os.walk(folder), key=lambda t: -len(t[0])):
        try:
            Path(root).rmdir()
        except OSError:
            log.warning("kept %s: it is not empty", root)


def write_export_dir(
    out: str | Path,
    write: Callable[[Path], None],
    protected: list[str | Path],
    force: bool = False,
    marker: dict[str, Any] | None = None,
) -> Path:
    """Call ``write(tmp_folder)`` on a fresh temporary sibling of ``out``, add the marker
    (listing every file written) and move the folder into place by the rules above."""
    out = Path(out)
    check_out_dir(out, protected, force)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.coec-tmp-", dir=out.parent))
    try:
        write(tmp)
        listing = {"format": FORMAT, "version": 1, **(marker or {}), "files": _files(tmp)}
        (tmp / MARKER).write_text(json.dumps(listing, indent=2) + "\n")
        umask_modes(tmp)  # mkdtemp makes 0700, save_pretrained 0600 files: follow the umask
        state = check_out_dir(out, protected, force)  # again: the folder may have changed
        old = None
        if state == "empty":
            out.rmdir()
        elif state == "replace":
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.coec-old-", dir=out.parent))
            os.rmdir(old)
            os.rename(out, old)
        try:
            os.rename(tmp, out)
        except OSError:
            if old is not None:
                os.rename(old, out)
            raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # our own temporary folder only
        raise
    if old is not None:
        _delete_listed(old, (read_marker(old) or {}).get("files", []))
    return out


def check_out_file(
    out: str | Path, protected: list[str | Path], force: bool = False, is_ours: Callable[[Path], bool] | None = None
) -> str:
    """Validate a single-file export target (a GGUF file); returns 'new' or 'replace'.

    The same rules as a folder: never a link, never the source model folder or a file inside it,
    never an input file; an existing file is replaced only with ``force`` and only when
    ``is_ours(path)`` says a previous export of ours wrote it. Raises ExportRefused."""
    out = Path(out)
    _check_target(out, protected, "file")
    if not out.exists():
        return "new"
    if not out.is_file():
        raise ExportRefused(f"--out {out} exists and is not a file")
    if not force:
        raise ExportRefused(f"--out {out} exists; pass --force to replace a previous export")
    if is_ours is None or not is_ours(out):
        raise ExportRefused(f"--out {out} is not a previous export of ours; refusing to replace it even with --force")
    return "replace"


# ----------------------------------------------------------------------------- the export stage
def run_export(request: ExportRequest, fmt: str | None = None) -> dict[str, Any]:
    """Export a cell (``request.keep`` None: the dense model) in the registered format ``fmt``
    (``coec.export.formats``: ``hf`` a checkpoint folder, the default; ``gguf`` a file for
    llama.cpp; or a plug-in's), ``request.options`` being the format's own (e.g. ``gguf_type``).
    Returns its record."""
    return export(fmt, request)


def _export_provenance(request: ExportRequest, source: CellSource) -> dict[str, Any]:
    """What an export records of its cell; ``source``: the request's cell as resolved."""
    return {
        "source": str(request.model),
        "keep": str(request.keep) if request.keep else None,
        "comp": [str(c) for c in request.comp],
        "dtype": request.dtype,
        "cell": dict(request.cell),
        "model": source.provenance(),
    }


def run_export_hf(request: ExportRequest) -> dict[str, Any]:
    """Write a pruned, compensated checkpoint that a vanilla ``AutoModelForCausalLM.from_pretrained``
    reloads (stock class chosen by ``export_class.build_export_model``; see docs/export.md), reloaded
    from disk and its logits checked. ``request.out`` must be absent or empty; with ``force`` a
    previous export there is replaced. Returns the provenance recorded as ``coec_export`` in
    config.json."""
    # deferred: keeps the job boundary torch-free
    from coec.export.hf_class import build_export_model
    from coec.export.reload import check_reload
    from coec.model.cell import build_cell

    source = resolve_source(request.source)
    model_dir = source.local.model_dir
    protected: list[str | Path] = [model_dir, *([request.keep] if request.keep else []), *request.comp]
    check_out_dir(request.out, protected, request.force)  # refuse before the (slow) model build
    model, tok = build_cell(source)
    target, info = build_export_model(model)
    info.update(_export_provenance(request, source))
    target.config.coec_export = info

    def write(folder: Path) -> None:
        target.save_pretrained(folder)
        tok.save_pretrained(folder)
        info["reload_max_abs_logit_diff"] = check_reload(folder, model)  # recorded in the marker

    write_export_dir(request.out, write, protected, request.force, marker={"coec_export": info})
    log.info("exported %s as %s (%s) to %s", request.model, info["architecture"], info["reason"], request.out)
    return info


def run_export_gguf(request: ExportRequest) -> dict[str, Any]:
    """Write a pruned, compensated cell as one GGUF file for llama.cpp (``coec.export.gguf.write_gguf``:
    llama arch for uniform widths, deci for per-layer widths; docs/export.md "GGUF") and its
    sidecar ``<out>.json`` (the tensors that did not get the requested type, and why). ``out`` is
    a file: absent, or with ``force`` a previous GGUF export of ours. Options: ``gguf_type`` (f32;
    the K-quant mixes need llama.cpp's bindings), ``gguf_fallback`` (allow; refuse: stop, writing
    nothing, when a tensor would not take the type), ``tokenizer_gguf``: take the tokenizer keys
    from that GGUF file (an embedded model's source) instead of converting the HF tokenizer;
    ``imatrix``: an importance matrix file for llama.cpp's quantizer (``coec imatrix``).
    Returns the writer's report with the provenance (also stored in the file)."""
    # deferred: keeps the job boundary torch-free
    from coec.evaluate.llamacpp.run import require
    from coec.export.gguf import GgufOptions, is_gguf_export, write_gguf
    from coec.export.gguf.layout import QUANTIZER, check_gguf_type, check_imatrix_need, made_by
    from coec.export.gguf.sidecar import is_sidecar, sidecar_path, write_sidecar
    from coec.export.gguf.writer import FALLBACK_POLICIES
    from coec.model.cell import build_cell

    gguf_type = check_gguf_type(request.options.get("gguf_type") or "f32")
    check_imatrix_need(gguf_type, bool(request.options.get("imatrix")))
    fallback = request.options.get("gguf_fallback") or FALLBACK_POLICIES[0]
    if fallback not in FALLBACK_POLICIES:
        raise ValueError(f"--gguf-fallback {fallback!r}: expected one of {', '.join(FALLBACK_POLICIES)}")
    if made_by(gguf_type) == QUANTIZER:
        require(f"--gguf-type {gguf_type} (made by llama.cpp's quantizer)")
    imatrix = _read_imatrix(request.options.get("imatrix"), gguf_type)
    tokenizer_gguf = request.options.get("tokenizer_gguf")
    source = resolve_source(request.source)
    model_dir = source.local.model_dir
    protected: list[str | Path] = [
        model_dir,
        *([request.keep] if request.keep else []),
        *request.comp,
        *([tokenizer_gguf] if tokenizer_gguf else []),
        *([imatrix.path] if imatrix else []),
    ]
    report_path = sidecar_path(request.out)

    def check_out() -> None:
        check_out_file(request.out, protected, request.force, is_gguf_export)
        check_out_file(report_path, protected, request.force, is_sidecar)

    check_out()  # refuse before the model build
    model, tok = build_cell(source)
    dense = _dense_widths(model_dir, request.trust_remote_code, gguf_type)
    prov = _export_provenance(request, source)
    check_out()  # again: the files may have appeared
    options = GgufOptions(tokenizer_gguf, Path(model_dir).name, prov, fallback, imatrix=imatrix)
    report = write_gguf(model, tok, request.out, gguf_type, options)
    write_sidecar(request.out, report, dense)
    log.info(
        "exported %s as GGUF %s (%s, %s) to %s", request.model, report["arch"], gguf_type, report["reason"], request.out
    )
    return {**report, **prov}


def _read_imatrix(path: str | None, gguf_type: str) -> Imatrix | None:
    """The ``--imatrix`` file (``coec.export.imatrix.read_imatrix``), refused for a type gguf-py writes."""
    if not path:
        return None
    # deferred: keeps the job boundary torch-free
    from coec.export.gguf.layout import QUANTIZER, made_by
    from coec.export.imatrix import read_imatrix

    if made_by(gguf_type) != QUANTIZER:
        raise ValueError(
            f"--imatrix is for the K-quant mixes made by llama.cpp's quantizer, not --gguf-type {gguf_type}"
        )
    return read_imatrix(path)


def _dense_widths(model_dir: str | Path, trust_remote_code: bool, gguf_type: str) -> dict[str, Any]:
    """The source (dense) model's hidden size and MLP width against the type's block."""
    # deferred: keeps the job boundary torch-free
    from transformers import AutoConfig

    from coec.export.gguf.sidecar import dense_widths

    cfg = AutoConfig.from_pretrained(model_dir, trust_remote_code=trust_remote_code)
    cfg = getattr(cfg, "text_config", None) or cfg
    return dense_widths(cfg.hidden_size, cfg.intermediate_size, gguf_type)


EXPORT_FORMATS.register(
    ExportFormat("hf", "a transformers checkpoint folder in a stock class (the default)", run_export_hf)
)
EXPORT_FORMATS.register(
    ExportFormat(
        "gguf",
        "one GGUF file for llama.cpp (per-layer widths as the deci arch)",
        run_export_gguf,
        options=(
            FormatOption(
                "--gguf-type",
                "gguf_type",
                "GGUF tensor type (default f32); q8_0, q5_1, q5_0, q4_1 and q4_0 fall back to f16 per tensor "
                "where a row width is not a multiple of 32; the mixes q6_k, q5_k_m, q4_k_m, iq4_xs, q3_k_m, q3_k_s "
                "and q2_k are made by llama.cpp's quantizer (its own fallbacks where a row width is not a multiple "
                "of 256)",
                GGUF_TYPES,
            ),
            FormatOption(
                "--gguf-fallback",
                "gguf_fallback",
                "allow (default): a tensor that cannot take the type is written in another one (listed in the "
                "sidecar <out>.json); refuse: stop, writing nothing",
                ("allow", "refuse"),
            ),
            FormatOption(
                "--imatrix",
                "imatrix",
                "importance matrix (coec imatrix: mean x^2 of each weight's input columns over a calibration set) "
                "that llama.cpp's quantizer weights its rounding error by; the quantizer's mixes (K-quants, "
                "iq4_xs) only",
            ),
            FormatOption(
                "--tokenizer-gguf",
                "tokenizer_gguf",
                "GGUF file whose tokenizer keys are copied (e.g. an embedded model's)",
            ),
        ),
    )
)
