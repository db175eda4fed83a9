"""Zero-shot accuracy through lm-eval on an in-memory model (paper protocol: 0-shot, 7 tasks).

The tasks are defined once, in the registry :mod:`coec.evaluate.tasks` (lm-eval's own task
YAMLs, included at run time with only the data source overridden); the offline data they read is
built by :mod:`coec.data.zeroshot` (stage ``prepare-zeroshot``). This module runs them.

:func:`run_zeroshot` wraps the model in ``HFLM`` without saving it. With a ``data_dir`` it renders
a temporary include dir of wrapper YAMLs (``include:`` lm-eval's YAML by absolute path, local
JSONL ``data_files``) and loads them with ``TaskManager(include_path=...)``; without one it runs
lm-eval's built-in tasks (hub datasets, for clusters). :func:`zeroshot_with_records` also returns
lm-eval's own records (aggregated file, per-sample JSONL).
"""

from __future__ import annotations

import json
import logging
import math
import random
import re
import tempfile
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from coec.evaluate.options import ZeroshotOptions
from coec.evaluate.tasks import PAPER_TASKS, TASKS, TaskSpec, builtin_yaml_source, data_file, render_task_dir, task_spec
from coec.io.artifacts import log_timings, write_result
from coec.io.atomic import write_bytes
from coec.io.progress import routed_tqdm
from coec.model.source import CellSource

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------- evaluation


def _metric_table(res: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``{"acc,none": v, "acc_stderr,none": s}`` -> ``{"acc": {"value": v, "stderr": s}}``."""
    out: dict[str, dict[str, Any]] = {}
    for key, val in res.items():
        name, _, filt = key.partition(",")
        if filt != "none" or name.endswith("_stderr"):
            continue
        stderr = res.get(f"{name}_stderr,none")
        out[name] = {"value": _num(val), "stderr": _num(stderr)}
    return out


def _num(x: Any) -> float | None:
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def summarize(
    raw: dict[str, Any], specs: list[TaskSpec], lm_names: list[str], limit: int | None, source: str
) -> dict[str, Any]:
    """Reduce lm-eval's results dict to the JSON-serialisable record we store."""
    import lm_eval  # deferred: lm_eval is an optional dependency

    tasks = {}
    for spec, name in zip(specs, lm_names, strict=False):
        metrics = _metric_table(raw["results"][name])
        if spec.metric not in metrics:
            raise KeyError(f"{name}: lm-eval reported no {spec.metric} (got {sorted(metrics)})")
        n = raw.get("n-samples", {}).get(name, {})
        tasks[spec.name] = {
            "lm_eval_task": name,
            "builtin_task": spec.builtin,
            "task_version": raw.get("versions", {}).get(name),
            "split": spec.split,
            "n_docs": n.get("effective"),
            "n_docs_total": n.get("original"),
            "metric": spec.metric,
            "value": metrics[spec.metric]["value"],
            "stderr": metrics[spec.metric]["stderr"],
            "metrics": metrics,
        }
    paper = {t: tasks[t]["value"] for t in PAPER_TASKS if t in tasks}
    out = {
        "lm_eval_version": lm_eval.__version__,
        "source": source,
        "num_fewshot": 0,
        "limit": limit,
        "tasks": tasks,
        "paper_metrics": paper,
    }
    if len(paper) == len(PAPER_TASKS):
        out["mean7"] = sum(paper.values()) / len(paper)
    return out


def _check_limit(limit: int | None) -> int | None:
    if limit is None:
        return None
    if isinstance(limit, bool) or int(limit) != limit or limit < 1:
        raise ValueError(f"limit must be a positive integer (docs per task) or None, got {limit!r}")
    return int(limit)


@contextmanager
def _kept_rng_state() -> Iterator[Any]:
    """lm-eval resets the random generators of Python, NumPy and torch; give the caller its own back."""
    states = random.getstate(), np.random.get_state(), torch.get_rng_state()
    try:
        yield
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])


def _evaluate(
    lm: Any, task_names: list[str], task_manager: Any, limit: int | None, *, log_samples: bool = False
) -> dict[str, Any]:
    """lm-eval's simple_evaluate, 0-shot, first ``limit`` docs per task; with ``log_samples``
    the result also holds lm-eval's per-sample records under ``"samples"``."""
    import lm_eval.api.task as lm_task  # deferred: lm_eval is an optional dependency
    import lm_eval.models.huggingface as lm_hf  # deferred: lm_eval is an optional dependency
    from lm_eval import simple_evaluate  # deferred: lm_eval is an optional dependency

    # lm-eval's request loop (the long part) reports like every other stage (coec.io.progress)
    with _kept_rng_state(), routed_tqdm(lm_hf, lm_task):
        res: dict[str, Any] = simple_evaluate(
            model=lm, tasks=task_names, num_fewshot=0, limit=limit, task_manager=task_manager, log_samples=log_samples
        )
    return res


