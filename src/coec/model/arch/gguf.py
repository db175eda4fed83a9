"""llama.cpp's side of the GGUF export (``coec.export.gguf``): the architectures a pruned model is written
as and what each one's loader holds, and the other llama.cpp / gguf-py names the export uses
(file types, tokenizer models, pre-tokenizers). They live here because llama.cpp names its
architectures and vocabularies after model families.

Read from the llama.cpp that llama-cpp-python 0.3.36 vendors (``vendor/llama.cpp``); the line
numbers below are that release's. A tensor the file carries but the loader does not create is an
error at load time ("wrong number of tensors", ``src/llama-model-loader.cpp:1398``), so every
tensor of the export must have a slot in its architecture's table:

* ``llama`` (``src/models/llama.cpp:34-92``): wq/wo sized ``n_embd_head_k * n_head`` (an explicit
  head size, ``attention.key_length``, ``src/llama-model.cpp:1440``), optional q/k/v biases
  (``create_tensor_qkv``, ``src/llama-model.cpp:3396``), optional ``attn_output.bias`` (:57) and
  ``ffn_gate|up|down.bias`` (:74-76), the llama3 ``rope_freqs`` (:66). One width for all blocks:
  tensors are sized by layer 0's counts (``LLAMA_LOAD_LOCALS``, ``src/llama-model.h:860``).
* ``deci`` (``src/models/deci.cpp:14-74``): the same slots with per-layer ``head_count``,
  ``head_count_kv`` and ``feed_forward_length`` (``hparams.n_head(i)`` etc., :30-34).
* ``qwen3`` (``src/models/qwen3.cpp:15-47``): q/k/v biases and per-head ``attn_q_norm`` /
  ``attn_k_norm``; no ``attn_output.bias``, no MLP bias, no ``rope_freqs``; one width.
* ``granite`` (``src/models/granite.cpp:59-117``): the llama slots plus the embedding, residual,
  attention and logit scales (:5-10); one width.

``llama``, ``deci`` and ``granite`` apply RoPE to consecutive pairs (``LLAMA_ROPE_TYPE_NORM``,
``src/llama-model.cpp:3052-3095``), so the q/k rows of a Hugging Face (rotate-half) model are
permuted as ``convert_hf_to_gguf.py`` does (``LlamaModel.permute``); ``qwen3`` uses the
rotate-half (NEOX) form (``src/llama-model.cpp:3177``) and takes the rows as they are.
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from gguf import LlamaFileType, LlamaHfVocab
    from llama_cpp import Llama

_QKV = {f"attn_{t}.{s}" for t in "qkv" for s in ("weight", "bias")}
_BASE_LAYER = frozenset(
    {
        "attn_norm.weight",
        *_QKV,
        "attn_output.weight",
        "attn_output.bias",
        "ffn_norm.weight",
        *{f"ffn_{t}.{s}" for t in ("gate", "up", "down") for s in ("weight", "bias")},
    }
)
_QK_NORM_LAYER = frozenset(
    {
        "attn_norm.weight",
        *_QKV,
        "attn_output.weight",
        "attn_q_norm.weight",
        "attn_k_norm.weight",
        "ffn_norm.weight",
        "ffn_gate.weight",
        "ffn_up.weight",
        "ffn_down.weight",
    }
)
_MODEL = frozenset({"token_embd.weight", "output_norm.weight", "output.weight"})


@dataclass(frozen=True)
class GgufArch:
    """What one llama.cpp architecture's loader and graph hold."""

    name: str
    layer_slots: frozenset[str]  # per-block tensors ``blk.<i>.<slot>`` the loader creates
    model_slots: frozenset[str]  # tensors outside the blocks
    per_layer: bool = False  # head counts and FFN width may differ per block
    rope_pairs: bool = True  # NORM RoPE on consecutive pairs: q/k rows are permuted
    scalars: frozenset[str] = frozenset()  # extra ``<arch>.<key>`` scalars it reads
    source: str = ""  # where in llama.cpp this was read

    def missing_slots(self, layer: set[str], model: set[str]) -> list[str]:
        """The tensors of a model that this architecture has no slot for."""
        return sorted({f"blk.N.{s}" for s in layer - self.layer_slots} | (model - self.model_slots))


