"""The slow tests of test_workflow_faults.py: kill -9 of Snakemake at three points of the trimmed
workflow, each followed by a rerun that must give the uninterrupted run's bytes (the session's
``trimmed_reference``). The faults that hit a job (kill -9 of an inner job, a full disk) are in
test_workflow_faults_job_slow.py. Set slow for the whole file (CI's slow steps, or `pytest -m slow`)."""

from __future__ import annotations

import os
import random
import signal
import subprocess

import pytest

from conftest import file_digests, run_trimmed_workflow, trimmed_workflow_cmd
from test_workflow_faults import fresh_copy

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_kill9_of_snakemake_then_rerun_is_byte_identical(trimmed_reference, tmp_path, seed):
    ref, seconds, digests = trimmed_reference
    cfg_path = fresh_copy(ref, tmp_path / "w")
    work = cfg_path.parent
    delay = random.Random(seed).uniform(0.1, 0.9) * seconds
    cmd = trimmed_workflow_cmd(work, cfg_path)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        proc.wait(timeout=delay)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # Snakemake and every job it started
        proc.wait()
    # Snakemake's lock of a killed run stays: --unlock first, as a user would
    subprocess.run(trimmed_workflow_cmd(work, cfg_path, "--unlock"), capture_output=True, timeout=300)
    run_trimmed_workflow(work, cfg_path)
    assert file_digests(work) == digests
