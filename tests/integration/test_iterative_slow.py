"""The slow tests of test_iterative.py (a real embedded model, a Snakemake run of the whole chain or
several reruns): set slow for the whole file (CI's slow steps, or `pytest -m slow`)."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow


def test_trimmed_workflow_iterative_cell(tmp_path):
    import csv

    import yaml

    from conftest import CORPUS, job_counts, make_model_dir, snakemake

    model = make_model_dir(tmp_path / "tiny-llama", "llama")
    (tmp_path / "calib.txt").write_text(CORPUS)
    (tmp_path / "eval.txt").write_text(CORPUS[1000:4000])
    (tmp_path / "code.txt").write_text("def f(x):\n    return [i * x for i in range(10)]\n\n" * 80)
    cfg = {
        "models": {"tiny": {"source": str(model), "num_layers": 2}},
        "datasets": {
            "local": {"source": "files", "calib": str(tmp_path / "calib.txt"), "eval": str(tmp_path / "eval.txt")},
            "code": {"source": "files", "calib": str(tmp_path / "code.txt"), "eval": str(tmp_path / "code.txt")},
        },
        "calibration": {"c8": {"dataset": "local", "nsamples": 8, "seqlen": 32, "batch_size": 4}},
        "evaluation": {"ppl_dataset": "local", "ppl_seqlen": 32, "ppl_max_windows": 4},
        "compensations": {"none": {"method": "none"}, "bias": {"method": "bias"}},
        "compute": {"device": "cpu", "compensate_block": 0},
        "table1": {
            "calibration": "c8",
            "models": ["tiny"],
            "ratios": [0.5],
            "rows": [{"selection": "flap", "compensation": "bias"}],
        },
        "domains": {"nl": {"source": "dataset", "dataset": "local"}, "code": {"source": "dataset", "dataset": "code"}},
        "iterative": {
            "mixes": {"mix8": {"domains": {"nl": 1, "code": 1}, "nsamples": 8, "seqlen": 32, "batch_size": 4}},
            "variants": {"flap": {"steps": 1}, "iflap": {"step": 0.25}},
            "table": {
                "calibration": "c8",
                "models": ["tiny"],
                "ratios": [0.25, 0.5],
                "rows": [
                    {"label": "Wanda-sp", "selection": "wanda_sp", "compensation": "none"},
                    {"label": "FLAP", "selection": "flap", "compensation": "bias"},
                    {"label": "iterative", "variant": "iflap"},
                    {"label": "multi-domain", "variant": "flap", "calibration": "mix8"},
                    {"label": "iterative + multi-domain", "variant": "iflap", "calibration": "mix8"},
                ],
            },
        },
    }
    path = tmp_path / "trim.yaml"
    path.write_text(yaml.safe_dump(cfg))
    snakemake(tmp_path, "--cores", "2", "results/table_iterative.csv", "--configfile", str(path))
    rows = list(csv.DictReader((tmp_path / "results/table_iterative.csv").open()))
    assert len(rows) == 1 + 5 * 2 and all(float(r["tiny"]) > 1 for r in rows)
    # the single-step iterative FLAP on c8 equals the workflow's FLAP cell
    a = json.loads((tmp_path / "results/tiny/c8/flap-0.5/bias/ppl.json").read_text())
    steps = tmp_path / "results/tiny/c8/iterative/global-uniform/steps"
    assert (steps / "0.25/keep.json").is_file() and (steps / "0.25/0.5/keep.json").is_file()
    # the 0.5 chain reuses the 0.25 step: adding a step reruns only what follows it
    res = snakemake(tmp_path, "-n", "results/table_iterative.csv", "--configfile", str(path))
    assert "Nothing to be done" in res.stdout + res.stderr
    cfg["iterative"]["table"]["ratios"] = [0.25, 0.5, 0.75]
    path.write_text(yaml.safe_dump(cfg))
    counts = job_counts(snakemake(tmp_path, "-n", "results/table_iterative.csv", "--configfile", str(path)).stdout)
    # one new last step per iterative chain (c8, mix8) and the one-step multi-domain cell
    assert counts["iterative_step"] == 3
    assert a["ppl"] > 1