ARCHS: dict[str, GgufArch] = {
    a.name: a
    for a in (
        GgufArch("llama", _BASE_LAYER, _MODEL | {"rope_freqs.weight"}, source="src/models/llama.cpp:34-92"),
        GgufArch(
            "deci", _BASE_LAYER, _MODEL | {"rope_freqs.weight"}, per_layer=True, source="src/models/deci.cpp:14-74"
        ),
        GgufArch("qwen3", _QK_NORM_LAYER, _MODEL, rope_pairs=False, source="src/models/qwen3.cpp:15-47"),
        GgufArch(
            "granite",
            _BASE_LAYER,
            _MODEL | {"rope_freqs.weight"},
            scalars=frozenset({"embedding_scale", "residual_scale", "attention.scale", "logit_scale"}),
            source="src/models/granite.cpp:5-117",
        ),
    )
}


@dataclass(frozen=True)
class GgufNeeds:
    """What a pruned model asks of the architecture that is to hold it."""

    layer_slots: frozenset[str]
    model_slots: frozenset[str]
    per_layer: bool
    scalars: frozenset[str]


def cannot_hold(arch: GgufArch, needs: GgufNeeds) -> str | None:
    """Why ``arch`` cannot hold a model with ``needs`` (None: it can)."""
    if needs.per_layer and not arch.per_layer:
        return "one width for all blocks (tensors sized by layer 0), the layers' widths differ"
    missing = arch.missing_slots(set(needs.layer_slots), set(needs.model_slots))
    if missing:
        return "no slot for " + ", ".join(missing)
    extra = sorted(needs.scalars - arch.scalars)
    if extra:
        return "does not read " + ", ".join(f"{arch.name}.{k}" for k in extra)
    return None


def choose_arch(candidates: tuple[str, ...], needs: GgufNeeds) -> tuple[GgufArch, str]:
    """The first candidate architecture that holds the model, with a one-line reason; ValueError
    naming each candidate and why it cannot, when none does."""
    tried: list[str] = []
    for name in candidates:
        arch = ARCHS[name]
        why = cannot_hold(arch, needs)
        if why is None:
            reason = f"llama.cpp {name} holds it ({arch.source})"
            return arch, "; ".join([*tried, reason])
        tried.append(f"{name}: {why}")
    raise ValueError("no llama.cpp architecture holds this pruned model (" + "; ".join(tried) + ")")


# ----------------------------------------------------------------------------- other names
def file_types() -> dict[str, LlamaFileType]:
    """``general.file_type`` of each requested tensor type (gguf-py's ``LlamaFileType``)."""
    from gguf import LlamaFileType as F  # deferred: gguf (~0.3 s), only the GGUF stages need it

    return {
        "f32": F.ALL_F32,
        "f16": F.MOSTLY_F16,
        "q8_0": F.MOSTLY_Q8_0,
        "q6_k": F.MOSTLY_Q6_K,
        "q5_k_m": F.MOSTLY_Q5_K_M,
        "q5_1": F.MOSTLY_Q5_1,
        "q5_0": F.MOSTLY_Q5_0,
        "q4_k_m": F.MOSTLY_Q4_K_M,
        "q4_1": F.MOSTLY_Q4_1,
        "q4_0": F.MOSTLY_Q4_0,
        "iq4_xs": F.MOSTLY_IQ4_XS,
        "q3_k_m": F.MOSTLY_Q3_K_M,
        "q3_k_s": F.MOSTLY_Q3_K_S,
        "q2_k": F.MOSTLY_Q2_K,
    }


def file_type_name(value: int) -> str:
    """The tensor type named by a ``general.file_type`` value: ours (:func:`file_types`) where
    it is one, else gguf-py's name less its ALL_/MOSTLY_ prefix (``q4_k_m``)."""
    from gguf import LlamaFileType as F  # deferred: gguf (~0.3 s), only the GGUF stages need it

    ours = {int(v): k for k, v in file_types().items()}
    if value in ours:
        return ours[value]
    return F(value).name.lower().removeprefix("mostly_").removeprefix("all_")


# tokenizer.ggml.model of a SentencePiece-style (byte-fallback BPE) vocabulary
# (src/llama-vocab.cpp:1971, LLAMA_VOCAB_TYPE_SPM)
SPM_TOKENIZER_MODEL = "llama"


def byte_fallback_vocab(folder: Path) -> LlamaHfVocab:
    """gguf-py's reader of a byte-fallback BPE ``tokenizer.json`` (``LlamaHfVocab``: tokens,
    scores and types as the converter's ``_set_vocab_llama_hf`` writes them)."""
    from gguf import LlamaHfVocab  # deferred: gguf (~0.3 s), only the GGUF stages need it

    return LlamaHfVocab(folder)


