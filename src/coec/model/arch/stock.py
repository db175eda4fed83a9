"""Stock transformers classes that serve only as export targets (no source family of ours):
they hold a pruned model whose own class cannot (docs/export.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from coec.model.arch.base import NeedsView, StockClass

if TYPE_CHECKING:
    from transformers import PretrainedConfig


class SeedOssClass(StockClass):
    model_type = "seed_oss"
    qkv_bias = o_bias = mlp_bias = "flag"
    note = (
        "the Llama layer with separate q/k/v (attention_bias), o_proj (attention_out_bias) "
        "and MLP (mlp_bias) bias flags and an explicit head_dim without a divisibility check"
    )

    def export_kwargs(self, needs: NeedsView, src_config: PretrainedConfig) -> dict[str, Any]:
        return dict(
            attention_bias=needs.qkv_bias,
            attention_out_bias=needs.o_bias,
            mlp_bias=needs.mlp_bias,
            residual_dropout=0.0,
        )


class HyV3Class(StockClass):
    model_type = "hy_v3"
    qk_norm = True
    qkv_bias = o_bias = mlp_bias = "flag"
    note = (
        "the Qwen3 layer (per-head q/k RMSNorm) with attention_bias and mlp_bias, every layer dense (mlp_layer_types)"
    )

    def export_kwargs(self, needs: NeedsView, src_config: PretrainedConfig) -> dict[str, Any]:
        return dict(
            attention_bias=needs.qkv_bias or needs.o_bias,
            mlp_bias=needs.mlp_bias,
            mlp_layer_types=["dense"] * src_config.num_hidden_layers,
        )
