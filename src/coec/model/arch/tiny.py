"""The tiny random configs of every family (the tests' models and ``coec tiny-model``'s,
``coec.model.tiny``): family-specific fields live here, with the other family knowledge."""

from __future__ import annotations

from typing import Any

#: The family ``coec tiny-model`` makes when none is named.
DEFAULT_FAMILY = "llama"


def tiny_config(family: str, **over: Any) -> Any:
    """A 2-layer GQA config of the given family (4 query heads, 2 KV heads, head_dim 8); ``over``
    replaces any field."""
    from transformers import AutoConfig  # deferred: keeps the job boundary torch-free

    kw: dict[str, Any] = dict(
        vocab_size=320,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    if family == "granite":  # non-trivial multipliers, so that forgetting one shows
        kw.update(embedding_multiplier=4.0, residual_multiplier=0.5, attention_multiplier=0.25, logits_scaling=2.0)
    kw.update(over)
    return AutoConfig.for_model(family, **kw)
