"""The pruned model as a product: GGUF workflow targets next to each cell's HF export (dense and
iterative cells too), the measured deployment cost beside Table 4 (results/table4_measured.csv:
interleaved repeats in processes of their own, speedups beside their bounds) and the GPU half's
script, run here at tiny size on the CPU."""

from __future__ import annotations

import json
import math
import shlex
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from coec.cli import build_parser
from coec.config.validate import ConfigError, validate_config
from coec.evaluate.llamacpp.run import unavailable
from coec.export.formats import ExportRequest
from coec.export.gguf import write_gguf
from coec.export.stage import run_export
from coec.model.cell import build_model
from coec.report.cost import flops_per_token
from coec.report.measured.bounds import gguf_flops_per_token, gguf_read_bytes, prefill_context
from coec.report.measured.table import write_measured
from coec.workflow.targets.measured import measured_spec
from conftest import full_workflow_config, job_counts, make_model_dir, snakemake

REPO = Path(__file__).resolve().parents[2]
SHAPE = dict(
    hidden_size=64, num_attention_heads=8, num_key_value_heads=4, head_dim=8, intermediate_size=96, num_hidden_layers=2
)
MEASURED = {
    "model": "tiny",
    "calibration": "c8",
    "repeats": 1,
    "prompt_tokens": 16,
    "new_tokens": 4,
    "cells": [
        {"selection": "flap", "compensation": "bias", "ratio": 0.5},
        {"variant": "alam", "ratio": 0.5, "label": "AL-AM"},
    ],
    "runtimes": ["transformers-fp32", "llamacpp-f16", "llamacpp-q8_0"],
}
GGUF_TARGETS = [
    "results/tiny/c8/rcpu-0.5/coec/export-q8_0.gguf",
    "results/tiny/dense/export-f16.gguf",
    "results/tiny/c8/iterative/alam-0.5/export-f32.gguf",
]


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    work = tmp_path_factory.mktemp("deploy")
    cfg = full_workflow_config(work)
    cfg["table4_measured"] = MEASURED
    (work / "config.yaml").write_text(yaml.safe_dump(cfg))
    return work


