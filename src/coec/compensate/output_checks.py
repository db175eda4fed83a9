"""Checks of what a method's ``solve`` returns, before anything uses or writes it: every method,
built-in or plug-in, with or without ``reports_errors``.

A :class:`Compensation` whose weight is (d_out, k) (k = |keep|) and bias (d_out,) or None, both
finite floating-point tensors that stay finite in the module's dtype, and an ``info`` of
JSON-serialisable values (:func:`jsonable`). A violation raises :class:`MethodOutputError`, one
line naming the method and the expected and actual shape or value; the compensate stage adds the
layer and module. The checks read the tensors only: no result changes.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, NoReturn

import torch

from coec.compensate.methods.base import Compensation


class MethodOutputError(ValueError):
    """A method returned what cannot be written: wrong shape, dtype, non-finite values, or an
    ``info`` that is not JSON (one line)."""


class NotJSONError(TypeError):
    """A value :func:`jsonable` cannot convert; ``where`` is its key path in the object."""

    def __init__(self, where: str, value: Any) -> None:
        self.where, self.kind = where, type(value).__name__
        super().__init__(f"{where} is a {self.kind}, not a JSON value")


def jsonable(x: Any, where: str = "info") -> Any:
    """``x`` as JSON values: dicts (keys as strings), lists, strings, booleans, None, integers,
    reals (non-finite ones as None), torch dtypes and devices (as their names). Anything else
    raises :class:`NotJSONError` naming its key path (``info['scale']``)."""
    if isinstance(x, dict):
        return {str(k): jsonable(v, f"{where}[{k!r}]") for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v, f"{where}[{i}]") for i, v in enumerate(x)]
    if isinstance(x, bool) or x is None or isinstance(x, str):
        return x
    if isinstance(x, numbers.Integral):
        return int(x)
    if isinstance(x, numbers.Real):
        x = float(x)
        return x if math.isfinite(x) else None
    if isinstance(x, torch.dtype):
        return str(x).replace("torch.", "")
    if isinstance(x, torch.device):
        return str(x)
    raise NotJSONError(where, x)


def _fail(method: str, problem: str) -> NoReturn:
    raise MethodOutputError(f"method {method!r} returned {problem}")


def _check_tensor(method: str, name: str, t: Any, shape: tuple[int, ...], expected: str) -> None:
    """``t`` is a floating-point tensor of ``shape`` with finite values."""
    if not isinstance(t, torch.Tensor):
        _fail(method, f"a {name} of type {type(t).__name__}, expected a torch.Tensor of shape {expected}")
    if tuple(t.shape) != shape:
        _fail(method, f"a {name} of shape {tuple(t.shape)}, expected {expected}")
    if not t.is_floating_point():
        _fail(method, f"a {name} of dtype {str(t.dtype).replace('torch.', '')}, expected a floating-point tensor")
    finite = torch.isfinite(t)
    if not bool(finite.all()):
        bad = int((~finite).sum())
        _fail(method, f"a {name} with {bad} non-finite values (NaN or Inf) of {t.numel()}, expected finite values")


def check_output(out: Any, method: str, d_out: int, k: int) -> None:
    """What ``solve`` returned: a :class:`Compensation` with weight (d_out, k), bias (d_out,) or
    None, finite floating-point values, and an ``info`` dict of JSON values."""
    if not isinstance(out, Compensation):
        _fail(method, f"a {type(out).__name__}, expected a Compensation(weight, bias, info)")
    _check_tensor(method, "weight", out.weight, (d_out, k), f"(d_out, |keep|) = ({d_out}, {k})")
    if out.bias is not None:
        _check_tensor(method, "bias", out.bias, (d_out,), f"(d_out,) = ({d_out},) or None")
    if not isinstance(out.info, dict):
        _fail(method, f"an info of type {type(out.info).__name__}, expected a dict of JSON values")
    try:
        jsonable(out.info)
    except NotJSONError as exc:
        _fail(method, f"{exc.where} of type {exc.kind}, expected a JSON value (number, string, bool, None, list, dict)")


def check_cast(method: str, name: str, t: torch.Tensor, dtype: torch.dtype) -> None:
    """``t``, the method's (finite) tensor cast to the module's ``dtype``, is finite: the cast
    did not overflow."""
    if t.is_floating_point() and not bool(torch.isfinite(t).all()):
        _fail(method, f"a {name} that overflows the module's dtype {str(dtype).replace('torch.', '')}")
