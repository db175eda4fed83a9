"""The GGML type and the bytes each tensor of a GGUF file gets, from its role and shape alone:
what a byte budget counts (``coec.select.search.budget``) before any file is written.

gguf-py types (f32, f16, q8_0, q5_1, q5_0, q4_1, q4_0): ``layout.tensor_type`` (1-D tensors f32;
a row width that is no multiple of the type's block f16).

K-quant mixes (q6_k, q5_k_m, q4_k_m; written by llama.cpp's quantizer from an f32 file of ours,
``coec.export.gguf.quantize``): llama.cpp's ``llama_tensor_get_type`` for a dense model, as its
``src/llama-quant.cpp`` reads (the default, non-``pure`` mix, no type overrides):

* 1-D tensors (norms, biases, RoPE factors) are not quantized: f32 as written;
* ``output.weight``, and ``token_embd.weight`` when the file has no ``output.weight`` (tied
  embeddings): Q6_K, or Q8_0 when its row width is no multiple of 256;
* ``attn_v.weight`` of q4_k_m / q5_k_m: Q6_K when ``use_more_bits(i, n)`` with ``i`` its index
  among the file's attn_v tensors (in block order) and ``n`` their count; a 70B-type model (an
  80-block model with grouped KV heads: llama.cpp's ``LLM_TYPE_70B``) raises a Q4_K attn_v to
  Q5_K;
* ``ffn_down.weight`` of q4_k_m / q5_k_m: Q6_K when ``use_more_bits(i, n)`` with ``i`` its index
  among the file's ffn_down tensors and ``n`` the block count;
* every other 2-D tensor: the mix's main type (Q6_K, Q5_K, Q4_K);
* then the fallback of a row width (ggml ne[0], the last numpy axis) that is no multiple of 256:
  Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, and f16 when the width is no multiple of 32 either.

The other mixes of llama.cpp's quantizer (iq4_xs, q3_k_m, q3_k_s, q2_k) are not modelled here: their
choices depend on more than a tensor's place (the grouped-query ratio, whether an importance matrix
is given), so :func:`check_mix_type` refuses them for a byte budget.

The bytes of a tensor are those of its data (``layout.encoded_nbytes``); a file adds its metadata
(tokenizer, a few MB) and alignment padding (at most 31 bytes a tensor).
"""

from __future__ import annotations

from dataclasses import dataclass

from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q

from coec.export.formats import GGUF_TYPES
from coec.export.gguf.layout import KQUANTS, check_gguf_type, encoded_nbytes, tensor_type

#: the main type of each K-quant mix
MAIN = {"q6_k": Q.Q6_K, "q5_k_m": Q.Q5_K, "q4_k_m": Q.Q4_K}
#: llama.cpp's fallback of a K-quant type for a row width that is no multiple of 256
FALLBACK = {Q.Q4_K: Q.Q5_0, Q.Q5_K: Q.Q5_1, Q.Q6_K: Q.Q8_0}
#: the tensors a mix treats by their position in the file
COUNTED = ("attn_v", "ffn_down")
#: blocks of a model llama.cpp types LLM_TYPE_70B (llama with grouped KV heads, deci, qwen2)
SEVENTY_B_BLOCKS = 80


@dataclass(frozen=True)
class Place:
    """Where a tensor sits, for the K-quant mixes: ``index`` among the file's tensors of its role
    and their ``count`` (attn_v: the attn_v tensors in the file; ffn_down: the blocks), whether the
    file has no ``output.weight`` (``tied``) and whether llama.cpp types the model 70B (``big``)."""

    index: int = 0
    count: int = 1
    tied: bool = False
    big: bool = False


def check_mix_type(gguf_type: str) -> str:
    """``gguf_type`` when this module counts its bytes (the gguf-py types and the mixes of
    :data:`MAIN`); ValueError (one line) for an unknown type or a mix it does not model."""
    if check_gguf_type(gguf_type) in KQUANTS and gguf_type not in MAIN:
        modelled = [t for t in GGUF_TYPES if t not in KQUANTS or t in MAIN]
        raise ValueError(
            f"the bytes of a {gguf_type} file are not modelled (llama.cpp's choice of its tensor types); "
            f"expected one of {', '.join(modelled)}"
        )
    return gguf_type


def use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's choice of the blocks whose attn_v / ffn_down a q4_k_m / q5_k_m mix keeps in Q6_K:
    the first and last eighth and every third block between (C integer division)."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def kquant_fallback(qtype: Q, width: int) -> Q:
    """The type llama.cpp writes a tensor of row width ``width`` in when it chose ``qtype``."""
    block = int(GGML_QUANT_SIZES[qtype][0])
    if width % block == 0:
        return qtype
    fallback = FALLBACK.get(qtype, Q.F16)
    return fallback if width % int(GGML_QUANT_SIZES[fallback][0]) == 0 else Q.F16


def kquant_type(role: str, width: int, gguf_type: str, place: Place) -> Q:
    """The type llama.cpp's quantizer gives a 2-D tensor of ``role`` (its GGUF name less ``blk.N.``
    and ``.weight``: ``token_embd``, ``output``, ``attn_q``, ..., ``ffn_down``) and row width
    ``width`` in the mix ``gguf_type``."""
    if role == "output" or (role == "token_embd" and place.tied):
        return Q.Q8_0 if width % int(GGML_QUANT_SIZES[Q.Q6_K][0]) else Q.Q6_K
    qtype = MAIN[gguf_type]
    if role in COUNTED and gguf_type != "q6_k" and use_more_bits(place.index, place.count):
        qtype = Q.Q6_K
    if role == "attn_v" and place.big and qtype == Q.Q4_K:
        qtype = Q.Q5_K
    return kquant_fallback(qtype, width)


def file_tensor_type(role: str, shape: tuple[int, ...], gguf_type: str, place: Place | None = None) -> Q:
    """The GGML type of a tensor of ``role`` and numpy shape ``shape`` (rows, row width) in a file
    of the requested ``gguf_type``."""
    if check_mix_type(gguf_type) not in KQUANTS:
        return tensor_type(shape, gguf_type)[0]
    if len(shape) != 2:
        return Q.F32
    return kquant_type(role, shape[-1], gguf_type, place or Place())


def tensor_bytes(role: str, shape: tuple[int, ...], gguf_type: str, place: Place | None = None) -> int:
    """Bytes of the data of that tensor (0 for an empty shape: a removed tensor)."""
    if 0 in shape:
        return 0
    return encoded_nbytes(shape, file_tensor_type(role, shape, gguf_type, place))
