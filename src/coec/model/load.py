"""Model loading and per-tensor checkpoint reads.

What a family looks like (layer paths, module names, geometry) lives in its adapter
(``coec.model.arch``); the functions here ask the adapter and hard-code no family, size or path.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch

from coec.io.artifacts import read_json
from coec.io.atomic import atomic_dir
from coec.io.errors import ArtifactError
from coec.io.safetensors_file import safetensors_header
from coec.model.arch import Adapter, ModelError, adapter_for
from coec.model.checkpoint import Checkpoint

log = logging.getLogger(__name__)

DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "float64": torch.float64,
    "fp64": torch.float64,
}


def torch_dtype(name: str | torch.dtype) -> torch.dtype:
    """Map a config dtype string ('float32', 'bf16', ...) to a torch dtype."""
    if isinstance(name, torch.dtype):
        return name
    try:
        return DTYPES[str(name).lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; expected one of {sorted(DTYPES)}") from None


def resolve_device(name: str | torch.device | None) -> torch.device:
    """'auto' -> cuda if available else cpu."""
    if name in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def check_family(config: Any) -> str:
    """Return the model_type, or raise naming the unsupported family (``adapter_for``)."""
    adapter_for(config)
    model_type: str = config.model_type
    return model_type


def decoder_layers(model: Any) -> torch.nn.ModuleList:
    """The list of decoder blocks of a causal LM (where its family's adapter keeps them)."""
    return adapter_for(model.config).decoder_layers(model)


def resolve_model_dir(source: str, revision: str | None = None, trust_remote_code: bool = False) -> Path:
    """A local directory for ``source``: an existing folder, or a hub id resolved through the
    local HF cache / hub at ``revision`` (``snapshot_download`` of the safetensors, configs and
    tokenizer; with ``trust_remote_code`` also the repository's ``*.py`` model code)."""
    path = Path(source).expanduser()
    if path.is_dir():  # config.json present, every safetensors file complete (one-line error)
        return check_model_dir(path)
    if path.exists():
        raise ModelError(f"model source {source!r} is a file; expected a directory or hub id")
    if source.startswith((".", "/", "~")):
        raise ModelError(f"model directory {source!r} does not exist")
    from huggingface_hub import snapshot_download  # deferred: only hub ids need it, +0.9 s at import (measured)

    patterns = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.txt"]
    try:
        return Path(
            snapshot_download(
                source, revision=revision, allow_patterns=patterns + (["*.py"] if trust_remote_code else [])
            )
        )
    except Exception as exc:  # network / auth / missing repo
        raise ModelError(f"cannot resolve model {source!r} locally or on the hub: {exc}") from exc


def hub_kwargs(revision: str | None = None, trust_remote_code: bool = False) -> dict[str, Any]:
    """The keyword arguments every ``from_pretrained`` of a model source receives."""
    return {"revision": revision, "trust_remote_code": bool(trust_remote_code)}


def load_config(model_dir: str | Path, revision: str | None = None, trust_remote_code: bool = False) -> Any:
    """The transformers config of a resolved model folder (``AutoConfig.from_pretrained``)."""
    from transformers import AutoConfig  # deferred: transformers (+1-4 s), read only when a model is loaded

    return AutoConfig.from_pretrained(model_dir, **hub_kwargs(revision, trust_remote_code))


def load_model(source: str | Path, dtype: str | torch.dtype = "float32", device: str | None = "cpu") -> Any:
    """Load (model, tokenizer) from a local directory or a hub id, in eval mode, with SDPA
    attention. Raises :class:`ModelError` for unsupported families."""
    t0 = time.time()
    return load_resolved(resolve_model_dir(str(source)), dtype, device, (None, False), None, (str(source), t0))


def load_resolved(
    model_dir: Path,
    dtype: str | torch.dtype,
    device: str | None,
    hub_options: tuple[str | None, bool],
    device_map: str | None,
    logged: tuple[str, float],
) -> tuple[Any, Any]:
    """:func:`load_model` of the folder ``model_dir`` already resolved from a source, at
    ``hub_options`` (revision, trust_remote_code); ``logged``: the source's name and the load's start
    (for the log line)."""
    from transformers import (
        AutoModelForCausalLM,
        AutoTokenizer,
    )  # deferred: transformers (+1-4 s), read only when a model is loaded

    hub = hub_kwargs(*hub_options)
    config = load_config(model_dir, *hub_options)
    adapter_for(config).attention_shape(config)
    kwargs = dict(dtype=torch_dtype(dtype), attn_implementation="sdpa", **hub)
    if device_map:
        kwargs["device_map"] = device_map
    model: Any = AutoModelForCausalLM.from_pretrained(model_dir, **kwargs)
    if not device_map and device is not None:
        model.to(resolve_device(device))
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir, **hub)
    log.info("loaded %s (%s, %s) in %.1fs", logged[0], config.model_type, dtype, time.time() - logged[1])
    return model, tokenizer


