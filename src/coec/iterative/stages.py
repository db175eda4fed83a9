"""Stage entry points of the iterative multi-domain FLAP method (docs/iterative.md).

The ``coec iterative <sub>`` commands (``cli.py``) map onto these, as the other commands map
onto :mod:`coec.pipeline`; they share its I/O rather than repeating it: Gram folders are
written by ``calibrate.write_gram_dir`` (the calibrate stage's writer), block files, keep sets
and results by :mod:`coec.artifacts`, blocks are installed by ``prune.install_weights_``, and
a cell's perplexity is ``pipeline.run_ppl`` itself. They live beside ``pipeline.py`` rather than
in it because they are one method's stages, which the paper's workflow never calls: kept apart,
``pipeline.py`` stays the COEC workflow's stage list (about 310 lines rather than 490) and this
module reads as the iterative method's. The method itself is :mod:`coec.iterative`, which knows
nothing of files.
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path

import torch

from .. import artifacts, atomic
from ..arch import MODULES
from ..artifacts import log_timings, read_gram_layer
from ..calibrate import gram_meta, write_gram_dir
from ..models import decoder_layers, load_model, resolve_device
from ..progress import bar as progress_bar
from ..provenance import model_provenance
from .method import Options, global_pass, run_iterative
from .state import PruneState, block_tensors, keep_dict, restore_state, state_tensors
from .stats import calib_set, finalize_stats, normalise_alphas

log = logging.getLogger(__name__)


def write_step(
    model, state: PruneState, out_dir: str | Path, keep_meta: dict, info: dict, block_name: str | None = None
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


def load_step(model, init_dir: str | Path) -> PruneState:
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


def run_iterative_prune(
    model_src: str,
    domains: list[dict],
    nsamples: int,
    seqlen: int,
    schedule: list[float],
    out: str,
    seed: int = 0,
    batch_size: int = 8,
    dtype: str = "float32",
    gram_dtype: str = "float32",
    variance_mix: str = "pooled",
    device: str | None = None,
    progress: bool = True,
    mode: str = "global",
    structure: str = "uniform",
    group_rounding: str = "ceil",
    channel_rounding: str = "ceil",
    init: str | None = None,
    block_name: str | None = None,
    revision: str | None = None,
    trust_remote_code: bool = False,
) -> dict:
    """``iterative run``: load, (continue from the step folder ``init``), prune along
    ``schedule`` (cumulative ratios), write the step (:func:`write_step`)."""
    t0 = time.time()
    torch.manual_seed(seed)
    model, tok = load_model(
        model_src, dtype=dtype, device="cpu", revision=revision, trust_remote_code=trust_remote_code
    )
    calib = calib_set(tok, domains, nsamples, seqlen, seed)
    opts = Options(
        mode=mode,
        structure=structure,
        variance_mix=variance_mix,
        group_rounding=group_rounding,
        channel_rounding=channel_rounding,
        gram_dtype=gram_dtype,
        batch_size=batch_size,
        device=resolve_device(device),
        progress=progress,
    )
    state = load_step(model, init) if init else None
    state, infos = run_iterative(model, calib, schedule, opts, state)
    meta = {
        "ratio": schedule[-1],
        "schedule": schedule,
        "mode": mode,
        "structure": structure,
        "group_rounding": group_rounding,
        "channel_rounding": channel_rounding,
    }
    info = {
        "model": model_provenance(model_src, revision, trust_remote_code),
        "domains": domains,
        "alphas": calib.alphas,
        "sequences_per_domain": calib.counts,
        "seqlen": seqlen,
        "seed": seed,
        "variance_mix": variance_mix,
        "gram_dtype": gram_dtype,
        "init": init,
        **meta,
        "steps": infos,
        "seconds": round(time.time() - t0, 3),
    }
    write_step(model, state, out, meta, info, block_name)
    return info


def run_iterative_grams(
    model_src: str,
    domains: list[dict],
    nsamples: int,
    seqlen: int,
    out: str,
    seed: int = 0,
    batch_size: int = 8,
    dtype: str = "float32",
    gram_dtype: str = "float32",
    variance_mix: str = "pooled",
    device: str | None = None,
    progress: bool = True,
    revision: str | None = None,
    trust_remote_code: bool = False,
) -> dict:
    """``iterative grams``: one pass of the dense model, per-domain statistics mixed by alpha
    (eq. 8), written as a Gram folder (the calibrate stage's format) for select/compensate."""
    t0 = time.time()
    torch.manual_seed(seed)
    model, tok = load_model(
        model_src, dtype=dtype, device="cpu", revision=revision, trust_remote_code=trust_remote_code
    )
    calib = calib_set(tok, domains, nsamples, seqlen, seed)
    opts = Options(
        variance_mix=variance_mix,
        gram_dtype=gram_dtype,
        batch_size=batch_size,
        device=resolve_device(device),
        progress=progress,
    )
    opts.check()

    def fill(write):
        global_pass(model, calib, opts, lambda i, _layer, stats: write(i, stats))
        return gram_meta(
            len(decoder_layers(model)),
            calib.ids,
            gram_dtype,
            {
                "model": model_provenance(model_src, revision, trust_remote_code),
                "domains": domains,
                "alphas": calib.alphas,
                "sequences_per_domain": calib.counts,
                "variance_mix": variance_mix,
                "seed": seed,
                "dtype": dtype,
            },
        )

    meta = write_gram_dir(out, gram_dtype, fill)
    meta["seconds"] = round(time.time() - t0, 3)
    log.info("Grams of %d layers in %.1fs", meta["n_layers"], meta["seconds"])
    return meta


def mix_gram_dirs(
    gram_dirs: list[str], alphas, out: str | Path, variance_mix: str = "pooled", gram_dtype: str = "float32"
) -> dict:
    """``iterative mix``: existing per-domain Gram folders mixed layer by layer (eq. 8)."""
    metas = [artifacts.read_gram_meta(d) for d in gram_dirs]
    n_layers = {m["n_layers"] for m in metas}
    if len(n_layers) != 1:
        raise ValueError(f"Gram directories disagree on the layer count: {sorted(n_layers)}")

    def fill(write):
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


def collect_cell(step_infos: list[str], variant: dict, keep_out: str, info_out: str) -> dict:
    """``iterative collect``: a cell from its chain of step folders: the last step's keep.json
    (with the whole schedule) and one iterative.json with every step's info (timings are in the
    steps' logs)."""
    steps = [artifacts.strip_format(artifacts.read_json(p, "iterative-info")) for p in step_infos]
    keep = artifacts.read_keep(Path(step_infos[-1]).parent / "keep.json")
    schedule = [st["ratio"] for st in steps]
    keep["schedule"] = schedule
    infos = [
        {**st["steps"][-1], "step": s + 1, "dir": str(Path(p).parent)}
        for s, (st, p) in enumerate(zip(steps, step_infos))
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
