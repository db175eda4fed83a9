"""The command-line options of the streamed stages (no torch import: the CLI loads lazily).

Each option's default is the config schema's (``coec.cli.config_arg``), so a stage run by hand
streams as the workflow's job does.
"""

from __future__ import annotations

import argparse

#: option dest -> (flag, config key), per stage
OPTIONS = {
    "hidden_budget_gb": ("--hidden-budget-gb", "compute.hidden_cache_budget_gb"),
    "checkpoint_minutes": ("--checkpoint-minutes", "compute.calibrate_checkpoint_minutes"),
    "stream_eval_above_gb": ("--stream-eval-above-gb", "compute.stream_eval_above_gb"),
}
STAGE_OPTIONS = {
    "calibrate": ("hidden_budget_gb", "checkpoint_minutes"),
    "ppl": ("hidden_budget_gb", "stream_eval_above_gb"),
    "zeroshot": ("hidden_budget_gb", "stream_eval_above_gb"),
}


def add_stream_args(parser: argparse.ArgumentParser, stage: str) -> None:
    """Add the streaming options of ``stage`` (``STAGE_OPTIONS``) to its subparser."""
    from ..cli import config_arg

    for dest in STAGE_OPTIONS[stage]:
        flag, key = OPTIONS[dest]
        config_arg(parser, flag, key, type=float, dest=dest)


def stream_options(args: argparse.Namespace) -> dict:
    """The parsed streaming options of a stage, as keyword arguments of its pipeline function."""
    return {dest: getattr(args, dest) for dest in OPTIONS if hasattr(args, dest)}
