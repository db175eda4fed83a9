"""An lm-eval ``LM`` that scores all of a run's loglikelihood requests layer by layer.

lm-eval hands an ``LM`` every loglikelihood request of every task at once. :class:`LayerwiseLM`
is lm-eval's ``HFLM`` (same tokenisation, same request order, batching, truncation and padding,
same log-softmax and continuation scoring: those are HFLM's own code, run unchanged) whose model
call is served layer-sequentially: before HFLM's loop runs, the batches it is going to form are
planned (:meth:`LayerwiseLM.plan`, HFLM's causal batching), all of them are pushed through a
:class:`~coec.model.streamed.StreamedModel` one resident decoder layer at a time
(:class:`~coec.evaluate.layerwise.LayerSequential`, in groups that fit a host-memory budget),
and each call of ``_model_call`` receives the next batch's logits. Every call checks that its
batch is the planned one, so a change in lm-eval's batching fails loudly instead of scoring the
wrong rows. A batch's forward is the model's own, so the per-sample loglikelihoods match
``HFLM`` on the loaded model (bit for bit on the CPU in the tests).

Only loglikelihood requests (the multiple-choice tasks of ``coec.evaluate.tasks``) are served;
``generate_until`` is refused with one line.
"""

from __future__ import annotations

from typing import Any

import torch
from lm_eval.models.huggingface import HFLM, Collator, pad_and_concat  # the names HFLM uses

from coec.evaluate.layerwise import LayerSequential


class _Served:
    """The planned batches and the iterator of their logits, handed out in order."""

    def __init__(self, plan: list[torch.Tensor], logits: Any) -> None:
        self.plan, self.logits, self.k = plan, logits, 0

    def next(self, inps: torch.Tensor) -> torch.Tensor:
        if self.k >= len(self.plan) or not torch.equal(inps.cpu(), self.plan[self.k]):
            raise RuntimeError(
                f"lm-eval asked for a batch other than the planned batch {self.k}: "
                "its loglikelihood batching changed (LayerwiseLM.plan)"
            )
        self.k += 1
        logits: torch.Tensor = next(self.logits)
        return logits


class LayerwiseLM(HFLM):  # type: ignore[misc]  # lm_eval ships no type information
    """``HFLM`` over a :class:`StreamedModel`, scoring layer by layer (module docstring).

    ``budget_bytes``: host memory for the hidden states of one group of batches."""

    def __init__(
        self,
        sm: Any,
        tokenizer: Any,
        batch_size: int = 8,
        max_length: int = 2048,
        budget_bytes: float = float("inf"),
        progress: bool = True,
    ) -> None:
        super().__init__(pretrained=sm.model, tokenizer=tokenizer, batch_size=batch_size, max_length=max_length)
        self._device = sm.device
        self.sm = sm
        self.runner = LayerSequential(sm, budget_bytes, progress, desc="zero-shot")
        self._served: _Served | None = None

    def plan(self, requests: Any) -> list[torch.Tensor]:
        """The token batches (b, T) HFLM's ``_loglikelihood_tokens`` forms for ``requests``
        (causal models): requests sorted by length, longest first, one per shared
        context + continuation[:-1] when logits are cached, ``batch_size`` a batch, each input
        the last ``max_length + 1`` tokens less the final one, right-padded to the longest."""
        if self.batch_size == "auto":
            raise ValueError("layer-sequential scoring needs a fixed batch size, not 'auto'")

        def by_length(req: Any) -> Any:
            toks = req[1] + req[2]
            return -len(toks), tuple(toks)

        re_ord = Collator(
            requests,
            sort_fn=by_length,
            group_fn=lambda req: req[-2] + req[-1][:-1],
            group_by="contexts" if self.logits_cache else None,
        )
        batches = []
        for chunk in re_ord.get_batched(n=self.batch_size, batch_fn=None):
            inps = [
                torch.tensor((ctx + cont)[-(self.max_length + 1) :][:-1], dtype=torch.long) for _, ctx, cont in chunk
            ]
            batches.append(pad_and_concat(max(len(x) for x in inps), inps, padding_side="right"))
        return batches

    def _loglikelihood_tokens(self, requests: Any, disable_tqdm: bool = False, override_bs: int | None = None) -> Any:
        if self.backend != "causal":
            raise ValueError(f"layer-sequential scoring serves causal LMs, not {self.backend}")
        plan = self.plan(requests)
        self._served = _Served(plan, self.runner.logits(plan))
        try:
            return super()._loglikelihood_tokens(requests, disable_tqdm, override_bs)
        finally:
            self._served = None

    def _model_call(self, inps: torch.Tensor, attn_mask: Any = None, labels: Any = None) -> torch.Tensor:
        if self._served is None or attn_mask is not None or labels is not None:
            raise RuntimeError("LayerwiseLM serves only the model calls of _loglikelihood_tokens")
        return self._served.next(inps)

    def generate_until(self, requests: Any, disable_tqdm: bool = False) -> None:
        raise ValueError("layer-sequential zero-shot scores loglikelihood tasks only, not generation (generate_until)")

    def get_model_info(self) -> dict[str, Any]:
        """HFLM's record, with the parameter count of the (pruned) model as it streamed."""
        info: dict[str, Any] = super().get_model_info()
        if len(self.sm.layer_params) == self.sm.n_layers:
            info["model_num_parameters"] = self.sm.param_count()
        return info
