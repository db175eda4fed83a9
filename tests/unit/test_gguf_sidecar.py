"""The pure pieces of the GGUF sidecar and the K-quant types: which types gguf-py writes and which
llama.cpp's quantizer, the fallbacks predicted from row widths, the quantizer's fallbacks read from
tensor types, the refusal line, the dense-width note and the sidecar's fields."""

from __future__ import annotations

import gguf
import pytest

from coec.export.formats import GGUF_TYPES
from coec.export.gguf.layout import K_BLOCK, KQUANTS, block_of, fallback_reason, file_type, made_by
from coec.export.gguf.quantize import quantizer_fallbacks, type_counts
from coec.export.gguf.sidecar import dense_widths, sidecar, sidecar_path
from coec.export.gguf.writer import refusal
from coec.io.paths import gguf_file, gguf_report_file

Q = gguf.GGMLQuantizationType


def test_types_their_writer_block_and_file_type():
    gguf_py = ["f32", "f16", "q8_0", "q5_1", "q5_0", "q4_1", "q4_0"]
    mixes = ["q6_k", "q5_k_m", "q4_k_m", "iq4_xs", "q3_k_m", "q3_k_s", "q2_k"]
    assert GGUF_TYPES == (
        "f32", "f16", "q8_0", "q6_k", "q5_k_m", "q5_1", "q5_0", "q4_k_m", "q4_1", "q4_0",
        "iq4_xs", "q3_k_m", "q3_k_s", "q2_k",
    )  # fmt: skip
    assert [t for t in GGUF_TYPES if made_by(t) == "llama.cpp quantizer"] == list(KQUANTS) == mixes
    assert [t for t in GGUF_TYPES if made_by(t) == "coec"] == gguf_py
    assert K_BLOCK == 256 and [block_of(t) for t in ("f32", "f16", "q8_0", "q4_0", "q4_k_m")] == [1, 1, 32, 32, 256]
    assert {block_of(t) for t in KQUANTS} == {256}
    # llama_ftype MOSTLY_Q6_K, Q5_K_M, Q4_K_M, IQ4_XS, Q3_K_M, Q3_K_S, Q2_K
    assert [file_type(t) for t in KQUANTS] == [18, 17, 15, 30, 12, 11, 10]
    with pytest.raises(ValueError, match="unknown GGUF tensor type 'q3_k'"):
        made_by("q3_k")


def test_fallbacks_are_predicted_from_row_widths():
    assert fallback_reason((256,), "q4_k_m") is None  # 1-D: f32
    assert fallback_reason((64, 512), "q4_k_m") is None
    assert fallback_reason((1536, 576), "q6_k") == "row width 576 is not a multiple of the K-quant block (256)"
    assert fallback_reason((64, 48), "q8_0") == "row width 48 is not a multiple of the q8_0 block (32); written as f16"
    assert fallback_reason((64, 96), "q8_0") is None and fallback_reason((64, 48), "f16") is None


def test_quantizer_fallbacks_are_the_non_k_types_and_the_mix_is_counted():
    tensors = [
        ("token_embd.weight", (320, 256), Q.Q4_K),
        ("output.weight", (320, 256), Q.Q6_K),  # the mix's choice, not a fallback
        ("blk.0.attn_norm.weight", (256,), Q.F32),
        ("blk.0.ffn_down.weight", (256, 96), Q.Q5_0),
        ("blk.0.attn_output.weight", (256, 200), Q.F16),
        ("blk.0.attn_q.weight", (256, 256), Q.Q8_0),  # a row of 256 that llama.cpp did not K-quantize
    ]
    assert quantizer_fallbacks(tensors) == [
        {
            "tensor": "blk.0.ffn_down.weight",
            "shape": [256, 96],
            "type": "q5_0",
            "why": "row width 96 is not a multiple of the K-quant block (256); llama.cpp wrote it as Q5_0",
        },
        {
            "tensor": "blk.0.attn_output.weight",
            "shape": [256, 200],
            "type": "f16",
            "why": "row width 200 is not a multiple of the K-quant block (256); llama.cpp wrote it as F16",
        },
        {
            "tensor": "blk.0.attn_q.weight",
            "shape": [256, 256],
            "type": "q8_0",
            "why": "llama.cpp's quantizer chose Q8_0",
        },
    ]
    assert type_counts(tensors) == {"F16": 1, "F32": 1, "Q4_K": 1, "Q5_0": 1, "Q6_K": 1, "Q8_0": 1}


