"""The command-line options of the streamed stages and their values (no torch import: the CLI
reads this module).

``coec.cli.add_stream_args`` adds them to a stage's parser, each with the config schema's default
(``coec.cli.config_arg``), so a stage run by hand streams as the workflow's job does.
"""

from __future__ import annotations

from dataclasses import dataclass

from coec.config.validate import schema_default
from coec.report.cost import GIB

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


def setting(key: str, value: float | None) -> float:
    """``value``, or the schema default of ``compute.<key>`` when it is None."""
    return float(schema_default(f"compute.{key}") if value is None else value)


@dataclass(frozen=True)
class StreamOptions:
    """How a stage streams the model (docs/streaming.md); None: the config schema's default."""

    hidden_budget_gb: float | None = None
    checkpoint_minutes: float | None = None
    stream_eval_above_gb: float | None = None

    def budget_bytes(self) -> float:
        """The hidden-state budget in bytes (``compute.hidden_cache_budget_gb``, GiB)."""
        return setting("hidden_cache_budget_gb", self.hidden_budget_gb) * GIB

    def checkpoint_seconds(self) -> float:
        """Seconds between calibration checkpoints (``compute.calibrate_checkpoint_minutes``)."""
        return 60.0 * setting("calibrate_checkpoint_minutes", self.checkpoint_minutes)

    def stream_above_bytes(self) -> float:
        """Checkpoint size above which an evaluation streams (``compute.stream_eval_above_gb``)."""
        return setting("stream_eval_above_gb", self.stream_eval_above_gb) * GIB
