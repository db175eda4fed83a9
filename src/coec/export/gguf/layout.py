"""Pure pieces of the GGUF export: q/k row order, tensor types and their fallbacks, per-layer
widths and RoPE metadata. No file I/O here (``coec.export.gguf.writer`` does it)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, quants
from gguf import GGMLQuantizationType as Q

from coec.export.formats import GGUF_TYPES, QUANTIZER_MIXES
from coec.model.arch.gguf import file_types

if TYPE_CHECKING:
    from torch import nn
    from transformers import PretrainedConfig

    from coec.model.arch import Adapter

# requested type -> 2-D tensor type; gguf-py quantizes the block types (32 values of a row each)
_TYPES = {"f32": Q.F32, "f16": Q.F16, "q8_0": Q.Q8_0, "q5_1": Q.Q5_1, "q5_0": Q.Q5_0, "q4_1": Q.Q4_1, "q4_0": Q.Q4_0}
# the mixes of llama.cpp's quantizer (the K-quants and iq4_xs): gguf-py cannot write K-quants
# (ggml-org/llama.cpp #14667), so llama.cpp's quantizer makes them from an f32 file of ours
# (``llama_ftype`` = ``general.file_type``)
KQUANTS = QUANTIZER_MIXES
# the types a mix writes in super-blocks of 256 values (the K-quants and IQ4_XS): a tensor in
# another type fell back (its row width), whatever the mix chose for it
KQUANT_TYPES = frozenset({Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.Q8_K, Q.IQ4_XS})
K_BLOCK = GGML_QUANT_SIZES[Q.Q4_K][0]  # 256 values of a row per K-quant super-block
# The mixes llama.cpp's quantizer refuses without an importance matrix (``tensor_requires_imatrix``
# in src/llama-quant.cpp: a tensor it types IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S or IQ3_XXS, or
# Q2_K inside a Q2_K_S file; the output and embedding tensors never). None of the offered mixes:
# q2_k keeps Q2_K without one, iq4_xs is no such type. A mix named here is refused before any work.
NEEDS_IMATRIX: frozenset[str] = frozenset()
GGUFPY, QUANTIZER = "coec", "llama.cpp quantizer"  # who chooses each tensor's type


def made_by(gguf_type: str) -> str:
    """Who writes (and chooses the per-tensor types of) a requested type: coec through gguf-py,
    or llama.cpp's quantizer for the K-quant mixes."""
    return QUANTIZER if check_gguf_type(gguf_type) in KQUANTS else GGUFPY


def block_of(gguf_type: str) -> int:
    """Values of a row per quantization block of a requested type (1: f32, f16)."""
    if check_gguf_type(gguf_type) in KQUANTS:
        return K_BLOCK
    return int(GGML_QUANT_SIZES[_TYPES[gguf_type]][0])


def file_type(gguf_type: str) -> int:
    """``general.file_type`` of a requested tensor type."""
    return int(file_types()[check_gguf_type(gguf_type)])


def check_gguf_type(gguf_type: str) -> str:
    if gguf_type not in _TYPES and gguf_type not in KQUANTS:
        raise ValueError(f"unknown GGUF tensor type {gguf_type!r}; expected one of {', '.join(GGUF_TYPES)}")
    return gguf_type


def check_imatrix_need(gguf_type: str, has_imatrix: bool) -> None:
    """ValueError (one line) for a mix llama.cpp's quantizer refuses without an importance matrix
    (:data:`NEEDS_IMATRIX`) when none is given: refused before the model is built."""
    if gguf_type in NEEDS_IMATRIX and not has_imatrix:
        raise ValueError(
            f"--gguf-type {gguf_type} needs an importance matrix (llama.cpp's quantizer refuses it without one); "
            f"pass --imatrix (coec imatrix; in the workflow: export-{gguf_type}-imatrix.gguf)"
        )


def fallback_reason(shape: tuple[int, ...], gguf_type: str) -> str | None:
    """Why a tensor of numpy shape ``shape`` will not get the requested type (None: it will):
    a 2-D tensor whose row width (the last axis, ggml's ne[0]) is not a multiple of the type's
    block. Predicts the fallbacks of both writers from the shapes alone."""
    if len(shape) != 2:
        return None
    if made_by(gguf_type) == GGUFPY:
        return tensor_type(shape, gguf_type)[1]
    if shape[-1] % K_BLOCK:
        return f"row width {shape[-1]} is not a multiple of the K-quant block ({K_BLOCK})"
    return None


