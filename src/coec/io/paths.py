"""The one path scheme of the results tree, used by the rules (with wildcard placeholders) and by
the table and figure specs (with names):

    results/{model}/grams/{calib}/                         Grams of a calibration set
    results/{model}/{calib}/{select}-{ratio}/keep.json     a keep set
    results/{model}/{calib}/{select}-{ratio}/{comp}/       a cell: block{a}-{b}.safetensors (+ .json),
                                                           ppl.json, zeroshot.json, geometry.csv, export/
    results/{model}/{calib}/{select}-{ratio}/search.json   a width search's record (beside its keep.json)
    results/{model}/{calib}/search/{select}/{comp}/layer{i}.safetensors (+ .json)   its candidates
    results/{model}/dense/                                 the unpruned model's evaluations and
                                                           kl-reference.safetensors
    results/{table}.csv (+ .md), results/figures/{figure}.png
    resources/models/{model}, resources/text/{dataset}, resources/zeroshot   embedded inputs

Every function takes names or Snakemake wildcard placeholders (``"{ratio}"``), so
``keep_file("{model}", "{calib}", "{select}", "{ratio}")`` is the rule's pattern and
``keep_file("smollm2", "c32", "rcpu", 0.3)`` a concrete file.
"""

from __future__ import annotations

RESULTS = "results"
RESOURCES = "resources"
ZEROSHOT_DATA = f"{RESOURCES}/zeroshot"
ZEROSHOT_MANIFEST = f"{ZEROSHOT_DATA}/manifest.json"
#: a ratio as it appears in paths (``fmt_ratio``), the ``{ratio}`` wildcard's constraint
RATIO_PATTERN = r"0\.[0-9]+"
#: a config name (model, dataset, calibration set, compensation, table, ...): it becomes a path
#: component, a wildcard value and a shell word. The one home of the pattern: the workflow's
#: wildcard constraints use NAME; validation (the config's and an option's) NAME_PATTERN (the
#: schema's ``$defs.name.pattern`` repeats it; tests/unit/test_targets.py checks they agree).
NAME = "[A-Za-z0-9][A-Za-z0-9._-]*"
NAME_PATTERN = f"^{NAME}$"


def fmt_ratio(r: float | str) -> str:
    """A ratio as it appears in paths: 0.30 -> '0.3' (a ``{wildcard}`` passes through)."""
    if isinstance(r, str) and r.startswith("{"):
        return r
    return f"{float(r):g}"


def model_dir(model: str) -> str:
    """The safetensors folder an embedded model is converted to (``prepare_model``)."""
    return f"{RESOURCES}/models/{model}"


def text_dir(dataset: str) -> str:
    """The calib.txt / eval.txt folder of an embedded dataset (``prepare_text``)."""
    return f"{RESOURCES}/text/{dataset}"


def grams_dir(model: str, calib: str) -> str:
    """Folder of the Grams of ``model`` on calibration set ``calib`` (one file per layer)."""
    return f"{RESULTS}/{model}/grams/{calib}"


def gram_check_file(model: str, calib: str) -> str:
    """App. B's verdict on every Gram of ``model`` on ``calib`` and each module's output energy."""
    return f"{RESULTS}/{model}/gram_checks/{calib}.json"


def selection_dir(model: str, calib: str, select: str, ratio: float | str) -> str:
    """Folder of a selection at a ratio: its keep set and its cells."""
    return f"{RESULTS}/{model}/{calib}/{select}-{fmt_ratio(ratio)}"


def keep_file(model: str, calib: str, select: str, ratio: float | str) -> str:
    """keep.json of a selection at a ratio."""
    return f"{selection_dir(model, calib, select, ratio)}/keep.json"


def cell_dir(model: str, calib: str, select: str, ratio: float | str, comp: str | None = None) -> str:
    """Folder of a cell (a selection and a compensation on a calibration set); without ``comp``
    the selection's folder."""
    base = selection_dir(model, calib, select, ratio)
    return f"{base}/{comp}" if comp else base


def block_file(cell: str, first: int | str, last: int | str) -> str:
    """Compensated weights of layers ``first..last`` of a cell."""
    return f"{cell}/block{first}-{last}.safetensors"


def block_info_file(cell: str, first: int | str, last: int | str) -> str:
    """The JSON twin of ``block_file`` (each module's ``info``)."""
    return f"{cell}/block{first}-{last}.json"


def search_candidates_file(
    model: str, calib: str, select: str, comp: str, layer: int | str, ext: str = "safetensors"
) -> str:
    """A width search's candidates of one layer (docs/search.md): the keep set of selection
    ``select`` at every level and its refit by compensation ``comp`` (``ext`` json: the keep sets
    and each refit's errors)."""
    return f"{RESULTS}/{model}/{calib}/search/{select}/{comp}/layer{layer}.{ext}"


def search_record_file(model: str, calib: str, select: str, ratio: float | str) -> str:
    """The record of a width search beside its keep.json: budget, realised cost, fitness curve."""
    return f"{selection_dir(model, calib, select, ratio)}/search.json"


def export_dir(cell: str) -> str:
    """A cell's HF checkpoint (``coec export``)."""
    return f"{cell}/export"


def gguf_file(folder: str, gguf_type: str) -> str:
    """A GGUF export (``coec export --format gguf``) in a cell's folder or the dense model's."""
    return f"{folder}/export-{gguf_type}.gguf"


def gguf_report_file(folder: str, gguf_type: str) -> str:
    """The sidecar of a GGUF export: the tensors that did not get the requested type, and why."""
    return f"{folder}/export-{gguf_type}.gguf.json"


def gguf_ppl_file(folder: str, gguf_type: str) -> str:
    """Perplexity of a GGUF export measured in llama.cpp (``coec ppl --gguf``)."""
    return f"{folder}/ppl-gguf-{gguf_type}.json"


def imatrix_file(folder: str, calib: str | None = None) -> str:
    """The importance matrix for llama.cpp's quantizer (``coec imatrix``) of a cell, on its own
    calibration set (``imatrix.safetensors``), or of the dense model on ``calib``
    (``imatrix-<calib>.safetensors``)."""
    return f"{folder}/imatrix-{calib}.safetensors" if calib else f"{folder}/imatrix.safetensors"


def dense_dir(model: str) -> str:
    """Folder of the unpruned model's evaluations."""
    return f"{RESULTS}/{model}/dense"


def kl_reference_file(model: str) -> str:
    """The dense model's KL reference over the perplexity windows (``coec kl-reference``), read by
    every perplexity job of the model (docs/kl.md)."""
    return f"{dense_dir(model)}/kl-reference.safetensors"


def table_file(name: str, ext: str = "csv") -> str:
    """A table (``results/<name>.csv`` and its Markdown twin ``.md``)."""
    return f"{RESULTS}/{name}.{ext}"


def figure_file(name: str) -> str:
    """A figure, ``results/figures/<name>.png``."""
    return f"{RESULTS}/figures/{name}.png"


def log_file(stage: str, *parts: str, suffix: str = ".log") -> str:
    """``results/logs/<stage>/<parts...><suffix>`` (``results/logs/<stage><suffix>`` without parts)."""
    return f"{RESULTS}/logs/{'/'.join((stage, *parts))}{suffix}"


def benchmark_file(stage: str, *parts: str) -> str:
    """``results/benchmarks/<stage>/<parts...>.tsv`` (Snakemake's per-job timings)."""
    return log_file(stage, *parts, suffix=".tsv").replace(f"{RESULTS}/logs/", f"{RESULTS}/benchmarks/", 1)
