"""Write an in-memory pruned, compensated model as one GGUF file that llama.cpp loads, then read
it back and check every tensor (docs/export.md "GGUF").

The architecture is the first of the family's candidates (``Adapter.gguf_archs``) whose loader
holds the model (``coec.model.arch.gguf``): ``llama`` for one width in every block, ``deci`` when the
blocks' head counts or MLP widths differ. Tensors are written one at a time (the writer never
holds a second copy of the model), to a temporary name next to the output that is renamed only
after the read-back check passed.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gguf
import numpy as np
import torch

from coec.export.gguf.layout import (
    QUANTIZER,
    LayerWidths,
    block_of,
    check_gguf_type,
    check_imatrix_need,
    encode,
    encoded_nbytes,
    fallback_reason,
    file_type,
    layer_widths,
    made_by,
    permute_qk,
    rope_metadata,
    tensor_type,
)
from coec.export.gguf.quantize import quantize_gguf, quantizer_fallbacks, read_tensor_types, type_counts
from coec.export.gguf.vocab import copy_gguf_tokenizer, write_hf_tokenizer
from coec.export.imatrix import Imatrix, check_imatrix
from coec.io.atomic import atomic_path
from coec.io.progress import bar as progress_bar
from coec.model.arch import adapter_for, weight_of
from coec.model.arch.gguf import ARCHS, GgufArch, GgufNeeds, choose_arch

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

    from coec.model.arch import Adapter

log = logging.getLogger(__name__)

PROVENANCE_KEY = "coec.export.stage"  # JSON of the export's provenance (llama.cpp ignores it)
FALLBACK_POLICIES = ("allow", "refuse")  # a tensor that cannot take the requested type: written otherwise, or refused


@dataclass
class Planned:
    """One tensor of the file: its GGUF name, where it comes from, and its encoding."""

    name: str
    source: str
    shape: tuple[int, ...]  # numpy order (rows, row width)
    qtype: gguf.GGMLQuantizationType
    fallback: str | None
    get: Callable[[], torch.Tensor] = field(repr=False)  # float32 CPU values, ``shape``

    def values(self) -> np.ndarray:
        return self.get().detach().to("cpu", torch.float32).contiguous().numpy()


def refuse_config(adapter: Adapter, config: PretrainedConfig) -> None:
    """ValueError naming what of the source config no llama.cpp architecture written here has."""
    act = getattr(config, "hidden_act", "silu")
    if act != "silu":
        raise ValueError(
            f"hidden_act {act!r}: the llama.cpp archs written here ({', '.join(ARCHS)}) gate their MLP with SiLU only"
        )
    if adapter.sliding(config):
        raise ValueError(
            f"sliding-window attention (window {config.sliding_window} < context "
            f"{config.max_position_embeddings}) is not held by the llama.cpp archs "
            f"written here ({', '.join(ARCHS)})"
        )
    if adapter.embed_scale(config) is not None and "embedding_scale" not in adapter.gguf_scalars(config):
        raise ValueError(f"{config.model_type} scales its token embeddings and names no GGUF key for the factor")


def _getter(t: torch.Tensor, n_heads: int | None) -> Callable[[], torch.Tensor]:
    """Read a tensor as float32 (q/k rows permuted into ``n_heads`` heads when given), lazily:
    nothing is copied until the tensor is written."""
    if n_heads is None:
        return lambda: t.detach().float()
    return lambda: permute_qk(t.detach().float(), n_heads)


def plan_tensors(
    adapter: Adapter,
    model: PreTrainedModel,
    widths: list[LayerWidths],
    gguf_type: str,
    rope_freqs: torch.Tensor | None,
    rope_pairs: bool,
) -> list[Planned]:
    """Every tensor of the file, in writing order: embedding, RoPE factors, final norm, head,
    then block by block each module's weight and bias. ``rope_pairs``: permute q/k rows for an
    architecture with consecutive-pair RoPE (``GgufArch.rope_pairs``)."""
    top = adapter.gguf_model_modules(model)
    emb, head = weight_of(top["token_embd"]), weight_of(top["output"])
    entries: list[tuple[str, str, torch.Tensor, int | None]] = [("token_embd.weight", "embed_tokens.weight", emb, None)]
    if rope_freqs is not None:
        entries.append(("rope_freqs.weight", "llama3 rope_parameters", rope_freqs, None))
    entries.append(("output_norm.weight", "norm.weight", weight_of(top["output_norm"]), None))
    # a tied head is left out: llama.cpp then uses token_embd (src/models/llama.cpp:41-46)
    if not (head.data_ptr() == emb.data_ptr() and head.shape == emb.shape):
        entries.append(("output.weight", "lm_head.weight", head, None))
    for i, layer in enumerate(adapter.decoder_layers(model)):
        for name, mod in adapter.gguf_layer_modules(layer).items():
            heads = None
            if rope_pairs and name in ("attn_q", "attn_k"):
                heads = widths[i].heads if name == "attn_q" else widths[i].kv_heads
            for suffix in ("weight", "bias"):
                t = getattr(mod, suffix, None)
                if t is not None:
                    entries.append((f"blk.{i}.{name}.{suffix}", f"layer {i} {name}.{suffix}", t, heads))
    plan = []
    for gname, source, t, heads in entries:
        shape = tuple(int(s) for s in t.shape)
        qtype, why = tensor_type(shape, gguf_type)
        plan.append(Planned(gname, source, shape, qtype, why, _getter(t, heads)))
    return plan


def needs_of(plan: list[Planned], widths: list[LayerWidths], scalars: Mapping[str, Any]) -> GgufNeeds:
    layer = {p.name.split(".", 2)[2] for p in plan if p.name.startswith("blk.")}
    model = {p.name for p in plan if not p.name.startswith("blk.")}
    return GgufNeeds(frozenset(layer), frozenset(model), len(set(widths)) > 1, frozenset(scalars))


@dataclass(frozen=True)
class GgufOptions:
    """How ``write_gguf`` writes: ``tokenizer_gguf`` copies that GGUF file's tokenizer keys
    instead of converting the HF tokenizer; ``name`` (``general.name``; default: the model's
    folder name); ``provenance`` stored as ``coec.export.stage``; ``fallback`` (``FALLBACK_POLICIES``);
    ``threads`` of llama.cpp's quantizer (default: torch's); ``imatrix`` (K-quant mixes only)."""

    tokenizer_gguf: str | Path | None = None
    name: str | None = None
    provenance: Mapping[str, Any] | None = None
    fallback: str = "allow"
    threads: int | None = None
    imatrix: Imatrix | None = None


@dataclass
class GgufLayout:
    """What the file holds, decided before anything is written: the source config, the
    architecture and why, each block's widths, the head size, the vocabulary size, the RoPE
    keys (and factors), the family's scalars, the tensors in writing order, the file's name and
    the type gguf-py writes (``base``: f32 for a K-quant mix, which llama.cpp's quantizer makes)."""

    config: PretrainedConfig
    arch: GgufArch
    reason: str
    widths: list[LayerWidths]
    head_dim: int
    n_vocab: int
    rope_kv: dict[str, Any]
    scalars: dict[str, float]
    plan: list[Planned]
    name: str
    base: str


def layout_of(model: PreTrainedModel, base: str, name: str | None = None) -> GgufLayout:
    """The layout of ``model`` written in type ``base``; ValueError, before anything is written,
    for a model no llama.cpp architecture here holds."""
    cfg = model.config
    adapter = adapter_for(cfg)
    refuse_config(adapter, cfg)
    head_dim = adapter.attention_shape(cfg).head_dim
    widths = layer_widths(adapter, model, head_dim)
    rope_kv, rope_freqs = rope_metadata(cfg, head_dim)
    scalars = adapter.gguf_scalars(cfg)
    names = plan_tensors(adapter, model, widths, base, rope_freqs, rope_pairs=False)
    arch, reason = choose_arch(adapter.gguf_archs, needs_of(names, widths, scalars))
    plan = plan_tensors(adapter, model, widths, base, rope_freqs, arch.rope_pairs)
    embedding = weight_of(adapter.embedding(model))
    name = name or getattr(cfg, "name_or_path", None) or "coec-pruned"
    file_name = Path(str(name)).name or "coec-pruned"
    return GgufLayout(
        cfg, arch, reason, widths, head_dim, int(embedding.shape[0]), rope_kv, scalars, plan, file_name, base
    )


def write_metadata(w: gguf.GGUFWriter, layout: GgufLayout) -> None:
    """Architecture keys: sizes (per-layer arrays for an arch that reads them), head size, RoPE,
    norm epsilon, the family's scalars."""
    config, arch, widths = layout.config, layout.arch, layout.widths
    w.add_name(layout.name)
    w.add_file_type(int(file_type(layout.base)))
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_vocab_size(layout.n_vocab)
    w.add_context_length(int(config.max_position_embeddings))
    w.add_embedding_length(int(config.hidden_size))
    w.add_block_count(len(widths))
    per = (lambda xs: list(xs)) if arch.per_layer else (lambda xs: next(iter(xs)))
    w.add_head_count(per(x.heads for x in widths))
    w.add_head_count_kv(per(x.kv_heads for x in widths))
    w.add_feed_forward_length(per(x.ffn for x in widths))
    # explicit head size: pruned heads leave hidden_size != heads x head_dim
    w.add_key_length(layout.head_dim)
    w.add_value_length(layout.head_dim)
    w.add_layer_norm_rms_eps(float(config.rms_norm_eps))
    for key, value in {**layout.rope_kv, **layout.scalars}.items():
        full = f"{arch.name}.{key}"
        if isinstance(value, str):
            w.add_string(full, value)
        elif isinstance(value, int):
            w.add_uint32(full, value)
        else:
            w.add_float32(full, float(value))


def refusal(gguf_type: str, fallbacks: list[dict[str, Any]]) -> str:
    """The one-line refusal of an export whose tensors would not all take ``gguf_type``."""
    first, block = fallbacks[0], block_of(gguf_type)
    n = len(fallbacks)
    return (
        f"{gguf_type} would fall back on {n} tensor{'s' if n != 1 else ''} (first: {first['tensor']}, row width "
        f"{first['shape'][-1]} not a multiple of {block}); pass --gguf-fallback allow or choose widths that are "
        f"multiples of {block}"
    )


def write_gguf(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    out: str | Path,
    gguf_type: str = "f32",
    options: GgufOptions | None = None,
) -> dict[str, Any]:
    """Write ``model`` (a pruned HF causal LM in memory) and its tokenizer as a GGUF file at
    ``out``; returns the report (architecture and why, widths, per-tensor fallbacks, tokenizer,
    read-back check). ``options``: :class:`GgufOptions`. The K-quant mixes are made by
    llama.cpp's quantizer (``coec.export.gguf.quantize``) from an f32 file written beside ``out`` and
    always removed. ``fallback='refuse'``: ValueError when any 2-D tensor would not take
    ``gguf_type`` (predicted from the shapes, checked again after quantizing). ValueError,
    before anything is written, for a model no llama.cpp architecture here holds. ``imatrix``
    (``coec.export.imatrix.Imatrix``, K-quant mixes only): the quantizer's importance vectors, checked
    against the tensors' row widths before anything is written, recorded in ``coec.export.stage``;
    a mix that llama.cpp refuses without one (``layout.NEEDS_IMATRIX``) is refused first."""
    opts = options or GgufOptions()
    check_gguf_type(gguf_type)
    check_imatrix_need(gguf_type, opts.imatrix is not None)
    if opts.fallback not in FALLBACK_POLICIES:
        raise ValueError(f"gguf fallback {opts.fallback!r}: expected one of {', '.join(FALLBACK_POLICIES)}")
    kquant = made_by(gguf_type) == QUANTIZER
    layout = layout_of(model, "f32" if kquant else gguf_type, opts.name)  # base: what gguf-py writes
    plan = layout.plan
    if opts.imatrix is not None:
        if not kquant:
            raise ValueError(f"--imatrix is for the K-quant mixes made by llama.cpp's quantizer, not {gguf_type}")
        check_imatrix(opts.imatrix.vectors, {p.name: p.shape for p in plan}, opts.imatrix.path)
    predicted = [
        {"tensor": p.name, "shape": list(p.shape), "why": why}
        for p in plan
        if (why := fallback_reason(p.shape, gguf_type))
    ]
    if opts.fallback == "refuse" and predicted:
        raise ValueError(refusal(gguf_type, predicted))
    fallbacks = [
        {"tensor": p.name, "shape": list(p.shape), "type": p.qtype.name.lower(), "why": p.fallback}
        for p in plan
        if p.fallback
    ]
    for f in fallbacks if not kquant else predicted:
        log.info("gguf: %s %s: %s", f["tensor"], tuple(f["shape"]), f["why"])
    report = _report(out, layout, gguf_type, fallbacks)
    stored: dict[str, Any] = {"arch": layout.arch.name, "reason": layout.reason, "gguf_type": gguf_type}
    stored["fallbacks"] = fallbacks
    if kquant:  # the quantizer's fallbacks as predicted from the shapes (the report has those read back)
        stored.update(fallbacks=predicted, quantizer="llama.cpp")
    if opts.imatrix is not None:
        stored["imatrix"] = report["imatrix"] = opts.imatrix.record()
    stored = {**(opts.provenance or {}), **stored}
    source = _Source(tokenizer, opts.tokenizer_gguf, json.dumps(stored, sort_keys=True))
    out = Path(out)
    with atomic_path(out) as tmp:
        if not kquant:
            _write_file(tmp, layout, source, report)
        else:
            f32 = tmp.with_name(tmp.name + ".f32")  # beside the output, always removed
            try:
                _write_file(f32, layout, source, report)
                threads = opts.threads or torch.get_num_threads()
                vectors = opts.imatrix.vectors if opts.imatrix else None
                report["quantize_seconds"] = quantize_gguf(f32, tmp, gguf_type, threads, vectors)
            finally:
                f32.unlink(missing_ok=True)
            report.update(check_quantized(tmp, plan, gguf_type, predicted, opts.fallback))
    log.info(
        "gguf: wrote %s (%s, %s, %d tensors, %d fallbacks)",
        out,
        layout.arch.name,
        gguf_type,
        len(plan),
        len(report["fallbacks"]),
    )
    return report


def _report(out: str | Path, layout: GgufLayout, gguf_type: str, fallbacks: list[dict[str, Any]]) -> dict[str, Any]:
    """The report's fields known before writing (``write_gguf`` adds the tokenizer and checks)."""
    widths, plan = layout.widths, layout.plan
    return {
        "path": str(out),
        "arch": layout.arch.name,
        "reason": layout.reason,
        "gguf_type": gguf_type,
        "made_by": made_by(gguf_type),
        "head_dim": layout.head_dim,
        "heads": [x.heads for x in widths],
        "kv_heads": [x.kv_heads for x in widths],
        "ffn": [x.ffn for x in widths],
        "tensors": len(plan),
        "fallbacks": fallbacks,
        "types": type_counts([(p.name, p.shape, p.qtype) for p in plan]),
    }


@dataclass(frozen=True)
class _Source:
    """What the file takes beside the model: the HF tokenizer or a GGUF file to copy the
    tokenizer keys of, and the provenance JSON (``coec.export.stage``)."""

    tokenizer: PreTrainedTokenizerBase
    tokenizer_gguf: str | Path | None
    provenance: str


def _write_file(path: Path, layout: GgufLayout, source: _Source, report: dict[str, Any]) -> None:
    """Write the file at ``path`` with gguf-py (``layout.base`` tensors), then read it back
    (``report['tokenizer']``, ``report['verify']``)."""
    plan = layout.plan
    w = gguf.GGUFWriter(path, layout.arch.name)
    try:
        write_metadata(w, layout)
        report["tokenizer"] = (
            copy_gguf_tokenizer(w, source.tokenizer_gguf, layout.n_vocab)
            if source.tokenizer_gguf
            else write_hf_tokenizer(w, source.tokenizer, layout.n_vocab)
        )
        w.add_string(PROVENANCE_KEY, source.provenance)
        for p in plan:
            w.add_tensor_info(
                p.name, p.shape, np.dtype(np.float32), encoded_nbytes(p.shape, p.qtype), raw_dtype=p.qtype
            )
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        for p in progress_bar(plan, desc=f"gguf {layout.base}", unit="tensor"):
            w.write_tensor_data(encode(p.values(), p.qtype))
    finally:
        w.close()
    report["verify"] = verify_gguf(path, plan, layout.arch, layout.widths)


def check_quantized(
    path: Path, plan: list[Planned], gguf_type: str, predicted: list[dict[str, Any]], fallback: str
) -> dict[str, Any]:
    """Read a file made by llama.cpp's quantizer back: the planned tensors and shapes, the
    requested ``general.file_type``, the provenance kept; returns {'fallbacks' (read back),
    'types' (tensors per written type)}. ValueError on a mismatch, or on any fallback with
    ``fallback='refuse'``; a fallback the shapes did not predict is logged."""
    tensors = read_tensor_types(path)
    if sorted((n, s) for n, s, _ in tensors) != sorted((p.name, p.shape) for p in plan):
        raise ValueError(f"{path}: llama.cpp's quantizer wrote other tensors than those planned")
    r = gguf.GGUFReader(str(path))
    ft = r.get_field("general.file_type")
    if ft is None or ft.contents() != file_type(gguf_type) or r.get_field(PROVENANCE_KEY) is None:
        raise ValueError(f"{path}: llama.cpp's quantizer did not keep the file type {gguf_type} and {PROVENANCE_KEY}")
    fell = quantizer_fallbacks(tensors)
    if fallback == "refuse" and fell:
        raise ValueError(refusal(gguf_type, fell))
    if {f["tensor"] for f in fell} != {f["tensor"] for f in predicted}:
        log.warning("gguf: llama.cpp's quantizer fell back on other tensors than the row widths predict")
    for f in fell:
        log.info("gguf: %s %s: %s", f["tensor"], tuple(f["shape"]), f["why"])
    return {"fallbacks": fell, "types": type_counts(tensors)}


def is_gguf_export(path: str | Path) -> bool:
    """Whether ``path`` is a GGUF file this export wrote (it carries ``coec.export.stage``)."""
    try:
        return gguf.GGUFReader(str(path)).get_field(PROVENANCE_KEY) is not None
    except (OSError, ValueError):
        return False


def verify_gguf(path: str | Path, plan: list[Planned], arch: GgufArch, widths: list[LayerWidths]) -> dict[str, Any]:
    """Read a written file back: architecture, block count, head counts, and every tensor's
    name, shape, type and bytes equal to the plan's encoding (f32 tensors: the model's values
    exactly). Returns the largest |dequantised - model| per type; ValueError on any mismatch."""
    r = gguf.GGUFReader(str(path))
    meta = {k: f.contents() for k, f in r.fields.items() if not k.startswith("tokenizer.")}
    if meta.get("general.architecture") != arch.name:
        raise ValueError(f"{path}: reads back as arch {meta.get('general.architecture')!r}, not {arch.name!r}")
    heads = meta.get(f"{arch.name}.attention.head_count")
    want = [x.heads for x in widths] if arch.per_layer else widths[0].heads
    if meta.get(f"{arch.name}.block_count") != len(widths) or heads != want:
        raise ValueError(
            f"{path}: block count / head counts read back as "
            f"{meta.get(f'{arch.name}.block_count')} / {heads}, expected {len(widths)} / {want}"
        )
    tensors = {t.name: t for t in r.tensors}
    if list(tensors) != [p.name for p in plan]:
        raise ValueError(f"{path}: tensors read back differ from those written")
    err: dict[str, float] = {}
    for p in plan:
        t = tensors[p.name]
        shape = tuple(int(s) for s in reversed(t.shape.tolist()))
        if shape != p.shape or t.tensor_type != p.qtype:
            raise ValueError(
                f"{path}: {p.name} reads back as {shape} {t.tensor_type.name}, written {p.shape} {p.qtype.name}"
            )
        x = p.values()
        if not np.array_equal(np.asarray(t.data), encode(x, p.qtype)):
            raise ValueError(f"{path}: {p.name} reads back with different values")
        back = gguf.quants.dequantize(np.asarray(t.data), p.qtype).reshape(p.shape)
        key = p.qtype.name.lower()
        err[key] = max(err.get(key, 0.0), float(np.abs(back - x).max()) if x.size else 0.0)
    if err.get("f32", 0.0) != 0.0:
        raise ValueError(f"{path}: f32 tensors do not read back exactly")
    return {"tensors": len(plan), "max_abs_err": err}
