"""The ``coec iterative`` command group: the stages of the iterative multi-domain FLAP method
(``coec.iterative.stages``), added to ``coec``'s parser by ``coec.cli``. No torch at import
(the stages import it when they run): ``coec --help`` and every job's start read this module."""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import TYPE_CHECKING

from coec.cli_args import Subparsers, add_model_check_args, cell_source, config_arg, json_arg, run_checked
from coec.iterative.choices import MODES, STRUCTURES, VARIANCE_MIXES
from coec.iterative.schedule import make_schedule
from coec.model.source import CellSource
from coec.select.rounding import DEFAULT_ROUNDING
from coec.select.scores import CHANNEL_ROUNDINGS, ROUNDINGS

if TYPE_CHECKING:
    from coec.iterative.method import Options
    from coec.iterative.stages import DomainCalibration

MODEL_STAGES = ("run", "grams")


def _calib_args(s: argparse.ArgumentParser) -> None:
    """Arguments of the iterative stages that run a calibration pass (run, grams)."""
    s.add_argument("--model", required=True)
    s.add_argument(
        "--domains",
        type=json_arg,
        required=True,
        help='JSON list of {"name", "alpha", "dataset": <data.load_split spec>}',
    )
    s.add_argument("--nsamples", type=int, required=True, help="sequences over all domains")
    s.add_argument("--seqlen", type=int, required=True)
    config_arg(s, "--seed", "iterative.mixes.*.seed", type=int)
    config_arg(s, "--batch-size", "iterative.mixes.*.batch_size", type=int)
    config_arg(s, "--dtype", "models.*.dtype")
    config_arg(s, "--gram-dtype", "iterative.mixes.*.gram_dtype")
    config_arg(s, "--variance-mix", "iterative.mixes.*.variance_mix", choices=VARIANCE_MIXES)
    config_arg(s, "--device", "compute.device")
    s.add_argument("--quiet", action="store_true", help="no progress bars")
    add_model_check_args(s)
    s.add_argument("--out", required=True)


def add_parser(sub: Subparsers) -> None:
    """``coec iterative <run|grams|mix|prepare-domain|collect>``: the stages of the iterative
    multi-domain FLAP method (``coec.iterative.stages``); a cell's perplexity is ``coec ppl``'s."""

    it = sub.add_parser(
        "iterative",
        help="iterative multi-domain FLAP (run, grams, mix, prepare-domain, collect; `coec iterative -h`)",
        description="Iterative multi-domain FLAP (docs/iterative.md, eq. 1–14).",
    )
    cmds = it.add_subparsers(dest="cmd", required=True)

    s = cmds.add_parser("run", help="iterative (multi-domain) FLAP -> keep.json + bias block")
    _calib_args(s)
    s.add_argument("--ratio", type=float, help="target ratio rho (with --steps or --step)")
    s.add_argument("--steps", type=int, help="S steps: rho_s = rho s / S")
    s.add_argument("--step", type=float, help="step δ of the original width: δ, 2δ, ... rho")
    s.add_argument("--schedule", help="explicit cumulative ratios, e.g. 0.1,0.2,0.3")
    config_arg(s, "--mode", "iterative.variants.*.mode", choices=MODES)
    config_arg(s, "--structure", "iterative.variants.*.structure", choices=STRUCTURES)
    config_arg(s, "--group-rounding", "group_rounding", choices=ROUNDINGS)
    s.add_argument("--channel-rounding", default=DEFAULT_ROUNDING, choices=CHANNEL_ROUNDINGS)
    s.add_argument("--init", default=None, help="continue from a previous step's output folder")
    s.add_argument("--block-name", default=None, help="default block0-{L-1}.safetensors")
    s.set_defaults(func=cmd_run)

    s = cmds.add_parser("grams", help="multi-domain Gram directory (one pass, mixed by alpha)")
    _calib_args(s)
    s.set_defaults(func=cmd_grams)

    s = cmds.add_parser("mix", help="mix per-domain Gram directories (eq. 8)")
    s.add_argument("--grams", nargs="+", required=True)
    s.add_argument("--alphas", nargs="+", type=float, required=True)
    config_arg(s, "--variance-mix", "iterative.mixes.*.variance_mix", choices=VARIANCE_MIXES)
    config_arg(s, "--gram-dtype", "iterative.mixes.*.gram_dtype")
    s.add_argument("--out", required=True)
    s.set_defaults(func=cmd_mix)

    s = cmds.add_parser("prepare-domain", help="write a domain's calibration text")
    s.add_argument("--spec", type=json_arg, required=True)
    s.add_argument("--datasets", type=json_arg, default={})
    s.add_argument("--out", required=True)
    s.set_defaults(func=cmd_prepare_domain)

    s = cmds.add_parser("collect", help="assemble a cell from its step folders")
    s.add_argument("--steps", nargs="*", default=[], help="the steps' iterative.json, in order")
    s.add_argument("--variant", type=json_arg, default={})
    s.add_argument("--keep-out")
    s.add_argument("--info-out")
    s.add_argument("--block", help="a step's bias block file to copy")
    s.add_argument("--first", type=int, default=0)
    s.add_argument("--last", type=int)
    s.add_argument("--block-out")
    s.set_defaults(func=cmd_collect)


