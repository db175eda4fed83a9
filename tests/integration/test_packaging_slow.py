"""The slow tests of test_packaging.py (a real embedded model, a Snakemake run of the whole chain or
several reruns): set slow for the whole file (CI's slow steps, or `pytest -m slow`)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from test_packaging import dry_run  # noqa: F401  (helpers and fixtures)

pytestmark = pytest.mark.slow


@pytest.mark.skipif(
    not (shutil.which("conda") or shutil.which("mamba")),
    reason="no conda on PATH: the environment cannot be created here",
)
def test_sdm_conda_creates_the_env(tmp_path):
    """Really create envs/coec.yaml (network, minutes) and run its `coec`."""
    out = dry_run(tmp_path, "--sdm", "conda", "--conda-create-envs-only", "--cores", "1")
    envs = list((tmp_path / ".snakemake" / "conda").glob("*/bin/coec"))
    assert envs, out[-2000:]
    subprocess.run([str(envs[0]), "--help"], check=True, capture_output=True)