def gguf_dequantize_kwargs() -> dict[str, Any]:
    """``from_pretrained`` options that unpack every GGUF weight at load time. transformers
    >= 5.24 keeps GGUF weights packed when the ``kernels`` package has a matmul kernel for the
    architecture; ``GgufConfig(dequantize=True)`` turns that off. A release without GgufConfig
    gets no option; :func:`check_dense` still refuses a packed result."""
    try:
        from transformers import GgufConfig  # deferred: transformers (+1-4 s), read only when a model is loaded
    except ImportError:
        return {}
    return {"quantization_config": GgufConfig(dequantize=True)}


def check_dense(model: Any, dtype: torch.dtype) -> None:
    """Raise unless every parameter is a dense floating tensor of ``dtype`` (no GGUF blocks)."""
    packed = [n for n, p in model.named_parameters() if p.dtype != dtype]
    if packed:
        raise ModelError(f"GGUF weights not dequantised to {dtype}: {packed[:3]}")


def convert_gguf(gguf_path: str | Path, out_dir: str | Path, dtype: str = "float32") -> Path:
    """Dequantize a GGUF checkpoint once into an HF safetensors folder (model + tokenizer).

    Dequantisation is explicit (:func:`gguf_dequantize_kwargs`) and checked
    (:func:`check_dense`). The GGUF loader attaches a quantizer that refuses
    ``save_pretrained``; it is cleared first.
    """
    from transformers import (
        AutoModelForCausalLM,
        AutoTokenizer,
    )  # deferred: transformers (+1-4 s), read only when a model is loaded

    gguf_path = Path(gguf_path)
    if not gguf_path.is_file():
        raise FileNotFoundError(f"GGUF file not found: {gguf_path}")
    out_dir = Path(out_dir)
    model: Any = AutoModelForCausalLM.from_pretrained(
        gguf_path.parent, gguf_file=gguf_path.name, dtype=torch_dtype(dtype), **gguf_dequantize_kwargs()
    )
    check_family(model.config)
    check_dense(model, torch_dtype(dtype))
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tok = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    with atomic_dir(out_dir) as tmp:  # a temp folder renamed on success; modes follow the umask
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
    return out_dir


def layer_tensor_names(layer: int, config: Any = None) -> dict[str, str]:
    """Checkpoint names of the tensors of one decoder layer that pruning touches, by role
    (q_proj ... down_proj), in the layout of ``config``'s family (None: the common HF layout)."""
    return (Adapter() if config is None else adapter_for(config)).layer_tensor_names(layer)


def check_model_dir(folder: str | Path) -> Path:
    """A local model folder: config.json present and readable, every safetensors file (and the
    shard index) complete. One-line :class:`ArtifactError` naming the file otherwise."""
    folder = Path(folder)
    cfg = folder / "config.json"
    if not cfg.is_file():
        raise ArtifactError(folder, "missing config.json (not a model folder)")
    obj = read_json(cfg)
    if not isinstance(obj, dict) or "model_type" not in obj:
        raise ArtifactError(cfg, "no model_type key")
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        wm = read_json(index).get("weight_map")
        if not isinstance(wm, dict):
            raise ArtifactError(index, "missing weight_map")
        for shard in sorted(set(wm.values())):
            safetensors_header(folder / shard)
    for shard in sorted(folder.glob("*.safetensors")):
        safetensors_header(shard)
    return folder


def read_model_tensors(model_dir: str | Path, names: list[str]) -> dict[str, torch.Tensor]:
    """Only the named tensors of a (sharded) safetensors checkpoint, each shard checked and every
    floating tensor finite: one read of a :class:`~coec.model.checkpoint.Checkpoint` (a stage that
    reads every layer builds one and reads each layer from it)."""
    return Checkpoint(model_dir).read(names, check_finite=True)
