"""Paired comparison of two zero-shot results on the same documents.

Two compensations scored on the same documents differ by far less noise than two independent
samples would: the documents both get right (or both wrong) cancel. With ``d_i = a_i - b_i`` the
per-document difference of a task's metric (0/1), the task's difference is ``mean(d)`` with
standard error ``sd(d) / sqrt(n)``; the mean over T tasks (the tables' "mean7") differs by
``D = mean_t mean(d_t)`` with ``SE(D) = sqrt(sum_t SE_t^2) / T`` (tasks independent). The
unpaired standard error of the same difference is ``sqrt(SE_a^2 + SE_b^2)`` per task.

    python -m coec.evaluate.paired RESULT_DIR_A RESULT_DIR_B [--tasks boolq,rte,...]

reads ``<dir>/zeroshot.json`` and its ``zeroshot_samples/<task>.jsonl`` (``--log-samples``,
which the workflow always passes) and prints the per-task and mean differences (A - B, points).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from .tasks import task_spec

__all__ = ["per_document", "paired_difference", "main"]


def per_document(result_dir: str | Path, task: str) -> dict[int, float]:
    """``{doc_id: metric}`` of one task from ``<result_dir>/zeroshot_samples/<task>.jsonl``,
    the metric the tables report (``TaskSpec.metric``)."""
    metric = task_spec(task).metric
    path = Path(result_dir) / "zeroshot_samples" / f"{task}.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no per-sample records (run zeroshot with --log-samples)")
    out = {}
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            out[int(row["doc_id"])] = float(row[metric])
    return out


def _stats(xs: list[float]) -> tuple[float, float]:
    """(mean, standard error of the mean) with the n - 1 sample variance."""
    n = len(xs)
    m = sum(xs) / n
    var = sum((x - m) ** 2 for x in xs) / (n - 1) if n > 1 else 0.0
    return m, math.sqrt(var / n)


def paired_difference(a: dict[str, dict[int, float]], b: dict[str, dict[int, float]]) -> dict:
    """A - B per task and for the mean over tasks, paired over the documents both scored.

    a, b: ``{task: {doc_id: metric}}`` (``per_document``). Returns ``{"tasks": {task: {"n",
    "a", "b", "diff", "se", "se_unpaired"}}, "diff", "se", "se_unpaired", "z"}``; ``z`` = diff
    / se (0 when se is 0 and diff is 0). Raises when a task is missing or shares no document.
    """
    tasks = {}
    for task in a:
        if task not in b:
            raise KeyError(f"task {task} is in A but not in B")
        docs = sorted(set(a[task]) & set(b[task]))
        if not docs:
            raise ValueError(f"task {task}: the two results share no document")
        xa, xb = [a[task][i] for i in docs], [b[task][i] for i in docs]
        (ma, sa), (mb, sb) = _stats(xa), _stats(xb)
        md, sd = _stats([p - q for p, q in zip(xa, xb)])
        tasks[task] = {"n": len(docs), "a": ma, "b": mb, "diff": md, "se": sd,
                       "se_unpaired": math.hypot(sa, sb)}
    T = len(tasks)
    diff = sum(t["diff"] for t in tasks.values()) / T
    se = math.sqrt(sum(t["se"] ** 2 for t in tasks.values())) / T
    se_u = math.sqrt(sum(t["se_unpaired"] ** 2 for t in tasks.values())) / T
    z = diff / se if se > 0 else (0.0 if diff == 0 else math.copysign(math.inf, diff))
    return {"tasks": tasks, "diff": diff, "se": se, "se_unpaired": se_u, "z": z}


def load(result_dir: str | Path, tasks: list[str] | None = None) -> dict[str, dict[int, float]]:
    """Per-document metrics of every task of a result (its ``zeroshot.json``'s task list)."""
    if tasks is None:
        tasks = json.loads((Path(result_dir) / "zeroshot.json").read_text())["tasks"]
    return {t: per_document(result_dir, t) for t in tasks}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a", help="result folder A (holds zeroshot.json and zeroshot_samples/)")
    ap.add_argument("b", help="result folder B")
    ap.add_argument("--tasks", default=None, help="comma-separated (default: A's tasks)")
    args = ap.parse_args(argv)
    tasks = args.tasks.split(",") if args.tasks else None
    a = load(args.a, tasks)
    res = paired_difference(a, load(args.b, list(a)))
    print(f"A = {args.a}\nB = {args.b}\n")
    print(f"{'task':<14} {'n':>5} {'A':>7} {'B':>7} {'A-B':>7} {'paired SE':>10} {'unpaired SE':>12}")
    for task, t in res["tasks"].items():
        print(f"{task:<14} {t['n']:>5} {100 * t['a']:7.2f} {100 * t['b']:7.2f} {100 * t['diff']:7.2f} "
              f"{100 * t['se']:10.2f} {100 * t['se_unpaired']:12.2f}")
    print(f"{'mean':<14} {'':>5} {'':>7} {'':>7} {100 * res['diff']:7.2f} {100 * res['se']:10.2f} "
          f"{100 * res['se_unpaired']:12.2f}   z = {res['z']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
