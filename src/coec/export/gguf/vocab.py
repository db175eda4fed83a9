"""Tokenizer metadata of a GGUF export: copied from a source GGUF file, or built from a Hugging
Face tokenizer the way llama.cpp's converter does (``convert_hf_to_gguf.py``).

* Byte-level BPE (``tokenizer.json`` model ``BPE`` without byte fallback: GPT-2, Llama-3, Qwen2,
  SmolLM): ``tokenizer.ggml.model = gpt2``, the tokens (ids without a token become ``[PAD<i>]``,
  type UNUSED), their types (CONTROL for special added tokens, USER_DEFINED for other added
  ones), the merges and the special ids (gguf-py's ``SpecialVocab``), and
  ``tokenizer.ggml.pre`` from the converter's hash of the tokenizer's encoding of a check text
  (``coec.model.arch.gguf_pre``). An unknown hash is written as ``gpt-2`` when the pre-tokenizer is
  exactly the GPT-2 byte-level split, else ``default`` with a warning: token ids are unaffected,
  but llama.cpp's own text tokenisation may then differ from the source tokenizer's.
* SentencePiece-style BPE with byte fallback (Llama-2, Mistral): llama.cpp's SPM vocabulary
  (``coec.model.arch.gguf.SPM_TOKENIZER_MODEL``) through gguf-py's byte-fallback reader, as the
  converter's ``_set_vocab_llama_hf``.
"""

from __future__ import annotations

import json
import logging
import tempfile
from hashlib import sha256
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gguf

from coec.model.arch.gguf import SPLIT_REGEX_PRE, SPM_TOKENIZER_MODEL, byte_fallback_vocab
from coec.model.arch.gguf_pre import CHECK_TEXT, PRE_BY_HASH

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)


def gguf_tokenizer_fields(path: str | Path) -> list[tuple[str, Any, gguf.GGUFValueType, gguf.GGUFValueType | None]]:
    """Every ``tokenizer.*`` key of a GGUF file as (key, value, type, array item type)."""
    reader = gguf.GGUFReader(str(path))
    out = []
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        out.append((key, field.contents(), vtype, sub))
    if not any(k == gguf.Keys.Tokenizer.MODEL for k, *_ in out):
        raise ValueError(f"{path}: no tokenizer.ggml.model key, not a GGUF file with a tokenizer")
    return out


def copy_gguf_tokenizer(writer: gguf.GGUFWriter, path: str | Path, n_vocab: int) -> dict[str, Any]:
    """Copy the tokenizer keys of a source GGUF file; its token list must have ``n_vocab``
    entries (the embedding's rows)."""
    fields = gguf_tokenizer_fields(path)
    tokens = next((v for k, v, *_ in fields if k == gguf.Keys.Tokenizer.LIST), None)
    if tokens is None or len(tokens) != n_vocab:
        raise ValueError(
            f"{path}: the tokenizer lists {len(tokens or [])} tokens, the model's embedding has {n_vocab} rows"
        )
    for key, value, vtype, sub in fields:
        writer.add_key_value(key, value, vtype, sub_type=sub)
    model = next(v for k, v, *_ in fields if k == gguf.Keys.Tokenizer.MODEL)
    pre = next((v for k, v, *_ in fields if k == gguf.Keys.Tokenizer.PRE), None)
    return {"source": str(path), "model": model, "pre": pre, "tokens": len(tokens)}


def _split_stages(pre: dict[str, Any]) -> list[dict[str, Any]]:
    stages: list[dict[str, Any]] = (
        pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre] if pre else []
    )
    return stages


def pre_tokenizer_name(tokenizer: PreTrainedTokenizerBase, tokenizer_json: dict[str, Any]) -> tuple[str, str]:
    """(``tokenizer.ggml.pre``, how it was found) of a byte-level BPE tokenizer: the converter's
    hash table, else a pre-tokenizer recognised by its exact split (GPT-2's byte-level regex,
    Qwen2's or Llama-3's split regex followed by a plain byte-level step), else ``default``."""
    chkhsh = sha256(str(tokenizer.encode(CHECK_TEXT)).encode()).hexdigest()
    if chkhsh in PRE_BY_HASH:
        return PRE_BY_HASH[chkhsh], f"converter hash {chkhsh[:12]}"
    stages = _split_stages(tokenizer_json.get("pre_tokenizer") or {})
    norm = (tokenizer_json.get("normalizer") or {}).get("type")
    if len(stages) == 1 and stages[0].get("type") == "ByteLevel" and stages[0].get("use_regex", True) and norm is None:
        return "gpt-2", "GPT-2 byte-level split (hash not in llama.cpp's table)"
    if (
        len(stages) == 2
        and stages[0].get("type") == "Split"
        and stages[1].get("type") == "ByteLevel"
        and not stages[1].get("use_regex", True)
        and norm in (None, "NFC")
    ):
        regex = (stages[0].get("pattern") or {}).get("Regex")
        if regex in SPLIT_REGEX_PRE:
            return SPLIT_REGEX_PRE[regex], (f"{SPLIT_REGEX_PRE[regex]} split regex (hash not in llama.cpp's table)")
    log.warning(
        "tokenizer pre-tokenizer not known to llama.cpp (hash %s): writing 'default'; "
        "token ids are exact, llama.cpp's text tokenisation may differ",
        chkhsh[:12],
    )
    return "default", f"unknown (hash {chkhsh[:12]}): llama.cpp text tokenisation may differ"


