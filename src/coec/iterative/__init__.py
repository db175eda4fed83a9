"""Iterative multi-domain FLAP (docs/iterative.md, eq. 1–14).

FLAP prunes input columns of o_proj (whole KV groups) and down_proj (MLP channels) by the
fluctuation score Var(X_j)·||W[:, j]||² (eq. 5) and replaces the pruned columns by the bias
B = W[:, P] mean[P] (eq. 2–4). This package adds

- **multi-domain calibration** (eq. 6–8, :mod:`.stats`): calibration sequences from K domains
  (natural language, code, math; :mod:`.domains`), per-domain statistics accumulated in one
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

The stages that read and write files (``coec iterative <sub>``) are :mod:`.stages`:
``keep.json`` (kept KV groups and channels per layer, ORIGINAL indices), a block file
``block0-{L-1}.safetensors`` with ``layer{i}.{o_proj|down_proj}.weight|bias`` (bias in the weight
dtype), ``state.safetensors`` (the float64 accumulated biases, so a later step continues
exactly) and ``iterative.json`` (per-step info).
"""

from __future__ import annotations
