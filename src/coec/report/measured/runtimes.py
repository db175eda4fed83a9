"""The runtime configurations the measured deployment table (``coec.report.measured.table``)
compares: name -> (runtime, tensor type). Read by the workflow when it plans the table's GGUF
exports (``coec.workflow.targets.measured``), so no torch or numpy here."""

from __future__ import annotations

from coec.export.formats import GGUF_VARIANTS

RUNTIMES = {
    "transformers-fp32": ("transformers", "float32"),
    "transformers-bf16": ("transformers", "bfloat16"),
    **{f"llamacpp-{t}": ("llama.cpp", t) for t in GGUF_VARIANTS},
}
