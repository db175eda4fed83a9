"""The command-line options of the streamed stages and their values (no torch import: the CLI
reads this module).

``coec.cli.add_stream_args`` adds them to a stage's parser, each with the config schema's default
(``coec.cli.config_arg``), so a stage run by hand streams as the workflow's job does; the fields of
:class:`StreamOptions` default to the same (``coec.config.schema.config_field``).
"""

from __future__ import annotations

from dataclasses import dataclass

from coec.config.schema import config_field

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


def _gib(gb: float) -> float:
    """``gb`` GiB in bytes."""
    from coec.report.cost import GIB  # deferred: report.cost imports torch

    return float(gb) * GIB


@dataclass(frozen=True)
class StreamOptions:
    """How a stage streams the model (docs/streaming.md); each default the config schema's."""

    hidden_budget_gb: float = config_field(OPTIONS["hidden_budget_gb"][1])
    checkpoint_minutes: float = config_field(OPTIONS["checkpoint_minutes"][1])
    stream_eval_above_gb: float = config_field(OPTIONS["stream_eval_above_gb"][1])

    def budget_bytes(self) -> float:
        """The hidden-state budget in bytes (``compute.hidden_cache_budget_gb``, GiB)."""
        return _gib(self.hidden_budget_gb)

    def checkpoint_seconds(self) -> float:
        """Seconds between calibration checkpoints (``compute.calibrate_checkpoint_minutes``)."""
        return 60.0 * float(self.checkpoint_minutes)

    def stream_above_bytes(self) -> float:
        """Checkpoint size above which an evaluation streams (``compute.stream_eval_above_gb``)."""
        return _gib(self.stream_eval_above_gb)
