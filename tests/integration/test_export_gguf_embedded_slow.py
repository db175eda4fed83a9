"""Slow: the embedded model (SmolLM2-135M) leaves as a GGUF that a real llama.cpp runs like the
in-memory cell, for Table 1's RCPU-selection COEC cell at 30 % (one width in every block: llama
arch) and for an iterative FLAP AL-AM cell (per-layer widths: deci arch).

The cells (tests/embedded_cells.py) are config.yaml's, made smaller where an export cannot tell
the difference; each is built once per pytest worker (the ``embedded_cell`` fixture) and shared
with test_evaluate_ppl_gguf_embedded_slow.py. llama.cpp's f32 logits must match to 1e-4 of the
logit scale and its perplexity over the first evaluation windows to 0.1 %.

Needs llama-cpp-python (CI's llama.cpp step installs it); skipped with the reason otherwise.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from coec.cli import main
from coec.data import text as data
from coec.evaluate.llamacpp.run import gguf_logits, gguf_perplexity
from coec.evaluate.ppl import perplexity
from coec.model.cell import build_model
from embedded_cells import PPL_WINDOWS, dataset, repo_config

pytestmark = pytest.mark.slow


def compare(model, windows: torch.Tensor, path: Path) -> dict:
    """Max |logit diff| / logit scale over two windows, and the relative perplexity difference
    over ``windows``, llama.cpp (f32 GGUF, f32 KV cache) against the in-memory cell."""
    diff, scale = 0.0, 0.0
    for w in windows[:2]:
        with torch.no_grad():
            ref = model(input_ids=w[None]).logits[0].double().numpy()
        got = gguf_logits(path, w[None], n_threads=1)[0]
        diff, scale = max(diff, float(np.abs(got - ref).max())), max(scale, float(np.abs(ref).max()))
    ppl_hf = perplexity(model, windows, batch_size=4, progress=False)["ppl"]
    ppl_cpp = gguf_perplexity(path, windows, n_threads=1)["ppl"]
    return {
        "rel": diff / scale,
        "diff": diff,
        "scale": scale,
        "ppl_hf": ppl_hf,
        "ppl_cpp": ppl_cpp,
        "ppl_rel": abs(ppl_cpp / ppl_hf - 1),
    }


@pytest.mark.parametrize("which,arch", [("table1", "llama"), ("al-am", "deci")])
def test_embedded_cell_runs_in_llama_cpp_like_the_model(embedded, embedded_cell, tmp_path, which, arch):
    config = repo_config()
    model_dir, text = embedded
    keep, comp = embedded_cell(which)
    out = tmp_path / "cell.gguf"
    assert (
        main(
            [
                "export",
                "--model",
                str(model_dir),
                "--keep",
                str(keep),
                "--comp",
                *map(str, comp),
                "--format",
                "gguf",
                "--gguf-type",
                "f32",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    import gguf

    assert gguf.GGUFReader(str(out)).get_field("general.architecture").contents() == arch
    model, tok = build_model(str(model_dir), "float32", "cpu", str(keep), [str(c) for c in comp])
    ev = config["evaluation"]
    tokens = data.tokenize_text(tok, data.load_split(dataset(text, config), "eval"))
    windows = data.eval_windows(tokens, ev["ppl_seqlen"], PPL_WINDOWS)
    m = compare(model, windows, out)
    print(f"{which} ({arch}): {m}")
    assert m["rel"] <= 1e-4, m
    assert m["ppl_rel"] <= 1e-3, m
