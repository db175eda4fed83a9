"""Named profiler ranges for the hot blocks.

The library marks its blocks with ``span("coec.left")`` / ``@traced("coec.rescale")``
(``torch.profiler.record_function``: near-zero cost when no profiler is running). A benchmark runs
a call under ``torch.profiler.profile`` and reads the totals with ``span_totals``
(benchmarks/timing.py):

    with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        compensate(...)
    for row in span_totals(prof, "coec."): ...
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from torch.profiler import record_function as span

__all__ = ["span", "traced"]

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
