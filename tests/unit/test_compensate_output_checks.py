"""What a method returns is checked before anything uses it (coec.compensate.output_checks): the
weight is (d_out, |keep|), the bias (d_out,) or None, both finite floating-point tensors that stay
finite in the module's dtype, and ``info`` holds JSON values; a violation is one line naming the
method and the expected and actual shape or value, with or without ``reports_errors``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from coec.compensate import compensate
from coec.compensate.method import METHODS
from coec.compensate.output_checks import MethodOutputError, NotJSONError, jsonable
from coec.registry import PLUGINS_ENV, load_plugins
from registry_state import forget_plugins, restored

PLUGIN = Path(__file__).resolve().parents[1] / "plugins" / "bad_output.py"
METHOD_NAMES = ("bad_output", "bad_output_own")

#: fault -> the message (a regular expression) for the problem below: d_out 6, d_in 10, |keep| 7
MESSAGES = {
    "shape": r"returned a weight of shape \(6, 10\), expected \(d_out, \|keep\|\) = \(6, 7\)$",
    "nan": r"returned a weight with 1 non-finite values \(NaN or Inf\) of 42, expected finite values$",
    "bias": r"returned a bias of shape \(5,\), expected \(d_out,\) = \(6,\) or None$",
    "info": r"returned info\['scale'\] of type Tensor, expected a JSON value",
    "overflow": r"returned a weight that overflows the module's dtype float32$",
}


@pytest.fixture(scope="module")
def plugin():
    with restored(METHODS):
        load_plugins([str(PLUGIN)])
        yield
    forget_plugins()
    os.environ.pop(PLUGINS_ENV, None)


def _problem():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(40, 10, generator=g)
    W0 = torch.randn(6, 10, generator=g)
    return W0, X.T @ X, X.mean(0), torch.tensor([0, 1, 3, 4, 6, 8, 9])


@pytest.mark.parametrize("method", METHOD_NAMES)
@pytest.mark.parametrize("fault", sorted(MESSAGES))
def test_a_faulty_output_stops_in_one_line_naming_method_and_shapes(plugin, method, fault):
    W0, G, mean, keep = _problem()
    with pytest.raises(MethodOutputError, match=rf"^method '{method}' " + MESSAGES[fault]) as exc:
        compensate(W0, G, mean, keep, method, fault=fault, n_tokens=40)
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize("method", METHOD_NAMES)
def test_a_valid_output_passes_unchanged(plugin, method):
    W0, G, mean, keep = _problem()
    out = compensate(W0, G, mean, keep, method, fault="none", n_tokens=40)
    assert torch.equal(out.weight, W0[:, keep]) and out.bias is None and out.info["fault"] == "none"


def test_jsonable_names_the_key_of_a_value_that_is_not_json():
    assert jsonable({"a": (1, 2.5, float("nan")), 3: torch.float16, "d": torch.device("cpu")}) == {
        "a": [1, 2.5, None],
        "3": "float16",
        "d": "cpu",
    }
    with pytest.raises(NotJSONError, match=r"info\['a'\]\[1\] is a object"):
        jsonable({"a": [1, object()]})
