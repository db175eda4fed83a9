"""The measured deployment cost beside Table 4 (``results/table4_measured.csv``, its Markdown twin
and ``results/figures/table4_measured.png``; docs/deploy.md).

Every (cell, runtime) configuration is measured ``repeats`` times, each time in a fresh process
(``coec.report.measured.worker``: load, warm up, one timed prefill and decode, its own peak RSS), the
configurations interleaved (repeat r runs every configuration once, in an order rotated by r) so
that a change of machine load reaches all of them alike. Speedups are pruned / dense of the same
runtime and type, from the medians (and from the best runs) of those repeats; beside each, its
bound (``coec.report.measured.bounds``).

Spec (``coec report --kind table4-measured --spec JSON``): ``cells`` [{label, ratio, hf (an HF
folder) or build ({model, keep, comp}: assembled in memory), gguf {type: file}}], the first being
the dense model; ``runtimes`` (transformers-fp32, transformers-bf16, and llamacpp-<type> for
every GGUF type: f32, f16, q8_0, q5_1, q5_0, q4_1, q4_0); ``prompt_tokens``, ``new_tokens``, ``repeats``, ``threads``
(0: every core this process may use), ``device``, ``seed``, ``caption``, ``figure``.

A worker that dies by a signal (llama.cpp's AMX matmul segfaults on some CPUs; docs/deploy.md)
fails its configuration, not the table: the configuration's ``failed`` record (signal, repeat,
the end of its stderr) goes to ``.runs.json``, its row says ``failed: SIGSEGV (signal 11)`` in
``status`` with no measurement, and it is not run again; every other configuration still runs.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from coec.evaluate.llamacpp.run import require
from coec.io import artifacts
from coec.io.atomic import write_text
from coec.io.isolated import describe_exit, signal_name
from coec.report.measured.bounds import gguf_flops_per_token, prefill_context
from coec.report.measured.figure import plot_measured
from coec.report.measured.runtimes import RUNTIMES
from coec.report.measured.worker import MARK
from coec.report.rendering import to_markdown

log = logging.getLogger(__name__)

# the Markdown twin's columns (the CSV has every one): name in the CSV -> heading
MD_COLUMNS = {
    "cell": "cell",
    "runtime": "runtime",
    "type": "type",
    "status": "status",
    "file_mb": "file MiB",
    "peak_rss_mb": "peak RSS MiB",
    "prefill_tok_s": "prefill tok/s",
    "decode_tok_s": "decode tok/s",
    "prefill_speedup": "prefill speedup",
    "prefill_speedup_cpu": "prefill speedup, CPU s",
    "flop_bound": "FLOP bound",
    "decode_speedup": "decode speedup",
    "decode_speedup_cpu": "decode speedup, CPU s",
    "byte_bound": "byte bound",
    "decode_of_bound": "decode / bound",
    "decode_of_bound_cpu": "decode / bound, CPU s",
}


def machine_threads(threads: int) -> int:
    """``threads``, or with 0 every core this process may run on."""
    if threads:
        return threads
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def check_runtimes(spec: dict[str, Any]) -> None:
    """Before any measurement: the llama.cpp runtimes the spec asks for can run here (else one
    line saying how to install them, ``coec.evaluate.llamacpp.run.require``)."""
    wanted = [name for name in spec["runtimes"] if RUNTIMES[name][0] == "llama.cpp"]
    if wanted:
        require(f"table4_measured.runtimes {', '.join(wanted)} run in llama.cpp")


def prompt_ids(spec: dict[str, Any]) -> list[int]:
    """``prompt_tokens`` token ids drawn with ``seed`` from the model's vocabulary (speed does not
    depend on the text; every configuration gets the same ids)."""
    rng = np.random.default_rng(spec.get("seed", 0))
    ids: list[int] = rng.integers(0, vocab_size(spec["cells"][0]), spec["prompt_tokens"]).tolist()
    return ids


def vocab_size(cell: dict[str, Any]) -> int:
    gguf_file = next(iter(cell.get("gguf", {}).values()), None)
    if gguf_file:
        import gguf  # deferred: gguf (~0.3 s), only the llama.cpp runtimes need it

        emb = next(t for t in gguf.GGUFReader(gguf_file).tensors if t.name == "token_embd.weight")
        return int(emb.shape[1])
    folder = cell.get("hf") or cell["build"]["model"]
    return int(artifacts.read_json(Path(folder) / "config.json")["vocab_size"])


def configurations(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Every (cell, runtime) the spec can measure: transformers where the cell has an HF folder or
    a build, llama.cpp where it has a GGUF file of that type."""
    out = []
    for cell in spec["cells"]:
        for name in spec["runtimes"]:
            runtime, dtype = RUNTIMES[name]
            if runtime == "transformers" and (cell.get("hf") or cell.get("build")):
                src = {"path": cell["hf"]} if cell.get("hf") else {"build": cell["build"]}
            elif runtime == "llama.cpp" and cell.get("gguf", {}).get(dtype):
                src = {"path": cell["gguf"][dtype]}
            else:
                continue
            out.append({"cell": cell["label"], "name": name, "runtime": runtime, "dtype": dtype, **src})
    return out


