"""What other runtimes read from each stock class an HF export may be written in (docs/export.md
"Which class the checkpoint uses"): vLLM, and llama.cpp's Hugging Face converter.

transformers itself is checked by the export (the written checkpoint is reloaded and its logits
compared). The other two are read from their code, not run:

* vLLM 0.33.0, the sources of its PyPI wheel (``vllm/model_executor/models/*.py``). vLLM cannot be
  installed and run on the machines this repository is tested on (no GPU); nothing here is a test
  against it.
* llama.cpp's ``convert_hf_to_gguf.py`` as llama-cpp-python 0.3.36 vendors it
  (``vendor/llama.cpp/conversion/*.py`` maps a class to a llama.cpp architecture,
  ``src/models/*.cpp`` is that architecture's loader). The GGUF export of this repository
  (``coec export --format gguf``) does not go through the converter and is tested in a real
  llama.cpp.

A runtime reads a class one of three ways for a given cell: ``ok`` (head size and every bias as
transformers does), ``misread`` (it computes with another head size or drops a bias the cell
has: wrong outputs or a load error, depending on the shapes) or ``fails`` (it refuses to load
the checkpoint with an error).
"""

from __future__ import annotations

from dataclasses import dataclass

from coec.model.arch.base import NeedsView

OK, MISREAD, FAILS = "ok", "misread", "fails"
VLLM = "vLLM 0.33.0"
CONVERTER = "llama.cpp via convert_hf_to_gguf.py (llama-cpp-python 0.3.36)"
RUNTIMES = (VLLM, CONVERTER)
_ALL_BIASES = frozenset({"qkv", "o", "mlp"})


@dataclass(frozen=True)
class Reads:
    """How one runtime builds one stock class from its config.json.

    ``head``: ``config`` (an explicit ``head_dim`` is honoured) or ``implied``
    (``hidden_size // num_attention_heads``). ``biases``: the roles (``qkv``, ``o``, ``mlp``) whose
    biases it loads when the class has them. ``no_slot``: what a bias without a slot does
    (``misread``: dropped silently; ``fails``: the loader stops). ``fails``: why every export in
    this class fails to load (None: it loads). ``source``: where this was read."""

    head: str
    biases: frozenset[str]
    no_slot: str
    source: str
    fails: str | None = None


_V = "vllm/model_executor/models/"
_DROP = f"unexpected .bias tensors are skipped ({_V}utils.py:457-458)"
READS: dict[str, dict[str, Reads]] = {
    VLLM: {
        "llama": Reads(
            "config",
            _ALL_BIASES,
            MISREAD,
            f"{_V}llama.py:158-159 head_dim, :267-274 attention_bias on q/k/v and o_proj, :305 mlp_bias",
        ),
        "mistral": Reads(
            "config",
            _ALL_BIASES,
            MISREAD,
            f"{_V}mistral.py:77-103,144-156 (the Llama attention and layer: llama.py:158-159 head_dim)",
        ),
        "qwen2": Reads(
            "implied",
            frozenset({"qkv"}),
            MISREAD,
            f"{_V}qwen2.py:150 head_dim = hidden_size // num_heads, :162 q/k/v bias, "
            f":169 no o_proj bias, :94,101 no MLP bias; {_DROP}",
        ),
        "qwen3": Reads(
            "config",
            frozenset({"qkv"}),
            MISREAD,
            f"{_V}qwen3.py:100,209 head_dim, :111,208 attention_bias on q/k/v only, :118 "
            f"o_proj without bias (transformers' attention_bias also biases o_proj), "
            f":58 Qwen2's MLP (no bias); {_DROP}",
        ),
        "seed_oss": Reads(
            "config",
            _ALL_BIASES,
            MISREAD,
            f"{_V}registry.py:765 SeedOssForCausalLM runs on the Transformers modeling "
            f"backend: transformers' modules with every Linear's bias kept "
            f"({_V}transformers/utils.py:142), head size from config.head_dim "
            "(vllm/transformers_utils/model_arch_config_convertor.py:105-108)",
        ),
        "hy_v3": Reads(
            "config",
            frozenset(),
            MISREAD,
            f"{_V}hy_v3.py:391-392 requires first_k_dense_replace, :260 q/k norms only "
            f"with config.qk_norm, :100,107,269,275 no biases, skipped at :589,605",
            fails="its HYV3 model requires first_k_dense_replace, which transformers' "
            "HYV3Config has not (hy_v3.py:391-392)",
        ),
        "granite": Reads(
            "config",
            _ALL_BIASES,
            MISREAD,
            f"{_V}granite.py:181-183 head_dim, :264-276 attention_bias on q/k/v and o_proj, :286 mlp_bias",
        ),
    },
    CONVERTER: {
        "llama": Reads(
            "config",
            _ALL_BIASES,
            FAILS,
            "conversion/llama.py:17-33 (llama arch), conversion/base.py:1541-1543 "
            "head_dim as attention.key_length; src/models/llama.cpp:53-77 every bias",
        ),
        "mistral": Reads(
            "config",
            _ALL_BIASES,
            FAILS,
            "conversion/llama.py:17-33 (MistralForCausalLM -> llama arch), conversion/base.py:1541-1543",
        ),
        "qwen2": Reads(
            "implied",
            frozenset({"qkv"}),
            FAILS,
            "conversion/qwen.py:48-57 (qwen2 arch); src/models/qwen2.cpp:38-39 q and "
            "o_proj sized hidden_size x hidden_size, no o_proj or MLP bias",
        ),
        "qwen3": Reads(
            "config",
            frozenset({"qkv"}),
            FAILS,
            "conversion/qwen.py:159 (qwen3 arch); src/models/qwen3.cpp:36-45 no o_proj "
            "or MLP bias (src/llama-model-loader.cpp:1398 'wrong number of tensors')",
        ),
        "seed_oss": Reads(
            "config",
            frozenset({"qkv"}),
            FAILS,
            "conversion/olmo.py:42-45 (seed_oss arch); src/models/seed-oss.cpp:15-17 "
            "head size, :32-41 no o_proj or MLP bias",
        ),
        "hy_v3": Reads(
            "config",
            frozenset({"qkv"}),
            FAILS,
            "conversion/hunyuan.py:363-366 (hy_v3 arch); src/models/hy-v3.cpp:53-64 no o_proj or MLP bias",
        ),
        "granite": Reads(
            "implied",
            _ALL_BIASES,
            FAILS,
            "conversion/granite.py:33-34 drops head_dim ('Ignoring head_dim'); "
            "src/models/granite.cpp:78-102 every bias",
        ),
    },
}

