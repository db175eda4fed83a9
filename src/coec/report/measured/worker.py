"""One measurement in a process of its own, so that its peak resident memory is its own:

    python -m coec.report.measured.worker '<json spec>'

Spec: ``runtime`` (``transformers`` | ``llama.cpp``), ``dtype`` (transformers: float32 |
bfloat16; llama.cpp: the GGUF's type, recorded only), ``path`` (an HF folder or a GGUF file) or,
for a cell no HF class can hold (per-layer widths), ``build`` = {model, keep, comp} (the cell
assembled in memory as ``coec ppl`` does), ``prompt`` (token ids), ``new_tokens``, ``threads``
and ``device`` (transformers). Prints one line ``COEC_TIMING {json}``: prefill_s, decode_s,
peak_rss_mb, read_bytes (weights read per decoded token), total_s; for llama.cpp, extra_bufts
(False where the AMX guard loaded without llama.cpp's extra CPU buffers).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import torch

from coec.report.measured.bounds import gguf_read_bytes
from coec.report.measured.timing import load_llamacpp, peak_rss_mb, time_llamacpp, time_transformers, torch_read_bytes

MARK = "COEC_TIMING "


def _transformers(spec: dict[str, Any]) -> dict[str, Any]:
    torch.set_num_threads(spec["threads"])
    dtype = getattr(torch, spec["dtype"])
    device = spec.get("device", "cpu")
    if spec.get("path"):
        from transformers import AutoModelForCausalLM  # deferred: a llama.cpp run's peak memory without it

        model = AutoModelForCausalLM.from_pretrained(spec["path"], dtype=dtype)
    else:
        from coec.model.cell import build_model  # deferred: a llama.cpp run's peak memory without it

        b = spec["build"]
        model, _ = build_model(b["model"], spec["dtype"], "cpu", b.get("keep"), b.get("comp") or [])
    model = model.to(device).eval()
    out = time_transformers(model, spec["prompt"], spec["new_tokens"])
    return {**out, "read_bytes": torch_read_bytes(model)}


def _llamacpp(spec: dict[str, Any]) -> dict[str, Any]:
    n = len(spec["prompt"])
    llm = load_llamacpp(spec["path"], n + spec["new_tokens"] + 8, n, spec["threads"])
    try:
        out = time_llamacpp(llm, spec["prompt"], spec["new_tokens"])
        extra_bufts = bool(llm.model_params.use_extra_bufts)  # what the model was loaded with
    finally:
        llm.close()
    return {**out, "read_bytes": gguf_read_bytes(spec["path"]), "extra_bufts": extra_bufts}


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one measurement in this process (load, warm up, time once)."""
    t0 = time.perf_counter()
    run = _transformers if spec["runtime"] == "transformers" else _llamacpp
    out = run(spec)
    out["peak_rss_mb"] = peak_rss_mb()
    out["total_s"] = time.perf_counter() - t0
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    spec = json.loads(argv[0])
    os.environ.setdefault("OMP_NUM_THREADS", str(spec["threads"]))
    print(MARK + json.dumps(measure(spec)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
