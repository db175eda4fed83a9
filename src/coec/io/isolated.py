"""Run one call in a fresh process, so that a native library that crashes (llama.cpp's AMX matmul
segfaults on some CPUs, docs/deploy.md "llama.cpp on AMX CPUs") raises one line in the caller
instead of killing it (pytest, a Snakemake job, the table harness).

``call_isolated(fn, *args)`` pickles ``fn`` (a module-level function) and its arguments to a
``spawn`` child, which returns the result or the exception it raised; a child that dies raises
:class:`ProcessCrashed` with the signal's name.
"""

from __future__ import annotations

import multiprocessing as mp
import signal
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any


class ProcessCrashed(RuntimeError):
    """A child process died (a signal or a non-zero exit) before it returned its result."""

    def __init__(self, message: str, exitcode: int | None):
        super().__init__(message)
        self.exitcode = exitcode
        self.signal = signal_name(exitcode)


def signal_name(returncode: int | None) -> str | None:
    """'SIGSEGV' for a process killed by signal 11 (return code -11, or a shell's 139); None
    for a clean or an ordinary non-zero exit."""
    if returncode is None:
        return None
    num = -returncode if returncode < 0 else returncode - 128 if 128 < returncode < 160 else 0
    if not num:
        return None
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def describe_exit(returncode: int | None) -> str:
    """'SIGSEGV (signal 11)', 'exit code 3' or 'no exit code'."""
    name = signal_name(returncode)
    if name and returncode is not None:
        return f"{name} (signal {abs(returncode) if returncode < 0 else returncode - 128})"
    return "no exit code" if returncode is None else f"exit code {returncode}"


def _child(conn: Connection, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    try:
        out = (True, fn(*args, **kwargs))
    except BaseException as exc:  # noqa: BLE001 - every error goes back to the caller
        out = (False, exc)
    try:
        conn.send(out)
    except Exception as exc:  # an unpicklable result or exception
        conn.send((False, RuntimeError(f"{type(exc).__name__}: {exc} (sending back {type(out[1]).__name__})")))
    conn.close()


def call_isolated(fn: Callable[..., Any], *args: Any, what: str | None = None, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` run in a spawned child process; its result, or its exception
    re-raised here. A child that dies raises ProcessCrashed('<what> died with SIGSEGV (signal
    11)'), ``what`` defaulting to the function's name."""
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(child, fn, args, kwargs), daemon=True)
    proc.start()
    child.close()
    try:
        ok, payload = parent.recv()  # before join: a large result must not fill the pipe
    except EOFError:
        proc.join()
        label = what or getattr(fn, "__qualname__", repr(fn))
        raise ProcessCrashed(f"{label} died with {describe_exit(proc.exitcode)}", proc.exitcode) from None
    finally:
        parent.close()
    proc.join()
    if not ok:
        raise payload
    return payload
