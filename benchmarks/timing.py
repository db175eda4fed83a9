"""Timing helpers the benchmark scripts share: profiler range totals, a device barrier, a GEMM rate."""

from __future__ import annotations

import time
from typing import Any

import torch


def span_totals(prof: torch.profiler.profile, prefix: str = "coec.") -> list[dict[str, Any]]:
    """Inclusive totals of the named ranges (``coec.compensate.profiling.span``) starting with
    ``prefix``, sorted by name.

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
