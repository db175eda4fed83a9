"""An export format defined outside the package: this file alone, named in ``COEC_PLUGINS`` (or a
config's ``plugins``), adds ``coec export --format safetensors-state`` with its own option
(tests/integration/test_export_formats.py runs it through the CLI).

safetensors-state writes the pruned, compensated model's state dict as one safetensors file,
each tensor in ``--state-dtype`` (default: the model's dtype), with the cell's labels as metadata.
"""

from __future__ import annotations

import json

import torch
from safetensors.torch import save_file

from coec.api import EXPORT_FORMATS, ExportFormat, ExportRequest, FormatOption


def write(request: ExportRequest) -> dict:
    from coec.model.cell import build_model

    model, _ = build_model(request.model, request.dtype, "cpu", request.keep, list(request.comp))
    dtype = getattr(torch, request.options.get("state_dtype") or request.dtype)
    state = {k: v.detach().to(dtype).contiguous() for k, v in model.state_dict().items()}
    save_file(state, request.out, metadata={"cell": json.dumps(dict(request.cell))})
    return {"tensors": len(state), "dtype": str(dtype)}


EXPORT_FORMATS.register(
    ExportFormat(
        "safetensors-state",
        "the model's state dict in one safetensors file",
        write,
        options=(FormatOption("--state-dtype", "state_dtype", "dtype of the stored tensors", ("float32", "bfloat16")),),
    )
)
