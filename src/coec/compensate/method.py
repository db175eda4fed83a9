"""What a compensation method is and the problem it solves: one registered entry with typed
options, the data it needs beyond the Grams, and a solve function of one shared signature.

    solve(problem: Problem, options: MyOptions) -> Compensation

A method lives in one module that defines its options (a frozen dataclass deriving from
:class:`CommonOptions`, fields made with ``validators.opt``) and registers a :class:`Method`
in :data:`METHODS`. The built-in methods are in ``coec.compensate.methods`` (where the entry
types and the registry are defined, without torch; this module re-exports them); a researcher's
own is a file named in the config's ``plugins`` (docs/adding-a-method.md). Everything else (the
config schema's method names, the option checks and page, the compensate rule's inputs, the
compensate stage) reads the registry.
"""

from __future__ import annotations

from coec.compensate.methods import METHODS
from coec.compensate.methods.base import CommonOptions, Compensation, Method
from coec.compensate.problem import Metric, Problem, check_module, form_metric, prepare
from coec.model.arch import MODULES

__all__ = [
    "CommonOptions",
    "Problem",
    "Metric",
    "form_metric",
    "prepare",
    "Compensation",
    "Method",
    "METHODS",
    "MODULES",
    "check_module",
]
