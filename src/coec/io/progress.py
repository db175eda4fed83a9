"""Progress of long stages: one helper, the same behaviour everywhere.

``bar(iterable, total=..., desc=..., unit=...)`` returns a tqdm bar (count, rate, elapsed and
ETA) on a terminal, and in a batch log (stderr not a terminal: a Snakemake job log, SLURM, CI)
a plain log line each time another tenth of the total is done (and at least once a minute while
it advances), with the same count and ETA::

    compensate: 3/8 modules (38%) elapsed 01:02 eta 01:43 [layer 1 down_proj]

``COEC_PROGRESS`` chooses: ``1`` (or ``bar``) a tqdm bar even in a log, ``lines`` the log
lines even on a terminal, ``0`` (or ``off``) nothing; unset, the terminal decides.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import IO, Any

from tqdm import tqdm

ENV = "COEC_PROGRESS"
_BAR, _LINES, _OFF = "bar", "lines", "off"
_ALIASES = {
    **dict.fromkeys(("1", "on", "true", "yes", "bar"), _BAR),
    **dict.fromkeys(("0", "off", "false", "no"), _OFF),
    **dict.fromkeys(("lines", "log"), _LINES),
}

log = logging.getLogger("coec.io.progress")


@dataclass(frozen=True)
class Display:
    """How a bar shows: ``leave=False`` marks an inner loop (a bar on a terminal that does not
    stay, no log lines); ``every``: the fraction of the total between log lines; ``stream``: where
    a bar draws and whose terminal-ness picks bar or lines (default stderr)."""

    leave: bool = True
    every: float = 0.1
    stream: IO[str] | None = None


#: An inner loop's display (see :class:`Display`).
INNER = Display(leave=False)


def progress_mode(stream: IO[str] | None = None) -> str:
    """'bar', 'lines' or 'off' from ``COEC_PROGRESS``, else from whether ``stream`` (default
    stderr) is a terminal."""
    env = os.environ.get(ENV, "").strip().lower()
    if env:
        if env not in _ALIASES:
            raise ValueError(f"{ENV}={env!r}: expected 1/bar, lines or 0/off")
        return _ALIASES[env]
    stream = sys.stderr if stream is None else stream
    try:
        return _BAR if stream.isatty() else _LINES
    except (AttributeError, ValueError):  # a closed or file-less stream
        return _LINES


def _unit_plural(unit: str, n: float) -> str:
    """'layer' -> 'layers', 'batch' -> 'batches' (for counts other than 1)."""
    if n == 1 or unit.endswith("s"):
        return unit
    return unit + ("es" if unit.endswith(("ch", "sh", "x")) else "s")


class LogProgress:
    """tqdm's interface (iterate, ``update``, ``set_postfix_str``, ``close``) writing one log
    line per ``display.every`` fraction of ``total`` (the last at the end), and one at an update
    ``interval`` seconds or more after the previous line. ``display.leave=False`` (an inner loop)
    writes nothing."""

    def __init__(
        self,
        iterable: Iterable[Any] | None = None,
        total: float | None = None,
        desc: str = "",
        unit: str = "it",
        display: Display = Display(),
        interval: float = 60.0,
    ):
        if total is None and iterable is not None:
            try:
                total = len(iterable)  # type: ignore[arg-type]
            except TypeError:
                total = None
        self.iterable, self.total, self.desc, self.unit = iterable, total, desc, unit
        self.every, self.interval, self.quiet, self.log = display.every, interval, not display.leave, log
        self.n: float = 0
        self.postfix = ""
        self.t0 = self._last_t = time.monotonic()
        self._next_step, self._closed = 1, False

    def __iter__(self) -> Iterator[Any]:
        try:
            for x in () if self.iterable is None else self.iterable:
                yield x
                self.update(1)
        finally:
            self.close()

    def __len__(self) -> int:
        return int(self.total or 0)

    def __enter__(self) -> LogProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def line(self) -> str:
        """The progress line: count, percent, elapsed, ETA and postfix."""
        el = time.monotonic() - self.t0
        head = f"{self.desc}: " if self.desc else ""
        if self.total:
            frac = self.n / self.total
            eta = el / self.n * (self.total - self.n) if self.n else math.nan
            eta_s = tqdm.format_interval(eta) if math.isfinite(eta) else "?"
            body = (
                f"{self.n:g}/{self.total:g} {_unit_plural(self.unit, self.total)} "
                f"({frac:.0%}) elapsed {tqdm.format_interval(el)} eta {eta_s}"
            )
        else:
            body = f"{self.n:g} {_unit_plural(self.unit, self.n)} elapsed {tqdm.format_interval(el)}"
        return head + body + (f" [{self.postfix}]" if self.postfix else "")

    def _emit(self) -> None:
        self._last_t = time.monotonic()
        if not self.quiet:
            self.log.info("%s", self.line())

    def update(self, n: float = 1) -> None:
        self.n += n
        if self.total:
            step = max(1, math.ceil(self.total * self.every)) if self.every > 0 else self.total
            if self.n >= min(self._next_step * step, self.total):
                self._next_step = int(self.n // step) + 1
                self._emit()
                return
        if time.monotonic() - self._last_t >= self.interval:
            self._emit()

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        self.postfix = s

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if not self.total and self.n:  # the final count of an open-ended loop
            self._emit()


def bar(
    iterable: Iterable[Any] | None = None,
    *,
    total: float | None = None,
    desc: str = "",
    unit: str = "it",
    disable: bool = False,
    display: Display = Display(),
    **tqdm_kw: Any,
) -> Any:
    """A progress bar over ``iterable`` (or one to ``update`` by hand): tqdm on a terminal or
    with ``COEC_PROGRESS=1``, plain log lines (count, percent, ETA) every ``display.every`` of the
    total in a log, nothing with ``disable`` or ``COEC_PROGRESS=0``. Returns a tqdm or a
    :class:`LogProgress` (the same interface)."""
    mode = _OFF if disable else progress_mode(display.stream)
    if mode == _BAR:
        return tqdm(
            iterable,
            total=total,
            desc=desc,
            unit=unit,
            leave=display.leave,
            file=sys.stderr if display.stream is None else display.stream,
            dynamic_ncols=True,
            **tqdm_kw,
        )
    if mode == _LINES:
        return LogProgress(iterable, total=total, desc=desc, unit=unit, display=display)
    return tqdm(iterable, total=total, desc=desc, unit=unit, disable=True)


def _tqdm_like(*args: Any, disable: bool = False, **kw: Any) -> Any:
    """A stand-in for ``tqdm(...)`` calls inside third-party code, routed through ``bar``."""
    iterable = args[0] if args else kw.pop("iterable", None)
    keep = {k: kw[k] for k in ("total", "desc", "unit") if k in kw and kw[k] is not None}
    leave = kw.get("leave")
    if not keep.get("desc"):  # an unnamed helper loop: a bar on a terminal, no log lines
        leave = False
    display = Display() if leave is None else Display(leave=bool(leave))
    return bar(iterable, disable=disable, display=display, **keep)


@contextlib.contextmanager
def routed_tqdm(*modules: Any) -> Iterator[None]:
    """Within the block, the ``tqdm`` name of each module (e.g. lm-eval's HF model, whose
    request loop has its own bar) follows ``bar``'s rules instead of always drawing."""
    saved = [(m, m.tqdm) for m in modules if hasattr(m, "tqdm")]
    for m, _ in saved:
        m.tqdm = _tqdm_like
    try:
        yield
    finally:
        for m, orig in saved:
            m.tqdm = orig
