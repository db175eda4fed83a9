"""Export: a pruned, compensated cell written as a checkpoint that a plain
``AutoModelForCausalLM.from_pretrained`` (no custom code) reloads with equal logits, in the stock
class that expresses it; and an output folder rule that never destroys data."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

from coec.cli import main
from coec.export.formats import ExportRequest
from coec.export.hf_class import ExportNeeds, choose_export_class
from coec.export.stage import MARKER, ExportRefused, check_out_dir, run_export
from coec.model.arch import ModelError
from coec.model.cell import build_model
from conftest import make_model_dir, snakemake

LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}
# 8 query heads of head_dim 8 in 4 KV groups, hidden 64: keeping 3 of 4 groups leaves 6 heads and
# 64 % 6 != 0, as Llama-3.1-8B at 30 % keeps 24 of 32 heads and 4096 % 24 != 0
WIDE = dict(hidden_size=64, num_attention_heads=8, num_key_value_heads=4, head_dim=8, intermediate_size=48)
CHANNELS = list(range(0, 48, 2))


def make_cell(root: Path, family: str, kv_groups: list[int], bias: bool, **over):
    """A tiny model folder, a keep.json and one compensation block file (random compensated
    weights; FLAP-style o_proj and down_proj biases when ``bias``)."""
    from safetensors.torch import save_file

    src = make_model_dir(root / "src", family, **{**WIDE, **over})
    keep = root / "keep.json"
    keep.write_text(json.dumps({"layers": [{"kv_groups": kv_groups, "channels": CHANNELS}] * 2}))
    g = torch.Generator().manual_seed(1)
    k = len(kv_groups) * 2 * WIDE["head_dim"]
    t = {}
    for i in range(2):
        t[f"layer{i}.o_proj.weight"] = torch.randn(64, k, generator=g) * 0.2
        t[f"layer{i}.down_proj.weight"] = torch.randn(64, len(CHANNELS), generator=g) * 0.2
        if bias:
            t[f"layer{i}.o_proj.bias"] = torch.randn(64, generator=g) * 0.5
            t[f"layer{i}.down_proj.bias"] = torch.randn(64, generator=g) * 0.5
    comp = root / "block0-1.safetensors"
    save_file(t, str(comp))
    return src, keep, [comp]


def reload_plain(folder: Path):
    """What a user of the checkpoint runs: no custom code, no trust_remote_code."""
    from transformers import AutoModelForCausalLM

    cfg = json.loads((folder / "config.json").read_text())
    assert "auto_map" not in cfg
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def logits(model, n: int = 40) -> torch.Tensor:
    ids = torch.randint(0, 300, (2, n), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        return model(input_ids=ids).logits


CASES = [  # family, kept KV groups, FLAP bias, extra config, expected stock class
    ("llama", [0, 1, 3], False, {"rope_parameters": LLAMA3_ROPE}, "MistralForCausalLM"),
    ("llama", [0, 1, 3], True, {"rope_parameters": LLAMA3_ROPE}, "SeedOssForCausalLM"),
    ("llama", [0, 2], True, {}, "LlamaForCausalLM"),
    ("qwen2", [0, 1, 3], True, {}, "SeedOssForCausalLM"),
    ("qwen2", [1, 2], True, {"tie_word_embeddings": True}, "LlamaForCausalLM"),
    ("qwen2", [0, 1, 3], False, {}, "SeedOssForCausalLM"),  # vLLM's qwen2 takes hidden // heads
    ("qwen3", [0, 1, 3], False, {}, "Qwen3ForCausalLM"),
    ("qwen3", [0, 1, 3], True, {}, "HYV3ForCausalLM"),
    ("mistral", [0, 1, 3], False, {"sliding_window": 16}, "MistralForCausalLM"),
    ("mistral", [0, 1, 3], True, {"sliding_window": None}, "SeedOssForCausalLM"),
]


@pytest.mark.parametrize(
    "family,kv,bias,over,arch",
    CASES,
    ids=[f"{c[0]}-{len(c[1]) * 2}heads-{'bias' if c[2] else 'nobias'}" for c in CASES],
)
def test_export_reloads_with_equal_logits(tmp_path, family, kv, bias, over, arch):
    src, keep, comp = make_cell(tmp_path, family, kv, bias, **over)
    info = run_export(ExportRequest(str(src), str(keep), tuple(str(c) for c in comp), "float32", str(tmp_path / "out")))
    cell, _ = build_model(str(src), "float32", "cpu", str(keep), [str(c) for c in comp])
    reloaded = reload_plain(tmp_path / "out")
    assert type(reloaded).__name__ == arch == info["architecture"]
    assert reloaded.config.num_attention_heads == len(kv) * 2
    assert reloaded.config.intermediate_size == len(CHANNELS)
    torch.testing.assert_close(logits(reloaded), logits(cell), rtol=0, atol=1e-5)
    saved = json.loads((tmp_path / "out/config.json").read_text())["coec_export"]
    assert saved["source_model_type"] == family and saved["reason"]
    marker = json.loads((tmp_path / "out" / MARKER).read_text())
    assert marker["coec_export"]["architecture"] == arch


def test_exported_rope_scaling_and_sliding_window_carry_over(tmp_path):
    """Llama-3.1's llama3 rope scaling survives the move to Mistral; a Mistral window shorter
    than the context stays in force (the 40-token check above runs past a 16-token window)."""
    src, keep, comp = make_cell(tmp_path / "l", "llama", [0, 1, 3], False, rope_parameters=LLAMA3_ROPE)
    run_export(ExportRequest(str(src), str(keep), (str(comp[0]),), "float32", str(tmp_path / "l/out")))
    cfg = json.loads((tmp_path / "l/out/config.json").read_text())
    assert cfg["rope_parameters"]["rope_type"] == "llama3" and cfg["sliding_window"] is None
    src, keep, comp = make_cell(tmp_path / "m", "mistral", [0, 1, 3], True, sliding_window=16)
    with pytest.raises(ModelError, match="sliding attention window"):
        run_export(ExportRequest(str(src), str(keep), (str(comp[0]),), "float32", str(tmp_path / "m/out")))
    assert not (tmp_path / "m/out").exists()


def test_bf16_export_keeps_dtype_and_logits(tmp_path):
    from transformers import AutoModelForCausalLM

    src, keep, comp = make_cell(tmp_path, "llama", [0, 1, 3], True)
    run_export(ExportRequest(str(src), str(keep), (str(comp[0]),), "bfloat16", str(tmp_path / "out")))
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype="auto")
    cell, _ = build_model(str(src), "bfloat16", "cpu", str(keep), [str(comp[0])])
    assert reloaded.dtype == torch.bfloat16
    assert torch.equal(logits(reloaded), logits(cell))


def _needs(**kw):
    base = dict(
        family="llama", qk_norm=False, qkv_bias=False, o_bias=False, mlp_bias=False, divides=True, sliding=False
    )
    return ExportNeeds(**{**base, **kw})


@pytest.mark.parametrize(
    "kw,expected",
    [
        ({}, "llama"),
        ({"divides": False}, "mistral"),
        ({"divides": False, "o_bias": True, "mlp_bias": True}, "seed_oss"),
        ({"family": "qwen2", "qkv_bias": True, "o_bias": True, "mlp_bias": True}, "llama"),
        ({"family": "qwen2", "qkv_bias": True, "o_bias": True, "divides": False}, "seed_oss"),
        ({"family": "qwen3", "qk_norm": True, "o_bias": True}, "hy_v3"),  # vLLM's qwen3 drops it
        ({"family": "qwen3", "qk_norm": True, "o_bias": True, "mlp_bias": True}, "hy_v3"),
    ],
)
def test_choose_export_class(kw, expected):
    model_type, reason = choose_export_class(_needs(**kw))
    assert model_type == expected and reason


def test_choose_export_class_refuses_what_no_stock_class_holds():
    with pytest.raises(ModelError, match="no stock transformers class"):
        choose_export_class(_needs(family="mistral", sliding=True, o_bias=True))


# ----------------------------------------------------------------------------- folder safety
def digest(folder: Path) -> dict[str, str]:
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def cell(tmp_path_factory):
    root = tmp_path_factory.mktemp("cell")
    src, keep, comp = make_cell(root, "llama", [0, 2], True)  # saveable in its own class too
    return src, keep, comp


def cli_export(cell, out: Path, *extra: str) -> int:
    src, keep, comp = cell
    return main(
        [
            "export",
            "--model",
            str(src),
            "--keep",
            str(keep),
            "--comp",
            *[str(c) for c in comp],
            "--out",
            str(out),
            *extra,
        ]
    )


def test_nonempty_out_is_refused_and_untouched(cell, tmp_path):
    out = tmp_path / "notes"
    out.mkdir()
    (out / "notes.txt").write_text("my notes")
    assert cli_export(cell, out) == 2
    assert (out / "notes.txt").read_text() == "my notes" and len(list(out.iterdir())) == 1
    assert cli_export(cell, out, "--force") == 2  # not a previous export: refused even so
    assert (out / "notes.txt").read_text() == "my notes" and len(list(out.iterdir())) == 1
    assert [p.name for p in tmp_path.iterdir()] == ["notes"]  # no temporary leftovers


@pytest.mark.parametrize("where", ["source", "inside", "parent"])
def test_source_folder_is_never_an_output(cell, tmp_path, where):
    src = cell[0]
    before = digest(src.parent)
    out = {"source": src, "inside": src / "pruned", "parent": src.parent}[where]
    assert cli_export(cell, out, "--force") == 2
    assert digest(src.parent) == before
    assert not (src / "pruned").exists()


def test_force_replaces_only_a_previous_export(cell, tmp_path):
    out = tmp_path / "export"
    out.mkdir()  # an empty folder (e.g. made by the workflow engine) is fine
    assert cli_export(cell, out) == 0
    first = digest(out)
    assert cli_export(cell, out) == 2  # a second run without --force is refused
    assert digest(out) == first
    assert cli_export(cell, out, "--force") == 0
    assert set(digest(out)) == set(first) and (out / MARKER).is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]
    (out / "mine.txt").write_text("added by the user")
    with pytest.raises(ExportRefused, match="mine.txt"):
        check_out_dir(out, [cell[0]], force=True)
    assert cli_export(cell, out, "--force") == 2
    assert (out / "mine.txt").read_text() == "added by the user"


def test_failed_write_keeps_the_previous_export(cell, tmp_path, monkeypatch):
    out = tmp_path / "export"
    assert cli_export(cell, out) == 0
    before = digest(out)

    def broken(self, *a, **k):
        raise ValueError("disk full")

    monkeypatch.setattr("transformers.PreTrainedModel.save_pretrained", broken)
    assert cli_export(cell, out, "--force") == 2
    assert digest(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]


def test_out_holding_an_input_file_is_refused(cell, tmp_path):
    with pytest.raises(ExportRefused, match="overlaps"):
        check_out_dir(cell[1].parent, [cell[0], cell[1]], force=True)


# ----------------------------------------------------------------------------- workflow
def _export_workflow(work: Path) -> tuple[Path, str]:
    """A trimmed config on a tiny Llama whose 25 % cell keeps 6 of 8 heads (64 % 6 != 0)."""
    import yaml

    from conftest import CORPUS

    model = make_model_dir(work / "tiny-wide", "llama", **WIDE, rope_parameters=LLAMA3_ROPE)
    (work / "calib.txt").write_text(CORPUS)
    (work / "eval.txt").write_text(CORPUS[1000:4000])
    cfg = {
        "models": {"tiny": {"source": str(model), "num_layers": 2, "dtype": "float32"}},
        "datasets": {"local": {"source": "files", "calib": str(work / "calib.txt"), "eval": str(work / "eval.txt")}},
        "calibration": {"c8": {"dataset": "local", "nsamples": 8, "seqlen": 32, "seed": 0, "batch_size": 4}},
        "compute": {"device": "cpu", "compensate_block": 2},
    }
    path = work / "trim.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path, "results/tiny/c8/flap-0.25/bias/export"


def test_export_target_is_planned(tmp_path):
    cfg, target = _export_workflow(tmp_path)
    res = snakemake(tmp_path, "-n", "-p", "--cores", "1", target, "--configfile", str(cfg), check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "rule export:" in res.stdout and "--force" not in res.stdout
    assert f"--out {target}" in res.stdout
