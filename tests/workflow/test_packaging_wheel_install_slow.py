"""A non-editable install works: build the wheel, install it into a fresh virtual environment
(the dependencies seen from the project's .venv, the source tree not), then validate the
embedded config and dry-run the workflow's default target with the installed package. Slow (a
wheel build and a venv install): set for the whole file (CI's slow steps, or `pytest -m slow`)."""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
# zero-shot tasks ship no YAML of their own: the registry includes lm-eval's (coec.evaluate.tasks)
DATA = ["coec/config/schemas/config.schema.yaml", "coec/evaluate/tasks.py", "coec/data/zeroshot.py"]

CHECK = """
import sys
from pathlib import Path
import coec, coec.config.validate as cfg, coec.evaluate.zeroshot as zs
venv = Path(sys.argv[1]).resolve()
for p in (coec.__file__, cfg.SCHEMA, zs.__file__):
    assert venv in Path(p).resolve().parents, f"not from the wheel: {p}"
assert cfg.SCHEMA.is_file(), f"no schema at {cfg.SCHEMA}"
import coec.evaluate.tasks as zt
assert all(zt.builtin_yaml_path(s).is_file() for s in zt.TASKS.values()), "lm-eval task YAMLs missing"
import yaml
cfg.validate_config(yaml.safe_load(Path(sys.argv[2]).read_text()))
# the dry run runs in this process, so the workflow's `import coec` is the wheel's
from snakemake.cli import main
sys.argv = ["snakemake", "--snakefile", sys.argv[2].replace("config.yaml", "Snakefile"),
            "--directory", sys.argv[3], "-n", "--cores", "1", "results/table1.csv"]
main()
"""


def run(*cmd, cwd=None) -> subprocess.CompletedProcess:
    # no PYTHONPATH: a source tree on it (a checkout's src/) is what the installed wheel must do without
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    res = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, cwd=cwd, timeout=600, env=env)
    assert res.returncode == 0, f"{[str(c)[:60] for c in cmd[:4]]} failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return res


def test_wheel_installs_non_editable(tmp_path):
    # build from a copy of the sources: no build/ or egg-info in the tree, no stale build/lib files
    src = tmp_path / "src-copy"
    shutil.copytree(REPO / "src", src / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    shutil.copy(REPO / "pyproject.toml", src)
    dist = tmp_path / "dist"
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", dist, src)
    (wheel,) = dist.glob("coec-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert set(DATA) <= names, sorted(set(DATA) - names)

    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", "--without-pip", venv)
    py = venv / "bin" / "python"
    run(sys.executable, "-m", "pip", "--python", py, "install", "--no-deps", "-q", wheel)
    # the dependencies: the project's site-packages as a plain path entry, after the venv's own
    # (a path line does not run that directory's .pth files, so the editable source stays unseen)
    own = Path(run(py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip())
    (own / "zz_deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    path = run(py, "-c", "import sys; print('\\n'.join(sys.path))").stdout.splitlines()
    assert str(REPO / "src") not in path

    work = tmp_path / "work"
    work.mkdir()
    res = run(py, "-c", CHECK, venv, REPO / "config.yaml", work, cwd=tmp_path)
    assert "results/table1.csv" in res.stdout + res.stderr
    assert "prepare_model" in res.stdout + res.stderr
