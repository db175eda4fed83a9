"""Solver watchdog (paper App. B): a factorisation that does not return in time is a failure.

App. B: "An SVD watchdog converts cuSOLVER hangs on degenerate slices into recoverable failures
through a timed fallback chain from gesdd to gesvd to CPU double precision." ``watched(fn,
device, name)`` runs one entry of such a chain with a wall-clock limit: the call runs in a daemon
thread (torch releases the GIL inside its kernels) and, on CUDA, on a side stream, not the caller's, so
that a kernel that never finishes blocks neither the caller nor the caller's stream; the caller
then takes the next entry (``linalg.svd``, ``linalg.eigh``). The abandoned call is left running
(CUDA kernels cannot be cancelled); its thread and its stream are never used again (the calls
share one side stream per device, replaced after a hang by one from torch's pool; the pool hands
streams out round-robin, so a hung one is skipped when it comes back).

The limit, in seconds:
- ``with solver_timeout(s):`` (``None`` or ``0`` turns the watchdog off inside the block);
- else the environment variable ``COEC_SOLVER_TIMEOUT`` (``0`` = off), e.g. exported before a
  SLURM submission;
- else ``DEFAULT_TIMEOUT[device type]``: 600 s on CUDA (far above any single factorisation of
  the paper's shapes), off on the CPU (LAPACK does not hang on degenerate input, and a timed-out
  CPU call would keep its cores while the fallback runs).
The last entry of a chain (float64 on the CPU) always runs without a limit.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar, cast

import torch

ENV_VAR = "COEC_SOLVER_TIMEOUT"
DEFAULT_TIMEOUT: dict[str, float | None] = {"cuda": 600.0, "cpu": None}
_UNSET = object()
_override = threading.local()
_hung_streams: set[int] = set()  # CUDA side streams left with a call that never returned
_side_streams: dict[torch.device, torch.cuda.Stream] = {}  # device -> the side stream the watched calls share
_T = TypeVar("_T")


def _side_stream(device: torch.device) -> torch.cuda.Stream:
    """The side stream of ``device`` that watched calls share (one, so the caching allocator
    keeps one extra pool rather than one per stream of torch's pool). After a hang it is
    replaced by a stream from torch's pool that holds no abandoned call (the pool hands its
    streams out round-robin, so a hung one would come back and block every later call)."""
    stream = _side_streams.get(device)
    if stream is not None:
        return stream
    for _ in range(256):
        stream = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]  # (torch's constructor is unannotated)
        if stream.cuda_stream not in _hung_streams:
            _side_streams[device] = stream
            return stream
    raise SolverTimeout(f"every side stream of {device} holds a call that never returned")


def _abandon(device: torch.device, stream: torch.cuda.Stream) -> None:
    _hung_streams.add(stream.cuda_stream)
    _side_streams.pop(device, None)


class SolverTimeout(RuntimeError):
    """A watched solver call did not return within its limit."""


def _seconds(value: str | float, source: str) -> float | None:
    try:
        s = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{source} must be a number of seconds (0 = off), got {value!r}") from None
    if math.isnan(s) or s < 0:
        raise ValueError(f"{source} must be >= 0 seconds (0 = off), got {value!r}")
    return s if s > 0 and math.isfinite(s) else None


@contextlib.contextmanager
def solver_timeout(seconds: float | None) -> Iterator[None]:
    """Set the watchdog limit (seconds; None or 0: off) for the calls made by this thread inside
    the block, whatever the device, overriding the environment and the defaults."""
    value = None if seconds is None else _seconds(seconds, "solver_timeout")
    prev = getattr(_override, "value", _UNSET)
    _override.value = value
    try:
        yield
    finally:
        _override.value = prev


def timeout_seconds(device: torch.device | str) -> float | None:
    """The limit for a solver call on ``device``: the ``solver_timeout`` block, else the
    environment variable, else ``DEFAULT_TIMEOUT``. None = no watchdog."""
    value = getattr(_override, "value", _UNSET)
    if value is not _UNSET:
        return cast("float | None", value)
    env = os.environ.get(ENV_VAR, "").strip()
    if env:
        return _seconds(env, ENV_VAR)
    return DEFAULT_TIMEOUT.get(torch.device(device).type)


def watched(fn: Callable[[], _T], device: torch.device | str, name: str, record: list[str] | None = None) -> _T:
    """``fn()`` (a solver call on ``device`` returning a tensor or a tuple of tensors) with the
    watchdog's limit; without a limit it is a plain call. When the limit passes it appends
    ``"<name>:timeout"`` to ``record`` and raises ``SolverTimeout``; it re-raises what ``fn``
    raised. On CUDA the call runs on a side stream (one per
    device, replaced after a hang) that first waits for the caller's stream; its results are
    synchronised and marked as used by the caller's stream before they are returned. Grad mode
    and the torch thread count follow the caller. A profiler sees the call as host wall time of
    the caller's range: its ops run in a thread the profiler does not follow, so their device
    kernels are not attributed to the range
    (``COEC_SOLVER_TIMEOUT=0`` for a breakdown that attributes them)."""
    device = torch.device(device)
    limit = timeout_seconds(device)
    if limit is None:
        return fn()
    # on CUDA: (the caller's stream, the side stream)
    streams = (torch.cuda.current_stream(device), _side_stream(device)) if device.type == "cuda" else None
    box: dict[str, Any] = {}
    worker = threading.Thread(target=_runner(fn, device, streams, box), name=f"coec-watchdog-{name}", daemon=True)
    worker.start()
    worker.join(limit)
    if worker.is_alive():
        if streams is not None:
            _abandon(device, streams[1])
        if record is not None:
            record.append(f"{name}:timeout")
        raise SolverTimeout(f"solver call {name!r} on {device} did not return within {limit:g} s (watchdog, App. B)")
    if "exc" in box:
        raise box["exc"]
    out: _T = box["out"]
    if streams is not None:
        _hand_back(out, streams)
    return out


def _runner(
    fn: Callable[[], Any], device: torch.device, streams: tuple[Any, Any] | None, box: dict[str, Any]
) -> Callable[[], None]:
    """The watchdog thread's body: ``fn()`` with the caller's grad mode and thread count (on the
    side stream of ``streams`` after the caller's, synchronised), its result or exception in
    ``box``."""
    grad, threads = torch.is_grad_enabled(), torch.get_num_threads()

    def run() -> None:
        try:
            torch.set_num_threads(threads)
            with torch.set_grad_enabled(grad):
                if streams is None:
                    box["out"] = fn()
                else:
                    main, side = streams
                    with torch.cuda.device(device), torch.cuda.stream(side):
                        side.wait_stream(main)
                        box["out"] = fn()
                    side.synchronize()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            box["exc"] = exc

    return run


def _hand_back(out: Any, streams: tuple[Any, Any]) -> None:
    """The side stream's results to the caller's stream (``streams``: caller's, side)."""
    main, side = streams
    main.wait_stream(side)
    for t in out if isinstance(out, (tuple, list)) else (out,):
        if isinstance(t, torch.Tensor) and t.device.type == "cuda":
            t.record_stream(main)
