"""Every on-disk format between workflow rules, written and read in one place (docs/artifacts.md).

Writers are atomic (``coec.io.atomic``: temp file, fsync, rename; mode ``0666 & ~umask``),
safetensors included. Writers are deterministic: safetensors headers are serialised with sorted
keys (tensors in a fixed order, metadata sorted; the byte layout is ``coec.io.safetensors_file``),
JSON keeps the caller's key order, and nothing host- or time-dependent is written
(:func:`without_timings`).

Readers check what they read and raise :class:`ArtifactError`, one line ``<path>: <problem>``
(truncated, not a safetensors file, wrong format version, missing tensor, wrong shape,
non-finite values, bad JSON at line n, ...). Every coec file records its format name and version
(``coec_format`` / ``coec_format_version``: safetensors ``__metadata__`` entries, the first keys
of a JSON object); a file without them was written before versions existed and is read as
version 1, which is the same layout.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict, TypeVar

import torch
from safetensors import SafetensorError, safe_open

from coec.io.atomic import write_chunks, write_text
from coec.io.errors import ArtifactError, need_file
from coec.io.errors import MissingArtifact as MissingArtifact  # artifacts.MissingArtifact, as ever
from coec.io.safetensors_file import safetensors_chunks, safetensors_header
from coec.model.arch import COMP_KEY, MODULES

if TYPE_CHECKING:
    import pandas as pd

FORMAT_KEY = "coec_format"
VERSION_KEY = "coec_format_version"

#: Format name -> current version. A reader accepts exactly this version (or no version: 1).
FORMATS = {
    "gram": 1,  # results/{model}/grams/{calib}/layer{i}.safetensors
    "gram-meta": 1,  # results/{model}/grams/{calib}/meta.json
    "gram-check": 1,  # results/{model}/gram_checks/{calib}.json
    "keep": 1,  # results/{model}/{calib}/{select}-{ratio}/keep.json
    "comp-block": 1,  # .../{comp}/block{a}-{b}.safetensors (also the iterative block file)
    "comp-info": 1,  # .../{comp}/block{a}-{b}.json
    "ppl": 1,  # .../ppl.json
    "zeroshot": 1,  # .../zeroshot.json
    "kl-reference": 1,  # results/{model}/dense/kl-reference.safetensors
    "iterative-state": 1,  # iterative step folder: state.safetensors
    "iterative-info": 1,  # iterative step folder / cell: iterative.json
    "search-candidates": 1,  # results/{model}/{calib}/search/{select}/{comp}/layer{i}.safetensors
    "search-candidates-info": 1,  # .../layer{i}.json
    "search": 1,  # results/{model}/{calib}/{select}-{ratio}/search.json (a width search's record)
}

#: Columns a geometry.csv must have (CSV files carry no version; their header is checked).
GEOMETRY_COLUMNS = ("layer", "module", "r")

T = TypeVar("T")

_TIMING = re.compile(r"(^|_)(seconds|secs|elapsed|duration|date|time|timestamp|hostname|host)(_|$)")


def with_format(obj: dict[str, Any], fmt: str) -> dict[str, Any]:
    """``obj`` with ``coec_format`` / ``coec_format_version`` as its first keys."""
    _version(fmt)
    rest = {k: v for k, v in obj.items() if k not in (FORMAT_KEY, VERSION_KEY)}
    return {FORMAT_KEY: fmt, VERSION_KEY: FORMATS[fmt], **rest}


def json_text(obj: Any, fmt: str | None = None) -> str:
    """The JSON text the writers produce (indent 2, the caller's key order, trailing newline)."""
    if fmt is not None:
        obj = with_format(obj, fmt)
    return json.dumps(obj, indent=2, sort_keys=False) + "\n"


def write_json(path: str | Path, obj: Any, fmt: str | None = None) -> None:
    """Atomic JSON write; with ``fmt`` the object records its format name and version."""
    write_text(path, json_text(obj, fmt))


def without_timings(obj: Any) -> Any:
    """``obj`` less every key naming a wall-clock or host value (``seconds``, ``total_seconds``,
    ``seconds_per_round``, ``date``, ``start_time``, ``hostname``, ...), recursively: such values
    differ from run to run and go to the job's log (and Snakemake's benchmark file) instead."""
    if isinstance(obj, dict):
        return {k: without_timings(v) for k, v in obj.items() if not (isinstance(k, str) and _TIMING.search(k))}
    if isinstance(obj, list):
        return [without_timings(v) for v in obj]
    return obj


def timings(obj: Any, prefix: str = "") -> dict[str, Any]:
    """The values :func:`without_timings` drops, flattened to ``{"a.b.seconds": value}`` (for logs)."""
    out: dict[str, Any] = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            name = f"{prefix}{k}"
            if isinstance(k, str) and _TIMING.search(k):
                out[name] = v
            else:
                out.update(timings(v, name + "."))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out.update(timings(v, f"{prefix.rstrip('.')}[{i}]."))
    return out


def log_timings(what: str, obj: Any) -> None:
    """Wall-clock values kept out of result files (:func:`without_timings`) go to the log."""
    t = timings(obj)
    if t:
        logging.getLogger(__name__).info("timings of %s: %s", what, json.dumps(t))


def _version(fmt: str) -> int:
    if fmt not in FORMATS:
        raise ValueError(f"unknown artifact format {fmt!r}; known: {', '.join(FORMATS)}")
    return FORMATS[fmt]


def write_tensors(
    path: str | Path, tensors: dict[str, torch.Tensor], fmt: str | None = None, metadata: dict[str, Any] | None = None
) -> None:
    """Atomic, byte-deterministic safetensors write; with ``fmt`` its name and version are
    recorded in the header's ``__metadata__`` next to ``metadata`` (values stored as strings,
    non-strings as sorted JSON)."""
    meta = {k: v if isinstance(v, str) else json.dumps(v, sort_keys=True) for k, v in (metadata or {}).items()}
    if fmt is not None:
        meta.update({FORMAT_KEY: fmt, VERSION_KEY: str(_version(fmt))})
    write_chunks(path, safetensors_chunks(tensors, meta))


# ============================================================================ readers
def _check_format(path: Path, found_fmt: Any, found_version: Any, fmt: str | None) -> None:
    """``fmt``'s name and version against what the file records (nothing recorded: version 1)."""
    if fmt is None:
        return
    want = _version(fmt)
    if found_fmt is not None and found_fmt != fmt:
        raise ArtifactError(path, f"is a {found_fmt!r} file, expected {fmt!r}")
    version = 1 if found_version is None else found_version
    try:
        version = int(version)
    except (TypeError, ValueError):
        raise ArtifactError(path, f"bad format version {found_version!r}") from None
    if version != want:
        raise ArtifactError(path, f"wrong format version {version} (expected {want})")


def tensors_metadata(path: str | Path) -> dict[str, str]:
    """A safetensors file's ``__metadata__`` (after the header check)."""
    return dict(safetensors_header(path).get("__metadata__") or {})


def _shape_ok(shape: tuple[int, ...], want: tuple[int | None, ...]) -> bool:
    return len(shape) == len(want) and all(w is None or s == w for s, w in zip(shape, want, strict=True))


def read_tensors(
    path: str | Path,
    keys: Iterable[str] | None = None,
    fmt: str | None = None,
    expect_keys: Iterable[str] | None = None,
    expect_shapes: dict[str, tuple[int | None, ...]] | None = None,
    check_finite: bool = True,
) -> dict[str, torch.Tensor]:
    """Tensors of a safetensors file (only ``keys`` when given), checked: complete file,
    ``fmt``'s version, ``expect_keys`` present, ``expect_shapes`` (None = any size in that
    dimension), finite floating values. Raises :class:`ArtifactError` naming the file."""
    path = Path(path)
    header = safetensors_header(path)
    meta = header.get("__metadata__") or {}
    _check_format(path, meta.get(FORMAT_KEY), meta.get(VERSION_KEY), fmt)
    names = [k for k in header if k != "__metadata__"]
    wanted = list(keys) if keys is not None else names
    for k in list(expect_keys or []) + wanted:
        if k not in header or k == "__metadata__":
            raise ArtifactError(path, f"missing tensor {k}")
    for k, want in (expect_shapes or {}).items():
        shape = tuple(header[k]["shape"]) if k in header else None
        if shape is not None and not _shape_ok(shape, want):
            raise ArtifactError(
                path, f"tensor {k} has shape {shape}, expected {tuple('*' if w is None else w for w in want)}"
            )
    out: dict[str, torch.Tensor] = {}
    try:
        with safe_open(str(path), framework="pt") as f:
            for k in wanted:
                out[k] = f.get_tensor(k)
    except SafetensorError as exc:
        raise ArtifactError(path, f"not a readable safetensors file ({exc})") from None
    if check_finite:
        for k, t in out.items():
            if t.is_floating_point() and not all_finite(t):
                raise ArtifactError(path, f"tensor {k} has non-finite values")
    return out


def all_finite(t: torch.Tensor, rows: int = 1024) -> bool:
    """Whether every entry of t is finite, checked ``rows`` rows at a time: ``isfinite`` of a
    whole matrix makes temporaries of its size (a float64 d_ff = 14336 Gram: +2 GiB)."""
    if t.dim() < 2:
        return bool(torch.isfinite(t).all())
    return all(bool(torch.isfinite(t[s : s + rows]).all()) for s in range(0, t.shape[0], rows))


def read_json(path: str | Path, fmt: str | None = None) -> Any:
    """A JSON file, checked: parses (``bad JSON at line n``), and with ``fmt`` an object of that
    format and version (the format keys stay in the returned dict)."""
    path = Path(path)
    need_file(path)
    text = path.read_text(encoding="utf-8")
    if not text.strip():
        raise ArtifactError(path, "empty file (truncated?)")
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        where = f"bad JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
        if not text.rstrip().endswith(("}", "]", '"')) and text.lstrip()[:1] in "{[":
            where = f"truncated JSON ({where})"  # a complete object or list ends with } or ]
        raise ArtifactError(path, where) from None
    if fmt is not None:
        if not isinstance(obj, dict):
            raise ArtifactError(path, f"expected a JSON object ({fmt}), found {type(obj).__name__}")
        _check_format(path, obj.get(FORMAT_KEY), obj.get(VERSION_KEY), fmt)
    return obj


def strip_format(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` less the format keys."""
    return {k: v for k, v in obj.items() if k not in (FORMAT_KEY, VERSION_KEY)}


# ============================================================================ named formats
class GramLayer(TypedDict):
    """One module's calibration statistics at one layer (:func:`read_gram_layer`)."""

    gram: torch.Tensor  # (d, d) float64: sum of x x^T
    sum: torch.Tensor  # (d,) float64: sum of x
    sumsq: torch.Tensor  # (d,) float64: sum of x^2
    count: int  # tokens
    mean: torch.Tensor  # (d,): sum / count
    abssum: NotRequired[torch.Tensor]  # (d,) float64: sum of |x| (newer calibrations only)


def gram_path(gram_dir: str | Path, layer: int) -> Path:
    return Path(gram_dir) / f"layer{layer}.safetensors"


def read_gram_layer(gram_dir: str | Path, layer: int, module: str) -> GramLayer:
    """``gram`` (d, d), ``sum`` (d,), ``sumsq`` (d,) float64 (from the Gram's diagonal for files
    written before Σx² was stored), ``count`` int and ``mean`` of one module's input at one layer;
    ``abssum`` (d,) float64 Σ|x| only where the file holds it (optional key, newer calibrations)."""
    path = gram_path(gram_dir, layer)
    header = safetensors_header(path)
    keys = [f"{module}.gram", f"{module}.sum", f"{module}.count"]
    has_sumsq = f"{module}.sumsq" in header
    d = header[keys[0]]["shape"][0] if keys[0] in header else None
    shapes = {keys[0]: (d, d), keys[1]: (d,), keys[2]: (1,)}
    if has_sumsq:
        keys.append(f"{module}.sumsq")
        shapes[keys[3]] = (d,)
    has_abssum = f"{module}.abssum" in header
    if has_abssum:
        keys.append(f"{module}.abssum")
        shapes[keys[-1]] = (d,)
    t = read_tensors(path, keys, fmt="gram", expect_shapes=shapes)
    gram, total = t[keys[0]], t[keys[1]]
    count = int(t[keys[2]][0])
    if count < 1:
        raise ArtifactError(path, f"tensor {keys[2]} is {count}, expected a token count >= 1")
    sumsq = (t[f"{module}.sumsq"] if has_sumsq else gram.diagonal()).to(torch.float64)
    out: GramLayer = {"gram": gram, "sum": total, "sumsq": sumsq, "count": count, "mean": total / count}
    if has_abssum:
        out["abssum"] = t[f"{module}.abssum"].to(torch.float64)
    return out


def write_gram_layer(path: str | Path, tensors: dict[str, torch.Tensor]) -> None:
    write_tensors(path, tensors, "gram")


def read_gram_meta(gram_dir: str | Path) -> dict[str, Any]:
    obj: dict[str, Any] = read_json(Path(gram_dir) / "meta.json", "gram-meta")
    if not isinstance(obj.get("n_layers"), int):
        raise ArtifactError(Path(gram_dir) / "meta.json", "missing n_layers")
    return obj


def read_gram_checks(path: str | Path, parse: Callable[[Any], T], n_layers: int | None = None) -> list[dict[str, T]]:
    """gram_checks/{calib}.json: per layer, ``{"o_proj": check, "down_proj": check}``, each check
    the JSON entry read by ``parse`` (``coec.compensate.gram_check.GramCheck.from_json``; its
    ValueError names the entry)."""
    path = Path(path)
    layers = read_json(path, "gram-check").get("layers")
    if not isinstance(layers, list) or not layers:
        raise ArtifactError(path, "missing layers")
    if n_layers is not None and len(layers) != n_layers:
        raise ArtifactError(path, f"has {len(layers)} layers, the model {n_layers}")
    out: list[dict[str, T]] = []
    for i, layer in enumerate(layers):
        if not isinstance(layer, dict):
            raise ArtifactError(path, f"layers[{i}] is not an object")
        checks: dict[str, T] = {}
        for module in MODULES:
            try:
                checks[module] = parse(layer.get(module))
            except ValueError as exc:
                raise ArtifactError(path, f"layers[{i}].{module}: {exc}") from None
        out.append(checks)
    return out


def read_keep(path: str | Path, n_layers: int | None = None) -> dict[str, Any]:
    """keep.json: ``layers`` with sorted unique ``kv_groups`` and ``channels`` per layer."""
    path = Path(path)
    keep: dict[str, Any] = read_json(path, "keep")
    layers = keep.get("layers")
    if not isinstance(layers, list) or not layers:
        raise ArtifactError(path, "missing layers")
    for i, k in enumerate(layers):
        for key in ("kv_groups", "channels"):
            v = k.get(key) if isinstance(k, dict) else None
            if not isinstance(v, list) or not all(isinstance(x, int) and x >= 0 for x in v):
                raise ArtifactError(path, f"layers[{i}].{key} is not a list of indices")
    return keep if n_layers is None else check_keep_layers(keep, path, n_layers)


def check_keep_layers(keep: dict[str, Any], path: str | Path, n_layers: int) -> dict[str, Any]:
    """A keep set read from ``path`` (:func:`read_keep`) against the model's ``n_layers``; returns it."""
    if len(keep["layers"]) != n_layers:
        raise ArtifactError(Path(path), f"has {len(keep['layers'])} layers, the model {n_layers}")
    return keep


def read_comp_block(path: str | Path, first: int | None = None, last: int | None = None) -> dict[str, torch.Tensor]:
    """A compensation block file: ``layer{i}.{o_proj|down_proj}.weight|bias``, finite; with
    ``first``/``last`` exactly those layers."""
    path = Path(path)
    t = read_tensors(path, fmt="comp-block")
    bad = [k for k in t if not COMP_KEY.match(k)]
    if bad:
        raise ArtifactError(path, f"unexpected tensor {bad[0]} (expected layer<i>.<module>.weight|bias)")
    if first is not None:
        layers = {int(m.group(1)) for m in map(COMP_KEY.match, t) if m}
        want = set(range(first, (last if last is not None else first) + 1))
        if layers != want:
            raise ArtifactError(path, f"holds layers {sorted(layers)}, expected {first}..{last}")
    return t


def read_comp_blocks(paths: Iterable[str | Path] | None) -> dict[str, torch.Tensor]:
    """All tensors of a cell's block files (each checked)."""
    out: dict[str, torch.Tensor] = {}
    for p in paths or []:
        out.update(read_comp_block(p))
    return out


def write_comp_block(path: str | Path, tensors: dict[str, torch.Tensor], metadata: dict[str, Any]) -> None:
    write_tensors(path, tensors, "comp-block", metadata)


def read_result(path: str | Path) -> dict[str, Any]:
    """A per-cell result JSON (ppl.json, zeroshot.json, iterative.json) of any coec result format."""
    path = Path(path)
    obj: Any = read_json(path)
    if not isinstance(obj, dict):
        raise ArtifactError(path, f"expected a JSON object, found {type(obj).__name__}")
    fmt = obj.get(FORMAT_KEY)
    _check_format(path, fmt, obj.get(VERSION_KEY), fmt if fmt in FORMATS else None)
    return obj


def write_result(path: str | Path, obj: dict[str, Any], fmt: str) -> dict[str, Any]:
    """A result JSON without timings (:func:`without_timings`); returns what was written."""
    clean: dict[str, Any] = without_timings(obj)
    write_json(path, clean, fmt)
    return clean


def read_csv_rows(path: str | Path, columns: Iterable[str] = ()) -> list[dict[str, Any]]:
    """A CSV file's rows (pandas), checking that ``columns`` are present."""
    import pandas as pd  # deferred: pandas adds ~0.8 s to the start of every stage; only CSV reading needs it

    path = Path(path)
    need_file(path)
    try:
        df = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise ArtifactError(path, f"bad CSV ({str(exc).splitlines()[0]})") from None
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ArtifactError(path, f"missing column {missing[0]}")
    rows: list[dict[str, Any]] = df.to_dict("records")
    return rows


def write_csv(path: str | Path, df: pd.DataFrame, **kwargs: Any) -> None:
    """A pandas DataFrame as CSV, atomically (``to_csv`` keyword arguments pass through)."""
    write_text(path, df.to_csv(index=False, **kwargs))
