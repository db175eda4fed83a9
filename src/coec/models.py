"""Model loading and architecture accessors for Llama / Qwen2 / Qwen3 / Mistral.

All four families share the HF attribute names ``model.layers[i].self_attn.{q,k,v,o}_proj`` and
``model.layers[i].mlp.{gate,up,down}_proj``; nothing here hard-codes a head size or a path.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

log = logging.getLogger(__name__)

FAMILIES = ("llama", "qwen2", "qwen3", "mistral")

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
          "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16,
          "float64": torch.float64, "fp64": torch.float64}


class ModelError(ValueError):
    """A model that the pruning code cannot handle, with a message naming why."""


def torch_dtype(name: str | torch.dtype) -> torch.dtype:
    """Map a config dtype string ('float32', 'bf16', ...) to a torch dtype."""
    if isinstance(name, torch.dtype):
        return name
    try:
        return DTYPES[str(name).lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; expected one of {sorted(DTYPES)}") from None


def resolve_device(name: str | None) -> torch.device:
    """'auto' -> cuda if available else cpu."""
    if name in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


@dataclass(frozen=True)
class AttnGeometry:
    """Grouped-query attention shape: query heads, KV heads, head dim; groups = heads per KV head."""

    n_heads: int
    n_kv: int
    head_dim: int

    @property
    def groups(self) -> int:
        return self.n_heads // self.n_kv


def check_family(config) -> str:
    """Return the model_type, or raise naming the unsupported family."""
    family = getattr(config, "model_type", None)
    if family not in FAMILIES:
        raise ModelError(f"model family {family!r} is not supported by the pruning surgery; "
                         f"supported: {', '.join(FAMILIES)}")
    return family


def attention_geometry(config) -> AttnGeometry:
    """Heads, KV heads and head_dim from an HF config (head_dim explicit or hidden/heads)."""
    n_heads = config.num_attention_heads
    n_kv = getattr(config, "num_key_value_heads", None) or n_heads
    if n_heads % n_kv:
        raise ModelError(f"num_attention_heads={n_heads} is not divisible by "
                         f"num_key_value_heads={n_kv}")
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // n_heads
    return AttnGeometry(n_heads, n_kv, head_dim)


def decoder_layers(model) -> torch.nn.ModuleList:
    """The list of decoder blocks of a causal LM (``model.model.layers``)."""
    check_family(model.config)
    return model.model.layers


def resolve_model_dir(source: str, revision: str | None = None) -> Path:
    """A local directory for ``source``: an existing folder, or a hub id resolved through the
    local HF cache / hub (``snapshot_download`` of the safetensors, configs and tokenizer)."""
    path = Path(source).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise ModelError(f"model source {source!r} is a file; expected a directory or hub id")
    if source.startswith((".", "/", "~")):
        raise ModelError(f"model directory {source!r} does not exist")
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(
            source, revision=revision,
            allow_patterns=["*.json", "*.safetensors", "tokenizer*", "*.model", "*.txt"]))
    except Exception as exc:  # network / auth / missing repo
        raise ModelError(f"cannot resolve model {source!r} locally or on the hub: {exc}") from exc


def load_model(source: str | Path, dtype: str | torch.dtype = "float32", device: str | None = "cpu",
               trust_remote_code: bool = False, revision: str | None = None,
               device_map: str | None = None):
    """Load (model, tokenizer) from a local directory or a hub id, in eval mode, with SDPA
    attention. Raises :class:`ModelError` for unsupported families."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    t0 = time.time()
    model_dir = resolve_model_dir(str(source), revision)
    config = AutoConfig.from_pretrained(model_dir, trust_remote_code=trust_remote_code)
    check_family(config)
    attention_geometry(config)
    kwargs = dict(dtype=torch_dtype(dtype), trust_remote_code=trust_remote_code,
                  attn_implementation="sdpa")
    if device_map:
        kwargs["device_map"] = device_map
    model = AutoModelForCausalLM.from_pretrained(model_dir, **kwargs)
    if not device_map and device is not None:
        model.to(resolve_device(device))
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=trust_remote_code)
    log.info("loaded %s (%s, %s) in %.1fs", source, config.model_type, dtype, time.time() - t0)
    return model, tokenizer


def convert_gguf(gguf_path: str | Path, out_dir: str | Path, dtype: str = "float32") -> Path:
    """Dequantize a GGUF checkpoint once into an HF safetensors folder (model + tokenizer).

    The GGUF loader attaches a quantizer that refuses ``save_pretrained``; it is cleared first.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_path = Path(gguf_path)
    if not gguf_path.is_file():
        raise FileNotFoundError(f"GGUF file not found: {gguf_path}")
    out_dir = Path(out_dir)
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name,
                                                 dtype=torch_dtype(dtype))
    check_family(model.config)
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tok = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    _replace_dir(tmp, out_dir)
    return out_dir


def _replace_dir(tmp: Path, out: Path) -> None:
    import shutil

    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)


def layer_tensor_names(layer: int) -> dict[str, str]:
    """Checkpoint names of the tensors of one decoder layer that pruning touches."""
    p = f"model.layers.{layer}."
    names = {m: f"{p}self_attn.{m}.weight" for m in ("q_proj", "k_proj", "v_proj", "o_proj")}
    names.update({m: f"{p}mlp.{m}.weight" for m in ("gate_proj", "up_proj", "down_proj")})
    return names


def read_tensors(model_dir: str | Path, names: list[str]) -> dict[str, torch.Tensor]:
    """Read only the named tensors from a safetensors checkpoint (single file or sharded),
    without loading the rest of the model: a 70B compensation job needs one layer's weights."""
    from safetensors import safe_open

    model_dir = Path(model_dir)
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
    elif (model_dir / "model.safetensors").is_file():
        weight_map = {n: "model.safetensors" for n in names}
    else:
        raise FileNotFoundError(f"no safetensors checkpoint in {model_dir}")
    missing = [n for n in names if n not in weight_map]
    if missing:
        raise KeyError(f"tensors not in checkpoint {model_dir}: {missing[:3]}")
    by_file: dict[str, list[str]] = {}
    for n in names:
        by_file.setdefault(weight_map[n], []).append(n)
    out = {}
    for fname, ns in by_file.items():
        with safe_open(model_dir / fname, framework="pt") as f:
            for n in ns:
                out[n] = f.get_tensor(n)
    return out


def model_config_dict(model_dir: str | Path) -> dict:
    """The raw config.json of a model folder."""
    return json.loads((Path(model_dir) / "config.json").read_text())
