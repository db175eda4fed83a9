"""The mixes of llama.cpp's quantizer (the K-quants q6_k, q5_k_m, q4_k_m, q3_k_m, q3_k_s, q2_k and
the i-quant iq4_xs), made by its own ``llama_model_quantize`` from an f32 GGUF file of ours: gguf-py
cannot write them (ggml-org/llama.cpp #14667). The quantizer runs in a child process
(``coec.io.isolated``), so that a llama.cpp crash raises ProcessCrashed in the caller. It copies the
file's metadata (the ``coec.export.stage`` provenance included) and chooses each tensor's type
itself: a mix gives some tensors another K-quant type on purpose (Q6_K for output; Q4_K_M / Q5_K_M:
Q6_K for attn_v and ffn_down of some blocks; Q3_K_M: Q4_K or Q5_K for attn_v, attn_output and
ffn_down; Q2_K: Q3_K for attn_v, attn_output and ffn_down; IQ4_XS without an importance matrix:
Q5_K for ffn_down of the first eighth of the blocks), and a row width that is not a multiple of
the super-block (256) falls back to a type of 32-value blocks (Q4_K -> Q5_0, Q5_K -> Q5_1,
Q6_K -> Q8_0, Q3_K and Q2_K -> Q4_0, IQ4_XS -> IQ4_NL), or f16 when the row is not a multiple of
32 either."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from coec.export.gguf.layout import K_BLOCK, KQUANT_TYPES, KQUANTS, file_type
from coec.io.isolated import call_isolated
from coec.model.arch.gguf import bindings_quantize


def quantize_gguf(
    src: str | Path, dst: str | Path, gguf_type: str, nthread: int, imatrix: dict[str, np.ndarray] | None = None
) -> float:
    """Quantize the f32 GGUF ``src`` to the mix ``gguf_type`` at ``dst`` with llama.cpp's
    quantizer on ``nthread`` threads, in a child process; returns the seconds it took. ``imatrix``:
    GGUF weight name -> per-column importance (float32, (row width,); ``coec.export.imatrix``). ValueError
    (one line) for a non-zero return, ProcessCrashed if llama.cpp dies."""
    if gguf_type not in KQUANTS:
        raise ValueError(f"{gguf_type} is not made by llama.cpp's quantizer ({', '.join(KQUANTS)})")
    t0 = time.perf_counter()
    rc = call_isolated(
        bindings_quantize,
        str(src),
        str(dst),
        file_type(gguf_type),
        int(nthread),
        *([imatrix] if imatrix is not None else []),
        what=f"llama.cpp's quantizer ({gguf_type})",
    )
    if rc != 0:
        raise ValueError(f"llama.cpp's quantizer returned {rc} quantizing {Path(src).name} to {gguf_type}")
    return time.perf_counter() - t0


def read_tensor_types(path: str | Path) -> list[tuple[str, tuple[int, ...], gguf.GGMLQuantizationType]]:
    """(name, numpy shape (rows, row width), GGML type) of every tensor of a GGUF file."""
    r = gguf.GGUFReader(str(path))
    return [(t.name, tuple(int(s) for s in reversed(t.shape.tolist())), t.tensor_type) for t in r.tensors]


def quantizer_fallbacks(tensors: list[tuple[str, tuple[int, ...], gguf.GGMLQuantizationType]]) -> list[dict[str, Any]]:
    """The 2-D tensors that llama.cpp's quantizer did not write in a type of 256-value super-blocks
    (``KQUANT_TYPES``: the K-quants, IQ4_XS), with why: {'tensor', 'shape', 'type' (written, lower
    case), 'why'}. Another such type than the mix's main one (Q6_K in a Q4_K_M file, Q3_K in a Q2_K
    file, Q5_K in an IQ4_XS file) is the mix's choice, not a fallback."""
    out: list[dict[str, Any]] = []
    for name, shape, qtype in tensors:
        if len(shape) != 2 or qtype in KQUANT_TYPES:
            continue
        width = shape[-1]
        why = (
            f"row width {width} is not a multiple of the K-quant block ({K_BLOCK}); llama.cpp wrote it as {qtype.name}"
            if width % K_BLOCK
            else f"llama.cpp's quantizer chose {qtype.name}"
        )
        out.append({"tensor": name, "shape": list(shape), "type": qtype.name.lower(), "why": why})
    return out


def type_counts(tensors: list[tuple[str, tuple[int, ...], gguf.GGMLQuantizationType]]) -> dict[str, int]:
    """Tensors per written GGML type ({'Q4_K': n, 'Q6_K': m, 'F32': k, ...}), sorted by name."""
    return dict(sorted(Counter(q.name for _, _, q in tensors).items()))
