"""What the AMX guard costs: llama.cpp prefill and decode speed of GGUF files loaded with its extra
CPU buffers (llama.cpp's default: the CPU repack buffers, and AMX where the build has it) against
``use_extra_bufts=False`` (the guard's setting on an AMX CPU with an AMX build; docs/deploy.md
"llama.cpp on AMX CPUs").

Each measurement runs in a process of its own through the measured table's worker
(``coec.report.measured.table.run_worker``), the two settings interleaved (repeat r starts with setting r % 2), and
the guard's setting chosen by ``COEC_LLAMACPP_EXTRA_BUFTS``:

    python benchmarks/llamacpp_extra_buffers.py results/smollm2-135m/dense/export-q8_0.gguf \
        results/smollm2-135m/dense/export-f16.gguf --repeats 5 --threads 2

Prints a table: median tokens/s with the buffers on and off, and off / on.
"""

from __future__ import annotations

import argparse
import os
import statistics

from coec.evaluate.llamacpp.amx import ENV, describe
from coec.report.measured.table import run_worker


def measure(path: str, mode: str, prompt: int, new_tokens: int, threads: int) -> dict:
    """One run of ``path`` with the extra buffers ``mode`` ('on' | 'off') through the measured
    table's worker (``measured.run_worker``, which hands this process's environment on)."""
    config = {"runtime": "llamacpp", "dtype": "gguf", "path": path, "cell": os.path.basename(path), "name": mode}
    ids = [(7 * i + 11) % 4000 + 100 for i in range(prompt)]
    os.environ[ENV] = mode
    try:
        out = run_worker(config, ids, {"new_tokens": new_tokens, "device": "cpu"}, threads)
    finally:
        del os.environ[ENV]
    if "failed" in out:
        raise RuntimeError(f"{path} ({mode}): the worker died with {out['failed']}")
    assert out["extra_bufts"] == (mode == "on"), out
    return {"prefill": prompt / out["prefill_s"], "decode": new_tokens / out["decode_s"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gguf", nargs="+")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    print(describe())
    runs: dict[tuple[str, str], list[dict]] = {(p, m): [] for p in args.gguf for m in ("on", "off")}
    load = [os.getloadavg()[0]]
    for r in range(args.repeats):
        modes = ("on", "off") if r % 2 == 0 else ("off", "on")
        for p in args.gguf:
            for m in modes:
                runs[p, m].append(measure(p, m, args.prompt, args.new_tokens, args.threads))
        load.append(os.getloadavg()[0])
    print(
        f"{args.repeats} interleaved repeats, {args.threads} thread(s), prompt {args.prompt}, "
        f"{args.new_tokens} new tokens, batch 1; 1-min load average: {', '.join(f'{x:.2f}' for x in load)}"
    )
    print("| file | stage | extra buffers on (tok/s) | off (tok/s) | off / on |")
    print("|---|---|---:|---:|---:|")
    for p in args.gguf:
        for stage in ("prefill", "decode"):
            on = statistics.median(x[stage] for x in runs[p, "on"])
            off = statistics.median(x[stage] for x in runs[p, "off"])
            print(f"| {os.path.basename(p)} | {stage} | {on:.1f} | {off:.1f} | {off / on:.2f} |")


if __name__ == "__main__":
    main()
