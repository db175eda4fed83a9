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
from pathlib import Path

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


def _overlaps(a: Path, b: Path) -> bool:
    """Whether two resolved paths are the same, or one lies inside the other."""
    return a == b or a in b.parents or b in a.parents


def read_marker(folder: Path) -> dict | None:
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
    if out.is_symlink():
        raise ExportRefused(f"--out {out} is a symbolic link; give a real folder")
    target = out.resolve()
    for p in protected:
        if _overlaps(target, Path(p).resolve()):
            raise ExportRefused(f"--out {out} overlaps the export's input {p}; "
                                "choose a folder outside the source model and the cell's files")
    if not out.exists():
        return "new"
    if not out.is_dir():
        raise ExportRefused(f"--out {out} exists and is not a folder")
    present = _files(out)
    if not present and not any(out.iterdir()):
        return "empty"
    if not force:
        raise ExportRefused(f"--out {out} exists and is not empty; pass --force to replace a "
                            "previous export (a folder holding coec_export.json)")
    marker = read_marker(out)
    if marker is None:
        raise ExportRefused(f"--out {out} is not a previous export ({MARKER} missing or not "
                            "ours); refusing to replace it even with --force")
    foreign = sorted(set(present) - set(marker.get("files", [])) - {MARKER})
    if foreign:
        raise ExportRefused(f"--out {out} holds files the previous export did not write "
                            f"({', '.join(foreign[:3])}); refusing to replace it")
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


def write_export_dir(out: str | Path, write, protected: list[str | Path], force: bool = False,
                     marker: dict | None = None) -> Path:
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
        from .atomic import umask_modes

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
        _delete_listed(old, read_marker(old).get("files", []))
    return out


def check_out_file(out: str | Path, protected: list[str | Path], force: bool = False,
                   is_ours=None) -> str:
    """Validate a single-file export target (a GGUF file); returns 'new' or 'replace'.

    The same rules as a folder: never a link, never the source model folder or a file inside it,
    never an input file; an existing file is replaced only with ``force`` and only when
    ``is_ours(path)`` says a previous export of ours wrote it. Raises ExportRefused."""
    out = Path(out)
    if out.is_symlink():
        raise ExportRefused(f"--out {out} is a symbolic link; give a real file name")
    target = out.resolve()
    for p in protected:
        if _overlaps(target, Path(p).resolve()):
            raise ExportRefused(f"--out {out} overlaps the export's input {p}; "
                                "choose a file outside the source model and the cell's files")
    if not out.exists():
        return "new"
    if not out.is_file():
        raise ExportRefused(f"--out {out} exists and is not a file")
    if not force:
        raise ExportRefused(f"--out {out} exists; pass --force to replace a previous export")
    if is_ours is None or not is_ours(out):
        raise ExportRefused(f"--out {out} is not a previous export of ours; refusing to replace "
                            "it even with --force")
    return "replace"