def bpe_tokens(tokenizer: PreTrainedTokenizerBase, n_vocab: int) -> tuple[list[str], list[int]]:
    """(tokens, token types) of ids 0..n_vocab-1 (``TextModel.get_vocab_base``)."""
    vocab = tokenizer.get_vocab()
    if max(vocab.values()) >= n_vocab:
        raise ValueError(
            f"the tokenizer has ids up to {max(vocab.values())}, the model's embedding only {n_vocab} rows"
        )
    reverse = {i: t for t, i in vocab.items()}
    added = tokenizer.get_added_vocab()
    decoder = tokenizer.added_tokens_decoder
    tokens: list[str] = []
    types: list[int] = []
    for i in range(n_vocab):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
            continue
        tok = reverse[i]
        if tok in added:
            special = decoder[i].special if i in decoder else False
            types.append(gguf.TokenType.CONTROL if special else gguf.TokenType.USER_DEFINED)
        else:
            types.append(gguf.TokenType.NORMAL)
        tokens.append(tok)
    return tokens, types


def byte_fallback_tokens(folder: Path, n_vocab: int) -> tuple[list[bytes], list[float], list[int]]:
    """(tokens, scores, types) of a byte-fallback BPE tokenizer (``arch.gguf.byte_fallback_vocab``),
    padded with UNUSED ``[PAD<i>]`` entries up to ``n_vocab``."""
    vocab = byte_fallback_vocab(folder)
    tokens: list[bytes] = []
    scores: list[float] = []
    types: list[int] = []
    for text, score, ttype in vocab.all_tokens():
        tokens.append(text)
        scores.append(score)
        types.append(ttype)
    if len(tokens) > n_vocab:
        raise ValueError(f"the tokenizer has {len(tokens)} tokens, the model's embedding only {n_vocab} rows")
    for i in range(len(tokens), n_vocab):
        tokens.append(f"[PAD{i}]".encode())
        scores.append(-1000.0)
        types.append(gguf.TokenType.UNUSED)
    return tokens, scores, types


def write_hf_tokenizer(writer: gguf.GGUFWriter, tokenizer: PreTrainedTokenizerBase, n_vocab: int) -> dict[str, Any]:
    """Tokenizer keys of a Hugging Face fast tokenizer (saved to a temporary folder first, so
    that gguf-py reads the same ``tokenizer.json`` / ``tokenizer_config.json``)."""
    with tempfile.TemporaryDirectory(prefix="coec-gguf-tok-") as tmp:
        folder = Path(tmp)
        tokenizer.save_pretrained(folder)
        tj_path = folder / "tokenizer.json"
        if not tj_path.is_file():
            raise ValueError(
                "the tokenizer has no tokenizer.json (a fast tokenizer is needed for "
                "the GGUF export); pass a source GGUF's tokenizer instead"
            )
        tj = json.loads(tj_path.read_text(encoding="utf-8"))
        kind = tj.get("model", {}).get("type")
        if kind != "BPE":
            raise ValueError(
                f"tokenizer model {kind!r} is not written by the GGUF export (BPE is); "
                "pass a source GGUF's tokenizer instead"
            )
        if tj["model"].get("byte_fallback"):
            pieces, scores, piece_types = byte_fallback_tokens(folder, n_vocab)
            writer.add_tokenizer_model(SPM_TOKENIZER_MODEL)
            writer.add_tokenizer_pre("default")
            writer.add_token_list(pieces)
            writer.add_token_scores(scores)
            writer.add_token_types(piece_types)
            gguf.SpecialVocab(folder, n_vocab=n_vocab).add_to_gguf(writer, quiet=True)
            return {"model": SPM_TOKENIZER_MODEL, "pre": "default", "tokens": len(pieces), "found": "byte fallback"}
        tokens, types = bpe_tokens(tokenizer, n_vocab)
        pre, found = pre_tokenizer_name(tokenizer, tj)
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre(pre)
        writer.add_token_list(tokens)
        writer.add_token_types(types)
        special = gguf.SpecialVocab(folder, load_merges=True, n_vocab=n_vocab)
        if not special.merges:
            raise ValueError("the BPE tokenizer has no merges; llama.cpp's loader requires tokenizer.ggml.merges")
        special.add_to_gguf(writer, quiet=True)
        return {"model": "gpt2", "pre": pre, "tokens": len(tokens), "found": found}
