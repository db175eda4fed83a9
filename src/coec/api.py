"""The public plug-in API: everything a researcher's own file imports to add a compensation
method, a selection score, a model family, a zero-shot task or an export format
(docs/adding-a-method.md, docs/adding-a-model.md).

    from coec.api import METHODS, CommonOptions, Compensation, Method, Problem, number, opt

This module is the one stable home of these names: the package's inner layout may move, a
plug-in that imports from here keeps working. Importing it loads torch (a method solves with
it); the workflow's planning never imports it, only the plug-ins a config names do.
"""

from __future__ import annotations

from coec.compensate.method import Problem
from coec.compensate.methods import METHODS
from coec.compensate.methods.base import CommonOptions, Compensation, Method
from coec.compensate.validators import boolean, choice, number, opt
from coec.evaluate.tasks import TASKS, TaskSpec
from coec.export.formats import EXPORT_FORMATS, ExportFormat, ExportRequest, FormatOption
from coec.model.arch import ADAPTERS
from coec.model.arch.base import Adapter
from coec.registry import Registry, UnknownName
from coec.select.scores import SCORES, ColumnStats, Score, ScoreSpec

__all__ = [
    "ADAPTERS",
    "EXPORT_FORMATS",
    "METHODS",
    "SCORES",
    "TASKS",
    "Adapter",
    "ColumnStats",
    "CommonOptions",
    "Compensation",
    "ExportFormat",
    "ExportRequest",
    "FormatOption",
    "Method",
    "Problem",
    "Registry",
    "Score",
    "ScoreSpec",
    "TaskSpec",
    "UnknownName",
    "boolean",
    "choice",
    "number",
    "opt",
]
