"""Packaging floors in pyproject.toml match what the code and the pinned stack need."""

from __future__ import annotations

import importlib.metadata as md
import re
import tomllib
from pathlib import Path

import pytest
import torch
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PINS = ROOT / "envs" / "requirements.txt"

# facts the floors rest on
TORCH_MM_OUT_DTYPE = Version("2.8")  # first release with torch.mm(a, b, out_dtype=) (aten::mm.dtype)
SETUPTOOLS_SPDX_LICENSE = Version("77")  # first setuptools that accepts `license = "<SPDX expr>"`


def floor(spec: str) -> Version:
    """The lower bound of a specifier set (its `>=` clause)."""
    lows = [Version(s.version) for s in SpecifierSet(spec) if s.operator in (">=", "==", "~=")]
    assert lows, f"no lower bound in {spec!r}"
    return max(lows)


def requirement(reqs: list[str], name: str) -> Requirement:
    found = [Requirement(r) for r in reqs if Requirement(r).name.lower() == name]
    assert found, f"{name} not among {reqs}"
    return found[0]


def pinned() -> dict[str, Version]:
    """name -> pinned version from envs/requirements.txt."""
    out = {}
    for line in PINS.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line and not line.startswith("-"):
            r = Requirement(line)
            out[r.name.lower()] = Version(next(iter(r.specifier)).version)
    return out


def test_python_floor_admitted_and_needed_by_pinned_stack():
    py_floor = floor(PYPROJECT["project"]["requires-python"])
    assert py_floor >= Version("3.11")
    minors = [Version(f"3.{m}") for m in range(8, 15)]
    needed = Version("3.8")
    checked = 0
    for name in pinned():
        try:
            spec = md.metadata(name)["Requires-Python"]
        except md.PackageNotFoundError:
            continue
        if not spec:
            continue
        checked += 1
        spec = SpecifierSet(spec)
        assert spec.contains(str(py_floor)), f"{name} requires Python {spec}, floor is {py_floor}"
        needed = max(needed, min(v for v in minors if spec.contains(str(v))))
    assert checked >= 5
    assert py_floor >= needed, f"the pinned stack needs Python >= {needed}"


def test_setuptools_floor_supports_spdx_license():
    license_field = PYPROJECT["project"].get("license")
    st = requirement(PYPROJECT["build-system"]["requires"], "setuptools")
    if isinstance(license_field, str):  # PEP 639 SPDX expression
        assert floor(str(st.specifier)) >= SETUPTOOLS_SPDX_LICENSE


def test_torch_floor_has_mm_out_dtype():
    src = "\n".join(p.read_text() for p in sorted((ROOT / "src" / "coec" / "calibrate").rglob("*.py")))
    assert re.search(r"torch\.mm\([^)]*out_dtype=", src), "calibration (coec.calibrate) no longer uses out_dtype"
    torch_req = requirement(PYPROJECT["project"]["dependencies"], "torch")
    assert floor(str(torch_req.specifier)) >= TORCH_MM_OUT_DTYPE
    # the installed torch has the overload (the meta backend runs it without a GPU)
    a = torch.ones(4, 3, dtype=torch.bfloat16, device="meta")
    assert torch.mm(a.mT, a, out_dtype=torch.float32).dtype == torch.float32
    with pytest.raises(TypeError):
        torch.mm(a.mT, a, no_such_option=torch.float32)


def test_pins_satisfy_pyproject_ranges():
    pins = pinned()
    deps = PYPROJECT["project"]["dependencies"] + PYPROJECT["project"]["optional-dependencies"]["workflow"]
    for dep in deps:
        r = Requirement(dep)
        if r.name.lower() in pins:
            assert r.specifier.contains(pins[r.name.lower()], prereleases=True), (
                f"envs/requirements.txt pins {r.name}=={pins[r.name.lower()]} outside {r.specifier}"
            )


# --- environments: every rule deploys envs/coec.yaml and runs the environment's own `coec` ---

import os  # noqa: E402
import sys  # noqa: E402

import yaml  # noqa: E402

from conftest import snakemake  # noqa: E402

ENV_FILE = ROOT / "envs" / "coec.yaml"

