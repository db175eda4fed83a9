"""An importance matrix for llama.cpp's quantizer from a calibration set (docs/export.md
"Importance matrix from the calibration").

For every weight the GGUF export quantizes, the mean over the calibration tokens of the square of
each input column, ``mean_t x[t, j]^2`` ((row width,) float32), keyed by the GGUF tensor name
(``blk.<i>.attn_q.weight``, ...): the statistic llama.cpp's own ``llama-imatrix`` collects, which
its quantizer takes (``llama_model_quantize_params.imatrix``) to weight each column's rounding
error. It is measured on the model that is exported (the pruned, compensated cell as
``model.cell.build_model`` assembles it, or the dense model), over the calibration windows
``coec calibrate`` draws for the same set (``data.calibration_ids``).

The file is a safetensors file of float32 vectors named by GGUF tensor name, with metadata
``format`` (coec-imatrix), ``version`` (1), ``tokens``, ``calibration``, ``cell`` and ``model`` (JSON strings).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open
from torch import nn

from coec.calibrate.options import CalibrationWindows
from coec.data import text as data
from coec.io.atomic import write_chunks
from coec.io.safetensors_file import safetensors_chunks
from coec.model.arch import adapter_for
from coec.model.cell import build_cell
from coec.model.source import CellSource, resolve_source

log = logging.getLogger(__name__)

FORMAT = "coec-imatrix"


def imatrix_modules(adapter: Any, model: Any) -> dict[str, nn.Module]:
    """GGUF weight name -> the module whose input weights it: every 2-D weight of each block's
    ``gguf_layer_modules`` (norms left out) and the LM head, under ``output.weight``, or under
    ``token_embd.weight`` when the head is tied to the embedding (llama.cpp's graph then multiplies
    by ``token_embd`` and ``llama-imatrix`` records it under that name)."""
    out: dict[str, nn.Module] = {}
    top = adapter.gguf_model_modules(model)
    emb, head = top["token_embd"].weight, top["output"].weight
    tied = head.data_ptr() == emb.data_ptr() and head.shape == emb.shape
    for i, layer in enumerate(adapter.decoder_layers(model)):
        for name, mod in adapter.gguf_layer_modules(layer).items():
            w = getattr(mod, "weight", None)
            if w is not None and w.dim() == 2:
                out[f"blk.{i}.{name}.weight"] = mod
    out["token_embd.weight" if tied else "output.weight"] = top["output"]
    return out


@dataclass
class SumSq:
    """Running sum of squares of each input column in float64, (row width,), and the token count."""

    sums: dict[str, torch.Tensor] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)

    def add(self, name: str, x: torch.Tensor) -> None:
        """Add the inputs ``x`` (..., row width) of one call."""
        x2 = x.detach().reshape(-1, x.shape[-1]).double().pow(2).sum(0).cpu()
        self.sums[name] = self.sums[name] + x2 if name in self.sums else x2
        self.counts[name] = self.counts.get(name, 0) + x.numel() // x.shape[-1]

    def means(self) -> dict[str, torch.Tensor]:
        """The per-column mean of x^2, float32 (row width,), per name."""
        return {k: (s / self.counts[k]).float() for k, s in self.sums.items()}


def hook_inputs(modules: dict[str, nn.Module], acc: SumSq) -> list[Any]:
    """Forward pre-hooks adding each module's first positional input to ``acc``; returns the
    handles (remove them when done)."""

    def hook(name: Any) -> Any:
        def fn(_mod: Any, args: Any) -> None:
            acc.add(name, args[0])

        return fn

    return [m.register_forward_pre_hook(hook(k)) for k, m in modules.items()]


@torch.no_grad()
def collect(model: Any, modules: dict[str, nn.Module], input_ids: torch.Tensor, batch_size: int) -> SumSq:
    """Run ``model`` over ``input_ids`` (n_seq, seqlen) in batches and return the sums of squares
    of the ``modules``' inputs (every token counts: the windows have no padding)."""
    acc = SumSq()
    handles = hook_inputs(modules, acc)
    device = next(model.parameters()).device
    try:
        for b in range(0, input_ids.shape[0], batch_size):
            model(input_ids=input_ids[b : b + batch_size].to(device), use_cache=False)
    finally:
        for h in handles:
            h.remove()
    return acc


