"""The one home of the rounding default: how a pruned width is rounded when a ratio does not
divide it (KV groups, MLP channels). The config schema's ``group_rounding`` and
``table4.group_rounding`` default to it (tests/unit/test_targets.py checks), and every function
with a rounding argument takes it as its default."""

from __future__ import annotations

#: the paper's rule: keep ceil(n * (1 - ratio)) of n
DEFAULT_ROUNDING = "ceil"
