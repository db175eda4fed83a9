"""The speedups a pruned model could reach at most, from what one token costs (docs/deploy.md):

* decode (batch 1) reads every weight once per token: the bound is the ratio of weight bytes read
  per decoded token, dense / pruned, for the same tensor types (the KV cache is left out);
* prefill is compute: the bound is the ratio of FLOPs per prompt token, with the convention of
  ``coec.report.cost.flops_per_token`` (2 FLOPs per weight, the embedding lookup free and the head a
  matmul, plus the attention scores: 4 x heads x head_dim x the cached context, here the mean
  context of a causal prompt, (P + 1) / 2).

Both are read from the exported GGUF file itself (tensor shapes and bytes, per-layer head
counts), so cells with per-layer widths are counted as they are.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import gguf


def _reader(path: str | Path) -> gguf.GGUFReader:
    import gguf  # deferred: gguf (~0.3 s), only the llama.cpp runtimes need it

    return gguf.GGUFReader(str(path))


def _field(r: gguf.GGUFReader, key: str) -> Any:
    f = r.get_field(key)
    return None if f is None else f.contents()


def gguf_read_bytes(path: str | Path) -> int:
    """Bytes of tensors one decoded token reads: every tensor of the file, less the token
    embedding but one row when an untied ``output.weight`` is the head."""
    r = _reader(path)
    tensors = {t.name: t for t in r.tensors}
    total = sum(int(t.n_bytes) for t in r.tensors)
    if "output.weight" in tensors:
        emb = tensors["token_embd.weight"]
        total -= int(emb.n_bytes) - int(emb.n_bytes) // int(emb.shape[1])
    return total


def gguf_widths(path: str | Path) -> dict[str, Any]:
    """{'arch', 'layers', 'heads' (per layer), 'head_dim'} of a GGUF file (scalar head counts are
    repeated per layer)."""
    r = _reader(path)
    arch = _field(r, "general.architecture")
    layers = int(_field(r, f"{arch}.block_count"))
    heads = _field(r, f"{arch}.attention.head_count")
    heads = list(heads) if isinstance(heads, list) else [int(heads)] * layers
    return {
        "arch": arch,
        "layers": layers,
        "heads": [int(h) for h in heads],
        "head_dim": int(_field(r, f"{arch}.attention.key_length")),
    }


def gguf_flops_per_token(path: str | Path, context: float) -> float:
    """FLOPs of one token's forward pass attending to ``context`` cached tokens: 2 per weight
    (matrices, biases and norms; the token embedding only as a tied head), plus
    4 x heads x head_dim x context per layer."""
    r = _reader(path)
    names = {t.name for t in r.tensors}
    weights = sum(
        int(math.prod(int(s) for s in t.shape))
        for t in r.tensors
        if t.name != "token_embd.weight" or "output.weight" not in names
    )
    w = gguf_widths(path)
    heads: int = sum(w["heads"])
    head_dim = int(w["head_dim"])
    return 2.0 * weights + 4.0 * heads * head_dim * context


def prefill_context(prompt_tokens: int) -> float:
    """The mean number of tokens a prompt position attends to (itself included), causal."""
    return (prompt_tokens + 1) / 2
