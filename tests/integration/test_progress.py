"""coec.io.progress: a tqdm bar on a terminal or when asked, count/ETA log lines in a batch log,
nothing when turned off; the compensation stage reports per (layer, module)."""

from __future__ import annotations

import io
import logging
import re

import pytest

from coec.compensate.stage import CompensateOptions
from coec.io import progress as PR
from coec.model.source import CellSource


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def _lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "coec.io.progress"]


@pytest.mark.parametrize(
    "env, tty, want",
    [
        (None, True, "bar"),
        (None, False, "lines"),
        ("1", False, "bar"),
        ("bar", False, "bar"),
        ("0", True, "off"),
        ("off", False, "off"),
        ("lines", True, "lines"),
    ],
)
def test_mode_from_env_and_terminal(monkeypatch, env, tty, want):
    if env is None:
        monkeypatch.delenv(PR.ENV, raising=False)
    else:
        monkeypatch.setenv(PR.ENV, env)
    assert PR.progress_mode(_Tty() if tty else io.StringIO()) == want


def test_bad_env_value_is_one_clear_error(monkeypatch):
    monkeypatch.setenv(PR.ENV, "maybe")
    with pytest.raises(ValueError, match="COEC_PROGRESS"):
        PR.progress_mode(io.StringIO())


def test_log_lines_every_tenth_with_count_and_eta(monkeypatch, caplog):
    monkeypatch.delenv(PR.ENV, raising=False)
    caplog.set_level(logging.INFO, logger="coec.io.progress")
    in_a_log = PR.Display(stream=io.StringIO())  # not a terminal
    assert list(PR.bar(range(20), desc="calibrate", unit="layer", display=in_a_log)) == list(range(20))
    lines = _lines(caplog)
    assert len(lines) == 10
    assert lines[0].startswith("calibrate: 2/20 layers (10%) elapsed ")
    assert lines[-1].startswith("calibrate: 20/20 layers (100%) elapsed ")
    assert all(re.search(r" eta (\d\d:)?\d\d:\d\d", line) for line in lines)
    caplog.clear()
    for _ in PR.bar(range(3), desc="perplexity", unit="batch", display=PR.Display(stream=io.StringIO())):
        pass
    assert _lines(caplog)[-1].startswith("perplexity: 3/3 batches (100%)")
    caplog.clear()  # slow items: a line once `interval` seconds have passed, between the tenths
    assert len(list(PR.LogProgress(range(100), desc="slow", interval=0.0))) == 100
    assert len(_lines(caplog)) == 100


def test_terminal_draws_a_bar_and_logs_nothing(monkeypatch, caplog):
    monkeypatch.delenv(PR.ENV, raising=False)
    caplog.set_level(logging.INFO, logger="coec.io.progress")
    tty = _Tty()
    for _ in PR.bar(range(3), desc="perplexity", unit="batch", display=PR.Display(stream=tty)):
        pass
    assert "perplexity" in tty.getvalue() and "3/3" in tty.getvalue()
    assert _lines(caplog) == []


def test_off_and_disabled_and_inner_loops_are_silent(monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="coec.io.progress")
    tty = _Tty()
    monkeypatch.setenv(PR.ENV, "0")
    assert sum(PR.bar(range(5), desc="x", display=PR.Display(stream=tty))) == 10
    monkeypatch.setenv(PR.ENV, "lines")
    assert sum(PR.bar(range(5), desc="x", disable=True, display=PR.Display(stream=tty))) == 10
    assert sum(PR.bar(range(5), desc="rounds", display=PR.INNER)) == 10  # an inner loop in a log
    assert tty.getvalue() == "" and _lines(caplog) == []


def test_routed_third_party_tqdm_follows_the_mode(monkeypatch, caplog):
    import types

    from tqdm import tqdm

    mod = types.SimpleNamespace(tqdm=tqdm)
    monkeypatch.setenv(PR.ENV, "lines")
    caplog.set_level(logging.INFO, logger="coec.io.progress")
    with PR.routed_tqdm(mod):
        pbar = mod.tqdm(total=4, disable=False, desc="Running loglikelihood requests")
        for _ in range(4):
            pbar.update(1)
        pbar.close()
        assert sum(mod.tqdm(range(4), disable=True)) == 6
    assert mod.tqdm is tqdm
    assert _lines(caplog)[-1].startswith("Running loglikelihood requests: 4/4 its (100%)")


def _compensate(llama_dir, d):
    from coec.compensate.stage import run_compensate

    run_compensate(
        CellSource(str(llama_dir), keep=str(d / "keep.json"), device="cpu"),
        str(d / "grams"),
        CompensateOptions({"method": "bias"}, 0, 1),
        str(d / "block0-1.safetensors"),
    )


def test_compensation_reports_count_and_eta_per_module(llama_dir, pruned_cell, monkeypatch, caplog, capsys):
    caplog.set_level(logging.INFO, logger="coec.io.progress")
    monkeypatch.setenv(PR.ENV, "lines")  # a job log
    _compensate(llama_dir, pruned_cell)
    lines = [line for line in _lines(caplog) if line.startswith("compensate")]
    assert len(lines) == 4, lines  # 2 layers x (o_proj, down_proj)
    assert lines[0].startswith("compensate bias: 1/4 modules (25%) elapsed ")
    assert lines[-1].startswith("compensate bias: 4/4 modules (100%) elapsed ")
    assert lines[-1].endswith("[layer 1 down_proj]") and " eta " in lines[-1]
    caplog.clear()
    monkeypatch.setenv(PR.ENV, "1")  # asked for the bar in a log
    _compensate(llama_dir, pruned_cell)
    err = capsys.readouterr().err
    assert "compensate bias" in err and "4/4" in err and "module" in err
    assert not [line for line in _lines(caplog) if line.startswith("compensate")]
    monkeypatch.setenv(PR.ENV, "0")
    _compensate(llama_dir, pruned_cell)
    assert "compensate bias" not in capsys.readouterr().err
    assert not [line for line in _lines(caplog) if line.startswith("compensate")]
