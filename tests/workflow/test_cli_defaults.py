"""Each default exists once: every option the workflow's rules pass to the ``coec`` CLI is
required, takes its default from the config schema (``coec.cli.config_arg``), or defaults to
nothing (None, an empty list or mapping, False), so a stage run by hand and the same stage run
by the workflow compute the same thing. The commands are read from a dry run (``-n -p``) of a
config that reaches every rule."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

import pytest
import yaml

from coec.cli import build_parser
from coec.config.validate import schema_default
from conftest import full_workflow_config, snakemake

REPO = Path(__file__).resolve().parents[2]
TARGETS = [
    "results/table1.csv",
    "results/table2.csv",
    "results/table3.csv",
    "results/appC.csv",
    "results/table4.csv",
    "results/table_iterative.csv",
    "results/table_iterative_zeroshot.csv",
    "results/figures/fig2_calibration_size.png",
    "results/figures/iterative_calibration_size.png",
    "results/tiny/c8/rcpu-0.5/coec/export",
    "results/tiny/c8/rcpu-0.5/coec/imatrix.safetensors",
    "results/tiny/dense/imatrix-c8.safetensors",
    "results/tiny/c8/search-obs-0.5/keep.json",
    "results/README.md",
    "results/claims.md",
]
ABSENT = (None, [], {}, "{}", False)


def every_rule_config(work: Path) -> dict:
    cfg = full_workflow_config(work)
    cfg["evaluation"].update(
        zeroshot_tasks=["boolq", "rte", "winogrande", "hellaswag", "arc_easy", "arc_challenge", "openbookqa"],
        zeroshot_limit=5,
    )
    cfg["calibration"]["c4-holdout"] = dict(cfg["calibration"]["c8"], nsamples=4, seed=1, disjoint_from="c8")
    cfg["compensations"]["blend"] = {"method": "blend", "base": "coec", "holdout": "c4-holdout"}
    cfg["table1"]["rows"].append({"selection": "rcpu", "compensation": "blend"})
    cfg["selections"] = {  # a width search over obs candidates refit by blend (search candidates, search run)
        "obs-a8": {"score": "obs", "channel_multiple": 8, "channel_rounding": "nearest"},
        "search-obs": {
            "score": "search",
            "candidates": "obs-a8",
            "compensation": "blend",
            "holdout": "c4-holdout",
            "tokens": [32, 64],
        },
    }
    cfg["appC"] = {"model": "tiny", "calibration": "c8", "selection": "rcpu", "ratio": 0.5, "compensation": "coec"}
    cfg["table4"] = {"ratio": 0.5, "models": ["tiny"]}
    return cfg


@pytest.fixture(scope="module")
def rule_commands(tmp_path_factory) -> list[list[str]]:
    """The argument lists after the ``coec`` entry point of every job of the dry run."""
    work = tmp_path_factory.mktemp("every-rule")
    cfg_path = work / "config.yaml"
    cfg_path.write_text(yaml.safe_dump(every_rule_config(work)))
    res = snakemake(work, "-n", "-p", "--cores", "1", *TARGETS, "--configfile", str(cfg_path), timeout=600)
    commands = []
    for line in res.stdout.splitlines():
        if not line.startswith("Shell command: "):
            continue
        words, cmd = shlex.split(line.removeprefix("Shell command: ")), None
        for w in words:
            if w in (">", "&&", "2>&1") or w.startswith((">", ")")):
                cmd = None
            elif cmd is not None:
                cmd.append(w)
            elif w.lstrip("(").endswith("/coec"):
                cmd = []
                commands.append(cmd)
    assert commands
    return commands


def _subparser(parser: argparse.ArgumentParser, words: list[str]) -> tuple[argparse.ArgumentParser, str]:
    """The (sub)parser that parses ``words`` and the command's name (``iterative run``...)."""
    name = []
    while True:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs or not words or words[0] not in subs[0].choices:
            return parser, " ".join(name)
        name.append(words[0])
        parser, words = subs[0].choices[words[0]], words[1:]


def test_every_rule_command_parses(rule_commands):
    names = set()
    parser = build_parser()  # parsing changes no parser: one for every command
    for words in rule_commands:
        parser.parse_args(words)  # exits on an unknown option
        names.add(_subparser(parser, words)[1])
    # the dry run reached every kind of stage the rules run
    assert {
        "calibrate",
        "select",
        "compensate",
        "ppl",
        "kl-reference",
        "zeroshot",
        "geometry",
        "export",
        "report",
        "prepare-zeroshot",
        "iterative run",
        "iterative collect",
        "search candidates",
        "search run",
    } <= names, names


def test_options_the_rules_pass_have_one_default(rule_commands):
    """Every option a rule passes: required, a schema default (config_arg), or no default."""
    problems = set()
    root = build_parser()
    for words in rule_commands:
        parser, name = _subparser(root, words)
        by_flag = {f: a for a in parser._actions for f in a.option_strings}
        for w in words:
            if not w.startswith("--"):
                continue
            action = by_flag[w.split("=", 1)[0]]
            key = getattr(action, "config_key", None)
            if action.required or action.default in ABSENT:
                continue
            if key is None:
                problems.add(f"coec {name} {w}: default {action.default!r} is not the config schema's")
            elif action.default != schema_default(key):
                problems.add(f"coec {name} {w}: default {action.default!r} != schema {key}")
    assert not problems, sorted(problems)


def test_config_defaults_are_the_schemas():
    """Every CLI option that names a config key has exactly the schema's default, including the
    one that once disagreed (zeroshot --batch-size: 8 in the CLI, 16 in the schema)."""
    parser = build_parser()
    seen = 0
    stack = [parser]
    while stack:
        p = stack.pop()
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                stack += list(a.choices.values())
            elif getattr(a, "config_key", None):
                assert a.default == schema_default(a.config_key), (a.option_strings, a.config_key)
                seen += 1
    assert seen >= 20
    zs = _subparser(parser, ["zeroshot"])[0].parse_args(["--model", "m", "--tasks", "boolq", "--out", "o"])
    assert zs.batch_size == schema_default("evaluation.zeroshot_batch_size") == 16