# ---------------------------------------------------------------------------- lm-eval's records

# keys of lm-eval's aggregated results file that change from run to run (dates, timings)
VOLATILE_KEYS = ("date", "start_time", "end_time", "total_evaluation_time_seconds")
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+>")  # "<function f at 0x7f..>" -> "<function f>"


def lm_eval_records(
    raw: dict[str, Any], specs: list[TaskSpec], lm_names: list[str], config_sources: dict[str, str] | None = None
) -> dict[str, Any]:
    """lm-eval's own files for this run, written by its ``EvaluationTracker`` and made
    deterministic: ``{"aggregated": dict, "samples": {task: JSONL text}}``.

    ``aggregated`` is what ``save_results_aggregated`` writes (results, configs, versions,
    n-shot, higher_is_better, n-samples, config, git_hash, lm-eval/transformers versions,
    task_hashes) less :data:`VOLATILE_KEYS`, with object addresses dropped and each config's
    ``metadata.config_source`` set from ``config_sources`` (lm name -> lm-eval's included YAML;
    the rendered wrapper lives in a temporary folder). ``samples`` (only when ``raw`` holds them, i.e. the
    run logged samples) is ``save_results_samples``' JSONL per task, keyed by our task name.
    """
    from lm_eval.loggers import EvaluationTracker  # deferred: lm_eval is an optional dependency

    results = {k: v for k, v in raw.items() if k != "samples"}
    samples = raw.get("samples")
    out: dict[str, Any] = {"samples": {}}
    with tempfile.TemporaryDirectory(prefix="coec_lm_eval_") as tmp:
        tracker = EvaluationTracker(output_path=str(Path(tmp) / "results.json"))
        tracker.save_results_aggregated(results=results, samples=samples)
        written = sorted(Path(tmp).glob("results_*.json"))
        if len(written) != 1:
            raise FileNotFoundError(f"lm-eval's EvaluationTracker wrote no results file in {tmp}")
        agg = json.loads(_ADDRESS.sub(">", written[0].read_text(encoding="utf-8")))
        if samples:
            for spec, name in zip(specs, lm_names, strict=False):
                tracker.save_results_samples(task_name=name, samples=samples[name])
                files_ = list(Path(tmp).glob(f"samples_{name}_*.jsonl"))
                if len(files_) != 1:
                    raise FileNotFoundError(f"lm-eval wrote no per-sample file for {name}")
                out["samples"][spec.name] = _ADDRESS.sub(">", files_[0].read_text(encoding="utf-8"))
    for key in VOLATILE_KEYS:
        agg.pop(key, None)
    for name, src in (config_sources or {}).items():
        meta = agg.get("configs", {}).get(name, {}).get("metadata")
        if isinstance(meta, dict) and "config_source" in meta:
            meta["config_source"] = src
    out["aggregated"] = agg
    return out


def write_records(records: dict[str, Any], out_json: str | Path) -> list[Path]:
    """Write :func:`lm_eval_records` next to ``out_json`` (``<dir>/zeroshot.json``):
    ``<stem>_lm_eval.json`` and, when samples were logged, ``<stem>_samples/<task>.jsonl``.
    Returns the paths written."""
    out = Path(out_json)
    agg = out.with_name(f"{out.stem}_lm_eval.json")
    write_bytes(agg, (json.dumps(records["aggregated"], indent=2, ensure_ascii=False) + "\n").encode("utf-8"))
    paths = [agg]
    if records["samples"]:
        folder = out.with_name(f"{out.stem}_samples")
        folder.mkdir(parents=True, exist_ok=True)
        for task, text in records["samples"].items():
            write_bytes(folder / f"{task}.jsonl", text.encode("utf-8"))
            paths.append(folder / f"{task}.jsonl")
    return paths


