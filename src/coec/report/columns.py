"""The columns of a result table (``results/<table>.csv``): label columns, then one column per
model, and beside each model's metric in a zero-shot table its noise columns, in a perplexity
table the metric columns it asks for (``columns: [kl]``: ``<model> kl``)."""

from __future__ import annotations

from collections.abc import Container

#: the columns a zero-shot table has beside each model's metric (``report.zeroshot_table``): its
#: standard error, its difference to the row named under ``vs`` and that difference's paired SE
NOISE_COLUMNS = (" se", " diff", " diff se")

#: the columns a perplexity table can ask for beside each model's metric (the table config's
#: ``columns``): name -> (key of the cell's ppl.json, Markdown digits). ``kl``: the mean token KL
#: to the dense model (docs/kl.md)
METRIC_COLUMNS = {"kl": ("kl", 4)}


def is_model_column(name: str, label_columns: Container[str]) -> bool:
    """Whether a table column holds a model's metric (not a label, ``vs``, a noise or a metric
    column)."""
    extra = tuple(f" {c}" for c in METRIC_COLUMNS)
    return name not in label_columns and name != "vs" and not name.endswith(NOISE_COLUMNS + extra)
