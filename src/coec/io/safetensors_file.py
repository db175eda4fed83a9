"""The safetensors file layout, written and checked byte by byte (coec.io.artifacts reads and writes
through it): an 8-byte little-endian header length, the JSON header (tensor dtype, shape, data
offsets; ``__metadata__``), the tensors' bytes.

Written deterministically: tensors ordered by (item size descending, name), header keys sorted,
padded with spaces to a multiple of 8, as the safetensors library writes. Read: the header, after
checking that the file holds every byte it promises.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from coec.io.errors import ArtifactError, need_file

_ST_DTYPES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}
_ST_DTYPES.update(
    {
        getattr(torch, n): code
        for n, code in (
            ("float8_e4m3fn", "F8_E4M3"),
            ("float8_e5m2", "F8_E5M2"),
            ("uint16", "U16"),
            ("uint32", "U32"),
            ("uint64", "U64"),
        )
        if hasattr(torch, n)
    }
)
_MAX_HEADER = 100 * 1024 * 1024  # safetensors' own limit on the JSON header


def _tensor_order(item: tuple[str, torch.Tensor]) -> tuple[int, str]:
    name, t = item
    return (-t.element_size(), name)


def safetensors_chunks(
    tensors: dict[str, torch.Tensor], metadata: dict[str, Any] | None = None
) -> Iterator[bytes | memoryview]:
    """The byte chunks of a safetensors file with a deterministic header: tensors ordered by
    (item size descending, name) so every tensor is aligned, JSON keys sorted, header padded
    with spaces to a multiple of 8 (as the safetensors library writes)."""
    items = []
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"tensor {name!r} is a {type(t).__name__}, not a torch.Tensor")
        if t.dtype not in _ST_DTYPES:
            raise TypeError(f"tensor {name!r} has dtype {t.dtype}, which safetensors here cannot store")
        items.append((name, t.detach().to("cpu").contiguous()))
    items.sort(key=_tensor_order)
    header: dict[str, Any] = {}
    offset = 0
    for name, t in items:
        n = t.numel() * t.element_size()
        header[name] = {"dtype": _ST_DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + n]}
        offset += n
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in sorted(metadata.items())}
    raw = json.dumps(header, sort_keys=True, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    yield struct.pack("<Q", len(raw)) + raw
    for _, t in items:
        if t.numel():
            yield t.reshape(-1).view(torch.uint8).numpy().data


def safetensors_header(path: str | Path) -> dict[str, Any]:
    """The JSON header of a safetensors file, after checking that the file holds every byte the
    header promises: ``<path>: truncated ...`` / ``not a safetensors file`` otherwise."""
    path = Path(path)
    need_file(path)
    size = path.stat().st_size
    if size < 8:
        raise ArtifactError(path, f"truncated ({size} bytes, not even a safetensors header)")
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        if n > _MAX_HEADER:
            raise ArtifactError(path, "not a safetensors file (no valid header)")
        if 8 + n > size:
            raise ArtifactError(path, f"truncated ({size} bytes; the header alone needs {8 + n})")
        raw = f.read(n)
    try:
        header = json.loads(raw)
        if not isinstance(header, dict):
            raise ValueError
        end = 0
        for name, entry in header.items():
            if name != "__metadata__":
                a, b = entry["data_offsets"]
                end = max(end, int(b))
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        raise ArtifactError(path, "not a safetensors file (unreadable header)") from None
    if size < 8 + n + end:
        raise ArtifactError(path, f"truncated ({size} bytes, the header describes {8 + n + end})")
    if size > 8 + n + end:
        raise ArtifactError(path, f"{size - 8 - n - end} bytes after the last tensor (not a safetensors file?)")
    return header
