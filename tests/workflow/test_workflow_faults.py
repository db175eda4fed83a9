"""Fault injection on the tiny-model trimmed workflow: bad inputs are refused in one line naming
the file, and faults (kill -9 of Snakemake or of an inner job, a full disk) lose nothing: a rerun
gives byte-identical results.

The input faults run the CLI stages directly (fast). The workflow faults run the real workflow
several times and are marked slow (`pytest -m slow tests/workflow/test_workflow_faults_slow.py`; CI runs them as a
separate step).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import CORPUS, make_model_dir

REPO = Path(__file__).resolve().parents[2]
COEC = [sys.executable, "-m", "coec"]


# --------------------------------------------------------------------------------------------
# helpers


def coec(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*COEC, *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=600)


def assert_refused(res: subprocess.CompletedProcess, *needles: str) -> str:
    """A refusal: exit 2, no traceback, and one `coec <stage>: error: ...` line naming ``needles``."""
    assert res.returncode == 2, (res.returncode, res.stderr[-3000:])
    assert "Traceback" not in res.stderr, res.stderr[-3000:]
    lines = [ln for ln in res.stderr.splitlines() if ": error: " in ln and ln.startswith("coec ")]
    assert len(lines) == 1, res.stderr[-3000:]
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def truncate(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: max(1, int(len(data) * keep))])


# --------------------------------------------------------------------------------------------
# input faults, stage by stage (fast)


@pytest.fixture(scope="module")
def cell(tmp_path_factory):
    """A tiny Llama, its Grams, a keep set and a compensation block made by the CLI stages."""
    work = tmp_path_factory.mktemp("faults")
    model = make_model_dir(work / "model", "llama")
    (work / "calib.txt").write_text(CORPUS)
    (work / "eval.txt").write_text(CORPUS[1000:4000])
    dataset = json.dumps({"source": "files", "calib": str(work / "calib.txt"), "eval": str(work / "eval.txt")})
    res = coec(
        "calibrate",
        "--model",
        model,
        "--dataset",
        dataset,
        "--nsamples",
        4,
        "--seqlen",
        32,
        "--device",
        "cpu",
        "--out",
        work / "grams",
    )
    assert res.returncode == 0, res.stderr[-3000:]
    res = coec(
        "select",
        "--model",
        model,
        "--grams",
        work / "grams",
        "--method",
        "wanda_sp",
        "--ratio",
        0.5,
        "--out",
        work / "keep.json",
    )
    assert res.returncode == 0, res.stderr[-3000:]
    res = coec(
        "compensate",
        "--model",
        model,
        "--grams",
        work / "grams",
        "--keep",
        work / "keep.json",
        "--spec",
        json.dumps({"method": "lstsq"}),
        "--first",
        0,
        "--last",
        1,
        "--device",
        "cpu",
        "--out",
        work / "block0-1.safetensors",
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return {
        "work": work,
        "model": model,
        "dataset": dataset,
        "grams": work / "grams",
        "keep": work / "keep.json",
        "block": work / "block0-1.safetensors",
    }


def _compensate(cell, grams, keep, out, spec=None):
    return coec(
        "compensate",
        "--model",
        cell["model"],
        "--grams",
        grams,
        "--keep",
        keep,
        "--spec",
        json.dumps(spec or {"method": "lstsq"}),
        "--first",
        0,
        "--last",
        1,
        "--device",
        "cpu",
        "--out",
        out,
    )


def _ppl(cell, out, model=None, comp=()):
    args = [
        "ppl",
        "--model",
        model or cell["model"],
        "--dataset",
        cell["dataset"],
        "--seqlen",
        32,
        "--max-windows",
        2,
        "--device",
        "cpu",
        "--out",
        out,
    ]
    if comp:
        args += ["--keep", cell["keep"], "--comp", *comp]
    return coec(*args)


def _copy_grams(cell, tmp_path) -> Path:
    dst = tmp_path / "grams"
    shutil.copytree(cell["grams"], dst)
    return dst


def _gram_tensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(path)


def _rewrite_gram(path: Path, fn) -> None:
    """Rewrite a Gram file with ``fn`` applied to its tensors, through the artifact writer so
    only the content is bad (metadata and format version kept)."""
    from safetensors import safe_open

    from coec.io import artifacts

    with safe_open(str(path), "pt") as f:
        meta = dict(f.metadata() or {})
    tensors = fn(_gram_tensors(path))
    artifacts.write_tensors(path, tensors, metadata=meta)


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_damaged_gram_is_refused_naming_the_file(cell, tmp_path, damage):
    grams = _copy_grams(cell, tmp_path)
    target = grams / "layer1.safetensors"
    if damage == "truncated":
        truncate(target)
    elif damage == "garbage":
        target.write_bytes(os.urandom(4096))
    else:
        target.write_bytes(b"")
    out = tmp_path / "block.safetensors"
    assert_refused(_compensate(cell, grams, cell["keep"], out), "compensate", str(target))
    assert not out.exists() and not list(tmp_path.glob(".*tmp*"))


def test_non_finite_gram_is_refused(cell, tmp_path):
    grams = _copy_grams(cell, tmp_path)
    target = grams / "layer0.safetensors"

    def poison(t):
        key = next(k for k in sorted(t) if t[k].dim() == 2)
        t[key] = t[key].clone()
        t[key][0, 0] = float("nan")
        return t

    _rewrite_gram(target, poison)
    out = tmp_path / "block.safetensors"
    line = assert_refused(_compensate(cell, grams, cell["keep"], out), str(target))
    assert "finite" in line or "NaN" in line
    assert not out.exists()


def test_gram_of_the_wrong_shape_is_refused(cell, tmp_path):
    grams = _copy_grams(cell, tmp_path)
    target = grams / "layer0.safetensors"

    def shrink(t):
        return {
            k: (v[:-1, :-1].contiguous() if v.dim() == 2 else v[:-1].contiguous() if v.dim() == 1 else v)
            for k, v in t.items()
        }

    _rewrite_gram(target, shrink)
    out = tmp_path / "block.safetensors"
    line = assert_refused(_compensate(cell, grams, cell["keep"], out), str(target))
    assert "shape" in line
    assert not out.exists()


def test_indefinite_gram_is_repaired_and_recorded(cell, tmp_path):
    """G - 0.5 lambda_max I on one layer: compensation runs (App. B: the Gram is projected onto
    the PSD cone), the info records what was done, the error is finite, no logging error."""
    grams = _copy_grams(cell, tmp_path)
    target = grams / "layer1.safetensors"

    def indefinite(t):
        for k in sorted(t):
            if t[k].dim() == 2 and t[k].shape[0] == t[k].shape[1]:
                g = t[k].double()
                lam = torch.linalg.eigvalsh(g).max()
                t[k] = (g - 0.5 * lam * torch.eye(g.shape[0], dtype=g.dtype)).to(t[k].dtype)
        return t

    _rewrite_gram(target, indefinite)
    for method in ("lstsq", "rcpu", "coec"):
        out = tmp_path / f"{method}.safetensors"
        spec = {"method": method} if method != "coec" else {"method": "coec", "max_rounds": 2}
        res = _compensate(cell, grams, cell["keep"], out, spec)
        assert res.returncode == 0, res.stderr[-3000:]
        assert "Logging error" not in res.stderr
        info = json.loads(out.with_suffix(".json").read_text())
        layer1 = [v for k, v in info.items() if k.startswith("layer1.")]
        assert layer1
        for v in layer1:
            text = json.dumps(v)
            assert "null" not in json.dumps(v.get("relerr_after")), (method, v)
            assert "psd" in text or "indefinite" in text or "clipped" in text, (method, v)


def test_mismatched_keep_set_is_refused(cell, tmp_path):
    keep = json.loads(cell["keep"].read_text())
    keep["layers"] = keep["layers"][:1]
    bad = tmp_path / "keep.json"
    bad.write_text(json.dumps(keep))
    out = tmp_path / "block.safetensors"
    assert_refused(_compensate(cell, cell["grams"], bad, out), str(bad))
    assert not out.exists()


def test_bad_json_keep_set_is_refused(cell, tmp_path):
    bad = tmp_path / "keep.json"
    bad.write_text(cell["keep"].read_text()[:40])
    out = tmp_path / "block.safetensors"
    assert_refused(_compensate(cell, cell["grams"], bad, out), str(bad))


def test_truncated_compensation_block_is_refused(cell, tmp_path):
    block = tmp_path / "block0-1.safetensors"
    shutil.copy(cell["block"], block)
    truncate(block)
    out = tmp_path / "ppl.json"
    assert_refused(_ppl(cell, out, comp=[block]), str(block))
    assert not out.exists()


def test_truncated_weight_shard_is_refused(cell, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(cell["model"], model)
    shard = next(model.glob("*.safetensors"))
    truncate(shard, 0.9)
    out = tmp_path / "ppl.json"
    assert_refused(_ppl(cell, out, model=model), shard.name)
    assert not out.exists()


def test_model_folder_without_config_is_refused(cell, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(cell["model"], model)
    (model / "config.json").unlink()
    out = tmp_path / "ppl.json"
    assert_refused(_ppl(cell, out, model=model), "config.json")
    assert not out.exists()


def test_full_disk_keeps_the_previous_file(tmp_path, monkeypatch):
    """ENOSPC in the middle of a write (injected into os.write) leaves the previous artifact
    intact and no temp file; on a real full tmpfs too where root can mount one."""
    import errno

    from coec.io import artifacts

    def check(folder: Path) -> None:
        target = folder / "layer0.safetensors"
        artifacts.write_tensors(target, {"a": torch.ones(3)})
        before = target.read_bytes()
        with pytest.raises(OSError) as err:
            artifacts.write_tensors(target, {"a": torch.zeros(2**20)})  # 4 MiB
        assert err.value.errno == errno.ENOSPC
        assert target.read_bytes() == before
        assert sorted(p.name for p in folder.iterdir()) == ["layer0.safetensors"]

    real_write = os.write
    calls = []

    def write_then_fail(fd, data):
        calls.append(len(data))
        if len(calls) > 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data[:16])

    (tmp_path / "injected").mkdir()
    with monkeypatch.context() as m:
        m.setattr(os, "write", write_then_fail)
        target = tmp_path / "injected" / "layer0.safetensors"
        m.setattr(os, "write", real_write)
        artifacts.write_tensors(target, {"a": torch.ones(3)})
        before = target.read_bytes()
        m.setattr(os, "write", write_then_fail)
        with pytest.raises(OSError):
            artifacts.write_tensors(target, {"a": torch.zeros(1000)})
    assert target.read_bytes() == before
    assert sorted(p.name for p in target.parent.iterdir()) == ["layer0.safetensors"]
    small = tmp_path / "tmpfs"
    if _mount_tmpfs(small, "1m"):
        try:
            check(small)
        finally:
            subprocess.run(["umount", str(small)], capture_output=True)
    else:
        print("no tmpfs here (needs root and mount): only the injected ENOSPC was tested")


# --------------------------------------------------------------------------------------------
# workflow faults (slow): kill -9, full disk, then a rerun with byte-identical results


def fresh_copy(reference: Path, dst: Path) -> Path:
    """The reference's inputs (model, text, config) without its results."""
    dst.mkdir(parents=True)
    for name in ("tiny-llama", "calib.txt", "eval.txt", "trim.yaml"):
        src = reference / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, dst / name)
    cfg = (dst / "trim.yaml").read_text().replace(str(reference), str(dst))
    (dst / "trim.yaml").write_text(cfg)
    return dst / "trim.yaml"


def _mount_tmpfs(path: Path, size: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True, text=True
    )
    return res.returncode == 0
