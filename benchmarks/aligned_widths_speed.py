"""Do aligned MLP widths fix llama.cpp's prefill regression? (docs/selection-variants.md "Aligned
widths: measured speed").

One selection at one ratio, its kept MLP channel count rounded to each ``--multiples`` entry
(``coec select --channel-multiple M --channel-rounding R``; 1 is the paper's rule), each keep set
exported prune-only (no compensation: speed depends on the widths, not the values) as a GGUF of
every ``--types``, and timed beside the dense model's GGUF with the measured-table harness
(``coec.report.measured.table``: every configuration in a process of its own, interleaved repeats,
prefill of ``--prompt-tokens`` and greedy decode of ``--new-tokens`` at batch 1, the machine's
load average in the caption). Printed: each cell's MLP width, prefill and decode speedup against
dense, and their FLOP / byte bounds.

    python benchmarks/aligned_widths_speed.py --model resources/models/smollm2-135m \\
        --grams results/smollm2-135m/grams/enwiki-32x512 --ratio 0.3 --multiples 1 32 64 128 256
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def coec(*args: str) -> None:
    """Run one ``coec`` stage in a subprocess (as the workflow does); stop on failure."""
    subprocess.run([sys.executable, "-m", "coec", *args], check=True)


def mlp_width(keep_path: Path) -> int:
    """Kept MLP channels of the first layer of a keep.json (one width in every layer here)."""
    layers = json.loads(keep_path.read_text())["layers"]
    first = layers[0]
    return len(first.get("channels", first.get("mlp", [])))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--grams", required=True)
    ap.add_argument("--selection", default="rcpu")
    ap.add_argument("--ratio", type=float, default=0.3)
    ap.add_argument("--multiples", type=int, nargs="+", default=[1, 32, 64, 128, 256])
    ap.add_argument("--rounding", default="nearest", choices=["ceil", "nearest", "floor"])
    ap.add_argument("--group-rounding", default="nearest")
    ap.add_argument("--types", nargs="+", default=["f16", "q8_0"])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--work", default="/tmp/coec-aligned-widths", help="keep sets and GGUF files")
    ap.add_argument("--out", default="benchmarks/results/aligned_widths_speed.csv")
    a = ap.parse_args()

    from coec.report.measured.table import write_measured

    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)

    def export(keep: Path | None, folder: Path) -> dict:
        folder.mkdir(parents=True, exist_ok=True)
        files = {}
        for t in a.types:
            out = folder / f"export-{t}.gguf"
            if not out.exists():
                coec("export", "--format", "gguf", "--gguf-type", t, "--model", a.model, "--dtype", "float32",
                     *(["--keep", str(keep)] if keep else []), "--out", str(out))  # fmt: skip
            files[t] = str(out)
        return files

    cells = [{"label": "dense", "ratio": 0.0, "gguf": export(None, work / "dense")}]
    widths = {}
    for m in a.multiples:
        folder = work / f"{a.selection}-{a.ratio:g}-m{m}"
        keep = folder / "keep.json"
        if not keep.exists():
            folder.mkdir(parents=True, exist_ok=True)
            coec("select", "--model", a.model, "--grams", a.grams, "--method", a.selection, "--ratio", str(a.ratio),
                 "--group-rounding", a.group_rounding, "--channel-multiple", str(m),
                 "--channel-rounding", a.rounding, "--out", str(keep))  # fmt: skip
        widths[m] = mlp_width(keep)
        label = f"{a.selection} {a.ratio:g}, MLP {widths[m]} (multiple {m})"
        cells.append({"label": label, "ratio": a.ratio, "gguf": export(keep, folder)})

    spec = {
        "runtimes": [f"llamacpp-{t}" for t in a.types],
        "prompt_tokens": a.prompt_tokens,
        "new_tokens": a.new_tokens,
        "repeats": a.repeats,
        "threads": a.threads,
        "seed": 0,
        "cells": cells,
        "device": "cpu",
        "figure": str(Path(a.out).with_suffix(".png")),
        "caption": f"Aligned MLP widths ({a.rounding} rounding), prune-only cells of {a.selection} at "
        f"{a.ratio:g}, llama.cpp on this machine's CPU.",
    }
    df = write_measured(spec, a.out)
    cols = ["cell", "runtime", "prefill_tok_s", "prefill_speedup", "flop_bound", "decode_tok_s", "decode_speedup"]
    cols = [c for c in cols if c in df.columns] + [c for c in ("byte_bound",) if c in df.columns]
    print(df[cols].to_string(index=False))
    print(Path(a.out).with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
