"""The stock transformers class a pruned model is exported in (docs/export.md).

A pruned model is written in the stock class that expresses it exactly: its own family when that
family's config and modules can hold it, else the first fallback of ``coec.model.arch.EXPORT_FALLBACKS``
that can (what each stock class holds: ``coec.model.arch.STOCK``), preferring the class that vLLM and
llama.cpp's converter read correctly (``coec.model.arch.runtimes``). :func:`build_export_model` builds
that twin, sharing the pruned model's tensors, and checks its logits against the model's.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig, PreTrainedModel

from coec.model.arch import EXPORT_FALLBACKS, ModelError, adapter_for, runtimes, stock_class
from coec.model.prune import rewrite_config_

log = logging.getLogger(__name__)


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


def export_needs(model: PreTrainedModel) -> ExportNeeds:
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
    (``coec.model.arch.runtimes``; ``build_export_model`` records and warns about the rest)."""
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
    note = stock_class(model_type).note
    return model_type, f"{'; '.join(tried)}; {model_type} holds it exactly: {note} (absent biases are zeros)"


# The config entries an export to another stock class copies from the source config.
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


def export_config(model: PreTrainedModel, model_type: str, needs: ExportNeeds) -> PretrainedConfig:
    """The config of ``model_type`` that describes the pruned model (bias flags set as needed)."""
    src = model.config
    if model_type == needs.family:
        own: PretrainedConfig = copy.deepcopy(src)
        adapter_for(model_type).own_export_flags(own, needs)
        return own
    kw = {k: copy.deepcopy(getattr(src, k)) for k in _COPIED_KEYS if hasattr(src, k)}
    kw["attention_dropout"] = 0.0
    kw.update(stock_class(model_type).export_kwargs(needs, src))
    cfg: PretrainedConfig = AutoConfig.for_model(model_type, **kw)
    cfg.dtype = getattr(src, "dtype", None) or next(model.parameters()).dtype
    return cfg


def _target_state(model: nn.Module, target: nn.Module) -> dict[str, torch.Tensor]:
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


def _meta_twin(model: PreTrainedModel, cfg: PretrainedConfig) -> PreTrainedModel:
    """The ``cfg`` model holding ``model``'s tensors (built on the meta device, then filled)."""
    dtype = next(model.parameters()).dtype
    device = next(model.parameters()).device
    with torch.device("meta"):
        target: PreTrainedModel = AutoModelForCausalLM.from_config(  # type: ignore[no-untyped-call]  # transformers: untyped
            cfg, dtype=dtype
        )
    target.load_state_dict(_target_state(model, target), strict=True, assign=True)
    rotary = target.model.rotary_emb  # non-persistent buffers: rebuild off the meta device
    target.model.rotary_emb = type(rotary)(config=target.config).to(device)
    meta = [n for n, t in [*target.named_parameters(), *target.named_buffers()] if t.is_meta]
    if meta:
        raise ModelError(f"export: tensors left unset in the target class: {meta[:3]}")
    module: nn.Module = target  # transformers types PreTrainedModel.to by a wrapper mypy misreads
    module.to(device).eval()
    if getattr(model, "generation_config", None) is not None:
        target.generation_config = copy.deepcopy(model.generation_config)
    return target


def build_export_model(
    model: PreTrainedModel, check_tokens: int = 8, seed: int = 0
) -> tuple[PreTrainedModel, dict[str, Any]]:
    """A stock-class twin of a pruned model (sharing its tensors) that a vanilla
    ``AutoModelForCausalLM.from_pretrained`` reloads, plus a provenance dict.

    The twin's logits on ``check_tokens`` random tokens must equal the model's (fp32: within
    1e-4 of the logit scale) or ModelError is raised."""
    rewrite_config_(model)
    needs = export_needs(model)
    model_type, reason = choose_export_class(needs)
    cfg = export_config(model, model_type, needs)
    target = _meta_twin(model, cfg)
    info: dict[str, Any] = {
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


def runtime_report(model_type: str, needs: ExportNeeds) -> dict[str, Any]:
    """{'runtimes': each runtime's verdict on the class, 'warnings': one line per runtime that
    misreads it or fails to load it}; the warnings are logged."""
    warnings = runtimes.warnings_for(model_type, needs)
    for w in warnings:
        log.warning("export: %s", w)
    report = {
        "transformers": {"status": "ok", "why": "reloaded and its logits checked"},
        **runtimes.verdicts(model_type, needs),
    }
    return {"runtimes": report, "warnings": warnings}


def check_same_logits(model: PreTrainedModel, other: PreTrainedModel, n_tokens: int = 8, seed: int = 0) -> float:
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
