"""A causal LM whose weights stay on disk: a ``meta`` skeleton, materialised a part at a time.

:class:`StreamedModel` builds the model's skeleton with ``AutoModelForCausalLM.from_config``
under ``torch.device("meta")`` (no memory, the family's own modules) and materialises, on the
compute device and only while a ``with`` block holds it, a copy of

* the token embedding (:meth:`StreamedModel.embedding`),
* the final norm and the LM head (:meth:`StreamedModel.head`: a function hidden -> logits,
  with the family's logit divisor),
* one decoder layer (:meth:`StreamedModel.layer`), pruned by a cell's keep set and given its
  compensated o_proj / down_proj weights (:class:`CellWeights`, read per layer) as it streams,

from the checkpoint's tensors (:class:`~coec.model.checkpoint.Checkpoint`, memory-mapped).
Tensor names come from the skeleton's own module names (the family's layout, ``coec.model.arch``);
tied embeddings read the embedding's tensor for the head. The skeleton itself never holds a
weight, so the pruned model is never assembled whole. The rotary embedding (a buffer computed
from the config) is rebuilt on the device as ``from_pretrained`` builds it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn
from transformers import AutoModelForCausalLM

from coec.io import artifacts
from coec.io.errors import ArtifactError
from coec.io.safetensors_file import safetensors_header
from coec.model.arch import COMP_KEY, MODULES, ModelError, adapter_for
from coec.model.checkpoint import Checkpoint
from coec.model.load import load_config, resolve_device, torch_dtype
from coec.model.prune import set_output_weights_


class CellWeights:
    """A pruned cell: its keep set (``keep.json``) and compensated weights (block files), read
    one layer at a time. Every block file's header is checked up front (complete file, format
    version, ``layer<i>.<module>.weight|bias`` names); a layer's tensors are read (and checked
    finite) when the layer streams. ``keep``: the keep set already read (and checked against
    ``n_layers``), which is then not read again."""

    def __init__(
        self,
        keep_path: str | Path | None,
        comp_files: list[str] | None,
        n_layers: int,
        keep: dict[str, Any] | None = None,
    ) -> None:
        if keep is None and keep_path:
            keep = artifacts.read_keep(keep_path, n_layers)
        self.keep = keep
        self.files: dict[int, list[tuple[Path, list[str]]]] = {}
        for path in map(Path, comp_files or []):
            meta = artifacts.tensors_metadata(path)
            if meta.get(artifacts.FORMAT_KEY) != "comp-block":
                artifacts.read_tensors(path, [], fmt="comp-block")  # raises the format error naming it
            by_layer: dict[int, list[str]] = {}
            for key in safetensors_header(path):
                if key == "__metadata__":
                    continue
                m = COMP_KEY.match(key)
                if not m:
                    raise ArtifactError(path, f"unexpected tensor {key} (expected layer<i>.<module>.weight|bias)")
                by_layer.setdefault(int(m.group(1)), []).append(key)
            for i, keys in by_layer.items():
                self.files.setdefault(i, []).append((path, keys))

    def layer_keep(self, i: int) -> dict[str, Any] | None:
        """``{"kv_groups", "channels"}`` of layer i (None: a dense model)."""
        return None if self.keep is None else self.keep["layers"][i]

    def layer_tensors(self, i: int) -> dict[str, torch.Tensor]:
        """``{module}.weight|bias`` of layer i's compensated outputs (empty: none)."""
        out = {}
        for path, keys in self.files.get(i, []):
            for key, t in artifacts.read_tensors(path, keys, fmt="comp-block").items():
                out[key.split(".", 1)[1]] = t
        return out


def meta_skeleton(config: Any, dtype: torch.dtype, trust_remote_code: bool = False) -> nn.Module:
    """The causal LM of ``config`` on the meta device (SDPA attention, eval mode, ties made)."""
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(  # type: ignore[no-untyped-call]  # transformers stub gap
            config, dtype=dtype, attn_implementation="sdpa", trust_remote_code=trust_remote_code
        )
    skeleton: nn.Module = model.eval()
    return skeleton


def _set_submodule(root: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, attr = name.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, attr, module)