def worker_command() -> list[str]:
    """The command a measurement runs (the job's JSON is appended)."""
    return [sys.executable, "-m", "coec.report.measured.worker"]


def run_worker(config: dict[str, Any], prompt: list[int], spec: dict[str, Any], threads: int) -> dict[str, Any]:
    """One measurement in a fresh process; its ``COEC_TIMING`` line as a dict, or for a worker
    killed by a signal {'failed': 'SIGSEGV (signal 11)', 'signal', 'returncode', 'stderr_tail'}.
    Any other failure raises RuntimeError."""
    job: dict[str, Any] = {k: config[k] for k in ("runtime", "dtype", "path", "build") if k in config}
    job.update(prompt=prompt, new_tokens=spec["new_tokens"], threads=threads, device=spec.get("device", "cpu"))
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(
        [*worker_command(), json.dumps(job)],
        capture_output=True,
        text=True,
        env=env,
        timeout=spec.get("timeout_s", 3600),
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(MARK)]
    tail = " ".join((proc.stderr or proc.stdout).split()[-40:])
    if signal_name(proc.returncode):
        rc = proc.returncode
        return {"failed": describe_exit(rc), "signal": signal_name(rc), "returncode": rc, "stderr_tail": tail}
    if proc.returncode or not lines:
        raise RuntimeError(f"measuring {config['cell']} on {config['name']} failed: {tail}")
    result: dict[str, Any] = json.loads(lines[-1].removeprefix(MARK))
    return result


