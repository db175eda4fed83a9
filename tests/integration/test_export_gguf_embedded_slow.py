"""Slow: the embedded model (SmolLM2-135M) leaves as a GGUF that a real llama.cpp runs like the
in-memory cell, for Table 1's RCPU-selection COEC cell at 30 % (one width in every block: llama
arch) and for an iterative FLAP AL-AM cell (per-layer widths: deci arch).

The cells are built as the workflow builds them, with config.yaml's settings, through the
package API (calibration enwiki-32x512, ``group_rounding``, the ``coec`` compensation; the
``iflap-alam`` variant); where this checkout's workflow already made them
(``results/smollm2-135m/...``), those files are used. llama.cpp's f32 logits must match to 1e-4 of
the logit scale and its perplexity over the first evaluation windows to 0.1 %.

Needs llama-cpp-python (CI's llama.cpp step installs it); skipped with the reason otherwise.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from coec.cli import main
from coec.config.validate import validate_config
from coec.data import text as data
from coec.evaluate.llamacpp.run import gguf_logits, gguf_perplexity, unavailable
from coec.evaluate.ppl import perplexity
from coec.model.cell import build_model

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
MODEL = "smollm2-135m"
PPL_WINDOWS = 12  # the first 12 of the 48 evaluation windows of 512 tokens


@pytest.fixture(scope="module")
def config():
    return validate_config(yaml.safe_load((REPO / "config.yaml").read_text()))


@pytest.fixture(scope="module")
def embedded(tmp_path_factory):
    """(model folder, text folder): this checkout's prepared resources, else prepared here."""
    why = unavailable()
    if why:
        pytest.skip(why)
    from coec.data.bundled import prepare_embedded_model, prepare_embedded_text

    model = Path(os.environ.get("COEC_EMBEDDED_MODEL", REPO / f"resources/models/{MODEL}"))
    if not (model / "config.json").is_file():
        model = prepare_embedded_model(MODEL, tmp_path_factory.mktemp("m") / MODEL)
    text = REPO / "resources/text/enwiki"
    if not (text / "eval.txt").is_file():
        text = tmp_path_factory.mktemp("enwiki")
        prepare_embedded_text(text)
    return Path(model), text


def dataset(text: Path, config: dict) -> dict:
    """The embedded Wikipedia dataset spec, as the workflow passes it."""
    return {"source": "embedded", "dir": str(text), "eval_every": config["datasets"]["enwiki"]["eval_every"]}


def table1_cell(config, model: Path, text: Path, work: Path) -> tuple[Path, list[Path]]:
    """keep.json and block files of Table 1's rcpu-0.3/coec cell (the workflow's, or built)."""
    cell = REPO / f"results/{MODEL}/enwiki-32x512/rcpu-0.3"
    if (cell / "keep.json").is_file() and (cell / "coec/block0-29.safetensors").is_file():
        return cell / "keep.json", [cell / "coec/block0-29.safetensors"]
    c = config["calibration"]["enwiki-32x512"]
    grams, keep, block = work / "grams", work / "keep.json", work / "block0-29.safetensors"
    ds = json.dumps(dataset(text, config))
    assert (
        main(
            [
                "calibrate",
                "--model",
                str(model),
                "--dataset",
                ds,
                "--nsamples",
                str(c["nsamples"]),
                "--seqlen",
                str(c["seqlen"]),
                "--seed",
                str(c["seed"]),
                "--batch-size",
                str(c["batch_size"]),
                "--gram-dtype",
                c["gram_dtype"],
                "--device",
                "cpu",
                "--out",
                str(grams),
            ]
        )
        == 0
    )
    assert (
        main(
            [
                "select",
                "--model",
                str(model),
                "--grams",
                str(grams),
                "--method",
                "rcpu",
                "--ratio",
                "0.3",
                "--group-rounding",
                config["group_rounding"],
                "--out",
                str(keep),
            ]
        )
        == 0
    )
    assert (
        main(
            [
                "compensate",
                "--model",
                str(model),
                "--grams",
                str(grams),
                "--keep",
                str(keep),
                "--spec",
                json.dumps(config["compensations"]["coec"]),
                "--first",
                "0",
                "--last",
                "29",
                "--device",
                "cpu",
                "--out",
                str(block),
            ]
        )
        == 0
    )
    return keep, [block]


