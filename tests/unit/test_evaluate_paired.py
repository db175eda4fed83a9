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
    se_b = math.sqrt((8 * 0.25 * 8 / 7) / 8 / 8)  # sd^2 = 8/7 * 0.25 (n - 1 variance)
    se_h = math.sqrt((0.75 * 0.25 * 4 / 3) / 4)  # d = (-1,0,0,0): var = 3/16 * 4/3
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


def _write_margins(folder, task, margins_and_labels):
    (folder / "zeroshot_samples").mkdir(parents=True, exist_ok=True)
    rows = []
    for i, (m, y) in enumerate(margins_and_labels):
        # loglik(choice 0) = -3, loglik(choice 1) = -3 + m
        resps = [[str(-3.0), "False"], [str(-3.0 + m), "False"]]
        rows.append(
            json.dumps({"doc_id": i, "target": str(y), "filtered_resps": resps, "acc": float((m > 0) == (y == 1))})
        )
    (folder / "zeroshot_samples" / f"{task}.jsonl").write_text("\n".join(rows) + "\n")


def test_two_choice_separates_the_prior_from_the_ranking(tmp_path):
    pairs = [(0.5, 1), (0.2, 0), (0.9, 1), (-0.1, 0), (0.3, 1), (-0.4, 0), (0.1, 1), (0.4, 0)]
    _write_margins(tmp_path, "boolq", pairs)
    got = paired.margins(tmp_path, "boolq")
    assert sorted(got) == list(range(len(pairs)))
    assert [got[i][1] for i in range(8)] == [y for _, y in pairs]
    assert [got[i][0] for i in range(8)] == pytest.approx([m for m, _ in pairs])
    st = paired.two_choice(got.values())
    # brute-force Mann-Whitney: pairs (pos, neg) with pos margin larger, ties half
    pos = [m for m, y in pairs if y == 1]
    neg = [m for m, y in pairs if y == 0]
    brute = sum((a > b) + 0.5 * (a == b) for a in pos for b in neg) / (len(pos) * len(neg))
    assert st["auc"] == pytest.approx(brute)
    assert st["choice1_rate"] == pytest.approx(6 / 8) and st["label1_rate"] == 0.5
    assert st["acc"] == pytest.approx(sum((m > 0) == (y == 1) for m, y in pairs) / 8)
    # a constant shift of the margin moves the prior and the accuracy, never the AUC
    for shift in (-1.0, -0.35, 0.6):
        sh = paired.two_choice([(m + shift, y) for m, y in pairs])
        assert sh["auc"] == pytest.approx(st["auc"])
    assert paired.two_choice([(m - 1.0, y) for m, y in pairs])["choice1_rate"] == 0


def test_two_choice_limits_and_ties():
    assert paired.two_choice([(1.0, 1), (2.0, 1), (-1.0, 0)])["auc"] == 1.0
    assert paired.two_choice([(-1.0, 1), (2.0, 0), (1.0, 0)])["auc"] == 0.0
    assert paired.two_choice([(0.3, 1), (0.3, 0), (0.3, 1), (0.3, 0)])["auc"] == 0.5
    assert math.isnan(paired.two_choice([(0.3, 1), (0.2, 1)])["auc"])
    with pytest.raises(ValueError, match="no documents"):
        paired.two_choice([])


def test_cli_two_choice_rows(tmp_path, capsys):
    for name, shift in (("a", 0.0), ("b", -1.0)):
        _write(tmp_path / name, {"boolq": [1, 0, 1, 0]})
        _write_margins(
            tmp_path / name, "boolq", [(0.5 + shift, 1), (0.2 + shift, 0), (0.9 + shift, 1), (-0.1 + shift, 0)]
        )
    assert paired.main([str(tmp_path / "a"), str(tmp_path / "b"), "--two-choice"]) == 0
    out = capsys.readouterr().out
    assert "boolq A" in out and "boolq B" in out and "  1.000" in out  # AUC 1 for both


def test_margins_take_the_label_from_acc_when_the_target_is_text(tmp_path):
    (tmp_path / "zeroshot_samples").mkdir()
    rows = [  # WinoGrande-style: target is the gold continuation; acc says which choice is right
        {"doc_id": 0, "target": "the cat sat", "filtered_resps": [["-5", "F"], ["-4", "F"]], "acc": 1.0},
        {"doc_id": 1, "target": "the dog ran", "filtered_resps": [["-5", "F"], ["-4", "F"]], "acc": 0.0},
        {"doc_id": 2, "target": "a bird flew", "filtered_resps": [["-3", "F"], ["-4", "F"]], "acc": 1.0},
    ]
    (tmp_path / "zeroshot_samples" / "winogrande.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    assert paired.margins(tmp_path, "winogrande") == {0: (1.0, 1), 1: (1.0, 0), 2: (-1.0, 0)}
    (tmp_path / "zeroshot_samples" / "hellaswag.jsonl").write_text(
        json.dumps({"doc_id": 0, "target": "0", "filtered_resps": [["-1", "F"]] * 4, "acc": 1.0})
    )
    with pytest.raises(ValueError, match="4 choices"):
        paired.margins(tmp_path, "hellaswag")


def test_margin_agreement_sees_a_pure_shift():
    a = {0: (0.5, 1), 1: (-0.2, 0), 2: (0.9, 1), 3: (0.1, 0)}
    shifted = {i: (m - 0.7, y) for i, (m, y) in a.items()}
    ag = paired.margin_agreement(a, shifted)
    assert ag["shift"] == pytest.approx(0.7) and ag["corr"] == pytest.approx(1.0) and ag["n"] == 4
    flipped = {i: (-m, y) for i, (m, y) in a.items()}
    assert paired.margin_agreement(a, flipped)["corr"] == pytest.approx(-1.0)
    assert math.isnan(paired.margin_agreement(a, {i: (0.0, y) for i, (_, y) in a.items()})["corr"])
    # pairs on the shared documents only: doc 3 is missing from B, doc 9 from A
    part = {0: (0.5, 1), 1: (-0.2, 0), 2: (0.9, 1), 9: (5.0, 0)}
    assert paired.margin_agreement(a, part) == {"n": 3, "shift": 0.0, "corr": pytest.approx(1.0)}
    with pytest.raises(ValueError, match="share no document"):
        paired.margin_agreement(a, {7: (0.1, 1)})
    with pytest.raises(ValueError, match="gold labels"):
        paired.margin_agreement(a, {0: (0.5, 0)})
