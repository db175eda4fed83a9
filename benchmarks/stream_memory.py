"""Peak resident memory of every stage against the checkpoint's size, streamed (the default
path); with ``--compare`` also the in-memory path, and whether the two give the same bytes.

    python benchmarks/stream_memory.py --model /work/bigmodel --text resources/text/enwiki \
        --zeroshot-data resources/zeroshot --work /tmp/stream-bench \
        [--nsamples 2 --seqlen 128 --windows 2 --ppl-seqlen 128 --task arc_easy --limit 5]
        [--compare]   # a model that fits: in-memory calibrate / ppl / zeroshot too

Each stage is its own process (``python -m coec <stage>``, as a workflow job runs it), so its
peak is the process's own high-water mark (``getrusage`` ru_maxrss, file-backed mapped pages
included). Stages: calibrate (``--nsamples`` x ``--seqlen`` tokens), select (wanda_sp 30 %),
compensate one layer (``--comp``, default ridge: ``lstsq``), perplexity of that cell over
``--windows`` windows, zero-shot of the cell on the first ``--limit`` documents of ``--task``.
Prints one row per stage: seconds, peak RSS (GiB), peak / checkpoint.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

GIB = 2**30


def child(argv: list[str]) -> None:
    """Run one stage in this process and print its wall time and peak RSS as JSON."""
    t0 = time.time()
    if argv[0] == "inmem-calibrate":  # the loaded-model path of earlier versions, for --compare
        import torch

        from coec.calibrate.layer_pass import PassOptions, calibrate_to_dir
        from coec.data.text import calibration_ids
        from coec.io.provenance import model_provenance
        from coec.model.load import load_model

        model, dataset, nsamples, seqlen, batch, gram_dtype, out = argv[1:]
        dataset, nsamples, seqlen, batch = json.loads(dataset), int(nsamples), int(seqlen), int(batch)
        torch.manual_seed(0)
        m, tok = load_model(model, dtype="float32", device="cpu")
        ids = calibration_ids(tok, dataset, nsamples, seqlen, 0)
        meta = {
            "model": model_provenance(model),
            "dataset": dataset,
            "nsamples": nsamples,
            "seed": 0,
            "dtype": "float32",
        }
        calibrate_to_dir(m, ids, out, PassOptions(batch_size=batch, gram_dtype=gram_dtype), meta, "cpu")
        rc = 0
    else:
        from coec.cli import main

        rc = main(argv)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print("STAGE " + json.dumps({"rc": rc, "seconds": round(time.time() - t0, 1), "peak": peak}))
    sys.exit(rc)


def run(label: str, argv: list[str], log: Path) -> dict:
    """One stage as a child process; its figures."""
    with open(log, "a") as fh:
        fh.write(f"\n=== {label}: coec {' '.join(argv)}\n")
        fh.flush()
        res = subprocess.run([sys.executable, __file__, "--child", *argv], stdout=subprocess.PIPE, stderr=fh, text=True)
    line = [ln for ln in res.stdout.splitlines() if ln.startswith("STAGE ")]
    if res.returncode or not line:
        raise SystemExit(f"{label} failed (exit {res.returncode}); see {log}")
    out = json.loads(line[-1][6:])
    out["label"] = label
    return out


def digest_dir(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def same_json(a: Path, b: Path, drop=("total_seconds", "seconds")) -> bool:
    ja, jb = json.loads(a.read_text()), json.loads(b.read_text())
    return {k: v for k, v in ja.items() if k not in drop} == {k: v for k, v in jb.items() if k not in drop}


def request_tokens(model: Path, samples: Path) -> tuple[int, int]:
    """(total, longest) tokens of the zero-shot requests of a run (context + continuation, from
    lm-eval's per-sample records), for the memory plan's settings; (0, 0) without the file."""
    if not samples.is_file():
        return 0, 0
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    lens = [
        len(tok(arg["arg_0"] + arg["arg_1"], add_special_tokens=False)["input_ids"])
        for line in samples.read_text().splitlines()
        for arg in json.loads(line)["arguments"].values()
    ]
    return sum(lens), max(lens)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        return child(sys.argv[2:])
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--text", required=True, help="folder with calib.txt / eval.txt (embedded text)")
    p.add_argument("--zeroshot-data", required=True, help="coec prepare-zeroshot output folder")
    p.add_argument("--work", required=True)
    p.add_argument("--nsamples", type=int, default=2)
    p.add_argument("--seqlen", type=int, default=128)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--gram-dtype", default="float32")
    p.add_argument("--ratio", type=float, default=0.3)
    p.add_argument("--layer", type=int, default=0, help="the compensated layer")
    p.add_argument("--comp", default='{"method": "lstsq", "ridge": 0.01}')
    p.add_argument("--windows", type=int, default=2)
    p.add_argument("--ppl-seqlen", type=int, default=128)
    p.add_argument("--ppl-batch", type=int, default=1)
    p.add_argument("--task", default="arc_easy")
    p.add_argument("--limit", type=int, default=5)
    p.add_argument("--zs-batch", type=int, default=16)
    p.add_argument("--stages", default="calibrate,select,compensate,ppl,zeroshot")
    p.add_argument("--compare", action="store_true", help="also the in-memory path, and byte checks")
    p.add_argument("--drop-grams", action="store_true", help="delete the Grams after compensation")
    a = p.parse_args()

    from coec.model.checkpoint import Checkpoint

    model, work = Path(a.model), Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    log = work / "stages.log"
    size = Checkpoint(model).nbytes()
    ds = json.dumps({"source": "embedded", "dir": str(Path(a.text).resolve())})
    L = a.layer
    block = work / f"block{L}-{L}.safetensors"
    cell = ["--keep", str(work / "keep.json"), "--comp", str(block)]
    common = ["--dtype", "float32", "--device", "cpu"]
    stages = {
        "calibrate": [
            "calibrate",
            "--model",
            str(model),
            "--dataset",
            ds,
            "--nsamples",
            str(a.nsamples),
            "--seqlen",
            str(a.seqlen),
            "--batch-size",
            str(a.batch),
            "--gram-dtype",
            a.gram_dtype,
            *common,
            "--out",
            str(work / "grams"),
        ],
        "select": [
            "select",
            "--model",
            str(model),
            "--grams",
            str(work / "grams"),
            "--method",
            "wanda_sp",
            "--ratio",
            str(a.ratio),
            "--out",
            str(work / "keep.json"),
        ],
        "compensate": [
            "compensate",
            "--model",
            str(model),
            "--grams",
            str(work / "grams"),
            "--keep",
            str(work / "keep.json"),
            "--spec",
            a.comp,
            "--first",
            str(L),
            "--last",
            str(L),
            "--device",
            "cpu",
            "--out",
            str(block),
        ],
        "ppl": [
            "ppl",
            "--model",
            str(model),
            "--dataset",
            ds,
            "--seqlen",
            str(a.ppl_seqlen),
            "--max-windows",
            str(a.windows),
            "--batch-size",
            str(a.ppl_batch),
            *common,
            *cell,
            "--out",
            str(work / "ppl.json"),
        ],
        "zeroshot": [
            "zeroshot",
            "--model",
            str(model),
            "--tasks",
            a.task,
            "--data-dir",
            a.zeroshot_data,
            "--limit",
            str(a.limit),
            "--batch-size",
            str(a.zs_batch),
            *common,
            *cell,
            "--out",
            str(work / "zs" / "zeroshot.json"),
        ],
    }
    rows = []
    for name in a.stages.split(","):
        rows.append(run(name, stages[name], log))
        print(
            f"{name:<11} {rows[-1]['seconds']:>8.1f} s  peak {rows[-1]['peak'] / GIB:6.2f} GiB "
            f"({100 * rows[-1]['peak'] / size:5.1f} % of {size / GIB:.2f} GiB)",
            flush=True,
        )
        if name == "compensate" and a.drop_grams:
            import shutil

            shutil.rmtree(work / "grams")
    checks = {}
    if a.compare:
        rows.append(
            run(
                "calibrate (in memory)",
                [
                    "inmem-calibrate",
                    str(model),
                    ds,
                    str(a.nsamples),
                    str(a.seqlen),
                    str(a.batch),
                    a.gram_dtype,
                    str(work / "grams-inmem"),
                ],
                log,
            )
        )
        checks["Grams byte-identical"] = digest_dir(work / "grams") == digest_dir(work / "grams-inmem")
        inmem = ["--stream-eval-above-gb", "1e9"]
        rows.append(run("ppl (in memory)", [*stages["ppl"][:-1], str(work / "ppl-inmem.json"), *inmem], log))
        checks["ppl.json equal"] = same_json(work / "ppl.json", work / "ppl-inmem.json")
        rows.append(
            run(
                "zeroshot (in memory)",
                [*stages["zeroshot"][:-1], str(work / "zs-inmem" / "zeroshot.json"), *inmem],
                log,
            )
        )
        checks["zeroshot.json equal"] = same_json(work / "zs" / "zeroshot.json", work / "zs-inmem" / "zeroshot.json")
        samples = sorted((work / "zs" / "zeroshot_samples").glob("*.jsonl"))
        checks["per-sample records equal"] = all(
            s.read_bytes() == (work / "zs-inmem" / "zeroshot_samples" / s.name).read_bytes() for s in samples
        )
    print(f"\ncheckpoint {model}: {size / GIB:.2f} GiB ({size / 1e9:.2f} GB)")
    print("| stage | path | seconds | peak RSS (GiB) | % of checkpoint |")
    print("|---|---|---:|---:|---:|")
    for r in rows:
        path = "in memory" if "in memory" in r["label"] else "streamed"
        print(
            f"| {r['label'].replace(' (in memory)', '')} | {path} | {r['seconds']:.1f} | "
            f"{r['peak'] / GIB:.2f} | {100 * r['peak'] / size:.1f} |"
        )
    for k, v in checks.items():
        print(f"{k}: {v}")
    zs_total, zs_longest = request_tokens(model, work / "zs" / "zeroshot_samples" / f"{a.task}.jsonl")
    settings = {
        "dtype": "float32",
        "gram_dtype": a.gram_dtype,
        "nsamples": a.nsamples,
        "seqlen": a.seqlen,
        "batch": a.batch,
        "ratio": a.ratio,
        "method": json.loads(a.comp)["method"],
        "ppl_tokens": a.windows * a.ppl_seqlen,
        "ppl_seqlen": a.ppl_seqlen,
        "ppl_batch": a.ppl_batch,
        "zs_tokens": zs_total,
        "zs_max_length": 2048,
        "zs_longest": zs_longest,
        "zs_batch": a.zs_batch,
        "budget_gib": 16,
    }
    config = json.loads((model / "config.json").read_text())
    (work / "stream_memory.json").write_text(
        json.dumps(
            {
                "model": str(model),
                "checkpoint_bytes": size,
                "config": config,
                "settings": settings,
                "rows": rows,
                "checks": checks,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
