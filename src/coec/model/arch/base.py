"""The adapter contract: everything the pruning code needs to know about one decoder family.

An :class:`Adapter` describes where a family keeps its decoder blocks, which modules are the
compensated outputs (the inputs of ``o_proj`` and ``down_proj``), the grouped-query attention
shape, the structured-pruning surgery (which sibling tensors are sliced with a KV group or an
MLP channel), what its stock transformers class can hold on export, and its parameter count.
The defaults below are the common Hugging Face decoder layout; a family file overrides only what
differs. Method code reaches a family only through :func:`coec.model.arch.adapter_for`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast

if TYPE_CHECKING:
    import torch
    from torch import nn
    from transformers import PretrainedConfig, PreTrainedModel

# The compensated output modules, by role: the attention output projection (its input columns
# are the query heads' values) and the MLP output projection (its input columns are channels).
MODULES = ("o_proj", "down_proj")

# A compensated tensor's name in a compensation block file, ``layer{i}.{module}.{weight|bias}``
# (group 1: the layer index, group 2: the module, group 3: weight or bias).
COMP_KEY = re.compile(rf"^layer(\d+)\.({'|'.join(MODULES)})\.(weight|bias)$")


class ModelError(ValueError):
    """A model that the pruning code cannot handle, with a message naming why."""


class NeedsView(Protocol):
    """What the export rules read of the structure a pruned model needs (``export_class.ExportNeeds``)."""

    @property
    def qkv_bias(self) -> bool: ...
    @property
    def o_bias(self) -> bool: ...
    @property
    def mlp_bias(self) -> bool: ...
    @property
    def divides(self) -> bool: ...  # hidden_size % num_attention_heads == 0


@dataclass(frozen=True)
class AttnShape:
    """Grouped-query attention shape: query heads, KV heads, head dim; groups = heads per KV head."""

    n_heads: int
    n_kv: int
    head_dim: int

    @property
    def groups(self) -> int:
        return self.n_heads // self.n_kv


def attention_shape(config: PretrainedConfig) -> AttnShape:
    """Heads, KV heads and head_dim from an HF config (head_dim explicit or hidden/heads)."""
    n_heads = config.num_attention_heads
    n_kv = getattr(config, "num_key_value_heads", None) or n_heads
    if n_heads % n_kv:
        raise ModelError(f"num_attention_heads={n_heads} is not divisible by num_key_value_heads={n_kv}")
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // n_heads
    return AttnShape(n_heads, n_kv, head_dim)


def head_indices(kv_groups: list[int], geom: AttnShape) -> list[int]:
    """Query heads of the kept KV groups (head h belongs to KV head h // groups)."""
    return [g * geom.groups + j for g in kv_groups for j in range(geom.groups)]


def o_proj_columns(kv_groups: list[int], geom: AttnShape) -> torch.Tensor:
    """Input columns of o_proj kept with ``kv_groups`` (ascending), LongTensor."""
    import torch  # deferred: keeps the job boundary torch-free

    heads = torch.tensor(head_indices(kv_groups, geom), dtype=torch.long)
    return (heads[:, None] * geom.head_dim + torch.arange(geom.head_dim)).reshape(-1)


def kv_rows(kv_groups: list[int], geom: AttnShape) -> torch.Tensor:
    """Output rows of k_proj / v_proj kept with ``kv_groups`` (ascending), LongTensor."""
    import torch  # deferred: keeps the job boundary torch-free

    g = torch.tensor(kv_groups, dtype=torch.long)
    return (g[:, None] * geom.head_dim + torch.arange(geom.head_dim)).reshape(-1)


def expand_kv_rows(v_weight: torch.Tensor, n_rep: int, head_dim: int) -> torch.Tensor:
    """Repeat each KV head's rows of a v_proj weight for its query heads (Sec. 4.5; docs/design.md).

    ``v_weight`` (n_kv*head_dim x d_model) -> (n_kv*n_rep*head_dim x d_model); query head h
    reads KV head h // n_rep, matching the o_proj input layout, so the result has k rows.
    """
    n_rows, d = v_weight.shape
    if n_rows % head_dim:
        raise ValueError(f"v_proj rows {n_rows} not a multiple of head_dim {head_dim}")
    v = v_weight.reshape(n_rows // head_dim, head_dim, d)
    return v.repeat_interleave(n_rep, dim=0).reshape(-1, d)


def pruned_value_proj(v_weight: torch.Tensor, kv_groups: list[int], geom: AttnShape) -> torch.Tensor:
    """The pruned v_proj in the query-head layout: each kept KV head's rows repeated for its
    query heads, (k, d_model) with k = kept query heads x head_dim (the o_proj input order)."""
    rows = v_weight.index_select(0, kv_rows(kv_groups, geom))
    return expand_kv_rows(rows, geom.groups, geom.head_dim)


def weight_of(module: nn.Module, name: str = "weight") -> torch.Tensor:
    """A module's ``weight`` (or ``name``) tensor; TypeError when it holds none."""
    import torch  # deferred: keeps the job boundary torch-free

    t = getattr(module, name, None)
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{type(module).__name__} has no {name} tensor")
    return t


def sliced_linear(lin: nn.Linear, rows: torch.Tensor | None = None, cols: torch.Tensor | None = None) -> nn.Linear:
    """A new Linear holding ``lin.weight[rows][:, cols]`` (and its bias rows)."""
    from torch import nn  # deferred: keeps the job boundary torch-free

    w = lin.weight.data
    b = lin.bias.data if lin.bias is not None else None
    if rows is not None:
        rows = rows.to(w.device)
        w = w.index_select(0, rows)
        b = b.index_select(0, rows) if b is not None else None
    if cols is not None:
        w = w.index_select(1, cols.to(w.device))
    new = nn.Linear(w.shape[1], w.shape[0], bias=b is not None, device=w.device, dtype=w.dtype)
    new.weight.data.copy_(w)
    if b is not None:
        new.bias.data.copy_(b)
    return new


class StockClass:
    """What a stock transformers class can hold when a pruned model is exported into it.

    Bias conventions of the class's modules: ``"never"`` (no slot), ``"flag"`` (a config flag,
    ``attention_bias`` / ``mlp_bias``, switches them on), ``"always"`` (always present)."""

    model_type: str = ""
    qk_norm: bool = False  # per-head q/k RMSNorm over head_dim (shared by all heads)
    qkv_bias: str = "never"
    o_bias: str = "never"
    mlp_bias: str = "never"
    any_heads: bool = True  # the config accepts hidden_size % num_attention_heads != 0
    note: str = ""  # one line: how the class holds a pruned model (export reason)

    def export_kwargs(self, needs: NeedsView, src_config: PretrainedConfig) -> dict[str, Any]:
        """Extra ``AutoConfig.for_model`` arguments when this class is a fallback target."""
        return {}

    def holds(self) -> dict[str, bool]:
        """Which slots exist (the export's capability table)."""
        return dict(
            qk_norm=self.qk_norm,
            qkv_bias=self.qkv_bias != "never",
            o_bias=self.o_bias != "never",
            mlp_bias=self.mlp_bias != "never",
            any_heads=self.any_heads,
        )


class Adapter(StockClass):
    """One decoder family (or several with the same layout: ``families``)."""

    families: tuple[str, ...] = ()
    layers_path: tuple[str, ...] = ("model", "layers")
    attn_attr, mlp_attr = "self_attn", "mlp"
    q, k, v, o = "q_proj", "k_proj", "v_proj", "o_proj"
    gate, up, down = "gate_proj", "up_proj", "down_proj"
    always_sliding = False  # every layer masks with config.sliding_window
    portable = True  # export may fall back to another stock class with this layout
    attn_norm_attr, ffn_norm_attr = "input_layernorm", "post_attention_layernorm"
    q_norm_attr, k_norm_attr = "q_norm", "k_norm"  # per-head q/k norms (families with qk_norm)
    # llama.cpp architectures a GGUF export tries, in order (coec.model.arch.gguf): the first that
    # holds the pruned model's tensors, widths and config is written
    gguf_archs: tuple[str, ...] = ("llama", "deci")

    # ------------------------------------------------------------------ layer access
    # (``nn.Module.__getattr__`` is typed ``Tensor | Module``: a submodule is cast to its class)
    def decoder_layers(self, model: nn.Module) -> nn.ModuleList:
        obj = model
        for attr in self.layers_path:
            obj = getattr(obj, attr)
        return cast("nn.ModuleList", obj)

    def backbone(self, model: nn.Module) -> nn.Module:
        """The module holding embeddings, rotary embedding and layers (``model.model``)."""
        return cast("nn.Module", model.model)

    def embedding(self, model: nn.Module) -> nn.Module:
        return cast("nn.Module", self.backbone(model).embed_tokens)

    def embed_scale(self, config: PretrainedConfig) -> float | None:
        """A factor the model's forward applies to the token embeddings (None: none)."""
        return None

    def logit_divisor(self, config: PretrainedConfig) -> float | None:
        """A divisor the model's forward applies to the LM head's logits (None: none)."""
        return None

    def rotary(self, model: nn.Module) -> nn.Module:
        return cast("nn.Module", self.backbone(model).rotary_emb)

    def attention(self, layer: nn.Module) -> nn.Module:
        return cast("nn.Module", getattr(layer, self.attn_attr))

    def mlp(self, layer: nn.Module) -> nn.Module:
        return cast("nn.Module", getattr(layer, self.mlp_attr))

    def output_parent(self, layer: nn.Module, role: str) -> tuple[nn.Module, str]:
        """(parent module, attribute) of a compensated output module by role."""
        if role == "o_proj":
            return self.attention(layer), self.o
        if role == "down_proj":
            return self.mlp(layer), self.down
        raise ValueError(f"unknown output module {role!r}; expected one of {', '.join(MODULES)}")

    def output_module(self, layer: nn.Module, role: str) -> nn.Linear:
        """o_proj or down_proj of a layer: its forward pre-hook sees the input to compensate."""
        parent, attr = self.output_parent(layer, role)
        return cast("nn.Linear", getattr(parent, attr))

    def kv_width(self, layer: nn.Module) -> int:
        """Output width of the key projection (KV heads x head_dim) of a (pruned) layer."""
        k_proj = cast("nn.Linear", getattr(self.attention(layer), self.k))
        return k_proj.out_features

    def ffn_width(self, layer: nn.Module) -> int:
        return self.output_module(layer, "down_proj").in_features

    def layer_tensor_names(self, layer: int) -> dict[str, str]:
        """Checkpoint names of the weights pruning touches, by role (q_proj ... down_proj)."""
        p = ".".join((*self.layers_path, str(layer), ""))
        names = {
            r: f"{p}{self.attn_attr}.{a}.weight"
            for r, a in zip(("q_proj", "k_proj", "v_proj", "o_proj"), (self.q, self.k, self.v, self.o), strict=True)
        }
        names.update(
            {
                r: f"{p}{self.mlp_attr}.{a}.weight"
                for r, a in zip(("gate_proj", "up_proj", "down_proj"), (self.gate, self.up, self.down), strict=True)
            }
        )
        return names

    # ------------------------------------------------------------------ attention shape
    def attention_shape(self, config: PretrainedConfig) -> AttnShape:
        return attention_shape(config)

    def sliding(self, config: PretrainedConfig) -> bool:
        """Whether some layer masks with a sliding window shorter than the context."""
        window = getattr(config, "sliding_window", None)  # a window >= the context never acts
        return (
            bool(window)
            and window < config.max_position_embeddings
            and (self.always_sliding or "sliding_attention" in (getattr(config, "layer_types", None) or []))
        )

    # ------------------------------------------------------------------ surgery
    def prune_layer_(self, layer: nn.Module, geom: AttnShape, kv_groups: list[int], channels: list[int]) -> None:
        """Remove the pruned KV groups (with their query heads) and MLP channels in place:
        q rows and o_proj columns per query head, k/v rows per KV group (biases follow their
        rows; per-head q/k norms are shared by all heads and stay), gate/up rows and down_proj
        columns per channel."""
        if not kv_groups:
            raise ValueError("a layer must keep at least one KV group")
        if len(set(kv_groups)) != len(kv_groups) or max(kv_groups) >= geom.n_kv or min(kv_groups) < 0:
            raise ValueError(f"invalid kv_groups {kv_groups} for {geom.n_kv} KV heads")
        import torch  # deferred: keeps the job boundary torch-free

        attn, mlp = self.attention(layer), self.mlp(layer)
        q_rows = o_proj_columns(kv_groups, geom)
        kv = kv_rows(kv_groups, geom)
        setattr(attn, self.q, sliced_linear(getattr(attn, self.q), rows=q_rows))
        setattr(attn, self.k, sliced_linear(getattr(attn, self.k), rows=kv))
        setattr(attn, self.v, sliced_linear(getattr(attn, self.v), rows=kv))
        setattr(attn, self.o, sliced_linear(getattr(attn, self.o), cols=q_rows))
        ch = torch.tensor(channels, dtype=torch.long)
        d_ff = getattr(mlp, self.down).in_features
        if ch.numel() == 0 or ch.max() >= d_ff or ch.min() < 0:
            raise ValueError(f"invalid MLP channel keep set for d_ff={d_ff}")
        setattr(mlp, self.gate, sliced_linear(getattr(mlp, self.gate), rows=ch))
        setattr(mlp, self.up, sliced_linear(getattr(mlp, self.up), rows=ch))
        setattr(mlp, self.down, sliced_linear(getattr(mlp, self.down), cols=ch))

    # ------------------------------------------------------------------ export
    def own_export_flags(self, cfg: PretrainedConfig, needs: NeedsView) -> None:
        """Set the bias flags of a copy of the source config (export into the own class)."""
        any_attn_bias = needs.qkv_bias or needs.o_bias
        if hasattr(cfg, "attention_bias") and self.o_bias == "flag":
            cfg.attention_bias = bool(getattr(cfg, "attention_bias", False) or any_attn_bias)
        if hasattr(cfg, "mlp_bias"):
            cfg.mlp_bias = bool(getattr(cfg, "mlp_bias", False) or needs.mlp_bias)

    # ------------------------------------------------------------------ GGUF export
    def gguf_layer_modules(self, layer: nn.Module) -> dict[str, nn.Module]:
        """A decoder layer's modules under their llama.cpp tensor names (``blk.<i>.<name>``;
        each module's ``weight`` and, where present, ``bias`` are written)."""
        attn, mlp = self.attention(layer), self.mlp(layer)
        mods = {
            "attn_norm": getattr(layer, self.attn_norm_attr),
            "attn_q": getattr(attn, self.q),
            "attn_k": getattr(attn, self.k),
            "attn_v": getattr(attn, self.v),
            "attn_output": getattr(attn, self.o),
        }
        if self.qk_norm:
            mods.update(attn_q_norm=getattr(attn, self.q_norm_attr), attn_k_norm=getattr(attn, self.k_norm_attr))
        mods.update(
            {
                "ffn_norm": getattr(layer, self.ffn_norm_attr),
                "ffn_gate": getattr(mlp, self.gate),
                "ffn_up": getattr(mlp, self.up),
                "ffn_down": getattr(mlp, self.down),
            }
        )
        return mods

    def gguf_model_modules(self, model: PreTrainedModel) -> dict[str, nn.Module]:
        """The token embedding, final norm and LM head under their llama.cpp names."""
        return {
            "token_embd": self.embedding(model),
            "output_norm": cast("nn.Module", self.backbone(model).norm),
            "output": model.get_output_embeddings(),  # type: ignore[no-untyped-call]  # unannotated upstream
        }

    def gguf_scalars(self, config: PretrainedConfig) -> dict[str, float]:
        """Scalars of the forward pass beyond the Llama layer, by GGUF key suffix
        (``<arch>.<key>``); an architecture must declare every key it is given."""
        return {}

    # ------------------------------------------------------------------ parameter count
    def layer_params(self, d: Mapping[str, Any]) -> tuple[int, int]:
        """Parameters of one decoder layer's attention and MLP from architecture numbers
        (``coec.report.cost.arch_dims``: hidden, head_dim, heads, kv_heads, ffn, attention_bias, mlp_bias)."""
        h, hd, nh, nkv, ff = d["hidden"], d["head_dim"], d["heads"], d["kv_heads"], d["ffn"]
        q, kv = nh * hd, nkv * hd
        attn = h * q + 2 * h * kv + q * h
        if self.qkv_bias == "always":
            attn += q + 2 * kv
        elif self.qkv_bias == "flag" and d["attention_bias"]:
            attn += q + 2 * kv
        if self.o_bias == "always" or (self.o_bias == "flag" and d["attention_bias"]):
            attn += h
        if self.qk_norm:
            attn += 2 * hd  # q_norm, k_norm over head_dim
        mlp = 3 * h * ff
        if self.mlp_bias == "always" or (self.mlp_bias == "flag" and d["mlp_bias"]):
            mlp += 2 * ff + h
        return attn, mlp