def write_zeroshot(
    out: str | Path, res: dict[str, Any], records: dict[str, Any], provenance: dict[str, Any], source: CellSource,
    t0: float,
) -> dict[str, Any]:  # fmt: skip
    """The summary ``out`` (zeroshot.json: ``res`` with the model's provenance, the cell's dtype
    and labels and the seconds since ``t0``, timings logged and kept out of the file) and
    lm-eval's records next to it (:func:`write_records`): the one builder of zeroshot.json."""
    res.update(
        {"model": provenance, "dtype": source.dtype, "cell": source.cell, "total_seconds": round(time.time() - t0, 3)}
    )
    write_records(records, out)
    log_timings(str(out), res)
    write_result(out, res, "zeroshot")  # timings stay in the log
    return res


def rescore_samples(rows: Iterable[dict[str, Any]], target_delimiter: str = " ") -> dict[str, float]:
    """Recompute a multiple-choice task's ``acc`` and ``acc_norm`` from lm-eval's per-sample
    records (one JSONL row each): the argmax of the choices' log-likelihoods, raw and divided
    by the choice's length in characters (lm-eval's acc_norm), against the gold index. Tasks
    that put the choices in the context (winogrande: one continuation, gold from the doc's
    ``answer``) have no acc_norm."""
    hits: dict[str, list[bool]] = {"acc": [], "acc_norm": []}
    for row in rows:
        lls = [float(r[0]) for r in row["filtered_resps"]]
        gold = _gold_index(row)
        hits["acc"].append(max(range(len(lls)), key=lambda i: (lls[i], -i)) == gold)
        conts = [a["arg_1"] for a in row["arguments"].values()]
        if len(set(conts)) == len(conts):  # distinct continuations = the choices
            lens = [len(c[len(target_delimiter) :] if c.startswith(target_delimiter) else c) for c in conts]
            norm = [ll / n for ll, n in zip(lls, lens, strict=False)]
            hits["acc_norm"].append(max(range(len(norm)), key=lambda i: (norm[i], -i)) == gold)
    return {k: sum(v) / len(v) for k, v in hits.items() if v}


def _gold_index(row: dict[str, Any]) -> int:
    """The gold choice of a per-sample record: its target, or winogrande's ``answer`` ("1"/"2")
    when the target is the shared continuation text."""
    try:
        return int(row["target"])
    except ValueError:
        answer = str(row.get("doc", {}).get("answer", ""))
        if answer.isdigit():
            return int(answer) - 1
        raise ValueError(f"doc {row.get('doc_id')}: no gold index in target {row['target'][:40]!r}") from None


def zeroshot_with_records(
    model: Any, tokenizer: Any, options: ZeroshotOptions, *, lm: Any = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """:func:`run_zeroshot` that also returns lm-eval's own records (:func:`lm_eval_records`;
    per-sample JSONL when ``options.log_samples``): ``(summary, records)``. ``lm``: an lm-eval
    ``LM`` to score with instead of ``HFLM`` around ``model`` (e.g. ``layerwise_lm.LayerwiseLM``)."""
    from lm_eval.models.huggingface import HFLM  # deferred: lm_eval is an optional dependency
    from lm_eval.tasks import TaskManager  # deferred: lm_eval is an optional dependency

    data_dir, batch_size, max_length = options.data_dir, options.batch_size, options.max_length
    specs = [task_spec(t) for t in dict.fromkeys(options.tasks)]
    if not specs:
        raise ValueError(f"no zero-shot tasks given; known: {', '.join(TASKS)}")
    limit = _check_limit(options.limit)
    if data_dir is not None:
        for spec in specs:  # fail before touching the model
            data_file(spec, data_dir)
    if lm is None:
        model.eval()
        lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size, max_length=max_length)
    t0 = time.time()
    extra = {"log_samples": True} if options.log_samples else {}
    if data_dir is None:
        names = [s.builtin for s in specs]
        raw = _evaluate(lm, names, None, limit, **extra)  # lm-eval's default TaskManager
        source, includes = "builtin", None
    else:
        with tempfile.TemporaryDirectory(prefix="coec_tasks_") as tmp:
            names = render_task_dir([s.name for s in specs], data_dir, tmp)
            # the wrapper lives in tmp: name lm-eval's included YAML instead (machine-independent)
            includes = {n: builtin_yaml_source(s) for n, s in zip(names, specs, strict=False)}
            raw = _evaluate(lm, names, TaskManager(include_path=tmp, include_defaults=False), limit, **extra)
        source = "local"
    out = summarize(raw, specs, names, limit, source)
    out.update(batch_size=batch_size, max_length=max_length)
    log.info(
        "zero-shot: %s in %.1fs (limit=%s)",
        ", ".join(f"{k}={v}" for k, v in out["paper_metrics"].items()),
        time.time() - t0,
        limit,
    )
    return out, lm_eval_records(raw, specs, names, includes)
