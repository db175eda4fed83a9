"""The starter's parts (coec.model.starter): offline reference text split the same way every time, and a
template method whose scales are each row's error-optimal one."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import coec.model.starter as starter
from coec.compensate import compensate
from coec.compensate.method import METHODS
from coec.model.tiny import families
from coec.registry import load_plugins
from registry_state import forget_plugins, restored


def test_reference_text_is_real_offline_and_split_by_topic():
    calib, evals = starter.reference_text()
    assert len(calib) > 100_000 and len(evals) > 20_000 and starter.reference_text() == (calib, evals)
    assert "statement" in calib and evals not in calib
    assert {"llama", "qwen2", "qwen3", "mistral"} <= set(families())


@pytest.fixture
def template():
    """The template loaded as the workflow loads a plug-in file, for this test only."""
    with restored(METHODS):
        load_plugins([str(Path(starter.__file__).with_name("method_template.py"))])
        yield METHODS[starter.METHOD]
    forget_plugins()


def test_template_scales_each_row_optimally(template):
    g = torch.Generator().manual_seed(0)
    X = torch.randn(200, 12, generator=g, dtype=torch.float64) @ torch.randn(12, 12, generator=g, dtype=torch.float64)
    W0 = torch.randn(5, 12, generator=g, dtype=torch.float64)
    keep = torch.tensor([0, 2, 3, 5, 7, 8, 11])
    out = compensate(W0, X.T @ X, X.mean(0), keep, starter.METHOD)
    s = out.weight[:, 0] / W0[:, 0]

    def err(row, scale):
        return float(((X @ W0[row] - X[:, keep] @ (scale * W0[row, keep])) ** 2).sum())

    for i in range(5):
        assert all(err(i, s[i]) <= err(i, s[i] + d) + 1e-9 for d in (-0.1, -0.01, 0.01, 0.1))
    assert out.info["relerr_after"] < out.info["relerr_before"]
    assert torch.equal(compensate(W0, X.T @ X, X.mean(0), keep, starter.METHOD, shrink=1.0).weight, W0[:, keep])


def test_the_documented_template_is_the_starters():
    """docs/adding-a-method.md shows the template's code: each of its lines (less comments) is a
    line of method_template.py, so the page and the file do not drift apart."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "adding-a-method.md").read_text()
    block = doc.split("## 2. Write the method", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    template = {line.split("  #")[0].rstrip() for line in Path(starter.__file__).with_name("method_template.py").open()}
    shown = [line.split("  #")[0].rstrip() for line in block.splitlines() if line.strip()]
    assert len(shown) > 15 and [line for line in shown if line not in template] == []
