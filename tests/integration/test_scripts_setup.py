"""scripts/setup.sh: which torch build it installs (COEC_TORCH_INDEX), checked in its dry-run
mode (COEC_SETUP_DRY_RUN=1 prints the commands instead of running them)."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SETUP = REPO / "scripts" / "setup.sh"


def _commands(**env) -> list[list[str]]:
    full = {k: v for k, v in os.environ.items() if k not in ("COEC_TORCH_INDEX",)}
    full.update(COEC_SETUP_DRY_RUN="1", **env)
    res = subprocess.run(["bash", str(SETUP)], capture_output=True, text=True, env=full, check=True)
    return [shlex.split(line[2:]) for line in res.stdout.splitlines() if line.startswith("+ ")]


def _torch_pin() -> str:
    lines = (REPO / "envs" / "requirements.txt").read_text().splitlines()
    return next(line for line in lines if line.startswith("torch=="))


def _torch_cmd(cmds: list[list[str]]) -> list[str]:
    found = [c for c in cmds if _torch_pin() in c]
    assert len(found) == 1, cmds
    return found[0]


def test_default_is_plain_pinned_torch():
    """Unset: the same line as always, pip's configured index decides (CPU wheel here)."""
    cmds = _commands()
    assert _torch_cmd(cmds)[-4:] == ["pip", "install", "-q", _torch_pin()]
    assert not any("--index-url" in c for c in cmds)
    assert cmds.index(_torch_cmd(cmds)) < next(i for i, c in enumerate(cmds) if "envs/requirements.txt" in c)


def test_index_selects_the_build():
    for url in ("https://download.pytorch.org/whl/cpu", "https://download.pytorch.org/whl/cu128"):
        cmds = _commands(COEC_TORCH_INDEX=url)
        cmd = _torch_cmd(cmds)
        assert cmd[cmd.index("--index-url") + 1] == url
        # only torch comes from that index
        assert sum("--index-url" in c for c in cmds) == 1


def test_dry_run_changes_nothing(tmp_path):
    """The dry run prints the venv creation too, but runs nothing."""
    copy = tmp_path / "repo"
    (copy / "scripts").mkdir(parents=True)
    (copy / "envs").mkdir()
    (copy / "scripts" / "setup.sh").write_text(SETUP.read_text())
    (copy / "envs" / "requirements.txt").write_text(_torch_pin() + "\n")
    env = dict(os.environ, COEC_SETUP_DRY_RUN="1")
    out = subprocess.run(
        ["bash", str(copy / "scripts" / "setup.sh")], capture_output=True, text=True, env=env, check=True
    ).stdout
    assert "-m venv .venv" in out and not (copy / ".venv").exists()
