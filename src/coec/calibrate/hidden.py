"""The hidden states of every calibration batch between two decoder layers, within a budget.

:class:`HiddenStore` holds batch ``b`` (B_b, T, d) of one dtype on the host. The first batches
stay in memory while their bytes fit ``budget_bytes``; the others live in two files in a folder
next to the output: the inputs of the layer being run (generation g) and the outputs it writes
(generation 1 - g), swapped by :meth:`flip` when the layer is done. The files are read and
written with plain file I/O (``readinto`` / ``write`` at an offset), never memory-mapped, so the
page cache does not count as the process's memory.

For a resumable pass the whole store is written to one file (:meth:`save`, atomic) and read
back into a new store (:meth:`load`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import torch

from coec.io.atomic import write_chunks
from coec.io.errors import ArtifactError

_MAX_IO = 1 << 30  # bytes per read/write call (a single call moves at most ~2 GiB on Linux)


def nbytes(shape: Any, dtype: torch.dtype) -> int:
    """Bytes of a tensor of ``shape`` and ``dtype``."""
    n = 1
    for s in shape:
        n *= int(s)
    return n * torch.empty((), dtype=dtype).element_size()


def _byte_view(t: torch.Tensor) -> Any:
    """A writable uint8 NumPy view of a contiguous CPU tensor's bytes."""
    return t.reshape(-1).view(torch.uint8).numpy()


def write_at(fd: int, offset: int, t: torch.Tensor) -> None:
    """Write a CPU tensor's bytes at ``offset`` of an open file."""
    view = memoryview(_byte_view(t.contiguous()))
    done = 0
    while done < len(view):
        done += os.pwrite(fd, view[done : done + _MAX_IO], offset + done)


def read_at(fd: int, offset: int, shape: Any, dtype: torch.dtype) -> torch.Tensor:
    """A new CPU tensor of ``shape``/``dtype`` read from ``offset`` of an open file."""
    out = torch.empty(tuple(shape), dtype=dtype)
    view = memoryview(_byte_view(out))
    done = 0
    while done < len(view):
        got = os.preadv(fd, [view[done : done + _MAX_IO]], offset + done)
        if got <= 0:
            raise ArtifactError(f"fd {fd}", f"short read at byte {offset + done}")
        done += got
    return out


class HiddenStore:
    """Batches of hidden states, in memory up to ``budget_bytes``, in files in ``folder`` beyond
    (module docstring). List-like: ``len``, ``store[b]`` (a CPU tensor), ``store[b] = h``
    (memory: replaced; file: written to the next generation), iteration in batch order."""

    def __init__(self, folder: str | Path, budget_bytes: float) -> None:
        self.folder = Path(folder)
        self.budget = float(budget_bytes)
        self.shapes: list[tuple[int, ...]] = []
        self.dtype: torch.dtype | None = None
        self.memory: list[torch.Tensor] = []  # batches 0 .. len(memory) - 1
        self.offsets: list[int] = []  # file offset of each spilled batch
        self._fds: list[int] = []
        self._gen = 0

    def __len__(self) -> int:
        return len(self.shapes)

    @property
    def spilled(self) -> int:
        """How many batches live in files."""
        return len(self.shapes) - len(self.memory)

    def _open(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        for g in (0, 1):
            path = self.folder / f"spill-{g}.bin"
            self._fds.append(os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600))

    def append(self, h: torch.Tensor) -> None:
        """Add the next batch (its hidden states entering the first layer still to run)."""
        h = h.detach().to("cpu")
        if self.dtype is None:
            self.dtype = h.dtype
        elif h.dtype != self.dtype:
            raise TypeError(f"batch {len(self)} is {h.dtype}, the store holds {self.dtype}")
        in_memory = sum(nbytes(s, self.dtype) for s in self.shapes[: len(self.memory)])
        fits = in_memory + nbytes(h.shape, h.dtype) <= self.budget
        if fits and self.spilled == 0:
            self.memory.append(h)
        else:
            if not self._fds:
                self._open()
            prev = self.offsets[-1] + nbytes(self.shapes[-1], self.dtype) if self.offsets else 0
            self.offsets.append(prev)
            write_at(self._fds[self._gen], prev, h)
        self.shapes.append(tuple(h.shape))

    def __getitem__(self, b: int) -> torch.Tensor:
        if b < len(self.memory):
            return self.memory[b]
        return read_at(
            self._fds[self._gen], self.offsets[b - len(self.memory)], self.shapes[b], cast(torch.dtype, self.dtype)
        )

    def __setitem__(self, b: int, h: torch.Tensor) -> None:
        h = h.detach().to("cpu")
        if tuple(h.shape) != self.shapes[b] or h.dtype != self.dtype:
            raise ValueError(f"batch {b}: {tuple(h.shape)} {h.dtype}, expected {self.shapes[b]} {self.dtype}")
        if b < len(self.memory):
            self.memory[b] = h
        else:
            write_at(self._fds[1 - self._gen], self.offsets[b - len(self.memory)], h)

    def __iter__(self) -> Iterator[torch.Tensor]:
        for b in range(len(self)):
            yield self[b]

    def flip(self) -> None:
        """End of a layer: the outputs it wrote become the next layer's inputs."""
        if self._fds:
            self._gen = 1 - self._gen

    def save(self, path: str | Path) -> None:
        """Every batch, in order, as raw bytes in one file (atomic, fsynced)."""
        write_chunks(path, (memoryview(_byte_view(self[b].contiguous())) for b in range(len(self))))

    @classmethod
    def load(
        cls, path: str | Path, shapes: list[Any], dtype: torch.dtype, folder: str | Path, budget_bytes: float
    ) -> HiddenStore:
        """A store filled from a :meth:`save` file of batches of ``shapes`` and ``dtype``."""
        path = Path(path)
        want = sum(nbytes(s, dtype) for s in shapes)
        if not path.is_file() or path.stat().st_size != want:
            raise ArtifactError(path, f"expected {want} bytes of hidden states")
        store = cls(folder, budget_bytes)
        fd = os.open(path, os.O_RDONLY)
        try:
            offset = 0
            for s in shapes:
                store.append(read_at(fd, offset, s, dtype))
                offset += nbytes(s, dtype)
        finally:
            os.close(fd)
        return store

    def close(self) -> None:
        """Drop the batches and remove the spill files."""
        for fd in self._fds:
            os.close(fd)
        self._fds = []
        for g in (0, 1):
            try:
                (self.folder / f"spill-{g}.bin").unlink()
            except FileNotFoundError:
                pass
        self.memory, self.shapes, self.offsets = [], [], []