def measure_all(spec: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every configuration's ``repeats`` runs, interleaved; returns (configurations with their
    runs, machine info)."""
    threads = machine_threads(spec.get("threads", 0))
    prompt = prompt_ids(spec)
    configs = configurations(spec)
    for c in configs:
        c["runs"] = []
    load = [os.getloadavg()[0]]
    for r in range(spec["repeats"]):
        order = configs[r % len(configs) :] + configs[: r % len(configs)]
        for c in order:
            if c.get("failed"):
                continue
            run = run_worker(c, prompt, spec, threads)
            if "failed" in run:
                c["failed"] = {**run, "repeat": r + 1}
                log.warning("repeat %d %s %s: the worker died with %s", r + 1, c["cell"], c["name"], run["failed"])
                continue
            c["runs"].append(run)
            log.info(
                "repeat %d %s %s: prefill %.3fs decode %.3fs",
                r + 1,
                c["cell"],
                c["name"],
                c["runs"][-1]["prefill_s"],
                c["runs"][-1]["decode_s"],
            )
        load.append(os.getloadavg()[0])
    return configs, {"threads": threads, "load_1min": load}


def summarize(config: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    """Median and best tokens/s, peak RSS and bytes read of one configuration's runs (NaN for a
    configuration that failed)."""
    runs = config["runs"]
    p, n = spec["prompt_tokens"], spec["new_tokens"]
    if config.get("failed"):
        rates = (f"{k}_tok_{s}" for k in ("prefill", "decode") for s in ("s", "s_best", "cpu_s"))
        return dict.fromkeys(("peak_rss_mb", "read_mb", *rates), float("nan"))
    out = {"peak_rss_mb": max(r["peak_rss_mb"] for r in runs), "read_mb": runs[0]["read_bytes"] / 2**20}
    for key, tokens in (("prefill", p), ("decode", n)):
        wall = [r[f"{key}_s"] for r in runs]
        cpu = [r[f"{key}_cpu_s"] for r in runs]
        out.update(
            {
                f"{key}_tok_s": tokens / statistics.median(wall),
                f"{key}_tok_s_best": tokens / min(wall),
                f"{key}_tok_cpu_s": tokens / statistics.median(cpu),
            }
        )
    return out


def file_mb(config: dict[str, Any]) -> float:
    """Size on disk of what the configuration loads (an HF folder's weights or the GGUF file);
    NaN for a cell assembled in memory or a model that is not a local path."""
    p = Path(config.get("path") or "")
    if not config.get("path") or not p.exists():
        return float("nan")
    files = sorted(p.glob("*.safetensors")) if p.is_dir() else [p]
    return sum(f.stat().st_size for f in files) / 2**20


def _ratio(a: float | None, b: float | None) -> float:
    return a / b if a is not None and b else float("nan")


def table_rows(configs: list[dict[str, Any]], spec: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per configuration: measurements, speedups over the dense cell (the spec's first)
    of the same runtime and type, and their bounds."""
    cells = {c["label"]: c for c in spec["cells"]}
    dense = spec["cells"][0]["label"]
    ctx = prefill_context(spec["prompt_tokens"])
    flops = {k: gguf_flops_per_token(next(iter(c["gguf"].values())), ctx) for k, c in cells.items() if c.get("gguf")}
    stats = {(c["cell"], c["name"]): summarize(c, spec) for c in configs}
    rows = []
    for c in configs:
        s, d = stats[c["cell"], c["name"]], stats.get((dense, c["name"]), {})
        row = {
            "cell": c["cell"],
            "ratio": cells[c["cell"]]["ratio"],
            "runtime": c["runtime"],
            "type": c["dtype"],
            "status": f"failed: {c['failed']['failed']}" if c.get("failed") else "ok",
            "file_mb": file_mb(c),
            "read_mb": s["read_mb"],
            "peak_rss_mb": s["peak_rss_mb"],
            "prefill_tok_s": s["prefill_tok_s"],
            "decode_tok_s": s["decode_tok_s"],
            "prefill_speedup": _ratio(s["prefill_tok_s"], d.get("prefill_tok_s")),
            "flop_bound": _ratio(flops.get(dense), flops.get(c["cell"])),
            "decode_speedup": _ratio(s["decode_tok_s"], d.get("decode_tok_s")),
            "byte_bound": _ratio(d.get("read_mb"), s["read_mb"]),
        }
        row["decode_of_bound"] = row["decode_speedup"] / row["byte_bound"]
        for key in ("prefill", "decode"):
            row[f"{key}_speedup_best"] = _ratio(s[f"{key}_tok_s_best"], d.get(f"{key}_tok_s_best"))
            row[f"{key}_speedup_cpu"] = _ratio(s[f"{key}_tok_cpu_s"], d.get(f"{key}_tok_cpu_s"))
        row["decode_of_bound_cpu"] = row["decode_speedup_cpu"] / row["byte_bound"]
        rows.append(row)
    return rows


def write_measured(spec: dict[str, Any], out: str | Path) -> pd.DataFrame:
    """Measure, then write ``out`` (CSV), its .md twin (caption with the machine, threads, load
    average and repeats) and the figure; returns the table (a DataFrame)."""
    check_runtimes(spec)
    configs, machine = measure_all(spec)
    df = pd.DataFrame(table_rows(configs, spec))
    out = Path(out)
    artifacts.write_csv(out, df, float_format="%.4f")
    load = ", ".join(f"{x:.2f}" for x in machine["load_1min"])
    caption = (
        f"{spec.get('caption', '')} {spec['repeats']} interleaved repeats, median of wall "
        f"and of CPU time (best runs in the CSV), {machine['threads']} thread(s), prompt "
        f"{spec['prompt_tokens']} tokens, {spec['new_tokens']} new tokens, batch 1; "
        f"1-min load average before and after each round: {load}."
    ).strip()
    write_text(out.with_suffix(".md"), to_markdown(df[list(MD_COLUMNS)].rename(columns=MD_COLUMNS), 2, caption))
    write_text(out.with_suffix(".runs.json"), json.dumps({"machine": machine, "configs": configs}, indent=1) + "\n")
    plot_measured(df, spec.get("figure") or str(out.parent / "figures" / f"{out.stem}.png"), caption)
    return df
