"""The calibration pass over a :class:`~coec.model.streamed.StreamedModel`, resumable.

Decoder layer ``i`` is read from the checkpoint when the pass reaches it and dropped after its
statistics are taken, so host memory holds one layer, the embedding (only while the sequences
are embedded) and the hidden states of all sequences (:class:`~coec.calibrate.hidden.HiddenStore`:
in files beyond a budget). The operations, their order and dtypes are those of
``coec.calibrate.layer_pass.run_layerwise`` on the loaded model, so the Gram files are byte-identical.

The pass works in a folder next to the output, ``.<name>.partial``: each layer's Gram file is
written there as it completes, and a checkpoint (the hidden states entering the next layer,
then ``progress.json`` naming them, each written atomically) is taken after a layer whenever
``checkpoint_seconds`` have passed since the last (0: after every layer). A pass killed at any
point (``kill -9``, a preempted job) and run again with the same inputs resumes at the layer of
its last checkpoint; other inputs (a different fingerprint) start afresh. On success the folder,
less the checkpoint and spill files, is renamed onto the output (a previous output is replaced
only then).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from coec.calibrate.hidden import HiddenStore
from coec.calibrate.layer_pass import (
    PASS_DEFAULTS,
    PassOptions,
    gram_meta,
    gram_tensors,
    layer_call,
    layer_masks,
    layer_statistics,
)
from coec.io import artifacts
from coec.io.atomic import fsync_file, umask_modes
from coec.io.errors import ArtifactError
from coec.io.progress import bar as progress_bar
from coec.model.load import torch_dtype
from coec.model.streamed import StreamedModel

log = logging.getLogger(__name__)

PROGRESS = "progress.json"


def partial_dir(out_dir: str | Path) -> Path:
    """The resumable work folder of an output folder: ``.<name>.partial`` beside it."""
    out = Path(out_dir)
    return out.with_name(f".{out.name}.partial")


def fingerprint(input_ids: torch.Tensor, **inputs: Any) -> str:
    """sha256 of everything a pass's Grams depend on: the token ids and the named inputs."""
    h = hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode())
    h.update(input_ids.to(torch.int64).contiguous().numpy().tobytes())
    return h.hexdigest()


class StreamPass:
    """The calibration sequences walked through a streamed model one layer at a time: the
    layer-pass interface of ``coec.calibrate.layer_pass.layer_statistics`` (``device``, ``run``), with the
    hidden states in a :class:`HiddenStore` (filled here from the embeddings unless it holds a
    resumed pass's states already)."""

    def __init__(self, sm: StreamedModel, input_ids: torch.Tensor, batch_size: int, store: HiddenStore) -> None:
        self.device = sm.device
        self.hidden = store
        if not len(store):
            with sm.embedding() as embed, torch.no_grad():
                for s in range(0, input_ids.shape[0], batch_size):
                    store.append(embed(input_ids[s : s + batch_size]))
        first = store[0].to(self.device)
        self.pos = torch.arange(input_ids.shape[1], device=self.device).unsqueeze(0)
        self.pe = sm.adapter.rotary(sm.model)(first, self.pos)
        self.masks = layer_masks(sm.model, first, self.pos)

    @torch.no_grad()
    def run(self, i: int, layer: Any) -> None:
        """Every batch through decoder layer ``i``; the outputs go to the store's next generation."""
        for b, h in enumerate(self.hidden):
            self.hidden[b] = layer_call(layer, h.to(self.device), self.masks[i], self.pos, self.pe)


def _resume_state(work: Path, key: str) -> dict[str, Any] | None:
    """The checkpoint of a previous pass with the same fingerprint, or None (then the folder is
    cleared for a fresh pass)."""
    try:
        state: dict[str, Any] = artifacts.read_json(work / PROGRESS)
        if state.get("fingerprint") == key and (work / state["hidden"]).is_file():
            return state
    except (ArtifactError, KeyError, TypeError, AttributeError):
        pass
    if work.exists():
        log.info("%s: no usable checkpoint of this pass; starting afresh", work)
        shutil.rmtree(work)
    return None