def test_gguf_targets_and_measured_table_are_planned(work):
    """Every option the new rules pass is required, schema-defaulted or defaults to nothing (each
    default exists once), and the measured table depends on every export it times."""
    res = snakemake(
        work,
        "-n",
        "-p",
        "--cores",
        "1",
        "results/table4_measured.csv",
        *GGUF_TARGETS,
        "--configfile",
        str(work / "config.yaml"),
        check=False,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    jobs = job_counts(res.stdout)
    # dense f16 + q8_0, the AL-AM cell's f16 + q8_0 + f32, the flap cell's two and rcpu's q8_0
    assert jobs["export_gguf_dense"] == 2 and jobs["export_gguf_iterative"] == 3
    assert jobs["export_gguf"] == 3 and jobs["export"] == 1 and jobs["table4_measured"] == 1
    outputs = {w for line in res.stdout.splitlines() if line.strip().startswith("output:") for w in line.split()}
    for t in GGUF_TARGETS:  # each GGUF export's sidecar is an output of the same job
        assert {t, t + ".json"} <= {o.rstrip(",") for o in outputs}, t
    parser = build_parser()
    export = parser._subparsers._group_actions[0].choices["export"]
    for line in res.stdout.splitlines():
        if not line.startswith("Shell command: ") or " export --format gguf " not in line:
            continue
        words = shlex.split(line.removeprefix("Shell command: ").split(" > ")[0])
        args = words[words.index("export") + 1 :]
        export.parse_args(args)
        for w in (w for w in args if w.startswith("--")):
            action = next(a for a in export._actions if w in a.option_strings)
            assert action.required or hasattr(action, "config_key") or action.default in (None, [], {}, False), w
        assert "--gguf-type" in args and "--force" not in args
    spec = measured_spec(validate_config(yaml.safe_load((work / "config.yaml").read_text())))
    assert [c["label"] for c in spec["cells"]] == ["dense", "flap+bias 0.5", "AL-AM"]
    assert set(spec["cells"][2]["gguf"]) == {"f16", "q8_0"} and "build" in spec["cells"][2]


def test_imatrix_exports_read_the_cells_own_imatrix_and_the_dense_models_on_its_calibration(work):
    """A ``<type>-imatrix`` target runs the K-quant export with ``--imatrix`` of the cell's own
    imatrix (its calibration set) or the dense model's on ``imatrix_calibration`` (the first set
    unless given); the plain type reads none; an iterative cell takes the types only."""
    cell, dense = "results/tiny/c8/rcpu-0.5/coec", "results/tiny/dense"
    targets = [f"{cell}/export-q4_k_m-imatrix.gguf", f"{dense}/export-q6_k-imatrix.gguf", f"{cell}/export-q4_k_m.gguf"]
    res = snakemake(work, "-n", "-p", "--cores", "1", *targets, "--configfile", str(work / "config.yaml"), check=False)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    jobs = job_counts(res.stdout)
    assert jobs["imatrix_cell"] == 1 and jobs["imatrix_dense"] == 1
    assert jobs["export_gguf"] == 2 and jobs["export_gguf_dense"] == 1
    shells = [line for line in res.stdout.splitlines() if " export --format gguf " in line]
    want = {
        f"{cell}/export-q4_k_m-imatrix.gguf": f"--gguf-type q4_k_m --imatrix {cell}/imatrix.safetensors",
        f"{dense}/export-q6_k-imatrix.gguf": f"--gguf-type q6_k --imatrix {dense}/imatrix-c8.safetensors",
    }
    for target, args in want.items():
        assert any(args in line and f"--out {target}" in line for line in shells), (target, shells)
    plain = next(line for line in shells if f"--out {cell}/export-q4_k_m.gguf" in line)
    assert "--imatrix" not in plain
    res = snakemake(
        work, "-n", "--cores", "1", "results/tiny/c8/iterative/alam-0.5/export-q4_k_m-imatrix.gguf",
        "--configfile", str(work / "config.yaml"), check=False,
    )  # fmt: skip
    assert res.returncode != 0 and "MissingRuleException" in res.stdout + res.stderr


@pytest.mark.parametrize(
    "change,match",
    [
        ({"model": "nope"}, r"table4_measured\.model: unknown model 'nope'"),
        ({"cells": [{"variant": "nope", "ratio": 0.5}]}, r"table4_measured\.cells\[0\]\.variant"),
        ({"cells": [{"selection": "flap", "compensation": "nope", "ratio": 0.5}]}, r"cells\[0\]\.compensation"),
        ({"runtimes": ["vllm"]}, r"table4_measured\.runtimes"),
    ],
)
def test_bad_measured_config_is_one_line_naming_the_key(work, change, match):
    cfg = yaml.safe_load((work / "config.yaml").read_text())
    cfg["table4_measured"] = {**MEASURED, **change}
    with pytest.raises(ConfigError, match=match) as err:
        measured_spec(validate_config(cfg))
    assert "\n" not in str(err.value)


def test_bounds_follow_cost_py(tmp_path):
    """FLOPs per prefill token read from a uniform cell's GGUF equal coec.report.cost's count (2 per
    weight, the head a matmul, the attention scores at the mean causal context); bytes read per
    decoded token are the tensors' bytes less the untied input embedding but a row."""
    import gguf

    src = make_model_dir(tmp_path / "m", "llama", **SHAPE)
    keep = tmp_path / "keep.json"
    keep.write_text(json.dumps({"layers": [{"kv_groups": [0, 2], "channels": list(range(48))}] * 2}))
    model, tok = build_model(str(src), "float32", "cpu", str(keep))
    write_gguf(model, tok, tmp_path / "m.gguf", "f32")
    cfg = json.loads((src / "config.json").read_text())
    shape = {"num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 48}
    ctx = prefill_context(16)
    assert gguf_flops_per_token(tmp_path / "m.gguf", ctx) == pytest.approx(
        flops_per_token(cfg, shape, include_embedding=False, context_len=ctx) * 1e9, rel=1e-12
    )
    r = gguf.GGUFReader(str(tmp_path / "m.gguf"))
    vocab, hidden = cfg["vocab_size"], cfg["hidden_size"]
    assert gguf_read_bytes(tmp_path / "m.gguf") == sum(int(t.n_bytes) for t in r.tensors) - 4 * (vocab - 1) * hidden


@pytest.fixture(scope="module")
def tiny_cells(tmp_path_factory):
    """The dense tiny model and a pruned cell, exported as the workflow exports them."""
    root = tmp_path_factory.mktemp("cells")
    src = make_model_dir(root / "src", "llama", **SHAPE)
    keep = root / "keep.json"
    keep.write_text(json.dumps({"layers": [{"kv_groups": [0, 2], "channels": list(range(0, 96, 2))}] * 2}))
    run_export(ExportRequest(str(src), str(keep), (), "float32", str(root / "export")))
    for name, k in (("dense", None), ("cell", str(keep))):
        for g in ("f16", "q8_0"):
            gguf = ExportRequest(str(src), k, (), "float32", str(root / f"{name}-{g}.gguf"), options={"gguf_type": g})
            run_export(gguf, fmt="gguf")
    return root, src, keep


def tiny_spec(root, src, keep, out: Path, runtimes: list[str], repeats: int, in_memory: bool) -> dict:

    def gguf(name):
        return {g: str(root / f"{name}-{g}.gguf") for g in ("f16", "q8_0")}

    cells = [
        {"label": "dense", "ratio": 0.0, "hf": str(src), "gguf": gguf("dense")},
        {"label": "cell", "ratio": 0.5, "hf": str(root / "export"), "gguf": gguf("cell")},
    ]
    if in_memory:  # a cell no HF class holds (per-layer widths) is timed assembled in memory
        cells.append(
            {
                "label": "in memory",
                "ratio": 0.5,
                "gguf": gguf("cell"),
                "build": {"model": str(src), "keep": str(keep), "comp": []},
            }
        )
    return {
        "runtimes": runtimes,
        "prompt_tokens": 16,
        "new_tokens": 4,
        "repeats": repeats,
        "threads": 1,
        "seed": 0,
        "device": "cpu",
        "caption": "tiny",
        "cells": cells,
        "figure": str(out.parent / "fig.png"),
    }


def check_table(df, out: Path, n_rows: int, repeats: int) -> None:
    assert list(pd.read_csv(out).columns) == list(df.columns) and len(df) == n_rows
    dense = df[df.cell == "dense"]
    assert (dense.decode_speedup == 1).all() and (dense.byte_bound == 1).all() and (dense.flop_bound == 1).all()
    cell = df[df.cell == "cell"]
    assert (cell.byte_bound > 1.3).all() and (cell.flop_bound > 1.3).all()
    assert (df.prefill_tok_s > 0).all() and (df.decode_tok_s > 0).all() and (df.peak_rss_mb > 10).all()
    runs = json.loads(out.with_suffix(".runs.json").read_text())
    assert all(len(c["runs"]) == repeats for c in runs["configs"])
    assert len(runs["machine"]["load_1min"]) == repeats + 1
    assert "interleaved repeats" in out.with_suffix(".md").read_text()
    assert (out.parent / "fig.png").stat().st_size > 10_000


def test_measured_table_on_tiny_exports(tiny_cells, tmp_path):
    """Two interleaved repeats of the dense model and a cell, each run in a process of its own
    (llama.cpp where it is installed: its workers start fast; else transformers)."""
    runtimes = ["transformers-fp32"] if unavailable() else ["llamacpp-f16"]
    out = tmp_path / "t.csv"
    df = write_measured(tiny_spec(*tiny_cells, out, runtimes, 2, False), out)
    check_table(df, out, 2, 2)


@pytest.mark.slow
def test_measured_table_every_runtime(tiny_cells, tmp_path):
    if unavailable():
        pytest.skip(unavailable())
    runtimes = ["transformers-fp32", "transformers-bf16", "llamacpp-f16", "llamacpp-q8_0"]
    out = tmp_path / "t.csv"
    df = write_measured(tiny_spec(*tiny_cells, out, runtimes, 2, True), out)
    check_table(df, out, 3 * 4, 2)
    assert math.isnan(df[df.cell == "in memory"].file_mb.iloc[0])
    f16, fp32 = (df[(df.cell == "cell") & (df.type == t)].iloc[0] for t in ("f16", "float32"))
    assert f16.read_mb < fp32.read_mb * 0.55


def test_gpu_half_runs_at_tiny_size_on_the_cpu(tmp_path):
    out = tmp_path / "d.json"
    proc = subprocess.run(
        [
            sys.executable,
            "benchmarks/deploy_speed.py",
            "--random-arch",
            "tiny",
            "--device",
            "cpu",
            "--dtype",
            "float32",
            "--ratios",
            "0.25,0.5",
            "--prompt",
            "16",
            "--new-tokens",
            "4",
            "--repeat",
            "2",
            "--json",
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [r["ratio"] for r in rows] == [0.0, 0.25, 0.5]
    assert rows[0]["decode_speedup"] == 1 and 1 < rows[1]["byte_bound"] < rows[2]["byte_bound"]
    assert "llama.cpp" in proc.stdout and "| decode speedup | byte bound |" in proc.stdout


@pytest.mark.slow
def test_workflow_writes_gguf_targets(work):
    import gguf

    res = snakemake(work, "--cores", "2", *GGUF_TARGETS, "--configfile", str(work / "config.yaml"), check=False)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    archs = [gguf.GGUFReader(str(work / t)).get_field("general.architecture").contents() for t in GGUF_TARGETS]
    assert archs[:2] == ["llama", "llama"] and archs[2] in ("llama", "deci")
    for t in GGUF_TARGETS:
        report = json.loads((work / f"{t}.json").read_text())
        assert report["file"] == Path(t).name and report["type"] == Path(t).stem.removeprefix("export-")


CRASHING_WORKER = """
import json, os, runpy, signal, sys
job = json.loads(sys.argv[1])
if job["runtime"] == "transformers" and job["dtype"] == "bfloat16" and "export" in job.get("path", ""):
    os.kill(os.getpid(), signal.SIGSEGV)  # as llama.cpp's AMX matmul does on some CPUs
runpy.run_module("coec.report.measured.worker", run_name="__main__")
"""


@pytest.mark.slow  # 26 s: the measured harness with a crashing worker (CI's llama.cpp step runs it)
def test_a_worker_killed_by_a_signal_fails_its_configuration_not_the_table(tiny_cells, tmp_path, monkeypatch):
    """The pruned cell's bf16 worker dies with SIGSEGV in every repeat: that configuration is
    run once, recorded as failed with its signal (.runs.json, the CSV's and the .md's status),
    has no measurement, and every other configuration is measured in every repeat."""
    from coec.report.measured import table as measured

    fake = tmp_path / "crashing_worker.py"
    fake.write_text(CRASHING_WORKER)
    monkeypatch.setattr(measured, "worker_command", lambda: [sys.executable, str(fake)])
    out = tmp_path / "t.csv"
    df = write_measured(tiny_spec(*tiny_cells, out, ["transformers-fp32", "transformers-bf16"], 2, False), out)
    assert len(df) == 4 and list(pd.read_csv(out).columns) == list(df.columns)
    bad = (df.cell == "cell") & (df.type == "bfloat16")
    assert df[bad].status.tolist() == ["failed: SIGSEGV (signal 11)"]
    assert (df[~bad].status == "ok").all()
    speeds = ["prefill_tok_s", "decode_tok_s", "peak_rss_mb", "read_mb", "decode_speedup", "prefill_speedup"]
    assert df[bad][speeds].isna().all(axis=None)
    assert (df[~bad][["prefill_tok_s", "decode_tok_s"]] > 0).all(axis=None)
    runs = json.loads(out.with_suffix(".runs.json").read_text())["configs"]
    failed = [c for c in runs if c.get("failed")]
    assert len(failed) == 1 and failed[0]["runs"] == []
    assert failed[0]["failed"]["signal"] == "SIGSEGV" and failed[0]["failed"]["repeat"] == 1
    assert all(len(c["runs"]) == 2 for c in runs if not c.get("failed"))
    assert "failed: SIGSEGV (signal 11)" in out.with_suffix(".md").read_text()
