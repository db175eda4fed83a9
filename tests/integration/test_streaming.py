"""A model streamed from its safetensors shards one layer at a time (coec.model.streamed): the same
logits, the same Gram files byte for byte, the same perplexity as the loaded model, on every
tiny family; the hidden-state store and its budget; the refusal of pickle checkpoints."""

from __future__ import annotations

import gc
import hashlib
import json
import subprocess
import sys
import weakref
from pathlib import Path

import pytest
import torch

from coec.calibrate.hidden import HiddenStore
from coec.calibrate.layer_pass import PassOptions, calibrate_to_dir, layer_call, layer_masks
from coec.calibrate.options import CalibrateOptions, CalibrationWindows
from coec.calibrate.streamed import calibrate_streamed, partial_dir
from coec.compensate.stage import CompensateOptions
from coec.evaluate.layerwise import LayerSequential, group_batches, perplexity_streamed
from coec.evaluate.ppl import perplexity
from coec.model.checkpoint import Checkpoint, weight_map
from coec.model.load import ModelError, load_model
from coec.model.source import CellSource
from coec.model.streamed import CellWeights, StreamedModel
from coec.select.options import SelectOptions
from conftest import CORPUS, make_model_dir

FAMILIES = [
    ("llama", {}),
    ("qwen2", {"tie_word_embeddings": True}),
    ("qwen3", {}),
    ("mistral", {"sliding_window": 16}),
    ("granite", {}),
]


def _ids(n=5, t=24, seed=0):
    return torch.randint(0, 320, (n, t), generator=torch.Generator().manual_seed(seed))


def digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


@pytest.fixture(scope="module", params=FAMILIES, ids=[f for f, _ in FAMILIES])
def family_dir(request, tmp_path_factory) -> Path:
    fam, over = request.param
    return make_model_dir(tmp_path_factory.mktemp(fam), fam, **over)


# ----------------------------------------------------------------------------- checkpoint
def test_weight_map_single_index_and_shards(tmp_path, llama_dir):
    single = weight_map(llama_dir)
    assert set(single.values()) == {"model.safetensors"} and "lm_head.weight" in single
    from safetensors.torch import load_file, save_file

    t = load_file(llama_dir / "model.safetensors")
    names = sorted(t)
    half = len(names) // 2
    for k, part in enumerate((names[:half], names[half:])):
        save_file({n: t[n] for n in part}, str(tmp_path / f"s{k}.safetensors"))
    assert weight_map(tmp_path) == {n: f"s{int(i >= half)}.safetensors" for i, n in enumerate(names)}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {names[0]: "s0.safetensors"}}))
    assert weight_map(tmp_path) == {names[0]: "s0.safetensors"}
    ck = Checkpoint(llama_dir)
    got = ck.read([names[0]])[names[0]]
    assert torch.equal(got, t[names[0]]) and ck.nbytes() == (llama_dir / "model.safetensors").stat().st_size


def test_pickle_checkpoint_refused_in_one_line(tmp_path, llama_dir):
    """A folder with only a .bin pickle is refused by the streamed stages, naming the file."""
    import shutil

    from safetensors.torch import load_file

    folder = tmp_path / "pickled"
    folder.mkdir()
    for f in llama_dir.iterdir():
        if f.suffix != ".safetensors":
            shutil.copy(f, folder / f.name)
    torch.save(load_file(llama_dir / "model.safetensors"), folder / "pytorch_model.bin")
    with pytest.raises(ModelError, match=r"pickles \(pytorch_model.bin\)"):
        weight_map(folder)
    (tmp_path / "c.txt").write_text(CORPUS)
    ds = json.dumps({"source": "files", "calib": str(tmp_path / "c.txt"), "eval": str(tmp_path / "c.txt")})
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "coec",
            "calibrate",
            "--model",
            str(folder),
            "--dataset",
            ds,
            "--nsamples",
            "2",
            "--seqlen",
            "16",
            "--device",
            "cpu",
            "--out",
            str(tmp_path / "grams"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("coec calibrate: error: ")]
    assert res.returncode == 2 and len(lines) == 1 and "Traceback" not in res.stderr, res.stderr[-2000:]
    assert "pytorch_model.bin" in lines[0] and "safetensors" in lines[0]
    assert not (tmp_path / "grams").exists()


