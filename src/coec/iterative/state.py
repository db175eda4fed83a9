"""The pruning state of the iterative method: kept units and accumulated biases (eq. 3, 13).

Steps prune a layer to kept KV groups and MLP channels (ORIGINAL indices in
:class:`PruneState`) and add the step's bias b = W[:, P] mean[P]; the float64 biases of all
steps add up and are installed rounded exactly as a block file stores them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..arch import MODULES, AttnShape, adapter_for, attention_shape, o_proj_columns
from ..compensate.methods.bias import flap_bias
from ..models import decoder_layers
from ..prune import install_weights_, prune_layer_, prune_model_, set_output_weights_


def output_module(layer, name: str):
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
    bias: list[dict] = field(default_factory=list)  # module -> float64 (d_out,) or None
    base_bias: list[dict] = field(default_factory=list)  # module -> original bias or None

    @classmethod
    def fresh(cls, model) -> PruneState:
        adapter = adapter_for(model.config)
        geom = attention_shape(model.config)
        layers = decoder_layers(model)
        d_ff = adapter.ffn_width(layers[0])
        base = [
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
            [{m: None for m in MODULES} for _ in layers],
            base,
        )

    def ratio_done(self) -> float:
        """Fraction of prunable parameters (KV groups + channels) removed so far."""
        wg, wc = unit_params(self.geom, 1)
        total = len(self.kv_groups) * (self.geom.n_kv * wg + self.d_ff * wc)
        kept = sum(len(g) * wg + len(c) * wc for g, c in zip(self.kv_groups, self.channels))
        return 1.0 - kept / total


def current_shape(layer, geom0: AttnShape) -> AttnShape:
    """The attention geometry of a (partially pruned) layer: same head_dim and groups."""
    n_kv = adapter_for(layer).kv_width(layer) // geom0.head_dim
    return AttnShape(n_kv * geom0.groups, n_kv, geom0.head_dim)


def install_bias_(layer, module: str, base: torch.Tensor | None, total: torch.Tensor) -> None:
    """Give ``module`` the bias base + total, rounded exactly as a block file stores and
    ``pipeline.build_model`` installs it (weight dtype, then float32, then added to base)."""
    lin = output_module(layer, module)
    lin.bias = None if base is None else torch.nn.Parameter(base.clone(), requires_grad=False)
    file_bias = total.to(lin.weight.dtype).to(lin.weight.device)
    set_output_weights_(layer, module, lin.weight.data, file_bias.to(torch.float32))


def apply_layer_step_(
    layer, state: PruneState, i: int, groups_local: list[int], channels_local: list[int], means: dict
) -> None:
    """Prune layer ``i`` to the kept local groups/channels and add this step's bias
    b = W[:, P] mean[P] (eq. 3, W the current weight, mean from this step's statistics)."""
    geom = current_shape(layer, state.geom)
    keeps = {"o_proj": o_proj_columns(groups_local, geom), "down_proj": torch.tensor(channels_local, dtype=torch.long)}
    for m in MODULES:  # float64 where the weight lives, accumulated on the CPU
        W = output_module(layer, m).weight.detach().double()
        _, b = flap_bias(W, means[m].to(W.device, torch.float64), keeps[m].to(W.device))
        b = b.cpu()
        state.bias[i][m] = b if state.bias[i][m] is None else state.bias[i][m] + b
    prune_layer_(layer, geom, groups_local, channels_local)
    state.kv_groups[i] = [state.kv_groups[i][g] for g in groups_local]
    state.channels[i] = [state.channels[i][c] for c in channels_local]
    for m in MODULES:
        install_bias_(layer, m, state.base_bias[i][m], state.bias[i][m])


def apply_keep_(model, keep: dict, tensors: dict | None = None) -> None:
    """Prune a dense model by a keep.json dict and install a block file's weights/biases
    (per-layer widths may differ, as with AL-AM: then the config is left alone)."""
    prune_model_(model, keep)
    install_weights_(model, tensors or {})


def restore_state(model, keep: dict, block: dict, biases: dict) -> PruneState:
    """Apply a previous step's keep.json dict and block tensors to the dense ``model`` and return
    its state with the exact float64 ``biases`` (``layer{i}.{module}.bias``, state_tensors)."""
    state = PruneState.fresh(model)
    apply_keep_(model, keep, block)
    for i, k in enumerate(keep["layers"]):
        state.kv_groups[i], state.channels[i] = list(k["kv_groups"]), list(k["channels"])
        for m in MODULES:
            state.bias[i][m] = biases.get(f"layer{i}.{m}.bias")
    return state


def keep_dict(state: PruneState, meta: dict) -> dict:
    """keep.json in the select stage's format (ORIGINAL indices) plus the method's fields."""
    return {
        "selection": "iflap",
        **meta,
        "n_kv": state.geom.n_kv,
        "n_heads": state.geom.n_heads,
        "head_dim": state.geom.head_dim,
        "d_ff": state.d_ff,
        "layers": [{"kv_groups": g, "channels": c} for g, c in zip(state.kv_groups, state.channels)],
    }


def block_tensors(model, state: PruneState) -> dict[str, torch.Tensor]:
    """``layer{i}.{module}.weight`` (the kept original columns) and ``.bias`` (accumulated,
    in the weight dtype): the compensate stage's block format, as ``prune.install_weights_``
    reads it."""
    out = {}
    for i, layer in enumerate(decoder_layers(model)):
        for m in MODULES:
            w = output_module(layer, m).weight.data
            out[f"layer{i}.{m}.weight"] = w.detach().cpu().contiguous()
            if state.bias[i][m] is not None:
                out[f"layer{i}.{m}.bias"] = state.bias[i][m].to(w.dtype).cpu().contiguous()
    return out


def state_tensors(state: PruneState) -> dict[str, torch.Tensor]:
    """The float64 accumulated biases ``layer{i}.{module}.bias`` (a later step continues exactly)."""
    return {
        f"layer{i}.{m}.bias": b[m].cpu().contiguous()
        for i, b in enumerate(state.bias)
        for m in MODULES
        if b[m] is not None
    }
