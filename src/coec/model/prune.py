"""Structured-pruning surgery that yields a smaller dense model.

Attention: the kept KV groups keep their k/v rows, their query heads' q rows, and the matching
o_proj input columns (GQA shape preserved: heads per KV head unchanged). MLP: the kept channels
keep their gate/up rows and down_proj columns. o_proj / down_proj may receive a bias (FLAP) and
compensated weights. The HF config is rewritten so that ``save_pretrained`` followed by a vanilla
``AutoModelForCausalLM.from_pretrained`` reloads the same function: ``prepare_for_save_`` does so
in the model's own class; ``coec.export.hf_class.build_export_model`` picks the stock class that
expresses the pruned model exactly when its own class cannot (docs/export.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from coec.model.arch import AttnShape, ModelError, adapter_for, sliced_linear
from coec.model.load import decoder_layers

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def prune_layer_(layer: nn.Module, geom: AttnShape, kv_groups: list[int], channels: list[int]) -> None:
    """Remove the pruned KV groups (with their query heads) and MLP channels of one decoder
    layer in place (the family's surgery: ``Adapter.prune_layer_``)."""
    adapter_for(layer).prune_layer_(layer, geom, kv_groups, channels)


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


def prepare_for_save_(model: PreTrainedModel) -> None:
    """Make a pruned model reloadable by a vanilla ``from_pretrained``: widths in the config and,
    when o_proj / down_proj carry biases, the ``attention_bias`` / ``mlp_bias`` flags (sibling
    projections get zero biases), in the model's own class. Families whose vanilla modules cannot
    hold the bias raise; ``export_class.build_export_model`` (what ``coec export`` uses) then picks another
    stock class."""
    rewrite_config_(model)
    validate = getattr(model.config, "validate_architecture", None)
    if validate is not None:
        try:
            validate()
        except ValueError as exc:  # e.g. a config requiring hidden_size % num_attention_heads == 0
            raise ModelError(
                f"the pruned config cannot be saved by this transformers version "
                f"({exc}); evaluate the pruned model in memory instead"
            ) from exc
    cfg = model.config
    adapter = adapter_for(cfg)
    layers = adapter.decoder_layers(model)
    family = cfg.model_type
    for flag, attr, role, siblings in adapter.bias_groups():
        if not any(adapter.output_module(layer, role).bias is not None for layer in layers):
            continue
        slot = adapter.o_bias if role == "o_proj" else adapter.mlp_bias
        if slot == "never":
            raise ModelError(
                f"{family}'s vanilla modules have no {role} bias: a model with an "
                f"{role} bias cannot be reloaded with AutoModelForCausalLM"
            )
        if not hasattr(cfg, flag):
            raise ModelError(f"{family} has no {flag} config flag: the bias cannot be exported")
        setattr(cfg, flag, True)
        for layer in layers:
            parent = getattr(layer, attr)
            for name in siblings:
                lin = getattr(parent, name)
                if lin.bias is None:
                    setattr(parent, name, sliced_linear(lin, bias=True))
