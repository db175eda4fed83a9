"""The pruning state of the iterative method: kept units and accumulated biases (eq. 3, 13).

Steps prune a layer to kept KV groups and MLP channels (ORIGINAL indices in
:class:`PruneState`) and add the step's bias b = W[:, P] mean[P]; the float64 biases of all
steps add up and are installed rounded exactly as a block file stores them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from coec.compensate.methods.bias import flap_bias
from coec.model.arch import MODULES, AttnShape, adapter_for, attention_shape, o_proj_columns
from coec.model.load import decoder_layers
from coec.model.prune import install_weights_, prune_model_, set_output_weights_

if TYPE_CHECKING:
    from transformers import PreTrainedModel

#: module (o_proj / down_proj) -> a tensor or None
PerModule = dict[str, torch.Tensor | None]


def output_module(layer: nn.Module, name: str) -> nn.Linear:
    """o_proj or down_proj of a decoder layer, where its family's adapter keeps it."""
    return adapter_for(layer).output_module(layer, name)


def unit_params(geom: AttnShape, d_model: int) -> tuple[int, int]:
    """Parameters of one KV group (its q/k/v rows and o_proj columns) and of one MLP channel
    (gate/up rows, down column): (2 hd (groups + 1) d, 3 d)."""
    return 2 * geom.head_dim * (geom.groups + 1) * d_model, 3 * d_model


@dataclass
class PruneState:
    """Kept units (ORIGINAL indices) and accumulated float64 bias of every layer."""

    geom: AttnShape
    d_ff: int
    kv_groups: list[list[int]]
    channels: list[list[int]]
    bias: list[PerModule] = field(default_factory=list)  # module -> float64 (d_out,) or None
    base_bias: list[PerModule] = field(default_factory=list)  # module -> original bias or None

    @classmethod
    def fresh(cls, model: PreTrainedModel) -> PruneState:
        adapter = adapter_for(model.config)
        geom = attention_shape(model.config)
        layers = decoder_layers(model)
        d_ff = adapter.ffn_width(layers[0])
        base: list[PerModule] = [
            {
                m: (None if output_module(layer, m).bias is None else output_module(layer, m).bias.detach().clone())
                for m in MODULES
            }
            for layer in layers
        ]
        return cls(
            geom,
            d_ff,
            [list(range(geom.n_kv)) for _ in layers],
            [list(range(d_ff)) for _ in layers],
            [dict.fromkeys(MODULES) for _ in layers],
            base,
        )

    def ratio_done(self) -> float:
        """Fraction of prunable parameters (KV groups + channels) removed so far."""
        wg, wc = unit_params(self.geom, 1)
        total = len(self.kv_groups) * (self.geom.n_kv * wg + self.d_ff * wc)
        kept = sum(len(g) * wg + len(c) * wc for g, c in zip(self.kv_groups, self.channels, strict=True))
        return 1.0 - kept / total


def current_shape(layer: nn.Module, geom0: AttnShape) -> AttnShape:
    """The attention geometry of a (partially pruned) layer: same head_dim and groups."""
    n_kv = adapter_for(layer).kv_width(layer) // geom0.head_dim
    return AttnShape(n_kv * geom0.groups, n_kv, geom0.head_dim)


def install_bias_(layer: nn.Module, module: str, base: torch.Tensor | None, total: torch.Tensor) -> None:
    """Give ``module`` the bias base + total, rounded exactly as a block file stores and
    ``model.cell.build_model`` installs it (weight dtype, then float32, then added to base)."""
    lin = output_module(layer, module)
    # torch stub gap: Linear.bias is typed Parameter, None (no bias) is valid at runtime
    lin.bias = None if base is None else torch.nn.Parameter(base.clone(), requires_grad=False)  # type: ignore[assignment]
    file_bias = total.to(lin.weight.dtype).to(lin.weight.device)
    set_output_weights_(layer, module, lin.weight.data, file_bias.to(torch.float32))


