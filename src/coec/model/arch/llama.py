"""Llama and Mistral: the common layout. Llama switches q/k/v/o biases with ``attention_bias``
and MLP biases with ``mlp_bias`` and requires hidden_size % num_attention_heads == 0; Mistral has
no biases, an explicit head_dim and a sliding window in every layer."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from coec.model.arch.base import Adapter, NeedsView

if TYPE_CHECKING:
    from transformers import PretrainedConfig


class LlamaAdapter(Adapter):
    families = ("llama",)
    model_type = "llama"
    qkv_bias = o_bias = mlp_bias = "flag"
    any_heads = False
    note = "attention_bias carries the q/k/v and o_proj biases, mlp_bias the MLP's"

    def export_kwargs(self, needs: NeedsView, src_config: PretrainedConfig) -> dict[str, Any]:
        return dict(attention_bias=needs.qkv_bias or needs.o_bias, mlp_bias=needs.mlp_bias)


class MistralAdapter(Adapter):
    families = ("mistral",)
    model_type = "mistral"
    always_sliding = True
    note = "the Llama layer with an explicit head_dim and no divisibility check, sliding_window off"

    def export_kwargs(self, needs: NeedsView, src_config: PretrainedConfig) -> dict[str, Any]:
        return dict(sliding_window=None)
