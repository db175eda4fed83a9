"""Wall time of whole compensation jobs (``coec compensate``, one thread) with and without the
calibration's Gram check, and of the ``coec gram-check`` job that forms it.

Needs a finished calibration and keep sets of the embedded default, e.g.

    snakemake --cores 2 results/smollm2-135m/enwiki-32x512/{flap,wanda_sp}-0.3/keep.json
    python benchmarks/compensate_job_time.py --before-src ../old-checkout/src

``--before-src``: the ``src`` folder of another checkout, run as a third column (its code, this
environment). Each job runs ``--repeats`` times, interleaved; the table gives the minimum.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODEL = "resources/models/smollm2-135m"
GRAMS = "results/smollm2-135m/grams/enwiki-32x512"
EXPECT = json.dumps({"model": "models.smollm2-135m", "num_layers": 30})
CELLS = (("none", "wanda_sp"), ("bias", "flap"), ("lstsq", "flap"), ("rcpu", "flap"))


def run(args: list[str], src: str | None) -> float:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if src:
        env["PYTHONPATH"] = src
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "coec", *args], env=env, check=True, capture_output=True)
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before-src", default=None, help="src folder of the code to compare with")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--methods", nargs="*", default=[m for m, _ in CELLS])
    a = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="coec-jobtime-"))
    check = tmp / "gram_check.json"
    common = ["--model", MODEL, "--expect", EXPECT, "--device", "cpu"]
    times: dict[str, list[float]] = {}
    for r in range(a.repeats):
        times.setdefault("gram-check", []).append(
            run(["gram-check", *common, "--grams", GRAMS, "--out", str(check)], None)
        )
        for method, select in CELLS:
            if method not in a.methods:
                continue
            spec = json.dumps({"method": method, **({"ridge": 0.01} if method == "lstsq" else {})})
            job = [
                "compensate",
                *common,
                "--grams",
                GRAMS,
                "--keep",
                f"results/smollm2-135m/enwiki-32x512/{select}-0.3/keep.json",
            ]
            job += ["--spec", spec, "--first", "0", "--last", "29"]
            variants = {"without": (job, None), "with": (job + ["--gram-check", str(check)], None)}
            if a.before_src:
                variants["before"] = (job, a.before_src)
            for name, (cmd, src) in variants.items():
                times.setdefault(f"{method} {name}", []).append(
                    run(cmd + ["--out", str(tmp / f"{method}-{name}.safetensors")], src)
                )
        print(f"round {r + 1}/{a.repeats} done", file=sys.stderr)
    print(f"gram-check job (all 30 layers): {min(times['gram-check']):.2f} s")
    print("| method | " + ("code before | " if a.before_src else "") + "without the check | with the check |")
    print("|---|" + ("---:|" if a.before_src else "") + "---:|---:|")
    for method, _ in CELLS:
        if method not in a.methods:
            continue
        before = f"{min(times[f'{method} before']):.2f} s | " if a.before_src else ""
        print(f"| {method} | {before}{min(times[f'{method} without']):.2f} s | {min(times[f'{method} with']):.2f} s |")
    same = all(
        (tmp / f"{m}-with.safetensors").read_bytes() == (tmp / f"{m}-without.safetensors").read_bytes()
        for m, _ in CELLS
        if m in a.methods
    )
    print(f"blocks with and without the check byte-identical: {same}")


if __name__ == "__main__":
    main()
