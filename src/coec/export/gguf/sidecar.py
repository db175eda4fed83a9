"""The sidecar of a GGUF export (``export-<type>.gguf.json``, docs/export.md "GGUF"): which tensors
did not get the requested type and why, who chose their type (coec for the types gguf-py writes,
llama.cpp's quantizer for the K-quant mixes), the tensors per written type, whether the dense
model's own widths take the type's block, and the file's SHA-256."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from coec.data.bundled import file_sha256
from coec.export.gguf.layout import block_of, made_by
from coec.io.atomic import write_text

FORMAT = "coec-gguf-report"


def sidecar_path(gguf_path: str | Path) -> Path:
    """``X.gguf`` -> ``X.gguf.json``."""
    return Path(f"{gguf_path}.json")


def dense_widths(hidden_size: int, intermediate_size: int, gguf_type: str) -> dict[str, Any]:
    """Whether the dense model's hidden size and MLP width are multiples of the type's block
    (a row width that is not falls back in every tensor that reads it)."""
    block = block_of(gguf_type)
    sizes = {"hidden_size": int(hidden_size), "intermediate_size": int(intermediate_size)}
    return {**sizes, "block": block, "quantize": {k: v % block == 0 for k, v in sizes.items()}}


def sidecar(report: dict[str, Any], file_name: str, sha256: str, dense: dict[str, Any]) -> dict[str, Any]:
    """The sidecar's content from ``write_gguf``'s report: every tensor that did not get the
    requested type as {tensor, shape (rows, row width), requested, written, reason, chosen_by}."""
    t = report["gguf_type"]
    fallbacks = [
        {
            "tensor": f["tensor"],
            "shape": f["shape"],
            "requested": t,
            "written": f["type"],
            "reason": f["why"],
            "chosen_by": made_by(t),
        }
        for f in report["fallbacks"]
    ]
    out = {
        "format": FORMAT,
        "file": file_name,
        "type": t,
        "written_by": made_by(t),
        "sha256": sha256,
        "tensors": report["tensors"],
        "fallback_count": len(fallbacks),
        "fallbacks": fallbacks,
        "types": report["types"],
        "dense_widths": dense,
    }
    if "imatrix" in report:  # the importance matrix the quantizer weighted by (sha256, tokens)
        out["imatrix"] = report["imatrix"]
    if "quantize_seconds" in report:
        out["quantize_seconds"] = round(report["quantize_seconds"], 3)
    return out


def write_sidecar(gguf_path: str | Path, report: dict[str, Any], dense: dict[str, Any]) -> Path:
    """Write the sidecar of the GGUF file at ``gguf_path`` (atomically, beside it); returns its path."""
    path = sidecar_path(gguf_path)
    content = sidecar(report, Path(gguf_path).name, file_sha256(gguf_path), dense)
    write_text(path, json.dumps(content, indent=2) + "\n")
    return path


def is_sidecar(path: str | Path) -> bool:
    """Whether ``path`` is a sidecar this export wrote."""
    try:
        return bool(json.loads(Path(path).read_text()).get("format") == FORMAT)
    except (OSError, ValueError, AttributeError):
        return False