# ----------------------------------------------------------------------------- the model
def _streamed_logits(sm: StreamedModel, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        with sm.embedding() as embed:
            h = embed(ids)
        pos = torch.arange(ids.shape[1]).unsqueeze(0)
        pe = sm.adapter.rotary(sm.model)(h, pos)
        masks = layer_masks(sm.model, h, pos)
        for i in range(sm.n_layers):
            with sm.layer(i) as layer:
                h = layer_call(layer, h, masks[i], pos, pe)
        with sm.head() as head:
            return head(h)


def test_streamed_logits_are_the_models(family_dir):
    """Embedding, every layer and the head materialised one at a time give the loaded model's
    logits bit for bit (tied heads, Granite's multipliers, Mistral's window shorter than the
    sequence); the skeleton holds no weight before or after."""
    model, _ = load_model(family_dir)
    ids = _ids(t=24)
    with torch.no_grad():
        ref = model(input_ids=ids, use_cache=False).logits
    sm = StreamedModel(family_dir)
    assert all(p.is_meta for p in sm.model.parameters())
    assert torch.equal(_streamed_logits(sm, ids), ref)
    assert all(p.is_meta for p in sm.model.parameters())


def test_parts_are_released(llama_dir):
    """A materialised layer, embedding and head live only inside their ``with`` block."""
    sm = StreamedModel(llama_dir)
    with sm.layer(1) as layer:
        ref = weakref.ref(layer.mlp.down_proj.weight)
        assert not ref().is_meta
    del layer
    gc.collect()
    assert ref() is None
    with sm.embedding() as embed:
        embed(_ids(1, 4))
    with pytest.raises(IndexError):
        embed(_ids(1, 4))  # the function outlives the block, the weights do not


def test_cell_installed_per_layer_equals_the_assembled_cell(tmp_path, family_dir):
    """Pruned and compensated per layer as it streams: the same perplexity as ``build_model``'s
    assembled cell, bit for bit, and the same parameter count (a bias block adds biases)."""
    from coec.calibrate.stage import run_calibrate
    from coec.compensate.stage import run_compensate
    from coec.model.cell import build_model
    from coec.select.stage import run_select

    (tmp_path / "c.txt").write_text(CORPUS)
    ds = {"source": "files", "calib": str(tmp_path / "c.txt"), "eval": str(tmp_path / "c.txt")}
    grams, keep = tmp_path / "g", tmp_path / "keep.json"
    run_calibrate(
        CellSource(str(family_dir), "float32", "cpu"),
        CalibrateOptions(CalibrationWindows(ds, 8, 32, 0, 4), "float64"),
        str(grams),
    )
    run_select(CellSource(str(family_dir)), str(grams), SelectOptions("wanda_sp", 0.5, "ceil"), str(keep))
    blocks = []
    for i, spec in ((0, {"method": "bias"}), (1, {"method": "lstsq", "ridge": 0.01})):
        blocks.append(str(tmp_path / f"block{i}-{i}.safetensors"))
        run_compensate(
            CellSource(str(family_dir), keep=str(keep), device="cpu"),
            str(grams),
            CompensateOptions(spec, i, i),
            blocks[-1],
        )
    windows = _ids(7, 32, seed=1)
    for k, c in ((None, []), (str(keep), []), (str(keep), blocks)):
        model, _ = build_model(str(family_dir), "float32", "cpu", k, c)
        ref = perplexity(model, windows, batch_size=3, progress=False)
        sm = StreamedModel(family_dir, cell=CellWeights(k, c, 2))
        got = perplexity_streamed(sm, windows, batch_size=3, progress=False)
        assert (got["nll"], got["tokens_scored"]) == (ref["nll"], ref["tokens_scored"])
        assert sm.param_count() == sum(p.numel() for p in model.parameters())


# ----------------------------------------------------------------------------- calibration
@pytest.mark.parametrize("budget,every", [(float("inf"), 600.0), (1000.0, 0.0)])
def test_streamed_grams_are_byte_identical(tmp_path, family_dir, budget, every):
    """The streamed pass writes the loaded model's Gram files byte for byte, whether the hidden
    states stay in memory or go to files (a budget of 1000 bytes: every batch on disk) and
    whether it checkpoints after every layer; its work folder is gone afterwards."""
    ids = _ids()
    model, _ = load_model(family_dir)
    calibrate_to_dir(model, ids, tmp_path / "ref", PassOptions(batch_size=2, gram_dtype="float64"), {"x": 1}, "cpu")
    info = calibrate_streamed(
        StreamedModel(family_dir),
        ids,
        tmp_path / "st",
        PassOptions(batch_size=2, gram_dtype="float64", budget_bytes=budget, checkpoint_seconds=every, progress=False),
        meta={"x": 1},
    )
    assert digest(tmp_path / "st") == digest(tmp_path / "ref")
    assert info["resumed_at"] == 0 and not partial_dir(tmp_path / "st").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ref", "st"]


def test_cli_calibrate_streams_the_same_files(tmp_path, llama_dir):
    """``coec calibrate`` (the workflow's job) writes what the loaded-model pass writes."""
    from coec.data.text import calibration_ids

    (tmp_path / "c.txt").write_text(CORPUS)
    ds = {"source": "files", "calib": str(tmp_path / "c.txt"), "eval": str(tmp_path / "c.txt")}
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "coec",
            "calibrate",
            "--model",
            str(llama_dir),
            "--dataset",
            json.dumps(ds),
            "--nsamples",
            "6",
            "--seqlen",
            "16",
            "--batch-size",
            "4",
            "--device",
            "cpu",
            "--hidden-budget-gb",
            "1e-5",
            "--out",
            str(tmp_path / "cli"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert "1 of 2 batches on disk" in res.stderr  # the second batch exceeds the tiny budget
    from coec.io.provenance import model_provenance

    model, tok = load_model(llama_dir)
    torch.manual_seed(0)
    ids = calibration_ids(tok, ds, 6, 16, 0)
    meta = {"model": model_provenance(str(llama_dir)), "dataset": ds, "nsamples": 6, "seed": 0, "dtype": "float32"}
    calibrate_to_dir(
        model, ids, tmp_path / "ref", PassOptions(batch_size=4, gram_dtype="float32"), meta, "cpu"
    )  # the schema's gram_dtype
    assert digest(tmp_path / "cli") == digest(tmp_path / "ref")


# ----------------------------------------------------------------------------- hidden states
def test_hidden_store_spills_beyond_its_budget(tmp_path):
    """Batches fill memory up to the budget, the rest go to files; a layer writes the next
    generation while reading the current one; save/load round-trips; close removes the files."""
    xs = [torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(b)) for b in range(4)]
    xs.append(torch.randn(1, 3, 4))
    store = HiddenStore(tmp_path / "spill", budget_bytes=2 * 96 + 10)
    for x in xs:
        store.append(x)
    assert (len(store), store.spilled, len(store.memory)) == (5, 3, 2)
    assert all(torch.equal(a, b) for a, b in zip(store, xs))
    for b, h in enumerate(store):
        store[b] = h * 2
        assert torch.equal(store[b], xs[b] * 2) == (b < 2)  # files: visible after the flip
    store.flip()
    assert all(torch.equal(a, 2 * b) for a, b in zip(store, xs))
    store.save(tmp_path / "h.bin")
    again = HiddenStore.load(tmp_path / "h.bin", store.shapes, torch.float32, tmp_path / "s2", 0)
    assert again.spilled == 5 and all(torch.equal(a, 2 * b) for a, b in zip(again, xs))
    store.close()
    again.close()
    assert not list((tmp_path / "spill").iterdir())
    with pytest.raises(ValueError, match="expected"):
        s = HiddenStore(tmp_path / "x", 1e9)
        s.append(xs[0])
        s[0] = xs[4]


def test_groups_fit_the_budget():
    assert group_batches([4, 4, 4, 4], 8) == [range(0, 2), range(2, 4)]
    assert group_batches([4, 9, 1], 8) == [range(0, 1), range(1, 2), range(2, 3)]
    assert group_batches([1, 1, 1], float("inf")) == [range(0, 3)]
    assert group_batches([], 8) == []


def test_evaluation_groups_reread_the_weights(llama_dir):
    """With a budget of two batches, 5 batches run as 3 groups (each reads every layer), with
    the same logits as one group."""
    sm = StreamedModel(llama_dir)
    batches = [_ids(2, 16, seed=s) for s in range(5)]
    one = list(LayerSequential(sm, progress=False).logits(batches))
    runner = LayerSequential(sm, budget_bytes=2 * 2 * 16 * 32 * 4, progress=False)
    three = list(runner.logits(batches))
    assert runner.groups_run == 3 and all(torch.equal(a, b) for a, b in zip(one, three))


# ----------------------------------------------------------------------------- embedded (slow)
@pytest.mark.slow
def test_embedded_model_streams_the_same_grams_and_perplexity(tmp_path):
    """The embedded model (SmolLM2-135M, tied head): streamed Gram files byte-identical to the
    loaded model's (8 x 256 Wikipedia tokens, float64 Grams), the same perplexity over 8 windows
    of 256, dense and pruned by the Grams' wanda_sp keep set at 30 %."""
    import os

    from coec.data.bundled import prepare_embedded_model, prepare_embedded_text
    from coec.data.text import calibration_ids
    from coec.model.cell import build_model
    from coec.select.stage import run_select

    repo = Path(__file__).resolve().parents[2]
    model_dir = Path(os.environ.get("COEC_EMBEDDED_MODEL", repo / "resources/models/smollm2-135m"))
    if not (model_dir / "config.json").is_file():
        model_dir = prepare_embedded_model("smollm2-135m", tmp_path / "smollm2")
    text = repo / "resources/text/enwiki"
    if not (text / "calib.txt").is_file():
        prepare_embedded_text(text := tmp_path / "enwiki")
    ds = {"source": "embedded", "dir": str(text)}
    model, tok = load_model(model_dir)
    ids = calibration_ids(tok, ds, 8, 256, 0)
    calibrate_to_dir(model, ids, tmp_path / "ref", PassOptions(batch_size=4, gram_dtype="float64"), device="cpu")
    calibrate_streamed(
        StreamedModel(model_dir), ids, tmp_path / "st", PassOptions(batch_size=4, gram_dtype="float64", progress=False)
    )
    assert digest(tmp_path / "st") == digest(tmp_path / "ref")
    run_select(
        CellSource(str(model_dir)),
        str(tmp_path / "st"),
        SelectOptions("wanda_sp", 0.3, "nearest"),
        str(tmp_path / "keep.json"),
    )
    windows = calibration_ids(tok, ds, 8, 256, 1)
    for keep in (None, str(tmp_path / "keep.json")):
        ref = perplexity(build_model(str(model_dir), "float32", "cpu", keep)[0], windows, 4, progress=False)
        sm = StreamedModel(model_dir, cell=CellWeights(keep, [], 30) if keep else None)
        got = perplexity_streamed(sm, windows, 4, progress=False)
        assert got["nll"] == ref["nll"], (keep, got["nll"], ref["nll"])
