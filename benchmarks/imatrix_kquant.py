#!/usr/bin/env python
"""llama.cpp perplexity of K-quant GGUF exports with and without an importance matrix from the
calibration (``coec imatrix``, ``export --imatrix``; docs/export.md "Importance matrix from the
calibration"), for the dense model and a pruned, compensated cell.

For each target: the imatrix on the calibration set (the windows ``coec calibrate`` draws), an f32
export (the reference), then each K-quant type without and with the imatrix; each file's
perplexity in llama.cpp over the first ``--windows`` evaluation windows as ``coec ppl`` cuts them.
Everything is written under ``--work`` (default /tmp/coec-imatrix-kquant).

    python benchmarks/imatrix_kquant.py --model resources/models/smollm2-135m \\
        --cell results/smollm2-135m/enwiki-32x512/rcpu-0.3/keep.json \\
        results/smollm2-135m/enwiki-32x512/rcpu-0.3/coec/block0-29.safetensors \\
        --text resources/text/enwiki
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--cell", nargs="+", default=None, metavar="FILE", help="keep.json then the block files")
    p.add_argument("--text", required=True, help="folder with calib.txt and eval.txt")
    p.add_argument("--nsamples", type=int, default=32)
    p.add_argument("--seqlen", type=int, default=512)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--windows", type=int, default=16)
    p.add_argument("--types", nargs="+", default=["q4_k_m", "q5_k_m"])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--work", default="/tmp/coec-imatrix-kquant")
    a = p.parse_args()

    import torch
    from transformers import AutoTokenizer

    from coec.calibrate.options import CalibrationWindows
    from coec.data import text as data
    from coec.evaluate.llamacpp.run import gguf_perplexity
    from coec.export.formats import ExportRequest
    from coec.export.imatrix import run_imatrix
    from coec.export.stage import run_export
    from coec.model.source import CellSource

    torch.set_num_threads(a.threads)
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    dataset = {"source": "files", "calib": f"{a.text}/calib.txt", "eval": f"{a.text}/eval.txt"}
    tok = AutoTokenizer.from_pretrained(a.model)
    windows = data.eval_windows(data.tokenize_text(tok, data.load_split(dataset, "eval")), a.seqlen, a.windows)
    targets = {"dense": (None, [])}
    if a.cell:
        targets["cell"] = (a.cell[0], a.cell[1:])
    rows = []
    for target, (keep, comp) in targets.items():
        imx = work / f"imatrix-{target}.safetensors"
        if not imx.exists():
            t0 = time.time()
            source = CellSource(a.model, "float32", "cpu", keep=keep, comp=tuple(comp))
            run_imatrix(source, CalibrationWindows(dataset, a.nsamples, a.seqlen, a.seed, 4), str(imx))
            print(f"{target}: imatrix in {time.time() - t0:.0f}s", flush=True)
        for gtype, use in [("f32", False)] + [(t, u) for t in a.types for u in (False, True)]:
            out = work / f"{target}-{gtype}{'-imatrix' if use else ''}.gguf"
            if not out.exists():
                opts = {"gguf_type": gtype, **({"imatrix": str(imx)} if use else {})}
                run_export(ExportRequest(a.model, keep, tuple(comp), "float32", str(out), options=opts), fmt="gguf")
            res = gguf_perplexity(out, windows, n_threads=a.threads)
            row = {
                "target": target,
                "type": gtype,
                "imatrix": use,
                "ppl": round(res["ppl"], 4),
                "bytes": out.stat().st_size,
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    print("\n| target | type | ppl without imatrix | ppl with imatrix | change |")
    print("|---|---|---:|---:|---:|")
    for r in rows:
        if r["type"] == "f32":
            print(f"| {r['target']} | f32 | {r['ppl']:.3f} | | |")
        elif r["imatrix"]:
            base = next(x for x in rows if x["target"] == r["target"] and x["type"] == r["type"] and not x["imatrix"])
            change = 100 * (r["ppl"] / base["ppl"] - 1)
            print(f"| {r['target']} | {r['type']} | {base['ppl']:.3f} | {r['ppl']:.3f} | {change:+.2f} % |")
    (work / "results.json").write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
