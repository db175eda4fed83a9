"""Named profiler ranges for the hot blocks, their per-block totals, and the device's GEMM rate.

The library marks its blocks with ``span("coec.left")`` / ``@traced("coec.rescale")``
(``torch.profiler.record_function``: near-zero cost when no profiler is running). A benchmark runs
a call under ``torch.profiler.profile`` and reads the totals with ``span_totals``:

    with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        compensate(...)
    for row in span_totals(prof, "coec."): ...
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

import torch
from torch.profiler import record_function as span

__all__ = ["span", "traced", "span_totals", "device_sync", "gemm_rate"]

_P = ParamSpec("_P")
_R = TypeVar("_R")


def traced(name: str) -> Callable[[Callable[_P, _R]], Callable[_P, _R]]:
    """Decorator: run the function inside a fresh ``span(name)`` on every call (thread- and
    re-entrancy-safe, unlike decorating with one shared ``record_function`` instance)."""

    def wrap(fn: Callable[_P, _R]) -> Callable[_P, _R]:
        @functools.wraps(fn)
        def inner(*args: _P.args, **kwargs: _P.kwargs) -> _R:
            with span(name):
                return fn(*args, **kwargs)

        return inner

    return wrap


def span_totals(prof: torch.profiler.profile, prefix: str = "coec.") -> list[dict[str, Any]]:
    """Inclusive totals of the named ranges starting with ``prefix``, sorted by name.

    Each row: ``name``, ``calls``, ``cpu_s`` (wall time on the host, inclusive of nested ranges;
    on CUDA it covers the device work wherever the block synchronises, which every block here does
    through its ``float()`` reads), ``device_s`` (device kernel time attributed to the range; 0
    without CUDA activity).
    """
    rows = []
    for ev in prof.key_averages():
        if not ev.key.startswith(prefix):
            continue
        dev = getattr(ev, "device_time_total", 0.0) or 0.0
        rows.append({"name": ev.key, "calls": int(ev.count), "cpu_s": ev.cpu_time_total / 1e6, "device_s": dev / 1e6})
    return sorted(rows, key=lambda r: r["name"])


def device_sync(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA); no-op elsewhere."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def gemm_rate(m: int, k: int, n: int, dtype: torch.dtype, device: torch.device) -> float:
    """FLOP/s of an (m, k) x (k, n) GEMM in ``dtype`` on ``device``: best of two timed batches
    (3 products on a CPU, 20 on a GPU) after one warm-up product."""
    a = torch.randn(m, k, device=device).to(dtype)
    b = torch.randn(k, n, device=device).to(dtype)
    a @ b
    device_sync(device)
    reps = 3 if device.type == "cpu" else 20
    best = float("inf")
    for _ in range(2):
        t = time.perf_counter()
        for _ in range(reps):
            a @ b
        device_sync(device)
        best = min(best, (time.perf_counter() - t) / reps)
    return 2.0 * m * k * n / best