def _checkpoint(work: Path, store: HiddenStore, next_layer: int, key: str) -> None:
    """Hidden states entering ``next_layer``, then progress.json naming them; older states last."""
    name = f"hidden-L{next_layer}.bin"
    store.save(work / name)
    artifacts.write_json(
        work / PROGRESS,
        {
            "fingerprint": key,
            "next_layer": next_layer,
            "hidden": name,
            "shapes": [list(s) for s in store.shapes],
            "dtype": str(store.dtype).removeprefix("torch."),
        },
    )
    for old in work.glob("hidden-L*.bin"):
        if old.name != name:
            old.unlink()


def _publish(work: Path, out: Path) -> None:
    """Rename the finished work folder onto ``out`` (stray temp, checkpoint and spill files
    removed first; a previous ``out`` is removed only after the rename)."""
    for p in list(work.iterdir()):
        if p.name != "meta.json" and not re.fullmatch(r"layer\d+\.safetensors", p.name):
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    umask_modes(work)
    old = None
    if out.exists():
        old = out.with_name(f".{out.name}.{os.getpid()}.old.tmp")
        os.replace(out, old)
    os.replace(work, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    fsync_file(out.parent)


def calibrate_streamed(
    sm: StreamedModel,
    input_ids: torch.Tensor,
    out_dir: str | Path,
    options: PassOptions = PASS_DEFAULTS,
    meta: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Grams of every layer's o_proj and down_proj inputs over ``input_ids`` (n_seq, seqlen)
    -> ``out_dir/layer{i}.safetensors`` + ``meta.json``, the files ``coec.calibrate.layer_pass.
    calibrate_to_dir`` writes for the loaded model, byte for byte. Resumes a killed pass (module
    docstring). Returns meta.json's dict plus ``seconds`` and ``resumed_at``."""
    t0 = time.time()
    batch_size, gram_dtype, budget_bytes = options.batch_size, options.gram_dtype, options.budget_bytes
    out = Path(out_dir)
    work = partial_dir(out)
    info = gram_meta(sm.n_layers, input_ids, gram_dtype, meta)
    key = fingerprint(input_ids, meta=info, batch_size=batch_size, dtype=str(sm.dtype))
    state = _resume_state(work, key)
    work.mkdir(parents=True, exist_ok=True)
    spill = work / "spill"
    if state is None:
        start, store = 0, HiddenStore(spill, budget_bytes)
    else:
        start = int(state["next_layer"])
        store = HiddenStore.load(
            work / state["hidden"], state["shapes"], torch_dtype(state["dtype"]), spill, budget_bytes
        )
        log.info("resuming the calibration pass at layer %d (%s)", start, work)
    dt = torch_dtype(gram_dtype)
    try:
        lp = StreamPass(sm, input_ids, batch_size, store)
        last = time.monotonic()
        bar = progress_bar(range(start, sm.n_layers), desc="calibrate", unit="layer", disable=not options.progress)
        for i in bar:
            with sm.layer(i) as layer:
                stats = layer_statistics(lp, i, layer)
            del layer  # before the next layer is read, not after
            store.flip()
            artifacts.write_gram_layer(artifacts.gram_path(work, i), gram_tensors(stats, dt))
            del stats
            if i + 1 < sm.n_layers and time.monotonic() - last >= options.checkpoint_seconds:
                _checkpoint(work, store, i + 1, key)
                last = time.monotonic()
        spilled, batches = store.spilled, len(store)
    finally:
        store.close()
    artifacts.write_json(work / "meta.json", info, "gram-meta")
    _publish(work, out)
    info = {**info, "seconds": round(time.time() - t0, 3), "resumed_at": start}
    log.info(
        "calibrated %d layers on %d tokens in %.1fs (streamed%s; %d of %d batches on disk)",
        info["n_layers"],
        info["tokens"],
        info["seconds"],
        f", resumed at layer {start}" if start else "",
        spilled,
        batches,
    )
    return info
