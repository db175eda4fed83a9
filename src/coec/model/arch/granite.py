"""Granite (IBM Granite 3.x dense): the Llama layer plus four scalars from the config.

``embedding_multiplier`` scales the token embeddings inside the model's forward, so layer-wise
calibration must apply it too (``embed_scale``); ``residual_multiplier`` (inside each decoder
layer), ``attention_multiplier`` (the attention score scale) and ``logits_scaling`` (the head)
act inside modules the pruning code calls whole. No other stock class has these scalars, so a
pruned Granite model is exported only as Granite (``portable = False``); its attention reads an
explicit ``head_dim`` from the config, so head counts need not divide hidden_size.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from coec.model.arch.base import Adapter

if TYPE_CHECKING:
    from transformers import PretrainedConfig


class GraniteAdapter(Adapter):
    families = ("granite",)
    model_type = "granite"
    qkv_bias = o_bias = mlp_bias = "flag"
    portable = False
    note = "the Llama layer with embedding, residual, attention and logit multipliers"

    gguf_archs = ("granite",)

    def embed_scale(self, config: PretrainedConfig) -> float | None:
        return float(config.embedding_multiplier)

    def logit_divisor(self, config: PretrainedConfig) -> float | None:
        return float(config.logits_scaling)

    def gguf_scalars(self, config: PretrainedConfig) -> dict[str, float]:
        # llama.cpp's granite arch: the embedding and residual scales, the attention score
        # scale (kq_scale) and the logit divisor (src/models/granite.cpp, llama-graph.cpp)
        return {
            "embedding_scale": float(config.embedding_multiplier),
            "residual_scale": float(config.residual_multiplier),
            "attention.scale": float(config.attention_multiplier),
            "logit_scale": float(config.logits_scaling),
        }
