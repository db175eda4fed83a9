"""Golden digests of a trimmed workflow run: proves that a refactoring leaves every result unchanged.

Builds a tiny random Llama, local text and a trimmed config that reaches every stage (calibrate,
every selection, every compensation method, ppl, the iterative method in all its modes and
structures, multi-domain mixes, the tables and Fig. 2), runs Snakemake on it, and writes the
sha256 of every result file (tensor files hashed header + data, the work folder's own path
replaced, logs and per-job timings left out).

    python benchmarks/golden.py --out before.json                 # at the old commit
    python benchmarks/golden.py --out after.json --compare before.json   # exit 1 on any change

The comparison prints every file that differs, every file only one side has, and a count.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

TARGETS = [
    "results/table1.csv",
    "results/table3.csv",
    "results/table_iterative.csv",
    "results/figures/fig2_calibration_size.png",
    "results/figures/iterative_calibration_size.png",
]


def file_digests(root: Path) -> dict[str, str]:
    """sha256 of every file under root/results except logs/ and benchmarks/."""
    out = {}
    for p in sorted((root / "results").rglob("*")):
        rel = p.relative_to(root / "results").as_posix()
        if p.is_file() and not rel.startswith(("logs/", "benchmarks/")):
            data = p.read_bytes()
            if p.suffix == ".safetensors":
                n = int.from_bytes(data[:8], "little")
                data = data[8 : 8 + n] + b"|" + data[8 + n :]
            out[rel] = hashlib.sha256(data.replace(str(root).encode(), b"<WORK>")).hexdigest()
    return out


def _json_equal(old_work: Path, new_work: Path, rel: str, ignore: set) -> bool:
    """Whether results/<rel> of two runs are equal JSON once the keys in ``ignore`` are dropped."""

    def load(work):
        text = (work / "results" / rel).read_text().replace(str(work), "<WORK>")
        return strip(json.loads(text))

    def strip(o):
        if isinstance(o, dict):
            return {k: strip(v) for k, v in o.items() if k not in ignore}
        return [strip(v) for v in o] if isinstance(o, list) else o

    return load(old_work) == load(new_work)


def main(argv=None) -> int:
    import yaml

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="JSON file for the digests")
    p.add_argument("--compare", help="digests of an earlier run: exit 1 on any difference")
    p.add_argument("--work", help="work folder (default: a temporary one)")
    p.add_argument("--cores", default="2")
    p.add_argument(
        "--ignore-json-key",
        action="append",
        default=[],
        help="with --compare: a JSON key (at any depth) a changed .json file may differ in, "
        "e.g. a new option recorded in the info files; needs --compare-work",
    )
    p.add_argument("--compare-work", help="the earlier run's work folder (to read changed JSON files)")
    p.add_argument("--hash-only", action="store_true", help="hash the results already in --work, run nothing")
    a = p.parse_args(argv)
    work = Path(a.work or tempfile.mkdtemp(prefix="coec-golden-"))
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    if not a.hash_only:
        from conftest import full_workflow_config

        cfg_path = work / "golden.yaml"
        cfg_path.write_text(yaml.safe_dump(full_workflow_config(work)))
        cmd = [
            sys.executable,
            "-m",
            "snakemake",
            "--snakefile",
            str(REPO / "Snakefile"),
            "--directory",
            str(work),
            "--cores",
            a.cores,
            *TARGETS,
            "--configfile",
            str(cfg_path),
        ]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode:
            print(res.stdout[-3000:], res.stderr[-5000:])
            return res.returncode
    digests = file_digests(work)
    Path(a.out).write_text(json.dumps(digests, indent=1, sort_keys=True) + "\n")
    print(f"{len(digests)} result files hashed in {time.time() - t0:.0f} s ({work})")
    if a.compare:
        old = json.loads(Path(a.compare).read_text())
        changed = sorted(k for k in old.keys() & digests.keys() if old[k] != digests[k])
        if a.ignore_json_key and a.compare_work:
            same = [
                k
                for k in changed
                if k.endswith(".json") and _json_equal(Path(a.compare_work), work, k, set(a.ignore_json_key))
            ]
            for k in same:
                print("equal but for", ", ".join(a.ignore_json_key) + ":", k)
            changed = [k for k in changed if k not in same]
        only_old, only_new = sorted(old.keys() - digests.keys()), sorted(digests.keys() - old.keys())
        for k in changed:
            print("changed:", k)
        for k in only_old:
            print("only before:", k)
        for k in only_new:
            print("only after:", k)
        print(
            f"{len(old.keys() & digests.keys()) - len(changed)} identical, {len(changed)} changed, "
            f"{len(only_old)} only before, {len(only_new)} only after"
        )
        return 1 if changed or only_old or only_new else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