def test_the_fallbacks_of_the_mixes_below_4_bits_are_their_32_value_types():
    """Q3_K and Q2_K fall back to Q4_0, IQ4_XS to IQ4_NL (llama.cpp's tensor_type_fallback); the
    K-quants a Q2_K / Q3_K_M / IQ4_XS mix gives some tensors on purpose (Q3_K, Q4_K, Q5_K) are not
    fallbacks, and neither is IQ4_XS itself."""
    tensors = [
        ("blk.0.attn_q.weight", (576, 576), Q.Q4_0),  # q2_k / q3_k_s on the embedded model's rows
        ("blk.0.attn_v.weight", (192, 256), Q.Q3_K),  # the Q2_K mix's attn_v
        ("blk.0.ffn_down.weight", (576, 1536), Q.Q5_K),  # IQ4_XS's first ffn_down without an imatrix
        ("blk.1.ffn_down.weight", (576, 1536), Q.IQ4_XS),
        ("blk.1.attn_q.weight", (576, 576), Q.IQ4_NL),
        ("blk.1.attn_output.weight", (256, 200), Q.F16),
    ]
    fell = quantizer_fallbacks(tensors)
    assert [(f["tensor"], f["type"]) for f in fell] == [
        ("blk.0.attn_q.weight", "q4_0"),
        ("blk.1.attn_q.weight", "iq4_nl"),
        ("blk.1.attn_output.weight", "f16"),
    ]
    assert fell[1]["why"] == "row width 576 is not a multiple of the K-quant block (256); llama.cpp wrote it as IQ4_NL"
    assert all(fallback_reason((576, 576), t) for t in ("iq4_xs", "q3_k_m", "q3_k_s", "q2_k"))
    assert not any(fallback_reason((576, 1536), t) for t in ("iq4_xs", "q3_k_m", "q3_k_s", "q2_k"))


def test_a_mix_that_needs_an_importance_matrix_is_refused_without_one(monkeypatch):
    """None of the offered mixes needs one (llama.cpp quantizes q2_k and iq4_xs without); a mix
    that does is refused in one line when no --imatrix is given, and passes with one."""
    from coec.export.gguf import layout

    assert layout.NEEDS_IMATRIX == frozenset()
    for t in KQUANTS:
        layout.check_imatrix_need(t, False)
    monkeypatch.setattr(layout, "NEEDS_IMATRIX", frozenset({"q2_k"}))
    with pytest.raises(ValueError, match=r"^--gguf-type q2_k needs an importance matrix .*pass --imatrix") as e:
        layout.check_imatrix_need("q2_k", False)
    assert "\n" not in str(e.value) and "export-q2_k-imatrix.gguf" in str(e.value)
    layout.check_imatrix_need("q2_k", True)
    layout.check_imatrix_need("q3_k_m", False)


def test_refusal_is_one_line_naming_the_count_and_the_first_tensor():
    fell = [
        {"tensor": "blk.0.attn_q.weight", "shape": [576, 576]},
        {"tensor": "blk.0.attn_k.weight", "shape": [192, 576]},
    ]
    assert refusal("q4_k_m", fell * 75) == (
        "q4_k_m would fall back on 150 tensors (first: blk.0.attn_q.weight, row width 576 not a multiple of 256); "
        "pass --gguf-fallback allow or choose widths that are multiples of 256"
    )
    assert refusal("q8_0", fell[:1]).startswith("q8_0 would fall back on 1 tensor (first:")


def test_dense_widths_of_the_embedded_model_under_k_quants():
    assert dense_widths(576, 1536, "q4_k_m") == {
        "hidden_size": 576,
        "intermediate_size": 1536,
        "block": 256,
        "quantize": {"hidden_size": False, "intermediate_size": True},
    }
    assert dense_widths(576, 1536, "q8_0")["quantize"] == {"hidden_size": True, "intermediate_size": True}


