"""Stage entry points of the iterative multi-domain FLAP method (docs/iterative.md).

The ``coec iterative <sub>`` commands (``cli.py``) map onto these, as the other commands map
onto each package's stage body (``coec.calibrate.stage``, ``coec.evaluate.stage``, ...); they
share their I/O rather than repeating it: Gram folders are written by ``calibrate.write_gram_dir``
(the calibrate stage's writer), block files, keep sets and results by :mod:`coec.io.artifacts`,
blocks are installed by ``prune.install_weights_``, the model is resolved and loaded by
``model.source.resolve_source`` / ``model.load.load_resolved``, and a cell's perplexity is
``evaluate.stage.run_ppl`` itself. They are one method's stages, which the paper's workflow never
calls, and this module reads as the iterative method's. The method itself is
:mod:`coec.iterative`, which knows nothing of files.
"""

from __future__ import annotations

import logging
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from coec.calibrate.layer_pass import gram_meta, write_gram_dir
from coec.config.schema import config_field
from coec.io import artifacts, atomic
from coec.io.artifacts import log_timings, read_gram_layer
from coec.io.progress import bar as progress_bar
from coec.iterative.method import Options, global_pass, run_iterative
from coec.iterative.state import PruneState, block_tensors, keep_dict, restore_state, state_tensors
from coec.iterative.stats import CalibSet, calib_set, finalize_stats, normalise_alphas
from coec.model.arch import MODULES
from coec.model.load import decoder_layers, load_resolved, resolve_device
from coec.model.source import CellSource, resolve_source

log = logging.getLogger(__name__)


def write_step(
    model: Any,
    state: PruneState,
    out_dir: str | Path,
    keep_meta: dict[str, Any],
    info: dict[str, Any],
    block_name: str | None = None,
) -> dict[str, Path]:
    """Write keep.json, the block file (default ``block0-{L-1}.safetensors``),
    state.safetensors and iterative.json (timings left out: they are logged) into ``out_dir``
    (each atomically, ``artifacts``)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    n = len(state.kv_groups)
    paths = {
        "keep": out / "keep.json",
        "block": out / (block_name or f"block0-{n - 1}.safetensors"),
        "state": out / "state.safetensors",
        "info": out / "iterative.json",
    }
    artifacts.write_comp_block(paths["block"], block_tensors(model, state), {"method": "iflap"})
    artifacts.write_tensors(paths["state"], state_tensors(state), "iterative-state", {"method": "iflap"})
    artifacts.write_json(paths["keep"], keep_dict(state, keep_meta), "keep")
    log_timings(str(paths["info"]), info)
    artifacts.write_result(paths["info"], info, "iterative-info")
    return paths


def load_step(model: Any, init_dir: str | Path) -> PruneState:
    """Apply a previous step's keep.json + block file to the dense ``model`` and return its
    state with the exact float64 biases from state.safetensors."""
    init_dir = Path(init_dir)
    keep = artifacts.read_keep(init_dir / "keep.json", len(decoder_layers(model)))
    blocks = sorted(init_dir.glob("block*.safetensors")) or sorted(init_dir.glob("bias.safetensors"))
    if not blocks or not (init_dir / "state.safetensors").is_file():
        raise FileNotFoundError(f"{init_dir} lacks a block file or state.safetensors")
    return restore_state(
        model,
        keep,
        artifacts.read_comp_block(blocks[0]),
        artifacts.read_tensors(init_dir / "state.safetensors", fmt="iterative-state"),
    )


@dataclass(frozen=True)
class DomainCalibration:
    """The calibration set of the iterative stages: ``nsamples`` sequences of ``seqlen`` tokens over
    ``domains`` (``{"name", "alpha", "dataset"}`` each), drawn with ``seed``."""

    domains: list[dict[str, Any]]
    nsamples: int
    seqlen: int
    seed: int = config_field("iterative.mixes.*.seed")


@dataclass(frozen=True)
class Step:
    """One ``iterative run``: the cumulative ratios ``schedule``, the step folder it continues
    from (``init``; None: the dense model), the block file's name (None: ``block0-{L-1}``)."""

    schedule: list[float]
    init: str | None = None
    block_name: str | None = None


def _load(source: CellSource, calib: DomainCalibration) -> tuple[Any, CalibSet]:
    """The dense model on the CPU (``source`` resolved) and the calibration set (seeded as the
    calibrate stage is)."""
    torch.manual_seed(calib.seed)
    where = source.local.model_dir
    model, tok = load_resolved(where, source.dtype, "cpu", source.hub, None, (source.model, time.time()))
    return model, calib_set(tok, calib.domains, calib.nsamples, calib.seqlen, calib.seed)


