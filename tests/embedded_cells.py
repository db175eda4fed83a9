"""The embedded model (SmolLM2-135M) and two of its cells, built as the workflow builds them, for the
slow tests that run them in a real llama.cpp (tests/integration/*_embedded_slow.py; fixtures
``embedded`` and ``embedded_cell`` in tests/conftest.py make each once per pytest worker).

The cells use config.yaml's settings (calibration enwiki-32x512, ``group_rounding``, the ``coec``
compensation; the ``iflap-alam`` variant), made smaller where an export cannot tell the difference
(``SMALLER``): 8 calibration sequences instead of 32, 1 COEC round instead of 20 and at most 3
right-solve steps in it instead of 100, the same ratio, structure and compensated modules. Where this
checkout's workflow already made the full cells (``results/smollm2-135m/...``), those files are used."""

from __future__ import annotations

import json
import os
from pathlib import Path

import yaml

from coec.cli import main
from coec.config.validate import validate_config

REPO = Path(__file__).resolve().parents[1]
MODEL = "smollm2-135m"
PPL_WINDOWS = 4  # the first 4 of the 48 evaluation windows of 512 tokens
# config.yaml's settings lowered to build the cells in minutes: calibration sequences, COEC rounds and
# right-solve steps per round (the Table 1 cell's compensation: 95 s at 100 steps, 43 s at 3, 2 quiet cores)
SMALLER = {"nsamples": 8, "max_rounds": 1, "max_inner_steps": 3}


def repo_config() -> dict:
    """This checkout's config.yaml, validated (defaults filled in)."""
    return validate_config(yaml.safe_load((REPO / "config.yaml").read_text()))


def prepare(root: Path) -> tuple[Path, Path]:
    """(model folder, text folder): this checkout's prepared resources, else prepared under ``root``."""
    from coec.data.bundled import prepare_embedded_model, prepare_embedded_text

    model = Path(os.environ.get("COEC_EMBEDDED_MODEL", REPO / f"resources/models/{MODEL}"))
    if not (model / "config.json").is_file():
        model = prepare_embedded_model(MODEL, root / MODEL)
    text = REPO / "resources/text/enwiki"
    if not (text / "eval.txt").is_file():
        text = root / "enwiki"
        text.mkdir(parents=True)
        prepare_embedded_text(text)
    return Path(model), text


def dataset(text: Path, config: dict) -> dict:
    """The embedded Wikipedia dataset spec, as the workflow passes it."""
    return {"source": "embedded", "dir": str(text), "eval_every": config["datasets"]["enwiki"]["eval_every"]}


def calibration_args(config: dict) -> list[str]:
    """The flags of config.yaml's enwiki-32x512 calibration, with ``SMALLER``'s sequence count."""
    c = {**config["calibration"]["enwiki-32x512"], "nsamples": SMALLER["nsamples"]}
    keys = ("nsamples", "seqlen", "seed", "batch_size", "gram_dtype")
    return [arg for k in keys for arg in (f"--{k.replace('_', '-')}", str(c[k]))]


def table1_cell(config, model: Path, text: Path, work: Path) -> tuple[Path, list[Path]]:
    """keep.json and block files of Table 1's rcpu-0.3/coec cell (the workflow's, or built)."""
    cell = REPO / f"results/{MODEL}/enwiki-32x512/rcpu-0.3"
    if (cell / "keep.json").is_file() and (cell / "coec/block0-29.safetensors").is_file():
        return cell / "keep.json", [cell / "coec/block0-29.safetensors"]
    grams, keep, block = work / "grams", work / "keep.json", work / "block0-29.safetensors"
    ds = json.dumps(dataset(text, config))
    cpu = ["--device", "cpu"]
    calibrate = ["calibrate", "--model", str(model), "--dataset", ds, *calibration_args(config), *cpu]
    assert main([*calibrate, "--out", str(grams)]) == 0
    rounding = ["--group-rounding", config["group_rounding"]]
    select = ["--method", "rcpu", "--ratio", "0.3", *rounding]
    assert main(["select", "--model", str(model), "--grams", str(grams), *select, "--out", str(keep)]) == 0
    rounds = {k: SMALLER[k] for k in ("max_rounds", "max_inner_steps")}
    spec = json.dumps({**config["compensations"]["coec"], **rounds})
    cell_args = ["--model", str(model), "--grams", str(grams), "--keep", str(keep), "--spec", spec]
    assert main(["compensate", *cell_args, "--first", "0", "--last", "29", *cpu, "--out", str(block)]) == 0
    return keep, [block]


def al_am_cell(config, model: Path, text: Path, work: Path) -> tuple[Path, list[Path]]:
    """keep.json and block of the iterative ``iflap-alam`` cell at 30 % (the workflow's, or built)."""
    cell = REPO / f"results/{MODEL}/enwiki-32x512/iterative/iflap-alam-0.3"
    if (cell / "keep.json").is_file() and (cell / "block0-29.safetensors").is_file():
        return cell / "keep.json", [cell / "block0-29.safetensors"]
    v = config["iterative"]["variants"]["iflap-alam"]
    domains = json.dumps([{"name": "enwiki", "alpha": 1.0, "dataset": dataset(text, config)}])
    variant = ["--ratio", "0.3", "--step", str(v["step"]), "--structure", v["structure"]]
    variant += ["--group-rounding", config["group_rounding"]]
    out = work / "alam"
    run = ["iterative", "run", "--model", str(model), "--domains", domains, *calibration_args(config), *variant]
    assert main([*run, "--device", "cpu", "--quiet", "--out", str(out)]) == 0
    return out / "keep.json", sorted(out.glob("block*.safetensors"))
