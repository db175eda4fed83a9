"""Qwen3: the common layout with per-head q/k RMSNorm (``q_norm`` / ``k_norm`` over head_dim,
shared by all heads: pruning heads leaves them as they are) and ``attention_bias`` for all four
attention projections."""

from __future__ import annotations

from coec.model.arch.base import Adapter


class Qwen3Adapter(Adapter):
    families = ("qwen3",)
    model_type = "qwen3"
    qk_norm = True
    qkv_bias = o_bias = "flag"
    note = "per-head q/k RMSNorm, attention_bias for q/k/v and o_proj biases"
    gguf_archs = ("qwen3",)  # llama.cpp's llama/deci archs have no q/k norm slot
