"""The safetensors weights of a model folder, read tensor by tensor.

:class:`Checkpoint` maps every tensor name to its shard (``model.safetensors.index.json``, a
single ``model.safetensors``, or the headers of the folder's ``*.safetensors`` files) and reads
named tensors through ``safe_open``: the returned tensors are memory-mapped views of the shard
(nothing is copied until a tensor is cast or moved to another device), so reading one decoder
layer maps one layer's bytes. A folder holding only PyTorch pickles (``*.bin``, ``*.pt``) is
refused with that reason: a pickle cannot be read one tensor at a time.
"""

from __future__ import annotations

from pathlib import Path

import torch

from coec.io import artifacts
from coec.io.errors import ArtifactError
from coec.io.safetensors_file import safetensors_header
from coec.model.arch import ModelError

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth")


def weight_map(model_dir: str | Path) -> dict[str, str]:
    """Tensor name -> shard file name of a model folder's safetensors weights.

    Raises :class:`ModelError` (one line naming the folder) when there are none, saying so when
    the folder holds pickle weights instead; a damaged index or shard header raises
    ``ArtifactError`` naming the file."""
    folder = Path(model_dir)
    index = folder / INDEX
    if index.is_file():
        wm = artifacts.read_json(index).get("weight_map")
        if not isinstance(wm, dict) or not wm:
            raise ArtifactError(index, "missing weight_map")
        return {str(k): str(v) for k, v in wm.items()}
    shards = [folder / SINGLE] if (folder / SINGLE).is_file() else sorted(folder.glob("*.safetensors"))
    if shards:
        return {name: shard.name for shard in shards for name in safetensors_header(shard) if name != "__metadata__"}
    pickles = sorted(p.name for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES) if folder.is_dir() else []
    if pickles:
        raise ModelError(
            f"{folder}: the weights are PyTorch pickles ({pickles[0]}), which cannot "
            "be read one layer at a time; convert the checkpoint to safetensors "
            "(save_pretrained(..., safe_serialization=True))"
        )
    raise ModelError(f"{folder}: no safetensors weights ({SINGLE} or {INDEX})")


class Checkpoint:
    """Named tensors of a safetensors checkpoint, read memory-mapped, one group at a time.

    ``read(names)`` opens each shard involved once (``safe_open``), maps the tensors and closes
    it; a tensor stays mapped (file-backed pages, not a copy) until it is released."""

    def __init__(self, model_dir: str | Path) -> None:
        self.dir = Path(model_dir)
        self.map = weight_map(self.dir)

    def __contains__(self, name: str) -> bool:
        return name in self.map

    def nbytes(self) -> int:
        """Bytes of the checkpoint's shards on disk."""
        return sum((self.dir / s).stat().st_size for s in set(self.map.values()))

    def read(self, names: list[str], check_finite: bool = False) -> dict[str, torch.Tensor]:
        """The named tensors, as stored (dtype, CPU, memory-mapped). A name the checkpoint lacks
        raises ``ArtifactError`` naming the folder; a damaged shard names the shard; ``check_finite``:
        also every floating value finite (which reads every byte)."""
        missing = [n for n in names if n not in self.map]
        if missing:
            raise ArtifactError(self.dir, f"tensors not in the checkpoint: {missing[:3]}")
        by_shard: dict[str, list[str]] = {}
        for n in names:
            by_shard.setdefault(self.map[n], []).append(n)
        out: dict[str, torch.Tensor] = {}
        for shard, ns in by_shard.items():
            out.update(artifacts.read_tensors(self.dir / shard, ns, check_finite=check_finite))
        return out
