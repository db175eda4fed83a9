"""Run a GGUF file through a real llama.cpp (the ``llama-cpp-python`` bindings): per-token logits
and perplexity over the same windows, with the same NLL sum, as ``coec.evaluate.ppl`` scores the
in-memory model (docs/export.md "GGUF").

The KV cache is kept in f32 (llama.cpp's default is f16), so an f32 GGUF is compared against
the fp32 model without a 16-bit rounding of every key and value; flash attention stays off.
The bindings are an optional dependency (``bash scripts/setup.sh --llamacpp`` builds llama.cpp
from source): :func:`unavailable` says why it cannot be imported. Every model is opened by
:func:`open_gguf` (the AMX guard of ``llamacpp_amx``); :func:`gguf_logits` and
:func:`gguf_perplexity` evaluate in a child process, so that a llama.cpp crash raises
``coec.io.isolated.ProcessCrashed`` ("... died with SIGSEGV (signal 11)") instead of killing the caller.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from coec.evaluate.kl import KlMeter
from coec.evaluate.llamacpp.amx import ENV, extra_buffers_off, keep_extra_buffers
from coec.evaluate.ppl import ppl_summary, summed_nll
from coec.io.isolated import call_isolated
from coec.model.arch.gguf import bindings_model_class

log = logging.getLogger(__name__)

GGML_TYPE_F32 = 0  # ggml_type of the KV cache (type_k / type_v)


def unavailable() -> str | None:
    """Why the llama-cpp-python bindings cannot be imported (None: they can)."""
    try:
        bindings_model_class()
    except Exception as exc:  # an ImportError, or a shared library that does not load
        return f"llama-cpp-python is not importable: {type(exc).__name__}: {exc}"
    return None


def open_gguf(path: str | Path, **kwargs: Any) -> Any:
    """``llama_cpp.Llama(model_path=path, **kwargs)``, with llama.cpp's extra CPU buffers off on
    a CPU with AMX whose bindings were built with AMX (``llamacpp_amx.keep_extra_buffers``)."""
    model_class = bindings_model_class()
    if keep_extra_buffers():
        return model_class(model_path=str(path), **kwargs)
    log.warning(
        "llama.cpp: loading %s with use_extra_bufts=False (AMX CPU and AMX build, or %s=off; docs/deploy.md)", path, ENV
    )
    with extra_buffers_off():
        return model_class(model_path=str(path), **kwargs)


def load(path: str | Path, n_ctx: int, n_threads: int | None = None) -> Any:
    """A llama.cpp context on ``path`` that keeps every position's logits (``logits_all``)."""
    return open_gguf(
        path,
        n_ctx=n_ctx,
        n_batch=n_ctx,
        n_ubatch=n_ctx,
        n_threads=n_threads,
        n_threads_batch=n_threads,
        logits_all=True,
        type_k=GGML_TYPE_F32,
        type_v=GGML_TYPE_F32,
        flash_attn=False,
        verbose=False,
    )


def window_logits(llm: Any, tokens: list[int] | torch.Tensor) -> np.ndarray:
    """Logits (n, vocab) float32 of one sequence evaluated from an empty cache; position t
    scores token t + 1."""
    ids = [int(t) for t in (tokens.tolist() if isinstance(tokens, torch.Tensor) else tokens)]
    llm.reset()
    llm.eval(ids)
    return np.array(llm.scores[: llm.n_tokens], dtype=np.float32)


def gguf_logits(path: str | Path, windows: torch.Tensor, n_threads: int | None = None) -> np.ndarray:
    """Logits (n_windows, seqlen, vocab) of every window of token ids (n_windows, seqlen),
    computed in a child process (ProcessCrashed if llama.cpp dies)."""
    logits: np.ndarray = call_isolated(
        _gguf_logits, str(path), windows, n_threads, what=f"llama.cpp on {Path(path).name}"
    )
    return logits


def gguf_perplexity(
    path: str | Path, windows: torch.Tensor, n_threads: int | None = None, kl: KlMeter | None = None
) -> dict[str, Any]:
    """{'ppl', 'nll', 'tokens_scored', 'windows', 'seqlen', 'seconds'} of a GGUF file over
    (n, seqlen) token windows, each scored from an empty cache (``evaluate.ppl.perplexity``'s
    protocol and NLL sum), computed in a child process (ProcessCrashed if llama.cpp dies); with
    ``kl`` (a meter of the dense reference of these windows) also ``kl``, its mean."""
    result: dict[str, Any] = call_isolated(
        _gguf_perplexity, str(path), windows, n_threads, kl, what=f"llama.cpp on {Path(path).name}"
    )
    return result


def _gguf_logits(path: str, windows: torch.Tensor, n_threads: int | None) -> np.ndarray:
    llm = load(path, windows.shape[1], n_threads)
    try:
        return np.stack([window_logits(llm, w) for w in windows])
    finally:
        llm.close()


def _gguf_perplexity(
    path: str, windows: torch.Tensor, n_threads: int | None, kl: KlMeter | None = None
) -> dict[str, Any]:
    t0 = time.time()
    llm = load(path, windows.shape[1], n_threads)
    total, count = 0.0, 0
    try:
        for i, w in enumerate(windows):
            logits = torch.from_numpy(window_logits(llm, w))[None]
            total += float(summed_nll(logits, w[None].long()))
            count += w.numel() - 1
            if kl is not None:
                kl(i, w[None], logits)
    finally:
        llm.close()
    if not math.isfinite(total):
        raise FloatingPointError(f"non-finite NLL from llama.cpp on {path}")
    return {**ppl_summary(total, count, windows, t0), **({"kl": kl.mean()} if kl is not None else {})}


#: How to install the bindings (every message that asks for them names this command).
INSTALL = "bash scripts/setup.sh --llamacpp"


def require(what: str) -> None:
    """Raise ValueError, one line, when the bindings cannot be imported: ``what`` (that needs
    them), why not, and :data:`INSTALL`."""
    why = unavailable()
    if why is not None:
        raise ValueError(f"{what}: {why}; install it with: {INSTALL}")