def schedule_args_error(a: argparse.Namespace) -> str | None:
    """What is wrong with the schedule options of ``iterative run`` (None: nothing)."""
    given = sum(x is not None for x in (a.steps, a.step)) + bool(a.schedule)
    if a.schedule and (a.steps is not None or a.step is not None):
        return "--schedule excludes --steps/--step"
    if not a.schedule and (a.ratio is None or given != 1):
        return "give --ratio with exactly one of --steps or --step, or --schedule"
    return None


def schedule(a: argparse.Namespace) -> list[float]:
    """The cumulative ratios of ``iterative run``: --schedule, or --ratio with exactly one of
    --steps / --step (``schedule.make_schedule``)."""
    return [float(x) for x in a.schedule.split(",")] if a.schedule else make_schedule(a.ratio, a.steps, a.step)


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """``coec iterative <cmd>``: checked, then run with one error line on bad input."""
    if args.cmd == "run" and schedule_args_error(args):
        parser.error(f"iterative run: {schedule_args_error(args)}")
    return run_checked(f"iterative {args.cmd}", args, args.cmd in MODEL_STAGES)


def _calibration(a: argparse.Namespace) -> tuple[CellSource, DomainCalibration, Options]:
    """The model, the calibration set and the pass options of ``iterative run`` / ``grams``."""
    from coec.iterative.method import Options  # deferred: keeps the job boundary torch-free
    from coec.iterative.stages import DomainCalibration  # deferred: keeps the job boundary torch-free

    calib = DomainCalibration(a.domains, a.nsamples, a.seqlen, a.seed)
    opts = Options(variance_mix=a.variance_mix, gram_dtype=a.gram_dtype, batch_size=a.batch_size, progress=not a.quiet)
    return cell_source(a), calib, opts


def cmd_run(a: argparse.Namespace) -> None:
    from coec.iterative import stages  # deferred: keeps the job boundary torch-free

    source, calib, opts = _calibration(a)
    opts = replace(
        opts, mode=a.mode, structure=a.structure, group_rounding=a.group_rounding, channel_rounding=a.channel_rounding
    )
    stages.run_iterative_prune(source, calib, opts, stages.Step(schedule(a), a.init, a.block_name), a.out)


def cmd_grams(a: argparse.Namespace) -> None:
    from coec.iterative import stages  # deferred: keeps the job boundary torch-free

    stages.run_iterative_grams(*_calibration(a), a.out)


def cmd_mix(a: argparse.Namespace) -> None:
    from coec.iterative import stages  # deferred: keeps the job boundary torch-free

    stages.mix_gram_dirs(a.grams, a.alphas, a.out, a.variance_mix, a.gram_dtype)


def cmd_collect(a: argparse.Namespace) -> None:
    from coec.iterative import stages  # deferred: keeps the job boundary torch-free

    if a.steps:
        stages.collect_cell(a.steps, a.variant, a.keep_out, a.info_out)
    if a.block:
        stages.copy_block(a.block, a.first, a.last, a.block_out)


def cmd_prepare_domain(a: argparse.Namespace) -> None:
    from coec.iterative.domains import build_domain  # deferred: keeps the job boundary torch-free

    build_domain(a.spec, a.out, a.datasets)
