"""Architecture adapters (coec.model.arch): one home per family, method code free of family names, and
the Granite family end to end (calibrate -> select -> compensate -> ppl -> export)."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import pytest
import torch

from coec.model.arch import ADAPTERS, MODULES, STOCK, ModelError, adapter_for
from coec.report.cost import PUBLISHED_ARCHS, arch_dims, config_dict, count_params, pruned_shape
from conftest import tiny_config

SRC = Path(__file__).resolve().parents[2] / "src" / "coec"


def _code_strings(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every identifier and string literal of a Python file, docstrings and
    comments left out."""
    toks = list(tokenize.generate_tokens(io.StringIO(path.read_text()).readline))
    out = []
    for i, t in enumerate(toks):
        if t.type == tokenize.NAME:
            out.append((t.start[0], t.string, True))
        elif t.type == tokenize.STRING:
            prev = next(
                (p for p in reversed(toks[:i]) if p.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT)), None
            )
            is_doc = prev is None or prev.type in (tokenize.INDENT, tokenize.DEDENT)
            if not is_doc:
                out.append((t.start[0], t.string, False))
    return out


def _family_hits(path: Path, names: list[str]) -> list[tuple[int, str]]:
    """Identifiers containing a family name (``LlamaConfig``) and string literals holding one
    as a model_type (``"qwen2"``, ``"x/llama"``), not a published checkpoint name such as
    ``"Qwen2.5-7B"`` (a family name followed by ``.``/``-``/a digit)."""
    alts = "|".join(re.escape(n) for n in names)
    ident = re.compile(rf"(?:{alts})(?!_?cpp)", re.IGNORECASE)  # llama_cpp: the runtime, not the family
    literal = re.compile(rf"(?<![\w.-])(?:{alts})(?![\w.-])", re.IGNORECASE)
    return [(line, text) for line, text, is_name in _code_strings(path) if (ident if is_name else literal).search(text)]


def test_method_code_names_no_family():
    """No identifier or string literal outside coec/arch names a family or stock class."""
    names = sorted(set(STOCK) | set(ADAPTERS))
    hits = [
        f"{p.relative_to(SRC)}:{line}: {text}"
        for p in sorted(SRC.rglob("*.py"))
        if "arch" not in p.relative_to(SRC).parts
        for line, text in _family_hits(p, names)
    ]
    assert not hits, "family names outside coec/arch:\n" + "\n".join(hits)


def test_name_scan_finds_a_family_literal(tmp_path):
    """The scan above can fail: a family identifier or literal in code is found; docstrings,
    comments and published checkpoint names are not."""
    f = tmp_path / "m.py"
    f.write_text(
        '"""Llama docs."""\n\ndef f(c):\n    """qwen3 here too."""\n'
        '    x = LlamaConfig, "Qwen2.5-7B"  # llama\n'
        '    return c.model_type == "qwen2" or {"a": "qwen3"}\n'
        "    import llama_cpp; t = time_llamacpp()\n"
    )
    assert [t for _, t in _family_hits(f, ["llama", "qwen2", "qwen3"])] == ["LlamaConfig", '"qwen2"', '"qwen3"']


def test_unknown_family_lists_known():
    from transformers import AutoConfig

    with pytest.raises(ModelError, match="gpt2.*supported: .*granite"):
        adapter_for(AutoConfig.for_model("gpt2"))
    with pytest.raises(ModelError, match="None"):
        adapter_for(object())


def test_adapter_for_config_model_layer_and_name():
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(tiny_config("qwen3"))
    a = adapter_for("qwen3")
    assert adapter_for(model) is a and adapter_for(model.config) is a
    assert adapter_for(model.model.layers[1]) is a
    assert adapter_for({"model_type": "qwen3"}) is a
    assert a.decoder_layers(model) is model.model.layers
    layer = model.model.layers[0]
    assert a.output_module(layer, "o_proj") is layer.self_attn.o_proj
    assert a.output_module(layer, "down_proj") is layer.mlp.down_proj
    names = a.layer_tensor_names(3)
    assert names["o_proj"] == "model.layers.3.self_attn.o_proj.weight"
    assert set(names) == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    assert set(dict(model.named_parameters())) >= {n.replace(".3.", ".0.") for n in names.values()}
    assert MODULES == ("o_proj", "down_proj")


