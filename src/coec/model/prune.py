"""Structured-pruning surgery that yields a smaller dense model.

Attention: the kept KV groups keep their k/v rows, their query heads' q rows, and the matching
o_proj input columns (GQA shape preserved: heads per KV head unchanged). MLP: the kept channels
keep their gate/up rows and down_proj columns. o_proj / down_proj may receive a bias (FLAP) and
compensated weights. The HF config is rewritten with the pruned widths;
``coec.export.hf_class.build_export_model`` picks the stock class that expresses the pruned model
exactly, so that a vanilla ``AutoModelForCausalLM.from_pretrained`` reloads it (docs/export.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from coec.model.arch import ModelError, adapter_for
from coec.model.load import decoder_layers

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def set_output_weights_(layer: nn.Module, module: str, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
    """Install compensated weights (and an optional bias) on o_proj or down_proj."""
    parent, attr = adapter_for(layer).output_parent(layer, module)
    lin: nn.Linear = getattr(parent, attr)
    if weight.shape != lin.weight.shape:
        raise ValueError(
            f"{module}: compensated weight {tuple(weight.shape)} does not match "
            f"the pruned shape {tuple(lin.weight.shape)}"
        )
    has_bias = bias is not None or lin.bias is not None
    new = nn.Linear(lin.in_features, lin.out_features, bias=has_bias, device=lin.weight.device, dtype=lin.weight.dtype)
    new.weight.data.copy_(weight)
    if has_bias:
        base = lin.bias.data if lin.bias is not None else torch.zeros_like(new.bias)
        new.bias.data.copy_(base + (bias.to(base) if bias is not None else 0))
    setattr(parent, attr, new)


def install_weights_(model: nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """Install ``layer{i}.{o_proj|down_proj}.weight|bias`` tensors (a compensation block file)
    on a pruned model; dtypes and devices follow the model's modules."""
    layers = decoder_layers(model)
    for key, weight in tensors.items():
        if key.endswith(".weight"):
            layer_s, module, _ = key.split(".")
            set_output_weights_(
                layers[int(layer_s.removeprefix("layer"))], module, weight, tensors.get(f"{layer_s}.{module}.bias")
            )


def prune_model_(model: PreTrainedModel, keep: dict[str, Any]) -> None:
    """Prune every layer of ``model`` by a keep.json dict and rewrite its config (left alone
    when per-layer widths differ, e.g. FLAP's adaptive structure)."""
    adapter = adapter_for(model.config)
    geom = adapter.attention_shape(model.config)
    layers = adapter.decoder_layers(model)
    if len(keep["layers"]) != len(layers):
        raise ValueError(f"keep set has {len(keep['layers'])} layers, model has {len(layers)}")
    for layer, k in zip(layers, keep["layers"], strict=True):
        adapter.prune_layer_(layer, geom, k["kv_groups"], k["channels"])
    rewrite_config_(model, strict=False)


def rewrite_config_(model: PreTrainedModel, strict: bool = True) -> bool:
    """Set head counts, head_dim and intermediate_size from the pruned modules.

    Vanilla HF configs hold one width for all layers: with per-layer widths (FLAP's adaptive
    structure) ``strict`` raises, otherwise the config is left alone (the in-memory model still
    runs: attention infers head counts from weight shapes) and False is returned.
    """
    cfg = model.config
    adapter = adapter_for(cfg)
    geom = adapter.attention_shape(cfg)
    layers = adapter.decoder_layers(model)
    kv = {adapter.kv_width(layer) // geom.head_dim for layer in layers}
    ff = {adapter.ffn_width(layer) for layer in layers}
    if len(kv) != 1 or len(ff) != 1:
        if not strict:
            return False
        raise ModelError(
            f"per-layer widths differ (KV heads {sorted(kv)}, d_ff {sorted(ff)}): "
            "a vanilla HF config cannot describe this model"
        )
    n_kv = kv.pop()
    cfg.head_dim = geom.head_dim
    cfg.num_key_value_heads = n_kv
    cfg.num_attention_heads = n_kv * geom.groups
    cfg.intermediate_size = ff.pop()
    return True
