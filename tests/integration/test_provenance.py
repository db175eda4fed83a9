"""Hub provenance: --revision / --trust-remote-code reach every model, config and tokenizer load
and the hub snapshot; every result JSON records the model's source, revision, resolved commit
and weights digest; GGUF conversion dequantises explicitly."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch

from coec.io import provenance as PV
from conftest import REV, fake_hub_snapshot

HUB_ID = "org/tiny"
NS, SEQ, BS = 4, 16, 2


@pytest.fixture
def recorded_loads(monkeypatch, tmp_path, llama_dir):
    """A hub id served from a fake cache snapshot; every loader's kwargs recorded."""
    import huggingface_hub
    import transformers

    snap = fake_hub_snapshot(llama_dir, tmp_path / "hub")
    calls = []

    def fake_snapshot_download(repo_id, revision=None, allow_patterns=None, **kw):
        calls.append(("snapshot_download", repo_id, {"revision": revision, "allow_patterns": allow_patterns}))
        assert repo_id == HUB_ID
        return str(snap)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    for cls in (transformers.AutoConfig, transformers.AutoModelForCausalLM, transformers.AutoTokenizer):
        original = cls.from_pretrained

        def recorder(path, *args, _name=cls.__name__, _orig=original, **kw):
            calls.append((_name, str(path), dict(kw)))
            return _orig(path, *args, **kw)

        monkeypatch.setattr(cls, "from_pretrained", recorder)
    monkeypatch.setenv("COEC_DIGEST_CACHE", str(tmp_path / "digests"))
    return calls, snap


def expected_record(snap: Path) -> dict:
    manifest = "".join(
        f"{f.name} {hashlib.sha256(f.read_bytes()).hexdigest()}\n" for f in sorted(snap.glob("*.safetensors"))
    )
    return {
        "source": HUB_ID,
        "revision": REV,
        "commit": REV,
        "trust_remote_code": True,
        "weights_sha256": hashlib.sha256(manifest.encode()).hexdigest(),
    }


def test_revision_and_trust_remote_code_reach_every_load_and_every_result(recorded_loads, text_dataset, tmp_path):
    from coec.cli import main

    calls, snap = recorded_loads
    hub = ["--model", HUB_ID, "--revision", REV, "--trust-remote-code"]
    ds = json.dumps(text_dataset)
    grams, keep, block = tmp_path / "grams", tmp_path / "keep.json", tmp_path / "block0-1.safetensors"
    stages = [
        [
            "calibrate",
            *hub,
            "--dataset",
            ds,
            "--nsamples",
            str(NS),
            "--seqlen",
            str(SEQ),
            "--batch-size",
            str(BS),
            "--device",
            "cpu",
            "--out",
            str(grams),
        ],
        ["select", *hub, "--grams", str(grams), "--method", "wanda_sp", "--ratio", "0.5", "--out", str(keep)],
        [
            "compensate",
            *hub,
            "--grams",
            str(grams),
            "--keep",
            str(keep),
            "--spec",
            '{"method": "bias"}',
            "--first",
            "0",
            "--last",
            "1",
            "--device",
            "cpu",
            "--out",
            str(block),
        ],
        [
            "ppl",
            *hub,
            "--dataset",
            ds,
            "--seqlen",
            str(SEQ),
            "--max-windows",
            "2",
            "--device",
            "cpu",
            "--keep",
            str(keep),
            "--comp",
            str(block),
            "--out",
            str(tmp_path / "ppl.json"),
        ],
        ["geometry", *hub, "--keep", str(keep), "--comp", str(block), "--out", str(tmp_path / "geometry.csv")],
    ]
    for argv in stages:
        assert main(argv) == 0, argv[0]
    domains = json.dumps([{"name": "local", "alpha": 1.0, "dataset": text_dataset}])
    assert (
        main(
            [
                "iterative",
                "grams",
                *hub,
                "--domains",
                domains,
                "--nsamples",
                str(NS),
                "--seqlen",
                str(SEQ),
                "--batch-size",
                str(BS),
                "--device",
                "cpu",
                "--quiet",
                "--out",
                str(tmp_path / "it-grams"),
            ]
        )
        == 0
    )
    assert (
        main(
            [
                "iterative",
                "run",
                *hub,
                "--domains",
                domains,
                "--nsamples",
                str(NS),
                "--seqlen",
                str(SEQ),
                "--batch-size",
                str(BS),
                "--ratio",
                "0.5",
                "--steps",
                "1",
                "--device",
                "cpu",
                "--quiet",
                "--out",
                str(tmp_path / "it-run"),
            ]
        )
        == 0
    )

    loaders = [c for c in calls if c[0] != "snapshot_download"]
    kinds = {c[0] for c in loaders}
    assert {"AutoConfig", "AutoModelForCausalLM", "AutoTokenizer"} <= kinds
    bad = [c for c in loaders if c[2].get("revision") != REV or c[2].get("trust_remote_code") is not True]
    assert not bad, bad[:3]
    assert all(c[1] == str(snap) for c in loaders)
    downloads = [c for c in calls if c[0] == "snapshot_download"]
    assert downloads and all(c[2]["revision"] == REV and "*.py" in c[2]["allow_patterns"] for c in downloads)

    want = expected_record(snap)
    results = {
        "calibration meta": json.loads((grams / "meta.json").read_text()),
        "keep.json": json.loads(keep.read_text()),
        "compensation info": json.loads(block.with_suffix(".json").read_text()),
        "ppl.json": json.loads((tmp_path / "ppl.json").read_text()),
        "iterative grams meta": json.loads((tmp_path / "it-grams" / "meta.json").read_text()),
        "iterative info": json.loads((tmp_path / "it-run" / "iterative.json").read_text()),
    }
    for name, obj in results.items():
        assert obj.get("model") == want, name


