"""The dense KL reference (docs/kl.md) is one job per model, planned once, an input of every
perplexity job of the model (the dense model's, the cells', the iterative cells' and the llama.cpp
ones), each of which passes it as ``--kl-reference``; its command scores the windows the ppl jobs
score (dry run of a config that reaches every kind of ppl job)."""

from __future__ import annotations

import shlex

import pytest
import yaml

from coec.cli import build_parser
from coec.config.validate import schema_default
from coec.io import paths
from conftest import full_workflow_config, job_counts, snakemake

REFERENCE = paths.kl_reference_file("tiny")
PPL_RULES = ("ppl_dense", "ppl_cell", "iterative_ppl", "ppl_gguf_cell", "ppl_gguf_dense", "ppl_gguf_iterative")
TARGETS = [
    "results/table1.csv",
    "results/tiny/c8/iterative/alam-0.5/ppl.json",
    *(
        paths.gguf_ppl_file(f, "q8_0")
        for f in ("results/tiny/c8/rcpu-0.5/coec", "results/tiny/dense", "results/tiny/c8/iterative/alam-0.5")
    ),
]


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    work = tmp_path_factory.mktemp("kl")
    (work / "config.yaml").write_text(yaml.safe_dump(full_workflow_config(work)))
    return snakemake(work, "-n", "-p", "--cores", "1", *TARGETS, "--configfile", str(work / "config.yaml")).stdout


def jobs(planned: str) -> list[tuple[str, list[str], list[str]]]:
    """(rule, input files, words of the coec command) of every planned job."""
    out = []
    for block in planned.split("\nrule ")[1:]:
        rule = block.split(":", 1)[0].strip()
        inputs = next(
            (ln.split(":", 1)[1].split(", ") for ln in block.splitlines() if ln.strip().startswith("input:")), []
        )
        shell = next(ln for ln in block.splitlines() if ln.startswith("Shell command: "))
        words = shlex.split(shell.removeprefix("Shell command: ").split(" > ")[0])
        coec = next(i for i, w in enumerate(words) if w.endswith("/coec") or w == "coec")
        out.append((rule, [i.strip() for i in inputs], words[coec + 1 :]))
    return out


def test_one_reference_job(planned):
    counts = job_counts(planned)
    assert counts["kl_reference"] == 1
    assert all(counts.get(rule, 0) >= 1 for rule in PPL_RULES), counts


def test_every_ppl_job_reads_the_one_reference(planned):
    parser = build_parser()
    seen = set()
    for rule, inputs, words in jobs(planned):
        if rule not in PPL_RULES:
            continue
        seen.add(rule)
        assert REFERENCE in inputs, (rule, inputs)
        a = parser.parse_args(words)
        assert a.kl_reference == REFERENCE, (rule, words)
    assert seen == set(PPL_RULES)


def test_the_reference_scores_the_ppl_windows(planned):
    parser = build_parser()
    (ref,) = [parser.parse_args(w) for r, _, w in jobs(planned) if r == "kl_reference"]
    assert ref.out == REFERENCE and ref.top_k == schema_default("kl_top_k") == 64
    assert ref.tail_samples == schema_default("kl_tail_samples") == 64
    (dense,) = [parser.parse_args(w) for r, _, w in jobs(planned) if r == "ppl_dense"]
    for key in ("model", "dataset", "seqlen", "max_windows", "batch_size", "dtype", "device", "expect", "revision"):
        assert getattr(ref, key) == getattr(dense, key), key