_ROLES = (("qkv", "qkv_bias", "q/k/v"), ("o", "o_bias", "o_proj"), ("mlp", "mlp_bias", "MLP"))


def verdict(runtime: str, model_type: str, needs: NeedsView) -> dict[str, str]:
    """{'status': ok | misread | fails, 'why', 'source'} of ``runtime`` reading a cell with
    ``needs`` (``export_class.ExportNeeds``) written as ``model_type``."""
    reads = READS[runtime].get(model_type)
    if reads is None:
        return {"status": FAILS, "why": f"no rules recorded for {model_type}", "source": ""}
    out = {"source": reads.source}
    if reads.fails:
        return {**out, "status": FAILS, "why": reads.fails}
    implied_ok = needs.divides and getattr(needs, "head_implied", True)
    if reads.head == "implied" and not implied_ok:
        status = MISREAD if runtime == VLLM else FAILS
        return {**out, "status": status, "why": "head size taken as hidden_size // num_attention_heads, not head_dim"}
    missing = [what for role, key, what in _ROLES if getattr(needs, key) and role not in reads.biases]
    if missing:
        effect = "dropped silently" if reads.no_slot == MISREAD else "the loader stops"
        return {**out, "status": reads.no_slot, "why": f"no {', '.join(missing)} bias slot ({effect})"}
    return {**out, "status": OK, "why": "head size and every bias as transformers reads them"}


def verdicts(model_type: str, needs: NeedsView) -> dict[str, dict[str, str]]:
    """Every runtime's verdict on ``model_type`` for a cell with ``needs``."""
    return {r: verdict(r, model_type, needs) for r in RUNTIMES}


def rank(model_type: str, needs: NeedsView) -> tuple[int, int]:
    """(misreads, failures) of a class over the runtimes: lower is better, misreads first."""
    got = [v["status"] for v in verdicts(model_type, needs).values()]
    return got.count(MISREAD), got.count(FAILS)


def pick(candidates: list[str], needs: NeedsView) -> str:
    """The candidate (classes transformers holds exactly, in preference order) that the fewest
    runtimes misread, then the fewest fail to load; the earliest among equals."""
    return min(candidates, key=lambda m: (*rank(m, needs), candidates.index(m)))


def shortfalls(model_type: str, needs: NeedsView) -> str:
    """The runtimes that do not read ``model_type`` correctly for this cell, in one phrase."""
    bad = [f"{v['status']} in {r} ({v['why']})" for r, v in verdicts(model_type, needs).items() if v["status"] != OK]
    return "; ".join(bad) or "read correctly everywhere"


def warnings_for(model_type: str, needs: NeedsView) -> list[str]:
    """One line per runtime that does not read ``model_type`` correctly for this cell."""
    out = []
    for runtime, v in verdicts(model_type, needs).items():
        if v["status"] == OK:
            continue
        what = "would misread" if v["status"] == MISREAD else "would fail to load"
        tip = "; write it with --format gguf instead" if runtime == CONVERTER else ""
        out.append(f"{runtime} {what} this {model_type} export: {v['why']} ({v['source']}){tip}")
    return out
