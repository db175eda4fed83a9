"""Named profiler ranges for the hot blocks, and their per-block totals.

The library marks its blocks with ``span("coec.left")`` / ``@traced("coec.rescale")``
(``torch.profiler.record_function``: near-zero cost when no profiler is running). A benchmark runs
a call under ``torch.profiler.profile`` and reads the totals with ``span_totals``:

    with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        compensate(...)
    for row in span_totals(prof, "coec."): ...
"""

from __future__ import annotations

import functools

from torch.profiler import record_function as span

__all__ = ["span", "traced", "span_totals"]


def traced(name: str):
    """Decorator: run the function inside a fresh ``span(name)`` on every call (thread- and
    re-entrancy-safe, unlike decorating with one shared ``record_function`` instance)."""

    def wrap(fn):
        @functools.wraps(fn)
        def inner(*args, **kwargs):
            with span(name):
                return fn(*args, **kwargs)

        return inner

    return wrap


def span_totals(prof, prefix: str = "coec.") -> list[dict]:
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
