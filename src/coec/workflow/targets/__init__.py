"""Which result files each table and figure reads, and its spec: pure functions of the validated
workflow config (the dict Snakemake reads), one module per idea:

    sources       where a model and a dataset are read from (model_path, dataset_spec)
    calibrations  the resized calibration sets of the calibration-size figures (Fig. 2)
    tables        the table specs (Tables 1-4, extra tables) and the files they read
    figures       the figure specs (Fig. 2, App. C) and the files they read
    inputs        the extra inputs of a compensate job (a method's declared inputs, Gram check)
    claims        the claims report's spec
    sota          the state-of-the-art table's spec (table_sota)
    report_labels titles, captions and labels of every artifact (results/README.md, the report)

The rules (``workflow/rules/*.smk``) call them with the planned config ``W.config`` (``coec.workflow.wiring``).
The names below are re-exported so that ``from coec.workflow.targets import table_spec`` keeps working.
"""

from __future__ import annotations

from coec.workflow.targets.calibrations import fig2_calibrations, sized_calibration, sized_entry
from coec.workflow.targets.claims import claims_inputs, claims_spec
from coec.workflow.targets.figures import (
    appc_caption,
    appc_geometry,
    appc_spec,
    fig2_spec,
    figure_inputs,
    size_figure_spec,
)
from coec.workflow.targets.inputs import base_cells, consumers, gram_check_input, method_inputs
from coec.workflow.targets.report_labels import (
    METRIC_WORDS,
    readme_spec,
    report_items,
    report_label,
    report_table_kind,
    sparsity_words,
)
from coec.workflow.targets.sota import sota_inputs, sota_spec
from coec.workflow.targets.sources import dataset_spec, model_path
from coec.workflow.targets.tables import (
    TABLE_FILES,
    ZEROSHOT_NOISE,
    spec_inputs,
    table4_inputs,
    table4_spec,
    table_cfg,
    table_file,
    table_inputs,
    table_names,
    table_spec,
    with_comparisons,
    zeroshot_tasks,
)

__all__ = [
    "METRIC_WORDS",
    "TABLE_FILES",
    "ZEROSHOT_NOISE",
    "appc_caption",
    "appc_geometry",
    "appc_spec",
    "base_cells",
    "claims_inputs",
    "claims_spec",
    "consumers",
    "dataset_spec",
    "fig2_calibrations",
    "fig2_spec",
    "figure_inputs",
    "gram_check_input",
    "method_inputs",
    "model_path",
    "readme_spec",
    "report_items",
    "report_label",
    "report_table_kind",
    "size_figure_spec",
    "sota_inputs",
    "sota_spec",
    "sized_calibration",
    "sized_entry",
    "sparsity_words",
    "spec_inputs",
    "table4_inputs",
    "table4_spec",
    "table_cfg",
    "table_file",
    "table_inputs",
    "table_names",
    "table_spec",
    "with_comparisons",
    "zeroshot_tasks",
]
