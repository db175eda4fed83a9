"""docs/compensation-options.md, rendered from the registered methods' option dataclasses.

python -m coec.compensate.options_doc > docs/compensation-options.md
python -m coec.compensate.options_doc --plugins my_methods.py     # with a plug-in's methods
python -m coec.compensate.options_doc --config my.yaml            # with the config's plugins
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields
from typing import Any

from coec.compensate.methods import METHODS
from coec.compensate.validators import GROUPS


def _fmt_default(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, tuple):
        return "[" + ", ".join(_fmt_default(x) for x in v) + "]"
    if isinstance(v, str):
        return f"`{v}`"
    return f"{v:g}" if isinstance(v, float) else str(v)


def markdown() -> str:
    """docs/compensation-options.md, generated from the dataclasses."""
    out = [
        "# Compensation options",
        "",
        "<!-- generated from the registered methods by `python -m coec.compensate.options_doc >"
        " docs/compensation-options.md`;"
        " tests/integration/test_config_validation.py checks that this file matches -->",
        "",
        "A `compensations:` entry of the config names a `method` and any of its options; an",
        "`o_proj:` or `down_proj:` sub-mapping overrides options for that module only, e.g.",
        "",
        "```yaml",
        "compensations:",
        "  coec:",
        "    method: coec",
        "    alpha: 0.9",
        "    max_rounds: 50",
        "    o_proj: {align_lambda: 50.0}",
        "```",
        "",
        "Every key and value is checked when the config is validated (so `snakemake -n` already",
        "stops with one line naming, e.g., `compensations.coec.alpah` and the closest valid name).",
        "*Paper* options are hyperparameters of the method (App. B defaults where the paper gives",
        "one); *method* options are the design choices of blend, this project's method beyond the",
        "paper ([blend.md](blend.md)); *solver* options change how the same objective is computed",
        "(backends, dtypes, caps). A method's own data (another cell's weights, held-out Grams, the",
        "pruned value projection) is not an option: the compensate stage passes it",
        "([adding-a-method.md](adding-a-method.md)).",
        "",
        "*Evidence* says what keeps each option: a paper hyperparameter (with its section), a",
        "default, or the recorded result (`benchmarks/results/`, [benchmarks.md](benchmarks.md)) in",
        "which an alternative value wins on speed or accuracy. A solver alternative that no default",
        "uses and no recorded result shows winning is removed, with its code and benchmark (so were",
        "`temper_dtype`, `direction_matmul`, `eta_scale: lipschitz` and `left_polar: newton`).",
        "",
    ]
    for name, m in METHODS.items():
        out += [f"## `{name}`", "", m.doc.strip(), ""]
        out += ["| option | group | default | allowed | meaning | evidence |", "| --- | --- | --- | --- | --- | --- |"]
        for f in sorted(fields(m.options), key=lambda f: GROUPS.index(f.metadata["group"])):
            md = f.metadata
            evidence = md.get("evidence") or "not stated"
            cells = [f"`{f.name}`", md["group"], _fmt_default(f.default), str(md["check"]), md["doc"], evidence]
            out.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
        out.append("")
    out += [
        "## Indefinite Grams (App. B)",
        "",
        "A Gram with an eigenvalue below `-1e-4 x lambda_max` (far beyond float32 round-off) is",
        "replaced by its PSD projection (negative eigenvalues clipped to 0) for every method: the",
        "lstsq and rcpu solves and every reported error (`relerr_before`, `relerr_after`,",
        "`relerr_after_weight_only`) use it, and coec tempers with clipped eigenvalues (`psd_clip`).",
        'The result\'s `info["gram_psd"]` records the outcome: `indefinite`, and when the',
        "eigenvalues were computed `min_eig`, `max_eig`, `clipped` (eigenvalues set to 0) and",
        "`action`. A Gram that is PSD up to round-off is used exactly as it is.",
        "",
        "## Other checks made when the config is validated",
        "",
        "- Names that become paths or wildcards (models, datasets, calibration sets, compensations,",
        "  extra tables, domains, iterative mixes and variants) must match",
        "  `^[A-Za-z0-9][A-Za-z0-9._-]*$`; `.` and `..` are refused. Every path and value in the",
        "  rules' shell commands is shell-quoted as well.",
        "- A model's `num_layers`, and the sequence lengths it is run with (its calibration sets'",
        "  `seqlen`, `evaluation.ppl_seqlen`), are compared with the model's own config.json",
        "  (`num_hidden_layers`, `max_position_embeddings`) when it can be read at that point: a local",
        "  folder or an embedded model. Hub models are compared when their first stage starts",
        "  (`--expect`), before any work, and so is a keep.json's layer and head count.",
        "",
    ]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    """Print the page with the methods of any plug-ins named by ``--plugins`` or ``--config``."""
    from coec.registry import add_plugin_options, load_plugin_options

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    add_plugin_options(parser)
    args = parser.parse_args(argv)
    try:
        load_plugin_options(args)
    except ValueError as exc:
        print(f"options_doc: error: {exc}", file=sys.stderr)
        return 2
    print(markdown(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
