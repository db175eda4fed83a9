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

For a two-choice task (BoolQ, RTE, WinoGrande) accuracy mixes two things: how well the margin
``m_i = loglik(choice 1) - loglik(choice 0)`` ranks the documents, and where zero falls in its
distribution (a model that leans to one answer scores that answer's base rate). ``two_choice``
separates them: the rate of choosing choice 1 (the prior) and the AUC of the margin against the
label (the probability that a random choice-1 document has a larger margin than a random
choice-0 one, ties 1/2), which no constant shift of the margin changes. ``--two-choice`` prints
both for A and B, and how their margins agree document by document (``margin_agreement``: the
mean shift and the correlation; a shift at correlation near 1 is a change of prior alone).
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from coec.evaluate.tasks import task_spec


def _sample_rows(result_dir: str | Path, task: str) -> tuple[Path, list[dict[str, Any]]]:
    """(path, records) of ``<result_dir>/zeroshot_samples/<task>.jsonl``, lm-eval's per-sample
    records; raises when the file is missing (zeroshot run without --log-samples)."""
    path = Path(result_dir) / "zeroshot_samples" / f"{task}.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no per-sample records (run zeroshot with --log-samples)")
    return path, [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def per_document(result_dir: str | Path, task: str) -> dict[int, float]:
    """``{doc_id: metric}`` of one task from ``<result_dir>/zeroshot_samples/<task>.jsonl``,
    the metric the tables report (``TaskSpec.metric``)."""
    metric = task_spec(task).metric
    _, rows = _sample_rows(result_dir, task)
    return {int(row["doc_id"]): float(row[metric]) for row in rows}


def _stats(xs: list[float]) -> tuple[float, float]:
    """(mean, standard error of the mean) with the n - 1 sample variance."""
    n = len(xs)
    m = sum(xs) / n
    var = sum((x - m) ** 2 for x in xs) / (n - 1) if n > 1 else 0.0
    return m, math.sqrt(var / n)


def paired_difference(a: dict[str, dict[int, float]], b: dict[str, dict[int, float]]) -> dict[str, Any]:
    """A - B per task and for the mean over tasks, paired over the documents both scored.

    a, b: ``{task: {doc_id: metric}}`` (``per_document``). Returns ``{"tasks": {task: {"n",
    "a", "b", "diff", "se", "se_unpaired"}}, "diff", "se", "se_unpaired", "z"}``; ``z`` = diff
    / se (0 when se is 0 and diff is 0). Raises when a task is missing or shares no document.
    """
    tasks: dict[str, dict[str, float]] = {}
    for task in a:
        if task not in b:
            raise KeyError(f"task {task} is in A but not in B")
        docs = sorted(set(a[task]) & set(b[task]))
        if not docs:
            raise ValueError(f"task {task}: the two results share no document")
        xa, xb = [a[task][i] for i in docs], [b[task][i] for i in docs]
        (ma, sa), (mb, sb) = _stats(xa), _stats(xb)
        md, sd = _stats([p - q for p, q in zip(xa, xb, strict=True)])
        tasks[task] = {"n": len(docs), "a": ma, "b": mb, "diff": md, "se": sd, "se_unpaired": math.hypot(sa, sb)}
    T = len(tasks)
    diff = sum(t["diff"] for t in tasks.values()) / T
    se = math.sqrt(sum(t["se"] ** 2 for t in tasks.values())) / T
    se_u = math.sqrt(sum(t["se_unpaired"] ** 2 for t in tasks.values())) / T
    z = diff / se if se > 0 else (0.0 if diff == 0 else math.copysign(math.inf, diff))
    return {"tasks": tasks, "diff": diff, "se": se, "se_unpaired": se_u, "z": z}


def margins(result_dir: str | Path, task: str) -> dict[int, tuple[float, int]]:
    """``{doc_id: (m, label)}`` of a two-choice task: the margin loglik(choice 1) -
    loglik(choice 0) of each document and its gold choice (0 or 1), from its per-sample records
    (the target index, or, where the target is the gold text, the choice its ``acc`` says is
    right). Raises when a record does not have exactly two choices."""
    path, rows = _sample_rows(result_dir, task)
    out = {}
    for row in rows:
        resps = row["filtered_resps"]
        if len(resps) != 2:
            raise ValueError(f"{path}: doc {row['doc_id']} has {len(resps)} choices, not 2")
        loglik = [float(r[0]) for r in resps]
        target = str(row["target"])
        if target in ("0", "1"):
            label = int(target)
        else:  # target is the gold text (WinoGrande): from acc
            picked = int(loglik[1] > loglik[0])
            label = picked if float(row["acc"]) == 1.0 else 1 - picked
        out[int(row["doc_id"])] = (loglik[1] - loglik[0], label)
    return out


def two_choice(pairs: Iterable[tuple[float, int]]) -> dict[str, float]:
    """Prior and discrimination of a two-choice task from ``(m, label)`` pairs (the values of
    ``margins``): ``{"n", "acc", "choice1_rate", "label1_rate", "auc"}``. ``acc`` picks choice 1
    where the margin is positive (lm-eval's argmax; a tie picks choice 0); ``auc`` is the Mann-Whitney statistic
    P(m_pos > m_neg) + P(m_pos = m_neg) / 2 over label-1 (pos) and label-0 (neg) documents, by
    ranks (O(n log n)); NaN when one label is absent."""
    pairs = list(pairs)
    n = len(pairs)
    if n == 0:
        raise ValueError("no documents")
    acc = sum((m > 0) == (y == 1) for m, y in pairs) / n
    n_pos = sum(y == 1 for _, y in pairs)
    n_neg = n - n_pos
    auc = math.nan
    if n_pos and n_neg:
        order = sorted(range(n), key=lambda i: pairs[i][0])
        rank_sum, i = 0.0, 0
        while i < n:  # average ranks (1-based) over runs of tied margins
            j = i
            while j + 1 < n and pairs[order[j + 1]][0] == pairs[order[i]][0]:
                j += 1
            mid = (i + j) / 2 + 1
            rank_sum += mid * sum(pairs[order[k]][1] == 1 for k in range(i, j + 1))
            i = j + 1
        auc = (rank_sum - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)
    return {"n": n, "acc": acc, "choice1_rate": sum(m > 0 for m, _ in pairs) / n, "label1_rate": n_pos / n, "auc": auc}


def margin_agreement(a: dict[int, tuple[float, int]], b: dict[int, tuple[float, int]]) -> dict[str, float]:
    """How two results' margins (``margins``) agree on the documents both scored: ``{"n",
    "shift": mean(m_a - m_b), "corr": Pearson r of m_a and m_b}`` (r NaN where a margin is
    constant). A shift with r near 1 is a change of prior alone. Raises when no document is
    shared or a shared document's label differs."""
    docs = sorted(set(a) & set(b))
    if not docs:
        raise ValueError("the two results share no document")
    if any(a[i][1] != b[i][1] for i in docs):
        raise ValueError("a shared document has different gold labels in the two results")
    ma, mb = [a[i][0] for i in docs], [b[i][0] for i in docs]
    n = len(ma)
    ca, cb = sum(ma) / n, sum(mb) / n
    sab = sum((x - ca) * (y - cb) for x, y in zip(ma, mb, strict=True))
    saa = sum((x - ca) ** 2 for x in ma)
    sbb = sum((y - cb) ** 2 for y in mb)
    corr = sab / math.sqrt(saa * sbb) if saa > 0 and sbb > 0 else math.nan
    return {"n": n, "shift": ca - cb, "corr": corr}


def load(result_dir: str | Path, tasks: list[str] | None = None) -> dict[str, dict[int, float]]:
    """Per-document metrics of every task of a result (its ``zeroshot.json``'s task list)."""
    if tasks is None:
        tasks = json.loads((Path(result_dir) / "zeroshot.json").read_text())["tasks"]
    return {t: per_document(result_dir, t) for t in tasks}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a", help="result folder A (holds zeroshot.json and zeroshot_samples/)")
    ap.add_argument("b", help="result folder B")
    ap.add_argument("--tasks", default=None, help="comma-separated (default: A's tasks)")
    ap.add_argument(
        "--two-choice",
        action="store_true",
        help="also print, for each two-choice task, the rate of choosing choice 1 and "
        "the margin's AUC (threshold-free) of A and B",
    )
    args = ap.parse_args(argv)
    tasks = args.tasks.split(",") if args.tasks else None
    a = load(args.a, tasks)
    res = paired_difference(a, load(args.b, list(a)))
    print(f"A = {args.a}\nB = {args.b}\n")
    print(f"{'task':<14} {'n':>5} {'A':>7} {'B':>7} {'A-B':>7} {'paired SE':>10} {'unpaired SE':>12}")
    for task, t in res["tasks"].items():
        print(
            f"{task:<14} {t['n']:>5} {100 * t['a']:7.2f} {100 * t['b']:7.2f} {100 * t['diff']:7.2f} "
            f"{100 * t['se']:10.2f} {100 * t['se_unpaired']:12.2f}"
        )
    print(
        f"{'mean':<14} {'':>5} {'':>7} {'':>7} {100 * res['diff']:7.2f} {100 * res['se']:10.2f} "
        f"{100 * res['se_unpaired']:12.2f}   z = {res['z']:.2f}"
    )
    if args.two_choice:
        print(f"\n{'two-choice':<14} {'':>5} {'choice 1 %':>11} {'gold 1 %':>9} {'AUC':>6}   (A, then B)")
        for task in res["tasks"]:
            try:
                ms = [margins(d, task) for d in (args.a, args.b)]
            except ValueError:
                continue  # not a two-choice task
            for tag, m in zip("AB", ms, strict=True):
                st = two_choice(m.values())
                print(
                    f"{task + ' ' + tag:<14} {st['n']:>5} {100 * st['choice1_rate']:11.1f} "
                    f"{100 * st['label1_rate']:9.1f} {st['auc']:6.3f}"
                )
            ag = margin_agreement(*ms)
            print(f"{task + ' A-B':<14} margin shift {ag['shift']:+.3f}, correlation {ag['corr']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
