"""Architecture adapters: one home per decoder family (docs/adding-a-model.md).

``adapter_for(config | model | decoder layer | model_type)`` returns the family's
:class:`Adapter`; unknown families raise one :class:`ModelError` listing the known ones. Method
code (calibrate, select, compensate, prune, cost, iterative) goes through the adapter and never
names a family.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from coec.model.arch.base import (
    COMP_KEY,
    MODULES,
    Adapter,
    AttnShape,
    ModelError,
    StockClass,
    attention_shape,
    expand_kv_rows,
    head_indices,
    kv_rows,
    o_proj_columns,
    pruned_value_proj,
    sliced_linear,
    weight_of,
)
from coec.model.arch.granite import GraniteAdapter
from coec.model.arch.llama import LlamaAdapter, MistralAdapter
from coec.model.arch.qwen2 import Qwen2Adapter
from coec.model.arch.qwen3 import Qwen3Adapter
from coec.model.arch.stock import HyV3Class, SeedOssClass
from coec.registry import Registry

if TYPE_CHECKING:
    from transformers import PretrainedConfig

__all__ = [
    "COMP_KEY",
    "MODULES",
    "Adapter",
    "AttnShape",
    "ModelError",
    "StockClass",
    "ADAPTERS",
    "STOCK",
    "EXPORT_FALLBACKS",
    "adapter_for",
    "attention_shape",
    "head_indices",
    "kv_rows",
    "expand_kv_rows",
    "pruned_value_proj",
    "o_proj_columns",
    "sliced_linear",
    "stock_class",
    "weight_of",
]

#: Every supported model family (a transformers ``model_type``) -> its adapter; an adapter may
#: serve several families. A plug-in registers its own: ``ADAPTERS.register(MyAdapter(), name=...)``
#: (docs/adding-a-model.md).
# (an adapter has no ``name``: each is registered under each of its families)
ADAPTERS: Registry[Adapter] = Registry("model family")  # type: ignore[type-var]
for _a in (LlamaAdapter(), Qwen2Adapter(), Qwen3Adapter(), MistralAdapter(), GraniteAdapter()):
    for _f in _a.families:
        ADAPTERS.register(_a, name=_f)

# Every stock class an export may write: the families' own classes and export-only targets.
STOCK: dict[str, StockClass] = {a.model_type: a for a in ADAPTERS.values()}
STOCK.update({c.model_type: c for c in (SeedOssClass(), HyV3Class())})

# Stock classes tried, in order, when a portable family's own class cannot hold a pruned model,
# keyed by whether the model has per-head q/k norms.
EXPORT_FALLBACKS: dict[bool, tuple[str, ...]] = {False: ("llama", "mistral", "seed_oss"), True: ("qwen3", "hy_v3")}


def _model_type(obj: object) -> str | None:
    if obj is None or isinstance(obj, str):
        return obj
    if isinstance(obj, dict):
        return obj.get("model_type")
    cfg: PretrainedConfig | None = getattr(obj, "config", None)
    if cfg is None and hasattr(obj, "modules"):  # a decoder layer: its attention holds the config
        cfg = next((m.config for m in obj.modules() if getattr(m, "config", None) is not None), None)
    if cfg is not None and hasattr(cfg, "model_type"):
        return cfg.model_type
    return getattr(obj, "model_type", None)


def adapter_for(obj: object) -> Adapter:
    """The adapter of a model_type string, config (object or dict), model or decoder layer."""
    family = _model_type(obj)
    if family is None or family not in ADAPTERS:
        raise ModelError(
            f"model family (model_type) {family!r} is not supported by the pruning "
            f"surgery; supported: {', '.join(ADAPTERS)}"
        )
    return ADAPTERS[family]


def stock_class(model_type: str) -> StockClass:
    """The export capabilities of a stock transformers class."""
    try:
        return STOCK[model_type]
    except KeyError:
        raise ModelError(f"no export rules for the stock class {model_type!r}; known: {', '.join(STOCK)}") from None
