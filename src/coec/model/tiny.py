"""Tiny random decoder models with an offline tokenizer, saved as a hub checkpoint would be: what
the tests run on and what ``coec tiny-model`` gives a new method (``coec.model.starter``).

    make_model_dir(path, "llama")   # config.json, model.safetensors, tokenizer files

The model: 2 layers of GQA attention (4 query heads, 2 KV heads, head_dim 8, hidden 32, MLP 48,
vocabulary 320), drawn from ``seed``; the tokenizer: a byte-level BPE of 300 tokens trained on
``tokenizer_text`` (deterministic, no download).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

from coec.model.arch import ADAPTERS
from coec.model.arch.tiny import tiny_config

#: The default tokenizer text (and the tests' calibration text).
CORPUS = (
    "The quick brown fox jumps over the lazy dog. Structured pruning removes whole columns "
    "of weight matrices, attention heads and channels. A smaller dense model runs on standard "
    "hardware without sparse kernels. Calibration statistics come from a small text sample. "
) * 20


def families() -> list[str]:
    """The model families a tiny model can be made of: every one the pruning surgery supports."""
    return list(ADAPTERS.keys())


def make_tokenizer(path: str | Path, text: str = CORPUS) -> Any:
    """A byte-level BPE tokenizer (300 tokens, ``<eos>`` also the padding) trained on ``text``,
    saved into ``path``; returns it (a ``PreTrainedTokenizerFast``)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<eos>"],
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator([text], trainer)
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]  # transformers: untyped __init__
        tokenizer_object=tok, eos_token="<eos>", pad_token="<eos>"
    )
    fast.save_pretrained(path)
    return fast


def make_model_dir(
    path: str | Path,
    family: str,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    tokenizer_text: str = CORPUS,
    **over: Any,
) -> Path:
    """Save a randomly initialised tiny model (``tiny_config``) and its tokenizer
    (``make_tokenizer`` on ``tokenizer_text``) into ``path``; biases (Qwen2's q/k/v) are drawn
    non-zero so that slicing them shows."""
    torch.manual_seed(seed)
    config = tiny_config(family, **over)
    model = AutoModelForCausalLM.from_config(config).to(dtype)  # type: ignore[no-untyped-call]  # transformers: untyped
    for name, p in model.named_parameters():
        if name.endswith("bias"):
            torch.nn.init.normal_(p, std=0.1)
    model.save_pretrained(path)
    make_tokenizer(path, tokenizer_text)
    return Path(path)