def test_sidecar_fields_and_paths():
    report = {
        "gguf_type": "q5_k_m",
        "tensors": 3,
        "fallbacks": [{"tensor": "blk.0.ffn_down.weight", "shape": [256, 96], "type": "q5_1", "why": "w"}],
        "types": {"F32": 1, "Q5_K": 1, "Q5_1": 1},
        "quantize_seconds": 1.23456,
    }
    dense = dense_widths(256, 96, "q5_k_m")
    out = sidecar(report, "export-q5_k_m.gguf", "ab" * 32, dense)
    assert out == {
        "format": "coec-gguf-report",
        "file": "export-q5_k_m.gguf",
        "type": "q5_k_m",
        "written_by": "llama.cpp quantizer",
        "sha256": "ab" * 32,
        "tensors": 3,
        "fallback_count": 1,
        "fallbacks": [
            {
                "tensor": "blk.0.ffn_down.weight",
                "shape": [256, 96],
                "requested": "q5_k_m",
                "written": "q5_1",
                "reason": "w",
                "chosen_by": "llama.cpp quantizer",
            }
        ],
        "types": {"F32": 1, "Q5_K": 1, "Q5_1": 1},
        "dense_widths": dense,
        "quantize_seconds": 1.235,
    }
    plain = {k: v for k, v in report.items() if k != "quantize_seconds"} | {"gguf_type": "q8_0"}
    out = sidecar(plain, "export-q8_0.gguf", "", dense)  # gguf-py's types: coec chose, no quantizer time
    assert "quantize_seconds" not in out and out["written_by"] == out["fallbacks"][0]["chosen_by"] == "coec"
    assert gguf_report_file("r/dense", "q4_k_m") == "r/dense/export-q4_k_m.gguf.json"
    assert str(sidecar_path(gguf_file("r/dense", "q4_k_m"))) == gguf_report_file("r/dense", "q4_k_m")


def test_the_measured_tables_runtimes_are_the_schemas():
    """table4_measured.runtimes' enum (the config schema) is measured.RUNTIMES: a llamacpp-<type>
    runtime for every GGUF target name, the K-quant mixes and their -imatrix exports included."""
    from pathlib import Path

    import yaml

    from coec.export.formats import GGUF_VARIANTS
    from coec.report.measured.table import RUNTIMES

    schema = yaml.safe_load(
        (Path(__file__).resolve().parents[2] / "src/coec/config/schemas/config.schema.yaml").read_text()
    )
    enum = schema["properties"]["table4_measured"]["properties"]["runtimes"]["items"]["enum"]
    assert enum == list(RUNTIMES)
    assert [r.removeprefix("llamacpp-") for r in enum if r.startswith("llamacpp-")] == list(GGUF_VARIANTS)


def test_gguf_variant_names_split_into_type_and_imatrix():
    """Every target name is a type or a K-quant type with -imatrix; anything else is one line."""
    from coec.export.formats import GGUF_TYPES, GGUF_VARIANTS, split_gguf_variant

    assert [split_gguf_variant(t) for t in GGUF_TYPES] == [(t, False) for t in GGUF_TYPES]
    assert split_gguf_variant("q4_k_m-imatrix") == ("q4_k_m", True)
    assert split_gguf_variant("q3_k_s-imatrix") == ("q3_k_s", True)
    assert split_gguf_variant("iq4_xs") == ("iq4_xs", False)
    imatrix = [split_gguf_variant(v)[0] for v in GGUF_VARIANTS if v.endswith("-imatrix")]
    assert imatrix == ["q6_k", "q5_k_m", "q4_k_m", "iq4_xs", "q3_k_m", "q3_k_s", "q2_k"]
    for bad in ("q4_0-imatrix", "q3_k", "f16-imatrix", "iq4_nl", "q2_k_s"):
        with pytest.raises(ValueError, match="unknown GGUF export") as e:
            split_gguf_variant(bad)
        assert "\n" not in str(e.value)
