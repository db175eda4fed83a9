"""Structured-pruning surgery that yields a smaller dense model.

Attention: the kept KV groups keep their k/v rows, their query heads' q rows, and the matching
o_proj input columns (GQA shape preserved: heads per KV head unchanged). MLP: the kept channels
keep their gate/up rows and down_proj columns. o_proj / down_proj may receive a bias (FLAP) and
compensated weights. The HF config is rewritten so that ``save_pretrained`` followed by a vanilla
``AutoModelForCausalLM.from_pretrained`` reloads the same function.
"""

from __future__ import annotations

import torch
from torch import nn

from .models import AttnGeometry, ModelError, attention_geometry, check_family, decoder_layers
from .select import kv_rows, o_proj_columns


def _sliced_linear(lin: nn.Linear, rows: torch.Tensor | None = None,
                   cols: torch.Tensor | None = None, bias: bool | None = None) -> nn.Linear:
    """A new Linear holding ``lin.weight[rows][:, cols]`` (and its bias rows)."""
    w = lin.weight.data
    b = lin.bias.data if lin.bias is not None else None
    if rows is not None:
        rows = rows.to(w.device)
        w = w.index_select(0, rows)
        b = b.index_select(0, rows) if b is not None else None
    if cols is not None:
        w = w.index_select(1, cols.to(w.device))
    has_bias = (b is not None) if bias is None else bias
    new = nn.Linear(w.shape[1], w.shape[0], bias=has_bias, device=w.device, dtype=w.dtype)
    new.weight.data.copy_(w)
    if has_bias:
        new.bias.data.copy_(b if b is not None else torch.zeros_like(new.bias))
    return new


def prune_layer_(layer: nn.Module, geom: AttnGeometry, kv_groups: list[int],
                 channels: list[int]) -> None:
    """Remove the pruned KV groups (with their query heads) and MLP channels of one decoder
    layer in place."""
    if not kv_groups:
        raise ValueError("a layer must keep at least one KV group")
    if len(set(kv_groups)) != len(kv_groups) or max(kv_groups) >= geom.n_kv or min(kv_groups) < 0:
        raise ValueError(f"invalid kv_groups {kv_groups} for {geom.n_kv} KV heads")
    attn, mlp = layer.self_attn, layer.mlp
    q_rows = o_proj_columns(kv_groups, geom)
    kv = kv_rows(kv_groups, geom)
    attn.q_proj = _sliced_linear(attn.q_proj, rows=q_rows)
    attn.k_proj = _sliced_linear(attn.k_proj, rows=kv)
    attn.v_proj = _sliced_linear(attn.v_proj, rows=kv)
    attn.o_proj = _sliced_linear(attn.o_proj, cols=q_rows)
    ch = torch.tensor(channels, dtype=torch.long)
    if ch.numel() == 0 or ch.max() >= mlp.down_proj.in_features or ch.min() < 0:
        raise ValueError(f"invalid MLP channel keep set for d_ff={mlp.down_proj.in_features}")
    mlp.gate_proj = _sliced_linear(mlp.gate_proj, rows=ch)
    mlp.up_proj = _sliced_linear(mlp.up_proj, rows=ch)
    mlp.down_proj = _sliced_linear(mlp.down_proj, cols=ch)


def set_output_weights_(layer: nn.Module, module: str, weight: torch.Tensor,
                        bias: torch.Tensor | None = None) -> None:
    """Install compensated weights (and an optional bias) on o_proj or down_proj."""
    parent = layer.self_attn if module == "o_proj" else layer.mlp
    lin: nn.Linear = getattr(parent, module)
    if weight.shape != lin.weight.shape:
        raise ValueError(f"{module}: compensated weight {tuple(weight.shape)} does not match "
                         f"the pruned shape {tuple(lin.weight.shape)}")
    has_bias = bias is not None or lin.bias is not None
    new = nn.Linear(lin.in_features, lin.out_features, bias=has_bias,
                    device=lin.weight.device, dtype=lin.weight.dtype)
    new.weight.data.copy_(weight)
    if has_bias:
        base = lin.bias.data if lin.bias is not None else torch.zeros_like(new.bias)
        new.bias.data.copy_(base + (bias.to(base) if bias is not None else 0))
    setattr(parent, module, new)


