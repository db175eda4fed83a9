"""Slow fault injection on the trimmed workflow, the faults that hit a job: kill -9 of an inner
compensation job, and results/ on a disk that fills up mid-run; each followed by a rerun that must give
the uninterrupted run's bytes (the session's ``trimmed_reference``). kill -9 of Snakemake itself is in
test_workflow_faults_slow.py. Set slow for the whole file (CI's slow steps, or `pytest -m slow`)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time

import pytest

from conftest import file_digests, run_trimmed_workflow, trimmed_workflow_cmd
from test_workflow_faults import _mount_tmpfs, fresh_copy

pytestmark = pytest.mark.slow


def test_kill9_of_an_inner_job_then_rerun_is_byte_identical(trimmed_reference, tmp_path):
    ref, _, digests = trimmed_reference
    cfg_path = fresh_copy(ref, tmp_path / "w")
    work = cfg_path.parent
    proc = subprocess.Popen(
        trimmed_workflow_cmd(work, cfg_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    killed = None
    deadline = time.time() + 900
    while proc.poll() is None and time.time() < deadline and killed is None:
        ps = subprocess.run(["pgrep", "-f", f"coec compensate .*{work}"], capture_output=True, text=True)
        pids = [int(p) for p in ps.stdout.split()]
        if pids:
            time.sleep(0.5)  # let it get going
            try:
                os.kill(pids[0], signal.SIGKILL)
                killed = pids[0]
            except ProcessLookupError:
                pass
        time.sleep(0.2)
    out, _ = proc.communicate(timeout=900)
    assert killed is not None, "no compensation job was seen"
    assert proc.returncode != 0, out[-3000:]
    run_trimmed_workflow(work, cfg_path)
    assert file_digests(work) == digests


def test_full_disk_mid_run_then_rerun_is_byte_identical(trimmed_reference, tmp_path):
    """results/ on a tmpfs too small for the run: the run fails, every file left in results/
    is complete (each loads), and after more space the rerun gives the reference's bytes."""
    from coec.io import artifacts

    ref, _, digests = trimmed_reference
    cfg_path = fresh_copy(ref, tmp_path / "w")
    work = cfg_path.parent
    used = sum(p.stat().st_size for p in (ref / "results").rglob("*") if p.is_file())
    if not _mount_tmpfs(work / "results", f"{max(used // 3, 64 * 1024)}"):
        pytest.skip(
            "cannot mount a tmpfs here (needs root and mount): the ENOSPC unit test "
            "test_full_disk_keeps_the_previous_file covers the writer"
        )
    try:
        res = subprocess.run(trimmed_workflow_cmd(work, cfg_path), capture_output=True, text=True, timeout=1800)
        assert res.returncode != 0, "the run should not fit"
        for p in (work / "results").rglob("*"):
            rel = p.relative_to(work / "results").as_posix()
            if not p.is_file() or rel.startswith(("logs/", "benchmarks/")):
                continue
            if p.name == ".snakemake_timestamp":  # Snakemake's own marker in directory() outputs
                continue
            assert not p.name.startswith("."), f"temp file left behind: {rel}"
            if p.suffix == ".safetensors":
                artifacts.read_tensors(p)
            elif p.suffix == ".json":
                json.loads(p.read_text())
        kept = {p.relative_to(work).as_posix(): p.read_bytes() for p in (work / "results").rglob("*") if p.is_file()}
        shutil.copytree(work / "results", tmp_path / "saved")
    finally:
        subprocess.run(["umount", str(work / "results")], capture_output=True)
    shutil.rmtree(work / "results", ignore_errors=True)
    shutil.copytree(tmp_path / "saved", work / "results")
    subprocess.run(trimmed_workflow_cmd(work, cfg_path, "--unlock"), capture_output=True, timeout=300)
    run_trimmed_workflow(work, cfg_path)
    assert file_digests(work) == digests
    for rel, data in kept.items():  # what was complete before was kept, not redone differently
        if not rel.startswith(("results/logs/", "results/benchmarks/")):
            assert (work / rel).read_bytes() == data, rel