# The split regexes of tokenizers whose llama.cpp pre-tokenizer applies the same one
# (src/llama-vocab.cpp: "qwen2" -> LLAMA_VOCAB_PRE_TYPE_QWEN2 at :2259, "llama-bpe" ->
# LLAMA_VOCAB_PRE_TYPE_LLAMA3 at :2176), for a tokenizer whose hash is not in the converter's
# table (coec.model.arch.gguf_pre), e.g. a retrained vocabulary with the family's pre-tokenizer. Each
# regex is written out whole, as llama.cpp's converter has it.
SPLIT_REGEX_PRE = {
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+": "qwen2",  # noqa: E501
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+": "llama-bpe",  # noqa: E501
}


def bindings_last_logits(llm: Llama) -> np.ndarray:
    """The logits of the last evaluated position of a llama-cpp-python model (a view of the
    context's float32 buffer, ``n_vocab`` long)."""

    import llama_cpp  # deferred: llama-cpp-python is an optional dependency

    ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
    return np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), shape=(llm.n_vocab(),))


def bindings_model_class() -> type[Llama]:
    """llama-cpp-python's model class (``llama_cpp.Llama``); ImportError when it is absent."""
    from llama_cpp import Llama  # deferred: llama-cpp-python is an optional dependency

    model_class: type[Llama] = Llama  # typed whether or not mypy finds llama_cpp (else Any)
    return model_class


def bindings_imatrix(vectors: dict[str, np.ndarray]) -> tuple[Any, list[Any]]:
    """The quantizer's importance matrix (``llama_model_quantize_params.imatrix``): a ctypes array
    of ``llama_model_imatrix_data`` {name, data, size}, one per vector (float32, (row width,)) in
    name order, then one with ``name == NULL`` (llama.cpp reads up to it, src/llama-quant.cpp:994).
    Returns (array, the buffers it points into): keep both alive until the call returns."""

    import llama_cpp  # deferred: llama-cpp-python is an optional dependency

    entry = llama_cpp.llama_model_imatrix_data
    keep: list[Any] = []
    arr = (entry * (len(vectors) + 1))()
    for i, name in enumerate(sorted(vectors)):
        v = np.ascontiguousarray(vectors[name], dtype=np.float32)
        raw = name.encode()
        keep += [v, raw]
        arr[i].name = raw
        arr[i].data = v.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        arr[i].size = v.size
    return arr, keep  # arr[-1] is zeroed: the NULL name that ends it


def bindings_quantize(
    src: str, dst: str, ftype: int, nthread: int, imatrix: dict[str, np.ndarray] | None = None
) -> int:
    """llama.cpp's quantizer (``llama_model_quantize``, default parameters) from the GGUF file
    ``src`` to ``dst`` as ``ftype`` (a ``llama_ftype``, numbered as gguf-py's ``LlamaFileType``)
    on ``nthread`` threads, with the importance vectors ``imatrix`` (GGUF name -> float32 (row
    width,)) when given; returns its status (0: done). ImportError without the bindings."""

    import llama_cpp  # deferred: llama-cpp-python is an optional dependency

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = nthread
    keep: list[Any] = []
    if imatrix is not None:
        arr, keep = bindings_imatrix(imatrix)
        keep.append(arr)
        params.imatrix = ctypes.cast(arr, ctypes.POINTER(llama_cpp.llama_model_imatrix_data))
    status = int(llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(params)))
    del keep  # the buffers lived until the call returned
    return status


def bindings_system_info() -> str:
    """llama.cpp's system line (``llama_print_system_info``: the instruction sets it was built
    with, e.g. ``AMX_INT8 = 1``); ImportError when the bindings are absent."""
    import llama_cpp  # deferred: llama-cpp-python is an optional dependency

    return str(llama_cpp.llama_print_system_info().decode(errors="replace"))


@contextlib.contextmanager
def default_model_params(**fields: object) -> Iterator[None]:
    """Within the block, the model parameters llama-cpp-python's ``Llama()`` starts from
    (``llama_model_default_params``) carry ``fields`` (e.g. ``use_extra_bufts=False``, which its
    0.3.36 constructor takes no keyword for: ``**kwargs`` swallows it)."""
    import llama_cpp.llama_cpp as lib  # deferred: llama-cpp-python is an optional dependency

    default = lib.llama_model_default_params

    def params() -> Any:
        p = default()
        for k, v in fields.items():
            setattr(p, k, v)
        return p

    lib.llama_model_default_params = params
    try:
        yield
    finally:
        lib.llama_model_default_params = default
