"""The artifact module (coec.io.artifacts): atomic, umask-following, byte-deterministic writers and
readers that name the file and the problem; results byte-identical across runs."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from coec.calibrate.options import CalibrateOptions, CalibrationWindows
from coec.compensate.stage import CompensateOptions
from coec.evaluate.options import PplOptions
from coec.io import artifacts, atomic
from coec.model.source import CellSource
from coec.select.options import SelectOptions
from conftest import make_model_dir

REPO = Path(__file__).resolve().parents[2]


def gram_file(path: Path, d: int = 6, **over) -> Path:
    g = torch.randn(d, d, dtype=torch.float64)
    t = {
        "o_proj.gram": (g @ g.T).float(),
        "o_proj.sum": torch.randn(d, dtype=torch.float64),
        "o_proj.sumsq": torch.rand(d, dtype=torch.float64),
        "o_proj.count": torch.tensor([40]),
    }
    t.update(over)
    artifacts.write_tensors(path, t, "gram")
    return path


def raises(match: str, fn, *args, **kwargs) -> str:
    with pytest.raises(artifacts.ArtifactError) as info:
        fn(*args, **kwargs)
    msg = str(info.value)
    assert "\n" not in msg and match in msg, msg
    return msg


# ----------------------------------------------------------------------------- round trips
def test_tensor_round_trip_every_dtype(tmp_path):
    from safetensors import safe_open
    from safetensors.torch import load_file

    t = {
        "w": torch.randn(3, 5),
        "d": torch.randn(4, dtype=torch.float64),
        "h": torch.randn(3, dtype=torch.bfloat16),
        "f": torch.randn(2, 2, dtype=torch.float16),
        "n": torch.tensor([7], dtype=torch.int64),
        "i": torch.arange(3, dtype=torch.int32),
        "b": torch.tensor([True, False]),
        "e": torch.zeros(0),
        "s": torch.tensor(2.5),
        "nc": torch.randn(4, 3).T,
    }  # non-contiguous
    p = tmp_path / "x.safetensors"
    artifacts.write_tensors(p, t, "comp-block", {"spec": {"b": 1, "a": [1, 2]}, "method": "coec"})
    for got in (artifacts.read_tensors(p, fmt="comp-block"), load_file(p)):  # ours and the library's
        assert sorted(got) == sorted(t)
        for k in t:
            assert got[k].dtype == t[k].dtype and torch.equal(got[k], t[k]), k
    with safe_open(str(p), "pt") as f:
        meta = f.metadata()
    assert meta == {
        "coec_format": "comp-block",
        "coec_format_version": "1",
        "method": "coec",
        "spec": '{"a": [1, 2], "b": 1}',
    }


def test_safetensors_bytes_do_not_depend_on_insertion_order_or_process(tmp_path):
    t = {f"layer{i}.o_proj.weight": torch.full((2, 3), float(i)) for i in range(5)}
    meta = {k: str(i) for i, k in enumerate("zyxwvutsrq")}
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    artifacts.write_tensors(a, t, "comp-block", meta)
    artifacts.write_tensors(b, dict(reversed(list(t.items()))), "comp-block", dict(reversed(list(meta.items()))))
    assert a.read_bytes() == b.read_bytes()
    code = (
        "import sys, torch; from coec.io import artifacts\n"
        "t = {f'layer{i}.o_proj.weight': torch.full((2, 3), float(i)) for i in range(5)}\n"
        "artifacts.write_tensors(sys.argv[1], t, 'comp-block', {k: str(i) for i, k in enumerate('zyxwvutsrq')})"
    )
    for seed in ("1", "2"):
        c = tmp_path / f"c{seed}.safetensors"
        subprocess.run([sys.executable, "-c", code, str(c)], check=True, env=dict(os.environ, PYTHONHASHSEED=seed))
        assert c.read_bytes() == a.read_bytes()


def test_json_round_trip_records_the_format_first(tmp_path):
    p = tmp_path / "keep.json"
    keep = {"selection": "flap", "layers": [{"kv_groups": [0], "channels": [1, 2]}]}
    artifacts.write_json(p, keep, "keep")
    text = p.read_text()
    assert text.startswith('{\n  "coec_format": "keep",\n  "coec_format_version": 1,')
    assert text.endswith("}\n")
    assert artifacts.strip_format(artifacts.read_keep(p, 1)) == keep


def test_files_written_before_versions_are_read_as_version_1(tmp_path):
    from safetensors.torch import save_file

    g = torch.eye(4)
    save_file(
        {"o_proj.gram": g, "o_proj.sum": torch.ones(4, dtype=torch.float64), "o_proj.count": torch.tensor([8])},
        str(tmp_path / "layer0.safetensors"),
    )
    st = artifacts.read_gram_layer(tmp_path, 0, "o_proj")
    assert st["count"] == 8 and torch.equal(st["sumsq"], torch.ones(4, dtype=torch.float64))
    (tmp_path / "keep.json").write_text(json.dumps({"layers": [{"kv_groups": [1], "channels": [0]}]}))
    assert artifacts.read_keep(tmp_path / "keep.json")["layers"][0]["kv_groups"] == [1]


# ----------------------------------------------------------------------------- damaged files
@pytest.mark.parametrize("keep", [3, 40, 0.5, 0.99])
def test_truncated_safetensors_names_file(tmp_path, keep):
    p = gram_file(tmp_path / "layer0.safetensors")
    data = p.read_bytes()
    p.write_bytes(data[: keep if isinstance(keep, int) else int(len(data) * keep)])
    msg = raises("truncated", artifacts.read_gram_layer, tmp_path, 0, "o_proj")
    assert msg.startswith(str(p) + ": ")


def test_garbage_and_empty_files_are_not_safetensors(tmp_path):
    p = tmp_path / "layer0.safetensors"
    p.write_bytes(b"\xff" * 4096)
    raises("not a safetensors file", artifacts.read_tensors, p)
    p.write_bytes(b"12345678" + b"{not json" + b" " * 100)
    raises(str(p), artifacts.read_tensors, p)
    p.write_bytes(b"")
    raises("truncated", artifacts.read_tensors, p)
    with pytest.raises(FileNotFoundError, match="file not found"):  # MissingArtifact is both
        artifacts.read_tensors(tmp_path / "absent.safetensors")


def test_wrong_format_version_and_wrong_format(tmp_path):
    p = tmp_path / "layer0.safetensors"
    artifacts.write_tensors(p, {"a": torch.ones(2)}, metadata={"coec_format": "gram", "coec_format_version": "2"})
    raises("wrong format version 2 (expected 1)", artifacts.read_tensors, p, fmt="gram")
    artifacts.write_tensors(p, {"a": torch.ones(2)}, "comp-block")
    raises("is a 'comp-block' file, expected 'gram'", artifacts.read_tensors, p, fmt="gram")
    j = tmp_path / "ppl.json"
    j.write_text(json.dumps({"coec_format": "ppl", "coec_format_version": 7, "ppl": 3.0}))
    raises("wrong format version 7 (expected 1)", artifacts.read_result, j)


def test_wrong_shape_missing_tensor_and_nan(tmp_path):
    gram_file(tmp_path / "layer0.safetensors", **{"o_proj.sum": torch.zeros(5, dtype=torch.float64)})
    raises("tensor o_proj.sum has shape (5,), expected (6,)", artifacts.read_gram_layer, tmp_path, 0, "o_proj")
    gram_file(tmp_path / "layer1.safetensors", **{"o_proj.gram": torch.zeros(6, 5)})
    raises("tensor o_proj.gram has shape (6, 5), expected (6, 6)", artifacts.read_gram_layer, tmp_path, 1, "o_proj")
    raises("missing tensor down_proj.gram", artifacts.read_gram_layer, tmp_path, 1, "down_proj")
    bad = torch.eye(6)
    bad[2, 3] = float("nan")
    gram_file(tmp_path / "layer2.safetensors", **{"o_proj.gram": bad})
    msg = raises("tensor o_proj.gram has non-finite values", artifacts.read_gram_layer, tmp_path, 2, "o_proj")
    assert str(tmp_path / "layer2.safetensors") in msg
    block = tmp_path / "block0-0.safetensors"
    artifacts.write_tensors(block, {"layer0.o_proj.weight": torch.tensor([[float("inf")]])}, "comp-block")
    raises("non-finite", artifacts.read_comp_blocks, [block])
    artifacts.write_tensors(block, {"layer0.o_proj.weight": torch.ones(1, 1)}, "comp-block")
    raises("holds layers [0], expected 0..1", artifacts.read_comp_block, block, 0, 1)


def test_bad_json_names_file_and_line(tmp_path):
    p = tmp_path / "keep.json"
    p.write_text('{\n  "layers": [\n    {"kv_groups": [0],, }\n]}\n')
    raises("bad JSON at line 3", artifacts.read_keep, p)
    artifacts.write_json(p, {"layers": [{"kv_groups": [0], "channels": [1]}] * 3}, "keep")
    p.write_text(p.read_text()[:40])
    raises("truncated JSON", artifacts.read_keep, p)
    p.write_text("")
    raises("empty file", artifacts.read_keep, p)
    artifacts.write_json(p, {"layers": [{"kv_groups": [0], "channels": [1]}]}, "keep")
    raises("has 1 layers, the model 2", artifacts.read_keep, p, 2)
    artifacts.write_json(p, {"layers": [{"kv_groups": "all", "channels": [1]}]}, "keep")
    raises("layers[0].kv_groups is not a list of indices", artifacts.read_keep, p)


# ----------------------------------------------------------------------------- atomic writes
def test_failing_write_leaves_neither_target_nor_temp(tmp_path):
    target = tmp_path / "block0-0.safetensors"

    def chunks():
        yield b"x" * 1000
        raise RuntimeError("disk gone")

    with pytest.raises(RuntimeError):
        atomic.write_chunks(target, chunks())
    assert list(tmp_path.iterdir()) == []
    # a previous file survives a failed rewrite untouched
    artifacts.write_tensors(target, {"a": torch.ones(3)}, "comp-block")
    before = target.read_bytes()
    with pytest.raises(TypeError):
        artifacts.write_tensors(target, {"a": torch.ones(3), "z": torch.ones(2, dtype=torch.complex64)}, "comp-block")
    with pytest.raises(TypeError):
        artifacts.write_json(target.with_suffix(".json"), {"x": object()})
    assert target.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == [target.name]


def test_failing_folder_write_leaves_nothing(tmp_path):
    out = tmp_path / "grams"
    with pytest.raises(RuntimeError):
        with atomic.atomic_dir(out) as tmp:
            artifacts.write_tensors(tmp / "layer0.safetensors", {"a": torch.ones(1)}, "gram")
            raise RuntimeError("killed mid-calibration")
    assert list(tmp_path.iterdir()) == []
    with atomic.atomic_dir(out) as tmp:
        artifacts.write_json(tmp / "meta.json", {"n_layers": 1}, "gram-meta")
    with pytest.raises(RuntimeError):
        with atomic.atomic_dir(out) as tmp:
            raise RuntimeError
    assert [p.name for p in tmp_path.iterdir()] == ["grams"]
    assert artifacts.read_gram_meta(out)["n_layers"] == 1


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_modes_follow_the_umask(tmp_path, umask):
    old = os.umask(umask)
    try:
        artifacts.write_tensors(tmp_path / "a.safetensors", {"a": torch.ones(1)}, "gram")
        artifacts.write_json(tmp_path / "a.json", {"x": 1})
        with atomic.atomic_dir(tmp_path / "d") as d:
            fd = os.open(d / "third_party.bin", os.O_WRONLY | os.O_CREAT, 0o600)  # like save_pretrained
            os.close(fd)
        with atomic.atomic_path(tmp_path / "fig.png") as p:
            p.write_bytes(b"png")
            os.chmod(p, 0o600)
    finally:
        os.umask(old)
    want = 0o666 & ~umask
    for name in ("a.safetensors", "a.json", "d/third_party.bin", "fig.png"):
        assert (tmp_path / name).stat().st_mode & 0o777 == want, name
    assert (tmp_path / "d").stat().st_mode & 0o777 == 0o777 & ~umask


def test_without_timings():
    info = {
        "seconds": 1.0,
        "total_seconds": 3,
        "relerr": 0.5,
        "layer0.o_proj": {"seconds_per_round": [0.1], "seconds_setup": 0.2, "rounds": 2, "options": {"timeout": 5}},
        "steps": [{"seconds_pass": 1, "ratio": 0.1}],
        "date": "x",
        "start_time": 1,
        "update": 1,
    }
    clean = artifacts.without_timings(info)
    assert clean == {
        "relerr": 0.5,
        "layer0.o_proj": {"rounds": 2, "options": {"timeout": 5}},
        "steps": [{"ratio": 0.1}],
        "update": 1,
    }
    t = artifacts.timings(info)
    assert t["layer0.o_proj.seconds_setup"] == 0.2 and t["steps[0].seconds_pass"] == 1


# ----------------------------------------------------------------------------- models, CLI
def test_model_folder_checks(tmp_path):
    import shutil

    from coec.model.load import read_model_tensors, resolve_model_dir

    model = make_model_dir(tmp_path / "m", "llama")
    names = ["model.layers.0.self_attn.o_proj.weight"]
    assert read_model_tensors(model, names)[names[0]].shape == (32, 32)
    broken = tmp_path / "broken"
    shutil.copytree(model, broken)
    shard = broken / "model.safetensors"
    shard.write_bytes(shard.read_bytes()[:-100])
    raises(f"{shard}: truncated", read_model_tensors, broken, names)
    raises(f"{shard}: truncated", resolve_model_dir, str(broken))
    shutil.copy(model / "model.safetensors", shard)
    (broken / "config.json").unlink()
    raises(f"{broken}: missing config.json", resolve_model_dir, str(broken))


def test_run_guarded_turns_artifact_and_safetensors_errors_into_one_line(capsys):
    from safetensors import SafetensorError

    from coec.cli_args import run_guarded

    def bad_artifact():
        raise artifacts.ArtifactError("/x/layer0.safetensors", "truncated (10 bytes)")

    def bad_library():
        raise SafetensorError("Error while deserializing header:\nincomplete metadata")

    assert run_guarded("compensate", bad_artifact) == 2
    err = capsys.readouterr().err
    assert "coec compensate: error: /x/layer0.safetensors: truncated (10 bytes)" in err
    assert run_guarded("ppl", bad_library) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("coec ppl: error:")]
    assert lines == ["coec ppl: error: Error while deserializing header: incomplete metadata"]


# ----------------------------------------------------------------------------- reproducibility
def _digests(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_stages_are_byte_identical_across_runs(llama_dir, text_dataset, tmp_path):
    """calibrate -> select -> compensate (COEC, with its per-round timings) -> ppl, twice through
    the stage functions: every output file has the same bytes, and none holds a timing."""
    from coec.calibrate.stage import run_calibrate
    from coec.compensate.stage import run_compensate
    from coec.evaluate.stage import run_ppl
    from coec.select.stage import run_select

    def run(root: Path):
        run_calibrate(
            CellSource(str(llama_dir), "float32", "cpu"),
            CalibrateOptions(CalibrationWindows(text_dataset, 4, 32, 0, 2), "float32"),
            str(root / "grams"),
        )
        run_select(
            CellSource(str(llama_dir)),
            str(root / "grams"),
            SelectOptions("wanda_sp", 0.5, "ceil"),
            str(root / "keep.json"),
        )
        info = run_compensate(
            CellSource(str(llama_dir), keep=str(root / "keep.json"), device="cpu"),
            str(root / "grams"),
            CompensateOptions({"method": "coec", "max_rounds": 2, "alpha": 0.9}, 0, 1),
            str(root / "block0-1.safetensors"),
        )
        assert "seconds" in info["layer0.o_proj"]  # the return value keeps them (benchmarks)
        run_ppl(
            CellSource(
                str(llama_dir),
                "float32",
                "cpu",
                keep=str(root / "keep.json"),
                comp=(str(root / "block0-1.safetensors"),),
                cell={"cell": "x"},
            ),
            PplOptions(text_dataset, 32, 2, 2),
            str(root / "ppl.json"),
        )

    run(tmp_path / "a")
    run(tmp_path / "b")
    da, db = _digests(tmp_path / "a"), _digests(tmp_path / "b")
    assert sorted(da) == [
        "block0-1.json",
        "block0-1.safetensors",
        "grams/layer0.safetensors",
        "grams/layer1.safetensors",
        "grams/meta.json",
        "keep.json",
        "ppl.json",
    ]
    assert da == db, [k for k in da if da[k] != db.get(k)]
    for name in ("block0-1.json", "grams/meta.json", "ppl.json"):
        assert not artifacts.timings(json.loads((tmp_path / "a" / name).read_text())), name
    assert artifacts.tensors_metadata(tmp_path / "a/block0-1.safetensors")["coec_format"] == "comp-block"
