"""The starter folder of a new compensation method: ``coec tiny-model DIR`` (docs/adding-a-method.md).

    DIR/model/          a tiny random model of a supported family with its tokenizer (coec.model.tiny)
    DIR/calib.txt       calibration text, DIR/eval.txt evaluation text (real English, offline)
    DIR/my_method.py    a template plug-in method (row_scale), documented
    DIR/config.yaml     the workflow config: the plug-in, the model, the text, a Table 1 of
                        prune-only, COEC and the template method

run from the repository with ``snakemake --cores all --directory DIR results/table1.csv
--configfile DIR/config.yaml``; the results go under DIR/results.

The text is the Python reference manual's topics as every CPython ships them (``pydoc_data``),
no download: every fifth topic, in sorted order, is evaluation text, the others calibration.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from pydoc_data.topics import topics
from typing import Any

import yaml

from coec.model.arch.tiny import DEFAULT_FAMILY
from coec.model.tiny import families, make_model_dir

MODEL = "model"
PLUGIN = "my_method.py"
METHOD = "row_scale"  # the template's method name (method_template.py registers it)
EVAL_EVERY = 5

#: The starter's config (paths relative to DIR, the work folder); the repository's config.yaml
#: is read first and this one over it.
CONFIG: dict[str, Any] = {
    "plugins": [PLUGIN],
    "models": {"tiny": {"source": MODEL, "num_layers": 2, "dtype": "float32"}},
    "datasets": {"docs": {"source": "files", "calib": "calib.txt", "eval": "eval.txt"}},
    "calibration": {"docs-16x64": {"dataset": "docs", "nsamples": 16, "seqlen": 64, "seed": 0, "batch_size": 8}},
    "evaluation": {"ppl_dataset": "docs", "ppl_seqlen": 64, "ppl_max_windows": 32, "ppl_batch_size": 8},
    "compensations": {"mine": {"method": METHOD}},
    "compute": {"device": "cpu", "compensate_block": 0},
    "table1": {
        "calibration": "docs-16x64",
        "models": ["tiny"],
        "ratios": [0.5],
        "rows": [
            {"selection": "wanda_sp", "compensation": "none"},
            {"selection": "wanda_sp", "compensation": "coec"},
            {"selection": "wanda_sp", "compensation": "mine"},
        ],
    },
}


def reference_text(eval_every: int = EVAL_EVERY) -> tuple[str, str]:
    """(calibration, evaluation) text: the Python reference manual's topics (``pydoc_data``, in
    every CPython), sorted by name, every ``eval_every``-th one evaluation text."""
    docs = [topics[name] for name in sorted(topics)]
    calib = [d for i, d in enumerate(docs) if i % eval_every]
    evals = [d for i, d in enumerate(docs) if not i % eval_every]
    return "\n\n".join(calib), "\n\n".join(evals)


def run_command(out: str | Path) -> str:
    """The command, run from the repository, that takes the starter folder ``out`` to Table 1."""
    return f"snakemake --cores all --directory {out} results/table1.csv --configfile {Path(out) / 'config.yaml'}"


def write_starter(out: str | Path, family: str = DEFAULT_FAMILY, seed: int = 0) -> dict[str, Path]:
    """Write the starter folder into ``out`` (absent or empty); returns its files by role.
    Raises ValueError for a folder that is not empty or a family the surgery does not support."""
    out = Path(out)
    if family not in families():
        raise ValueError(f"--family: unknown model family {family!r}; supported: {', '.join(families())}")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"{out}: not an empty folder (the starter writes a model, text and a config there)")
    out.mkdir(parents=True, exist_ok=True)
    calib, evals = reference_text()
    files = {
        "calib": out / "calib.txt",
        "eval": out / "eval.txt",
        "plugin": out / PLUGIN,
        "config": out / "config.yaml",
    }
    files["calib"].write_text(calib, encoding="utf-8")
    files["eval"].write_text(evals, encoding="utf-8")
    files["model"] = make_model_dir(out / MODEL, family, seed=seed, tokenizer_text=calib)
    shutil.copyfile(Path(__file__).with_name("method_template.py"), files["plugin"])
    header = (
        f"# A starter for a new compensation method (coec tiny-model, family {family}). From the repository:\n"
        f"#   {run_command(out)}\n"
        "# Paths are relative to this folder (the work folder); the repository's config.yaml is read first.\n"
    )
    files["config"].write_text(header + yaml.safe_dump(CONFIG, sort_keys=False), encoding="utf-8")
    return files
