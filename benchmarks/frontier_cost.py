"""What the frontier costs (docs/frontier.md "Cost"): wall time per stage, per GGUF type and per
file, from the Snakemake benchmark files its jobs wrote (``results/benchmarks/<stage>/…tsv``, one
per job, column ``s``), and llama.cpp's quantization time per K-quant file (the export sidecars'
``quantize_seconds``). Counts only the jobs of the frontier's own cells (config key ``frontier``)
and the calibration they share; reads whatever subset exists.

    python benchmarks/frontier_cost.py [--configfile config.yaml]
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def seconds(tsv: Path) -> float:
    """Wall seconds of one Snakemake benchmark file (its first row)."""
    with tsv.open() as f:
        return float(next(csv.DictReader(f, delimiter="\t"))["s"])


def variant_of(name: str, variants: tuple[str, ...]) -> str | None:
    """The GGUF target name a benchmark file's stem ends with (the longest match), if any."""
    hits = [v for v in variants if name.endswith(f"-{v}")]
    return max(hits, key=len) if hits else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configfile", default="config.yaml")
    ap.add_argument("--results", default="results")
    a = ap.parse_args()

    import yaml

    from coec.config.validate import validate_config
    from coec.export.formats import GGUF_VARIANTS
    from coec.io import paths
    from coec.report.frontier import check, frontier_cells

    config = validate_config(yaml.safe_load(Path(a.configfile).read_text()))
    t = check(config)
    cells = frontier_cells(config)
    bench = Path(a.results) / "benchmarks"
    # the cells' own folders, as benchmark paths (results/<model>/<calib>/<sel>-<r>/<comp> ->
    # <stage>/<model>/<calib>/<sel>-<r>/<comp>...), the selections and the calibration they share
    keys = {str(Path(c["folder"]).relative_to(a.results)) for c in cells}
    keys |= {str(Path(c["keep"]).parent.relative_to(a.results)) for c in cells if c["keep"]}
    keys.add(f"{t['model']}/{t['calibration']}")
    keys.add(f"{t['model']}/dense")
    per_stage: dict[str, list[float]] = defaultdict(list)
    per_type: dict[tuple[str, str], list[float]] = defaultdict(list)
    for tsv in sorted(bench.rglob("*.tsv")):
        rel = tsv.relative_to(bench)
        stage, rest = rel.parts[0], str(rel.relative_to(rel.parts[0]).with_suffix(""))
        if stage in ("report",):
            if rest in ("frontier", "frontier_speed"):
                per_stage[rest].append(seconds(tsv))
            continue
        shared = stage == "calibrate" and rest.startswith(f"{t['model']}/")  # the holdout sets too
        if not shared and not any(rest == k or rest.startswith(k + "/") or rest.startswith(k + "-") for k in keys):
            continue
        s = seconds(tsv)
        v = variant_of(rest, GGUF_VARIANTS)
        name = f"{stage} ({'per type' if v else 'per cell'})"
        per_stage[name if v else stage].append(s)
        if v:
            per_type[stage, v].append(s)
    extra = [g for g in cells[0]["types"] if g not in t["types"]]
    print(f"frontier of {t['model']}: {len(cells)} cells x {len(t['types'])} types ({', '.join(t['types'])})")
    if extra:
        print(f"the dense model also: {', '.join(extra)}")
    print(f"{'stage':32s} {'jobs':>5s} {'total s':>9s} {'mean s':>8s}")
    total = 0.0
    for stage, xs in sorted(per_stage.items()):
        total += sum(xs)
        print(f"{stage:32s} {len(xs):5d} {sum(xs):9.1f} {sum(xs) / len(xs):8.1f}")
    print(f"{'all jobs (serial sum)':32s} {'':5s} {total:9.1f}")
    print("\nper GGUF type (mean seconds per file):")
    stages = sorted({s for s, _ in per_type})
    print(f"{'type':16s} " + " ".join(f"{s:>12s}" for s in stages) + f" {'quantize s':>11s}")
    for v in GGUF_VARIANTS:
        if not any((s, v) in per_type for s in stages):
            continue
        q = [
            json.loads(Path(paths.gguf_report_file(c["folder"], v)).read_text()).get("quantize_seconds")
            for c in cells
            if Path(paths.gguf_report_file(c["folder"], v)).is_file()
        ]
        q = [x for x in q if x is not None]
        cols = [per_type.get((s, v)) for s in stages]
        row = " ".join(f"{sum(x) / len(x):12.1f}" if x else f"{'-':>12s}" for x in cols)
        print(f"{v:16s} {row} {sum(q) / len(q) if q else float('nan'):11.1f}")


if __name__ == "__main__":
    main()
