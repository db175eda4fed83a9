"""The checked reload after an HF export: the written folder is loaded back the way a user
loads it (``AutoModelForCausalLM.from_pretrained``, no custom code) and its logits compared with
the in-memory cell's (``export_class.check_same_logits``: 1e-4 of the logit scale in fp32, 2e-2 in
16-bit), before the folder is moved into place."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from coec.export.hf_class import check_same_logits


def check_reload(folder: str | Path, reference: PreTrainedModel, n_tokens: int = 8, seed: int = 1) -> float:
    """Max |logit difference| between ``reference`` (the in-memory cell) and the checkpoint in
    ``folder`` reloaded in the reference's dtype on the CPU; ModelError above the tolerance."""
    dtype = next(reference.parameters()).dtype
    reloaded = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype)
    reloaded.eval()  # type: ignore[no-untyped-call]  # transformers: PreTrainedModel.eval is untyped
    try:
        with torch.no_grad():
            return check_same_logits(reference, reloaded, n_tokens, seed)
    finally:
        del reloaded
