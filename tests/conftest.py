"""Shared fixtures: tiny random Llama / Qwen2 / Qwen3 / Mistral / Granite models with a tiny offline tokenizer,
saved to temp folders exactly as a hub checkpoint would be."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import torch

CORPUS = (
    "The quick brown fox jumps over the lazy dog. Structured pruning removes whole columns "
    "of weight matrices, attention heads and channels. A smaller dense model runs on standard "
    "hardware without sparse kernels. Calibration statistics come from a small text sample. "
) * 20


def make_tokenizer(path: Path):
    """A byte-level BPE tokenizer trained on a fixed corpus (deterministic, offline)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<eos>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([CORPUS], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<eos>")
    fast.save_pretrained(path)
    return fast


def tiny_config(family: str, **over):
    """A 2-layer GQA config of the given family (4 query heads, 2 KV heads, head_dim 8)."""
    from transformers import AutoConfig

    kw = dict(vocab_size=320, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=8,
              max_position_embeddings=256, tie_word_embeddings=False)
    if family == "granite":  # non-trivial multipliers, so that forgetting one shows
        kw.update(embedding_multiplier=4.0, residual_multiplier=0.5, attention_multiplier=0.25,
                  logits_scaling=2.0)
    kw.update(over)
    return AutoConfig.for_model(family, **kw)


def make_model_dir(path: Path, family: str, dtype=torch.float32, seed: int = 0, **over) -> Path:
    """Save a randomly initialised tiny model + tokenizer into ``path``."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(family, **over)).to(dtype)
    # make biases (Qwen2 q/k/v) non-zero so slicing them is exercised
    for name, p in model.named_parameters():
        if name.endswith("bias"):
            torch.nn.init.normal_(p, std=0.1)
    model.save_pretrained(path)
    make_tokenizer(path)
    return path


@pytest.fixture(scope="module")
def one_thread():
    """Run a module's tests on one torch thread (small matrices; stable timings)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session", params=["llama", "qwen2", "qwen3", "mistral", "granite"])
def tiny_dir(request, tmp_path_factory) -> Path:
    return make_model_dir(tmp_path_factory.mktemp(request.param), request.param)


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory) -> Path:
    return make_model_dir(tmp_path_factory.mktemp("llama"), "llama")


@pytest.fixture(scope="session")
def text_dataset(tmp_path_factory) -> dict:
    """A local ``files`` dataset spec with calibration and evaluation text."""
    d = tmp_path_factory.mktemp("text")
    (d / "calib.txt").write_text(CORPUS)
    (d / "eval.txt").write_text(CORPUS[::-1][:3000] + CORPUS[:3000])
    return {"source": "files", "calib": str(d / "calib.txt"), "eval": str(d / "eval.txt")}


TEST_CONFIG = Path(__file__).resolve().parents[1] / ".test" / "config" / "config.yaml"


def in_work_folder(cfg: dict, work: Path) -> dict:
    """``cfg`` with its local model folders and text files (paths relative to the work folder)
    made absolute under ``work``."""
    cfg = copy.deepcopy(cfg)
    for m in cfg["models"].values():
        if m["source"] != "embedded":
            m["source"] = str(work / m["source"])
    for d in cfg["datasets"].values():
        if d["source"] == "files":
            d.update(calib=str(work / d["calib"]), eval=str(work / d["eval"]))
    return cfg


def write_trimmed_workflow(work: Path) -> tuple[dict, Path]:
    """The trimmed workflow config of .test/config/config.yaml (calibrate -> select ->
    compensate -> ppl -> table1, GPU resources on calibrate and the per-layer compensate jobs)
    with what it reads created under ``work``: a tiny Llama and local text. Returns (config, path
    of its YAML, every path absolute)."""
    import yaml

    make_model_dir(work / "tiny-llama", "llama")
    (work / "calib.txt").write_text(CORPUS)
    (work / "eval.txt").write_text(CORPUS[1000:4000])
    cfg = in_work_folder(yaml.safe_load(TEST_CONFIG.read_text()), work)
    cfg_path = work / "trim.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    return cfg, cfg_path


def job_counts(output: str) -> dict[str, int]:
    """Parse Snakemake's 'Job stats' table."""
    block = output.split("Job stats:")[1]
    counts = {}
    for line in block.splitlines()[3:]:
        m = re.match(r"^(\w+)\s+(\d+)$", line.strip())
        if not m:
            break
        counts[m.group(1)] = int(m.group(2))
    return counts


def method_kwargs(method: str, W0, G, mean, keep, n_tokens=1) -> dict:
    """Options a generic test passes so that every method runs: blend's stage inputs (a base
    weight W0[:, keep], the Gram's token count, and the same statistics as its held-out set)."""
    import torch

    if method == "coec":
        return {"max_rounds": 3}
    if method != "blend":
        return {}
    k = torch.as_tensor(keep).long()
    return {"base_weight": W0[:, k].float(), "n_tokens": n_tokens, "holdout_gram": G, "holdout_mean": mean,
            "holdout_count": n_tokens}