def test_plain_model_loads_pass_defaults(monkeypatch, llama_dir):
    """Without options the loaders still receive revision=None and trust_remote_code=False
    explicitly (nothing left to a library default)."""
    import transformers

    from coec.model.load import load_model

    seen = []
    for cls in (transformers.AutoConfig, transformers.AutoModelForCausalLM, transformers.AutoTokenizer):
        orig = cls.from_pretrained
        monkeypatch.setattr(
            cls, "from_pretrained", lambda p, *a, _o=orig, **kw: (seen.append(dict(kw)), _o(p, *a, **kw))[1]
        )
    load_model(str(llama_dir), device="cpu")
    assert len(seen) >= 3  # config, model, tokenizer (and transformers' own inner config loads)
    assert all(kw["revision"] is None and kw["trust_remote_code"] is False for kw in seen)


def test_weights_digest_cached_and_sensitive(tmp_path, llama_dir, monkeypatch):
    model = tmp_path / "m"
    shutil.copytree(llama_dir, model)
    cache = tmp_path / "digests"
    first = PV.weights_digest(model, cache)
    assert len(list(cache.glob("*.json"))) == 1
    # the cached digest is used while path, size and mtime match (no reread) ...
    monkeypatch.setattr(PV, "file_sha256", lambda p: pytest.fail("reread a cached file"))
    assert PV.weights_digest(model, cache) == first
    monkeypatch.undo()
    # ... and any change to the bytes changes the digest
    w = model / "model.safetensors"
    data = bytearray(w.read_bytes())
    data[-1] ^= 1
    w.write_bytes(bytes(data))
    assert PV.weights_digest(model, cache) != first
    # a hub blob's name is its sha256 (no read at all)
    snap = fake_hub_snapshot(llama_dir, tmp_path / "hub")
    monkeypatch.setattr(PV, "file_sha256", lambda p: pytest.fail("hashed a hub blob"))
    assert PV.weights_digest(snap, cache) == expected_record(snap)["weights_sha256"]
    assert PV.resolved_commit(snap) == REV and PV.resolved_commit(model) is None


def test_weights_digest_needs_weights(tmp_path):
    with pytest.raises(FileNotFoundError, match="no safetensors"):
        PV.weights_digest(tmp_path)


def test_gguf_load_dequantises_explicitly(monkeypatch, tmp_path):
    """convert_gguf asks transformers for dequantised weights (GgufConfig(dequantize=True)) and
    refuses a model that still holds packed (non-float) parameters."""
    import transformers

    from coec.model import load as models

    kw = models.gguf_dequantize_kwargs()
    assert kw["quantization_config"].dequantize is True

    packed = torch.nn.Linear(2, 2)
    packed.weight = torch.nn.Parameter(torch.zeros(2, 2, dtype=torch.uint8), requires_grad=False)
    with pytest.raises(models.ModelError, match="not dequantised"):
        models.check_dense(packed, torch.float32)
    models.check_dense(torch.nn.Linear(2, 2), torch.float32)

    seen = {}

    def fake_from_pretrained(path, **kwargs):
        seen.update(kwargs)
        raise RuntimeError("stop after recording")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", fake_from_pretrained)
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    with pytest.raises(RuntimeError, match="stop after recording"):
        models.convert_gguf(gguf, tmp_path / "out")
    assert seen["gguf_file"] == "m.gguf"
    assert seen["quantization_config"].dequantize is True


def test_paper_config_pins_or_explains_every_hub_revision():
    """Each hub model of paper.yaml has a revision, or its source line says why it has none."""
    import yaml

    path = Path(__file__).resolve().parents[2] / "workflow" / "configs" / "paper.yaml"
    models = yaml.safe_load(path.read_text())["models"]
    lines = path.read_text().splitlines()
    hub = {k: m for k, m in models.items() if "/" in m["source"] and not Path(m["source"]).exists()}
    assert len(hub) >= 6
    for name, m in hub.items():
        if m.get("revision"):
            continue
        line = next(x for x in lines if f"source: {m['source']}" in x)
        assert "# revision unpinned:" in line, f"models.{name}: no revision and no reason given"


def test_workflow_passes_revision_and_trust_remote_code_to_every_model_stage(tmp_path):
    """A dry run with models.<m>.revision / trust_remote_code set: every job that loads the
    model gets both options."""
    import re

    from conftest import snakemake

    cfg = tmp_path / "rev.yaml"
    cfg.write_text("models:\n  smollm2-135m:\n    revision: v1 beta\n    trust_remote_code: true\n")
    res = snakemake(tmp_path, "-n", "-p", "results/table1.csv", "--configfile", str(cfg))
    cmds = [x.split("Shell command: ", 1)[1] for x in res.stdout.splitlines() if "Shell command: " in x]
    model_jobs = [
        c
        for c in cmds
        if re.search(
            r"coec (calibrate|select|compensate|ppl|zeroshot|"
            r"geometry|export|iterative (run|grams|ppl)) ",
            c,
        )
    ]
    assert len(model_jobs) >= 5
    for c in model_jobs:
        assert "--revision 'v1 beta' --trust-remote-code" in c, c
