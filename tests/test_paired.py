"""Paired zero-shot comparison (coec.evaluate.paired) against closed forms."""

import json
import math

import pytest

from coec.evaluate import paired


def _write(folder, per_task):
    (folder / "zeroshot_samples").mkdir(parents=True)
    (folder / "zeroshot.json").write_text(json.dumps({"tasks": list(per_task)}))
    for task, values in per_task.items():
        metric = paired.task_spec(task).metric
        rows = [json.dumps({"doc_id": i, metric: v, "acc": v}) for i, v in enumerate(values)]
        (folder / "zeroshot_samples" / f"{task}.jsonl").write_text("\n".join(rows) + "\n")


def test_identical_results_differ_by_nothing(tmp_path):
    vals = {"boolq": [1, 0, 1, 1, 0], "rte": [0, 1, 1, 0]}
    _write(tmp_path / "a", vals)
    _write(tmp_path / "b", vals)
    res = paired.paired_difference(paired.load(tmp_path / "a"), paired.load(tmp_path / "b"))
    assert res["diff"] == 0 and res["se"] == 0 and res["z"] == 0
    assert res["se_unpaired"] > 0  # the unpaired error does not see that the documents agree


def test_difference_and_standard_errors_match_the_closed_form(tmp_path):
    # boolq: A right on all 8, B on the first 4 -> d = (0,0,0,0,1,1,1,1)
    # hellaswag (metric acc_norm): A = B except doc 0, where A is wrong -> d = (-1, 0, 0, 0)
    _write(tmp_path / "a", {"boolq": [1] * 8, "hellaswag": [0, 1, 0, 1]})
    _write(tmp_path / "b", {"boolq": [1] * 4 + [0] * 4, "hellaswag": [1, 1, 0, 1]})
    res = paired.paired_difference(paired.load(tmp_path / "a"), paired.load(tmp_path / "b"))
    t = res["tasks"]
    assert t["boolq"]["diff"] == pytest.approx(0.5) and t["hellaswag"]["diff"] == pytest.approx(-0.25)
    se_b = math.sqrt((8 * 0.25 * 8 / 7) / 8 / 8)           # sd^2 = 8/7 * 0.25 (n - 1 variance)
    se_h = math.sqrt((0.75 * 0.25 * 4 / 3) / 4)            # d = (-1,0,0,0): var = 3/16 * 4/3
    assert t["boolq"]["se"] == pytest.approx(se_b) and t["hellaswag"]["se"] == pytest.approx(se_h)
    assert res["diff"] == pytest.approx(0.125)
    assert res["se"] == pytest.approx(math.hypot(se_b, se_h) / 2)
    assert res["z"] == pytest.approx(0.125 / res["se"])


def test_only_shared_documents_are_paired_and_missing_records_are_errors(tmp_path):
    _write(tmp_path / "a", {"rte": [1, 1, 0]})
    _write(tmp_path / "b", {"rte": [0, 1]})
    res = paired.paired_difference(paired.load(tmp_path / "a"), paired.load(tmp_path / "b"))
    assert res["tasks"]["rte"]["n"] == 2
    with pytest.raises(KeyError, match="boolq"):
        paired.paired_difference({"boolq": {0: 1.0}}, {"rte": {0: 1.0}})
    (tmp_path / "c").mkdir()
    with pytest.raises(FileNotFoundError, match="log-samples"):
        paired.per_document(tmp_path / "c", "rte")


def test_cli_prints_the_mean_row(tmp_path, capsys):
    _write(tmp_path / "a", {"boolq": [1, 1, 0, 1]})
    _write(tmp_path / "b", {"boolq": [1, 0, 0, 1]})
    assert paired.main([str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    assert "mean" in out and "25.00" in out
