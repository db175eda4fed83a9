"""The command-line options of the streamed stages (no torch import: the CLI loads lazily).

``coec.cli.add_stream_args`` adds them to a stage's parser, each with the config schema's default
(``coec.cli.config_arg``), so a stage run by hand streams as the workflow's job does.
"""

from __future__ import annotations

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
