"""GGUF export of a pruned, compensated model for llama.cpp (docs/export.md "GGUF").

``write_gguf(model, tokenizer, out, gguf_type, GgufOptions(...))`` writes the in-memory model built by
``model.cell.build_model`` as ``llama`` (one width in every block) or ``deci`` (per-layer widths)
and checks the file read back; ``coec.model.arch.gguf`` records what each llama.cpp architecture's
loader holds, ``coec.export.gguf.layout`` the pure pieces (q/k row order, tensor types, RoPE),
``coec.export.gguf.vocab`` the tokenizer keys, ``coec.export.gguf.quantize`` the K-quant mixes made by llama.cpp's
quantizer, ``coec.export.gguf.sidecar`` the ``<out>.json`` that lists the tensors that fell back.
"""

from __future__ import annotations

from coec.export.formats import GGUF_TYPES
from coec.export.gguf.layout import permute_qk, tensor_type
from coec.export.gguf.writer import PROVENANCE_KEY, GgufOptions, is_gguf_export, verify_gguf, write_gguf
from coec.model.arch.gguf import ARCHS, GgufArch, choose_arch

__all__ = [
    "ARCHS",
    "GGUF_TYPES",
    "PROVENANCE_KEY",
    "GgufArch",
    "GgufOptions",
    "choose_arch",
    "permute_qk",
    "is_gguf_export",
    "tensor_type",
    "verify_gguf",
    "write_gguf",
]
