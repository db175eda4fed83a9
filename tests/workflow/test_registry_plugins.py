"""Plug-ins: a compensation method in one file outside the package (tests/plugins/global_scale.py),
named in a config's ``plugins``, reaches the schema, the option checks, the compensate stage and
a Table 1 row of the trimmed workflow, with no other file edited; bad plug-ins are refused in
one line."""

from __future__ import annotations

import copy
import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from coec.compensate import compensate
from coec.compensate.method import METHODS
from coec.config.validate import ConfigError, validate_config
from coec.registry import PLUGINS_ENV, Registry, UnknownName, load_plugins
from conftest import SHARED_PLUGIN, write_trimmed_workflow
from registry_state import forget_plugins, restored

REPO = Path(__file__).resolve().parents[2]
PLUGIN = Path(__file__).resolve().parents[1] / "plugins" / "global_scale.py"


@pytest.fixture
def plugin():
    """global_scale registered for the test only."""
    with restored(METHODS):
        load_plugins([str(PLUGIN)])
        yield METHODS["global_scale"]
    forget_plugins()
    os.environ.pop(PLUGINS_ENV, None)


def _problem(seed=0, d_out=10, d_in=16, k=11, n=80):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d_in, generator=g, dtype=torch.float64) @ torch.randn(
        d_in, d_in, generator=g, dtype=torch.float64
    )
    W0 = torch.randn(d_out, d_in, generator=g, dtype=torch.float64)
    keep = torch.sort(torch.randperm(d_in, generator=g)[:k]).values
    return W0, X.T @ X, X.mean(0), keep, X


def test_registry_names_unknown_entries_and_refuses_a_second_definition():
    reg: Registry = Registry("widget")

    class W:
        def __init__(self, name, v):
            self.name, self.v = name, v

    reg.register(W("alpha", 1))
    with pytest.raises(UnknownName, match=r"unknown widget 'alpah'; did you mean 'alpha'\? \(available: alpha\)"):
        reg["alpah"]
    with pytest.raises(ValueError, match="registered twice"):
        reg.register(W("alpha", 2))
    assert list(reg) == ["alpha"] and "alpha" in reg


def test_plugin_method_is_optimal_in_its_family(plugin):
    """s* minimises the output error over the scale (a scan of s never does better), shrink 1 is
    prune-only bit for bit, and the shared diagnostics report it."""
    W0, G, mean, keep, X = _problem()
    out = compensate(W0, G, mean, keep, "global_scale")
    s = out.info["scale"]
    assert torch.equal(out.weight, s * W0[:, keep])

    def err(scale):
        return float(((X @ W0.T - X[:, keep] @ (scale * W0[:, keep]).T) ** 2).sum())

    assert all(err(s) <= err(s + d) + 1e-9 for d in (-0.1, -0.01, 0.01, 0.1, 1.0 - s))
    assert out.info["relerr_after"] <= out.info["relerr_before"]
    assert out.info["method"] == "global_scale" and out.info["rounds"] == 0
    same = compensate(W0, G, mean, keep, "global_scale", shrink=1.0)
    assert torch.equal(same.weight, W0[:, keep])
    with pytest.raises(ValueError, match="option shrink must be <= 1"):
        compensate(W0, G, mean, keep, "global_scale", shrink=2.0)


def test_config_knows_the_method_only_with_its_plugin(plugin, tmp_path):
    cfg, _ = write_trimmed_workflow(tmp_path)
    cfg["compensations"].update({m: {"method": m} for m in ("none", "bias", "rcpu")})  # config.yaml's
    cfg["compensations"]["gs"] = {"method": "global_scale", "shrink": 0.5}
    with restored(METHODS):  # without the plug-in in this config the name is unknown
        del METHODS._entries["global_scale"]
        with pytest.raises(ConfigError, match=r"compensations\.gs\.method"):
            validate_config(copy.deepcopy(cfg))
    cfg["plugins"] = [str(PLUGIN)]
    validate_config(copy.deepcopy(cfg))
    cfg["compensations"]["gs"]["shrnk"] = 0.5
    with pytest.raises(
        ConfigError,
        match=r"compensations\.gs\.shrnk: unknown option 'shrnk' for method "
        r"'global_scale'; did you mean 'shrink'\?",
    ):
        validate_config(copy.deepcopy(cfg))


@pytest.mark.parametrize(
    "spec, needle",
    [
        ("no_such_file.py", r"plugins\[0\]: plug-in 'no_such_file.py' could not be loaded: FileNotFoundError"),
        ("no_such_module_xyz", r"plugins\[0\]: plug-in 'no_such_module_xyz' could not be loaded: ModuleNotFoundError"),
    ],
)
def test_a_bad_plugin_is_refused_in_one_line(tmp_path, spec, needle):
    cfg, _ = write_trimmed_workflow(tmp_path)
    cfg["compensations"].update({m: {"method": m} for m in ("none", "bias", "rcpu")})  # config.yaml's
    cfg["plugins"] = [spec]
    with pytest.raises(ConfigError, match=needle):
        validate_config(cfg)
    env = {**os.environ, PLUGINS_ENV: spec}
    res = subprocess.run([sys.executable, "-m", "coec", "select", "--help"], capture_output=True, text=True, env=env)
    assert res.returncode == 2 and res.stderr.count("\n") == 1
    assert "COEC_PLUGINS[0]: plug-in" in res.stderr


