"""Layer-sequential evaluation of a streamed model: every batch through one layer, then the next.

:class:`LayerSequential` turns a list of token batches into their logits, batch by batch and in
order, with one decoder layer of a :class:`~coec.model.streamed.StreamedModel` resident at a
time. The batches are taken in groups whose hidden states fit ``budget_bytes`` of host memory;
each group is embedded, run through every layer (each read once per group), and turned into
logits one batch at a time by the final norm and LM head. A group never spills to disk: another
group re-reads the weights instead, which moves fewer bytes than writing and re-reading all
hidden states at every layer whenever the budget holds more than half a layer's weights
(docs/streaming.md). Each batch's forward is the model's own (the masks, positions and rotary
embeddings its forward builds, the same layer calls), so the logits equal
``model(input_ids).logits`` of the loaded model, bit for bit on the CPU.

:func:`perplexity_streamed` is ``coec.evaluate.ppl.perplexity`` over such a model.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from typing import Any, cast

import torch

from coec.calibrate.layer_pass import layer_call, layer_masks
from coec.evaluate.ppl import OnLogits, ppl_summary, summed_nll
from coec.io.progress import bar as progress_bar
from coec.model.streamed import StreamedModel


def group_batches(sizes: list[int], budget_bytes: float) -> list[range]:
    """Consecutive ranges of batch indices whose summed ``sizes`` (bytes) fit the budget; a batch
    larger than the budget forms a group of its own."""
    groups, start, used = [], 0, 0
    for b, size in enumerate(sizes):
        if b > start and used + size > budget_bytes:
            groups.append(range(start, b))
            start, used = b, 0
        used += size
    if sizes:
        groups.append(range(start, len(sizes)))
    return groups


class LayerSequential:
    """Logits of token batches through a streamed model, one resident layer at a time (module
    docstring). ``budget_bytes``: host memory for one group's hidden states."""

    def __init__(
        self, sm: StreamedModel, budget_bytes: float = float("inf"), progress: bool = True, desc: str = "layers"
    ) -> None:
        self.sm = sm
        self.budget = budget_bytes
        self.progress = progress
        self.desc = desc
        self._ctx: dict[int, tuple[Any, ...]] = {}
        self.groups_run = 0

    def _context(self, h: torch.Tensor) -> tuple[Any, ...]:
        """(position ids (1, T), rotary (cos, sin), per-layer masks) for sequences of h's length."""
        T = h.shape[1]
        if T not in self._ctx:
            dev = self.sm.device
            pos = torch.arange(T, device=dev).unsqueeze(0)
            first = h[:1].to(dev)
            self._ctx[T] = (
                pos,
                self.sm.adapter.rotary(self.sm.model)(first, pos),
                layer_masks(self.sm.model, first, pos),
            )
        return self._ctx[T]

    @torch.no_grad()
    def hidden(self, batches: list[torch.Tensor]) -> list[torch.Tensor]:
        """The last decoder layer's outputs (b, T, d), on the host, of every batch (b, T) of
        token ids: embedded, then each layer read once and run over every batch."""
        with self.sm.embedding() as embed:
            hidden = [embed(ids).cpu() for ids in batches]
        dev = self.sm.device
        n = self.sm.n_layers
        for i in progress_bar(range(n), desc=self.desc, unit="layer", disable=not self.progress):
            with self.sm.layer(i) as layer:
                for b, h in enumerate(hidden):
                    pos, pe, masks = self._context(h)
                    hidden[b] = layer_call(layer, h.to(dev), masks[i], pos, pe).cpu()
            del layer, h  # before the next layer is read, not after
        return hidden

    def batch_bytes(self, ids: torch.Tensor) -> int:
        """Host bytes of one batch's hidden states."""
        d: int = self.sm.config.hidden_size
        return ids.numel() * d * torch.empty((), dtype=self.sm.dtype).element_size()

    @torch.no_grad()
    def logits(self, batches: list[torch.Tensor]) -> Iterator[torch.Tensor]:
        """Logits (b, T, V) on the device of every batch (b, T) of token ids, in order."""
        for group in group_batches([self.batch_bytes(ids) for ids in batches], self.budget):
            hidden = cast("list[torch.Tensor | None]", self.hidden([batches[b] for b in group]))
            self.groups_run += 1
            with self.sm.head() as head:
                for k in range(len(hidden)):
                    h, hidden[k] = hidden[k], None
                    yield head(cast(torch.Tensor, h))
                    del h


def perplexity_streamed(
    sm: StreamedModel,
    windows: torch.Tensor,
    batch_size: int = 4,
    budget_bytes: float = float("inf"),
    progress: bool = True,
    on_logits: OnLogits | None = None,
) -> dict[str, Any]:
    """``coec.evaluate.ppl.perplexity`` of a streamed model over (n, seqlen) token windows,
    batched as it batches them: the same ``{'ppl', 'nll', 'tokens_scored', 'windows', 'seqlen',
    'seconds'}``, the same sums in the same order, the same ``on_logits`` calls."""
    t0 = time.time()
    batches = [windows[s : s + batch_size] for s in range(0, windows.shape[0], batch_size)]
    runner = LayerSequential(sm, budget_bytes, progress, desc="perplexity")
    total, count = 0.0, 0
    for b, (ids, logits) in enumerate(zip(batches, runner.logits(batches), strict=False)):
        nll = float(summed_nll(logits, ids.to(logits.device)))
        if on_logits is not None:
            on_logits(b * batch_size, ids, logits)
        del logits
        if not math.isfinite(nll):
            raise FloatingPointError(f"non-finite NLL in perplexity batch starting at window {b * batch_size}")
        total += nll
        count += ids[:, 1:].numel()
    return ppl_summary(total, count, windows, t0)