def permute_qk(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Rows of a q/k projection weight (n_heads·head_dim, d) or bias (n_heads·head_dim,) from the
    Hugging Face rotate-half order to llama.cpp's consecutive-pair RoPE order: within each head,
    row j of the first half and row j of the second half become rows 2j and 2j + 1
    (``convert_hf_to_gguf.py``, ``LlamaModel.permute``)."""
    if w.shape[0] % (2 * n_heads):
        raise ValueError(f"cannot permute {w.shape[0]} rows into {n_heads} heads of even size")
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def tensor_type(shape: tuple[int, ...], gguf_type: str) -> tuple[Q, str | None]:
    """(GGML type, fallback reason) of one tensor of numpy shape ``shape`` under a requested type.

    1-D tensors (norms, biases, RoPE factors) stay f32, as llama.cpp's converter keeps them. q8_0,
    q5_1, q5_0, q4_1 and q4_0 quantise each row in blocks of 32 values; a row width (the last axis,
    ggml's ne[0]) that is not a multiple of the block falls back to f16, and the reason is returned.
    The K-quant mixes are not written by gguf-py (ValueError; see :func:`made_by`)."""
    if check_gguf_type(gguf_type) in KQUANTS:
        raise ValueError(f"{gguf_type} is written by llama.cpp's quantizer, not tensor by tensor by gguf-py")
    want = _TYPES[gguf_type]
    if len(shape) == 1 or want == Q.F32:
        return Q.F32, None
    block = GGML_QUANT_SIZES[want][0]
    if shape[-1] % block:
        return Q.F16, (f"row width {shape[-1]} is not a multiple of the {gguf_type} block ({block}); written as f16")
    return want, None


def encode(x: np.ndarray, qtype: Q) -> np.ndarray:
    """A float32 array in the file's encoding: float32, float16 or quantized blocks (uint8 rows)."""
    return quants.quantize(np.ascontiguousarray(x, dtype=np.float32), qtype)


def encoded_nbytes(shape: tuple[int, ...], qtype: Q) -> int:
    """Bytes of a tensor of numpy shape ``shape`` in type ``qtype``."""
    block, size = GGML_QUANT_SIZES[qtype]
    return math.prod(shape) // block * size


@dataclass(frozen=True)
class LayerWidths:
    """One decoder block's query heads, KV heads and MLP channels."""

    heads: int
    kv_heads: int
    ffn: int


def layer_widths(adapter: Adapter, model: nn.Module, head_dim: int) -> list[LayerWidths]:
    """Widths of every (pruned) decoder block, read from its module shapes; ValueError when a
    block's q/k/v/o shapes do not split into whole heads of ``head_dim``."""
    out: list[LayerWidths] = []
    for i, layer in enumerate(adapter.decoder_layers(model)):
        attn = adapter.attention(layer)
        q, k, v, o = (getattr(attn, n) for n in (adapter.q, adapter.k, adapter.v, adapter.o))
        if (
            q.out_features % head_dim
            or k.out_features % head_dim
            or k.out_features != v.out_features
            or o.in_features != q.out_features
        ):
            raise ValueError(
                f"layer {i}: q/k/v/o shapes {q.out_features}/{k.out_features}/"
                f"{v.out_features}/{o.in_features} are not whole heads of head_dim "
                f"{head_dim} (mixed head sizes cannot be written as GGUF)"
            )
        out.append(LayerWidths(q.out_features // head_dim, k.out_features // head_dim, adapter.ffn_width(layer)))
    return out


# ----------------------------------------------------------------------------- RoPE
def rope_freq_factors(params: dict[str, Any], head_dim: int) -> torch.Tensor:
    """The per-frequency divisors of Llama-3.1's RoPE scaling (``rope_freqs.weight``, head_dim/2
    values) as llama.cpp's converter computes them (``LlamaModel.generate_extra_tensors``)."""
    base = params.get("rope_theta", 10000.0)
    freqs = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    factor = params.get("factor", 8.0)
    low, high = params.get("low_freq_factor", 1.0), params.get("high_freq_factor", 4.0)
    old_ctx = params.get("original_max_position_embeddings", 8192)
    low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
    out: list[float] = []
    for f in freqs.tolist():
        wavelen = 2 * math.pi / f
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (old_ctx / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return torch.tensor(out, dtype=torch.float32)


def rope_params(config: PretrainedConfig) -> dict[str, Any]:
    """The config's RoPE parameters (transformers 5 ``rope_parameters``; older ``rope_scaling``
    plus ``rope_theta``), one flat dict with ``rope_type`` and ``rope_theta``."""
    p = getattr(config, "rope_parameters", None)
    if isinstance(p, dict) and "full_attention" in p and isinstance(p["full_attention"], dict):
        p = p["full_attention"]
    p = dict(p or getattr(config, "rope_scaling", None) or {})
    p.setdefault("rope_theta", getattr(config, "rope_theta", 10000.0))
    p.setdefault("rope_type", p.get("type", "default"))
    return p


def rope_metadata(config: PretrainedConfig, head_dim: int) -> tuple[dict[str, Any], torch.Tensor | None]:
    """(GGUF RoPE keys by suffix, llama3 ``rope_freqs`` tensor or None) of a config; ValueError
    for a RoPE variant this export does not write (yarn, dynamic, longrope, partial rotary)."""
    p = rope_params(config)
    partial = p.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0)) or 1.0
    if partial != 1.0:
        raise ValueError(
            f"partial rotary embeddings (partial_rotary_factor={partial}) are not written by the GGUF export"
        )
    kv: dict[str, Any] = {"rope.freq_base": float(p["rope_theta"]), "rope.dimension_count": head_dim}
    kind = p["rope_type"]
    if kind == "default":
        return kv, None
    if kind == "linear":
        kv.update({"rope.scaling.type": "linear", "rope.scaling.factor": float(p["factor"])})
        return kv, None
    if kind == "llama3":
        return kv, rope_freq_factors(p, head_dim)
    raise ValueError(f"RoPE type {kind!r} is not written by the GGUF export (default, linear and llama3 are)")
