"""Deployment cost of a pruned model from architecture numbers (paper Sec. 5.5, Table 4).

Pure arithmetic on config dicts (the fields of a Hugging Face ``config.json``); no I/O and no
torch (tests/integration/test_arch.py checks the analytic count against the meta-device model).

Pruned shape (Sec. 3.1, docs/protocol.md "Selection"): whole KV groups are removed with their query
heads (GQA ratio and ``head_dim`` unchanged) and MLP intermediate channels are removed; the
hidden size, vocabulary, norms and layer count are untouched. Compensation (RCPU, COEC) does not
change the shape, so the cost depends only on the ratio.

What is counted
---------------
* Parameters: embeddings (+ an untied ``lm_head``), q/k/v/o, gate/up/down, the two RMSNorms per
  layer and the final norm, and what each family's adapter adds (``Adapter.layer_params`` in
  ``coec.model.arch``): q/k/v biases always on or switched by ``attention_bias`` (with the o_proj
  bias), MLP biases switched by ``mlp_bias``, per-head ``q_norm`` / ``k_norm``.
* GFLOPs per token: ``2 x params`` -- one multiply-add per parameter, with the input-embedding
  lookup counted like a matmul and no attention-score term (``context_len=0``). This is the
  convention that reproduces Table 4 (15.2 for Qwen2.5-7B, 141.1 for Llama-3-70B); the honest
  matmul-only count (``include_embedding=False``) and the attention-score term
  (``4 * layers * heads * head_dim * context_len``) are available as options.
* Peak memory (GiB = 2**30 bytes, which the paper labels "GB"; :data:`GIB`, used by the
  workflow's memory plan too, ``coec.workflow.plan``): see ``peak_memory_gb``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from coec.model.arch import adapter_for
from coec.model.arch.published import PUBLISHED_ARCHS as PUBLISHED_ARCHS  # the Table 4 architectures
from coec.select.rounding import DEFAULT_ROUNDING
from coec.select.scores import n_keep

GIB = 2**30


def config_dict(config: Any) -> dict[str, Any]:
    if hasattr(config, "to_dict"):
        config = config.to_dict()
    if not isinstance(config, Mapping):
        raise TypeError(f"expected a config dict or PretrainedConfig, got {type(config).__name__}")
    return dict(config)


def _get(cfg: Mapping[str, Any], key: str) -> Any:
    if cfg.get(key) is None:
        raise KeyError(f"config is missing required key {key!r}")
    return cfg[key]


def arch_dims(cfg: Mapping[str, Any], shape: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Architecture numbers with the pruned ``shape`` (if any) overriding the config."""
    cfg = dict(cfg) | dict(shape or {})
    mt = str(_get(cfg, "model_type"))
    adapter_for(mt)  # unknown families: ModelError (a ValueError) listing the known ones
    h = int(_get(cfg, "hidden_size"))
    nh = int(_get(cfg, "num_attention_heads"))
    nkv = int(cfg.get("num_key_value_heads") or nh)
    hd = int(cfg.get("head_dim") or h // nh)
    if nh % nkv:
        raise ValueError(f"num_attention_heads={nh} is not a multiple of num_key_value_heads={nkv}")
    return {
        "model_type": mt,
        "hidden": h,
        "layers": int(_get(cfg, "num_hidden_layers")),
        "heads": nh,
        "kv_heads": nkv,
        "head_dim": hd,
        "ffn": int(_get(cfg, "intermediate_size")),
        "vocab": int(_get(cfg, "vocab_size")),
        "tied": bool(cfg.get("tie_word_embeddings", False)),
        "attention_bias": bool(cfg.get("attention_bias", False)),
        "mlp_bias": bool(cfg.get("mlp_bias", False)),
    }


def kept_count(n: int, ratio: float, rounding: str = DEFAULT_ROUNDING) -> int:
    """Units kept out of ``n`` at pruning ratio ``ratio`` in (0, 1): the selection stage's own
    rule (:func:`coec.select.scores.n_keep`), so cost figures and pruned models cannot disagree."""
    if n < 1:
        raise ValueError(f"count must be >= 1, got {n}")
    return n_keep(n, ratio, rounding)


def pruned_shape(config: Any, ratio: float, group_rounding: str = DEFAULT_ROUNDING) -> dict[str, int]:
    """Config fields of the model pruned at ``ratio`` (uniform across layers, Sec. 3.1).

    KV groups: ``kept_count(n_kv, ratio, group_rounding)``, each with its ``heads / n_kv`` query
    heads; MLP channels: ``ceil((1 - ratio) d_ff)`` (the paper's rule; ``group_rounding`` applies
    to KV groups only). ``head_dim`` is returned explicitly because ``hidden / heads`` no longer
    equals it after pruning.
    """
    d = arch_dims(config_dict(config))
    g = d["heads"] // d["kv_heads"]
    kv = kept_count(d["kv_heads"], ratio, group_rounding)
    return {
        "num_key_value_heads": kv,
        "num_attention_heads": kv * g,
        "head_dim": d["head_dim"],
        "intermediate_size": kept_count(d["ffn"], ratio, DEFAULT_ROUNDING),
    }


def param_breakdown(d: Mapping[str, Any]) -> dict[str, int]:
    h = d["hidden"]
    attn, mlp = adapter_for(d["model_type"]).layer_params(d)  # biases and norms per family
    L = d["layers"]
    return {
        "embed": d["vocab"] * h,
        "lm_head": 0 if d["tied"] else d["vocab"] * h,
        "attention": L * attn,
        "mlp": L * mlp,
        "norms": L * 2 * h + h,
    }


def count_params(config: Any, shape: Mapping[str, Any] | None = None) -> int:
    """Exact parameter count from the architecture numbers (``shape`` overrides, e.g. pruned)."""
    return sum(param_breakdown(arch_dims(config_dict(config), shape)).values())


def flops_per_token(
    config: Any, shape: Mapping[str, Any] | None = None, *, include_embedding: bool = True, context_len: int = 0
) -> float:
    """Dense GFLOPs per token of a forward pass.

    Default = ``2 x count_params`` (the Table 4 convention: a multiply-add per parameter, the
    embedding lookup counted as a matmul, norms/biases as 2 FLOPs per parameter, no attention
    scores). ``include_embedding=False`` drops the input-embedding term; ``context_len > 0``
    adds ``QK^T`` and ``AV`` against that many cached tokens: ``4 L heads head_dim context_len``.
    """
    d = arch_dims(config_dict(config), shape)
    n = sum(param_breakdown(d).values())
    if not include_embedding:
        n -= d["vocab"] * d["hidden"]
    flops: float = 2.0 * n + 4.0 * d["layers"] * d["heads"] * d["head_dim"] * context_len
    return flops / 1e9


def kv_cache_bytes(
    config: Any,
    shape: Mapping[str, Any] | None = None,
    *,
    seq_len: int = 4096,
    batch_size: int = 1,
    bytes_per_value: int = 2,
) -> int:
    """K and V for every layer: ``2 L n_kv head_dim seq_len batch bytes``."""
    d = arch_dims(config_dict(config), shape)
    n: int = 2 * d["layers"] * d["kv_heads"] * d["head_dim"] * seq_len * batch_size * bytes_per_value
    return n


def _layer_activation_bytes(d: Mapping[str, Any], tokens: int, nbytes: int) -> int:
    """Transient activations of one decoder layer over ``tokens`` tokens, the MLP being the
    largest: gate, up and their product (``3 d_ff``) plus the residual stream and its normed copy
    (``2 hidden``) per token, ``nbytes`` each."""
    n: int = tokens * (3 * d["ffn"] + 2 * d["hidden"]) * nbytes
    return n


def peak_memory_gb(
    config: Any,
    shape: Mapping[str, Any] | None = None,
    *,
    seq_len: int = 4096,
    batch_size: int = 1,
    bytes_per_param: int = 2,
    overhead_gib: float = 0.0,
) -> float:
    """Estimated peak inference memory in GiB (2**30 bytes; the paper's "GB").

    Model: the prefill of ``batch_size`` x ``seq_len`` tokens in bf16 with a KV cache and only the
    last position's logits (generation-style, ``logits_to_keep=1``):

    * weights: ``params * bytes_per_param``;
    * KV cache: ``kv_cache_bytes`` for all layers;
    * transient activations of one decoder layer, the MLP being the largest: gate, up and their
      product (``3 B S d_ff``) plus the residual stream and its normed copy (``2 B S hidden``),
      all in bf16;
    * last-token logits in fp32 (``4 B vocab`` bytes);
    * ``overhead_gib``: a constant (allocator, CUDA context), 0 by default.

    With the defaults (S = 4096, the paper's evaluation length; B = 1) this gives, against
    Table 4: Qwen2.5-7B 14.89 / 11.14 GiB vs 15.0 / 11.5 (-0.7 %, -3.1 %); Llama-3-70B
    133.45 / 95.82 vs 132.5 / 95.7 (+0.7 %, +0.1 %). The unit must be GiB: in 1e9-byte GB
    the bf16 weights alone (141.1 GB) exceed the paper's 132.5 for Llama-3-70B. No monotone
    formula fits all four exactly: the paper's figures imply a non-weight overhead of
    0.82 / 0.88 GiB (Qwen dense / 30 %) and 1.08 / 1.41 GiB (Llama), larger after pruning,
    whereas every activation and KV term shrinks with pruning.
    """
    d = arch_dims(config_dict(config), shape)
    weights = count_params(config, shape) * bytes_per_param
    kv = kv_cache_bytes(config, shape, seq_len=seq_len, batch_size=batch_size, bytes_per_value=2)
    act = _layer_activation_bytes(d, batch_size * seq_len, 2)
    logits = batch_size * d["vocab"] * 4
    gib: float = (weights + kv + act + logits) / GIB + overhead_gib
    return gib


def cost_table(
    archs: Mapping[str, Any], ratio: float, group_rounding: str = DEFAULT_ROUNDING, **memory_kwargs: Any
) -> list[dict[str, Any]]:
    """Table 4 rows for each ``name -> config`` at pruning ``ratio``.

    Keys: ``model``, ``params_dense_B``, ``params_pruned_B`` (1e9 parameters), ``mem_dense_GB``,
    ``mem_pruned_GB`` (GiB, ``peak_memory_gb`` with ``memory_kwargs``), ``gflops_dense``,
    ``gflops_pruned``, plus ``ratio`` and the pruned ``kv_heads`` / ``ffn``. Unrounded floats.
    """
    rows = []
    for name, cfg in archs.items():
        shape = pruned_shape(cfg, ratio, group_rounding)
        rows.append(
            {
                "model": name,
                "ratio": ratio,
                "params_dense_B": count_params(cfg) / 1e9,
                "params_pruned_B": count_params(cfg, shape) / 1e9,
                "mem_dense_GB": peak_memory_gb(cfg, **memory_kwargs),
                "mem_pruned_GB": peak_memory_gb(cfg, shape, **memory_kwargs),
                "gflops_dense": flops_per_token(cfg),
                "gflops_pruned": flops_per_token(cfg, shape),
                "kv_heads_pruned": shape["num_key_value_heads"],
                "ffn_pruned": shape["intermediate_size"],
            }
        )
    return rows
