"""``coec ppl --gguf``: perplexity of a GGUF file measured in llama.cpp over the same windows
as ``coec ppl`` (the model's HF tokenizer, ``data.eval_windows``) -> a ppl.json record with
``runtime: "llama.cpp"`` (docs/deploy.md "Perplexity in llama.cpp")."""

from __future__ import annotations

import importlib.metadata
import json
import logging
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import gguf
from transformers import AutoTokenizer

from coec.data import text as data
from coec.data.bundled import file_sha256
from coec.evaluate.kl import kl_record
from coec.evaluate.kl_reference import reference_meter
from coec.evaluate.llamacpp.options import GgufPplOptions
from coec.evaluate.llamacpp.run import gguf_perplexity, require
from coec.evaluate.options import PplOptions
from coec.evaluate.ppl import ppl_record
from coec.export.gguf.writer import PROVENANCE_KEY
from coec.io import artifacts
from coec.io.artifacts import log_timings
from coec.model.arch.gguf import file_type_name
from coec.model.load import hub_kwargs, load_config
from coec.model.source import CellSource, resolve_source

log = logging.getLogger(__name__)

IDENTITY = ("weights_sha256", "commit")  # what of model_provenance must match


def field_value(reader: gguf.GGUFReader, key: str) -> Any:
    """A GGUF metadata value (str, number or list), None when absent."""
    f = reader.get_field(key)
    return None if f is None else f.contents()


def gguf_type_of(reader: gguf.GGUFReader) -> str | None:
    """The weight type of a GGUF: coec.export.stage's ``gguf_type``, else general.file_type's name."""
    prov = field_value(reader, PROVENANCE_KEY)
    if prov is not None:
        gguf_type: str | None = json.loads(prov).get("gguf_type")
        return gguf_type
    ft = field_value(reader, "general.file_type")
    return None if ft is None else file_type_name(int(ft))


def gguf_facts(path: str | Path) -> dict[str, Any]:
    """What ``coec ppl --gguf`` reads of a GGUF: provenance, type, parameters, vocabulary,
    block count, embedding length."""
    r = gguf.GGUFReader(str(path))
    arch = field_value(r, "general.architecture")
    prov = field_value(r, PROVENANCE_KEY)
    tokens = field_value(r, "tokenizer.ggml.tokens") or []
    return {
        "provenance": json.loads(prov) if prov is not None else None,
        "gguf_type": gguf_type_of(r),
        "params": int(sum(int(t.n_elements) for t in r.tensors)),
        "tokens": list(tokens),
        "block_count": field_value(r, f"{arch}.block_count"),
        "embedding_length": field_value(r, f"{arch}.embedding_length"),
    }


def other_model_reason(
    facts: dict[str, Any], model_prov: dict[str, Any], cfg: Any, hf_tokens: list[str | None]
) -> str | None:
    """Why the GGUF is not of the model (None: it is): recorded identity when the file carries
    coec.export.stage, else vocabulary, token list, block count, embedding length."""
    prov = facts["provenance"]
    if prov is not None and isinstance(prov.get("model"), dict):
        for key in IDENTITY:
            mine, theirs = prov["model"].get(key), model_prov.get(key)
            if mine != theirs:
                return f"{key} {mine} != {theirs} of"
        return None
    n_file, n_model = len(facts["tokens"]), int(cfg.vocab_size)
    checks = [
        ("vocabulary", n_file, n_model),
        ("block count", facts["block_count"], int(cfg.num_hidden_layers)),
        ("embedding length", facts["embedding_length"], int(cfg.hidden_size)),
    ]
    for what, mine, theirs in checks:
        if mine != theirs:
            return f"{what} {mine} != {theirs} of"
    for i, (a, b) in enumerate(zip(facts["tokens"], hf_tokens, strict=True)):
        if b is not None and a != b:
            return f"token {i} {a!r} != {b!r} of"
    return None


def hf_token_list(tok: Any, n: int) -> list[str | None]:
    """The HF tokenizer's token strings by id (None where an id has none)."""
    by_id: list[str | None] = [None] * n
    for t, i in tok.get_vocab().items():
        if 0 <= i < n:
            by_id[i] = t
    return by_id


def run_ppl_gguf(source: CellSource, options: PplOptions, gguf_file: GgufPplOptions, out: str) -> dict[str, Any]:
    """Perplexity of ``gguf_file.gguf`` in llama.cpp over ``coec ppl``'s windows of
    ``source.model``'s tokenizer -> ppl.json (with runtime, gguf_type, gguf_file, gguf_sha256,
    llama_cpp_python; its ``dtype`` is the GGUF type; with ``options.kl_reference`` also the mean
    token KL to the transformers dense model, ``kl`` and ``kl_reference``). ValueError (nothing
    written): bindings missing, a GGUF of another model, or a KL reference of other windows, of
    another model or of another vocabulary."""
    require("coec ppl --gguf")
    t0 = time.time()
    gguf_path = gguf_file.gguf
    if not Path(gguf_path).is_file():
        raise FileNotFoundError(f"{gguf_path}: no such GGUF file")
    try:
        facts = gguf_facts(gguf_path)
    except (ValueError, OSError) as exc:
        raise ValueError(f"{gguf_path} is not a readable GGUF ({' '.join(str(exc).split())})") from None
    source = resolve_source(source)
    model_dir = source.local.model_dir
    prov = source.provenance()
    tok = AutoTokenizer.from_pretrained(model_dir, **hub_kwargs(*source.hub))
    cfg = load_config(model_dir, *source.hub)
    why = other_model_reason(facts, prov, cfg, hf_token_list(tok, len(facts["tokens"])))
    if why is not None:
        raise ValueError(f"{gguf_path} is a GGUF of another model ({why} {source.model})")
    tokens = data.tokenize_text(tok, data.load_split(options.dataset, "eval"))
    windows = data.eval_windows(tokens, options.seqlen, options.max_windows)
    kl = reference_meter(options.kl_reference, windows, prov, source.model) if options.kl_reference else None
    if kl and len(facts["tokens"]) != kl[0].rows.vocab:
        raise ValueError(
            f"{gguf_path} is a GGUF of another model ({len(facts['tokens'])} tokens, the KL reference "
            f"{options.kl_reference} {kl[0].rows.vocab})"
        )
    res = gguf_perplexity(gguf_path, windows, gguf_file.threads, kl[0] if kl else None)
    kl_mean = res.pop("kl", None)
    res = ppl_record(res, prov, replace(source, dtype=facts["gguf_type"]), options, facts["params"], t0)
    res.update(
        {
            "runtime": "llama.cpp",
            "gguf_type": facts["gguf_type"],
            "gguf_file": str(gguf_path),
            "gguf_sha256": file_sha256(gguf_path),
            "llama_cpp_python": importlib.metadata.version("llama_cpp_python"),
        }
    )
    if kl:
        res.update(kl_record(kl_mean, kl[0].rows, kl[1]))
    log_timings(str(out), res)
    artifacts.write_result(out, res, "ppl")
    log.info("ppl (llama.cpp) %.4f over %d tokens (%s)", res["ppl"], res["tokens_scored"], out)
    return res