FAKE_CONDA = """#!/bin/sh
case "$*" in
  "info --json") echo '{"conda_prefix": "%s", "platform": "linux-64"}';;
  "--version") echo "conda 25.1.1";;
  "config --get channel_priority --json") echo '{"get": {"channel_priority": "strict"}}';;
  *) echo "fake conda cannot: $*" >&2; exit 1;;
esac
"""


def test_every_rule_has_the_conda_env(tmp_path):
    """Every rule that runs a command deploys envs/coec.yaml, as Snakemake resolves it (a
    ``use rule ... with:`` inherits its parent's env)."""
    from conftest import workflow_rules

    rules = workflow_rules(tmp_path)
    jobs = [r for r in rules if r["shell"]]
    assert len(jobs) >= 26
    missing = [r["name"] for r in jobs if r["conda"] != "../../envs/coec.yaml"]
    assert not missing, f"rules without conda: envs/coec.yaml: {missing}"
    assert (ROOT / "workflow" / "rules" / "../../envs/coec.yaml").resolve() == ENV_FILE


def test_conda_env_pins_the_requirements_and_installs_coec():
    env = yaml.safe_load(ENV_FILE.read_text())
    deps = env["dependencies"]
    py = next(d for d in deps if isinstance(d, str) and d.startswith("python="))
    assert Version(py.split("=")[1]) >= floor(PYPROJECT["project"]["requires-python"])
    pip = next(d["pip"] for d in deps if isinstance(d, dict))
    env_pins = {Requirement(p).name.lower(): Version(next(iter(Requirement(p).specifier)).version) for p in pip}
    runtime = {Requirement(d).name.lower() for d in PYPROJECT["project"]["dependencies"]}
    want = {n: v for n, v in pinned().items() if n in runtime}  # jobs need coec's dependencies
    assert set(want) == runtime
    assert env_pins == want
    post = ENV_FILE.with_name("coec.post-deploy.sh").read_text()  # Snakemake's post-deploy hook
    assert re.search(r'pip install --no-deps .*-e "\$src"', post)
    st = next(d for d in deps if isinstance(d, str) and d.startswith("setuptools"))
    assert floor(st.split("setuptools")[1]) >= SETUPTOOLS_SPDX_LICENSE  # builds coec's metadata


def dry_run(workdir: Path, *args: str, path: str | None = None) -> str:
    env = dict(os.environ, PATH=path or os.environ["PATH"])
    res = snakemake(workdir, "-n", "-p", "results/table1.csv", *args, env=env)
    return res.stdout + res.stderr


def shell_commands(out: str) -> list[str]:
    cmds = [line.split("Shell command: ", 1)[1] for line in out.splitlines() if "Shell command: " in line]
    assert cmds
    return cmds


def test_sdm_conda_dry_run_lists_the_env_and_runs_its_coec(tmp_path):
    """With a stand-in `conda` (dry runs only ask it for info and version) the plan lists the
    environment, and every job runs the bare `coec` that the activated environment provides."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "conda").write_text(FAKE_CONDA % tmp_path)
    (bin_dir / "conda").chmod(0o755)
    out = dry_run(tmp_path / "work", "--sdm", "conda", path=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    assert re.search(r"Conda environment \S*envs/coec\.yaml will be created", out)
    for cmd in shell_commands(out):
        assert re.match(r"(OMP_NUM_THREADS=\d+ )?\(?coec ", cmd), cmd


def test_plain_dry_run_runs_the_coec_next_to_snakemakes_interpreter(tmp_path):
    """Without --sdm conda, jobs run the entry point of the environment Snakemake runs in, by
    absolute path, so an unactivated `.venv/bin/snakemake` finds it (PATH without the venv)."""
    coec = Path(sys.executable).parent / "coec"
    if not os.access(coec, os.X_OK):
        pytest.skip(f"no coec entry point next to {sys.executable}")
    out = dry_run(tmp_path, path="/usr/bin:/bin")
    for cmd in shell_commands(out):
        assert re.match(rf"(OMP_NUM_THREADS=\d+ )?\(?{re.escape(str(coec))} ", cmd), cmd


def test_lint_finds_no_missing_conda_directive(tmp_path):
    res = snakemake(tmp_path, "--lint", check=False)
    out = res.stdout + res.stderr
    assert "Lints for" in out or res.returncode == 0, out[-2000:]  # the linter ran
    assert "conda" not in out.lower(), [line for line in out.splitlines() if "conda" in line.lower()]