class StreamedModel:
    """A model read from its checkpoint one part at a time (module docstring).

    ``dtype``: the compute dtype every floating tensor is cast to (as ``from_pretrained(dtype=)``
    does); ``device``: where materialised parts live; ``cell``: a pruned cell's weights."""

    def __init__(
        self,
        model_dir: str | Path,
        dtype: str | torch.dtype = "float32",
        device: str | torch.device | None = "cpu",
        cell: CellWeights | None = None,
        revision: str | None = None,
        trust_remote_code: bool = False,
    ) -> None:
        self.dir = Path(model_dir)
        self.ckpt = Checkpoint(self.dir)
        self.config = load_config(self.dir, revision, trust_remote_code)
        self.adapter = adapter_for(self.config)
        self.geom = self.adapter.attention_shape(self.config)
        self.dtype = torch_dtype(dtype)
        self.device = resolve_device(device)
        self.model = meta_skeleton(self.config, self.dtype, trust_remote_code)
        self.config = self.model.config
        self.cell = cell
        self.layers = self.adapter.decoder_layers(self.model)
        self._names = {id(m): n for n, m in self.model.named_modules()}
        self._aliases = self._tied_aliases()
        self.layer_params: dict[int, int] = {}
        rotary = self.adapter.rotary(self.model)
        with torch.device("cpu"):
            fresh = type(rotary)(config=self.config)
        _set_submodule(self.model, self._names[id(rotary)], fresh.to(self.device))

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    def _tied_aliases(self) -> dict[str, list[str]]:
        """Parameter name -> every name of the same (tied) parameter."""
        groups: dict[int, list[str]] = {}
        for name, p in self.model.named_parameters(remove_duplicate=False):
            groups.setdefault(id(p), []).append(name)
        return {n: names for names in groups.values() for n in names}

    def _stored_name(self, name: str) -> str:
        """The checkpoint's name for a parameter (a tied one may be stored under its twin)."""
        for alias in [name, *self._aliases.get(name, [])]:
            if alias in self.ckpt:
                return alias
        raise ArtifactError(self.dir, f"tensor {name} is not in the checkpoint")

    def materialise(self, module: nn.Module) -> nn.Module:
        """A copy of a skeleton module with its tensors read from the checkpoint, cast to the
        compute dtype (floating tensors) and placed on the device."""
        prefix = self._names[id(module)]
        new = copy.deepcopy(module)
        state = new.state_dict()
        stored = {k: self._stored_name(f"{prefix}.{k}" if prefix else k) for k in state}
        tensors = self.ckpt.read(sorted(set(stored.values())))
        for k, ref in state.items():
            t = tensors[stored[k]]
            if tuple(t.shape) != tuple(ref.shape):
                raise ArtifactError(
                    self.dir, f"tensor {stored[k]} has shape {tuple(t.shape)}, the config implies {tuple(ref.shape)}"
                )
            state[k] = t.to(device=self.device, dtype=ref.dtype if ref.is_floating_point() else None)
        new.load_state_dict(state, strict=True, assign=True)
        new.requires_grad_(False)  # evaluation only: no autograd graph can hold a released part
        left = [n for n, t in [*new.named_parameters(), *new.named_buffers()] if t.is_meta]
        if left:
            raise ModelError(f"{prefix}: tensors not in the checkpoint's state: {left[:3]}")
        return new

    @contextmanager
    def embedding(self) -> Iterator[Callable[[torch.Tensor], torch.Tensor]]:
        """A function token ids (b, T) -> embeddings (b, T, d) on the device, with the family's
        embedding scale, while the block lasts."""
        held = [self.materialise(self.adapter.embedding(self.model))]
        scale = self.adapter.embed_scale(self.config)

        def embed(ids: torch.Tensor) -> torch.Tensor:
            h = held[0](ids.to(self.device))
            out: torch.Tensor = h if scale is None else h * scale
            return out

        try:
            yield embed
        finally:
            held.clear()  # the function may outlive the block; the weights do not

    @contextmanager
    def head(self) -> Iterator[Callable[[torch.Tensor], torch.Tensor]]:
        """A function last hidden states (b, T, d) -> logits (b, T, V): final norm, LM head and
        the family's logit divisor, as the model's forward computes them."""
        hf_model: Any = self.model  # a transformers model: get_output_embeddings
        held = [
            self.materialise(cast(nn.Module, self.adapter.backbone(self.model).norm)),
            self.materialise(hf_model.get_output_embeddings()),
        ]
        div = self.adapter.logit_divisor(self.config)

        def logits(h: torch.Tensor) -> torch.Tensor:
            norm, lm_head = held
            out = lm_head(norm(h.to(self.device)))
            logits: torch.Tensor = out if div is None else out / div
            return logits

        try:
            yield logits
        finally:
            held.clear()

    def build_layer(self, i: int) -> nn.Module:
        """Decoder layer i on the device: read, pruned by the cell's keep set and given its
        compensated weights (what ``prune_model_`` + ``install_weights_`` do to the whole)."""
        layer = self.materialise(self.layers[i])
        keep = self.cell.layer_keep(i) if self.cell else None
        if keep is not None:
            read = {id(p) for p in layer.parameters()}
            self.adapter.prune_layer_(layer, self.geom, keep["kv_groups"], keep["channels"])
            for p in layer.parameters():  # the norms left: copies, so the layer's mapping is freed
                if id(p) in read:
                    p.data = p.data.clone()
        comp = self.cell.layer_tensors(i) if self.cell else {}
        for module in MODULES:
            if f"{module}.weight" in comp:
                set_output_weights_(layer, module, comp[f"{module}.weight"], comp.get(f"{module}.bias"))
        self.layer_params[i] = sum(p.numel() for p in layer.parameters())
        return layer

    @contextmanager
    def layer(self, i: int) -> Iterator[nn.Module]:
        """:meth:`build_layer` for the duration of the block; released after."""
        layer = self.build_layer(i)
        try:
            yield layer
        finally:
            del layer

    def param_count(self) -> int:
        """Parameters of the (pruned, compensated) model, tied ones once: the skeleton's outside
        the decoder layers plus every built layer's. Raises unless every layer was built."""
        if len(self.layer_params) != self.n_layers:
            raise RuntimeError(f"param_count needs every layer built ({len(self.layer_params)} of {self.n_layers})")
        in_layers = {id(p) for p in self.layers.parameters()}
        outside = sum(p.numel() for p in self.model.parameters() if id(p) not in in_layers)
        return outside + sum(self.layer_params.values())