def apply_layer_step_(
    layer: nn.Module,
    state: PruneState,
    i: int,
    groups_local: list[int],
    channels_local: list[int],
    means: dict[str, torch.Tensor],
) -> None:
    """Prune layer ``i`` to the kept local groups/channels and add this step's bias
    b = W[:, P] mean[P] (eq. 3, W the current weight, mean from this step's statistics)."""
    geom = current_shape(layer, state.geom)
    keeps = {"o_proj": o_proj_columns(groups_local, geom), "down_proj": torch.tensor(channels_local, dtype=torch.long)}
    for m in MODULES:  # float64 where the weight lives, accumulated on the CPU
        W = output_module(layer, m).weight.detach().double()
        _, b = flap_bias(W, means[m].to(W.device, torch.float64), keeps[m].to(W.device))
        b = b.cpu()
        acc = state.bias[i][m]
        state.bias[i][m] = b if acc is None else acc + b
    adapter_for(layer).prune_layer_(layer, geom, groups_local, channels_local)
    state.kv_groups[i] = [state.kv_groups[i][g] for g in groups_local]
    state.channels[i] = [state.channels[i][c] for c in channels_local]
    for m in MODULES:
        total = state.bias[i][m]
        assert total is not None  # set above
        install_bias_(layer, m, state.base_bias[i][m], total)


def apply_keep_(model: PreTrainedModel, keep: dict[str, Any], tensors: dict[str, torch.Tensor] | None = None) -> None:
    """Prune a dense model by a keep.json dict and install a block file's weights/biases
    (per-layer widths may differ, as with AL-AM: then the config is left alone)."""
    prune_model_(model, keep)
    install_weights_(model, tensors or {})


def restore_state(
    model: PreTrainedModel, keep: dict[str, Any], block: dict[str, torch.Tensor], biases: dict[str, torch.Tensor]
) -> PruneState:
    """Apply a previous step's keep.json dict and block tensors to the dense ``model`` and return
    its state with the exact float64 ``biases`` (``layer{i}.{module}.bias``, state_tensors)."""
    state = PruneState.fresh(model)
    apply_keep_(model, keep, block)
    for i, k in enumerate(keep["layers"]):
        state.kv_groups[i], state.channels[i] = list(k["kv_groups"]), list(k["channels"])
        for m in MODULES:
            state.bias[i][m] = biases.get(f"layer{i}.{m}.bias")
    return state


def keep_dict(state: PruneState, meta: dict[str, Any]) -> dict[str, Any]:
    """keep.json in the select stage's format (ORIGINAL indices) plus the method's fields."""
    return {
        "selection": "iflap",
        **meta,
        "n_kv": state.geom.n_kv,
        "n_heads": state.geom.n_heads,
        "head_dim": state.geom.head_dim,
        "d_ff": state.d_ff,
        "layers": [{"kv_groups": g, "channels": c} for g, c in zip(state.kv_groups, state.channels, strict=True)],
    }


def block_tensors(model: nn.Module, state: PruneState) -> dict[str, torch.Tensor]:
    """``layer{i}.{module}.weight`` (the kept original columns) and ``.bias`` (accumulated,
    in the weight dtype): the compensate stage's block format, as ``prune.install_weights_``
    reads it."""
    out = {}
    for i, layer in enumerate(decoder_layers(model)):
        for m in MODULES:
            w = output_module(layer, m).weight.data
            out[f"layer{i}.{m}.weight"] = w.detach().cpu().contiguous()
            b = state.bias[i][m]
            if b is not None:
                out[f"layer{i}.{m}.bias"] = b.to(w.dtype).cpu().contiguous()
    return out


def state_tensors(state: PruneState) -> dict[str, torch.Tensor]:
    """The float64 accumulated biases ``layer{i}.{module}.bias`` (a later step continues exactly)."""
    return {
        f"layer{i}.{m}.bias": t.cpu().contiguous()
        for i, b in enumerate(state.bias)
        for m in MODULES
        if (t := b[m]) is not None
    }
