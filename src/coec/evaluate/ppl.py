"""Perplexity over non-overlapping windows (DESIGN.md "Protocol").

text = "\\n\\n".join(test); tokens split into windows of ``seqlen``; every window is scored
independently; PPL = exp(mean NLL over all predicted tokens), i.e. seqlen - 1 per window.
"""

from __future__ import annotations

import math
import time

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm


@torch.no_grad()
def window_nll(model, windows: torch.Tensor, batch_size: int = 4, device=None,
               progress: bool = True) -> tuple[float, int]:
    """Summed next-token NLL (float64) and number of predicted tokens over ``windows``
    (n, seqlen) of token ids."""
    device = device or next(model.parameters()).device
    total, count = 0.0, 0
    starts = range(0, windows.shape[0], batch_size)
    for s in tqdm(starts, desc="perplexity", unit="batch", disable=not progress):
        ids = windows[s:s + batch_size].to(device)
        logits = model(input_ids=ids).logits  # (b, T, V); position t predicts token t + 1
        if logits.dtype in (torch.float16, torch.bfloat16):
            logits = logits.float()
        labels = torch.roll(ids, -1, dims=1)
        labels[:, -1] = -100  # the last position predicts nothing: no sliced copy of the logits
        nll = F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1),
                              reduction="sum", ignore_index=-100)
        if not torch.isfinite(nll):
            raise FloatingPointError(f"non-finite NLL in perplexity batch starting at window {s}")
        total += float(nll.double())
        count += ids[:, 1:].numel()
    return total, count


def perplexity(model, windows: torch.Tensor, batch_size: int = 4, device=None,
               progress: bool = True) -> dict:
    """{'ppl', 'nll', 'tokens_scored', 'windows', 'seconds'} for (n, seqlen) token windows."""
    t0 = time.time()
    total, count = window_nll(model, windows, batch_size, device, progress)
    nll = total / count
    return {"ppl": math.exp(nll), "nll": nll, "tokens_scored": count,
            "windows": int(windows.shape[0]), "seqlen": int(windows.shape[1]),
            "seconds": round(time.time() - t0, 3)}
