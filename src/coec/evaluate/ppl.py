"""Perplexity over non-overlapping windows (docs/protocol.md "Perplexity").

text = "\\n\\n".join(test); tokens split into windows of ``seqlen``; every window is scored
independently; PPL = exp(mean NLL over all predicted tokens), i.e. seqlen - 1 per window.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from coec.evaluate.options import PplOptions
from coec.io.progress import bar as progress_bar
from coec.model.source import CellSource

#: Called with each batch's first window index, its token ids (b, T) and its logits (b, T, V), after
#: the batch's NLL is summed (e.g. ``evaluate.kl.KlMeter``); it must not change the logits.
OnLogits = Callable[[int, torch.Tensor, torch.Tensor], None]

#: Positions per float32 loss chunk: the loss adds ``2 x LOSS_CHUNK_TOKENS x vocab x 4`` bytes to
#: the forward's peak (1 GiB at a 128k vocabulary), whatever the batch and window length.
LOSS_CHUNK_TOKENS = 1024


def summed_nll(logits: torch.Tensor, ids: torch.Tensor, chunk_tokens: int = LOSS_CHUNK_TOKENS) -> torch.Tensor:
    """Summed next-token NLL (float64 scalar tensor on the logits' device) of ``ids`` (b, T) under
    ``logits`` (b, T, V), position t predicting token t + 1 (b (T - 1) predictions).

    Computed in chunks of at most ``chunk_tokens`` positions of one row: a 16-bit model's
    logits are upcast one chunk at a time (no float32 copy of the whole (b, T, V) block, and the
    log-softmax inside the loss is chunk-sized too); float32/64 logits are used as they are. Rows
    of a contiguous block are contiguous, so the chunks are views until the upcast.
    """
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    total = torch.zeros((), dtype=torch.float64, device=logits.device)
    T = ids.shape[1]
    for i in range(ids.shape[0]):
        for s in range(0, T - 1, chunk_tokens):
            e = min(s + chunk_tokens, T - 1)
            x = logits[i, s:e]
            x = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
            nll = F.cross_entropy(x, ids[i, s + 1 : e + 1], reduction="sum")
            total += nll.double()
    return total


@torch.no_grad()
def window_nll(
    model: torch.nn.Module,
    windows: torch.Tensor,
    batch_size: int = 4,
    device: torch.device | str | None = None,
    progress: bool = True,
    on_logits: OnLogits | None = None,
) -> tuple[float, int]:
    """Summed next-token NLL (float64) and number of predicted tokens over ``windows``
    (n, seqlen) of token ids; ``on_logits`` sees every batch's logits."""
    device = device or next(model.parameters()).device
    # no KV cache for a scoring pass (HF models, whose config knows the flag)
    no_cache = {"use_cache": False} if hasattr(getattr(model, "config", None), "use_cache") else {}
    total, count = 0.0, 0
    starts = range(0, windows.shape[0], batch_size)
    for s in progress_bar(starts, desc="perplexity", unit="batch", disable=not progress):
        ids = windows[s : s + batch_size].to(device)
        logits = model(input_ids=ids, **no_cache).logits  # (b, T, V); position t predicts t + 1
        nll = float(summed_nll(logits, ids.to(logits.device)))
        if on_logits is not None:
            on_logits(s, ids, logits)
        del logits
        if not math.isfinite(nll):
            raise FloatingPointError(f"non-finite NLL in perplexity batch starting at window {s}")
        total += nll
        count += ids[:, 1:].numel()
    return total, count


def perplexity(
    model: torch.nn.Module,
    windows: torch.Tensor,
    batch_size: int = 4,
    device: torch.device | str | None = None,
    progress: bool = True,
    on_logits: OnLogits | None = None,
) -> dict[str, Any]:
    """{'ppl', 'nll', 'tokens_scored', 'windows', 'seconds'} for (n, seqlen) token windows
    (``on_logits``: :func:`window_nll`'s)."""
    t0 = time.time()
    total, count = window_nll(model, windows, batch_size, device, progress, on_logits)
    return ppl_summary(total, count, windows, t0)


def ppl_summary(total: float, count: int, windows: torch.Tensor, t0: float) -> dict[str, Any]:
    """{'ppl', 'nll', 'tokens_scored', 'windows', 'seqlen', 'seconds'} of the summed NLL ``total``
    over ``count`` predicted tokens of the (n, seqlen) ``windows``, timed from ``t0``: the one
    summary of every perplexity (loaded, streamed, llama.cpp)."""
    nll = total / count
    return {
        "ppl": math.exp(nll),
        "nll": nll,
        "tokens_scored": count,
        "windows": int(windows.shape[0]),
        "seqlen": int(windows.shape[1]),
        "seconds": round(time.time() - t0, 3),
    }


def ppl_record(res: dict[str, Any], model: dict[str, Any], source: CellSource, options: PplOptions,
               params: int, t0: float) -> dict[str, Any]:  # fmt: skip
    """``res`` of :func:`perplexity` completed to a ppl.json record, in place; returns it.
    ``model``: the model's provenance; ``source``: the cell (its dtype and labels are recorded);
    ``options``: the windows scored; ``params``: the cell's parameter count; ``t0``: the stage's
    start, for ``total_seconds``. The one builder of ppl.json (loaded, streamed, llama.cpp)."""
    res.update(
        {
            "model": model,
            "dataset": options.dataset,
            "dtype": source.dtype,
            "max_windows": options.max_windows,
            "params": params,
            "cell": source.cell,
            "total_seconds": round(time.time() - t0, 3),
        }
    )
    return res
