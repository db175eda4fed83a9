"""Structured-pruning surgery that yields a smaller dense model.

Attention: the kept KV groups keep their k/v rows, their query heads' q rows, and the matching
o_proj input columns (GQA shape preserved: heads per KV head unchanged). MLP: the kept channels
keep their gate/up rows and down_proj columns. o_proj / down_proj may receive a bias (FLAP) and
compensated weights. The HF config is rewritten so that ``save_pretrained`` followed by a vanilla
``AutoModelForCausalLM.from_pretrained`` reloads the same function: ``prepare_for_save_`` does so
in the model's own class, ``build_export_model`` picks the stock class that expresses the pruned
model exactly when its own class cannot (docs/export.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .arch import EXPORT_FALLBACKS, STOCK, AttnShape, ModelError, adapter_for, sliced_linear, stock_class
from .models import decoder_layers

_sliced_linear = sliced_linear  # historical name


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


def install_weights_(model, tensors: dict[str, torch.Tensor]) -> None:
    """Install ``layer{i}.{o_proj|down_proj}.weight|bias`` tensors (a compensation block file)
    on a pruned model; dtypes and devices follow the model's modules."""
    layers = decoder_layers(model)
    for key, weight in tensors.items():
        if key.endswith(".weight"):
            layer_s, module, _ = key.split(".")
            set_output_weights_(
                layers[int(layer_s.removeprefix("layer"))], module, weight, tensors.get(f"{layer_s}.{module}.bias")
            )


def prune_model_(model, keep: dict) -> None:
    """Prune every layer of ``model`` by a keep.json dict and rewrite its config (left alone
    when per-layer widths differ, e.g. FLAP's adaptive structure)."""
    adapter = adapter_for(model.config)
    geom = adapter.attention_shape(model.config)
    layers = adapter.decoder_layers(model)
    if len(keep["layers"]) != len(layers):
        raise ValueError(f"keep set has {len(keep['layers'])} layers, model has {len(layers)}")
    for layer, k in zip(layers, keep["layers"]):
        adapter.prune_layer_(layer, geom, k["kv_groups"], k["channels"])
    rewrite_config_(model, strict=False)


def rewrite_config_(model, strict: bool = True) -> bool:
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


