"""The dense KL reference (docs/kl.md): ``coec kl-reference`` scores the dense model over the
perplexity windows once and writes its top-k log-probabilities and samples of the rest
(``coec.evaluate.kl``; ``results/{model}/dense/kl-reference.safetensors``); every perplexity stage given it
(``coec ppl --kl-reference``, transformers or llama.cpp) reports the mean token KL of its model
to the dense one in ppl.json.

The file records the sha256 of the token windows it was made on and the model's identity; a
stage refuses, in one line and before it writes anything, a reference of other windows (another
dataset, length, count, tokenizer, or a shift by one token) or of another model.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from coec.data import text as data
from coec.data.bundled import file_sha256
from coec.evaluate.kl import TAIL_SEED, KlMeter, KlRows, RowsBuilder, windows_sha256
from coec.evaluate.options import PplOptions
from coec.io import artifacts
from coec.io.errors import ArtifactError
from coec.model.cell import open_cell
from coec.model.source import CellSource, resolve_source

log = logging.getLogger(__name__)

FORMAT = "kl-reference"
#: file tensor -> KlRows field
TENSORS = {
    "token_ids": "ids",
    "logprobs": "lps",
    "log_rest": "rest",
    "tail_ids": "tail_ids",
    "tail_logprobs": "tail_lps",
}
#: what of ``model_provenance`` must match between the reference and the evaluated model (as
#: ``coec.evaluate.llamacpp.ppl.IDENTITY`` for a GGUF's recorded model)
IDENTITY = ("weights_sha256", "commit")


@dataclass(frozen=True)
class KlReference:
    """A read reference: its file, rows and metadata (``windows_sha256``, ``model`` (its identity:
    ``IDENTITY``), ``dtype``, ``seqlen``, ``max_windows``, ``windows``, ``top_k``, ``tail_samples``,
    ``tail_seed``, ``vocab``, the dense ``ppl``)."""

    path: str
    rows: KlRows
    meta: dict[str, Any]

    def record(self) -> dict[str, Any]:
        """What a ppl.json records of it (``evaluate.kl.kl_record`` adds top-k and vocabulary)."""
        return {"file": self.path, "sha256": file_sha256(self.path)}


def write_reference(path: str | Path, rows: KlRows, meta: dict[str, Any]) -> None:
    """The reference file (atomic, deterministic): the rows and ``meta``, every value as sorted JSON."""
    tensors = {name: getattr(rows, field) for name, field in TENSORS.items()}
    meta = dict(meta, vocab=rows.vocab, top_k=rows.top_k, tail_samples=rows.tail_samples, tail_seed=TAIL_SEED)
    meta = {k: json.dumps(v, sort_keys=True) for k, v in meta.items()}
    artifacts.write_tensors(path, tensors, FORMAT, meta)


def read_reference(path: str | Path) -> KlReference:
    """A reference file, checked (format, tensors and shapes, finite log-probabilities, token ids
    inside the vocabulary); ArtifactError naming the file otherwise."""
    t = artifacts.read_tensors(path, fmt=FORMAT, expect_keys=TENSORS, check_finite=False)
    raw = artifacts.tensors_metadata(path)
    try:
        meta = {k: v if k in (artifacts.FORMAT_KEY, artifacts.VERSION_KEY) else json.loads(v) for k, v in raw.items()}
        vocab = int(meta["vocab"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ArtifactError(path, f"bad KL reference metadata ({type(exc).__name__}: {exc})") from None
    if not isinstance(meta.get("windows_sha256"), str):
        raise ArtifactError(path, "records no windows_sha256: not a reference of coec kl-reference")
    rows = KlRows(**{field: t[name] for name, field in TENSORS.items()}, vocab=vocab)
    for ids, lps in ((rows.ids, rows.lps), (rows.tail_ids, rows.tail_lps)):
        if ids.dim() != 3 or ids.dtype != torch.int32 or lps.shape != ids.shape or lps.dtype != torch.float32:
            raise ArtifactError(
                path, f"token ids {tuple(ids.shape)} and log-probabilities {tuple(lps.shape)} do not match"
            )
        if ids.shape[:2] != rows.ids.shape[:2]:
            raise ArtifactError(
                path, f"tail samples of {tuple(ids.shape[:2])} positions, top-k of {tuple(rows.ids.shape[:2])}"
            )
        if not artifacts.all_finite(lps.flatten(0, 1)):
            raise ArtifactError(path, "non-finite log-probabilities")
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
            raise ArtifactError(path, f"token ids outside the vocabulary of {vocab}")
    rest = rows.rest
    if tuple(rest.shape) != tuple(rows.ids.shape[:2]) or rest.dtype != torch.float32:
        raise ArtifactError(path, f"log_rest has shape {tuple(rest.shape)}, expected {tuple(rows.ids.shape[:2])}")
    if bool(rest.isnan().any() | (rest == float("inf")).any()):
        raise ArtifactError(path, "non-finite log-probabilities")
    return KlReference(str(path), rows, meta)


def check_reference(ref: KlReference, windows: torch.Tensor, model: dict[str, Any], name: str) -> None:
    """ArtifactError (one line) unless ``ref`` was made on exactly these (n, seqlen) token
    windows and of the model whose provenance is ``model`` (``name``: how the message names it)."""
    mine = windows_sha256(windows)
    theirs = ref.meta["windows_sha256"]
    if mine != theirs:
        raise ArtifactError(
            ref.path,
            f"made on other token windows (sha256 {str(theirs)[:12]}… of {ref.meta.get('windows')} x "
            f"{ref.meta.get('seqlen')}, these {mine[:12]}… of {windows.shape[0]} x {windows.shape[1]}): "
            "another dataset, length, window count, tokenizer or offset",
        )
    recorded = ref.meta.get("model") or {}
    for key in IDENTITY:
        if recorded.get(key) != model.get(key):
            raise ArtifactError(
                ref.path,
                f"is the KL reference of another model ({key} {recorded.get(key)} != {model.get(key)} of {name})",
            )


def reference_meter(
    path: str | Path, windows: torch.Tensor, model: dict[str, Any], name: str
) -> tuple[KlMeter, dict[str, Any]]:
    """(meter, what ppl.json records of the file) of a checked reference (:func:`check_reference`)."""
    ref = read_reference(path)
    check_reference(ref, windows, model, name)
    return KlMeter(ref.rows), ref.record()


def run_kl_reference(
    source: CellSource, options: PplOptions, top_k: int, tail_samples: int, out: str
) -> dict[str, Any]:
    """The dense model's reference over ``coec ppl``'s windows of ``options`` -> ``out``: its top
    ``top_k`` log-probabilities and ``tail_samples`` samples of the rest at every scored position
    (the model reached as ``coec ppl`` reaches it, ``coec.model.cell.open_cell``). Returns the
    metadata written."""
    t0 = time.time()
    source = resolve_source(source)
    if source.keep or source.comp:
        raise ValueError("the KL reference is the dense model's: --keep and --comp do not apply")
    if top_k < 1 or tail_samples < 0:
        raise ValueError(f"--top-k must be >= 1 and --tail-samples >= 0, got {top_k} and {tail_samples}")
    cell = open_cell(source, options.stream)
    tokens = data.tokenize_text(cell.tokenizer, data.load_split(options.dataset, "eval"))
    windows = data.eval_windows(tokens, options.seqlen, options.max_windows)
    builder = RowsBuilder(int(windows.shape[0]), top_k, tail_samples)
    res = cell.perplexity(windows, options.batch_size, on_logits=builder)
    rows = builder.rows()
    # what identifies the model and the windows, nothing of where they lie: the file is the same
    # bytes in any work folder (the windows' sha256 stands for the dataset)
    provenance = source.provenance()
    meta = {
        "model": {key: provenance.get(key) for key in IDENTITY},
        "dtype": source.dtype,
        "seqlen": options.seqlen,
        "max_windows": options.max_windows,
        "windows": int(windows.shape[0]),
        "windows_sha256": windows_sha256(windows),
        "ppl": res["ppl"],
        "tokens_scored": res["tokens_scored"],
    }
    write_reference(out, rows, meta)
    what = f"top-{rows.top_k} of {rows.vocab} and {rows.tail_samples} samples of the rest"
    log.info("KL reference: %s over %d positions, dense ppl %.4f (%s; %.1fs)", what, res["tokens_scored"],
             res["ppl"], out, time.time() - t0)  # fmt: skip
    return dict(meta, top_k=rows.top_k, tail_samples=rows.tail_samples, vocab=rows.vocab)
