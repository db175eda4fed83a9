"""A plug-in's code is an input of the jobs that use it: editing the file reruns exactly the jobs
of the entries it registered (here a method's compensate jobs) and what reads them, never a
built-in method's cells; adding plug-ins to a config reruns nothing that ran without them; and
the results record the plug-in's sha256."""

from __future__ import annotations

import copy
import hashlib
import json
import os
from pathlib import Path

from coec.io.paths import cell_dir
from conftest import SHARED_PLUGIN, job_counts, run_env, snakemake, write_trimmed_workflow
from registry_state import forget_plugins, restored

PLUGIN = Path(__file__).resolve().parents[1] / "plugins" / "global_scale.py"
SCALED_JOBS = {"compensate": 2, "ppl_cell": 1, "table": 1, "total": 4}  # 2 layers, one block each


def _plan(work: Path, cfg_path: Path, *targets: str):
    return snakemake(work, "-n", *(targets or ["results/table1.csv"]), "--configfile", str(cfg_path), env=run_env())


def test_editing_a_plugin_reruns_exactly_its_cells(shared_run, tmp_path):
    """On the shared run (built-in cells and the plug-in's ``scaled`` cell, tests/conftest.py)."""
    cfg = copy.deepcopy(shared_run.cfg)
    builtin = [r for r in cfg["table1"]["rows"] if r["compensation"] != "scaled"]
    # the built-in cells' jobs carry a plugins param only when a plug-in's code reaches them: the
    # same cells planned without the plug-in in the config (as before it was added) rerun nothing
    del cfg["plugins"], cfg["compensations"]["scaled"]
    cfg["table1"]["rows"] = builtin
    without = shared_run.write_config(tmp_path / "without.yaml", cfg)
    cells = [f"{cell_dir('tiny', 'c8', r['selection'], 0.5, r['compensation'])}/ppl.json" for r in builtin]
    res = _plan(shared_run.work, without, *cells)
    assert "Nothing to be done" in res.stdout + res.stderr
    res = _plan(shared_run.work, shared_run.cfg_path)
    assert "Nothing to be done" in res.stdout + res.stderr

    cell = shared_run.work / "results/tiny/c8/wanda_sp-0.5"
    plugin = shared_run.work / SHARED_PLUGIN
    record = json.loads((cell / "scaled/block0-0.json").read_text())["model"]
    assert record["plugins"] == {SHARED_PLUGIN: hashlib.sha256(plugin.read_bytes()).hexdigest()}
    builtin_block = shared_run.work / "results/tiny/c8/flap-0.5/bias/block0-0.json"  # a built-in method's
    assert "plugins" not in json.loads(builtin_block.read_text())["model"]
    assert "plugins" not in json.loads((cell / "keep.json").read_text())["model"]

    edited = shared_run.copy(tmp_path / "edited")  # the same finished run, its own plug-in file
    plugin = edited.work / SHARED_PLUGIN
    plugin.write_text(plugin.read_text() + "\n# a fix\n")
    plan = _plan(edited.work, edited.cfg_path).stdout
    assert job_counts(plan) == SCALED_JOBS
    outputs = [line.split(":", 1)[1] for line in plan.splitlines() if line.strip().startswith("output:")]
    assert len(outputs) == 4 and all("/scaled/" in o or "table1" in o for o in outputs)
    new_sha = hashlib.sha256(plugin.read_bytes()).hexdigest()
    assert plan.count("reason: Params have changed") == 2 and plan.count(new_sha) == 2


def test_each_job_uses_the_plugins_of_its_entries(tmp_path):
    """The plug-ins a job's params hash: a model family's for every job that reads a model of
    that family (every family plug-in for a hub model, whose family is unknown before it is
    downloaded), a method's for its compensate jobs only; nothing for built-in entries."""
    from types import SimpleNamespace

    from coec.compensate.method import METHODS
    from coec.config.validate import validate_config
    from coec.model.arch import ADAPTERS
    from coec.registry import PLUGINS_ENV
    from coec.workflow.wiring import NO_PLUGINS, Wiring

    family = tmp_path / "toy_family.py"
    family.write_text('from coec.model.arch import ADAPTERS\n\nADAPTERS.register(ADAPTERS["llama"], name="toyfam")\n')
    cfg, _ = write_trimmed_workflow(tmp_path)
    config_json = tmp_path / "tiny-llama" / "config.json"
    config_json.write_text(config_json.read_text().replace('"model_type": "llama"', '"model_type": "toyfam"'))
    cfg["plugins"] = [str(family), str(PLUGIN)]
    cfg["compensations"].update({m: {"method": m} for m in ("none", "bias", "rcpu")})  # config.yaml's
    cfg["compensations"]["scaled"] = {"method": "global_scale"}
    cfg["models"]["hub"] = {"source": "org/some-model", "num_layers": 2, "dtype": "float32"}
    try:
        with restored(ADAPTERS), restored(METHODS):
            W = Wiring(validate_config(cfg))
            cell = dict(model="tiny", calib="c8", select="wanda_sp", ratio="0.5")
            assert W.job_plugins("calibrate", SimpleNamespace(model="tiny", calib="c8")) == {str(family)}
            assert W.job_plugins("compensate", SimpleNamespace(**cell, comp="scaled")) == {str(family), str(PLUGIN)}
            assert W.job_plugins("compensate", SimpleNamespace(**cell, comp="coec")) == {str(family)}
            assert W.job_plugins("ppl", SimpleNamespace(model="hub")) == {str(family)}
            config_json.write_text(config_json.read_text().replace('"toyfam"', '"llama"'))
            assert W.job_plugins("compensate", SimpleNamespace(**cell, comp="coec")) == set()
            assert W.plugin_code(set()) is NO_PLUGINS
            digest = hashlib.sha256(PLUGIN.read_bytes()).hexdigest()
            assert json.loads(W.plugin_code({str(PLUGIN)})) == {str(PLUGIN): digest}
            del cfg["plugins"]
            assert Wiring(cfg).plugin_params("compensate") == {}
    finally:
        forget_plugins()
        os.environ.pop(PLUGINS_ENV, None)