def run_iterative_prune(
    source: CellSource, calib: DomainCalibration, opts: Options, step: Step, out: str
) -> dict[str, Any]:
    """``iterative run``: load, (continue from the step folder ``step.init``), prune along
    ``step.schedule`` (cumulative ratios) with ``opts`` (its device: ``source.device``), write the
    step (:func:`write_step`)."""
    t0 = time.time()
    source = resolve_source(source)
    model, cset = _load(source, calib)
    opts = replace(opts, device=resolve_device(source.device))
    state = load_step(model, step.init) if step.init else None
    state, infos = run_iterative(model, cset, step.schedule, opts, state)
    meta = {
        "ratio": step.schedule[-1],
        "schedule": step.schedule,
        "mode": opts.mode,
        "structure": opts.structure,
        "group_rounding": opts.group_rounding,
        "channel_rounding": opts.channel_rounding,
    }
    info = {
        "model": source.provenance(),
        "domains": calib.domains,
        "alphas": cset.alphas,
        "sequences_per_domain": cset.counts,
        "seqlen": calib.seqlen,
        "seed": calib.seed,
        "variance_mix": opts.variance_mix,
        "gram_dtype": opts.gram_dtype,
        "init": step.init,
        **meta,
        "steps": infos,
        "seconds": round(time.time() - t0, 3),
    }
    write_step(model, state, out, meta, info, step.block_name)
    return info


def run_iterative_grams(source: CellSource, calib: DomainCalibration, opts: Options, out: str) -> dict[str, Any]:
    """``iterative grams``: one pass of the dense model, per-domain statistics mixed by alpha
    (eq. 8), written as a Gram folder (the calibrate stage's format) for select/compensate;
    ``opts``: the pass's variance mix, Gram dtype, batch size and progress bar."""
    t0 = time.time()
    source = resolve_source(source)
    model, cset = _load(source, calib)
    opts = Options(
        variance_mix=opts.variance_mix,
        gram_dtype=opts.gram_dtype,
        batch_size=opts.batch_size,
        device=resolve_device(source.device),
        progress=opts.progress,
    )
    opts.check()

    def fill(write: Any) -> Any:
        global_pass(model, cset, opts, lambda i, _layer, stats: write(i, stats))
        return gram_meta(
            len(decoder_layers(model)),
            cset.ids,
            opts.gram_dtype,
            {
                "model": source.provenance(),
                "domains": calib.domains,
                "alphas": cset.alphas,
                "sequences_per_domain": cset.counts,
                "variance_mix": opts.variance_mix,
                "seed": calib.seed,
                "dtype": source.dtype,
            },
        )

    meta = write_gram_dir(out, opts.gram_dtype, fill)
    meta["seconds"] = round(time.time() - t0, 3)
    log.info("Grams of %d layers in %.1fs", meta["n_layers"], meta["seconds"])
    return meta


def mix_gram_dirs(
    gram_dirs: list[str], alphas: Any, out: str | Path, variance_mix: str = "pooled", gram_dtype: str = "float32"
) -> dict[str, Any]:
    """``iterative mix``: existing per-domain Gram folders mixed layer by layer (eq. 8)."""
    metas = [artifacts.read_gram_meta(d) for d in gram_dirs]
    n_layers = {m["n_layers"] for m in metas}
    if len(n_layers) != 1:
        raise ValueError(f"Gram directories disagree on the layer count: {sorted(n_layers)}")

    def fill(write: Any) -> Any:
        for i in progress_bar(range(n_layers.pop()), desc="mix", unit="layer"):
            write(
                i,
                {
                    m: finalize_stats([read_gram_layer(d, i, m) for d in gram_dirs], alphas, variance_mix, gram_dtype)
                    for m in MODULES
                },
            )
        return {
            "n_layers": metas[0]["n_layers"],
            "sources": [str(d) for d in gram_dirs],
            "alphas": normalise_alphas(alphas),
            "variance_mix": variance_mix,
            "tokens": sum(m.get("tokens", 0) for m in metas),
            "gram_dtype": gram_dtype,
        }

    return write_gram_dir(out, gram_dtype, fill)


def collect_cell(step_infos: list[str], variant: dict[str, Any], keep_out: str, info_out: str) -> dict[str, Any]:
    """``iterative collect``: a cell from its chain of step folders: the last step's keep.json
    (with the whole schedule) and one iterative.json with every step's info (timings are in the
    steps' logs)."""
    steps = [artifacts.strip_format(artifacts.read_json(p, "iterative-info")) for p in step_infos]
    keep = artifacts.read_keep(Path(step_infos[-1]).parent / "keep.json")
    schedule = [st["ratio"] for st in steps]
    keep["schedule"] = schedule
    infos = [
        {**st["steps"][-1], "step": s + 1, "dir": str(Path(p).parent)}
        for s, (st, p) in enumerate(zip(steps, step_infos, strict=True))
    ]
    info = {
        **{k: v for k, v in steps[-1].items() if k not in ("steps", "seconds", "init")},
        "variant": variant,
        "schedule": schedule,
        "steps": infos,
        "calibration_passes": len(infos),
    }
    artifacts.write_json(keep_out, keep, "keep")
    artifacts.write_result(info_out, info, "iterative-info")
    return info


def copy_block(src: str, first: int, last: int, out: str) -> None:
    """``iterative collect --block``: a step's bias block file copied to a cell's
    ``block{first}-{last}.safetensors`` after checking that it holds exactly layers first..last."""
    artifacts.read_comp_block(src, first, last)
    with atomic.atomic_path(out) as tmp:
        shutil.copyfile(src, tmp)
