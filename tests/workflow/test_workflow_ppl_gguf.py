"""The llama.cpp perplexity targets (``ppl-gguf-{gguf_type}.json`` beside each GGUF export) resolve
to their rules, and each planned command parses as ``coec ppl --gguf`` of that folder's export."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml

from coec.cli import build_parser
from coec.io import paths
from conftest import full_workflow_config, job_counts, snakemake

REPO = Path(__file__).resolve().parents[2]
TARGETS = {
    "ppl_gguf_cell": "results/tiny/c8/rcpu-0.5/coec",
    "ppl_gguf_dense": "results/tiny/dense",
    "ppl_gguf_iterative": "results/tiny/c8/iterative/alam-0.5",
}


def test_gguf_ppl_file_is_beside_the_export():
    assert paths.gguf_ppl_file("results/m/dense", "q8_0") == "results/m/dense/ppl-gguf-q8_0.json"


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    work = tmp_path_factory.mktemp("pplgguf")
    (work / "config.yaml").write_text(yaml.safe_dump(full_workflow_config(work)))
    targets = [paths.gguf_ppl_file(f, "q8_0") for f in TARGETS.values()]
    res = snakemake(work, "-n", "-p", "--cores", "1", *targets, "--configfile", str(work / "config.yaml"))
    return res.stdout


def test_targets_resolve_to_their_rules(planned):
    jobs = job_counts(planned)
    for rule in TARGETS:
        assert jobs[rule] == 1, rule
    assert jobs["export_gguf"] == 1 and jobs["export_gguf_dense"] == 1 and jobs["export_gguf_iterative"] == 1


def test_commands_are_ppl_gguf_of_the_folders_export(planned):
    ppl = build_parser()._subparsers._group_actions[0].choices["ppl"]
    lines = [ln for ln in planned.splitlines() if ln.startswith("Shell command: ") and " ppl --gguf " in ln]
    assert len(lines) == len(TARGETS)
    outs = set()
    for line in lines:
        words = shlex.split(line.removeprefix("Shell command: ").split(" > ")[0])
        a = ppl.parse_args(words[words.index("ppl") + 1 :])
        folder = str(Path(a.out).parent)
        assert a.gguf == paths.gguf_file(folder, "q8_0") and a.out == paths.gguf_ppl_file(folder, "q8_0")
        assert a.keep is None and not a.comp and a.threads >= 1
        outs.add(folder)
    assert outs == set(TARGETS.values())