def prepare_for_save_(model) -> None:
    """Make a pruned model reloadable by a vanilla ``from_pretrained``: widths in the config and,
    when o_proj / down_proj carry biases, the ``attention_bias`` / ``mlp_bias`` flags (sibling
    projections get zero biases), in the model's own class. Families whose vanilla modules cannot
    hold the bias raise; ``build_export_model`` (what ``coec export`` uses) then picks another
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
                    setattr(parent, name, _sliced_linear(lin, bias=True))


# ----------------------------------------------------------------------------- export
# A pruned model is written in the stock transformers class that expresses it exactly: its own
# family when that family's config and modules can hold it, else the first fallback below.

# The fallback order (EXPORT_FALLBACKS) and what each stock class can hold (STOCK) live in
# coec.arch; these two tables are views of it under their historical names.
STOCK_CLASSES = {k: c.holds() for k, c in STOCK.items()}
STOCK_NOTES = {k: c.note for k, c in STOCK.items()}


@dataclass(frozen=True)
class ExportNeeds:
    """The structure a pruned model needs from the class that is to hold it."""

    family: str
    qk_norm: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    divides: bool  # hidden_size % num_attention_heads == 0
    sliding: bool  # the source masks with a sliding window shorter than its context
    head_implied: bool = True  # head_dim == hidden_size // num_attention_heads


def export_needs(model) -> ExportNeeds:
    """Read what a pruned (uniform-width) model needs; its config must already hold the widths."""
    cfg = model.config
    ad = adapter_for(cfg)
    layers = ad.decoder_layers(model)
    attn = [ad.attention(layer) for layer in layers]
    mlp = [ad.mlp(layer) for layer in layers]
    return ExportNeeds(
        family=cfg.model_type,
        qk_norm=ad.qk_norm,
        qkv_bias=any(getattr(a, n).bias is not None for a in attn for n in (ad.q, ad.k, ad.v)),
        o_bias=any(getattr(a, ad.o).bias is not None for a in attn),
        mlp_bias=any(getattr(m, n).bias is not None for m in mlp for n in (ad.gate, ad.up, ad.down)),
        divides=cfg.hidden_size % cfg.num_attention_heads == 0,
        sliding=ad.sliding(cfg),
        head_implied=cfg.hidden_size // cfg.num_attention_heads == ad.attention_shape(cfg).head_dim,
    )


def _cannot_hold(model_type: str, needs: ExportNeeds) -> str | None:
    """Why ``model_type`` cannot express a model with ``needs`` exactly (None: it can)."""
    cap = stock_class(model_type).holds()
    if cap["qk_norm"] != needs.qk_norm:
        return "per-head q/k norms " + ("missing" if needs.qk_norm else "not in the source")
    if needs.sliding and model_type != needs.family:
        return "the sliding attention window is kept only in the source class"
    for key, what in (("qkv_bias", "q/k/v bias"), ("o_bias", "o_proj bias"), ("mlp_bias", "MLP bias")):
        if getattr(needs, key) and not cap[key]:
            return f"no {what} slot"
    if not needs.divides and not cap["any_heads"]:
        return "its config requires hidden_size % num_attention_heads == 0"
    return None


def choose_export_class(needs: ExportNeeds) -> tuple[str, str]:
    """The stock model_type to export to, with a one-line reason; raises when none fits.

    Of the classes transformers holds exactly (the source class, then the fallbacks), the one
    that vLLM and llama.cpp's converter read correctly, else the one the fewest misread
    (``coec.arch.runtimes``; ``build_export_model`` records and warns about the rest)."""
    from .arch import runtimes

    fallbacks = EXPORT_FALLBACKS[needs.qk_norm] if adapter_for(needs.family).portable else ()
    order = list(dict.fromkeys((needs.family, *fallbacks)))
    why = {m: _cannot_hold(m, needs) for m in order}
    held = [m for m in order if why[m] is None]
    if not held:
        raise ModelError(
            "no stock transformers class expresses this pruned model exactly ("
            + "; ".join(f"{m}: {why[m]}" for m in order)
            + ")"
        )
    model_type = runtimes.pick(held, needs)
    tried = [f"{m}: {why[m] or runtimes.shortfalls(m, needs)}" for m in order[: order.index(model_type)]]
    if model_type == needs.family and not tried:
        return model_type, f"the source class {model_type} expresses the pruned model"
    return model_type, (
        f"{'; '.join(tried)}; {model_type} holds it exactly: {STOCK_NOTES[model_type]} (absent biases are zeros)"
    )


_COPIED_KEYS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "hidden_act",
    "max_position_embeddings",
    "rms_norm_eps",
    "tie_word_embeddings",
    "rope_parameters",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "initializer_range",
    "use_cache",
)


def export_config(model, model_type: str, needs: ExportNeeds):
    """The config of ``model_type`` that describes the pruned model (bias flags set as needed)."""
    import copy

    from transformers import AutoConfig

    src = model.config
    if model_type == needs.family:
        cfg = copy.deepcopy(src)
        adapter_for(model_type).own_export_flags(cfg, needs)
        return cfg
    kw = {k: copy.deepcopy(getattr(src, k)) for k in _COPIED_KEYS if hasattr(src, k)}
    kw["attention_dropout"] = 0.0
    kw.update(stock_class(model_type).export_kwargs(needs, src))
    cfg = AutoConfig.for_model(model_type, **kw)
    cfg.dtype = getattr(src, "dtype", None) or next(model.parameters()).dtype
    return cfg


def _target_state(model, target) -> dict[str, torch.Tensor]:
    """The pruned model's tensors under the target's names; absent biases become zeros."""
    src = model.state_dict()
    out = {}
    for name, ref in target.state_dict().items():
        if name in src:
            if tuple(src[name].shape) != tuple(ref.shape):
                raise ModelError(
                    f"export: {name} has shape {tuple(src[name].shape)}, the target class expects {tuple(ref.shape)}"
                )
            out[name] = src[name]
        elif name.endswith(".bias"):
            out[name] = torch.zeros(ref.shape, dtype=ref.dtype, device="cpu")
        else:
            raise ModelError(f"export: the target class needs {name}, which the model lacks")
    left = sorted(set(src) - set(out))
    if left:
        raise ModelError(f"export: the target class has no slot for {left[:3]}")
    return out


def build_export_model(model, check_tokens: int = 8, seed: int = 0):
    """A stock-class twin of a pruned model (sharing its tensors) that a vanilla
    ``AutoModelForCausalLM.from_pretrained`` reloads, plus a provenance dict.

    The twin's logits on ``check_tokens`` random tokens must equal the model's (fp32: within
    1e-4 of the logit scale) or ModelError is raised."""
    from transformers import AutoModelForCausalLM

    rewrite_config_(model)
    needs = export_needs(model)
    model_type, reason = choose_export_class(needs)
    cfg = export_config(model, model_type, needs)
    dtype = next(model.parameters()).dtype
    device = next(model.parameters()).device
    with torch.device("meta"):
        target = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    target.load_state_dict(_target_state(model, target), strict=True, assign=True)
    rotary = target.model.rotary_emb  # non-persistent buffers: rebuild off the meta device
    target.model.rotary_emb = type(rotary)(config=target.config).to(device)
    meta = [n for n, t in [*target.named_parameters(), *target.named_buffers()] if t.is_meta]
    if meta:
        raise ModelError(f"export: tensors left unset in the target class: {meta[:3]}")
    target.to(device).eval()
    if getattr(model, "generation_config", None) is not None:
        import copy

        target.generation_config = copy.deepcopy(model.generation_config)
    info = {
        "source_architecture": type(model).__name__,
        "source_model_type": needs.family,
        "architecture": type(target).__name__,
        "model_type": model_type,
        "reason": reason,
        "heads": cfg.num_attention_heads,
        "kv_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "intermediate_size": cfg.intermediate_size,
        **runtime_report(model_type, needs),
    }
    if check_tokens:
        info["max_abs_logit_diff"] = check_same_logits(model, target, check_tokens, seed)
    return target, info


def runtime_report(model_type: str, needs: ExportNeeds) -> dict:
    """{'runtimes': each runtime's verdict on the class, 'warnings': one line per runtime that
    misreads it or fails to load it}; the warnings are logged."""
    import logging

    from .arch import runtimes

    warnings = runtimes.warnings_for(model_type, needs)
    for w in warnings:
        logging.getLogger(__name__).warning("export: %s", w)
    report = {
        "transformers": {"status": "ok", "why": "reloaded and its logits checked"},
        **runtimes.verdicts(model_type, needs),
    }
    return {"runtimes": report, "warnings": warnings}


def check_same_logits(model, other, n_tokens: int = 8, seed: int = 0) -> float:
    """Max |logit difference| of two models on ``n_tokens`` random tokens; raises ModelError
    above the dtype's tolerance (1e-4 in fp32/fp64, 2e-2 otherwise, relative to the logit scale)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (1, n_tokens), generator=g)
    with torch.no_grad():
        a = model(input_ids=ids.to(model.device)).logits.double().cpu()
        b = other(input_ids=ids.to(other.device)).logits.double().cpu()
    diff = float((a - b).abs().max())
    dtype = next(model.parameters()).dtype
    scale = max(1.0, float(a.abs().max()))
    tol = (1e-4 if dtype in (torch.float32, torch.float64) else 2e-2) * scale
    if not diff <= tol:
        raise ModelError(
            f"export: the {type(other).__name__} twin's logits differ from the "
            f"pruned model's by {diff:.3g} (> {tol:.3g})"
        )
    return diff
