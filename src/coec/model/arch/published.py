"""Published architectures (the paper's Table 4 and a few more), as config.json numbers."""

from __future__ import annotations

from typing import Any


def _arch(model_type: str, sizes: tuple[int, int, int, int, int, int], bias: bool = False) -> dict[str, Any]:
    """One architecture's config.json numbers: ``sizes`` = (hidden_size, layers, query heads,
    KV heads, intermediate_size, vocab_size); head_dim 128, untied embeddings; ``bias``: q/k/v."""
    h, n_layers, nh, nkv, ff, vocab = sizes
    return {
        "model_type": model_type,
        "hidden_size": h,
        "num_hidden_layers": n_layers,
        "num_attention_heads": nh,
        "num_key_value_heads": nkv,
        "head_dim": 128,
        "intermediate_size": ff,
        "vocab_size": vocab,
        "tie_word_embeddings": False,
        "attention_bias": bias,
    }


# Published config.json numbers (from the public hub configs). ``attention_bias`` for Qwen2.5
# records the q/k/v biases that Qwen2 always has (its config.json has no such key); head_dim is
# written out explicitly (Llama-2 and Mistral-7B-v0.1 configs leave it implicit = hidden/heads).
PUBLISHED_ARCHS: dict[str, dict[str, Any]] = {
    "Llama-3.1-8B": _arch("llama", (4096, 32, 32, 8, 14336, 128256)),
    "Llama-3-70B": _arch("llama", (8192, 80, 64, 8, 28672, 128256)),
    "Qwen2.5-7B": _arch("qwen2", (3584, 28, 28, 4, 18944, 152064), bias=True),
    "Qwen2.5-14B": _arch("qwen2", (5120, 48, 40, 8, 13824, 152064), bias=True),
    "Qwen2.5-32B": _arch("qwen2", (5120, 64, 40, 8, 27648, 152064), bias=True),
    "Qwen2.5-72B": _arch("qwen2", (8192, 80, 64, 8, 29568, 152064), bias=True),
    "Llama-2-7B": _arch("llama", (4096, 32, 32, 32, 11008, 32000)),
    "Llama-2-13B": _arch("llama", (5120, 40, 40, 40, 13824, 32000)),
    "Llama-2-70B": _arch("llama", (8192, 80, 64, 8, 28672, 32000)),
    "Qwen3-8B": _arch("qwen3", (4096, 36, 32, 8, 12288, 151936)),
    "Qwen3-14B": _arch("qwen3", (5120, 40, 40, 8, 17408, 151936)),
    "Qwen3-32B": _arch("qwen3", (5120, 64, 64, 8, 25600, 151936)),
    "Mistral-7B-v0.1": _arch("mistral", (4096, 32, 32, 8, 14336, 32000)),
}
