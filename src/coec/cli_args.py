"""What ``coec.cli`` and the ``coec iterative`` command group (``coec.iterative.cli``) share:
argument types, options whose default is the config schema's, the hub and streaming options,
the parsed cell, the model check before a stage and the guarded run of one. No torch: every job
of the workflow starts here (``python -m coec <stage>``), and ``coec --help`` stays quick."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Callable
from typing import Any, TypeAlias

from coec.config.validate import schema_default
from coec.model.source import CellSource, ResolvedSource, resolve_source
from coec.model.stream_options import OPTIONS, STAGE_OPTIONS, StreamOptions

Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def json_arg(s: str) -> Any:
    try:
        return json.loads(s)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON: {s!r} ({exc})") from None


def optional_int(s: str) -> int | None:
    return None if s in ("", "none", "None", "null", "0") else int(s)


def config_arg(s: argparse.ArgumentParser, flag: str, key: str, **kw: Any) -> argparse.Action:
    """An option whose default is the config schema's default of ``key`` (``coec.config.validate.
    schema_default``), so a stage run by hand and the same stage run by the workflow agree.
    The action records ``config_key`` (tests/workflow/test_cli_defaults.py checks every option the rules
    pass is required, has one, or defaults to nothing)."""
    action = s.add_argument(flag, default=schema_default(key), **kw)
    action.config_key = key  # type: ignore[attr-defined]  # typeshed: Action has no attribute for this
    if action.help is None:
        action.help = f"default: config {key} = {action.default!r}"
    return action


EXPECT_HELP = (
    'JSON of what the config says of the model, e.g. {"model": "models.tiny", "num_layers": 2, '
    '"seqlen_key": "evaluation.ppl_seqlen"}; checked against its config.json first'
)


def hub_options(a: argparse.Namespace) -> tuple[str | None, bool]:
    """(revision, trust_remote_code) of a parsed model stage (absent options: None, False)."""
    return getattr(a, "revision", None), bool(getattr(a, "trust_remote_code", False))


def add_hub_args(s: argparse.ArgumentParser) -> None:
    """--revision / --trust-remote-code: passed to every load of the model and tokenizer."""
    s.add_argument("--revision", default=None, help="hub revision (commit, tag or branch) of a hub-id --model")
    s.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="allow the model repository's own code (transformers trust_remote_code)",
    )


def add_model_check_args(s: argparse.ArgumentParser) -> None:
    """--expect and the hub options of a stage whose model is checked before any work."""
    s.add_argument("--expect", type=json_arg, default={}, help=EXPECT_HELP)
    add_hub_args(s)


def check_model_stage(a: argparse.Namespace) -> ResolvedSource:
    """A model stage's model against --expect, its --seqlen and its --keep, before any work
    (``coec.config.modelcheck``): one error line naming the config key and both values. Returns
    the sources as resolved (at --revision, as the stage loads it) and read for the check, which
    the stage then reads too (:func:`run_checked`, :func:`cell_source`)."""
    from coec.config.modelcheck import check_stage  # deferred: keeps the job boundary torch-free

    resolved = resolve_source(cell_source(a)).local
    check_stage(resolved, getattr(a, "expect", None), getattr(a, "seqlen", None))
    return resolved


def add_stream_args(parser: argparse.ArgumentParser, stage: str) -> None:
    """Add the streaming options of ``stage`` (``STAGE_OPTIONS``) to its subparser."""
    for dest in STAGE_OPTIONS[stage]:
        flag, key = OPTIONS[dest]
        config_arg(parser, flag, key, type=float, dest=dest)


def stream_options(a: argparse.Namespace) -> StreamOptions:
    """The parsed streaming options of a stage (those it does not take: None)."""
    return StreamOptions(**{dest: getattr(a, dest) for dest in OPTIONS if hasattr(a, dest)})


def cell_source(a: argparse.Namespace) -> CellSource:
    """Which model and which cell a parsed stage names (options it does not take: their defaults),
    with what its stage-start check resolved (``a.resolved``, :func:`run_checked`)."""
    return CellSource(
        model=a.model,
        dtype=getattr(a, "dtype", CellSource.dtype),
        device=getattr(a, "device", None),
        revision=getattr(a, "revision", None),
        trust_remote_code=bool(getattr(a, "trust_remote_code", False)),
        keep=getattr(a, "keep", None),
        comp=tuple(getattr(a, "comp", None) or ()),
        cell=dict(getattr(a, "cell", None) or {}),
        device_map=getattr(a, "device_map", None),
        resolved=getattr(a, "resolved", None),
    )


def run_guarded(stage: str, fn: Callable[[], object]) -> int:
    """Run one stage with logging; a bad input ends it with one error line and exit code 2."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    from safetensors import SafetensorError  # deferred: only a stage that runs reads safetensors files

    log = logging.getLogger("coec")
    t0 = time.time()
    try:
        fn()
    except (ValueError, FileNotFoundError, KeyError, FloatingPointError, SafetensorError) as exc:
        # ArtifactError (a ValueError) reads "<file>: <problem>"; any message is kept to one line
        msg = " ".join(str(exc).split())
        log.error("%s failed: %s", stage, msg)
        print(f"coec {stage}: error: {msg}", file=sys.stderr)
        return 2
    log.info("%s done in %.1fs", stage, time.time() - t0)
    return 0


def run_checked(stage: str, a: argparse.Namespace, model_stage: bool) -> int:
    """A parsed stage, guarded (:func:`run_guarded`): its model checked against the config first
    (``model_stage``), then its command (``set_defaults(func=...)``), which reads the model as the
    check resolved it."""

    def run() -> None:
        if model_stage:
            a.resolved = check_model_stage(a)
        a.func(a)

    return run_guarded(stage, run)
