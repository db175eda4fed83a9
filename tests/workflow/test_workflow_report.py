"""The Snakemake HTML report (`snakemake --report`): every table and figure marked with report(),
captions rendered from workflow/report/*.rst, in the categories Tables, Figures, Geometry and
Iterative. A fast check renders every caption against the shipped configs; a slow one builds the
report of a real tiny-model run."""

from __future__ import annotations

import copy
import json
import re
import types
from pathlib import Path

import pytest
import yaml

from conftest import REPO, run_env, snakemake, workflow_rules

CAPTIONS = REPO / "workflow/report"
RULES = REPO / "workflow/rules"


def merged(base: dict, over: dict) -> dict:
    """Snakemake's --configfile merge: nested dicts merged key by key, anything else replaced."""
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def render_caption(name: str, rule: str, config: dict, csv: Path, wildcards: dict | None = None) -> str:
    """A caption as `snakemake --report` renders it (Jinja2, then reStructuredText to HTML),
    failing on any reStructuredText warning."""
    from docutils.core import publish_parts
    from jinja2 import Environment

    output = types.SimpleNamespace(csv=str(csv), md=str(csv.with_suffix(".md")))
    sm = types.SimpleNamespace(
        config=config, rule=rule, output=output, wildcards=types.SimpleNamespace(**(wildcards or {}))
    )
    rst = (
        Environment(trim_blocks=True, lstrip_blocks=True)
        .from_string((CAPTIONS / name).read_text())
        .render(snakemake=sm)
    )
    return publish_parts(rst, writer="html", settings_overrides={"halt_level": 2, "report_level": 2})["body"]


CONFIGS = {"default": [], "paper": ["workflow/configs/paper.yaml"]}


@pytest.mark.parametrize("which", CONFIGS)
def test_every_caption_renders_for_the_shipped_configs(which, tmp_path):
    cfg = yaml.safe_load((REPO / "config.yaml").read_text())
    for f in CONFIGS[which]:
        cfg = merged(cfg, yaml.safe_load((REPO / f).read_text()))
    csv = tmp_path / "t.csv"
    csv.write_text("ratio,selection,compensation,m\n0,dense,dense,12.3456\n0.3,Wanda-sp,–,20.5\n")
    tables = ["table1", "table2"] + [t for t in ("table3",) if t in cfg] + list(cfg.get("extra_tables", {}))
    for t in tables:
        body = render_caption("table.rst", "table", cfg, csv, {"table": t})
        assert "<table" in body and "Wanda-sp" in body and "Calibration" in body, t
        assert ("Perplexity" in body) != ("accuracy" in body), t
    for rule in ("table_iterative", "table_iterative_zeroshot"):
        body = render_caption("table.rst", rule, cfg, csv)
        assert "<table" in body and "Iterative variants" in body
    checks = {
        "table4.rst": "table4",
        "appc.rst": "appC",
        "appc_angles.rst": "appC",
        "fig2.rst": "fig2",
        "iterative_size.rst": "iterative",
    }
    for name, key in checks.items():
        if key in cfg:
            assert "{{" not in render_caption(name, name, cfg, csv)


def test_start_page_lists_and_links_every_result():
    """workflow/report/workflow.rst with two categories, as Snakemake renders it (its link
    targets for the categories and files appended)."""
    from docutils.core import publish_parts
    from jinja2 import Environment
    from snakemake.report import Category as cat

    def rec(path, title):
        return types.SimpleNamespace(
            path=Path(path), target=Path(path).name, name=Path(path).name, labels={"artifact": title}
        )

    t1, t4 = rec("results/table1.csv", "Table 1: x"), rec("results/table4.csv", "Table 4: y")
    fig = rec("results/figures/f.png", "Fig. 2: z")
    categories = {
        cat("Tables"): {cat("Perplexity"): [t1], cat("Deployment cost"): [t4]},
        cat("Figures"): {cat("Other"): [fig]},
    }
    links = "".join(f"\n.. _{c.name}: javascript:c()" for c in categories)
    links += "".join(f"\n.. _{r.target}: javascript:r()" for r in (t1, t4, fig))
    links += "\n.. _Workflow: javascript:w()\n.. _Statistics: javascript:s()\n"
    rst = (
        Environment(trim_blocks=True, lstrip_blocks=True)
        .from_string((CAPTIONS / "workflow.rst").read_text() + links)
        .render(snakemake=types.SimpleNamespace(config={}), categories=categories, files=[t1, t4, fig])
    )
    body = publish_parts(rst, writer="html", settings_overrides={"halt_level": 2})["body"]
    # categories in name order, results in title order (Table 1 before Table 4), each a link
    assert body.index(">Figures<") < body.index(">Tables<")
    assert body.index(">Table 1: x<") < body.index(">Table 4: y<")
    assert body.count('href="javascript:r()"') == 3


