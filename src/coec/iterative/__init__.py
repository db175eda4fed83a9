"""Iterative multi-domain FLAP (docs/iterative.md, eq. 1–14).

FLAP prunes input columns of o_proj (whole KV groups) and down_proj (MLP channels) by the
fluctuation score Var(X_j)·||W[:, j]||² (eq. 5) and replaces the pruned columns by the bias
B = W[:, P] mean[P] (eq. 2–4). This package adds

- **multi-domain calibration** (eq. 6–8, :mod:`.stats`): calibration sequences from K domains
  (natural language, code, math; :mod:`coec.domains`), per-domain statistics accumulated in one
  pass and mixed with weights alpha_k by :func:`mix_stats`;
- **iterative calibration** (eq. 11–13, :mod:`.schedule`, :mod:`.method`): the target ratio rho
  is reached in steps rho_1 < ... < rho_S = rho (fractions of the ORIGINAL width of every
  layer); before step s the statistics are measured again on the model pruned and
  bias-compensated by steps < s, scores are computed over the remaining groups/channels, and
  the biases of all steps add up (:mod:`.state`);
- a **layer-sequential** mode: within one pass, the statistics of layer l are taken after layers
  < l were pruned and compensated in this same pass (stats of l -> prune + bias l -> re-run the
  pruned l to produce the inputs of l+1);
- FLAP's **adaptive structure** AL-AM (``structure="al-am"``, :mod:`.structure`): scores
  standardised per layer and module, KV groups and channels ranked together across layers, each
  unit weighted by its parameter count, keeping a global parameter fraction 1 - rho (per-layer
  widths then differ).

With one domain, one step, ``structure="uniform"`` and ``mode="global"`` the result is bit-for-bit
the workflow's ``flap`` selection + ``bias`` compensation (same keep sets, same bias tensors).

The stages that read and write files (``coec iterative <sub>``) are :mod:`coec.stages_iterative`:
``keep.json`` (kept KV groups and channels per layer, ORIGINAL indices), a block file
``block0-{L-1}.safetensors`` with ``layer{i}.{o_proj|down_proj}.weight|bias`` (bias in the weight
dtype), ``state.safetensors`` (the float64 accumulated biases, so a later step continues
exactly) and ``iterative.json`` (per-step info).
"""

from __future__ import annotations

from ..arch import MODULES
from .method import MODES, Options, global_pass, run_iterative, run_step, sequential_pass
from .schedule import check_schedule, make_schedule
from .state import (PruneState, apply_keep_, apply_layer_step_, block_tensors, current_geometry,
                    install_bias_, keep_dict, output_module, restore_state, state_tensors,
                    unit_params)
from .stats import (VARIANCE_MIXES, CalibSet, DomainAccumulator, attach_accumulators, calib_set,
                    finalize_stats, mix_stats, normalise_alphas)
from .structure import STRUCTURES, alam_keep, layer_scores, standardise, uniform_keep

__all__ = ["MODULES", "MODES", "STRUCTURES", "VARIANCE_MIXES", "CalibSet", "DomainAccumulator",
           "Options", "PruneState", "alam_keep", "apply_keep_", "apply_layer_step_",
           "attach_accumulators", "block_tensors", "calib_set", "check_schedule",
           "current_geometry", "finalize_stats", "global_pass", "install_bias_", "keep_dict",
           "layer_scores", "make_schedule", "mix_stats", "normalise_alphas", "output_module",
           "restore_state", "run_iterative", "run_step", "sequential_pass", "standardise",
           "state_tensors", "uniform_keep", "unit_params"]
