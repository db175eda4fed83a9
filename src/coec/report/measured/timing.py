"""Timing one model on one runtime: a prefill of a prompt from an empty cache, then greedy decoding
of new tokens one at a time with the KV cache, batch 1 (docs/deploy.md).

Both runtimes are timed the same way: wall-clock seconds (``time.perf_counter``), and this
process's CPU seconds (``time.process_time``, every thread), of the prefill
forward pass (the prompt's tokens in one batch) and of ``new_tokens`` single-token steps, each
step's next token the argmax of the previous step's logits (the sampling a runtime does on top is
the same for a dense and a pruned model and is left out). End-of-sequence tokens are ignored, so
every run decodes exactly ``new_tokens`` tokens. A short warm-up (first kernels, allocations)
precedes the timed run. With one thread the CPU seconds are what the run costs whatever else
the machine runs (the wall clock then also counts the time other processes held the core).
"""

from __future__ import annotations

import resource
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from coec.evaluate.llamacpp.run import open_gguf
from coec.model.arch import weight_of
from coec.model.arch.gguf import bindings_last_logits

if TYPE_CHECKING:
    from transformers import PreTrainedModel

Clocks = tuple[float, float]  # (wall seconds, CPU seconds)

WARMUP_PROMPT, WARMUP_STEPS = 16, 4


def _clocks() -> tuple[float, float]:
    """(wall seconds, this process's CPU seconds)."""
    return time.perf_counter(), time.process_time()


def _result(t0: Clocks, t1: Clocks, t2: Clocks) -> dict[str, float]:
    """Wall and CPU seconds of the prefill (t0 -> t1) and of the decode steps (t1 -> t2)."""
    return {
        "prefill_s": t1[0] - t0[0],
        "decode_s": t2[0] - t1[0],
        "prefill_cpu_s": t1[1] - t0[1],
        "decode_cpu_s": t2[1] - t1[1],
    }


def _argmax_next(logits: torch.Tensor) -> int:
    return int(logits[0, -1].argmax())


def time_transformers(model: PreTrainedModel, prompt: list[int], new_tokens: int) -> dict[str, float]:
    """{'prefill_s', 'decode_s', 'prefill_cpu_s', 'decode_cpu_s'} of a transformers causal LM (on
    its device) for ``prompt`` (token ids) and ``new_tokens`` greedy steps."""
    device = next(model.parameters()).device
    sync: Callable[[], None] = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def run(ids: list[int], steps: int) -> tuple[Clocks, Clocks, Clocks]:
        x = torch.tensor([ids], device=device)
        with torch.inference_mode():
            sync()
            t0 = _clocks()
            out = model(input_ids=x, use_cache=True)
            nxt = _argmax_next(out.logits)
            sync()
            t1 = _clocks()
            cache = out.cache  # transformers 5: ``cache`` (formerly ``past_key_values``)
            for _ in range(steps):
                out = model(input_ids=torch.tensor([[nxt]], device=device), cache=cache, use_cache=True)
                cache, nxt = out.cache, _argmax_next(out.logits)
            sync()
            t2 = _clocks()
        return t0, t1, t2

    run(prompt[:WARMUP_PROMPT], WARMUP_STEPS)
    return _result(*run(prompt, new_tokens))


def load_llamacpp(path: str, n_ctx: int, n_batch: int, threads: int) -> Any:
    """A llama.cpp context on a GGUF file for timing: default KV cache and attention settings (what
    a deployment gets), ``threads`` for both the prompt and the decode steps."""
    return open_gguf(
        path,
        n_ctx=n_ctx,
        n_batch=n_batch,
        n_ubatch=n_batch,
        n_threads=threads,
        n_threads_batch=threads,
        logits_all=False,
        verbose=False,
    )


def time_llamacpp(llm: Any, prompt: list[int], new_tokens: int) -> dict[str, float]:
    """Wall and CPU seconds of prefill and decode of a llama.cpp context (``load_llamacpp``), as
    :func:`time_transformers` times a transformers model."""

    def run(ids: list[int], steps: int) -> tuple[Clocks, Clocks, Clocks]:
        llm.reset()
        t0 = _clocks()
        llm.eval(ids)
        nxt = int(bindings_last_logits(llm).argmax())
        t1 = _clocks()
        for _ in range(steps):
            llm.eval([nxt])
            nxt = int(bindings_last_logits(llm).argmax())
        t2 = _clocks()
        return t0, t1, t2

    run(prompt[:WARMUP_PROMPT], WARMUP_STEPS)
    return _result(*run(prompt, new_tokens))


def peak_rss_mb() -> float:
    """This process's peak resident memory (VmHWM) in MiB; getrusage where /proc is absent."""
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def torch_read_bytes(model: PreTrainedModel) -> int:
    """Bytes of weights one decoded token reads in a transformers model: every parameter once
    (a tied head counted once, as the head), less the input embedding when the head is untied
    (the lookup reads one row)."""
    seen, total = set(), 0
    for p in model.parameters():
        if p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            total += p.numel() * p.element_size()
    emb = weight_of(model.get_input_embeddings())
    head = weight_of(model.get_output_embeddings())  # type: ignore[no-untyped-call]  # transformers: untyped
    if emb.data_ptr() != head.data_ptr():
        total -= emb.numel() * emb.element_size() - emb.shape[1] * emb.element_size()
    return total