def test_plugin_method_runs_through_the_trimmed_workflow_to_a_table1_row(shared_run):
    """The plug-in file is the only addition: the shared run's config names it (``plugins``, no
    COEC_PLUGINS in its environment) and a row uses it (tests/conftest.py::shared_config)."""
    work = shared_run.work
    assert shared_run.cfg["plugins"] == [SHARED_PLUGIN] and (work / SHARED_PLUGIN).read_bytes() == PLUGIN.read_bytes()
    rows = {r["compensation"]: float(r["tiny"]) for r in csv.DictReader((work / "results/table1.csv").open())}
    assert {"dense", "–", "scaled"} <= set(rows) and all(v > 1.0 for v in rows.values())
    info = json.loads((work / "results/tiny/c8/wanda_sp-0.5/scaled/block0-0.json").read_text())
    assert info["layer0.o_proj"]["method"] == "global_scale" and "scale" in info["layer0.down_proj"]
    assert info["layer0.down_proj"]["relerr_after"] <= info["layer0.down_proj"]["relerr_before"]


SCORE_PLUGIN = """
from coec.select.scores import SCORES, Score


def columns(weight, stats, spec):
    return weight.abs().sum(0).double()


SCORES.register(Score("{name}", columns, "column L1 norm"))
"""


@pytest.mark.parametrize("spec_of", [lambda f: str(f), lambda f: f.stem], ids=["file", "module"])
def test_a_plugin_reusing_a_builtin_name_is_named_as_the_second_origin(tmp_path, monkeypatch, spec_of):
    """A score plug-in (as a file or a module name) that reuses a built-in name: the message names
    the built-in's module and the plug-in as the config names it."""
    from coec.select.scores import SCORES

    plugin = tmp_path / "my_scores.py"
    plugin.write_text(SCORE_PLUGIN.format(name="wanda_sp"))
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = spec_of(plugin)
    with restored(SCORES), pytest.raises(ValueError) as err:
        load_plugins([spec])
    forget_plugins()
    sys.modules.pop("my_scores", None)
    assert f"selection score 'wanda_sp' is registered twice (coec.select.scores and {spec})" in str(err.value)


def test_a_method_defined_by_two_plugins_names_both_files(tmp_path):
    second = tmp_path / "again.py"
    second.write_text(PLUGIN.read_text())
    with restored(METHODS), pytest.raises(ValueError) as err:
        load_plugins([str(PLUGIN), str(second)])
    forget_plugins()
    assert f"compensation method 'global_scale' is registered twice ({PLUGIN} and {second})" in str(err.value)
    lstsq = tmp_path / "lstsq_again.py"
    lstsq.write_text(PLUGIN.read_text().replace('name="global_scale"', 'name="lstsq"'))
    with restored(METHODS), pytest.raises(ValueError) as err:
        load_plugins([str(lstsq)])
    forget_plugins()
    assert f"'lstsq' is registered twice (coec.compensate.methods.lstsq and {lstsq})" in str(err.value)


def test_registries_know_which_plugin_registered_an_entry(plugin):
    """Built-in entries have no plug-in; the plug-in's entry names its file, and a lookup of it
    is recorded for the result's provenance (sha256 of the file)."""
    import hashlib

    from coec.io.provenance import plugin_record
    from coec.registry import USED_PLUGINS
    from coec.select.scores import SCORES

    assert METHODS.plugin_of("coec") is None and SCORES.plugin_of("wanda_sp") is None
    assert METHODS.plugin_of("global_scale") == str(PLUGIN) and METHODS.plugins() == {str(PLUGIN)}
    USED_PLUGINS.clear()  # the fixture looked the method up
    METHODS["coec"]
    assert plugin_record() == {}
    METHODS["global_scale"]
    assert plugin_record() == {"plugins": {str(PLUGIN): hashlib.sha256(PLUGIN.read_bytes()).hexdigest()}}


def test_the_options_page_includes_the_plugins_of_the_command_line_or_a_config(tmp_path):
    def page(*args):
        env = {k: v for k, v in os.environ.items() if k != PLUGINS_ENV}
        cmd = [sys.executable, "-m", "coec.compensate.options_doc", *args]
        return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path)

    assert "## `global_scale`" not in page().stdout
    cfg = tmp_path / "my.yaml"
    cfg.write_text(yaml.safe_dump({"plugins": [str(PLUGIN)]}))
    for args in (["--plugins", str(PLUGIN)], ["--config", str(cfg)]):
        res = page(*args)
        assert res.returncode == 0, res.stderr
        assert "## `global_scale`" in res.stdout and "| `shrink` | method | 0 |" in res.stdout
    bad = page("--plugins", "missing.py")
    assert bad.returncode == 2 and bad.stdout == "" and bad.stderr.count("\n") == 1
    assert "--plugins[0]: plug-in 'missing.py' could not be loaded: FileNotFoundError" in bad.stderr


def test_a_plugin_module_is_hashed_over_its_source_files(tmp_path, monkeypatch):
    """A module plug-in's sha256 is its file's; a package's covers every .py file under it, so an
    edit to any of them changes it."""
    import hashlib

    from coec.registry import plugin_sha256, plugin_sources

    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "my_single.py").write_text("X = 1\n")
    assert plugin_sha256("my_single") == hashlib.sha256(b"X = 1\n").hexdigest()
    pkg = tmp_path / "my_pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from . import sub\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "scores.py").write_text("Y = 1\n")
    assert [p.relative_to(pkg).as_posix() for p in plugin_sources("my_pkg")] == [
        "__init__.py",
        "sub/__init__.py",
        "sub/scores.py",
    ]
    before = plugin_sha256("my_pkg")
    (pkg / "sub" / "scores.py").write_text("Y = 2\n")
    assert plugin_sha256("my_pkg") != before
    with pytest.raises(ValueError, match="no source file found"):
        plugin_sha256("no_such_module_xyz")
