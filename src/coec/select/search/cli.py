"""The ``coec search`` command group (docs/search.md): ``candidates`` (one layer's candidates)
and ``run`` (the allocation -> keep.json and search.json), added to ``coec``'s parser by ``coec.cli``.
Every option the workflow passes takes its default from the config schema (``config_arg``) or is
required. No torch at import (the stages import it when they run)."""

from __future__ import annotations

import argparse

from coec.calibrate.options import CalibrationWindows
from coec.cli_args import Subparsers, add_model_check_args, cell_source, config_arg, json_arg, run_checked
from coec.select.scores import CHANNEL_ROUNDINGS, ROUNDINGS, KeepRule
from coec.select.search import ALLOCATIONS, OPTION_KEYS
from coec.select.search.checks import search_options

KEY = "selections.*."  # the search options' config keys (a search entry's)


def _model_args(s: argparse.ArgumentParser) -> None:
    s.add_argument("--model", required=True)
    config_arg(s, "--device", "compute.device")
    s.add_argument("--cell", type=json_arg, default={}, help="cell labels recorded in the output")
    add_model_check_args(s)


def add_parser(sub: Subparsers) -> None:
    """``coec search <candidates|run>``."""
    group = sub.add_parser(
        "search",
        help="per-layer widths searched under one budget (candidates, run; `coec search -h`)",
        description="Per-layer width search (docs/search.md).",
    )
    cmds = group.add_subparsers(dest="cmd", required=True)

    s = cmds.add_parser("candidates", help="one layer's keep set and refit at every level")
    _model_args(s)
    s.add_argument("--grams", required=True)
    s.add_argument("--method", required=True, help="the candidates' selection score")
    s.add_argument("--options", type=json_arg, default={}, help="JSON of the score's options")
    config_arg(s, "--channel-multiple", "channel_multiple", type=int)
    s.add_argument("--spec", type=json_arg, required=True, help="JSON of the compensations entry")
    s.add_argument("--layer", type=int, required=True)
    s.add_argument("--out", required=True)
    s.set_defaults(func=cmd_candidates)

    s = cmds.add_parser("run", help="the allocation under the budget -> keep.json and search.json")
    _model_args(s)
    config_arg(s, "--dtype", "models.*.dtype")
    s.add_argument("--name", required=True, help="the search selection's name")
    s.add_argument("--candidates", nargs="+", required=True, help="every layer's candidates, in order")
    s.add_argument("--holdout", type=json_arg, required=True, help="JSON {dataset, nsamples, seqlen, seed}")
    s.add_argument("--ratio", type=float, required=True)
    config_arg(s, "--group-rounding", "group_rounding", choices=ROUNDINGS)
    config_arg(s, "--channel-multiple", "channel_multiple", type=int)
    config_arg(s, "--channel-rounding", "channel_rounding", choices=CHANNEL_ROUNDINGS)
    config_arg(s, "--budget", KEY + "budget", type=json_arg)
    config_arg(s, "--allocation", KEY + "allocation", choices=ALLOCATIONS)
    for flag in ("generations", "offspring", "seed", "max_switches"):
        config_arg(s, "--" + flag.replace("_", "-"), KEY + flag, type=int)
    for flag in ("survivors", "tokens"):
        config_arg(s, "--" + flag, KEY + flag, type=json_arg)
    config_arg(s, "--tolerance", KEY + "tolerance", type=float)
    s.add_argument("--grams", default=None, help="the calibration's Grams (allocation alam)")
    s.add_argument("--out", required=True, help="keep.json")
    s.add_argument("--record", required=True, help="search.json")
    s.set_defaults(func=cmd_run)


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """``coec search <cmd>``: the model checked against the config first, then the command."""
    return run_checked(f"search {args.cmd}", args, True)


def cmd_candidates(a: argparse.Namespace) -> None:
    from coec.select.search.stage import CandidateOptions, run_candidates  # deferred: keeps the job boundary torch-free

    options = CandidateOptions(a.method, a.options, a.channel_multiple, a.spec, a.layer)
    run_candidates(cell_source(a), a.grams, options, a.out)


def cmd_run(a: argparse.Namespace) -> None:
    from coec.select.search.stage import SearchJob, run_search  # deferred: keeps the job boundary torch-free

    h = a.holdout
    job = SearchJob(
        name=a.name,
        candidates=tuple(a.candidates),
        holdout=CalibrationWindows(h["dataset"], int(h["nsamples"]), int(h["seqlen"]), int(h["seed"])),
        rule=KeepRule(a.ratio, a.group_rounding, a.channel_rounding, a.channel_multiple),
        budget=a.budget,
        allocation=a.allocation,
        options=search_options({k: getattr(a, k) for k in OPTION_KEYS}, a.name),
        grams=a.grams,
    )
    run_search(cell_source(a), job, a.out, a.record)