def count_params_meta(config, shape=None):
    """Parameter count of the HF model built on the meta device (the oracle of
    ``cost.count_params``); tied embeddings counted once. Some transformers 5.x configs refuse
    ``hidden_size % num_attention_heads != 0`` at construction even with an explicit
    ``head_dim``, so the head counts are set as attributes after construction."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = config_dict(config) | dict(shape or {})
    d = arch_dims(cfg)
    heads = {"num_attention_heads": d["heads"], "num_key_value_heads": d["kv_heads"], "head_dim": d["head_dim"]}
    kwargs = {k: v for k, v in cfg.items() if k not in heads and k != "model_type"}
    hf_cfg = AutoConfig.for_model(
        d["model_type"], num_attention_heads=1, num_key_value_heads=1, head_dim=d["head_dim"], **kwargs
    )
    for k, v in heads.items():
        setattr(hf_cfg, k, v)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_cfg)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("family", sorted(ADAPTERS))
def test_param_count_matches_meta_model(family):
    """The adapter's parameter count equals the meta-device HF model, biases switched on where
    the family has flags."""
    cfg = tiny_config(family, attention_bias=True, mlp_bias=True).to_dict()
    assert count_params(cfg) == count_params_meta(cfg)
    shape = {"num_attention_heads": 2, "num_key_value_heads": 1, "intermediate_size": 20}
    assert count_params(cfg, shape) == count_params_meta(cfg, shape)


@pytest.mark.parametrize("name", sorted(PUBLISHED_ARCHS))
def test_meta_count_equals_analytic_count(name):
    cfg = dict(PUBLISHED_ARCHS[name], num_hidden_layers=2)  # linear in layers; keeps it fast
    shape = pruned_shape(cfg, 0.3)
    assert count_params_meta(cfg) == count_params(cfg)
    assert count_params_meta(cfg, shape) == count_params(cfg, shape)


def test_meta_count_full_size_qwen_and_variants():
    qwen7 = PUBLISHED_ARCHS["Qwen2.5-7B"]
    assert count_params_meta(qwen7) == count_params(qwen7) == 7_615_616_512
    assert count_params_meta(qwen7 | pruned_shape(qwen7, 0.3)) == count_params(qwen7, pruned_shape(qwen7, 0.3))
    small = dict(PUBLISHED_ARCHS["Llama-3.1-8B"], num_hidden_layers=1, vocab_size=1000)
    for extra in ({"tie_word_embeddings": True}, {"attention_bias": True}, {"mlp_bias": True}):
        assert count_params_meta(dict(small, **extra)) == count_params(dict(small, **extra)), extra
    q3 = dict(PUBLISHED_ARCHS["Qwen3-8B"], num_hidden_layers=1, attention_bias=True, tie_word_embeddings=True)
    assert count_params_meta(q3) == count_params(q3)


def test_granite_calibration_applies_the_embedding_multiplier(monkeypatch):
    """Layer-wise calibration must scale the embeddings like GraniteModel.forward: with the
    adapter's embed_scale switched off the Grams differ (tests/integration/test_calibrate_foundation.py checks that
    with it they equal the inputs captured from the full forward)."""
    from transformers import AutoModelForCausalLM

    from coec.calibrate.layer_pass import LayerRun, run_layerwise
    from coec.model.arch.granite import GraniteAdapter

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config("granite")).double().eval()
    ids = torch.randint(0, 320, (2, 16), generator=torch.Generator().manual_seed(1))

    def grams():
        out = {}
        run_layerwise(
            model,
            ids,
            on_layer=lambda i, s: out.update({i: s["o_proj"].gram.clone()}),
            run=LayerRun(batch_size=2, progress=False),
        )
        return out

    right = grams()
    monkeypatch.setattr(GraniteAdapter, "embed_scale", lambda self, config: None)
    wrong = grams()
    assert not torch.allclose(right[0], wrong[0])


def _masked_logits(src: Path, keep: dict, ids: torch.Tensor) -> torch.Tensor:
    """Logits of the dense model with the pruned o_proj / down_proj input columns zeroed."""
    from coec.model.arch import attention_shape, o_proj_columns
    from coec.model.load import load_model

    model, _ = load_model(src, dtype="float64")
    geom = attention_shape(model.config)
    with torch.no_grad():
        for layer, k in zip(model.model.layers, keep["layers"]):
            drop_o = [
                c
                for c in range(geom.n_heads * geom.head_dim)
                if c not in set(o_proj_columns(k["kv_groups"], geom).tolist())
            ]
            drop_d = [c for c in range(model.config.intermediate_size) if c not in k["channels"]]
            layer.self_attn.o_proj.weight[:, drop_o] = 0
            layer.mlp.down_proj.weight[:, drop_d] = 0
        return model(input_ids=ids).logits


def test_granite_exports_only_as_granite():
    """Granite's multipliers exist in no other stock class: the export tries no fallback."""
    from coec.export.hf_class import ExportNeeds, choose_export_class

    assert not adapter_for("granite").portable and adapter_for("llama").portable

    needs = ExportNeeds(
        family="granite", qk_norm=False, qkv_bias=True, o_bias=True, mlp_bias=True, divides=False, sliding=False
    )
    assert choose_export_class(needs)[0] == "granite"
    needs_llama = ExportNeeds(
        family="llama", qk_norm=False, qkv_bias=True, o_bias=True, mlp_bias=True, divides=False, sliding=False
    )
    assert choose_export_class(needs_llama)[0] == "seed_oss"
