"""Atomic file writes: the bytes go to a temp file in the target's folder, are fsynced and renamed
onto the target; on any exception the temp file is removed, so a target is either the previous
file or the complete new one. Files are created with mode ``0666 & ~umask`` (folders ``0777 &
~umask``). Every artifact writer (``coec.io.artifacts``) and every other file the package writes goes
through these."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path


def _umask() -> int:
    """The process umask, read without changing it where /proc allows."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _tmp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(3)}.tmp")


def _fsync_dir(folder: Path) -> None:
    with contextlib.suppress(OSError):
        fsync_file(folder)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temp path next to ``path`` for writers that need a file name (e.g. ``savefig``); on
    exit it is chmodded to ``0666 & ~umask``, fsynced and renamed onto ``path``; on an exception
    it is removed and ``path`` left as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_name(path)
    try:
        yield tmp
        if tmp.is_dir():
            umask_modes(tmp)
        else:
            os.chmod(tmp, 0o666 & ~_umask())
            fsync_file(tmp)
        os.replace(tmp, path)
    except BaseException:
        _remove(tmp)
        raise
    _fsync_dir(path.parent)


def write_chunks(path: str | Path, chunks: Iterable[bytes | memoryview]) -> None:
    """Write byte chunks (bytes / memoryview) atomically to ``path``, mode ``0666 & ~umask``."""
    with atomic_path(path) as tmp:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            for chunk in chunks:
                view = memoryview(chunk).cast("B")
                while len(view):
                    view = view[os.write(fd, view) :]
        finally:
            os.close(fd)


def write_bytes(path: str | Path, data: bytes) -> None:
    """Atomic binary write."""
    write_chunks(path, [data])


def write_text(path: str | Path, text: str) -> None:
    """Atomic UTF-8 text write."""
    write_chunks(path, [text.encode("utf-8")])


def umask_modes(folder: str | Path) -> None:
    """Files ``0666 & ~umask``, folders ``0777 & ~umask`` under ``folder`` (third-party writers
    such as ``save_pretrained`` create 0600 files)."""
    mask = _umask()
    os.chmod(folder, 0o777 & ~mask)
    for root, dirs, files in os.walk(folder):
        for d in dirs:
            os.chmod(os.path.join(root, d), 0o777 & ~mask)
        for f in files:
            fd = os.path.join(root, f)
            if not os.path.islink(fd):
                os.chmod(fd, 0o666 & ~mask)
                fsync_file(fd)


def fsync_file(path: str | Path) -> None:
    """fsync a file or a folder (its entries), by path."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """A temp folder next to ``path`` to fill; on success it replaces ``path`` (a previous
    folder is removed only after the rename), on an exception it is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_name(path)
    tmp.mkdir()
    try:
        yield tmp
        umask_modes(tmp)
        old = None
        if path.exists():
            old = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(3)}.old.tmp")
            os.replace(path, old)
        os.replace(tmp, path)
    except BaseException:
        _remove(tmp)
        raise
    if old is not None:
        _remove(old)
    _fsync_dir(path.parent)
