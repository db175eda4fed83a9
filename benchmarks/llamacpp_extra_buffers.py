"""What the AMX guard costs: llama.cpp prefill and decode speed of GGUF files loaded with its extra
CPU buffers (llama.cpp's default: the CPU repack buffers, and AMX where the build has it) against
``use_extra_bufts=False`` (the guard's setting on an AMX CPU with an AMX build; docs/deploy.md
"llama.cpp on AMX CPUs").

Each measurement runs in a process of its own through the measured table's worker
(``coec.deploy.worker``), the two settings interleaved (repeat r starts with setting r % 2), and
the guard's setting chosen by ``COEC_LLAMACPP_EXTRA_BUFTS``:

    python benchmarks/llamacpp_extra_buffers.py results/smollm2-135m/dense/export-q8_0.gguf \
        results/smollm2-135m/dense/export-f16.gguf --repeats 5 --threads 2

Prints a table: median tokens/s with the buffers on and off, and off / on.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from coec.deploy.worker import MARK
from coec.evaluate.llamacpp_amx import ENV, describe


def measure(path: str, mode: str, prompt: int, new_tokens: int, threads: int) -> dict:
    """One worker run of ``path`` with the extra buffers ``mode`` ('on' | 'off')."""
    job = {
        "runtime": "llamacpp",
        "dtype": "gguf",
        "path": path,
        "prompt": [(7 * i + 11) % 4000 + 100 for i in range(prompt)],
        "new_tokens": new_tokens,
        "threads": threads,
        "device": "cpu",
    }
    env = {**os.environ, ENV: mode, "OMP_NUM_THREADS": str(threads)}
    proc = subprocess.run(
        [sys.executable, "-m", "coec.deploy.worker", json.dumps(job)], capture_output=True, text=True, env=env
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(MARK)]
    if proc.returncode or not lines:
        raise RuntimeError(f"{path} ({mode}): exit {proc.returncode}: {proc.stderr[-2000:]}")
    out = json.loads(lines[-1].removeprefix(MARK))
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