def install_weights_(model, tensors: dict[str, torch.Tensor]) -> None:
    """Install ``layer{i}.{o_proj|down_proj}.weight|bias`` tensors (a compensation block file)
    on a pruned model; dtypes and devices follow the model's modules."""
    layers = decoder_layers(model)
    for key, weight in tensors.items():
        if key.endswith(".weight"):
            layer_s, module, _ = key.split(".")
            set_output_weights_(layers[int(layer_s.removeprefix("layer"))], module, weight,
                                tensors.get(f"{layer_s}.{module}.bias"))


def prune_model_(model, keep: dict) -> None:
    """Prune every layer of ``model`` by a keep.json dict and rewrite its config (left alone
    when per-layer widths differ, e.g. FLAP's adaptive structure)."""
    check_family(model.config)
    geom = attention_geometry(model.config)
    layers = decoder_layers(model)
    if len(keep["layers"]) != len(layers):
        raise ValueError(f"keep set has {len(keep['layers'])} layers, model has {len(layers)}")
    for layer, k in zip(layers, keep["layers"]):
        prune_layer_(layer, geom, k["kv_groups"], k["channels"])
    rewrite_config_(model, strict=False)


def rewrite_config_(model, strict: bool = True) -> bool:
    """Set head counts, head_dim and intermediate_size from the pruned modules.

    Vanilla HF configs hold one width for all layers: with per-layer widths (FLAP's adaptive
    structure) ``strict`` raises, otherwise the config is left alone (the in-memory model still
    runs: attention infers head counts from weight shapes) and False is returned.
    """
    cfg = model.config
    geom = attention_geometry(cfg)
    layers = decoder_layers(model)
    kv = {l.self_attn.k_proj.out_features // geom.head_dim for l in layers}
    ff = {l.mlp.down_proj.in_features for l in layers}
    if len(kv) != 1 or len(ff) != 1:
        if not strict:
            return False
        raise ModelError(f"per-layer widths differ (KV heads {sorted(kv)}, d_ff {sorted(ff)}): "
                         "a vanilla HF config cannot describe this model")
    n_kv = kv.pop()
    cfg.head_dim = geom.head_dim
    cfg.num_key_value_heads = n_kv
    cfg.num_attention_heads = n_kv * geom.groups
    cfg.intermediate_size = ff.pop()
    return True


def prepare_for_save_(model) -> None:
    """Make a pruned model reloadable by a vanilla ``from_pretrained``: widths in the config and,
    when o_proj / down_proj carry biases, the ``attention_bias`` / ``mlp_bias`` flags (sibling
    projections get zero biases). Families whose vanilla modules cannot hold the bias raise."""
    rewrite_config_(model)
    validate = getattr(model.config, "validate_architecture", None)
    if validate is not None:
        try:
            validate()
        except ValueError as exc:  # e.g. LlamaConfig: hidden_size % num_attention_heads != 0
            raise ModelError(f"the pruned config cannot be saved by this transformers version "
                             f"({exc}); evaluate the pruned model in memory instead") from exc
    layers = decoder_layers(model)
    o_bias = any(l.self_attn.o_proj.bias is not None for l in layers)
    d_bias = any(l.mlp.down_proj.bias is not None for l in layers)
    cfg = model.config
    family = cfg.model_type
    if o_bias and family == "qwen2":
        raise ModelError("Qwen2's vanilla attention has no o_proj bias: a model with an "
                         "o_proj bias cannot be reloaded with AutoModelForCausalLM")
    for attr, flag, needed, siblings in (
            ("self_attn", "attention_bias", o_bias, ("q_proj", "k_proj", "v_proj", "o_proj")),
            ("mlp", "mlp_bias", d_bias, ("gate_proj", "up_proj", "down_proj"))):
        if not needed:
            continue
        if not hasattr(cfg, flag):
            raise ModelError(f"{family} has no {flag} config flag: the bias cannot be exported")
        setattr(cfg, flag, True)
        for layer in decoder_layers(model):
            parent = getattr(layer, attr)
            for name in siblings:
                lin = getattr(parent, name)
                if lin.bias is None:
                    setattr(parent, name, _sliced_linear(lin, bias=True))