def al_am_cell(config, model: Path, text: Path, work: Path) -> tuple[Path, list[Path]]:
    """keep.json and block of the iterative ``iflap-alam`` cell at 30 % (the workflow's, or built)."""
    cell = REPO / f"results/{MODEL}/enwiki-32x512/iterative/iflap-alam-0.3"
    if (cell / "keep.json").is_file() and (cell / "block0-29.safetensors").is_file():
        return cell / "keep.json", [cell / "block0-29.safetensors"]
    c = config["calibration"]["enwiki-32x512"]
    v = config["iterative"]["variants"]["iflap-alam"]
    ds = dataset(text, config)
    out = work / "alam"
    assert (
        main(
            [
                "iterative",
                "run",
                "--model",
                str(model),
                "--domains",
                json.dumps([{"name": "enwiki", "alpha": 1.0, "dataset": ds}]),
                "--nsamples",
                str(c["nsamples"]),
                "--seqlen",
                str(c["seqlen"]),
                "--seed",
                str(c["seed"]),
                "--batch-size",
                str(c["batch_size"]),
                "--gram-dtype",
                c["gram_dtype"],
                "--ratio",
                "0.3",
                "--step",
                str(v["step"]),
                "--structure",
                v["structure"],
                "--group-rounding",
                config["group_rounding"],
                "--device",
                "cpu",
                "--quiet",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    return out / "keep.json", sorted(out.glob("block*.safetensors"))


def compare(model, windows: torch.Tensor, path: Path) -> dict:
    """Max |logit diff| / logit scale over two windows, and the relative perplexity difference
    over ``windows``, llama.cpp (f32 GGUF, f32 KV cache) against the in-memory cell."""
    diff, scale = 0.0, 0.0
    for w in windows[:2]:
        with torch.no_grad():
            ref = model(input_ids=w[None]).logits[0].double().numpy()
        got = gguf_logits(path, w[None], n_threads=1)[0]
        diff, scale = max(diff, float(np.abs(got - ref).max())), max(scale, float(np.abs(ref).max()))
    ppl_hf = perplexity(model, windows, batch_size=4, progress=False)["ppl"]
    ppl_cpp = gguf_perplexity(path, windows, n_threads=1)["ppl"]
    return {
        "rel": diff / scale,
        "diff": diff,
        "scale": scale,
        "ppl_hf": ppl_hf,
        "ppl_cpp": ppl_cpp,
        "ppl_rel": abs(ppl_cpp / ppl_hf - 1),
    }


@pytest.mark.parametrize("which,arch", [("table1", "llama"), ("al-am", "deci")])
def test_embedded_cell_runs_in_llama_cpp_like_the_model(config, embedded, tmp_path, which, arch):
    model_dir, text = embedded
    build = table1_cell if which == "table1" else al_am_cell
    keep, comp = build(config, model_dir, text, tmp_path)
    out = tmp_path / "cell.gguf"
    assert (
        main(
            [
                "export",
                "--model",
                str(model_dir),
                "--keep",
                str(keep),
                "--comp",
                *map(str, comp),
                "--format",
                "gguf",
                "--gguf-type",
                "f32",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    import gguf

    assert gguf.GGUFReader(str(out)).get_field("general.architecture").contents() == arch
    model, tok = build_model(str(model_dir), "float32", "cpu", str(keep), [str(c) for c in comp])
    ev = config["evaluation"]
    tokens = data.tokenize_text(tok, data.load_split(dataset(text, config), "eval"))
    windows = data.eval_windows(tokens, ev["ppl_seqlen"], PPL_WINDOWS)
    m = compare(model, windows, out)
    print(f"{which} ({arch}): {m}")
    assert m["rel"] <= 1e-4, m
    assert m["ppl_rel"] <= 1e-3, m