def test_every_configured_artifact_is_marked_for_the_report(tmp_path):
    """Each path report_items() lists (the paper order of tables and figures) for the paper config
    and the iterative extension is a report() output of the workflow as Snakemake parses it, with
    a caption file and one of the four categories."""
    from snakemake.io import regex_from_filepattern

    from coec.config.validate import validate_config
    from coec.workflow import targets

    configs = [REPO / "config.yaml", REPO / "workflow/configs/paper.yaml"]
    marked = [rep for r in workflow_rules(tmp_path, *configs) for rep in r["reports"]]
    assert {rep["category"] for rep in marked} == {"Tables", "Figures", "Geometry", "Iterative"}
    for rep in marked:
        assert Path(rep["caption"]).is_file() and Path(rep["caption"]).parent.resolve() == CAPTIONS, rep
    cfg = validate_config(merged(*(yaml.safe_load(c.read_text()) for c in configs)))
    listed = [path for path, _, _ in targets.report_items(cfg)]
    assert {"results/table1.csv", "results/table2.csv", "results/appC.csv"} <= set(listed)
    patterns = [re.compile(regex_from_filepattern(rep["path"])) for rep in marked]
    unmarked = [p for p in listed if not any(rx.match(p) for rx in patterns)]
    assert not unmarked, f"report items that no report() output produces: {unmarked}"


# ----------------------------------------------------------------------------- a real report
@pytest.fixture(scope="module")
def report_html(shared_run, tmp_path_factory):
    """The shared trimmed run (copied) plus one artifact of every other category, then the HTML report."""
    run = shared_run.copy(tmp_path_factory.mktemp("report") / "work")
    work, cfg = run.work, run.cfg
    extra = {
        "appC": {"model": "tiny", "calibration": "c8", "selection": "wanda_sp", "ratio": 0.5, "compensation": "coec"},
        "table4": {"ratio": 0.5, "published": ["Qwen2.5-7B"], "models": ["tiny"]},
        "fig2": {
            "model": "tiny",
            "calibration": "c8",
            "nsamples": [4, 8],
            "ratios": [0.5],
            "selection": "flap",
            "compensations": ["none", "bias"],
        },
        "iterative": {
            "table": {
                "calibration": "c8",
                "models": ["tiny"],
                "ratios": [0.5],
                "rows": [
                    {"label": "FLAP", "selection": "flap", "compensation": "bias"},
                    {"label": "one-step FLAP", "variant": "flap"},
                ],
            }
        },
    }
    cfg_path = work / "report.yaml"
    cfg_path.write_text(yaml.safe_dump(dict(cfg, **extra)))
    targets = [
        "results/table1.csv",
        "results/table4.csv",
        "results/appC.csv",
        "results/figures/fig2_calibration_size.png",
        "results/table_iterative.csv",
    ]
    snakemake(work, *targets, "--cores", "2", "--configfile", str(cfg_path), env=run_env())
    out = work / "results/report.html"
    snakemake(work, "--report", str(out), *targets, "--configfile", str(cfg_path), env=run_env())
    return out.read_text()


def _results(page: str) -> dict:
    """The report's results index (a JSON object in the page's JavaScript)."""
    m = re.search(r"var results = (\{.*?\});\n", page)
    assert m, "no results object in the report"
    return json.loads(m.group(1))
