"""Provenance of the model a result was computed from: its source, the requested and resolved
revision, and a content hash of its weight files (docs/provenance.md).

``weights_sha256`` is the sha256 of a manifest listing every ``*.safetensors`` file of the
model folder by name with its own sha256. A file's sha256 is read from the hub cache where the
file is a hub LFS blob (the blob's name is the sha256 the hub recorded for it), else computed
once and remembered in a small sidecar cache keyed on the file's path, size and mtime, so
stages after the first do not reread a 16 GB checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from pathlib import Path
from typing import Any

from coec.data.bundled import file_sha256
from coec.io.atomic import write_text
from coec.registry import USED_PLUGINS, plugin_digests

log = logging.getLogger(__name__)

_HEX64 = re.compile(r"[0-9a-f]{64}")
_COMMIT = re.compile(r"[0-9a-f]{40}")
#: hex digits of a file's sha256 that a plan records (change detection, not a content address)
PLAN_DIGITS = 16
_SNAPSHOT = re.compile(r"[/\\]snapshots[/\\]([0-9a-f]{40})(?:[/\\]|$)")


def digest_cache_dir() -> Path:
    """Where computed file digests are remembered: $COEC_DIGEST_CACHE or ~/.cache/coec/digests."""
    return Path(os.environ.get("COEC_DIGEST_CACHE", Path.home() / ".cache" / "coec" / "digests"))


def file_digest(path: str | Path, cache: str | Path | None = None) -> str:
    """sha256 of one file: a hub LFS blob's own name, a cached digest whose path, size and
    mtime still match, or a fresh read (then cached; an unwritable cache is skipped). A file
    whose size or mtime moved since its digest was cached is read again, and the log says
    whether its contents changed (a touch leaves the digest, so nothing that depends on it)."""
    real = Path(os.path.realpath(path))
    if real.parent.name == "blobs" and _HEX64.fullmatch(real.name):
        return real.name
    st = real.stat()
    key = {"path": str(real), "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    cache = Path(cache) if cache is not None else digest_cache_dir()
    entry = cache / (hashlib.sha256(str(real).encode()).hexdigest()[:32] + ".json")
    saved: dict[str, Any] = {}
    try:
        saved = json.loads(entry.read_text())
        if {k: saved.get(k) for k in key} == key and _HEX64.fullmatch(saved.get("sha256", "")):
            known: str = saved["sha256"]
            return known
    except (OSError, ValueError):
        pass
    digest = file_sha256(real)
    if saved.get("sha256"):
        log.warning(
            "%s: size or mtime changed since it was hashed; its contents %s",
            real,
            "are unchanged" if saved["sha256"] == digest else "changed",
        )
    try:
        write_text(entry, json.dumps({**key, "sha256": digest}))
    except OSError:
        pass
    return digest


def weight_files(model_dir: str | Path) -> list[Path]:
    """The ``*.safetensors`` files of a model folder, sorted by name."""
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no safetensors weights in {model_dir}")
    return files


def weights_manifest(model_dir: str | Path, cache: str | Path | None = None) -> dict[str, str]:
    """``{file name: sha256}`` of the folder's weight files (``weight_files``), sorted by name."""
    return {f.name: file_digest(f, cache) for f in weight_files(model_dir)}


def weights_digest(model_dir: str | Path, cache: str | Path | None = None) -> str:
    """sha256 of the manifest ``<name> <sha256>\\n`` over the folder's sorted weight files."""
    return manifest_digest(weights_manifest(model_dir, cache))


def manifest_digest(manifest: dict[str, str]) -> str:
    """sha256 of the manifest ``<name> <sha256>\\n`` of a :func:`weights_manifest`."""
    lines = "".join(f"{name} {sha}\n" for name, sha in manifest.items())
    return hashlib.sha256(lines.encode()).hexdigest()


def hub_commit(repo_id: str, revision: str | None = None) -> str | None:
    """The commit a hub revision (default ``main``) resolves to: a 40-hex revision is one
    already; else the local HF cache's ``refs/<revision>``; else, when not offline
    (``HF_HUB_OFFLINE``), the hub's answer; else None (unknown here: a first download decides)."""
    rev = revision or "main"
    if _COMMIT.fullmatch(rev):
        return rev
    # deferred: only a hub model needs the hub client (+0.4 s on every job's start, measured)
    from huggingface_hub import HfApi, constants
    from huggingface_hub.file_download import repo_folder_name

    ref = Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=repo_id, repo_type="model") / "refs" / rev
    if ref.is_file() and _COMMIT.fullmatch(ref.read_text().strip()):
        return ref.read_text().strip()
    if constants.HF_HUB_OFFLINE:
        return None
    try:
        sha = HfApi().model_info(repo_id, revision=rev, timeout=10).sha
    except Exception:  # noqa: BLE001 - no network, no access: the first download resolves it
        return None
    return sha if sha and _COMMIT.fullmatch(sha) else None


def planned_identity(source: str, revision: str | None = None) -> dict[str, Any]:
    """What the workflow records of a model's weights when it plans a job, and the stage checks
    again before any work (``modelcheck.check_identity``): for a local folder
    ``{"weights": {file: sha256 prefix}}`` (digests cached on path, size and mtime: a plan reads
    no unchanged file), for a hub id ``{"commit": <40 hex>}`` (``hub_commit``), ``{}`` when
    neither is known (an embedded model, a workflow output; a hub id not resolvable here).
    A job's rule parameters hold it, so changed weights re-plan exactly that model's jobs."""
    path = Path(source).expanduser()
    if path.is_dir():
        return {"weights": {name: sha[:PLAN_DIGITS] for name, sha in weights_manifest(path).items()}}
    if source.startswith((".", "/", "~")) or path.exists():
        return {}  # a missing folder or a file: the stage names the problem
    commit = hub_commit(source, revision)
    return {"commit": commit} if commit else {}


def resolved_commit(model_dir: str | Path) -> str | None:
    """The hub commit a snapshot folder holds (``.../snapshots/<commit>``); None for a plain folder."""
    m = _SNAPSHOT.search(str(Path(model_dir).absolute()) + os.sep)
    return m.group(1) if m else None


def model_provenance(
    source: str | Path,
    revision: str | None = None,
    trust_remote_code: bool = False,
    model_dir: str | Path | None = None,
    manifest: dict[str, str] | None = None,
) -> dict[str, Any]:
    """``{source, revision, commit, trust_remote_code, weights_sha256}`` of a model source as a
    stage loads it (``model_dir``: the folder already resolved from it, else resolved here;
    ``manifest``: its :func:`weights_manifest` already read, else read here), and ``plugins``
    when the stage used a plug-in's entries (``plugin_record``). A stage's resolved cell gives
    both (``CellSource.provenance``)."""
    if model_dir is None:
        from coec.model.load import resolve_model_dir  # deferred: keeps the job boundary torch-free

        model_dir = resolve_model_dir(str(source), revision, trust_remote_code)
    return {
        "source": str(source),
        "revision": revision,
        "commit": resolved_commit(model_dir),
        "trust_remote_code": bool(trust_remote_code),
        "weights_sha256": manifest_digest(weights_manifest(model_dir) if manifest is None else manifest),
        **plugin_record(),
    }


def plugin_record() -> dict[str, Any]:
    """``{"plugins": {plug-in: sha256 of its code}}`` of the plug-ins whose entries (method,
    score, model family, task, export format) this process looked up; ``{}`` when none, so a
    result of built-in code alone is as it was."""
    return {"plugins": plugin_digests(USED_PLUGINS)} if USED_PLUGINS else {}
