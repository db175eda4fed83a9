"""The error every artifact reader raises: one line ``<path>: <problem>`` (coec.io.artifacts)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


class ArtifactError(ValueError):
    """An unreadable, incomplete or mismatched artifact; the message is ``<path>: <problem>``."""

    def __init__(self, path: str | Path, problem: str | None = None):
        self.path, self.problem = str(path), problem
        super().__init__(str(path) if problem is None else f"{path}: {problem}")

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""

    def __reduce__(self) -> tuple[type[ArtifactError], tuple[Any, ...]]:
        return (type(self), (self.path, self.problem))


class MissingArtifact(ArtifactError, FileNotFoundError):
    """An artifact that does not exist (also a FileNotFoundError)."""

    def __init__(self, path: str | Path, problem: str | None = "file not found"):
        ArtifactError.__init__(self, path, problem)


def need_file(path: Path) -> None:
    """``path`` exists and is a file (else :class:`MissingArtifact` / :class:`ArtifactError`)."""
    if not path.exists():
        raise MissingArtifact(path)
    if not path.is_file():
        raise ArtifactError(path, "not a file")