def imatrix_metadata(
    tokens: int, calibration: dict[str, Any], cell: dict[str, Any], model: dict[str, Any]
) -> dict[str, str]:
    """The safetensors metadata (all strings) of an imatrix file."""
    return {
        "format": FORMAT,
        "version": "1",
        "tokens": str(int(tokens)),
        "calibration": json.dumps(calibration, sort_keys=True),
        "cell": json.dumps(cell, sort_keys=True),
        "model": json.dumps(model, sort_keys=True),
    }


@dataclass(frozen=True)
class Imatrix:
    """An imatrix file as read: its vectors (float32, (row width,)), token count and SHA-256."""

    path: str
    vectors: dict[str, np.ndarray]
    tokens: int
    sha256: str

    def record(self) -> dict[str, Any]:
        """What the export records of the imatrix it used."""
        return {"sha256": self.sha256, "tokens": self.tokens, "entries": len(self.vectors)}


def read_imatrix(path: str | Path) -> Imatrix:
    """Read and check an imatrix file; ValueError (one line) for a file that is not one, or a
    vector that is not 1-D, holds a non-finite or a negative value."""

    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"imatrix {p}: no such file")
    data = p.read_bytes()
    with safe_open(str(p), framework="np") as f:
        meta = f.metadata() or {}
        if meta.get("format") != FORMAT:
            raise ValueError(f"imatrix {p}: not a coec imatrix file (metadata format {meta.get('format')!r})")
        vectors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open is not a dict)
    for k, v in vectors.items():
        if v.ndim != 1 or v.dtype != np.float32:
            raise ValueError(f"imatrix {p}: {k} is {v.dtype} {v.shape}, expected a float32 vector")
        if not np.isfinite(v).all():
            raise ValueError(f"imatrix {p}: {k} holds a non-finite value")
        if (v < 0).any():
            raise ValueError(f"imatrix {p}: {k} holds a negative value (a mean of squares cannot)")
    return Imatrix(str(p), vectors, int(meta.get("tokens", 0)), hashlib.sha256(data).hexdigest())


def check_imatrix(vectors: dict[str, np.ndarray], shapes: dict[str, tuple[int, ...]], where: str) -> None:
    """ValueError (one line) unless every vector names a 2-D tensor of the export (``shapes``:
    GGUF name -> (rows, row width)) and has its row width, and every block weight has one."""
    for name, v in sorted(vectors.items()):
        shape = shapes.get(name)
        if shape is None or len(shape) != 2:
            raise ValueError(f"imatrix {where}: {name} is not a weight of this export (an imatrix of another model?)")
        if v.shape[0] != shape[1]:
            raise ValueError(
                f"imatrix {where}: {name} has {v.shape[0]} values, the tensor's row width is {shape[1]} "
                "(an imatrix of another cell?)"
            )
    missing = sorted(n for n, s in shapes.items() if n.startswith("blk.") and len(s) == 2 and n not in vectors)
    if missing:
        raise ValueError(f"imatrix {where}: no vector for {missing[0]} ({len(missing)} weights lack one)")


def run_imatrix(source: CellSource, windows: CalibrationWindows, out: str) -> dict[str, Any]:
    """The ``coec imatrix`` stage: build the cell (``source.keep`` None: the dense model), run it over
    the calibration windows and write the imatrix file ``out`` (atomically); returns its metadata."""
    t0 = time.time()
    source = resolve_source(source)
    model, tok = build_cell(source)
    model.eval()
    ids = data.calibration_ids(tok, windows.dataset, windows.nsamples, windows.seqlen, windows.seed)
    modules = imatrix_modules(adapter_for(model.config), model)
    acc = collect(model, modules, ids, windows.batch_size)
    calibration = {"dataset": windows.dataset, "nsamples": windows.nsamples, "seqlen": windows.seqlen,
                   "seed": windows.seed}  # fmt: skip
    cell = {**source.cell, "keep": source.keep, "comp": list(source.comp)}
    meta = imatrix_metadata(ids.numel(), calibration, cell, source.provenance())
    write_chunks(out, safetensors_chunks(acc.means(), meta))
    log.info("imatrix: %d weights over %d tokens in %.1fs -> %s", len(modules), ids.numel(), time.time() - t0, out)
    return meta
